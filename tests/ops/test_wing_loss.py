"""ops.wing_loss (Feng et al. 2018) against its formula, at and around the kink |x| = w."""

import math

import mxnet as mx
import numpy as np
import pytest

import ops
from customop import check_grad
from customop.dispatch import forced_path
from tests.ops import common

OPS = [ops.wing_loss, ops.wing_loss.numpy]
ids = lambda op: op.mode  # noqa: E731


def reference(pred, target, w=10.0, epsilon=2.0, weight=None):
    # Wing(x) = w ln(1 + |x|/eps) if |x| < w else |x| - C, C = w - w ln(1 + w/eps)
    x = np.abs(np.float64(pred) - np.float64(target))
    c = w - w * math.log(1 + w / epsilon)
    loss = np.where(x < w, w * np.log(1 + x / epsilon), x - c)
    return loss if weight is None else loss * weight


def reference_grad(pred, target, w=10.0, epsilon=2.0, weight=None):
    x = np.float64(pred) - np.float64(target)
    d = np.sign(x) * np.where(np.abs(x) < w, w / (epsilon + np.abs(x)), 1.0)
    return d if weight is None else d * weight


@pytest.mark.parametrize("op", OPS, ids=ids)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("w,epsilon", [(10.0, 2.0), (5.0, 0.5), (1.0, 3.0)])
def test_forward_matches_reference(op, dtype, w, epsilon):
    pred = (np.random.randn(4, 6) * 2 * w).astype(dtype)
    target = np.random.randn(4, 6).astype(dtype)
    weight = np.random.rand(4, 1).astype(dtype)
    tol = 2e-6 if dtype == np.float32 else 1e-12
    got = op(common.nd(pred), common.nd(target), w=w, epsilon=epsilon)
    assert got.dtype == dtype and got.shape == pred.shape
    np.testing.assert_allclose(
        got.asnumpy(), reference(pred, target, w, epsilon), rtol=tol, atol=tol
    )
    got = op(common.nd(pred), common.nd(target), common.nd(weight), w=w, epsilon=epsilon)
    np.testing.assert_allclose(
        got.asnumpy(), reference(pred, target, w, epsilon, weight), rtol=tol, atol=tol
    )


def test_continuous_at_the_kink():
    w, eps = 10.0, 2.0
    x = np.array([w - 1e-9, w, w + 1e-9, -w])
    got = ops.wing_loss(common.nd(x), common.nd(np.zeros(4)), w=w, epsilon=eps).asnumpy()
    np.testing.assert_allclose(got, w * math.log(1 + w / eps), rtol=1e-9)


@pytest.mark.parametrize("op", OPS, ids=ids)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_check_grad_on_both_sides_of_the_kink(op, dtype):
    w, eps, delta = 4.0, 1.0, 0.02  # finite-difference steps (1e-4, 1e-6) stay on one side
    target = np.random.randn(2, 6)
    offsets = np.array([w - delta, w + delta, -w + delta, -w - delta, 0.5, 3 * w])
    pred = target + offsets
    weight = np.random.rand(2, 6)
    check_grad(op, pred.astype(dtype), target.astype(dtype), w=w, epsilon=eps)
    check_grad(op, pred.astype(dtype), target.astype(dtype), weight.astype(dtype), w=w, epsilon=eps)
    check_grad(
        op, pred.astype(dtype), target.astype(dtype), weight[:, :1].astype(dtype), w=w, epsilon=eps
    )  # a weight broadcast along axis 1 gets the sum over it


@pytest.mark.parametrize("op", OPS, ids=ids)
def test_every_path_agrees_and_gradients_match_the_formula(op):
    pred = (np.random.randn(3, 4) * 8).astype(np.float32)
    target = np.random.randn(3, 4).astype(np.float32)
    weight = np.random.rand(3, 4).astype(np.float32)
    heads = [np.random.randn(3, 4).astype(np.float32)]
    params = dict(w=5.0, epsilon=1.0)
    (out,), (dp, dt, dw) = common.assert_paths_agree(op, [pred, target, weight], params, heads)
    np.testing.assert_allclose(out, reference(pred, target, 5.0, 1.0, weight), rtol=1e-5)
    want = reference_grad(pred, target, 5.0, 1.0, weight) * heads[0]
    np.testing.assert_allclose(dp, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dt, -want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dw, reference(pred, target, 5.0, 1.0) * heads[0], rtol=1e-5)
    (_,), (_, _, dw) = common.assert_paths_agree(op, [pred, target, weight[:1]], params, heads)
    np.testing.assert_allclose(
        dw, (reference(pred, target, 5.0, 1.0) * heads[0]).sum(axis=0, keepdims=True), rtol=1e-5
    )
    common.assert_paths_agree(op.variant(2), [pred, target], params, heads)


@pytest.mark.parametrize("hybridize", [False, True])
def test_gluon_block(hybridize):
    pred, label, weight = np.random.randn(4, 6) * 8, np.random.randn(4, 6), np.random.rand(4, 1)
    out, (dpred,) = common.block_run(
        ops.WingLoss(w=5.0, epsilon=1.0), [pred, label, weight], hybridize
    )
    np.testing.assert_allclose(
        out, reference(pred, label, 5.0, 1.0, weight).mean(axis=1), rtol=1e-5
    )
    np.testing.assert_allclose(
        dpred, reference_grad(pred, label, 5.0, 1.0, weight) / 6, rtol=1e-4, atol=1e-6
    )


@pytest.mark.parametrize("how", ["function", "custom"])
def test_mxnet_mode_copies_nothing_to_the_host(how):
    pred, target = np.random.randn(4, 5).astype(np.float32), np.zeros((4, 5), np.float32)
    assert common.hot_path_reads(ops.wing_loss, [pred, target], {"w": 2.0}, how) == (0, 0)


@pytest.mark.parametrize("op", OPS, ids=ids)
@pytest.mark.parametrize("how", ["direct", "custom"])
def test_bad_input_names_the_op_and_the_argument(op, how):
    x = mx.nd.ones((2, 3))
    with forced_path(how):
        for bad in (0.0, -1.0, float("nan"), float("inf")):
            with pytest.raises(
                ValueError,
                match=r"ops\.wing_loss': epsilon must be a finite "
                r"number > 0",
            ):
                op(x, x, epsilon=bad).wait_to_read()
            with pytest.raises(ValueError, match=r"ops\.wing_loss': w must be a finite number"):
                op(x, x, w=bad).wait_to_read()
        with pytest.raises(
            ValueError,
            match=r"ops\.wing_loss': target has shape \(3, 2\) but "
            r"must have shape \(2, 3\)",
        ):
            op(x, mx.nd.ones((3, 2))).wait_to_read()
        with pytest.raises(ValueError, match=r"ops\.wing_loss': weight has shape"):
            op(x, x, mx.nd.ones((2,))).wait_to_read()
        y = op(x, mx.nd.zeros((2, 3)), w=10.0, epsilon=2.0)
    np.testing.assert_allclose(y.asnumpy(), 10 * math.log(1.5), rtol=1e-6)
    with pytest.raises(ValueError, match=r"ops\.wing_loss': epsilon"):
        ops.WingLoss(epsilon=0.0)


def test_symbol_graph():
    s = ops.wing_loss(mx.sym.var("pred"), mx.sym.var("target"), w=3.0, epsilon=0.5)
    assert s.list_arguments() == ["pred", "target"]
    ex = s.simple_bind(mx.cpu(), pred=(2, 3), target=(2, 3))
    p, t = np.random.randn(2, 3) * 4, np.random.randn(2, 3)
    ex.forward(is_train=True, pred=p, target=t)
    ex.backward(mx.nd.ones((2, 3)))
    np.testing.assert_allclose(ex.outputs[0].asnumpy(), reference(p, t, 3.0, 0.5), rtol=1e-5)
    np.testing.assert_allclose(
        ex.grad_dict["pred"].asnumpy(), reference_grad(p, t, 3.0, 0.5), rtol=1e-5
    )
