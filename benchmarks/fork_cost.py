"""What a ``fork`` costs once a decorated op has run: the ``fork`` patch, customop/runtime/fork.py.

Each row is a fresh process that forks a child (which exits at once) and waits
for it, ``--forks`` times; the median fork+wait is printed.  Rows: no customop;
customop imported, no op called (the patch is not installed); an op called
through MXNet's machinery (the patch runs MXNet's own fork prepare/restart steps
first, with the GIL released); the same with ``CUSTOMOP_RUNTIME_OFF=fork`` (what
MXNet alone does, which can deadlock when a Python callback is pending).

``python benchmarks/fork_cost.py [--forks 200] [--markdown]``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.rounds import fresh_rounds  # noqa: E402
from benchmarks.tables import print_table  # noqa: E402

USE_OP = """
import customop
from customop import customop as decorate
@decorate('numpy')
def square(x):
    return x * x
square.def_grad(lambda ans, x: lambda g: 2 * x * g)
x = mx.nd.ones((4,)); x.attach_grad()
with mx.autograd.record():
    y = square(x)
y.backward(); mx.nd.waitall()
"""
SETUPS = [
    ("without customop", "", {}),
    ("customop imported, no op called", "import customop, ops", {}),
    ("an op called (fork patch)", USE_OP, {}),
    ("an op called, CUSTOMOP_RUNTIME_OFF=fork", USE_OP, {"CUSTOMOP_RUNTIME_OFF": "fork"}),
]
MEASURE = """
import json, os, time
import numpy as np
times = []
for _ in range({forks}):
    t = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    times.append(time.perf_counter() - t)
print(json.dumps(1e3 * float(np.median(times))))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--forks", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    results = fresh_rounds(
        SETUPS,
        args.rounds,
        lambda setup: "import mxnet as mx\n" + setup + MEASURE.format(forks=args.forks),
    )
    base = sorted(results[SETUPS[0][0]])[args.rounds // 2]
    rows = []
    for name, _, _ in SETUPS:
        ms = sorted(results[name])[args.rounds // 2]
        rows.append([name, f"{ms:.2f}", f"{ms / base:.2f}"])
    print_table(["process", "fork+wait ms (median)", "x"], rows, args.markdown)


if __name__ == "__main__":
    main()
