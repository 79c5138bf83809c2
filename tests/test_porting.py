"""docs/porting.md's three worked ports (examples/porting/): each hand-written CustomOp and its
@customop port run on the same inputs on the nd, sym (bound executor / Module) and hybridized
paths, with equal outputs and gradients (the sampler: equal draws from the same NumPy seed),
and the ports against float64 references from the formulas."""

import re
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest

from customop import check_grad
from examples.porting import loss_layer, sampler, weighted_op

ROOT = Path(__file__).resolve().parents[1]
PATHS = ("nd", "sym", "hybridized")


def _close(a, b, **tol):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), **{"rtol": 1e-5, "atol": 1e-6, **tol})


# ---- the loss layer (need_top_grad=False) -------------------------------------------------
def _loss_inputs():
    rng = np.random.RandomState(0)
    return (rng.normal(size=(6, 3)).astype(np.float32), (rng.rand(6, 3) > 0.5).astype(np.float32))


def _loss_reference(x, y, pos_weight):
    p = 1 / (1 + np.exp(-x.astype(np.float64)))
    return p, (pos_weight * y + (1 - y)) * (p - y) / x.shape[0]


class _Loss(mx.gluon.HybridBlock):
    def __init__(self, original, **kwargs):
        super().__init__(**kwargs)
        self.original = original

    def hybrid_forward(self, F, x, y):
        if self.original:
            return F.Custom(x, y, op_type="porting_weighted_sigmoid", pos_weight=3.0)
        return loss_layer.weighted_sigmoid(x, y, pos_weight=3.0)


def _run_loss(original, path, x, y):
    if path == "sym":
        data, label = mx.sym.var("data"), mx.sym.var("label")
        s = (
            mx.sym.Custom(data, label, op_type="porting_weighted_sigmoid", pos_weight=3.0)
            if original
            else loss_layer.weighted_sigmoid(data, label, pos_weight=3.0)
        )
        ex = s.simple_bind(mx.cpu(), data=x.shape, label=y.shape)
        ex.arg_dict["data"][:], ex.arg_dict["label"][:] = x, y
        out = ex.forward(is_train=True)[0].asnumpy()
        ex.backward()
        return out, ex.grad_dict["data"].asnumpy(), ex.grad_dict["label"].asnumpy()
    xs, ys = mx.nd.array(x), mx.nd.array(y)
    xs.attach_grad()
    ys.attach_grad()
    net = _Loss(original)
    if path == "hybridized":
        net.hybridize()
    with mx.autograd.record():
        out = net(xs, ys)
    out.backward()
    return out.asnumpy(), xs.grad.asnumpy(), ys.grad.asnumpy()


@pytest.mark.parametrize("path", PATHS)
def test_the_loss_layer_port_matches_the_original(path):
    x, y = _loss_inputs()
    original = _run_loss(True, path, x, y)
    port = _run_loss(False, path, x, y)
    for a, b in zip(original, port):
        _close(a, b)
    p, grad = _loss_reference(x, y, 3.0)
    _close(port[0], p)
    _close(port[1], grad)
    assert not port[2].any()  # label: no gradient


def test_check_grad_checks_the_loss_layer_against_the_loss_it_differentiates():
    x, y = (a.astype(np.float64) for a in _loss_inputs())

    def weighted_bce(outputs, inputs):
        p, y = outputs[0], inputs[1]
        weight = 3.0 * y + (1 - y)
        return float(-(weight * (y * np.log(p) + (1 - y) * np.log(1 - p))).sum() / len(p))

    assert check_grad(
        loss_layer.weighted_sigmoid, x, y, argnums=["data"], loss=weighted_bce, pos_weight=3.0
    ).passed


# ---- the sampler (four named outputs, no gradient, NumPy's RNG) -----------------------------
def _sampler_inputs():
    rng = np.random.RandomState(1)
    gt = np.array([[10, 10, 40, 40, 1], [50, 20, 90, 70, 2]], np.float32)
    jitter = rng.randint(-12, 13, size=(14, 4)).astype(np.float32)
    rois = np.vstack([gt[:, :4]] * 7) + jitter
    rois[:, 2:] = np.maximum(rois[:, 2:], rois[:, :2] + 2)
    return rois, gt


PARAMS = dict(num_classes=3, batch_rois=8, fg_fraction=0.5, fg_overlap=0.5)


class _Sampler(mx.gluon.HybridBlock):
    def __init__(self, original, **kwargs):
        super().__init__(**kwargs)
        self.original = original

    def hybrid_forward(self, F, rois, gt):
        if self.original:
            return F.Custom(rois, gt, op_type="porting_proposal_target", **PARAMS)
        return sampler.proposal_target(rois, gt, **PARAMS)


def _run_sampler(original, path, rois, gt, seed):
    if path == "sym":
        r, g = mx.sym.var("rois"), mx.sym.var("gt_boxes")
        s = (
            mx.sym.Custom(r, g, op_type="porting_proposal_target", name="pt", **PARAMS)
            if original
            else sampler.proposal_target(r, g, name="pt", **PARAMS)
        )
        ex = s.simple_bind(mx.cpu(), rois=rois.shape, gt_boxes=gt.shape)
        ex.arg_dict["rois"][:], ex.arg_dict["gt_boxes"][:] = rois, gt
        np.random.seed(seed)
        outs = [o.asnumpy() for o in ex.forward(is_train=True)]
        ex.backward()
        return s.list_outputs(), outs, ex.grad_dict["rois"].asnumpy()
    net = _Sampler(original)
    if path == "hybridized":
        net.hybridize()
    rs = mx.nd.array(rois)
    rs.attach_grad()
    np.random.seed(seed)
    with mx.autograd.record():
        outs = net(rs, mx.nd.array(gt))
    mx.autograd.backward(list(outs))
    return None, [o.asnumpy() for o in outs], rs.grad.asnumpy()


@pytest.mark.parametrize("path", PATHS)
def test_the_sampler_port_draws_what_the_original_draws(path):
    rois, gt = _sampler_inputs()
    for seed in (3, 4):
        names, original, og = _run_sampler(True, path, rois, gt, seed)
        port_names, port, pg = _run_sampler(False, path, rois, gt, seed)
        assert names == port_names  # ['pt_rois_output', 'pt_label', ...] on the sym path
        for a, b in zip(original, port):
            np.testing.assert_array_equal(a, b)
        assert not og.any() and not pg.any()
    out_rois, label, target, weight = port
    fg = label > 0
    assert 1 <= fg.sum() <= 4 and (label[~fg] == 0).all()
    # a foreground proposal overlaps the ground truth box of its class by >= fg_overlap
    iou = sampler._iou(out_rois[fg].astype(np.float64), gt[:, :4].astype(np.float64))
    assert (iou[np.arange(fg.sum()), label[fg].astype(int) - 1] >= 0.5).all()
    assert (weight[fg].sum(axis=1) == 4).all() and not weight[~fg].any()
    if path == "sym":
        assert port_names == ["pt_rois_output", "pt_label", "pt_bbox_target", "pt_bbox_weight"]


# ---- the weighted op (inferred weight shape, joint backward, aux schedule) -----------------
NUM_HIDDEN, STEPS = 3, 2


def _margin_inputs():
    rng = np.random.RandomState(2)
    return (
        rng.normal(size=(4, 5)).astype(np.float32),
        rng.randint(0, NUM_HIDDEN, size=4).astype(np.float32),
        rng.normal(size=(NUM_HIDDEN, 5)).astype(np.float32),
        rng.normal(size=(4, NUM_HIDDEN)).astype(np.float32),
    )


def _margin_reference(x, y, w, head, step, scale=16.0, margin=0.35, base=100.0, gamma=0.5):
    """float64, from the docstring's formulas: output and the gradients of data and weight."""
    x, w, head = x.astype(np.float64), w.astype(np.float64), head.astype(np.float64)
    xn, wn = np.linalg.norm(x, axis=1, keepdims=True), np.linalg.norm(w, axis=1, keepdims=True)
    xh, wh = x / xn, w / wn
    m = margin / (1 + max(0.0, base / (1 + gamma * step)))
    out = scale * (xh @ wh.T - m * np.eye(NUM_HIDDEN)[y.astype(int)])
    g, h = scale * head @ wh, scale * head.T @ xh
    return (
        out,
        (g - xh * (g * xh).sum(1, keepdims=True)) / xn,
        (h - wh * (h * wh).sum(1, keepdims=True)) / wn,
    )


class _Margin(mx.gluon.HybridBlock):
    def __init__(self, original, **kwargs):
        super().__init__(**kwargs)
        self.original = original
        with self.name_scope():
            self.weight = self.params.get("weight", shape=(NUM_HIDDEN, 0), allow_deferred_init=True)
            self.iteration = self.params.get(
                "iteration", shape=(1,), init=mx.init.Zero(), grad_req="null"
            )

    def hybrid_forward(self, F, x, y, weight, iteration):
        if self.original:
            return F.Custom(
                x, y, weight, iteration, op_type="porting_margin_cosine", num_hidden=NUM_HIDDEN
            )
        return weighted_op.margin_cosine(x, y, weight, iteration, num_hidden=NUM_HIDDEN)


def _run_margin(original, path, x, y, w, head):
    """Per step: output, data gradient, weight gradient; then the iteration count."""
    steps = []
    if path == "sym":  # Module, bound without the weight's shape
        data, label, heads = mx.sym.var("data"), mx.sym.var("label"), mx.sym.var("head")
        weight = mx.sym.var("fc_weight")
        out = (
            mx.sym.Custom(
                data,
                label,
                weight,
                op_type="porting_margin_cosine",
                num_hidden=NUM_HIDDEN,
                name="fc",
            )
            if original
            else weighted_op.margin_cosine(data, label, weight, num_hidden=NUM_HIDDEN, name="fc")
        )
        loss = mx.sym.MakeLoss(mx.sym.sum(out * heads))
        mod = mx.mod.Module(
            mx.sym.Group([loss, mx.sym.BlockGrad(out)]),
            data_names=["data", "head"],
            label_names=["label"],
        )
        mod.bind(
            data_shapes=[("data", x.shape), ("head", head.shape)],
            label_shapes=[("label", y.shape)],
            inputs_need_grad=True,
        )
        mod.init_params(
            arg_params={"fc_weight": mx.nd.array(w)}, aux_params={"fc_iteration": mx.nd.zeros((1,))}
        )
        ex = mod._exec_group.execs[0]
        for _ in range(STEPS):
            mod.forward_backward(
                mx.io.DataBatch([mx.nd.array(x), mx.nd.array(head)], [mx.nd.array(y)])
            )
            steps.append(
                (
                    mod.get_outputs()[1].asnumpy(),
                    mod.get_input_grads()[0].asnumpy(),
                    ex.grad_dict["fc_weight"].asnumpy(),
                )
            )
        mx.nd.waitall()
        return steps, ex.aux_dict["fc_iteration"].asnumpy()
    net = _Margin(original)
    net.initialize()
    if path == "hybridized":
        net.hybridize()
    for step in range(STEPS):
        xs = mx.nd.array(x)
        xs.attach_grad()
        with mx.autograd.record():
            out = net(xs, mx.nd.array(y))
        if step == 0:  # deferred initialisation has run: the weight is (3, 5) now
            assert net.weight.shape == w.shape
            net.weight.set_data(mx.nd.array(w))
            with mx.autograd.record():
                out = net(xs, mx.nd.array(y))
        out.backward(mx.nd.array(head))
        steps.append((out.asnumpy(), xs.grad.asnumpy(), net.weight.grad().asnumpy()))
    mx.nd.waitall()
    return steps, net.iteration.data().asnumpy()


@pytest.mark.parametrize("path", PATHS)
def test_the_weighted_op_port_matches_the_original(path):
    x, y, w, head = _margin_inputs()
    original, original_count = _run_margin(True, path, x, y, w, head)
    port, port_count = _run_margin(False, path, x, y, w, head)
    assert original_count.tolist() == port_count.tolist() == [float(STEPS)]
    for step, (a, b) in enumerate(zip(original, port)):
        for got, want in zip(a, b):
            _close(got, want, rtol=1e-4, atol=1e-5)
        for got, want in zip(b, _margin_reference(x, y, w, head, step)):
            _close(got, want, rtol=1e-4, atol=1e-5)


# ---- the guide shows the code that runs ---------------------------------------------------
def test_the_porting_guide_includes_the_tested_code():
    guide = (ROOT / "docs" / "porting.md").read_text()
    included = re.findall(r"```\{literalinclude\} (\S+)\n((?::\w[\w-]*:.*\n)*)", guide)
    seen = set()
    for path, options in included:
        source = (ROOT / "docs" / path).resolve()
        assert source.parent == ROOT / "examples" / "porting", path
        text = source.read_text()
        for marker in re.findall(r":(?:start-after|end-before): (.+)", options):
            assert marker.strip() in text, (path, marker)
        seen.add(source.name)
    assert seen == {"loss_layer.py", "sampler.py", "weighted_op.py"}
