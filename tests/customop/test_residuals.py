"""Issue 21: a forward hands intermediate values (residuals) to its gradient closures.

The op under test is a row softmax whose closures read the probabilities from the
forward's residuals; each forward stamps its residual with a serial number, so a
test can tell a closure that reused its own forward's work from one that got it
by running the forward again.
"""

import functools
import gc
import itertools
import time
import weakref

import mxnet as mx
import numpy as np
import pytest

import customop
from customop import check_grad, residuals
from customop import customop as op_of
from customop.dispatch import forced_path
from tests.customop import paths

_serial = itertools.count(1)
FORWARDS = []  # serial numbers of forwards run on real inputs (not placeholders)
USED = []  # serial numbers the closures received


def _stamp(x):
    n = next(_serial)
    if not np.all(np.asarray(x if isinstance(x, np.ndarray) else x.asnumpy()) == 1):
        FORWARDS.append(n)  # shape inference runs on ones: not counted
    return n


@op_of("numpy")
def softmax_np(x, scale=1.0):
    e = np.exp(scale * (x - x.max(axis=1, keepdims=True)))
    p = e / e.sum(axis=1, keepdims=True)
    return residuals(p.astype(x.dtype), probs=p, serial=_stamp(x))


def _softmax_grad_np(ans, x, probs, serial, scale=1.0):
    USED.append(serial)
    return lambda g: (scale * probs * (g - (g * probs).sum(axis=1, keepdims=True))).astype(x.dtype)


softmax_np.def_grad(_softmax_grad_np)


@op_of("mxnet")
def softmax_nd(x, scale=1.0):
    p = mx.nd.softmax(scale * x, axis=1)
    return residuals(p, probs=p, serial=_stamp(x))  # the residual is the output itself


def _softmax_grad_nd(ans, x, probs, serial, **params):
    USED.append(serial)
    return lambda g: (
        params["scale"] * probs * mx.nd.broadcast_sub(g, (g * probs).sum(axis=1, keepdims=True))
    )


softmax_nd.def_grad(_softmax_grad_nd)
OPS = [softmax_np, softmax_nd]


def _reference(x, head, scale):
    # float64, from the formula: d/dx sum(head * softmax(scale x))
    x = x.astype(np.float64)
    e = np.exp(scale * (x - x.max(axis=1, keepdims=True)))
    p = e / e.sum(axis=1, keepdims=True)
    return p, scale * p * (head - (head * p).sum(axis=1, keepdims=True))


def _data():
    x = np.random.normal(size=(4, 5)).astype(np.float32)
    head = np.random.normal(size=(4, 5)).astype(np.float32)
    return x, head


def _reused_own_forward(before):
    # every backward since `before` got the residual of a forward run for a real call,
    # and no forward was run again for the backward
    fwd, used = FORWARDS[before[0] :], USED[before[1] :]
    return used and sorted(used) == sorted(fwd)


def _mark():
    return len(FORWARDS), len(USED)


@pytest.mark.parametrize("op", OPS, ids=lambda o: o.mode)
@pytest.mark.parametrize("how", paths.ALL)
def test_residuals_reach_the_closures_on_every_recording_path(op, how):
    x, head = _data()
    paths.run(op, [x], {"scale": 2.0}, how=how, heads=[head])  # shapes inferred once
    before = _mark()
    outs, grads = paths.run(op, [x], {"scale": 2.0}, how=how, heads=[head], repeat=2)
    p, want = _reference(x, head, 2.0)
    np.testing.assert_allclose(outs[0], p, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grads[0], want, rtol=1e-4, atol=1e-6)
    assert _reused_own_forward(before), (FORWARDS[before[0] :], USED[before[1] :])


@pytest.mark.parametrize("op", OPS, ids=lambda o: o.mode)
def test_direct_and_numpy_calls_return_only_the_outputs(op):
    x, _ = _data()
    p, _ = _reference(x, np.zeros_like(x), 1.0)
    got = op(mx.nd.array(x))
    assert isinstance(got, mx.nd.NDArray)
    np.testing.assert_allclose(got.asnumpy(), p, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(op(x), p, rtol=1e-5, atol=1e-6)
    assert op.num_outputs == 1


@op_of("mxnet")
def square_natively(x):
    return residuals(x * x, unused=x + 1)


def test_native_recording_drops_residuals():
    x = mx.nd.array([1.0, -2.0, 3.0])
    x.attach_grad()
    with forced_path("native"), mx.autograd.record():
        y = square_natively(x)
    y.backward()
    assert isinstance(y, mx.nd.NDArray)
    np.testing.assert_allclose(x.grad.asnumpy(), [2.0, -4.0, 6.0])


class _Net(mx.gluon.HybridBlock):
    def __init__(self, op, **kwargs):
        super().__init__(**kwargs)
        self.op = op
        with self.name_scope():
            self.dense = mx.gluon.nn.Dense(5, in_units=5)

    def hybrid_forward(self, F, x):
        return self.op(self.dense(x), scale=2.0)


def _net_grad(net, x, head):
    xn = mx.nd.array(x)
    xn.attach_grad()
    with mx.autograd.record():
        out = net(xn)
    out.backward(mx.nd.array(head))
    return out.asnumpy(), xn.grad.asnumpy()


@pytest.mark.parametrize("op", OPS, ids=lambda o: o.mode)
def test_hybridized_and_exported_then_reloaded_blocks_reuse_the_forward(op, tmp_path):
    x, head = _data()
    net = _Net(op)
    net.initialize(mx.init.Xavier())
    w = net.dense.weight.data().asnumpy().astype(np.float64)
    b = net.dense.bias.data().asnumpy().astype(np.float64)
    z = x.astype(np.float64) @ w.T + b
    p, dz = _reference(z, head, 2.0)
    net.hybridize()
    _net_grad(net, x, head)
    before = _mark()
    out, grad = _net_grad(net, x, head)
    np.testing.assert_allclose(out, p, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad, dz @ w, rtol=1e-4, atol=1e-5)
    assert _reused_own_forward(before)

    prefix = str(tmp_path / "net")
    net.export(prefix)
    again = customop.imports(prefix + "-symbol.json", ["data"], prefix + "-0000.params")
    _net_grad(again, x, head)
    before = _mark()
    out, grad = _net_grad(again, x, head)
    np.testing.assert_allclose(out, p, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad, dz @ w, rtol=1e-4, atol=1e-5)
    assert _reused_own_forward(before)


@pytest.mark.parametrize("op", OPS, ids=lambda o: o.mode)
def test_module_trains_through_residuals(op):
    x, head = _data()
    sym = mx.sym.MakeLoss(mx.sym.sum(op(mx.sym.var("data"), scale=2.0) * mx.sym.var("h")))
    mod = mx.mod.Module(sym, data_names=["data", "h"], label_names=None)
    mod.bind(data_shapes=[("data", x.shape), ("h", head.shape)], inputs_need_grad=True)
    mod.init_params()
    before = _mark()
    mod.forward(mx.io.DataBatch([mx.nd.array(x), mx.nd.array(head)]), is_train=True)
    mod.backward()
    _, want = _reference(x, head, 2.0)
    np.testing.assert_allclose(mod.get_input_grads()[0].asnumpy(), want, rtol=1e-4, atol=1e-6)
    assert _reused_own_forward(before)


@pytest.mark.parametrize("op", OPS, ids=lambda o: o.mode)
def test_a_second_backward_without_a_forward_runs_the_forward_again(op):
    # An executor may run backward twice after one forward; the residuals went with the
    # first, so the second gets them from the forward run again (same gradient).
    x, head = _data()
    ex = op(mx.sym.var("x"), scale=2.0).simple_bind(mx.cpu(), x=x.shape)
    ex.arg_dict["x"][:] = x
    ex.forward(is_train=True)
    ex.backward(out_grads=mx.nd.array(head))
    first = ex.grad_dict["x"].asnumpy()
    before = _mark()
    ex.backward(out_grads=mx.nd.array(head))
    np.testing.assert_allclose(ex.grad_dict["x"].asnumpy(), first, rtol=1e-6)
    assert len(FORWARDS) - before[0] == 1 and USED[-1] == FORWARDS[-1]


@pytest.mark.parametrize("op", OPS, ids=lambda o: o.mode)
def test_retain_graph_backward_twice_on_the_recorded_paths(op):
    x, head = _data()
    _, want = _reference(x, head, 1.0)
    for how in paths.IMPERATIVE:
        xn = mx.nd.array(x)
        xn.attach_grad(grad_req="add")
        with forced_path(how), mx.autograd.record():
            y = op(xn)
        y.backward(mx.nd.array(head), retain_graph=True)
        y.backward(mx.nd.array(head))
        np.testing.assert_allclose(xn.grad.asnumpy(), 2 * want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("op", OPS, ids=lambda o: o.mode)
def test_check_grad_passes_with_residuals(op):
    x, _ = _data()
    assert check_grad(op, x.astype(np.float64), scale=1.5).passed
    assert check_grad(op, x).passed


# ---- twins use residuals independently ----------------------------------------------------
@op_of("numpy")
def logsumexp(x):
    m = x.max(axis=1, keepdims=True)
    return (m + np.log(np.exp(x - m).sum(axis=1, keepdims=True)))[:, 0]


logsumexp.def_grad(lambda ans, x: lambda g: g[:, None] * np.exp(x - ans[:, None]))


@logsumexp.twin("mxnet")
def _logsumexp_nd(x):
    p = mx.nd.softmax(x, axis=1)
    return residuals(
        mx.nd.log(mx.nd.sum(mx.nd.exp(x - x.max(axis=1, keepdims=True)), axis=1)) + x.max(axis=1),
        probs=p,
    )


logsumexp.mxnet.def_grad(
    lambda ans, x, probs: lambda g: mx.nd.broadcast_mul(probs, g.reshape((-1, 1)))
)


def test_twins_use_residuals_or_not_independently():
    x = np.random.normal(size=(3, 4))
    for op in (logsumexp.numpy, logsumexp.mxnet):
        assert check_grad(op, x).passed
        assert check_grad(op, x.astype(np.float32)).passed
        for how in paths.ALL:
            _, grads = paths.run(op, [x.astype(np.float32)], how=how)
            e = np.exp(x - x.max(axis=1, keepdims=True))
            np.testing.assert_allclose(grads[0], e / e.sum(axis=1, keepdims=True), rtol=1e-5)


# ---- several outputs, shape inference, optional inputs, auxiliary states -------------------
@op_of("numpy")
def split_scale(x, k=2.0):
    big = np.zeros((100, 100))  # a residual of another shape than any output
    return residuals(k * x, x * x, big=big, twice=2 * x)


split_scale.def_grad(lambda ans, x, twice, big, k=2.0: lambda g: k * g[0] + twice * g[1])


def test_several_outputs_and_shape_inference_ignore_the_residuals():
    assert split_scale.num_outputs == 2
    a, b = split_scale(mx.sym.var("x"))
    _, out_shapes, _ = mx.sym.Group([a, b]).infer_shape(x=(3, 2))
    assert out_shapes == [(3, 2), (3, 2)]
    x = np.random.normal(size=(3, 2))
    assert check_grad(split_scale, x, k=3.0).passed
    for how in paths.ALL:
        _, grads = paths.run(split_scale, [x], {"k": 3.0}, how=how)
        np.testing.assert_allclose(grads[0], 3.0 + 2 * x, rtol=1e-6)


@op_of("numpy", optional=("weight",))
def weighted_square(x, weight=None):
    w = np.ones_like(x) if weight is None else weight
    return residuals(w * x * x, w=w)


weighted_square.def_grad(lambda ans, x, weight, w: lambda g: 2 * w * x * g)


def test_optional_inputs_left_out_still_reach_the_residuals():
    x = np.random.normal(size=(3,))
    for how in paths.ALL:
        # symbols name every input: there, the variant without `weight` is the op
        op = weighted_square.variant(1) if how == "symbol" else weighted_square
        _, grads = paths.run(op, [x], how=how)
        np.testing.assert_allclose(grads[0], 2 * x)
        _, grads = paths.run(weighted_square, [x, np.full(3, 3.0)], how=how)
        np.testing.assert_allclose(grads[0], 6 * x)


@op_of("numpy", aux={"count": lambda x_shape: (1,)})
def counted_double(x, count):
    count += 1  # one update per forward
    return residuals(2 * x, two=2.0)


counted_double.def_grad(lambda ans, x, count, two: lambda g: two * g)


def test_auxiliary_states_move_once_per_forward_even_when_the_forward_runs_again():
    x = np.random.normal(size=(3,)).astype(np.float32)
    ex = counted_double(mx.sym.var("x")).simple_bind(mx.cpu(), x=x.shape)
    ex.arg_dict["x"][:] = x
    ex.forward(is_train=True)
    ex.backward(out_grads=mx.nd.ones(3))
    ex.backward(out_grads=mx.nd.ones(3))  # needs the forward again: on a copy of the state
    mx.nd.waitall()
    assert list(ex.aux_dict.values())[0].asnumpy().tolist() == [1.0]
    np.testing.assert_allclose(ex.grad_dict["x"].asnumpy(), 2 * np.ones(3))


def test_a_residual_named_like_an_input_or_parameter_is_refused():
    @op_of("numpy")
    def clash(x, k=1.0):
        return residuals(x * k, k=k)

    with pytest.raises(TypeError, match=r"residual\(s\) 'k' share a name"):
        clash(np.ones(2))


def test_residuals_need_outputs():
    with pytest.raises(TypeError, match="output"):
        residuals(probs=np.ones(2))


# ---- parameters left at their defaults ------------------------------------------------------
@op_of("numpy")
def scaled(x, factor=3.0, shift=0.0):
    return factor * x + shift


scaled.def_grad(lambda ans, x, **params: lambda g: params["factor"] * g)


def test_closures_taking_params_get_the_defaults_too():
    x = np.random.normal(size=(3,))
    for how in paths.ALL:
        _, grads = paths.run(scaled, [x], how=how)
        np.testing.assert_allclose(grads[0], 3.0 * np.ones(3))
        _, grads = paths.run(scaled, [x], {"factor": 5.0}, how=how)
        np.testing.assert_allclose(grads[0], 5.0 * np.ones(3))


# ---- memory: residuals live as long as the recorded node -------------------------------------
_ALIVE = []  # weak references to every residual made


@op_of("numpy")
def big_residual(x):
    r = np.zeros(2**17)  # 1 MB (float64)
    _ALIVE.append(weakref.ref(r))
    return residuals(2 * x, r=r)


big_residual.def_grad(lambda ans, x, r: lambda g: 2 * g + r[:1] * 0)


def _alive():
    return sum(r() is not None for r in _ALIVE)


def _settle(limit):
    mx.nd.waitall()
    deadline = time.monotonic() + 5  # MXNet calls the operators' deleters from its own threads
    while _alive() > limit and time.monotonic() < deadline:
        time.sleep(0.01)
    return _alive()


class _BigNet(mx.gluon.HybridBlock):
    def hybrid_forward(self, F, x):
        return big_residual(x)


def _recorder(how):
    """``(x, call)``: ``call()`` makes one training call of ``big_residual`` through ``how``
    and returns what holds it (its output, or its executor) and its backward."""
    x = mx.nd.ones((10,))
    x.attach_grad()
    if how == "executor":
        sym = big_residual(mx.sym.var("x"))

        def call():
            ex = sym.simple_bind(mx.cpu(), x=x.shape)
            ex.forward(is_train=True, x=x)
            return ex, functools.partial(ex.backward, mx.nd.ones(10))

        return x, call
    net = _BigNet()
    net.hybridize()

    def call():
        with forced_path(None if how == "hybridized" else how), mx.autograd.record():
            y = net(x) if how == "hybridized" else big_residual(x)
        return y, y.backward

    return x, call


@pytest.mark.parametrize("differentiated", [True, False], ids=["backward", "no-backward"])
@pytest.mark.parametrize("how", ["function", "custom", "hybridized", "executor"])
def test_a_thousand_recorded_calls_free_their_residuals_without_the_cycle_collector(
    how, differentiated
):
    # MXNet's operator objects sit in reference cycles with its ctypes callbacks: a residual
    # they held would wait for gc (see customop/runtime/release.py)
    x, call = _recorder(how)
    call()  # builds the hybridized graph: outside the count
    mx.nd.waitall()  # its forward runs on MXNet's thread, maybe after this returns
    gc.collect()
    _ALIVE.clear()
    gc.disable()
    try:
        held = [call() for _ in range(20)]
        assert _settle(20) == 20  # alive while their outputs (or executors) are
        if differentiated:
            for i in range(len(held)):  # no loop variable left holding an output
                held[i][1]()
        del held
        assert _settle(0) == 0
        for i in range(1000):
            out, backward = call()
            if differentiated:
                backward()
            del out, backward
            if i % 100 == 99:  # MXNet runs backward and its deleters asynchronously
                alive = _settle(2)
                assert alive <= 2, f"{alive} residuals of 1 MB alive after {i + 1} calls"
        left = _settle(0)
    finally:
        gc.enable()
    assert len(_ALIVE) == 1020
    assert left == 0, f"{left} residuals of 1 MB still alive"
    if differentiated and how != "executor":
        np.testing.assert_allclose(x.grad.asnumpy(), 2 * np.ones(10))


# ---- stopping the gradient to a float label ---------------------------------------------------
@op_of("numpy")
def picked(x, label):
    return x[np.arange(len(x)), label.astype(np.int64)]


def test_a_float_label_with_attach_grad_gets_the_stop_gradient_advice():
    x = mx.nd.array(np.random.normal(size=(3, 4)))
    label = mx.nd.array([0, 3, 1])
    x.attach_grad()
    label.attach_grad()
    with forced_path("function"), mx.autograd.record():
        y = picked(x, label)
    with pytest.raises(TypeError) as info:
        y.backward()
        mx.nd.waitall()
    text = str(info.value)
    assert "input 'label':" in text and "'x'" not in text.split(":")[1]  # x alone traces
    assert "mx.nd.stop_gradient(label)" in text
    assert "@customop('numpy', ..., no_grad=('label',))" in text
    # the two fixes the message names both work
    with mx.autograd.record():
        y = picked(x, mx.nd.stop_gradient(label))
    y.backward()
    assert x.grad.asnumpy().sum() == 3.0
    declared = op_of("numpy", name="tests.picked_no_grad", no_grad=("label",))(picked.fn)
    with mx.autograd.record():
        y = declared(x, label)
    y.backward()
    assert x.grad.asnumpy().sum() == 3.0 and label.grad.asnumpy().tolist() == [0, 0, 0]
