"""ops.box_iou (issue 11): contrib.box_iou plus legacy_box."""

import mxnet as mx
import numpy as np
import pytest

import ops
from tests.ops.detection import every_path, forward_backward_without_host_copy

TWINS = [ops.box_iou, ops.box_iou.numpy]


def reference(lhs, rhs, format, legacy):
    """float64 IoU from the definition; widths x2 - x1 (+1 when legacy)."""
    d = 1.0 if legacy else 0.0
    a = np.asarray(lhs, np.float64).reshape(-1, 4)
    b = np.asarray(rhs, np.float64).reshape(-1, 4)

    def corners(box):
        if format == "corner":
            return box
        x, y, w, h = box.T  # a center box states its size: far corner at x + w/2 - d
        return np.stack([x - w / 2, y - h / 2, x + w / 2 - d, y + h / 2 - d], -1)

    def area(box):
        w, h = box[2] - box[0] + d, box[3] - box[1] + d
        return 0.0 if w < 0 or h < 0 else w * h

    out = np.zeros((len(a), len(b)))
    for i, p in enumerate(corners(a)):
        for j, q in enumerate(corners(b)):
            iw = min(p[2], q[2]) - max(p[0], q[0]) + d
            ih = min(p[3], q[3]) - max(p[1], q[1]) + d
            inter = max(iw, 0) * max(ih, 0)
            out[i, j] = inter / (area(p) + area(q) - inter) if inter > 0 else 0.0
    return out.reshape(np.shape(lhs)[:-1] + np.shape(rhs)[:-1])


def random_boxes(*shape, degenerate=True):
    """Integer-pixel corner boxes; some with zero or negative width/height."""
    xy = np.random.randint(-5, 20, shape + (2,))
    wh = np.random.randint(-3 if degenerate else 1, 12, shape + (2,))
    return np.concatenate([xy, xy + wh], -1).astype(np.float32)


def test_issue_numbers():
    a, b = mx.nd.array([[0, 0, 9, 9]]), mx.nd.array([[5, 5, 14, 14]])
    for op in TWINS:
        np.testing.assert_allclose(op(a, b, legacy_box=True).asnumpy(), [[25 / 175]], rtol=1e-6)
        np.testing.assert_allclose(op(a, b).asnumpy(), [[16 / 146]], rtol=1e-6)


@pytest.mark.parametrize("op", TWINS, ids=["mxnet", "numpy"])
@pytest.mark.parametrize("format", ["corner", "center"])
def test_equals_reference_and_native(op, format):
    lhs, rhs = random_boxes(2, 7), random_boxes(5)
    lhs[0, 0] = rhs[1] = [3, 3, 3, 3]  # a point box and an exact duplicate pair
    lhs[1, 1] = rhs[2] = [3, 3, 8, 8]
    if format == "center":
        lhs[..., 2:] -= lhs[..., :2]
        rhs[..., 2:] -= rhs[..., :2]
    for legacy in (False, True):
        got = op(mx.nd.array(lhs), mx.nd.array(rhs), format=format, legacy_box=legacy).asnumpy()
        assert got.shape == (2, 7, 5)
        np.testing.assert_allclose(got, reference(lhs, rhs, format, legacy), rtol=1e-6, atol=1e-7)
    native = mx.nd.contrib.box_iou(mx.nd.array(lhs), mx.nd.array(rhs), format=format)
    np.testing.assert_array_equal(
        op(mx.nd.array(lhs), mx.nd.array(rhs), format=format).asnumpy(), native.asnumpy()
    )


def test_legacy_differs_and_center_format_is_unchanged():
    lhs, rhs = random_boxes(6, degenerate=False), random_boxes(6, degenerate=False)
    plain = ops.box_iou(mx.nd.array(lhs), mx.nd.array(rhs)).asnumpy()
    legacy = ops.box_iou(mx.nd.array(lhs), mx.nd.array(rhs), legacy_box=True).asnumpy()
    assert np.abs(plain - legacy).max() > 1e-3
    lhs[:, 2:] -= lhs[:, :2]  # center boxes carry their size: legacy_box changes nothing
    rhs[:, 2:] -= rhs[:, :2]
    for op in (ops.box_iou, ops.box_iou.numpy):
        np.testing.assert_allclose(
            op(mx.nd.array(lhs), mx.nd.array(rhs), format="center", legacy_box=True).asnumpy(),
            op(mx.nd.array(lhs), mx.nd.array(rhs), format="center").asnumpy(),
            rtol=1e-6,
        )


def test_every_path_and_no_host_copy():
    lhs, rhs = random_boxes(3), random_boxes(4)
    params = dict(legacy_box=True)
    outs = every_path(ops.box_iou, [lhs, rhs], params)
    np.testing.assert_allclose(outs[0], reference(lhs, rhs, "corner", True), rtol=1e-6)
    for path in ("function", "custom"):
        got, grads = forward_backward_without_host_copy(ops.box_iou, [lhs, rhs], params, path)
        np.testing.assert_array_equal(got[0], outs[0])
        assert not any(g.any() for g in grads)  # not differentiable: zeros, as MXNet


@pytest.mark.parametrize("op", TWINS, ids=["mxnet", "numpy"])
def test_bad_input_raises_and_the_next_call_works(op):
    with pytest.raises(ValueError, match="ops.box_iou': rhs must be .* last axis 4"):
        op(mx.nd.ones((2, 4)), mx.nd.ones((2, 5)))
    with pytest.raises(
        ValueError,
        match=r"ops.box_iou': format must be one of "
        r"\('corner', 'center'\)",
    ):
        op(mx.nd.ones((2, 4)), mx.nd.ones((2, 4)), format="xywh")
    assert op(mx.nd.ones((2, 4)), mx.nd.ones((3, 4))).shape == (2, 3)


def test_a_graph_infers_its_shape_without_a_forward_and_keeps_the_checks(monkeypatch):
    # Issue 55: a bind at a new box count asks for box_iou's output shape; it comes from
    # the shapes (lhs[:-1] + rhs[:-1]) with the forward's own checks, not from a forward on
    # placeholder inputs (none runs: the Inference._run below would count it)
    from customop import inference

    runs = []
    monkeypatch.setattr(inference.Inference, "_run", lambda *a, **k: runs.append(a))
    sym = ops.box_iou(mx.sym.var("a"), mx.sym.var("b"), format="center")
    for m in (3, 5, 7):
        _, out, _ = sym.infer_shape(a=(6, 4), b=(2, m, 4))
        assert out == [(6, 2, m)]
        assert sym.infer_type(a="float16", b="float16")[1] == [np.float16]
    exe = sym.simple_bind(mx.cpu(), a=(6, 4), b=(2, 9, 4), grad_req="null")
    a, b = (
        np.random.RandomState(0).uniform(1, 5, (6, 4)),
        np.random.RandomState(1).uniform(1, 5, (2, 9, 4)),
    )
    got = exe.forward(a=mx.nd.array(a), b=mx.nd.array(b))[0].asnumpy()
    want = mx.nd.contrib.box_iou(mx.nd.array(a), mx.nd.array(b), format="center").asnumpy()
    np.testing.assert_array_equal(got, want)
    assert runs == []
    with pytest.raises(ValueError, match="ops.box_iou': lhs must be .* last axis 4"):
        sym.simple_bind(mx.cpu(), a=(6, 3), b=(2, 9, 4), grad_req="null")
    with pytest.raises(TypeError, match="ops.box_iou': rhs must be a float array"):
        sym.simple_bind(mx.cpu(), a=(6, 4), b=(2, 9, 4), type_dict={"b": "int32"}, grad_req="null")
    bad = ops.box_iou(mx.sym.var("a"), mx.sym.var("b"), format="xywh")
    with pytest.raises(ValueError, match="ops.box_iou': format must be one of"):
        bad.infer_shape(a=(6, 4), b=(2, 9, 4))
