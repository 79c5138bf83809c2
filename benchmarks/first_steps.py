"""What a training run pays before its steps reach speed: first steps, ours against native.

Each row is a fresh process that trains one head of ``benchmarks/composed.py`` (the
RetinaNet-style head, batch 2, 8 channels, a 4 x 4 map): ``ours`` (four of our ops) or
``native`` (the same head in MXNet's operators), hybridized or imperative (under
``record()``).  It times, in milliseconds, with a wait for every parameter after each step:

* ``first``: the process's first training step at 3 boxes (hybridized: trace, verify and
  splice of our ops; imperatively our ops' forwards run in Python);
* ``second``: the next step at the same shapes (imperatively: the signature's native graph,
  its trace when no graph of its family is known);
* ``first new box count``: the first step at 4 boxes, the process's second signature (shapes
  of the family verified at the first step: no trace, no verification);
* ``new box count``: the median of the first steps at 4 to 9 boxes, each new (shapes of a
  verified family: no trace, no verification);
* ``epoch of new box counts``: 60 steps at box counts 10 to 69 (``--quick``: 10), each
  seen for the first time, in all.

Our rows run with the verdicts an earlier process saved (``CUSTOMOP_VERDICT_CACHE``: a
folder a first run filled, as on a machine that trained before) and without them (an empty
folder: the first run on a machine, which checks every graph and saves its verdict).
The ratios are ours over native, medians over ``--rounds`` (rows alternate each round).
The Python files are compiled to bytecode first, as ``pip install`` does (a process that
compiles customop's modules from source when its first step imports them pays ~30 ms more).

``python benchmarks/first_steps.py [--rounds 3] [--markdown]``
"""

from __future__ import annotations

import argparse
import compileall
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.rounds import fresh_rounds  # noqa: E402
from benchmarks.tables import print_table  # noqa: E402

# Our rows run twice: with the verdicts a process saved before (``CUSTOMOP_VERDICT_CACHE``:
# a folder a first run filled) and without (an empty folder: the first run on a machine).
WARM, COLD = "verdicts saved before", "first run, none saved"
EMPTIED = "import os, shutil; shutil.rmtree(os.environ['CUSTOMOP_VERDICT_CACHE'], True)"
SETUPS = [
    (f"ours, hybridized, {WARM}", "ours", ""),
    (f"ours, hybridized, {COLD}", "ours", EMPTIED),
    ("native, hybridized", "native", ""),
    (f"ours, imperative, {WARM}", "ours imperative", ""),
    (f"ours, imperative, {COLD}", "ours imperative", EMPTIED),
    ("native, imperative", "native imperative", ""),
]
PROGRAM = """
{setup}
import json, sys, time
sys.path.insert(0, "benchmarks")
import mxnet as mx
import composed as C
head = C.make_heads(8, 4)[{key!r}]
trainer = mx.gluon.Trainer(head.collect_params(), "sgd", {{"learning_rate": 1e-4}})
batches = {{n: C.make_batch(2, 8, 4, n, seed=n) for n in range(3, 70)}}
mx.nd.waitall()
def step(n):
    start = time.perf_counter()
    C._step(head, trainer, batches[n])
    return (time.perf_counter() - start) * 1e3
first, second = step(3), step(3)
new = [step(n) for n in range({new_counts})]
epoch = sum(step(n) for n in range({epoch_counts}))
print(json.dumps([first, second, new[0], sorted(new)[len(new) // 2], epoch]))
"""
COLUMNS = [
    "first step ms",
    "second step ms",
    "first new box count ms",
    "new box count ms",
    "epoch of new box counts ms",
]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one round, 10 box counts")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    rounds, epoch = (1, "10, 20") if args.quick else (args.rounds, "10, 70")
    for folder in ("customop", "ops", "examples", "benchmarks"):
        compileall.compile_dir(str(ROOT / folder), quiet=1)
    with tempfile.TemporaryDirectory() as folder:
        rows = [
            (
                name,
                (key, setup),
                {"CUSTOMOP_VERDICT_CACHE": os.path.join(folder, "cold" if setup else "warm")},
            )
            for name, key, setup in SETUPS
        ]

        def program(row):
            key, setup = row
            return PROGRAM.format(key=key, setup=setup, new_counts="4, 10", epoch_counts=epoch)

        fresh_rounds([r for r in rows if WARM in r[0]], 1, program)  # fills the warm folder
        found = fresh_rounds(rows, rounds, program)
    medians = {name: [statistics.median(col) for col in zip(*runs)] for name, runs in found.items()}
    rows = []
    for name, ms in medians.items():
        base = medians["native, " + name.split(", ")[1]]
        rows.append([name, *(f"{v:.1f} ({v / b:.2f}x)" for v, b in zip(ms, base))])
    print_table(["RetinaNet-style head, 2 x 8 x 4 x 4", *COLUMNS], rows, args.markdown)


if __name__ == "__main__":
    main()
