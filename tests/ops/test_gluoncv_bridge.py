"""The GluonCV table of docs/operators.md (issue 19): its examples run, and where GluonCV is
wrong we match float64 references written from the formulas (no GluonCV in the tests)."""

import doctest
import math

import mxnet as mx
import numpy as np
import pytest

import ops
from tests.docs_pages import DOCS, FLAGS, blocks
from tests.ops.detection import every_path


def _bridge_block():
    page = DOCS / "operators.md"
    section = page.read_text().split("## From GluonCV", 1)[1].split("\n## ", 1)[0]
    table = [line for line in section.splitlines() if line.startswith("|")][2:]  # no header
    examples = [
        text
        for kind, text, _ in blocks(page)
        if kind == "doctest"
        and "From GluonCV" in page.read_text().split(text, 1)[0].rsplit("\n## ", 1)[-1]
    ]
    assert len(examples) == 1
    return table, examples[0]


def test_docs_gluoncv_examples_run_as_written():
    table, block = _bridge_block()
    # one example per row of the table: the knobs each row names appear in the block
    for knob in ("legacy_box=True", "1 / math.sqrt(rho)", "gluoncv_label + 1", "stds", "clip=-1"):
        assert knob in block, knob
    assert len(table) == 5
    test = doctest.DocTestParser().get_doctest(
        block,
        {"math": math, "mx": mx, "np": np, "ops": ops},
        "operators.md (From GluonCV)",
        None,
        0,
    )
    result = doctest.DocTestRunner(optionflags=FLAGS).run(test)
    assert result.attempted > 10 and result.failed == 0


def iou_plus_one(a, b):
    """IoU with Caffe's pixel-counting sides (x2 - x1 + 1), float64, from the definition."""
    a, b = np.float64(a), np.float64(b)
    iw = min(a[2], b[2]) - max(a[0], b[0]) + 1
    ih = min(a[3], b[3]) - max(a[1], b[1]) + 1
    inter = max(iw, 0) * max(ih, 0)
    area = lambda r: (r[2] - r[0] + 1) * (r[3] - r[1] + 1)  # noqa: E731
    return inter / (area(a) + area(b) - inter)


@pytest.mark.parametrize("op", [ops.box_iou, ops.box_iou.numpy], ids=["mxnet", "numpy"])
def test_boxes_sharing_one_pixel_row_or_column_overlap_with_legacy_box(op):
    lhs = np.array([[0, 0, 9, 9], [3, 4, 20, 30]], np.float32)
    rhs = np.array(
        [
            [0, 9, 9, 18],  # shares row 9 with box 0
            [9, 0, 18, 9],  # shares column 9 with box 0
            [20, 30, 40, 50],  # shares the corner pixel (20, 30) with box 1
            [10, 10, 19, 19],
        ],
        np.float32,
    )
    want = np.array([[iou_plus_one(a, b) for b in rhs] for a in lhs])
    assert want[0, 0] == want[0, 1] == 10 / 190 and want[1, 2] > 0  # GluonCV's numpy: 0
    got = op(mx.nd.array(lhs), mx.nd.array(rhs), legacy_box=True).asnumpy()
    np.testing.assert_allclose(got, want, rtol=1e-6)
    outs = every_path(op, [lhs, rhs], dict(legacy_box=True))
    np.testing.assert_allclose(outs[0], want, rtol=1e-6)


def focal64(x, target, alpha=0.25, gamma=2.0):
    """Sigmoid focal loss in float64 straight from Lin et al.: p = 1 / (1 + e^-x)."""
    x = np.float64(x)
    p = 1 / (1 + np.exp(-x))
    return np.where(
        target == 1, -alpha * (1 - p) ** gamma * np.log(p), -(1 - alpha) * p**gamma * np.log(1 - p)
    )


@pytest.mark.parametrize("op", [ops.focal_loss, ops.focal_loss.numpy], ids=["mxnet", "numpy"])
def test_focal_loss_does_not_saturate_at_logit_10(op):
    # anchors: class 1 scored -10 and +10, background scored +10 and -10 (C = 1); at |x| = 10
    # the float64 formula still has 1 - p = 4.5e-5 to 12 digits
    pred = np.array([[[-10.0], [10.0], [10.0], [-10.0], [-8.0], [9.0]]], np.float32)
    label = np.array([[1, 1, 0, 0, 1, 0]], np.float32)
    want = focal64(pred[..., 0], label)[..., None]
    assert want[0, 0, 0] > 2.4 and want[0, 2, 0] > 7.4  # ~0.25*10 and ~0.75*10: far from 0
    got = op(mx.nd.array(pred), mx.nd.array(label), normalization="none").asnumpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-9)  # the easy ones are ~1e-14
    # the gradient too: d/dx of the float64 formula by central differences
    x = mx.nd.array(pred)
    x.attach_grad()
    with mx.autograd.record():
        out = op(x, mx.nd.array(label), normalization="none")
    out.backward()
    h = 1e-6
    x64 = pred[..., 0].astype(np.float64)
    numeric = (focal64(x64 + h, label) - focal64(x64 - h, label)) / (2 * h)
    np.testing.assert_allclose(x.grad.asnumpy()[..., 0], numeric, rtol=1e-4, atol=1e-6)
