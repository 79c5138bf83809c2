"""Issue 25 item 4: the three model examples train the same on every path.

Each example takes 4 SGD steps imperatively, hybridized, through Module and
exported-then-reloaded (examples/four_paths.py); the losses must agree to 1e-5 relative
at every step.  The first step's loss (or the graph's parts) is also checked against an
independent reference: NumPy formulas, or the same head in MXNet's own operators.
"""

import importlib
import json
import sys
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest

from tests import fresh

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
four_paths = importlib.import_module("four_paths")


@pytest.fixture
def numpy_rng_kept():
    # the Faster R-CNN example seeds NumPy's global generator: hand it back as it was
    state = np.random.get_state()
    yield
    np.random.set_state(state)


@pytest.mark.parametrize("name", ["retinanet_head", "faster_rcnn_head", "face_embedding"])
def test_four_sgd_steps_give_the_same_losses_on_every_path(name, numpy_rng_kept):
    losses = importlib.import_module(name).train_every_path()
    assert sorted(losses) == sorted(four_paths.PATHS)
    want = np.array(losses["imperative"])
    assert want.shape == (4,) and np.all(np.isfinite(want)), want
    for path in four_paths.PATHS:
        np.testing.assert_allclose(losses[path], want, rtol=1e-5, err_msg=path)
    # it trains: the examples alternate two batches, and each one's loss fell on its second visit
    assert want[2] < want[0] and want[3] < want[1], want


@pytest.mark.parametrize("name", ["retinanet_head", "faster_rcnn_head", "face_embedding"])
def test_four_sgd_steps_are_the_same_with_inlining_switched_off(name, numpy_rng_kept, monkeypatch):
    # Issue 33 item 4: ops with their own gradients inline in training (their closures
    # transposed); with CUSTOMOP_RUNTIME_OFF=inline every op is a Custom node again.
    module = importlib.import_module(name)
    state = np.random.get_state()
    inlined = module.train_every_path()
    np.random.set_state(state)
    monkeypatch.setenv("CUSTOMOP_RUNTIME_OFF", "inline")
    custom = module.train_every_path()
    for path in four_paths.PATHS:
        np.testing.assert_allclose(inlined[path], custom[path], rtol=1e-5, err_msg=path)


def test_the_face_head_starts_at_the_loss_of_its_formula():
    face = importlib.import_module("face_embedding")
    net = face.make_block()
    params = four_paths.initial_params(face.make_block)
    descriptor, identity = face.make_batches(1)[0]
    layers = [net.embed[0], net.embed[1], net.classify]
    weight, bias = (
        [params[getattr(la, k).name].astype(np.float64) for la in layers]
        for k in ("weight", "bias")
    )
    hidden = np.maximum(descriptor @ weight[0].T + bias[0], 0)
    embedding = hidden @ weight[1].T + bias[1]
    logits = embedding @ weight[2].T + bias[2]
    m = logits.max(axis=1)
    cross_entropy = (
        m
        + np.log(np.exp(logits - m[:, None]).sum(axis=1))
        - logits[np.arange(len(identity)), identity.astype(int)]
    ).sum()
    centers = face.CENTER_WEIGHT / 2 * (embedding**2).sum()  # the centers start at zero
    losses = face.train_every_path(steps=1)
    np.testing.assert_allclose(losses["imperative"][0], cross_entropy + centers, rtol=1e-5)


def _iou(a, b):
    lt, rb = np.maximum(a[:, None, :2], b[None, :, :2]), np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(rb - lt, 0, None), axis=2)
    area = lambda x: np.prod(x[:, 2:] - x[:, :2], axis=1)  # noqa: E731
    return inter / (area(a)[:, None] + area(b)[None, :] - inter)


def test_the_faster_rcnn_sampler_draws_seeded_proposals_and_their_targets(numpy_rng_kept):
    rcnn = importlib.import_module("faster_rcnn_head")
    _, proposals, gt, labels = rcnn.make_batches(1)[0]
    draws = []
    for seed in (0, 0, 1):
        np.random.seed(seed)
        outs = rcnn.sample_proposals(mx.nd.array(proposals), mx.nd.array(gt), mx.nd.array(labels))
        draws.append([o.asnumpy() for o in outs])  # drawn before the next seed
    for a, b in zip(draws[0], draws[1]):
        np.testing.assert_array_equal(a, b)  # the same seed, the same draw
    assert not np.array_equal(draws[0][0], draws[2][0])  # drawn, not fixed
    index, label, target, weight = draws[0]
    s, p = rcnn.NUM_SAMPLE, rcnn.PROPOSALS
    assert index.shape == (rcnn.BATCH * s,) and target.shape == weight.shape == (rcnn.BATCH * s, 4)
    for b in range(rcnn.BATCH):
        rows = slice(b * s, (b + 1) * s)
        picked = index[rows].astype(int) - b * p
        assert np.all((picked >= 0) & (picked < p))
        iou = _iou(proposals[b].astype(np.float64), gt[b].astype(np.float64))[picked]
        fg = iou.max(axis=1) >= 0.5
        want_fg = min((_iou(proposals[b], gt[b]).max(axis=1) >= 0.5).sum(), int(0.25 * s))
        assert fg.sum() == want_fg > 0 and np.all(fg[:want_fg])  # foreground first
        match = iou.argmax(axis=1)
        np.testing.assert_array_equal(label[rows], np.where(fg, labels[b][match], 0))
        np.testing.assert_array_equal(weight[rows], np.repeat(fg[:, None], 4, axis=1))
        # R-CNN box coding of each foreground proposal against its box, from the formula
        a, r = proposals[b][picked].astype(np.float64), gt[b][match].astype(np.float64)
        wa, wr = a[:, 2:] - a[:, :2], r[:, 2:] - r[:, :2]
        t = np.concatenate([((r[:, :2] + wr / 2) - (a[:, :2] + wa / 2)) / wa, np.log(wr / wa)], 1)
        want = np.where(fg[:, None], (t - rcnn.MEANS) / rcnn.STDS, 0)
        np.testing.assert_allclose(target[rows], want, rtol=1e-4, atol=1e-4)


def test_the_retinanet_head_equals_the_same_head_in_native_operators():
    # benchmarks/composed.py checks this before it times anything; its --quick run here keeps
    # the benchmark runnable and the check in the suite
    proc = fresh.run(
        [sys.executable, "benchmarks/composed.py", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "loss and every gradient agree" in proc.stderr
    rows = [
        line.split("anchors", 1)[1].rsplit(None, 4)[0].strip()
        for line in proc.stdout.splitlines()
        if line.startswith("RetinaNet")
    ]
    assert rows == [
        "ours",
        "native",
        "ours imperative",
        "native imperative",
        "ours imperative, function path",
    ]


def _step_outputs_and_grads(make_block, params, batch, hybridize):
    # one step's outputs and gradients, on the second call (imperatively the first call
    # of a signature runs the op, the second the traced graph); the centers (an aux state
    # ours moves in backward) are set back before each call, NumPy's generator seeded
    net = make_block()
    net.initialize()
    for name, p in net.collect_params().items():
        p.set_data(mx.nd.array(params[name]))
    if hybridize:
        net.hybridize()
    for _ in range(2):
        for name, p in net.collect_params().items():
            if name.endswith("centers"):
                p.set_data(mx.nd.array(params[name]))
        # the sampler draws when MXNet's engine runs it: the last step's draws are done
        # before the generator is seeded again (else they took this step's numbers)
        mx.nd.waitall()
        np.random.seed(7)
        with mx.autograd.record():
            outs = list(net(*[mx.nd.array(a) for a in batch]))
        mx.autograd.backward(outs)
    grads = {n: p.grad().asnumpy() for n, p in net.collect_params().items() if p.grad_req != "null"}
    return [o.asnumpy() for o in outs], grads


@pytest.mark.parametrize("name", ["faster_rcnn_head", "face_embedding"])
@pytest.mark.parametrize("hybridize", [False, True])
def test_the_other_heads_equal_the_same_heads_in_native_operators(name, hybridize, numpy_rng_kept):
    # Issue 55 item 1: benchmarks/op_counts.py counts these native heads' operators
    # against ours; they must be the same model (outputs and gradients)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    native_heads = importlib.import_module("native_heads")
    module = importlib.import_module(name)
    make_native = {
        "faster_rcnn_head": native_heads.make_rcnn_head,
        "face_embedding": native_heads.make_face_head,
    }[name]
    params = four_paths.initial_params(module.make_block)
    for key in params:
        if key.endswith("centers"):  # away from zero: the center loss's gradient reads them
            params[key] = np.random.RandomState(1).randn(*params[key].shape).astype(np.float32)
    batch = module.make_batches(1)[0]
    got, got_grads = _step_outputs_and_grads(module.make_block, params, batch, hybridize)
    want, want_grads = _step_outputs_and_grads(make_native, params, batch, hybridize)
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=f"output {i}")
    assert sorted(got_grads) == sorted(want_grads)
    for key, b in want_grads.items():
        scale = np.abs(b).max()
        assert scale > 0, f"{key}: zero gradient, nothing compared"
        np.testing.assert_allclose(got_grads[key], b, rtol=1e-4, atol=1e-5 * scale, err_msg=key)
    if name == "faster_rcnn_head":  # OHEM kept some negatives and dropped others
        assert 0 < want[3].sum() < want[3].size, want[3]


AMP_CHILD = r"""
import json, sys
import numpy as np
sys.path[:0] = ["examples", "benchmarks"]
import amp_training as A, retinanet_head as R
from composed import NativeRetinaHead
A.main()  # amp.init(), then the example as written
runs = {}
for name, cls in (("ours", A.AmpRetinaHead), ("native", NativeRetinaHead)):
    for hybridize in (False, True):
        runs[name, hybridize] = A.train(cls(R.make_anchors(), prefix="retina_"), hybridize)
rel = lambda a, b: float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-12))
out = {}
for (name, hybridize), (losses, params) in runs.items():
    want_losses, want_params = runs["native", hybridize]
    out[f"{name} {hybridize}"] = {
        "losses": losses,
        "finite": bool(np.isfinite(losses).all()
                       and all(np.isfinite(p).all() for p in params.values())),
        "loss": rel(np.array(losses), np.array(want_losses)),
        "params": max(rel(params[k], want_params[k]) for k in want_params)}
print(json.dumps(out))
"""


def test_the_retinanet_head_trains_under_amp_as_in_native_operators():
    # Issue 52 item 5: examples/amp_training.py under amp.init() (bfloat16 on CPU), in a
    # process of its own (amp.init() patches MXNet process-wide); the same head in MXNet's
    # own operators (benchmarks/composed.py) under AMP is the reference.
    done = fresh.run(
        [sys.executable, "-c", AMP_CHILD],
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith("imperative") and lines[1].startswith("hybridized"), lines
    got = json.loads(lines[-1])
    for key, run in got.items():
        assert run["finite"], (key, run)
        assert run["loss"] <= 0.05 and run["params"] <= 0.05, (key, run)
    ours = np.array(got["ours False"]["losses"])
    np.testing.assert_allclose(got["ours True"]["losses"], ours, rtol=0.05)
    assert ours[2] < ours[0] and ours[3] < ours[1], ours  # it trains
