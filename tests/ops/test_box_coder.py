"""ops.box_encode and ops.box_decode (issue 11): contrib ops plus legacy_box, differentiable."""

import mxnet as mx
import numpy as np
import pytest

import ops
from customop import check_grad
from tests.ops.detection import every_path, forward_backward_without_host_copy


def centers(boxes, d):
    x1, y1, x2, y2 = np.moveaxis(np.asarray(boxes, np.float64), -1, 0)
    w, h = x2 - x1 + d, y2 - y1 + d
    return x1 + w / 2, y1 + h / 2, w, h


def encode_reference(samples, matches, anchors, refs, means, stds, legacy):
    """float64 R-CNN box coding: ((x_r - x_a)/w_a, (y_r - y_a)/h_a, log w_r/w_a, log h_r/h_a)."""
    d = 1.0 if legacy else 0.0
    b = np.arange(len(refs))[:, None]
    rx, ry, rw, rh = centers(refs[b, np.clip(matches, 0, refs.shape[1] - 1).astype(int)], d)
    ax, ay, aw, ah = centers(anchors, d)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.stack([(rx - ax) / aw, (ry - ay) / ah, np.log(rw / aw), np.log(rh / ah)], -1)
    t = (t - means) / stds
    mask = np.broadcast_to((samples > 0.5)[..., None], t.shape).astype(np.float64)
    return np.where(mask > 0, t, 0), mask


def decode_reference(data, anchors, stds, clip, format, legacy):
    d = 1.0 if legacy else 0.0
    if format == "corner":
        ax, ay, aw, ah = centers(anchors, d)
    else:
        ax, ay, aw, ah = np.moveaxis(np.asarray(anchors, np.float64), -1, 0)
    o = np.asarray(data, np.float64) * stds
    if clip > 0:
        o[..., 2:] = np.minimum(o[..., 2:], clip)
    x, y = o[..., 0] * aw + ax, o[..., 1] * ah + ay
    w, h = np.exp(o[..., 2]) * aw, np.exp(o[..., 3]) * ah
    return np.stack([x - w / 2, y - h / 2, x + w / 2 - d, y + h / 2 - d], -1)


def corner_boxes(*shape, low=1):
    xy = np.random.uniform(0, 20, shape + (2,))
    return np.concatenate([xy, xy + np.random.uniform(low, 10, shape + (2,))], -1).astype(
        np.float32
    )


def encode_inputs(b=2, n=7, m=3):
    samples = np.random.choice([-1, 0, 1], (b, n)).astype(np.float32)
    samples[0, :2] = 1
    matches = np.random.randint(0, m, (b, n)).astype(np.float32)
    means = np.array([0, 0.1, 0, -0.1], np.float32)
    stds = np.array([0.1, 0.1, 0.2, 0.2], np.float32)
    return [samples, matches, corner_boxes(b, n), corner_boxes(b, m), means, stds]


ENCODERS = [ops.box_encode, ops.box_encode.numpy]
DECODERS = [ops.box_decode, ops.box_decode.numpy]


@pytest.mark.parametrize("op", ENCODERS, ids=["mxnet", "numpy"])
def test_encode_equals_reference_and_native(op):
    inputs = encode_inputs()
    inputs[2][0, 0, 2] = inputs[2][0, 0, 0]  # zero width: inf/nan like MXNet
    inputs[2][0, 1, 3] = inputs[2][0, 1, 1] - 1  # negative height (legacy: zero)
    for legacy in (False, True):
        got = op(*map(mx.nd.array, inputs), legacy_box=legacy)
        for g, want in zip(got, encode_reference(*inputs, legacy)):
            np.testing.assert_allclose(g.asnumpy(), want, rtol=2e-5, atol=1e-5)
    native = mx.nd.contrib.box_encode(*map(mx.nd.array, inputs))
    for g, n in zip(op(*map(mx.nd.array, inputs)), native):
        if op is ops.box_encode:
            np.testing.assert_array_equal(g.asnumpy(), n.asnumpy())
        else:
            np.testing.assert_allclose(g.asnumpy(), n.asnumpy(), rtol=2e-6, atol=1e-6)
    samples = np.full_like(inputs[0], -1)  # no positives: all zero
    for out in op(*map(mx.nd.array, [samples, *inputs[1:]])):
        assert not out.asnumpy().any()


def test_legacy_encode_in_float16_takes_the_right_boxes_past_2048_rows():
    # refs flattened to (B M, 4): image 2's boxes start at row 2 M = 2400, past float16's
    # exact integers (2048); the row offsets were counted in matches' dtype and took the
    # wrong boxes there
    np.random.seed(11)
    inputs = encode_inputs(b=3, n=5, m=1200)
    inputs[1][:] = np.random.randint(1000, 1200, inputs[1].shape)
    inputs[0][:] = 1
    half = [a.astype(np.float16) for a in inputs]
    got = ops.box_encode(*[mx.nd.array(a, dtype=a.dtype) for a in half], legacy_box=True)
    assert got[0].dtype == np.float16
    want = encode_reference(*[a.astype(np.float64) for a in half], True)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.asnumpy().astype(np.float64), w, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("op", DECODERS, ids=["mxnet", "numpy"])
@pytest.mark.parametrize("format", ["corner", "center"])
def test_decode_equals_reference_and_native(op, format):
    data = np.random.normal(0, 0.5, (2, 6, 4)).astype(np.float32)
    anchors = corner_boxes(1, 6, low=-2)  # some negative widths
    anchors[0, 0, 2] = anchors[0, 0, 0]
    if format == "center":
        anchors[..., 2:] -= anchors[..., :2]
    stds = np.array([0.1, 0.2, 0.3, 0.4])
    for clip in (-1.0, 0.1):
        kw = dict(std0=0.1, std1=0.2, std2=0.3, std3=0.4, clip=clip, format=format)
        for legacy in (False, True):
            got = op(mx.nd.array(data), mx.nd.array(anchors), legacy_box=legacy, **kw)
            np.testing.assert_allclose(
                got.asnumpy(),
                decode_reference(data, anchors, stds, clip, format, legacy),
                rtol=1e-5,
                atol=1e-5,
            )
        native = mx.nd.contrib.box_decode(mx.nd.array(data), mx.nd.array(anchors), **kw)
        got = op(mx.nd.array(data), mx.nd.array(anchors), **kw).asnumpy()
        if op is ops.box_decode:
            np.testing.assert_array_equal(got, native.asnumpy())
        else:
            np.testing.assert_allclose(got, native.asnumpy(), rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("legacy", [False, True])
def test_decode_inverts_encode_without_drift(legacy):
    inputs = encode_inputs()
    inputs[2], inputs[3] = np.round(inputs[2]), np.round(inputs[3])  # pixel boxes
    inputs[4], inputs[5] = np.zeros(4, np.float32), np.ones(4, np.float32)
    targets, _ = ops.box_encode(*map(mx.nd.array, inputs), legacy_box=legacy)
    back = ops.box_decode(targets, mx.nd.array(inputs[2]), format="corner", legacy_box=legacy)
    want = inputs[3][np.arange(2)[:, None], inputs[1].astype(int)]
    pos = inputs[0] > 0.5
    np.testing.assert_allclose(back.asnumpy()[pos], want[pos], atol=2e-5)


@pytest.mark.parametrize("op", ENCODERS, ids=["mxnet", "numpy"])
def test_encode_gradient(op):
    inputs = encode_inputs()
    for legacy in (False, True):
        check_grad(op, *inputs, argnums=["anchors", "refs", "means", "stds"], legacy_box=legacy)


@pytest.mark.parametrize("op", DECODERS, ids=["mxnet", "numpy"])
def test_decode_gradient(op):
    data = np.random.normal(0, 0.5, (2, 5, 4)).astype(np.float32)
    for format in ("corner", "center"):
        check_grad(
            op,
            data,
            corner_boxes(1, 5),
            std0=0.1,
            std2=0.2,
            clip=0.3,
            format=format,
            legacy_box=True,
        )
        check_grad(op, data, corner_boxes(1, 5), format=format)


@pytest.mark.parametrize("legacy", [False, True])
def test_every_path_and_no_host_copy(legacy):
    inputs = encode_inputs()
    outs = every_path(ops.box_encode, inputs, dict(legacy_box=legacy))
    np.testing.assert_allclose(outs[0], encode_reference(*inputs, legacy)[0], rtol=2e-5, atol=1e-5)
    data, anchors = np.random.normal(0, 0.5, (2, 5, 4)).astype(np.float32), corner_boxes(1, 5)
    params = dict(format="corner", legacy_box=legacy)
    every_path(ops.box_decode, [data, anchors], params)
    for path in ("function", "custom"):
        forward_backward_without_host_copy(ops.box_encode, inputs, dict(legacy_box=legacy), path)
        forward_backward_without_host_copy(ops.box_decode, [data, anchors], params, path)


def test_bad_input_raises_and_the_next_call_works():
    inputs = encode_inputs()
    bad = list(inputs)
    bad[4] = np.zeros(3, np.float32)
    for op in ENCODERS:
        with pytest.raises(
            ValueError,
            match=r"ops.box_encode': means has shape \(3,\) but "
            r"must have shape \(4,\)",
        ):
            op(*map(mx.nd.array, bad))
    bad = list(inputs)
    bad[1] = inputs[1] + 5
    with pytest.raises(ValueError, match=r"ops.box_encode': matches of positive samples"):
        ops.box_encode.numpy(*map(mx.nd.array, bad))
    for op in DECODERS:
        with pytest.raises(ValueError, match=r"ops.box_decode': anchors must have shape"):
            op(mx.nd.ones((2, 5, 4)), mx.nd.ones((1, 4, 4)))
        with pytest.raises(ValueError, match=r"ops.box_decode': format must be one of"):
            op(mx.nd.ones((2, 5, 4)), mx.nd.ones((1, 5, 4)), format="xyxy")
        assert op(mx.nd.ones((2, 5, 4)), mx.nd.ones((1, 5, 4))).shape == (2, 5, 4)
    assert ops.box_encode(*map(mx.nd.array, inputs))[0].shape == (2, 7, 4)


def test_a_graph_infers_encodes_shapes_and_dtypes_with_its_checks(monkeypatch):
    # Issue 55: a bind at a new box count asks box_encode for its output shapes and dtypes;
    # they come from the shapes and dtypes with the forward's own checks (a bad signature
    # raises its named error at the bind), and no forward runs on placeholders
    from customop import inference

    runs = []
    monkeypatch.setattr(inference.Inference, "_run", lambda *a, **k: runs.append(a))
    names = ["samples", "matches", "anchors", "refs", "means", "stds"]
    sym = mx.sym.Group(list(ops.box_encode(*map(mx.sym.var, names))))
    good = dict(samples=(2, 7), matches=(2, 7), anchors=(2, 7, 4), means=(4,), stds=(4,))
    for m in (3, 5):
        _, out, _ = sym.infer_shape(refs=(2, m, 4), **good)
        assert out == [(2, 7, 4), (2, 7, 4)]
    types = dict.fromkeys(names, "float16")
    assert sym.infer_type(**types)[1] == [np.float16, np.float16]
    exe = sym.simple_bind(mx.cpu(), refs=(2, 3, 4), grad_req="null", **good)
    inputs = encode_inputs()
    outs = exe.forward(**{n: mx.nd.array(a) for n, a in zip(names, inputs)})
    native = mx.nd.contrib.box_encode(*map(mx.nd.array, inputs))
    for got, want in zip(outs, native):
        np.testing.assert_array_equal(got.asnumpy(), want.asnumpy())
    assert runs == []
    with pytest.raises(ValueError, match=r"ops.box_encode': means has shape \(3,\) but"):
        sym.simple_bind(mx.cpu(), refs=(2, 3, 4), grad_req="null", **dict(good, means=(3,)))
    with pytest.raises(ValueError, match=r"ops.box_encode': refs must have shape \(B, M, 4\)"):
        sym.infer_shape(refs=(3, 3, 4), **good)
    with pytest.raises(TypeError, match="ops.box_encode': refs must be a float array"):
        sym.simple_bind(
            mx.cpu(), refs=(2, 3, 4), type_dict={"refs": "int32"}, grad_req="null", **good
        )
    bad = ops.box_encode(*map(mx.sym.var, names), legacy_box="yes")
    with pytest.raises(TypeError, match="ops.box_encode': legacy_box must be a bool"):
        bad.infer_shape(refs=(2, 3, 4), **good)
