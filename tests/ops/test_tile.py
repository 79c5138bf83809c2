"""ops.tile': numpy.tile semantics for any reps, gradient summed back; equal to mx.nd.tile."""

import itertools

import mxnet as mx
import numpy as np
import pytest

import ops
from customop import check_grad
from customop.dispatch import forced_path
from tests.ops import common

OPS = [ops.tile, ops.tile.numpy]
ids = lambda op: op.mode  # noqa: E731
REPS = [2, (3,), (2, 1), (1, 3), (2, 2, 2), (2, 1, 1, 3)]


def reference_grad(g, shape, reps):
    # d out / d data: every copy of an element adds its head gradient (loops, float64).
    reps = (reps,) if isinstance(reps, int) else tuple(reps)
    n = max(len(shape), len(reps))
    shape1, reps1 = (1,) * (n - len(shape)) + tuple(shape), (1,) * (n - len(reps)) + reps
    g = np.asarray(g, np.float64).reshape([s * r for s, r in zip(shape1, reps1)])
    out = np.zeros(shape1)
    for copy in itertools.product(*[range(r) for r in reps1]):
        out += g[tuple(slice(c * s, (c + 1) * s) for c, s in zip(copy, shape1))]
    return out.reshape(shape)


@pytest.mark.parametrize("op", OPS, ids=ids)
@pytest.mark.parametrize("reps", REPS, ids=str)
def test_equals_numpy_tile_and_mx_nd_tile(op, reps):
    x = np.random.randn(2, 3).astype(np.float32)
    got = op(common.nd(x), reps=reps).asnumpy()
    np.testing.assert_array_equal(got, np.tile(x, reps))
    native_reps = (reps,) if isinstance(reps, int) else reps
    np.testing.assert_array_equal(got, mx.nd.tile(common.nd(x), reps=native_reps).asnumpy())


@pytest.mark.parametrize("op", OPS, ids=ids)
@pytest.mark.parametrize("reps", REPS, ids=str)
def test_gradient_sums_every_copy_and_equals_native(op, reps):
    x = np.random.randn(2, 3)
    heads = [np.random.randn(*np.tile(x, reps).shape)]
    (out,), (dx,) = common.assert_paths_agree(op, [x], {"reps": reps}, heads, rtol=1e-12)
    np.testing.assert_allclose(dx, reference_grad(heads[0], x.shape, reps), rtol=1e-12)
    a = common.nd(x)
    a.attach_grad()
    with mx.autograd.record():
        native = mx.nd.tile(a, reps=(reps,) if isinstance(reps, int) else reps)
    native.backward(common.nd(heads[0]))
    np.testing.assert_allclose(dx, a.grad.asnumpy(), rtol=1e-12)


@pytest.mark.parametrize("op", OPS, ids=ids)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_check_grad(op, dtype):
    x = np.random.randn(3, 2).astype(dtype)
    for reps in [(2, 3), (2, 1, 2)]:
        check_grad(op, x, reps=reps)


@pytest.mark.parametrize("hybridize", [False, True])
def test_in_a_hybridized_block(hybridize):
    class Tiled(mx.gluon.HybridBlock):
        def hybrid_forward(self, F, x):
            return ops.tile(x, reps=(1, 2)) * 2

    x = np.random.randn(2, 3)
    out, (dx,) = common.block_run(Tiled(), [x], hybridize)
    np.testing.assert_allclose(out, 2 * np.tile(x, (1, 2)), rtol=1e-6)
    np.testing.assert_allclose(dx, 4 * np.ones((2, 3)))


@pytest.mark.parametrize("how", ["function", "custom"])
def test_mxnet_mode_copies_nothing_to_the_host(how):
    x = np.random.randn(4, 5).astype(np.float32)
    assert common.hot_path_reads(ops.tile, [x], {"reps": (2, 3)}, how) == (0, 0)


@pytest.mark.parametrize("op", OPS, ids=ids)
@pytest.mark.parametrize("how", ["direct", "custom"])
def test_bad_reps_name_the_op_and_the_argument(op, how):
    x = mx.nd.ones((2, 3))
    with forced_path(how):
        for bad, error in [
            ((0, 1), ValueError),
            ((2, -1), ValueError),
            ((1.5,), TypeError),
            ("2", TypeError),
            (True, TypeError),
        ]:
            with pytest.raises(
                error,
                match=r"ops\.tile': reps must be an int or a tuple "
                r"of ints >= 1",
            ):
                op(x, reps=bad).wait_to_read()
        y = op(x, reps=(2,))
    assert y.shape == (2, 6)
