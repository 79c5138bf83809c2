"""How many operators the three example heads run: ours (inlined) against native.

Each example head of ``examples/`` against the same head in MXNet's own operators, at the
example's sizes, with Gluon's gradient requests (the parameters written; the data, the
``Constant`` anchors, means and stds, and the center loss's centers not):

* RetinaNet-style (``examples/retinanet_head.py``'s ``RetinaHead``, four of our ops, batch
  2, 3 ground-truth boxes) against ``benchmarks/composed.py``'s ``NativeRetinaHead``;
* Faster R-CNN-style (``examples/faster_rcnn_head.py``: ``ohem_sampler``, ``softmax_ce``,
  ``smooth_l1`` and the user's NumPy sampler) against ``benchmarks/native_heads.py``'s
  ``NativeRCNNHead`` (the sampler stays a ``Custom`` node in both);
* face embedding (``examples/face_embedding.py``: ``softmax_ce``, ``CenterLoss``) against
  ``NativeFaceHead``.

Counted:

* forward: the operator nodes of the graph that runs (ours: spliced, our ops inlined and
  tidied by ``customop.graphs.tidy`` at the training signature, as a bind or a hybridized
  block gets it; an op that does not inline stays one ``Custom`` node);
* bound for training: the operator nodes of ``simple_bind``'s executor, forward and
  backward (read from ``Executor.debug_str``), after MXNet's own passes (its common
  subexpression elimination among them: ``MXNET_ELIMINATE_COMMON_EXPR=0`` turns it off).

``python benchmarks/op_counts.py [--markdown]`` (a few seconds; counts, not timings: the
load of the machine does not change them).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import face_embedding as FE  # noqa: E402
import faster_rcnn_head as FR  # noqa: E402
import mxnet as mx  # noqa: E402
import native_heads  # noqa: E402
import retinanet_head as R  # noqa: E402
from composed import NativeRetinaHead  # noqa: E402
from tables import print_table  # noqa: E402

from customop.graphs import binding  # noqa: E402

RETINA_GT = 3


def _operators(sym: mx.sym.Symbol) -> int:
    return sum(n["op"] != "null" for n in json.loads(sym.tojson())["nodes"])


def counts(head: mx.gluon.HybridBlock, data: dict, ours: bool) -> tuple[int, int]:
    """(forward operators, operators bound for training) of ``head`` called on ``data``
    (``{input name: shape}``, in the order ``hybrid_forward`` takes them)."""
    head.initialize()
    sym = head(*[mx.sym.var(n) for n in data])
    if isinstance(sym, (list, tuple)):
        sym = mx.sym.Group(list(sym))
    params = head.collect_params()
    shapes = dict(data)
    shapes.update(
        (n, tuple(p.shape))
        for n, p in params.items()
        if n in sym.list_arguments() and p.shape and all(p.shape)
    )
    written = {n for n, p in params.items() if p.grad_req != "null"}
    forward = sym
    if ours:
        dtypes = {n: "float32" for n in sym.list_arguments()}
        found = binding.spliced(sym, shapes, dtypes, written & set(sym.list_arguments()))
        forward = sym if found is None else found.symbol
    req = {n: "write" if n in written else "null" for n in sym.list_arguments()}
    exe = sym.simple_bind(mx.cpu(), grad_req=req, **shapes)
    bound = len(re.findall(r"^Op:\S+, Name=", exe.debug_str(), re.M))
    return _operators(forward), bound


def heads() -> list:
    """``[(row name, ours, native, {input: shape})]`` for the three example heads."""
    anchors = R.make_anchors(R.HEIGHT, R.WIDTH)
    retina = {
        "feat": (R.BATCH, R.CHANNELS, R.HEIGHT, R.WIDTH),
        "gt_boxes": (R.BATCH, RETINA_GT, 4),
        "gt_labels": (R.BATCH, RETINA_GT),
    }
    rcnn = {
        "roi_feat": (FR.BATCH, FR.PROPOSALS, FR.FEATURE),
        "proposals": (FR.BATCH, FR.PROPOSALS, 4),
        "gt_boxes": (FR.BATCH, FR.NUM_GT, 4),
        "gt_labels": (FR.BATCH, FR.NUM_GT),
    }
    face = {"descriptor": (FE.BATCH, FE.DESCRIPTOR), "identity": (FE.BATCH,)}
    return [
        (
            "RetinaNet-style",
            R.make_block,
            lambda: NativeRetinaHead(anchors, channels=R.CHANNELS, prefix="head_"),
            retina,
        ),
        ("Faster R-CNN-style", FR.make_block, native_heads.make_rcnn_head, rcnn),
        ("face embedding", FE.make_block, native_heads.make_face_head, face),
    ]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    rows = []
    for name, make_ours, make_native, data in heads():
        ours = counts(make_ours(), data, True)
        native = counts(make_native(), data, False)
        for who, (f, b) in (("ours (inlined)", ours), ("native", native)):
            rows.append(
                [f"{name}, {who}", f"{f} ({f / native[0]:.2f}x)", f"{b} ({b / native[1]:.2f}x)"]
            )
    cse = os.environ.get("MXNET_ELIMINATE_COMMON_EXPR", "1")
    print_table(
        [
            "head",
            "forward operators",
            f"bound for training (MXNET_ELIMINATE_COMMON_EXPR={cse})",
        ],
        rows,
        args.markdown,
    )


if __name__ == "__main__":
    main()
