"""How many operators the RetinaNet-style head runs: ours (inlined) against native.

For ``benchmarks/composed.py``'s two heads (``examples/retinanet_head.py``'s ``RetinaHead``,
four of our ops, and ``NativeRetinaHead``, the same head in MXNet's operators) at the
example's sizes (batch 2, 3 ground-truth boxes), with Gluon's gradient requests (the
parameters written, the data and the ``Constant`` anchors, means and stds not):

* forward: the operator nodes of the graph that runs (ours: spliced, our ops inlined and
  tidied by ``customop.graphs.tidy`` at the training signature, as a bind or a hybridized
  block gets it);
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

import mxnet as mx  # noqa: E402
import retinanet_head as R  # noqa: E402
from composed import NativeRetinaHead  # noqa: E402
from tables import print_table  # noqa: E402

from customop.graphs import binding  # noqa: E402

NUM_GT = 3
INPUTS = ("feat", "gt_boxes", "gt_labels")


def _operators(sym: mx.sym.Symbol) -> int:
    return sum(n["op"] != "null" for n in json.loads(sym.tojson())["nodes"])


def counts(head: mx.gluon.HybridBlock, ours: bool) -> tuple[int, int]:
    """(forward operators, operators bound for training) of ``head``."""
    head.initialize()
    sym = head(*[mx.sym.var(n) for n in INPUTS])
    params = head.collect_params()
    shapes = {
        "feat": (R.BATCH, R.CHANNELS, R.HEIGHT, R.WIDTH),
        "gt_boxes": (R.BATCH, NUM_GT, 4),
        "gt_labels": (R.BATCH, NUM_GT),
    }
    shapes.update(
        (n, tuple(p.shape))
        for n, p in params.items()
        if n in sym.list_arguments() and p.shape and all(p.shape)
    )
    written = {n for n, p in params.items() if p.grad_req != "null"}
    forward = sym
    if ours:
        dtypes = {n: "float32" for n in sym.list_arguments()}
        forward = binding.spliced(sym, shapes, dtypes, written & set(sym.list_arguments())).symbol
    req = {n: "write" if n in written else "null" for n in sym.list_arguments()}
    exe = sym.simple_bind(mx.cpu(), grad_req=req, **shapes)
    bound = len(re.findall(r"^Op:\S+, Name=", exe.debug_str(), re.M))
    return _operators(forward), bound


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    anchors = R.make_anchors(R.HEIGHT, R.WIDTH)
    found = {
        "ours (inlined)": counts(R.make_block(), True),
        "native": counts(NativeRetinaHead(anchors, channels=R.CHANNELS, prefix="head_"), False),
    }
    base = found["native"]
    rows = [
        [name, f"{f} ({f / base[0]:.2f}x)", f"{b} ({b / base[1]:.2f}x)"]
        for name, (f, b) in found.items()
    ]
    cse = os.environ.get("MXNET_ELIMINATE_COMMON_EXPR", "1")
    print_table(
        [
            "RetinaNet-style head",
            "forward operators",
            f"bound for training (MXNET_ELIMINATE_COMMON_EXPR={cse})",
        ],
        rows,
        args.markdown,
    )


if __name__ == "__main__":
    main()
