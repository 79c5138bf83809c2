"""ops.center_loss (Wen et al. 2016): the centers are an auxiliary state updated in backward."""

import sys

import mxnet as mx
import numpy as np
import pytest

import ops
from customop import check_grad
from customop.dispatch import forced_path
from tests.ops import common

OPS = [ops.center_loss, ops.center_loss.numpy]
ids = lambda op: op.mode  # noqa: E731
K, D = 4, 3


def reference_step(x, y, centers, alpha=0.5, scale=1.0, head=None):
    """Loss, d loss/d x and the updated centers, in float64 with explicit loops."""
    x, c = np.float64(x), np.array(centers, np.float64)
    y = np.asarray(y).astype(int)
    head = np.ones(len(x)) if head is None else np.float64(head)
    loss = np.array([0.5 * scale * np.sum((x[i] - c[y[i]]) ** 2) for i in range(len(x))])
    grad = np.stack([scale * (x[i] - c[y[i]]) * head[i] for i in range(len(x))])
    new = c.copy()
    for j in range(len(c)):  # c_j -= alpha * sum_{i: y_i = j} (c_j - x_i) / (1 + n_j)
        members = [i for i in range(len(x)) if y[i] == j]
        new[j] -= alpha * sum(c[j] - x[i] for i in members) / (1 + len(members))
    return loss, grad, new


def batch(n=6):
    x = np.random.randn(n, D)
    y = np.array([1, 1, 1, 3, 0, 1][:n])  # several samples of class 1 in one batch
    return x, y


@pytest.mark.parametrize("op", OPS, ids=ids)
@pytest.mark.parametrize("how", ["function", "custom"])
@pytest.mark.parametrize("label_dtype", [np.float32, np.int32])
def test_steps_match_the_reference_imperatively(op, how, label_dtype):
    centers = mx.nd.array(np.random.randn(K, D))
    want_c = centers.asnumpy().astype(np.float64)
    for _ in range(3):
        x, y = batch()
        head = np.random.randn(len(x))
        loss_want, grad_want, want_c_next = reference_step(
            x, y, want_c, alpha=0.3, scale=2.0, head=head
        )
        xs = common.nd(x, np.float32)
        xs.attach_grad()
        with forced_path(how), mx.autograd.record():
            loss = op(xs, common.nd(y, label_dtype), centers, num_class=K, alpha=0.3, scale=2.0)
        loss.backward(common.nd(head, np.float32))
        np.testing.assert_allclose(loss.asnumpy(), loss_want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(xs.grad.asnumpy(), grad_want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(centers.asnumpy(), want_c_next, rtol=1e-5, atol=1e-6)
        want_c = want_c_next


@pytest.mark.parametrize("op", OPS, ids=ids)
def test_float64_and_inference_leaves_centers_alone(op):
    x, y = batch()
    c0 = np.random.randn(K, D)
    centers = common.nd(c0)
    got = op(common.nd(x), common.nd(y), centers, num_class=K, scale=0.5)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got.asnumpy(), reference_step(x, y, c0, scale=0.5)[0], rtol=1e-12)
    np.testing.assert_array_equal(centers.asnumpy(), c0)  # no backward, no update


@pytest.mark.parametrize("op", OPS, ids=ids)
def test_symbol_executor_creates_and_updates_the_centers(op):
    x, y = batch()
    s = op(mx.sym.var("data"), mx.sym.var("label"), num_class=K, alpha=0.5, name="cl")
    assert s.list_arguments() == ["data", "label"]
    assert s.list_auxiliary_states() == ["cl_centers"]
    ex = s.simple_bind(
        mx.cpu(), grad_req={"data": "write", "label": "null"}, data=x.shape, label=y.shape
    )
    c = np.zeros((K, D))
    np.testing.assert_array_equal(ex.aux_dict["cl_centers"].asnumpy(), c)
    for _ in range(3):
        ex.forward(is_train=True, data=x, label=y)
        ex.backward(mx.nd.ones(len(x)))
        loss, grad, c = reference_step(x, y, c)
        np.testing.assert_allclose(ex.outputs[0].asnumpy(), loss, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(ex.grad_dict["data"].asnumpy(), grad, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(ex.aux_dict["cl_centers"].asnumpy(), c, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", OPS, ids=ids)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_check_grad(op, dtype):
    # alpha=0 keeps the executor's centers (zeros) fixed while check_grad runs backward
    x, y = batch()
    s = op(mx.sym.var("data"), mx.sym.var("label"), num_class=K, alpha=0.0, scale=1.5)
    check_grad(s, x.astype(dtype), y.astype(np.int32))


def test_module_trains_saves_and_loads_the_centers(tmp_path):
    data, label = mx.sym.var("data"), mx.sym.var("label")
    feat = mx.sym.FullyConnected(data, num_hidden=D, name="fc")
    out = mx.sym.MakeLoss(mx.sym.sum(ops.center_loss(feat, label, num_class=K, name="cl")))
    out = mx.sym.Group([out, mx.sym.BlockGrad(feat)])
    mod = mx.mod.Module(out, data_names=["data"], label_names=["label"])
    mod.bind(data_shapes=[("data", (6, 5))], label_shapes=[("label", (6,))])
    mod.init_params(mx.init.Xavier())
    mod.init_optimizer(optimizer_params={"learning_rate": 0.0})  # features stay fixed
    x, y = np.random.randn(6, 5), batch()[1]
    c = np.zeros((K, D))
    for _ in range(3):
        mod.forward_backward(mx.io.DataBatch([mx.nd.array(x)], [mx.nd.array(y)]))
        mod.update()
        feats = mod.get_outputs()[1].asnumpy()
        c = reference_step(feats, y, c)[2]
    mx.nd.waitall()
    np.testing.assert_allclose(mod.get_params()[1]["cl_centers"].asnumpy(), c, rtol=1e-5, atol=1e-6)
    mod.save_checkpoint(str(tmp_path / "cl"), 1)
    _, _, aux = mx.model.load_checkpoint(str(tmp_path / "cl"), 1)
    np.testing.assert_allclose(aux["cl_centers"].asnumpy(), c, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", OPS, ids=ids)
@pytest.mark.parametrize("hybridize", [False, True])
def test_gluon_block_owns_the_centers(op, hybridize, tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules["ops.center_loss"], "center_loss", op)  # either twin
    block = ops.CenterLoss(num_class=K, feature_dim=D, alpha=0.25, scale=3.0)
    block.initialize()
    assert block.centers.grad_req == "null"
    c = np.zeros((K, D))
    for _ in range(3):
        x, y = batch()
        out, (dx,) = common.block_run(block, [x, y], hybridize)
        loss, grad, c = reference_step(x, y, c, alpha=0.25, scale=3.0)
        np.testing.assert_allclose(out, loss, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(dx, grad, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(block.centers.data().asnumpy(), c, rtol=1e-5, atol=1e-6)
    block.save_parameters(str(tmp_path / "c.params"))
    again = ops.CenterLoss(num_class=K, feature_dim=D)
    again.load_parameters(str(tmp_path / "c.params"))
    np.testing.assert_allclose(again.centers.data().asnumpy(), c, rtol=1e-6)


@pytest.mark.parametrize("how", ["function", "custom"])
def test_mxnet_mode_copies_nothing_to_the_host(how):
    x, y = batch()
    centers = mx.nd.zeros((K, D))
    xs = common.nd(x, np.float32)
    xs.attach_grad()
    label = common.nd(y, np.float32)
    for guarded in (False, True):  # the first call infers shapes (once per signature)
        with forced_path(how), common.no_host_copies() if guarded else _nothing() as reads:
            with mx.autograd.record():
                loss = ops.center_loss(xs, label, centers, num_class=K)
            mx.nd.waitall()
            n_forward = len(reads)
            loss.backward()
            mx.nd.waitall()
    assert n_forward <= 1 and len(reads) == n_forward  # the one flag is the label check


class _nothing:
    def __enter__(self):
        return []

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("op", OPS, ids=ids)
@pytest.mark.parametrize("how", ["direct", "custom"])
def test_bad_input_names_the_op_and_the_argument(op, how):
    x, centers = mx.nd.ones((3, D)), mx.nd.zeros((K, D))
    with forced_path(how):
        for bad in ([0, K, 1], [-1, 0, 0], [0.5, 1, 1]):
            with pytest.raises(
                ValueError,
                match=r"ops\.center_loss': label has values that are "
                r"not class indices in \[0, num_class - 1\] = \[0, 3\]",
            ):
                op(x, mx.nd.array(bad), centers, num_class=K).wait_to_read()
        with pytest.raises(ValueError, match=r"ops\.center_loss': label has shape \(4,\)"):
            op(x, mx.nd.zeros((4,)), centers, num_class=K).wait_to_read()
        with pytest.raises(ValueError, match=r"ops\.center_loss': data must have shape"):
            op(
                mx.nd.ones((3, 2, 2)), mx.nd.zeros((3,)), mx.nd.zeros((K, 2)), num_class=K
            ).wait_to_read()
        with pytest.raises(
            ValueError,
            match=r"ops\.center_loss': alpha must be a finite number"
            r" in \[0, 1\]",
        ):
            op(x, mx.nd.zeros((3,)), centers, num_class=K, alpha=2.0).wait_to_read()
        with pytest.raises(ValueError, match=r"auxiliary state 'centers' has shape"):
            op(x, mx.nd.zeros((3,)), mx.nd.zeros((K + 1, D)), num_class=K).wait_to_read()
        y = op(x, mx.nd.array([0, 1, 3]), centers, num_class=K)
    np.testing.assert_allclose(y.asnumpy(), 0.5 * D)


def _aux_rules():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "aux_rules.py"
    spec = importlib.util.spec_from_file_location("aux_rules", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _documented_table():
    # docs/howto/aux_states.md: | rule | 4 classes: vs one device | vs hand-written | 64 ...
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "howto" / "aux_states.md").read_text()
    rows = {}
    for line in text.splitlines():
        cells = [c.strip().strip("`*'") for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0] in ("sum", "mean", "first", "local"):
            rows[cells[0]] = [float(c.strip("*")) for c in cells[1:]]
    return rows


@pytest.mark.parametrize("classes", [4, 64])
def test_what_the_aux_states_how_to_says_of_each_merge_rule_holds(classes):
    # The merge-rule table's script (benchmarks/aux_rules.py): Module on 2 CPU contexts, the
    # same op per rule, against one device on the whole batch and a hand-written CustomOp.
    rows = _aux_rules().measure(steps=3, num_class=classes)
    rules = ("sum", "mean", "first", "local")
    for rule in rules:  # on one device every rule is the hand-written op, exactly
        assert rows[rule]["one device vs hand-written"] < 1e-6, rule
    assert rows["local"]["vs hand-written"] < 1e-6  # 'local' is the original's behaviour
    for rule in rules:  # no rule reproduces one device on the whole batch
        assert rows[rule]["vs one device"] > 1e-2, rule
    closest = min(rules, key=lambda r: rows[r]["vs one device"])
    assert closest == ("mean" if classes == 4 else "sum")  # as documented
    documented = _documented_table()
    column = 0 if classes == 4 else 2
    for rule in rules:
        want = documented[rule][column : column + 2]
        got = [rows[rule]["vs one device"], rows[rule]["vs hand-written"]]
        np.testing.assert_allclose(got, want, rtol=0.02, atol=1e-3, err_msg=rule)
    # ops.center_loss keeps the rule closest where classes are many (its face-recognition use)
    assert ops.center_loss.aux_rules == {"centers": "sum"}
