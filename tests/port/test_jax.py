"""customop.to_jax: every library op's forward and gradient against MXNet's, under jit,
grad, vjp and vmap."""

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="the port tests need jax (pip install 'customop[port]')")
jnp = jax.numpy

from customop import ops  # noqa: E402
from customop.port import PortError, to_jax  # noqa: E402

from .cases import CASES, IDS, R, mxnet_reference  # noqa: E402


def _close(got, want, what):
    got = np.asarray(got)
    assert got.shape == want.shape, what
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5, err_msg=what)


def _outputs(out):
    return list(out) if isinstance(out, tuple) else [out]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_forward_and_gradient_equal_mxnet_under_jit(case):
    _, name, make, params, grads = case
    op = getattr(ops, name)
    inputs = make(R(0))
    outs, heads, want = mxnet_reference(op, inputs, params, grads)
    port = to_jax(op)
    xs = [jnp.asarray(a) for a in inputs]
    got = jax.jit(lambda *xs: port(*xs, **params))(*xs)
    for k, (g, w) in enumerate(zip(_outputs(got), outs)):
        _close(g, w, f"output {k}")
    if not grads:
        return

    def weighted(*xs):  # noqa: E306 - sum of outputs times MXNet's head gradients
        return sum(
            (o * h).sum()
            for o, h in zip(_outputs(port(*xs, **params)), heads)
            if jnp.issubdtype(o.dtype, jnp.floating)
        )

    found = jax.jit(jax.grad(weighted, argnums=tuple(grads)))(*xs)
    for i, g, w in zip(grads, found, want):
        _close(g, w, f"gradient of input {i}")


def test_vjp_and_vmap():
    port = to_jax(ops.smooth_l1)
    r = R(2)
    x, sigma = jnp.asarray(r.randn(3, 4, 2).astype("f")), jnp.asarray([1.5], "float32")
    out, vjp = jax.vjp(lambda x: port(x, sigma), x)
    (g,) = vjp(jnp.ones_like(out))
    # per row: vmap over the leading axis gives each row's own call
    rows = jax.vmap(lambda row: port(row, sigma))(x)
    for k in range(3):
        _close(rows[k], np.asarray(port(x[k], sigma)), f"row {k}")
    mx_out, _, mx_g = mxnet_reference(ops.smooth_l1, [np.asarray(x), np.asarray(sigma)], {}, [0])
    _close(out, mx_out[0], "vjp output")
    grads = jax.vmap(jax.grad(lambda row: port(row, sigma).sum()))(x)
    _, _, mx_ones = mxnet_reference_ones(np.asarray(x), np.asarray(sigma))
    _close(grads, mx_ones, "vmap of grad")
    assert g.shape == x.shape


def mxnet_reference_ones(x, sigma):
    import mxnet as mx

    X = mx.nd.array(x)
    X.attach_grad()
    with mx.autograd.record():
        y = ops.smooth_l1(X, mx.nd.array(sigma))
    y.backward(mx.nd.ones_like(y))
    return y.asnumpy(), None, X.grad.asnumpy()


def test_focal_loss_with_integer_labels_as_jax_gives_no_label_gradient():
    port = to_jax(ops.focal_loss)
    pred, label = (jnp.asarray(a) for a in CASES[0][2](R(4)))
    g = jax.grad(lambda p, lab: port(p, lab).sum(), argnums=(0, 1))(pred, label)
    assert np.all(np.asarray(g[1]) == 0)


def test_aux_state_op_is_a_named_error():
    with pytest.raises(PortError, match="ops.center_loss.*auxiliary states"):
        to_jax(ops.center_loss)


def test_numpy_mode_op_runs_through_pure_callback():
    op = ops.smooth_l1.numpy
    r = R(6)
    x, sigma = r.randn(2, 3).astype("f"), np.array([1.2], "f")
    outs, heads, want = mxnet_reference(op, [x, sigma], {}, [0])
    port = to_jax(op)
    out, vjp = jax.vjp(lambda x: port(x, jnp.asarray(sigma)), jnp.asarray(x))
    _close(out, outs[0], "output")
    _close(vjp(jnp.asarray(heads[0]))[0], want[0], "gradient")
    _close(jax.jit(lambda x: port(x, jnp.asarray(sigma)))(jnp.asarray(x)), outs[0], "jit")


@pytest.mark.cuda
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_forward_and_gradient_on_a_gpu(case):
    try:
        gpu = jax.devices("gpu")[0]
    except RuntimeError:
        pytest.skip("jax sees no GPU")
    with jax.default_device(gpu):
        test_forward_and_gradient_equal_mxnet_under_jit(case)
