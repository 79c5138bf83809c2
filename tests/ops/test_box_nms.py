"""ops.box_nms (issue 11): contrib.box_nms plus legacy_box."""

import itertools
import sys
import textwrap

import mxnet as mx
import numpy as np
import pytest

import customop
import ops
from tests import fresh
from tests.ops.detection import every_path, forward_backward_without_host_copy

TWINS = [ops.box_nms, ops.box_nms.numpy]


def iou(p, q, d):
    iw = min(p[2], q[2]) - max(p[0], q[0]) + d
    ih = min(p[3], q[3]) - max(p[1], q[1]) + d
    inter = max(iw, 0) * max(ih, 0)

    def area(b):
        w, h = b[2] - b[0] + d, b[3] - b[1] + d
        return 0.0 if w < 0 or h < 0 else w * h

    return inter / (area(p) + area(q) - inter) if inter > 0 else 0.0


def reference(
    data,
    overlap_thresh=0.5,
    valid_thresh=0.0,
    topk=-1,
    id_index=-1,
    background_id=-1,
    force_suppress=False,
    in_format="corner",
    out_format="corner",
    legacy_box=False,
):
    """float64 greedy NMS from its definition (coord_start=2, score_index=1)."""
    d = 1.0 if legacy_box else 0.0
    data = np.asarray(data, np.float64)
    out = -np.ones_like(data)
    for b, rows in enumerate(data):
        boxes = rows[:, 2:6].copy()
        if in_format == "center":
            x, y, w, h = boxes.T
            boxes = np.stack([x - w / 2, y - h / 2, x + w / 2 - d, y + h / 2 - d], -1)
        valid = [
            i
            for i in range(len(rows))
            if rows[i, 1] > valid_thresh
            and not (id_index >= 0 and background_id >= 0 and rows[i, id_index] == background_id)
        ]
        order = sorted(valid, key=lambda i: (-rows[i, 1], i))
        order = order[:topk] if topk >= 0 else order
        if topk == 0:
            return data  # MXNet's box_nms returns its input unchanged for topk=0
        kept = []
        for i in order:
            if all(
                iou(boxes[i], boxes[j], d) <= overlap_thresh
                for j in kept
                if force_suppress or id_index < 0 or rows[i, id_index] == rows[j, id_index]
            ):
                kept.append(i)
        for slot, i in enumerate(kept):
            out[b, slot] = rows[i]
            c = rows[i, 2:6]
            # MXNet skips converting a row whose first coordinate is negative; legacy converts all
            if in_format != out_format and (legacy_box or c[0] >= 0):
                if out_format == "center":
                    w, h = c[2] - c[0] + d, c[3] - c[1] + d
                    out[b, slot, 2:6] = [c[0] + w / 2, c[1] + h / 2, w, h]
                else:
                    out[b, slot, 2:6] = [
                        c[0] - c[2] / 2,
                        c[1] - c[3] / 2,
                        c[0] + c[2] / 2 - d,
                        c[1] + c[3] / 2 - d,
                    ]
    return out


def random_data(batch, n):
    """(class, score, x1, y1, x2, y2) with tied scores, duplicates and degenerate boxes."""
    data = np.zeros((batch, n, 6), np.float32)
    data[..., 0] = np.random.randint(0, 3, (batch, n))
    data[..., 1] = np.random.choice([0.1, 0.3, 0.5, 0.7, 0.9], (batch, n))
    xy = np.random.randint(-5, 20, (batch, n, 2))
    data[..., 2:4] = xy
    data[..., 4:6] = xy + np.random.randint(-2, 12, (batch, n, 2))
    data[0, 1] = data[0, 0]  # an exact duplicate
    return data


SETTINGS = [
    dict(
        overlap_thresh=t,
        valid_thresh=v,
        topk=k,
        id_index=i,
        background_id=bg,
        force_suppress=f,
        in_format=fi,
        out_format=fo,
    )
    for t, v, k, i, bg, f, fi, fo in itertools.product(
        [0.1, 0.5],
        [0.0, 0.6],
        [-1, 0, 3],
        [-1, 0],
        [-1, 1],
        [False, True],
        ["corner", "center"],
        ["corner", "center"],
    )
]


@pytest.mark.parametrize("op", TWINS, ids=["mxnet", "numpy"])
def test_equals_reference_and_native(op):
    for kw in SETTINGS:
        data = random_data(2, 10)
        if kw["in_format"] == "center":
            data[..., 4:6] -= data[..., 2:4]
        for legacy in (False, True):
            got = op(mx.nd.array(data), legacy_box=legacy, **kw).asnumpy()
            np.testing.assert_allclose(
                got,
                reference(data, legacy_box=legacy, **kw),
                rtol=1e-6,
                err_msg=f"{kw} legacy={legacy}",
            )
        native = mx.nd.contrib.box_nms(mx.nd.array(data), **kw).asnumpy()
        np.testing.assert_array_equal(op(mx.nd.array(data), **kw).asnumpy(), native)


@pytest.mark.parametrize("op", TWINS, ids=["mxnet", "numpy"])
def test_legacy_suppresses_more_and_keeps_coordinates(op):
    data = np.array(
        [[[0, 0.9, 0, 0, 9, 9], [0, 0.8, 5, 5, 14, 14], [0, 0.7, 30.3, 1, 40.7, 9]]], np.float32
    )  # IoU 16/146 (plain) vs 25/175 (legacy)
    plain = op(mx.nd.array(data), overlap_thresh=0.12).asnumpy()
    legacy = op(mx.nd.array(data), overlap_thresh=0.12, legacy_box=True).asnumpy()
    np.testing.assert_array_equal(plain, data)
    np.testing.assert_array_equal(legacy[0, :2], data[0, [0, 2]])  # bit for bit, no +1 drift
    np.testing.assert_array_equal(legacy[0, 2], -1)


@pytest.mark.parametrize("op", TWINS, ids=["mxnet", "numpy"])
def test_empty_selections(op):
    data = random_data(2, 6)
    data[..., 1] = 0.05
    for legacy in (False, True):
        np.testing.assert_array_equal(
            op(mx.nd.array(data), valid_thresh=0.1, legacy_box=legacy).asnumpy(), -1
        )
        np.testing.assert_array_equal(
            op(mx.nd.array(data), valid_thresh=0.05, legacy_box=legacy).asnumpy(), -1
        )


@pytest.mark.parametrize("legacy", [False, True])
def test_every_path_and_no_host_copy(legacy):
    data = random_data(2, 8)
    params = dict(overlap_thresh=0.3, legacy_box=legacy, out_format="center")
    outs = every_path(ops.box_nms, [data], params)
    np.testing.assert_allclose(outs[0], reference(data, **params), rtol=1e-6)
    for path in ("function", "custom"):
        got, grads = forward_backward_without_host_copy(ops.box_nms, [data], params, path)
        np.testing.assert_array_equal(got[0], outs[0])
        assert not grads[0].any()  # documented: no gradient through NMS


class _Block(mx.gluon.HybridBlock):
    def __init__(self, params):
        super().__init__()
        self.params_ = params

    def hybrid_forward(self, F, data):
        return ops.box_nms(data, **self.params_)


def _reference_rows(data, **params):
    """The reference for ``data`` of shape (..., N, 6): per image of the leading axes."""
    return reference(data.reshape((-1,) + data.shape[-2:]), **params).reshape(data.shape)


def test_legacy_trains_inlined_and_one_graph_serves_every_batch_size(tmp_path):
    # Issue 33 item 2: legacy_box once built its shapes from Python numbers (the batch
    # size), so training graphs kept its Custom node and exports were fixed to one batch.
    params = dict(overlap_thresh=0.3, legacy_box=True, in_format="corner", out_format="center")
    report = customop.explain(ops.box_nms, random_data(2, 8), **params)
    assert report.inlines, report.train.reason
    net = _Block(params)
    net.hybridize()
    for shape in ((2, 8), (3, 8), (1, 8), (2, 3, 8)):  # the last: two leading axes
        data = random_data(int(np.prod(shape[:-1])), shape[-1]).reshape(shape + (6,))
        x = mx.nd.array(data)
        with mx.autograd.record():  # a training graph
            got = net(x).asnumpy()
        np.testing.assert_allclose(
            got, _reference_rows(data, **params), rtol=1e-6, err_msg=str(shape)
        )
    # bound: one inlined graph, reshaped to batch 3 (MXNet's reshape: the same graph)
    exe = ops.box_nms(mx.sym.var("data"), **params).simple_bind(mx.cpu(), data=(2, 8, 6))
    graph = exe.customop_inlined
    assert "Custom" not in graph.tojson()
    for batch in (2, 3):
        exe = exe.reshape(data=(batch, 8, 6), allow_up_sizing=True)
        assert exe.customop_inlined is graph  # the graph inlined at batch 2 serves batch 3
        data = random_data(batch, 8)
        got = exe.forward(is_train=True, data=mx.nd.array(data))[0].asnumpy()
        np.testing.assert_allclose(got, reference(data, **params), rtol=1e-6, err_msg=batch)
    # exported at batch 2, reloaded, run at other batch sizes
    net = _Block(params)
    done = customop.export(net, str(tmp_path / "nms"), mx.nd.array(random_data(2, 8)))
    assert done.fixed == [] and done.kept == []
    loaded = customop.imports(done.symbol_file, list(done.inputs), done.params_file)
    for batch in (3, 1, 2):
        data = random_data(batch, 8)
        np.testing.assert_allclose(
            loaded(mx.nd.array(data)).asnumpy(), reference(data, **params), rtol=1e-6, err_msg=batch
        )


def test_legacy_counts_rows_exactly_in_float16_past_2048():
    # The traced graph counts the rows of each image and where each image starts; in
    # float16 those would count exactly to 2048 only.  Kept boxes lie past row 2048.
    r = np.random.RandomState(4)
    data = np.zeros((2, 3000, 6), np.float16)
    data[..., 1] = 0.01  # invalid
    data[..., 2:4] = r.rand(2, 3000, 2) * 200
    data[..., 4:6] = data[..., 2:4] + 5 + r.rand(2, 3000, 2) * 30
    for b in range(2):
        rows = np.concatenate(
            [
                r.choice(np.arange(2049, 3000, 2), 20, replace=False),
                r.choice(2049, 5, replace=False),
            ]
        )
        data[b, rows, 1] = r.rand(len(rows)) * 0.8 + 0.1
    params = dict(overlap_thresh=0.4, valid_thresh=0.05, legacy_box=True)
    net = _Block(params)
    net.hybridize()
    want = reference(data, **params).astype(np.float16)
    assert (want[:, :, 1] > 0).sum() > 20
    for run in (net, lambda x: ops.box_nms(x, **params)):  # traced, then on arrays
        np.testing.assert_array_equal(run(mx.nd.array(data, dtype="float16")).asnumpy(), want)


@pytest.mark.parametrize("op", TWINS, ids=["mxnet", "numpy"])
def test_bad_input_raises_and_the_next_call_works(op):
    data = mx.nd.ones((2, 5, 6))
    with pytest.raises(ValueError, match="ops.box_nms': score_index must be in .* got 3"):
        op(data, score_index=3)
    with pytest.raises(
        ValueError, match="ops.box_nms': coord_start must leave 4 coordinates.* got 4"
    ):
        op(data, coord_start=4)
    with pytest.raises(ValueError, match="ops.box_nms': in_format must be"):
        op(data, in_format="xyxy")
    with pytest.raises(ValueError, match="ops.box_nms': id_index must be -1 or .* got 1"):
        op(data, id_index=1)
    assert op(data, legacy_box=True).shape == (2, 5, 6)


NO_BOXES = textwrap.dedent("""
    import mxnet as mx, numpy as np
    from customop import ops
    for legacy in (False, True):
        try:
            ops.box_nms(mx.nd.array(np.zeros((2, 0, 6), "f")), legacy_box=legacy)
        except ValueError as exc:
            print(str(exc).splitlines()[0])
""")


@pytest.mark.parametrize("shape", [(2, 0, 6), (3, 2, 0, 6), (0, 6)])
def test_numpy_mode_runs_images_without_boxes(shape):
    # the named error of the other paths tells users to use the 'numpy' mode, which runs them
    data = np.zeros(shape, np.float32)
    for legacy in (False, True):
        out = ops.box_nms.numpy(data, legacy_box=legacy)
        assert out.shape == shape and out.dtype == data.dtype


def test_images_without_boxes_are_refused_naming_the_input():
    # legacy_box once reshaped to the numbers (-1, 0, 6): MXNet divided by zero and the
    # process died (SIGFPE); so the calls run in a process of their own
    done = fresh.run([sys.executable, "-c", NO_BOXES], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 2, done.stdout
    for line in lines:
        assert line.startswith("customop 'ops.box_nms' (input 'data'): an empty (0-size)"), line
