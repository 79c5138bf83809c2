"""The two deployed models of issue 28: exported with customop.export, converted to ONNX.

``python tests/deploy/models.py OUTDIR`` writes, per model, ``<name>-symbol.json``,
``<name>-0000.params``, ``<name>.onnx`` and ``<name>.npz`` (the inputs, in the
order the ONNX model takes them, and the original block's outputs), plus
``models.json``.  ``run_plain_mxnet.py`` (MXNet without customop) and
``run_onnxruntime.py`` (ONNX Runtime, no MXNet) check the files against the npz.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import mxnet as mx
import numpy as np

import customop
from customop import ops


class PostProcess(mx.gluon.HybridBlock):
    """Detection post-processing: decode, NMS, then the top scores per image."""

    def hybrid_forward(self, F, offsets, scores, anchors):
        boxes = ops.box_decode(offsets, anchors, std0=0.1, std1=0.1, std2=0.2, std3=0.2)
        dets = F.concat(F.zeros_like(scores), scores, boxes, dim=-1)
        kept = ops.box_nms(dets, overlap_thresh=0.5, valid_thresh=0.05,
                           force_suppress=True)
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
    dets = np.concatenate([rng.randint(0, 3, (2, 12, 1)), rng.rand(2, 12, 1),
                           _corner_boxes(rng, 2, 12)], -1)
    cases = {
        "ops.arr_pick": (ops.arr_pick, [rng.rand(2, 3, 8), rng.rand(2, 1, 8) > 0.5],
                         dict(num=3)),
        "ops.box_decode": (ops.box_decode, [rng.randn(2, 6, 4) * 0.3,
                                            _corner_boxes(rng, 1, 6)], {}),
        "ops.box_decode(legacy_box=True)": (ops.box_decode, [
            rng.randn(2, 6, 4) * 0.3, _corner_boxes(rng, 1, 6)],
            dict(format="corner", legacy_box=True)),
        "ops.box_encode": (ops.box_encode, [
            np.ones((2, 6)), rng.randint(0, 3, (2, 6)), _corner_boxes(rng, 2, 6),
            _corner_boxes(rng, 2, 3), np.zeros(4), np.full(4, 0.1)], {}),
        "ops.box_iou": (ops.box_iou, [_corner_boxes(rng, 1, 5)[0],
                                      _corner_boxes(rng, 1, 3)[0]], {}),
        "ops.box_nms": (ops.box_nms, [dets], dict(overlap_thresh=0.5, force_suppress=True)),
        "ops.box_nms(legacy_box=True)": (ops.box_nms, [dets], dict(legacy_box=True)),
        "ops.center_loss": (ops.center_loss, [rng.randn(4, 3), rng.randint(0, 2, 4),
                                              np.zeros((2, 3))], dict(num_class=2)),
        "ops.focal_loss": (ops.focal_loss, [rng.randn(2, 5, 3), rng.randint(0, 4, (2, 5))],
                           {}),
        "ops.ohem_sampler": (ops.ohem_sampler, [rng.randn(2, 6, 3), rng.randint(0, 3, (2, 6)),
                                                np.ones((2, 6))], {}),
        "ops.smooth_l1": (ops.smooth_l1, [rng.randn(2, 5), np.ones(1)], {}),
        "ops.softmax_ce": (ops.softmax_ce, [rng.randn(4, 3), rng.randint(0, 3, 4)], {}),
        "ops.tile": (ops.tile, [rng.randn(2, 3)], dict(reps=(2, 2))),
        "ops.topk": (ops.topk, [rng.rand(2, 8)], dict(k=3)),
        "ops.topk(do_sort=False)": (ops.topk, [rng.rand(2, 8)], dict(k=3, do_sort=False)),
        "ops.wing_loss": (ops.wing_loss, [rng.randn(2, 5), rng.randn(2, 5)], {}),
    }
    return {row: (op, [np.asarray(x, np.float32) for x in xs], params)
            for row, (op, xs, params) in cases.items()}


# The rows whose ONNX column says yes: the deploy session runs each in ONNX Runtime.
ONNX_ROWS = ("ops.box_decode", "ops.box_decode(legacy_box=True)", "ops.box_nms",
             "ops.softmax_ce", "ops.tile", "ops.topk")


def models():
    """(name, block, inputs) of each deployed model, deterministic."""
    rng = np.random.RandomState(0)
    batch, n = 2, 48
    xy = rng.rand(1, n, 2) * 60
    anchors = np.concatenate([xy, xy + 8 + rng.rand(1, n, 2) * 24], -1)
    post = (PostProcess(), [rng.randn(batch, n, 4) * 0.5, rng.rand(batch, n, 1), anchors])
    mx.random.seed(0)
    classifier = TiledClassifier()
    classifier.initialize(mx.init.Xavier())
    yield "postprocess", post[0], [mx.nd.array(a, dtype="float32") for a in post[1]]
    yield "classifier", classifier, [mx.nd.array(rng.randn(4, 10), dtype="float32")]
    cases = op_cases()
    for row in ONNX_ROWS:
        op, xs, params = cases[row]
        name = "op_" + row[4:].replace("(", "_").replace("=", "_").replace(")", "")
        yield name, OneOp(op, params), [mx.nd.array(x) for x in xs]


def write(outdir: str, onnx: bool = True) -> list[dict]:
    """Export every model to ``outdir``; return what ``models.json`` lists."""
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    listed = []
    for name, block, inputs in models():
        block.hybridize()
        want = block(*inputs)
        want = [want] if isinstance(want, mx.nd.NDArray) else list(want)
        done = customop.export(block, str(out / name), *inputs)
        names = list(done.inputs)
        by_name = dict(zip(names, inputs))
        entry = {"name": name, "symbol": Path(done.symbol_file).name,
                 "params": Path(done.params_file).name, "inputs": names, "outputs": len(want)}
        if onnx:
            converted = customop.to_onnx(done, str(out / f"{name}.onnx"))
            entry.update(onnx=f"{name}.onnx", onnx_inputs=converted.inputs,
                         onnx_outputs=converted.outputs)
        np.savez(out / f"{name}.npz", **{f"input_{n}": a.asnumpy() for n, a in by_name.items()},
                 **{f"output_{i}": o.asnumpy() for i, o in enumerate(want)})
        listed.append(entry)
    (out / "models.json").write_text(json.dumps(listed, indent=1))
    return listed


if __name__ == "__main__":
    for entry in write(sys.argv[1]):
        print("exported", entry["name"])
