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
value check).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import mxnet as mx
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tables import print_table  # noqa: E402

from customop import customop, ops  # noqa: E402
from customop.dispatch import forced_path  # noqa: E402
from customop.graphs import imperative, native  # noqa: E402

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


WORKLOADS = [("x * x with def_grad", _square_step), ("ops.smooth_l1", _smooth_l1_step)]


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
        native.clear_cache()
        imperative.clear_cache()
        total = {"graph path (default)": 0.0, "function path": 0.0}
        for _ in range(cycles):  # interleaved: load from elsewhere hits both alike
            total["graph path (default)"] += run(step, None, 1, rng)
            total["function path"] += run(step, "function", 1, rng)
        steps = cycles * len(LENGTHS)
        base = total["function path"]
        for variant, sec in total.items():
            rows.append([name, variant, f"{sec / steps * 1e3:.3f}", steps,
                         f"{sec / base:.2f}x"])
    print(f"load average (1 min): {os.getloadavg()[0]:.2f}; {len(LENGTHS)} lengths, "
          f"{cycles} cycles, traces included (the graph path's first cycle)")
    print_table(["workload, 60 input lengths cycled", "variant", "ms/step", "steps",
                 "vs function path"], rows, args.markdown)


if __name__ == "__main__":
    main()
