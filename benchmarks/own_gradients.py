"""The library's def_grad ops in training graphs: closure transposed vs the forward's graph.

Run: ``python benchmarks/own_gradients.py [--markdown] [--turns N]`` (about 30 s on 2 cores).

Until issue 51, an op whose ``def_grad`` closure agreed with MXNet's gradient of its
forward on sampled values trained as its forward alone (``forward graph`` below); since,
its training graph is always the closure's own graph, transposed (``closure
transposed``).  For the ops that took that shortcut (``focal_loss``, ``smooth_l1``,
``wing_loss``, ``topk``), both graphs are built here in one process, checked to give
the closure's gradients, and timed round-robin: a ``CachedOp`` of each, forward and
backward under ``record()`` with a head gradient of ones, every call synchronised (each
turn: one untimed call, then four timed ones, in a shuffled order).  Medians in ms and
the ratio of the transposed graph to the forward graph.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

import mxnet as mx
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tables import print_table  # noqa: E402

from customop import (
    ops,  # noqa: E402
    symbol_json,  # noqa: E402
)
from customop.graphs import (
    closure_check,  # noqa: E402
    graph_verdicts,  # noqa: E402
    verify,  # noqa: E402
)
from customop.graphs.forward import ForwardGraph  # noqa: E402


def _cases(rng):
    def labels(b, n, c):
        return rng.randint(-1, c + 1, (b, n)).astype("f")

    return [
        (
            "focal_loss",
            "2x48x4",
            ops.focal_loss,
            [rng.randn(2, 48, 4).astype("f"), labels(2, 48, 4)],
            {},
        ),
        (
            "focal_loss",
            "8x6912x6",
            ops.focal_loss,
            [rng.randn(8, 6912, 6).astype("f"), labels(8, 6912, 6)],
            {},
        ),
        (
            "smooth_l1",
            "2x48x4",
            ops.smooth_l1,
            [rng.randn(2, 48, 4).astype("f"), np.array([3.0], "f")],
            {},
        ),
        (
            "smooth_l1",
            "8x6912x4",
            ops.smooth_l1,
            [rng.randn(8, 6912, 4).astype("f"), np.array([3.0], "f")],
            {},
        ),
        (
            "wing_loss",
            "4x136",
            ops.wing_loss,
            [rng.randn(4, 136).astype("f") * 8, rng.randn(4, 136).astype("f")],
            {},
        ),
        (
            "wing_loss",
            "256x136",
            ops.wing_loss,
            [rng.randn(256, 136).astype("f") * 8, rng.randn(256, 136).astype("f")],
            {},
        ),
        ("topk", "3x20, k=5", ops.topk, [rng.randn(3, 20).astype("f")], dict(k=5)),
        ("topk", "8x20000, k=1000", ops.topk, [rng.randn(8, 20000).astype("f")], dict(k=1000)),
    ]


class _Timed:
    def __init__(self, graph, inputs):
        names = [f"input{i}" for i in range(len(inputs))]
        sym = symbol_json.load(symbol_json.to_json(graph, names))
        self.args = [mx.nd.array(inputs[names.index(n)]) for n in sym.list_inputs()]
        for a in self.args:
            a.attach_grad()
        self.cached = mx.nd.CachedOp(sym)
        self.n = len(graph.nodes)

    def __call__(self):
        with mx.autograd.record():
            out = self.cached(*self.args)
        outs = list(out) if isinstance(out, (list, tuple)) else [out]
        mx.autograd.backward(outs, head_grads=[mx.nd.ones_like(o) for o in outs])
        for a in self.args:
            a.grad.wait_to_read()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--turns", type=int, default=40)
    args = parser.parse_args(argv)
    rng = np.random.RandomState(0)
    rows = []
    for name, size, op, inputs, params in _cases(rng):
        arrays, params = op.signature.bind(inputs, params)
        if op.variants and any(a is None for a in arrays):  # an optional input left out
            absent = frozenset(n for n, a in zip(op.signature.inputs, arrays) if a is None)
            op = op.variants[absent]
        shapes = [a.shape for a in inputs]
        dtypes = [a.dtype for a in inputs]
        transposed = graph_verdicts.native_graph(
            op, params, shapes, dtypes, graph_verdicts.TRAIN
        ).graph
        forward = verify.verified(
            ForwardGraph(op, params, graph_verdicts.TRAIN), shapes, dtypes, list(inputs)
        )
        for g in (transposed, forward):  # both give the closure's gradients here
            wrong = closure_check.mismatch(op, params, g, list(inputs))
            assert not wrong, (name, wrong)
        timed = {
            "closure transposed": _Timed(transposed, inputs),
            "forward graph": _Timed(forward, inputs),
        }
        times = {k: [] for k in timed}
        order = list(timed)
        for _ in range(args.turns):
            random.shuffle(order)
            for k in order:
                timed[k]()
                for _ in range(4):
                    t0 = time.perf_counter()
                    timed[k]()
                    times[k].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        rows.append(
            [
                f"ops.{name}",
                size,
                timed["closure transposed"].n,
                f"{med['closure transposed']:.3f}",
                timed["forward graph"].n,
                f"{med['forward graph']:.3f}",
                f"{med['closure transposed'] / med['forward graph']:.2f}x",
            ]
        )
    print(f"load average (1 min): {os.getloadavg()[0]:.2f}")
    print_table(
        ["op", "size", "transposed nodes", "transposed ms", "forward nodes", "forward ms", "ratio"],
        rows,
        args.markdown,
        "---|---|---:|---:|---:|---:|---:",
    )


if __name__ == "__main__":
    random.seed(0)
    main()
