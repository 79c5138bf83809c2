"""The deployed models: exported with customop.export, converted to ONNX where they convert.

The detection post-processing and a classifier (issue 28), the inference graphs of the
three example heads, every exportable row of docs/deploying.md's table, and a model fixed
to its batch size (issue 34).  ``python tests/deploy/models.py OUTDIR`` writes, per model,
``<name>-symbol.json``, ``<name>-0000.params``, ``<name>.onnx`` and ``<name>.npz`` (the
cases: inputs by name and the original block's outputs, per batch size tried), plus
``models.json``.  ``run_plain_mxnet.py`` (MXNet without customop: SymbolBlock, Module,
the C predict API) and ``run_onnxruntime.py`` (ONNX Runtime, no MXNet) check the files
against the npz.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import mxnet as mx
import numpy as np

import customop
from customop import ops, symbol_json


class PostProcess(mx.gluon.HybridBlock):
    """Detection post-processing: decode, NMS, then the top scores per image."""

    def hybrid_forward(self, F, offsets, scores, anchors):
        boxes = ops.box_decode(offsets, anchors, std0=0.1, std1=0.1, std2=0.2, std3=0.2)
        dets = F.concat(F.zeros_like(scores), scores, boxes, dim=-1)
        kept = ops.box_nms(dets, overlap_thresh=0.5, valid_thresh=0.05, force_suppress=True)
        best = ops.topk(kept.slice_axis(axis=-1, begin=1, end=2).reshape((0, -1)), k=8)
        return best, kept


class TiledClassifier(mx.gluon.HybridBlock):
    """A small classifier whose features are repeated by ops.tile (a def_grad op)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.features = mx.gluon.nn.Dense(6, activation="relu", in_units=10)
            self.head = mx.gluon.nn.Dense(3, in_units=18)

    def hybrid_forward(self, F, x):
        h = ops.tile(self.features(x).expand_dims(1), reps=(1, 3, 1)).reshape((0, -1))
        return F.softmax(self.head(h))


@customop.customop("mxnet")
def per_image_share(x):
    """``x`` divided by the batch size: an op whose graph holds at its traced batch only."""
    return x / mx.nd.full((1, 1), float(x.shape[0]), dtype=x.dtype)


@customop.customop("mxnet")
def centered(x):
    """``x`` minus each image's mean, broadcast back to the numbers of ``x.shape``: its
    operators fix the shape (``broadcast_to`` with ``shape=(2, 12, 6)``)."""
    return x - mx.nd.broadcast_to(mx.nd.mean(x, axis=(1, 2), keepdims=True), x.shape)


class OneOp(mx.gluon.HybridBlock):
    """A block of one operator call (the per-op rows of docs/deploying.md)."""

    def __init__(self, op, params, **kwargs):
        super().__init__(**kwargs)
        self.op, self.op_params = op, params

    def hybrid_forward(self, F, *xs):
        return self.op(*xs, **self.op_params)


def _corner_boxes(rng, b, n):
    xy = rng.rand(b, n, 2) * 50
    return np.concatenate([xy, xy + 5 + rng.rand(b, n, 2) * 20], -1)


def op_cases():
    """{row of docs/deploying.md's table: (op, inputs as NumPy float32, parameters)}."""
    rng = np.random.RandomState(0)
    dets = np.concatenate(
        [rng.randint(0, 3, (2, 12, 1)), rng.rand(2, 12, 1), _corner_boxes(rng, 2, 12)], -1
    )
    cases = {
        "ops.arr_pick": (ops.arr_pick, [rng.rand(2, 3, 8), rng.rand(2, 1, 8) > 0.5], dict(num=3)),
        "ops.box_decode": (
            ops.box_decode,
            [rng.randn(2, 6, 4) * 0.3, _corner_boxes(rng, 1, 6)],
            {},
        ),
        "ops.box_decode(legacy_box=True)": (
            ops.box_decode,
            [rng.randn(2, 6, 4) * 0.3, _corner_boxes(rng, 1, 6)],
            dict(format="corner", legacy_box=True),
        ),
        "ops.box_encode": (
            ops.box_encode,
            [
                np.ones((2, 6)),
                rng.randint(0, 3, (2, 6)),
                _corner_boxes(rng, 2, 6),
                _corner_boxes(rng, 2, 3),
                np.zeros(4),
                np.full(4, 0.1),
            ],
            {},
        ),
        "ops.box_iou": (
            ops.box_iou,
            [_corner_boxes(rng, 1, 5)[0], _corner_boxes(rng, 1, 3)[0]],
            {},
        ),
        "ops.box_nms": (ops.box_nms, [dets], dict(overlap_thresh=0.5, force_suppress=True)),
        "ops.box_nms(legacy_box=True)": (ops.box_nms, [dets], dict(legacy_box=True)),
        "ops.center_loss": (
            ops.center_loss,
            [rng.randn(4, 3), rng.randint(0, 2, 4), np.zeros((2, 3))],
            dict(num_class=2),
        ),
        "ops.focal_loss": (ops.focal_loss, [rng.randn(2, 5, 3), rng.randint(0, 4, (2, 5))], {}),
        "ops.ohem_sampler": (
            ops.ohem_sampler,
            [rng.randn(2, 6, 3), rng.randint(0, 3, (2, 6)), np.ones((2, 6))],
            {},
        ),
        "ops.smooth_l1": (ops.smooth_l1, [rng.randn(2, 5), np.ones(1)], {}),
        "ops.softmax_ce": (ops.softmax_ce, [rng.randn(4, 3), rng.randint(0, 3, 4)], {}),
        "ops.tile": (ops.tile, [rng.randn(2, 3)], dict(reps=(2, 2))),
        "ops.topk": (ops.topk, [rng.rand(2, 8)], dict(k=3)),
        "ops.topk(do_sort=False)": (ops.topk, [rng.rand(2, 8)], dict(k=3, do_sort=False)),
        "ops.wing_loss": (ops.wing_loss, [rng.randn(2, 5), rng.randn(2, 5)], {}),
    }
    return {
        row: (op, [np.asarray(x, np.float32) for x in xs], params)
        for row, (op, xs, params) in cases.items()
    }


# The rows whose ONNX column says yes: the deploy session runs each in ONNX Runtime.
ONNX_ROWS = (
    "ops.arr_pick",
    "ops.box_decode",
    "ops.box_decode(legacy_box=True)",
    "ops.box_encode",
    "ops.box_iou",
    "ops.box_nms",
    "ops.box_nms(legacy_box=True)",
    "ops.focal_loss",
    "ops.ohem_sampler",
    "ops.smooth_l1",
    "ops.softmax_ce",
    "ops.tile",
    "ops.topk",
    "ops.topk(do_sort=False)",
    "ops.wing_loss",
)


def example_models():
    """(name, block, inputs) of the inference graphs of the three example heads
    (examples/*.py), initialized with a fixed seed."""
    examples = str(Path(__file__).resolve().parents[2] / "examples")
    if examples not in sys.path:
        sys.path.insert(0, examples)
    import face_embedding
    import faster_rcnn_head
    import retinanet_head

    mx.random.seed(1)
    retina = retinanet_head.make_block()
    retina.initialize(mx.init.Xavier())
    detect = retinanet_head.RetinaDetect(retina, prefix="retina_detect_")
    detect.anchors.initialize()
    feat = retinanet_head.make_batches(1)[0][0]
    yield "example_retinanet", detect, [mx.nd.array(feat)]
    rcnn = faster_rcnn_head.make_block()
    rcnn.initialize(mx.init.Xavier())
    roi_feat, proposals = faster_rcnn_head.make_batches(1)[0][:2]
    yield (
        "example_faster_rcnn",
        faster_rcnn_head.RCNNDetect(rcnn, prefix="rcnn_detect_"),
        [mx.nd.array(roi_feat), mx.nd.array(proposals)],
    )
    face = face_embedding.make_block()
    face.initialize(mx.init.Xavier())
    descriptor, identity = face_embedding.make_batches(1)[0]
    yield (
        "example_face",
        face_embedding.FaceInference(face, prefix="face_inference_"),
        [mx.nd.array(descriptor), mx.nd.array(identity)],
    )


# The rows of the table that export (deploy export: yes): every loader runs each.
EXPORT_ROWS = tuple(
    row
    for row in (
        "ops.arr_pick",
        "ops.box_decode",
        "ops.box_decode(legacy_box=True)",
        "ops.box_encode",
        "ops.box_iou",
        "ops.box_nms",
        "ops.box_nms(legacy_box=True)",
        "ops.focal_loss",
        "ops.ohem_sampler",
        "ops.smooth_l1",
        "ops.softmax_ce",
        "ops.tile",
        "ops.topk",
        "ops.topk(do_sort=False)",
        "ops.wing_loss",
    )
)
# The post-processing block runs at these batch sizes, exported at the first (issue 34).
BATCHES = (2, 1, 5)


def row_name(row: str) -> str:
    return "op_" + row[4:].replace("(", "_").replace("=", "_").replace(")", "")


def models():
    """(name, block, inputs, export options, ONNX or not) of each deployed model."""
    rng = np.random.RandomState(0)
    batch, n = BATCHES[0], 48
    xy = rng.rand(1, n, 2) * 60
    anchors = np.concatenate([xy, xy + 8 + rng.rand(1, n, 2) * 24], -1)
    post = (PostProcess(), [rng.randn(batch, n, 4) * 0.5, rng.rand(batch, n, 1), anchors])
    mx.random.seed(0)
    classifier = TiledClassifier()
    classifier.initialize(mx.init.Xavier())
    yield (
        "postprocess",
        post[0],
        [mx.nd.array(a, dtype="float32") for a in post[1]],
        dict(input_names=["offsets", "scores", "anchors"], output_names=["best", "kept"]),
        True,
    )
    yield (
        "classifier",
        classifier,
        [mx.nd.array(rng.randn(4, 10), dtype="float32")],
        dict(input_names=["x"], output_names=["probabilities"]),
        True,
    )
    names = {
        "example_retinanet": (["feat"], ["detections", "best"]),
        "example_faster_rcnn": (["roi_feat", "proposals"], ["detections"]),
        "example_face": (["descriptor", "identity"], ["probabilities", "embedding"]),
    }
    for name, block, inputs in example_models():
        yield name, block, inputs, dict(zip(("input_names", "output_names"), names[name])), True
    # fixed to its batch size: every loader, ONNX Runtime included, must refuse another
    yield (
        "fixed_batch",
        OneOp(per_image_share, {}),
        [mx.nd.array(rng.rand(3, 4))],
        dict(input_names=["x"], output_names=["share"]),
        True,
    )
    cases = op_cases()
    for row in EXPORT_ROWS:
        op, xs, params = cases[row]
        yield row_name(row), OneOp(op, params), [mx.nd.array(x) for x in xs], {}, row in ONNX_ROWS


def post_inputs(batch: int) -> list[np.ndarray]:
    """The post-processing block's inputs at another batch size (the anchors are shared)."""
    rng = np.random.RandomState(batch)
    _, _, inputs, _, _ = next(models())
    n = inputs[0].shape[1]
    return [
        (rng.randn(batch, n, 4) * 0.5).astype(np.float32),
        rng.rand(batch, n, 1).astype(np.float32),
        inputs[2].asnumpy(),
    ]


def _outputs(block, arrays) -> list[np.ndarray]:
    got = block(*[mx.nd.array(a, dtype=a.dtype) for a in arrays])
    return [o.asnumpy() for o in ([got] if isinstance(got, mx.nd.NDArray) else got)]


def write(outdir: str, onnx: bool = True) -> list[dict]:
    """Export every model to ``outdir``; return what ``models.json`` lists.

    Per model: its files, what ``done.inputs``/``done.outputs`` say, and in
    ``<name>.npz`` the cases a loader must reproduce: ``<case>/input_<name>`` and
    ``<case>/output_<k>``, one case per batch size tried; ``refuses`` lists cases
    whose inputs a loader must refuse (a graph that holds at its exported shapes only).
    """
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    listed = []
    for name, block, inputs, options, convert in models():
        block.hybridize()
        want = _outputs(block, [a.asnumpy() for a in inputs])
        done = customop.export(block, str(out / name), *inputs, **options)
        names = options.get("input_names") or [
            d.name for d in symbol_json.block_graph(block, inputs)[0]
        ]
        read = list(done.inputs)
        cases = {"exported": ([a.asnumpy() for a in inputs], want)}
        if name == "postprocess":
            for batch in BATCHES[1:]:
                arrays = post_inputs(batch)
                cases[f"batch{batch}"] = (arrays, _outputs(block, arrays))
        refuses = []
        if done.fixed:  # another batch size must be refused
            first = inputs[0].asnumpy()
            arrays = [
                np.concatenate([a.asnumpy()] * 2) if a.shape[:1] == first.shape[:1] else a.asnumpy()
                for a in inputs
            ]
            cases["refused"] = (arrays, [])
            refuses.append("refused")
        saved = {}
        for case, (arrays, outs) in cases.items():
            by_name = dict(zip(names, arrays))
            saved.update({f"{case}/input_{n}": by_name[n] for n in read})
            saved.update({f"{case}/output_{k}": o for k, o in enumerate(outs)})
        entry = {
            "name": name,
            "symbol": Path(done.symbol_file).name,
            "params": Path(done.params_file).name,
            "inputs": read,
            "outputs": list(done.outputs),
            "cases": list(cases),
            "refuses": refuses,
            "fixed": done.fixed,
        }
        if onnx and convert:
            converted = customop.to_onnx(done, str(out / f"{name}.onnx"))
            entry.update(
                onnx=f"{name}.onnx", onnx_inputs=converted.inputs, onnx_outputs=converted.outputs
            )
        np.savez(out / f"{name}.npz", **saved)
        listed.append(entry)
    (out / "models.json").write_text(json.dumps(listed, indent=1))
    return listed


if __name__ == "__main__":
    for entry in write(sys.argv[1]):
        print("exported", entry["name"])
