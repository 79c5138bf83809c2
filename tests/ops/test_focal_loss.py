"""ops.focal_loss (Lin et al. 2017) against a float64 reference of the paper's formula."""

import sys

import mxnet as mx
import numpy as np
import pytest

import ops
from customop import check_grad
from customop.dispatch import forced_path
from tests.ops import common

OPS = [ops.focal_loss, ops.focal_loss.numpy]
ids = lambda op: op.mode  # noqa: E731


def sigmoid_pair(x):
    x = np.float64(x)
    return 1 / (1 + np.exp(-x)), 1 / (1 + np.exp(x))  # p and 1 - p, each without cancellation


def log_pair(x):
    # log p and log(1 - p); log(p) of a p rounded next to 1 would lose the digits at x = 30
    x = np.float64(x)
    return -np.log1p(np.exp(-x)), -np.log1p(np.exp(x))


def targets(label, num_class, ignore_label=-1):
    label = np.asarray(label)
    t = np.zeros(label.shape + (num_class,))
    for c in range(num_class):
        t[..., c] = label == c + 1  # label 0 is background, 1..C are channels 0..C-1
    return t, (label != ignore_label)[..., None] * 1.0


def normalizer(label, how, ignore_label=-1):
    valid = np.asarray(label) != ignore_label
    count = {"positive": (valid & (np.asarray(label) >= 1)).sum(), "valid": valid.sum(), "none": 1}[
        how
    ]
    return max(float(count), 1.0)


def reference(x, label, alpha=0.25, gamma=2.0, normalization="positive", ignore_label=-1, z=None):
    # FL = -alpha t (1-p)^gamma log p - (1-alpha)(1-t) p^gamma log(1-p), per class channel
    (p, q), (log_p, log_q) = sigmoid_pair(x), log_pair(x)
    t, valid = targets(label, x.shape[-1], ignore_label)
    loss = -alpha * t * q**gamma * log_p - (1 - alpha) * (1 - t) * p**gamma * log_q
    z = normalizer(label, normalization, ignore_label) if z is None else z
    return loss * valid / z


def reference_grad(
    x, label, alpha=0.25, gamma=2.0, normalization="positive", ignore_label=-1, z=None
):
    # d/dx: positives -alpha (1-p)^gamma (1 - p - gamma p log p),
    #       negatives -(1-alpha) p^gamma (gamma (1-p) log(1-p) - p)
    (p, q), (log_p, log_q) = sigmoid_pair(x), log_pair(x)
    t, valid = targets(label, x.shape[-1], ignore_label)
    d = -alpha * t * q**gamma * (q - gamma * p * log_p) - (1 - alpha) * (1 - t) * p**gamma * (
        gamma * q * log_q - p
    )
    z = normalizer(label, normalization, ignore_label) if z is None else z
    return d * valid / z


def sample(shape=(2, 5, 3), ignore_label=-1, scale=3.0):
    x = np.random.randn(*shape) * scale
    label = np.random.randint(0, shape[-1] + 1, size=shape[:-1])
    label[np.random.rand(*label.shape) < 0.2] = ignore_label
    return x, label


@pytest.mark.parametrize("op", OPS, ids=ids)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("normalization", ["positive", "valid", "none"])
def test_forward_and_gradient_match_the_paper(op, dtype, normalization):
    x, label = sample()
    params = dict(alpha=0.3, gamma=1.5, normalization=normalization)
    heads = [np.random.randn(*x.shape).astype(dtype)]
    tol = 1e-5 if dtype == np.float32 else 1e-10
    (out,), (dx, dl) = common.assert_paths_agree(
        op, [x.astype(dtype), label.astype(np.int32)], params, heads, rtol=tol, atol=tol
    )
    np.testing.assert_allclose(out, reference(x, label, **params), rtol=tol, atol=tol)
    np.testing.assert_allclose(
        dx, reference_grad(x, label, **params) * heads[0], rtol=tol, atol=tol
    )


@pytest.mark.parametrize("op", OPS, ids=ids)
def test_float_labels_ignore_label_above_c_and_gamma_zero(op):
    x, label = sample(ignore_label=255)
    params = dict(gamma=0.0, alpha=0.5, ignore_label=255, normalization="valid")
    got = op(common.nd(x), common.nd(label, np.float64), **params).asnumpy()
    np.testing.assert_allclose(got, reference(x, label, **params), rtol=1e-10)
    # gamma = 0 and alpha = 0.5 is half the binary cross-entropy
    p, q = sigmoid_pair(x)
    t, valid = targets(label, 3, 255)
    bce = -(t * np.log(p) + (1 - t) * np.log(q)) * valid / normalizer(label, "valid", 255)
    np.testing.assert_allclose(got, 0.5 * bce, rtol=1e-10)


@pytest.mark.parametrize("op", OPS, ids=ids)
def test_normalizer_input_replaces_the_normalization(op):
    x, label = sample()
    z = np.array([7.5])
    heads = [np.random.randn(*x.shape)]
    (out,), (dx, _, dz) = common.assert_paths_agree(
        op, [x, label.astype(np.int32), z], {}, heads, rtol=1e-10, atol=1e-12
    )
    np.testing.assert_allclose(out, reference(x, label, z=7.5), rtol=1e-10)
    np.testing.assert_allclose(dx, reference_grad(x, label, z=7.5) * heads[0], rtol=1e-10)
    # the output is L / z, so d/dz = -sum(head * output) / z
    np.testing.assert_allclose(dz, [-(heads[0] * out).sum() / 7.5], rtol=1e-10)


@pytest.mark.parametrize("op", OPS, ids=ids)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_check_grad(op, dtype):
    x, label = sample((2, 4, 3), scale=2.0)
    x, label, z = x.astype(dtype), label.astype(np.int32), np.array([2.5], dtype)
    check_grad(op, x, label, gamma=2.0)
    check_grad(op, x, label, normalization="valid", gamma=0.5, alpha=0.75)
    check_grad(op, x, label, z)
    check_grad(op, x, label.astype(dtype), argnums=["pred"], normalization="none")


@pytest.mark.parametrize("op", OPS, ids=ids)
def test_stable_for_large_logits(op):
    x = np.array([[[30.0, -30.0], [-30.0, 30.0], [100.0, -100.0], [-800.0, 800.0]]])
    label = np.array([[1, 1, 2, 0]])
    for dtype in (np.float32, np.float64):
        (out,), (dx, _) = common.run(op, [x.astype(dtype), label.astype(np.int32)])
        assert np.isfinite(out).all() and np.isfinite(dx).all()
    (out,), (dx, _) = common.run(op, [x[:, :2], label[:, :2].astype(np.int32)])
    np.testing.assert_allclose(out, reference(x[:, :2], label[:, :2]), rtol=1e-9, atol=1e-300)
    np.testing.assert_allclose(dx, reference_grad(x[:, :2], label[:, :2]), rtol=1e-9, atol=1e-300)
    check_grad(op, x[:, :2], label[:, :2].astype(np.int32))  # float64 at logits of +-30
    check_grad(op, x[:, :2], label[:, :2].astype(np.int32), gamma=0.0)


@pytest.mark.parametrize("op", OPS, ids=ids)
@pytest.mark.parametrize("how", common.PATHS)
def test_the_backward_reuses_the_forwards_work(op, how, monkeypatch):
    # targets, valid mask, normalizer and softplus terms reach the gradient as the forward's
    # residuals: built once per forward+backward, on every path
    module = sys.modules[op.fn.__module__]
    calls = []

    def counted(name, real):
        def call(*args):
            calls.append(name)
            return real(*args)

        return call

    x, label = sample()
    # (a graph path traces the op once per signature, at its first bind: not counted here)
    common.run(op, [x, label.astype(np.int32)], how=how)
    for name in ("_targets_nd", "_targets_np", "_normalizer_nd", "_normalizer_np"):
        monkeypatch.setattr(module, name, counted(name, getattr(module, name)))
    (out,), (dx, _) = common.run(op, [x, label.astype(np.int32)], how=how)
    np.testing.assert_allclose(dx, reference_grad(x, label), rtol=1e-10)
    kind = "nd" if op.mode == "mxnet" else "np"
    if how in ("symbol", "graph") and op.mode == "mxnet":  # native graphs: no Python at all
        assert calls == []
    else:
        assert sorted(calls) == [f"_normalizer_{kind}", f"_targets_{kind}"]


@pytest.mark.parametrize("hybridize", [False, True])
def test_gluon_block(hybridize):
    x, label = sample()
    out, (dx,) = common.block_run(ops.FocalLoss(alpha=0.4, gamma=1.0), [x, label], hybridize)
    want = reference(x, label, alpha=0.4, gamma=1.0)
    np.testing.assert_allclose(out, want.sum(axis=(1, 2)), rtol=1e-5)
    np.testing.assert_allclose(
        dx, reference_grad(x, label, alpha=0.4, gamma=1.0), rtol=1e-4, atol=1e-7
    )
    out, _ = common.block_run(ops.FocalLoss(), [x, label, [4.0]], hybridize)
    np.testing.assert_allclose(out, reference(x, label, z=4.0).sum(axis=(1, 2)), rtol=1e-5)


def test_symbols_with_and_without_normalizer():
    x, label = sample()
    for with_z in (False, True):
        names = ["pred", "label", "normalizer"][: 2 + with_z]
        s = ops.focal_loss(*[mx.sym.var(n) for n in names], gamma=1.0)
        assert s.list_arguments() == names
        ex = s.simple_bind(
            mx.cpu(),
            grad_req={"pred": "write", "label": "null", "normalizer": "null"},
            pred=x.shape,
            label=label.shape,
            normalizer=(1,),
        )
        feed = dict(pred=x, label=label, normalizer=np.array([3.0]))
        ex.forward(is_train=True, **{n: feed[n] for n in names})
        ex.backward(mx.nd.ones(x.shape))
        z = 3.0 if with_z else None
        np.testing.assert_allclose(
            ex.outputs[0].asnumpy(), reference(x, label, gamma=1.0, z=z), rtol=1e-5, atol=1e-7
        )
        np.testing.assert_allclose(
            ex.grad_dict["pred"].asnumpy(),
            reference_grad(x, label, gamma=1.0, z=z),
            rtol=1e-4,
            atol=1e-7,
        )


@pytest.mark.parametrize("how", ["function", "custom"])
def test_mxnet_mode_copies_nothing_to_the_host(how):
    x, label = sample()
    for inputs in ([x, label], [x, label, np.array([2.0])]):
        inputs = [a.astype(np.float32) for a in inputs]
        forward, backward = common.hot_path_reads(ops.focal_loss, inputs, {}, how)
        assert forward <= 1 and backward == 0  # the one flag is the label check


@pytest.mark.parametrize("op", OPS, ids=ids)
@pytest.mark.parametrize("how", ["direct", "custom"])
def test_bad_input_names_the_op_and_the_argument(op, how):
    x = mx.nd.zeros((2, 3, 4))
    with forced_path(how):
        for bad in (5, -2, 0.5):
            label = mx.nd.zeros((2, 3))
            label[1, 2] = bad
            with pytest.raises(
                ValueError,
                match=r"ops\.focal_loss': label has values outside "
                r"\[ignore_label, C\]: .*ignore_label=-1.*C=4",
            ):
                op(x, label).wait_to_read()
        with pytest.raises(
            ValueError,
            match=r"ops\.focal_loss': label has shape \(2, 4\) but "
            r"must have shape \(2, 3\)",
        ):
            op(x, mx.nd.zeros((2, 4))).wait_to_read()
        with pytest.raises(ValueError, match=r"ops\.focal_loss': normalizer must hold one value"):
            op(x, mx.nd.zeros((2, 3)), mx.nd.ones((2,))).wait_to_read()
        for key, value in [("alpha", 1.5), ("gamma", -1.0), ("normalization", "batch")]:
            with pytest.raises(ValueError, match=rf"ops\.focal_loss': {key} must"):
                op(x, mx.nd.zeros((2, 3)), **{key: value}).wait_to_read()
        y = op(x, mx.nd.array([[0, 4, -1], [1, 2, 3]]))
    assert np.isfinite(y.asnumpy()).all()
    with pytest.raises(ValueError, match=r"ops\.focal_loss': normalization"):
        ops.FocalLoss(normalization="sum")


@pytest.mark.parametrize("inline", [True, False])
def test_bad_labels_in_a_bound_graph_fail_and_the_executor_recovers(inline, monkeypatch):
    # Inlined (the op trains as MXNet operators), the label check is part of the graph: NaN
    # loss and gradient. As a Custom node (inlining off), the check raises the named error.
    if not inline:
        monkeypatch.setenv("CUSTOMOP_RUNTIME_OFF", "inline")
    s = ops.focal_loss(mx.sym.var("pred"), mx.sym.var("label"))
    ex = s.simple_bind(
        mx.cpu(), grad_req={"pred": "write", "label": "null"}, pred=(2, 3, 4), label=(2, 3)
    )
    assert hasattr(ex, "customop_inlined") == inline
    if inline:
        ex.forward(is_train=True, pred=np.zeros((2, 3, 4)), label=np.full((2, 3), 7.0))
        ex.backward(mx.nd.ones((2, 3, 4)))
        assert np.isnan(ex.outputs[0].asnumpy()).all()
        assert np.isnan(ex.grad_dict["pred"].asnumpy()).all()
    else:
        with pytest.raises(ValueError, match=r"ops\.focal_loss': label has values outside"):
            ex.forward(is_train=False, pred=np.zeros((2, 3, 4)), label=np.full((2, 3), 7.0))
            ex.outputs[0].wait_to_read()
    ex.forward(is_train=False, pred=np.zeros((2, 3, 4)), label=np.ones((2, 3)))
    np.testing.assert_allclose(
        ex.outputs[0].asnumpy().sum(),
        reference(np.zeros((2, 3, 4)), np.ones((2, 3))).sum(),
        rtol=1e-6,
    )


class _Loss(mx.gluon.HybridBlock):
    def __init__(self, ignore_label, **kwargs):
        super().__init__(**kwargs)
        self.ignore_label = ignore_label

    def hybrid_forward(self, F, pred, label):
        return ops.focal_loss(pred, label, ignore_label=self.ignore_label)


@pytest.mark.parametrize("ignore_label", [-1, 0, 5, 6, 255, -3])
def test_the_inlined_label_check_takes_each_valid_label_and_no_other(ignore_label):
    # C = 4: valid labels are 0..4 and ignore_label; the graph's check is one clip where
    # ignore_label lies next to [0, C] and a clip plus an equality elsewhere
    pred = mx.nd.array(np.random.RandomState(3).randn(1, 1, 4))
    net = _Loss(ignore_label)
    net.hybridize()
    valid = sorted({0, 1, 2, 3, 4, ignore_label})
    for value in valid:
        assert np.isfinite(net(pred, mx.nd.array([[value]])).asnumpy()).all(), value
    bad = {
        v for v in (-2, -1, 5, 6, 7, 254, 256, ignore_label - 1, ignore_label + 1) if v not in valid
    } | {0.5, ignore_label + 0.5, float("nan"), float("inf")}
    for value in sorted(bad):
        assert np.isnan(net(pred, mx.nd.array([[value]])).asnumpy()).all(), value
