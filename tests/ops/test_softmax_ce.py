"""ops.softmax_ce': an output layer equal to mx.nd.SoftmaxOutput, checked against its CE loss."""

import mxnet as mx
import numpy as np
import pytest

import ops
from customop import check_grad
from customop.dispatch import forced_path
from tests.ops import common

OPS = [ops.softmax_ce, ops.softmax_ce.numpy]
ids = lambda op: op.mode  # noqa: E731


def reference(x):
    x = np.float64(x)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def cross_entropy(outputs, inputs):
    # L = -sum_i log p[i, y_i], the loss whose gradient the layer returns
    p, y = outputs[0], inputs[1].astype(int)
    return -np.log(p[np.arange(len(y)), y]).sum()


def softmax_output(x, y):
    a = common.nd(x)
    a.attach_grad()
    with mx.autograd.record():
        out = mx.nd.SoftmaxOutput(a, common.nd(y))
    out.backward()
    return out.asnumpy(), a.grad.asnumpy()


@pytest.mark.parametrize("op", OPS, ids=ids)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("label_dtype", [np.float32, np.int32])
def test_equals_reference_and_softmax_output(op, dtype, label_dtype):
    x = (np.random.randn(6, 5) * 3).astype(dtype)
    y = np.array([0, 4, 2, 2, 1, 3]).astype(label_dtype)
    tol = 1e-6 if dtype == np.float32 else 1e-12
    (p,), (dx, dy) = common.assert_paths_agree(op, [x, y], rtol=tol, atol=tol)
    np.testing.assert_allclose(p, reference(x), rtol=tol, atol=tol)
    np.testing.assert_allclose(dx, reference(x) - np.eye(5)[y.astype(int)], rtol=tol, atol=tol)
    if dy is not None:
        assert not dy.any()
    native_p, native_dx = softmax_output(x, y.astype(dtype))
    np.testing.assert_allclose(p, native_p, rtol=tol, atol=tol)
    np.testing.assert_allclose(dx, native_dx, rtol=tol, atol=tol)


@pytest.mark.parametrize("op", OPS, ids=ids)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_check_grad_against_the_cross_entropy(op, dtype):
    x = (np.random.randn(4, 5) * 2).astype(dtype)
    check_grad(op, x, np.array([0, 4, 2, 1], np.int32), loss=cross_entropy)
    check_grad(op, x, np.array([3, 0, 0, 1], dtype), loss=cross_entropy, argnums=["data"])


@pytest.mark.parametrize("hybridize", [False, True])
def test_gluon_block(hybridize):
    x, y = np.random.randn(4, 3), np.array([2, 0, 1, 1])
    out, (dx,) = common.block_run(ops.SoftmaxCE(), [x, y], hybridize)
    np.testing.assert_allclose(out, reference(x), rtol=1e-5)
    np.testing.assert_allclose(dx, reference(x) - np.eye(3)[y], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("how", ["function", "custom"])
def test_mxnet_mode_copies_nothing_to_the_host(how):
    x, y = np.random.randn(4, 5).astype(np.float32), np.array([0, 1, 2, 4], np.float32)
    forward, backward = common.hot_path_reads(ops.softmax_ce, [x, y], {}, how)
    assert forward <= 1 and backward == 0  # the one flag is the label check


@pytest.mark.parametrize("op", OPS, ids=ids)
@pytest.mark.parametrize("how", ["direct", "custom"])
def test_bad_input_names_the_op_and_the_argument(op, how):
    x = mx.nd.ones((3, 4))
    with forced_path(how):
        for bad in ([0, 4, 1], [-1, 0, 0], [0.5, 1, 1]):
            with pytest.raises(
                ValueError,
                match=r"ops\.softmax_ce': label has values that are "
                r"not class indices in \[0, 3\]",
            ):
                op(x, mx.nd.array(bad)).wait_to_read()
        with pytest.raises(ValueError, match=r"ops\.softmax_ce': label has shape \(4,\)"):
            op(x, mx.nd.zeros((4,))).wait_to_read()
        with pytest.raises(ValueError, match=r"ops\.softmax_ce': data must have shape \(N, C\)"):
            op(mx.nd.ones((3, 2, 2)), mx.nd.zeros((3,))).wait_to_read()
        y = op(x, mx.nd.array([0, 3, 1]))
    np.testing.assert_allclose(y.asnumpy(), 0.25)


def test_module_training_step():
    data = mx.sym.var("data")
    out = ops.softmax_ce(
        mx.sym.FullyConnected(data, num_hidden=3, name="fc"), mx.sym.var("softmax_label"), name="sm"
    )
    mod = mx.mod.Module(out, data_names=["data"], label_names=["softmax_label"])
    mod.bind(data_shapes=[("data", (4, 5))], label_shapes=[("softmax_label", (4,))])
    mod.init_params(mx.init.Xavier())
    mod.init_optimizer(optimizer_params={"learning_rate": 0.5})
    x, y = mx.nd.array(np.random.randn(4, 5)), mx.nd.array([0, 1, 2, 1])
    batch = mx.io.DataBatch([x], [y])
    losses = []
    for _ in range(20):
        mod.forward_backward(batch)
        mod.update()
        p = mod.get_outputs()[0].asnumpy()
        losses.append(-np.log(p[np.arange(4), [0, 1, 2, 1]]).sum())
    assert losses[-1] < 0.5 * losses[0]
