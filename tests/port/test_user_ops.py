"""The user ops of the guide, the how-to pages and the tutorials, ported to torch and jax.

Each op is defined here as its page defines it (docs/guide.md, docs/howto/*.md,
docs/tutorials/*.ipynb); the reference is the op run by MXNet (``cases.mxnet_reference``:
its forward, and its gradient by ``mx.autograd`` with a random head gradient).  An
``'mxnet'``-mode op ports as graphs, a ``'numpy'``-mode one through the host path, and an op
with auxiliary states is a named :class:`PortError` in both frameworks.

Not here: ``howto/gpu.md``'s ``device_square`` (its forward asserts it runs on ``cpu(1)``)
and ``howto/input_shapes.md``'s ``linear_without`` (``linear`` below, without the shape
function, which a port does not use).
"""

import mxnet as mx
import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="the port tests need torch (pip install 'customop[port]')"
)
jax = pytest.importorskip("jax", reason="the port tests need jax (pip install 'customop[port]')")
jnp = jax.numpy

import customop  # noqa: E402
from customop import customop as op_of  # noqa: E402
from customop import residuals  # noqa: E402
from customop.port import PortError, to_jax, to_torch  # noqa: E402

from .cases import R, mxnet_reference  # noqa: E402


# docs/guide.md: an output count that depends on a parameter
@op_of("mxnet", num_outputs=lambda ret_typ="value", **_: 2 if ret_typ == "both" else 1)
def my_topk(data, *, k=1, ret_typ="value"):
    value = mx.nd.topk(data, k=k, ret_typ="value")
    if ret_typ == "both":
        return value, mx.nd.topk(data, k=k, ret_typ="indices")
    return value


# docs/guide.md: twins
@op_of("mxnet")
def scaled_square(x, scale=1.0):
    """scale * x**2 on the device."""
    return scale * x * x


@scaled_square.twin("numpy")
def _scaled_square_reference(x, scale=1.0):
    return scale * x * x


# docs/guide.md: an optional array input
@op_of("mxnet", optional=("weight",))
def weighted_abs(x, weight=None, *, scale=1.0):
    out = scale * mx.nd.abs(x)
    return out if weight is None else out * weight


# docs/howto/custom_gradients.md: a closure linear in g (transposed), one that is not
@op_of("mxnet")
def relu1(x):
    return mx.nd.relu(x)


relu1.def_grad(lambda ans, x: lambda g: g * (x >= 0))


@op_of("mxnet")
def square(x):
    return x * x


square.def_grad(lambda ans, x: lambda g: mx.nd.clip(g, -1, 1) * 2 * x)


# docs/howto/input_shapes.md (and tutorial 05's, with one closure for both inputs)
def weight_shape(data, weight, *, num_hidden):
    return (num_hidden, data[1])


@op_of("mxnet", infer_input_shape={"weight": weight_shape})
def linear(data, weight, *, num_hidden):
    return mx.nd.dot(data, weight, transpose_b=True)


@op_of("mxnet", infer_input_shape={"weight": lambda data, weight, *, units: (units, data[1])})
def linear_joint(data, weight, *, units):
    return mx.nd.dot(data, weight, transpose_b=True)


linear_joint.def_grad(
    lambda ans, data, weight, *, units: (
        lambda g: (mx.nd.dot(g, weight), mx.nd.dot(g, data, transpose_a=True))
    ),
    argnum=(0, 1),
)


# docs/howto/numpy_or_mxnet.md
@op_of("mxnet")
def softplus(x):
    """log(1 + exp(x)), stable for large x."""
    return mx.nd.Activation(x, act_type="softrelu")


@softplus.twin("numpy")
def _softplus_reference(x):
    return np.logaddexp(0, x)


@op_of("mxnet", name="port_user.pick_score")
def pick_score(scores, label):
    num_class = scores.shape[1]
    customop.require((label > -1) * (label < num_class), "label", f"must be in [0, {num_class})")
    return mx.nd.pick(scores, label, axis=1)


# docs/howto/several_outputs.md and tutorial 05
@op_of("mxnet", outputs=("low", "high"))
def split_at(x, *, at=1):
    return x[:, :at], x[:, at:]


# docs/howto/stop_gradient.md
@op_of("mxnet", no_grad=("label",))
def squared_error(pred, label):
    return (pred - label) ** 2


@op_of("mxnet")
def product(a, b):
    return a * b


# tutorial 01
@op_of("mxnet")
def softmax_loss_nd(x, y):
    logp = mx.nd.log_softmax(x, axis=1)
    return -mx.nd.sum(mx.nd.pick(logp, y, axis=1)) / x.shape[0]


@op_of("numpy")
def softmax_loss(x, y):
    probs = np.exp(x - np.max(x, axis=1, keepdims=True))
    probs /= np.sum(probs, axis=1, keepdims=True)
    n = x.shape[0]
    return -np.sum(np.log(probs[np.arange(n), y])) / n


def _softmax_loss_grad(ans, x, y):
    def grad(g):
        n = x.shape[0]
        probs = np.exp(x - np.max(x, axis=1, keepdims=True))
        probs /= np.sum(probs, axis=1, keepdims=True)
        probs[np.arange(n), y] -= 1
        return g * probs / n

    return grad


softmax_loss.def_grad(_softmax_loss_grad)


# tutorial 02: an output layer (need_top_grad=False), both modes
@op_of("mxnet", need_top_grad=False)
def smooth_l1_nd(pred, target):
    return mx.nd.sum(mx.nd.smooth_l1(pred - target, scalar=1.0), axis=1)


# (the tutorial's op has no gradient for target: its automatic one raises, in MXNet too, when
# target asks for one; a port asks for every float input's, so the test declares it no_grad)
@op_of("numpy", need_top_grad=False, no_grad=("target",))
def smooth_l1_layer(pred, target):
    d = np.abs(pred - target)
    return np.sum(np.where(d < 1, 0.5 * d * d, d - 0.5), axis=1)


smooth_l1_layer.def_grad(
    lambda ans, pred, target: (
        lambda g: np.where(np.abs(pred - target) < 1, pred - target, np.sign(pred - target))
    )
)


# tutorial 05: residuals in the numpy twin, a closure of its own in the mxnet twin
@op_of("numpy")
def charbonnier_saved(x, epsilon=1e-3):
    root = np.sqrt(x * x + epsilon * epsilon)
    return residuals(root - epsilon, root=root)


charbonnier_saved.def_grad(lambda ans, x, root, **params: lambda g: g * x / root)


@charbonnier_saved.twin("mxnet")
def _charbonnier_saved_nd(x, epsilon=1e-3):
    return mx.nd.sqrt(x * x + epsilon * epsilon) - epsilon


charbonnier_saved.mxnet.def_grad(
    lambda ans, x, **params: lambda g: g * x / (ans + params["epsilon"])
)


@op_of("numpy", no_grad=("label",))
def pick_label(x, label, scale=1.0):
    return scale * x[np.arange(len(x)), label.astype(np.int64)]


# docs/howto/aux_states.md
@op_of("numpy", aux={"passes": lambda x: (1,)})
def counted(x, passes):
    return 2 * x


def _counted_grad(ans, x, passes):
    def grad(g):
        passes[...] += 1
        return 2 * g

    return grad


counted.def_grad(_counted_grad)


@op_of("mxnet", aux={"calls": lambda x: (1,)})
def counted_nd(x, calls):
    return 2 * x


def _f(r, *shape):
    return r.randn(*shape).astype("f")


def _labels(r, n, c, dtype="f"):
    return r.randint(0, c, (n,)).astype(dtype)


# (id, op, inputs(r), parameters fixed in the port, parameters per call, inputs with gradients)
CASES = [
    ("guide.my_topk", my_topk, lambda r: [_f(r, 3, 7)], {"k": 2}, {}, [0]),
    ("guide.my_topk-both", my_topk, lambda r: [_f(r, 3, 7)], {"k": 3, "ret_typ": "both"}, {}, [0]),
    ("guide.scaled_square", scaled_square, lambda r: [_f(r, 4, 3)], {}, {"scale": 3.0}, [0]),
    (
        "guide.scaled_square.numpy",
        scaled_square.numpy,
        lambda r: [_f(r, 4, 3)],
        {},
        {"scale": 3.0},
        [0],
    ),
    (
        "guide.weighted_abs",
        weighted_abs,
        lambda r: [_f(r, 5), _f(r, 5)],
        {},
        {"scale": 2.0},
        [0, 1],
    ),
    ("guide.weighted_abs-without", weighted_abs, lambda r: [_f(r, 5)], {}, {}, [0]),
    (
        "custom_gradients.relu1",
        relu1,
        lambda r: [np.array([-1.0, 0.0, 2.0, 0.0, -3.0], "f")],
        {},
        {},
        [0],
    ),
    (
        "input_shapes.linear",
        linear,
        lambda r: [_f(r, 4, 5), _f(r, 3, 5)],
        {"num_hidden": 3},
        {},
        [0, 1],
    ),
    (
        "tutorial05.linear_joint",
        linear_joint,
        lambda r: [_f(r, 4, 5), _f(r, 3, 5)],
        {"units": 3},
        {},
        [0, 1],
    ),
    ("numpy_or_mxnet.softplus", softplus, lambda r: [_f(r, 4, 3) * 20], {}, {}, [0]),
    ("numpy_or_mxnet.softplus.numpy", softplus.numpy, lambda r: [_f(r, 4, 3) * 20], {}, {}, [0]),
    (
        "numpy_or_mxnet.pick_score",
        pick_score,
        lambda r: [_f(r, 4, 3), _labels(r, 4, 3)],
        {},
        {},
        [0],
    ),
    (
        "stop_gradient.squared_error",
        squared_error,
        lambda r: [_f(r, 2, 3), _f(r, 2, 3)],
        {},
        {},
        [0],
    ),
    ("stop_gradient.product", product, lambda r: [_f(r, 2, 3), _f(r, 2, 3)], {}, {}, [0, 1]),
    (
        "tutorial01.softmax_loss",
        softmax_loss,
        lambda r: [_f(r, 4, 3), _labels(r, 4, 3, "int32")],
        {},
        {},
        [0],
    ),
    (
        "tutorial02.smooth_l1_nd",
        smooth_l1_nd,
        lambda r: [_f(r, 4, 3) * 2, _f(r, 4, 3)],
        {},
        {},
        [0],
    ),
    (
        "tutorial02.smooth_l1_layer",
        smooth_l1_layer,
        lambda r: [_f(r, 4, 3) * 2, _f(r, 4, 3)],
        {},
        {},
        [0],
    ),
    (
        "tutorial05.charbonnier_saved",
        charbonnier_saved,
        lambda r: [_f(r, 3, 4)],
        {},
        {"epsilon": 0.1},
        [0],
    ),
    (
        "tutorial05.charbonnier_saved.mxnet",
        charbonnier_saved.mxnet,
        lambda r: [_f(r, 3, 4)],
        {},
        {"epsilon": 0.1},
        [0],
    ),
    (
        "tutorial05.pick_label",
        pick_label,
        lambda r: [_f(r, 3, 4), _labels(r, 3, 4)],
        {},
        {"scale": 0.5},
        [0],
    ),
]
IDS = [c[0] for c in CASES]


def _close(got, want, what):
    got = np.asarray(got)
    assert got.shape == want.shape, what
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5, err_msg=what)


def _outputs(out):
    return list(out) if isinstance(out, tuple) else [out]


def _reference(case):
    _, op, make, fixed, call, grads = case
    inputs = make(R(0))
    return inputs, mxnet_reference(op, inputs, {**fixed, **call}, grads)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_torch_forward_and_gradient_equal_mxnet(case):
    _, op, _, fixed, call, grads = case
    inputs, (outs, heads, want) = _reference(case)
    xs = [torch.tensor(a, requires_grad=i in grads) for i, a in enumerate(inputs)]
    got = _outputs(to_torch(op, **fixed)(*xs, **call))
    for k, (g, w) in enumerate(zip(got, outs)):
        _close(g.detach().numpy(), w, f"output {k}")
    torch.autograd.backward(
        [o for o in got if o.requires_grad],
        [torch.tensor(h) for h, o in zip(heads, got) if o.requires_grad],
    )
    for i, w in zip(grads, want):
        _close(xs[i].grad.numpy(), w, f"gradient of input {i}")


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_jax_forward_and_gradient_equal_mxnet_under_jit(case):
    _, op, _, fixed, call, grads = case
    inputs, (outs, heads, want) = _reference(case)
    port = to_jax(op)
    params = {**fixed, **call}
    xs = [jnp.asarray(a) for a in inputs]
    got = jax.jit(lambda *xs: port(*xs, **params))(*xs)
    for k, (g, w) in enumerate(zip(_outputs(got), outs)):
        _close(g, w, f"output {k}")

    def weighted(*xs):  # the outputs weighted by MXNet's head gradients
        return sum(
            (o * h).sum()
            for o, h in zip(_outputs(port(*xs, **params)), heads)
            if jnp.issubdtype(o.dtype, jnp.floating)
        )

    found = jax.jit(jax.grad(weighted, argnums=tuple(grads)))(*xs)
    for i, g, w in zip(grads, found, want):
        _close(g, w, f"gradient of input {i}")


def test_pick_score_label_check_gives_nan_in_both_frameworks():
    scores = R(1).randn(2, 3).astype("f")
    label = np.array([2.0, 3.0], "f")  # 3 is outside [0, 3)
    with pytest.raises(ValueError, match="port_user.pick_score.*label must be in"):
        pick_score(mx.nd.array(scores), mx.nd.array(label))
    assert torch.isnan(to_torch(pick_score)(torch.tensor(scores), torch.tensor(label))).any()
    assert jnp.isnan(to_jax(pick_score)(jnp.asarray(scores), jnp.asarray(label))).any()


@pytest.mark.parametrize("port", [to_torch, to_jax], ids=["torch", "jax"])
def test_clipped_head_gradient_is_a_named_error(port):
    """``square``'s closure clips ``g``: not linear, so no graph stands for its gradient."""
    with pytest.raises(PortError, match=r"square.*\(port\)"):
        f = port(square)
        f(*([torch.ones(3)] if port is to_torch else [jnp.ones(3)]))


# ops whose graph holds only at the traced shapes: a number read from x.shape (softmax_loss_nd's
# division by the batch size; split_at's slices become Reshape with fixed sizes)
SHAPE_BOUND = [
    (softmax_loss_nd, [np.zeros((4, 3), "f"), np.zeros(4, "f")], {}, "_div_scalar"),
    (split_at, [np.zeros((2, 3), "f")], {"at": 2}, "Reshape"),
]


@pytest.mark.parametrize(
    "case", SHAPE_BOUND, ids=["tutorial01.softmax_loss_nd", "several_outputs.split_at"]
)
@pytest.mark.parametrize("port", [to_torch, to_jax], ids=["torch", "jax"])
def test_shape_bound_graph_is_a_named_error(port, case):
    op, inputs, params, node = case
    wrap = torch.tensor if port is to_torch else jnp.asarray
    with pytest.raises(
        PortError,
        match=(
            rf"{op.__name__}' \(port\): its forward does not "
            rf"trace.*only at the traced input shapes \({node}"
        ),
    ):
        port(op)(*map(wrap, inputs), **params)


@pytest.mark.parametrize("op", [counted, counted_nd], ids=["numpy", "mxnet"])
@pytest.mark.parametrize("port", [to_torch, to_jax], ids=["torch", "jax"])
def test_aux_state_ops_are_a_named_error(port, op):
    with pytest.raises(PortError, match=r"counted.*auxiliary states \(\w+\)"):
        port(op)
