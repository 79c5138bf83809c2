"""Imperative training steps whose input sizes change every call: the graph path's cost.

Run from the repository root (about a minute on 2 CPU cores; ``--quick`` a few seconds)::

    .venv/bin/python benchmarks/imperative.py [--cycles 10] [--markdown]

A ``def_grad`` op called under ``mx.autograd.record()`` runs its native graph from a
signature's second call (``customop/graphs/imperative.py``); a signature seen once takes
the function path, so shapes that change every call pay no trace.  Each row is a workload
that cycles through 60 input lengths (a detection batch's box count), one forward and
backward per step, timed from a fresh start (the first cycle's traces included) with the
default dispatch and with ``forced_path('function')`` (the forward and closures in Python,
as before the graph path), in one run, interleaved by cycle.  Rows: ``x * x`` with a
``def_grad`` closure, and ``ops.smooth_l1`` (a library op with a ``sigma`` input and a
value check), recorded and, as in evaluation, not.

A second table: not recording, at one signature, the native graph's forward (the default
from a signature's second call) against the forward in Python (``forced_path('function')``,
the path before), medians of interleaved rounds, for ``x * x`` at three sizes and five
library ops.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import mxnet as mx
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tables import print_table  # noqa: E402

from customop import customop, ops  # noqa: E402
from customop.dispatch import forced_path  # noqa: E402
from customop.graphs import (
    graph_verdicts,  # noqa: E402
    imperative,  # noqa: E402
)

LENGTHS = [37 + 13 * k for k in range(60)]


@customop("mxnet")
def square(x):
    return x * x


square.def_grad(lambda ans, x: lambda g: 2 * x * g)


def _square_step(n, rng):
    x = mx.nd.array(rng.randn(n, 4))
    x.attach_grad()
    with mx.autograd.record():
        y = square(x)
    y.backward()
    x.grad.wait_to_read()


def _smooth_l1_step(n, rng):
    x = mx.nd.array(rng.randn(n, 4))
    x.attach_grad()
    sigma = mx.nd.array([3.0])
    with mx.autograd.record():
        y = ops.smooth_l1(x, sigma)
    y.backward()
    x.grad.wait_to_read()


def _smooth_l1_predict(n, rng):
    ops.smooth_l1(mx.nd.array(rng.randn(n, 4)), mx.nd.array([3.0])).wait_to_read()


WORKLOADS = [
    ("x * x with def_grad", _square_step),
    ("ops.smooth_l1", _smooth_l1_step),
    ("ops.smooth_l1, not recorded", _smooth_l1_predict),
]


def _fixed_cases(rng):
    """(name, op, inputs) of the unrecorded table: one signature each."""

    def f32(*shape):
        return mx.nd.array(rng.uniform(0.1, 1.0, shape))

    def labels(n, k):
        return mx.nd.array(rng.randint(0, k, n))

    def boxes(*shape):  # corner boxes (x1, y1, x2, y2), positive sizes
        corner = rng.uniform(0, 20, shape + (2,))
        return mx.nd.array(
            np.concatenate([corner, corner + rng.uniform(2, 8, shape + (2,))], axis=-1)
        )

    return [
        ("x * x, 10 elements", square, [f32(10)]),
        ("x * x, 1e3 elements", square, [f32(1000)]),
        ("x * x, 1e6 elements", square, [f32(10**6)]),
        ("ops.smooth_l1 (256, 4)", ops.smooth_l1, [f32(256, 4), mx.nd.array([3.0])]),
        ("ops.wing_loss (256, 10)", ops.wing_loss, [f32(256, 10), f32(256, 10)]),
        ("ops.focal_loss (256, 20)", ops.focal_loss, [f32(256, 20), labels(256, 20)]),
        ("ops.softmax_ce (256, 20)", ops.softmax_ce, [f32(256, 20), labels(256, 20)]),
        ("ops.box_iou (2, 256, 4) x (2, 7, 4)", ops.box_iou, [f32(2, 256, 4), f32(2, 7, 4)]),
        # a def_grad op with costly coefficients: its graph without them runs here
        (
            "ops.box_encode (8, 768) anchors, 8 boxes",
            ops.box_encode,
            [
                mx.nd.array(rng.randint(-1, 2, (8, 768))),
                labels((8, 768), 8),
                boxes(8, 768),
                boxes(8, 8),
                mx.nd.zeros(4),
                mx.nd.array([0.1, 0.1, 0.2, 0.2]),
            ],
        ),
    ]


def _per_call(op, inputs, path, calls) -> float:
    with forced_path(path):
        op(*inputs)  # (a signature's first call takes the Python forward)
        mx.nd.waitall()
        start = time.perf_counter()
        for _ in range(calls):
            op(*inputs)
        mx.nd.waitall()
    return (time.perf_counter() - start) / calls


def unrecorded_table(rounds, calls, markdown) -> None:
    """Not recording, a signature's calls from the second on: the native graph's forward
    (default) against the forward in Python (``forced_path('function')``), interleaved."""
    rows = []
    for name, op, inputs in _fixed_cases(np.random.RandomState(0)):
        took = {"native graph (default)": [], "Python forward": []}
        for _ in range(rounds):
            took["native graph (default)"].append(_per_call(op, inputs, None, calls))
            took["Python forward"].append(_per_call(op, inputs, "function", calls))
        med = {k: statistics.median(v) for k, v in took.items()}
        rows.append(
            [
                name,
                f"{med['native graph (default)'] * 1e6:.1f}",
                f"{med['Python forward'] * 1e6:.1f}",
                f"{med['native graph (default)'] / med['Python forward']:.2f}x",
            ]
        )
    print_table(
        [
            "not recorded: one forward per call",
            "native graph us",
            "Python forward us",
            "graph / Python",
        ],
        rows,
        markdown,
    )


def run(step, path, cycles, rng) -> float:
    start = time.perf_counter()
    with forced_path(path):
        for _ in range(cycles):
            for n in LENGTHS:
                step(n, rng)
    return time.perf_counter() - start


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=10)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    cycles = 2 if args.quick else args.cycles
    rows = []
    for name, step in WORKLOADS:
        rng = np.random.RandomState(0)
        for _ in range(2):
            step(LENGTHS[0], rng)  # imports, engine start and the op's registration
        graph_verdicts.clear_cache()
        imperative.clear_cache()
        total = {"graph path (default)": 0.0, "function path": 0.0}  # (unrecorded: direct)
        for _ in range(cycles):  # interleaved: load from elsewhere hits both alike
            total["graph path (default)"] += run(step, None, 1, rng)
            total["function path"] += run(step, "function", 1, rng)
        steps = cycles * len(LENGTHS)
        base = total["function path"]
        for variant, sec in total.items():
            rows.append([name, variant, f"{sec / steps * 1e3:.3f}", steps, f"{sec / base:.2f}x"])
    print(
        f"load average (1 min): {os.getloadavg()[0]:.2f}; {len(LENGTHS)} lengths, "
        f"{cycles} cycles, traces included (the graph path's first cycle)"
    )
    print_table(
        ["workload, 60 input lengths cycled", "variant", "ms/step", "steps", "vs function path"],
        rows,
        args.markdown,
    )
    unrecorded_table(3 if args.quick else 7, 50 if args.quick else 300, args.markdown)


if __name__ == "__main__":
    main()
