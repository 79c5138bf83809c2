"""What binding a graph without our ops costs once one of our ops ran: the ``binds`` patch.

The patch (customop/runtime/bind_lock.py) wraps ``Symbol.simple_bind``/``Symbol.bind`` so that
graphs holding our ops bind one at a time; any other graph pays one look at its JSON for
a ``Custom`` node of ours, then binds as MXNet binds it.  Each row is a fresh process that
builds ResNet-50 v1 (Gluon's model zoo, hybridized, exported as a Symbol) and binds it
``--binds`` times for inference at batch 1; the median bind is printed, and where the
patch is installed, the median time of its look for our nodes in that graph (what it adds
to each bind: whole binds vary by more than that from process to process).  Rows: no
customop; an op of ours called first (``binds`` installed); the same with
``CUSTOMOP_RUNTIME_OFF=binds``.

A second table: what rebinding a graph with our ops costs. Each row is a fresh process
that builds ``examples/retinanet_head.py``'s head as a Symbol (four of our ops, inlined
in training graphs) and ``simple_bind``s it for training: once, then ``--binds`` times at
the same shapes, then ``--binds`` times each at a new number of ground-truth boxes (a
detection batch's box count changes every step; bucketing and ``Module.reshape`` rebind
likewise; the first of them is a column of its own: after a first bind that read its
splice from the saved files, the process's tables are filled there). The batch is 2 and
the first box count 3: a graph verified once serves other values of each size it was
checked at (a box count equal to the batch size would tie the two). Rows: inlining on
(our ops run as MXNet's operators), with the verdicts an earlier process saved
(``CUSTOMOP_VERDICT_CACHE``: a folder a first run filled) and without them (an empty
folder: the first run on a machine checks every graph),
``CUSTOMOP_RUNTIME_OFF=inline`` (the same graph with ``Custom`` nodes) and the same head
in MXNet's operators (``benchmarks/composed.py``'s ``NativeRetinaHead``: the ratios'
base); medians.  ``--requests gluon`` binds with Gluon's gradient requests (the parameters
written; the data, labels and ``Constant`` anchors, means and stds not), as a Trainer or
``Module`` asks: the default (``write`` for every argument) makes our head compute the true
gradients of the anchors, boxes, means and stds through ``box_iou`` and ``box_encode``
(72 more operators), where MXNet's ``contrib.box_iou`` and ``contrib.box_encode`` give zeros.

``python benchmarks/bind_cost.py [--binds 20] [--rounds 3] [--requests all|gluon] [--markdown]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.rounds import fresh_rounds  # noqa: E402
from benchmarks.tables import print_table  # noqa: E402

USE_OP = """
import customop
from customop import customop as decorate
@decorate('mxnet')
def square(x):
    return x * x
square(mx.sym.var("x")).simple_bind(mx.cpu(), x=(4,), grad_req="null").forward()
from customop import runtime
assert runtime.is_installed("binds") or "binds" in os.environ.get("CUSTOMOP_RUNTIME_OFF", "")
"""
SETUPS = [
    ("without customop", "", {}),
    ("an op of ours called (binds patch)", USE_OP, {}),
    ("an op of ours called, CUSTOMOP_RUNTIME_OFF=binds", USE_OP, {"CUSTOMOP_RUNTIME_OFF": "binds"}),
]
MEASURE = """
import json, os, sys, time
def runtime_installed():
    return sys.modules["customop.runtime"].installed() if "customop.runtime" in sys.modules else []
import mxnet as mx
from mxnet.gluon.model_zoo import vision
{setup}
net = vision.resnet50_v1()
net.initialize()
net.hybridize()
sym = net(mx.sym.var("data"))
times = []
for _ in range({binds} + 1):
    start = time.perf_counter()
    sym.simple_bind(mx.cpu(), data=(1, 3, 224, 224), grad_req="null")
    times.append(time.perf_counter() - start)
times = sorted(times[1:])
check = []
if "binds" in runtime_installed():
    from customop.runtime import bind_lock
    for _ in range({binds} + 1):
        start = time.perf_counter()
        bind_lock.holds_ours(sym)
        check.append(time.perf_counter() - start)
    check = sorted(check[1:])
print(json.dumps([times[len(times) // 2] * 1e3, check[len(check) // 2] * 1e3 if check else None]))
"""


OURS = "head = R.make_block()"
NATIVE = """
sys.path.insert(0, "benchmarks")
from composed import NativeRetinaHead
head = NativeRetinaHead(R.make_anchors(R.HEIGHT, R.WIDTH), channels=R.CHANNELS, prefix="head_")
"""
EMPTIED = "import os, shutil; shutil.rmtree(os.environ['CUSTOMOP_VERDICT_CACHE'], True)\n"
REBIND_SETUPS = [
    ("inlined (our ops as MXNet operators), verdicts saved before", OURS, {"saved": "warm"}),
    ("inlined, first run, none saved", EMPTIED + OURS, {"saved": "cold"}),
    ("CUSTOMOP_RUNTIME_OFF=inline (Custom nodes)", OURS, {"CUSTOMOP_RUNTIME_OFF": "inline"}),
    ("native (benchmarks/composed.py's NativeRetinaHead)", NATIVE, {}),
]
REBIND = """
import json, sys, time
sys.path.insert(0, "examples")
import mxnet as mx
import retinanet_head as R
{setup}
head.initialize()
sym = head(*[mx.sym.var(n) for n in ("feat", "gt_boxes", "gt_labels")])
fixed = {{"feat": (R.BATCH, R.CHANNELS, R.HEIGHT, R.WIDTH)}}
fixed.update((n, tuple(p.shape)) for n, p in head.collect_params().items()
             if n in sym.list_arguments() and p.shape and all(p.shape))
req = "write"
if {gluon}:
    params = head.collect_params()
    req = {{n: "write" if n in params and params[n].grad_req != "null" else "null"
           for n in sym.list_arguments()}}
def bind(num_gt):
    start = time.perf_counter()
    exe = sym.simple_bind(mx.cpu(), grad_req=req, gt_boxes=(R.BATCH, num_gt, 4),
                          gt_labels=(R.BATCH, num_gt), **fixed)
    took = time.perf_counter() - start
    exe.forward(is_train=True)
    exe.backward()
    mx.nd.waitall()
    return took
first = bind(3)
same = sorted(bind(3) for _ in range({binds}))
new = [bind(4 + k) for k in range({binds})]
first_new, new = new[0], sorted(new)
print(json.dumps([first * 1e3, same[len(same) // 2] * 1e3, first_new * 1e3,
                  new[len(new) // 2] * 1e3]))
"""


def rebind_table(args) -> None:
    with tempfile.TemporaryDirectory() as folder:
        setups = []
        for name, setup, env in REBIND_SETUPS:
            if "saved" in env:  # the folder of saved verdicts, a warm one or an emptied one
                env = {"CUSTOMOP_VERDICT_CACHE": os.path.join(folder, env["saved"])}
            setups.append((name, setup, env))

        def program(setup):
            return REBIND.format(setup=setup, binds=args.binds, gluon=args.requests == "gluon")

        fresh_rounds(setups[:1], 1, program)  # fills the folder of saved verdicts
        found = fresh_rounds(setups, args.rounds, program)
    medians = {name: [statistics.median(col) for col in zip(*runs)] for name, runs in found.items()}
    base = medians[REBIND_SETUPS[-1][0]]
    rows = [
        [name, *(f"{v:.1f} ({v / b:.2f}x)" for v, b in zip(ms, base))]
        for name, ms in medians.items()
    ]
    print_table(
        [
            f"RetinaNet-style head, simple_bind for training (requests: {args.requests})",
            "first bind ms",
            "again, same shapes ms",
            "first new box count ms",
            "again, new box count ms",
        ],
        rows,
        args.markdown,
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binds", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--only", choices=("binds", "rebinds"), default=None)
    parser.add_argument("--requests", choices=("all", "gluon"), default="all")
    args = parser.parse_args(argv)
    if args.only != "binds":
        rebind_table(args)
    if args.only == "rebinds":
        return
    found = fresh_rounds(
        SETUPS, args.rounds, lambda setup: MEASURE.format(setup=setup, binds=args.binds)
    )
    ms = {name: [bind_ms for bind_ms, _ in runs] for name, runs in found.items()}
    checks = {
        name: [check_ms for _, check_ms in runs if check_ms is not None]
        for name, runs in found.items()
    }
    base = statistics.median(ms[SETUPS[0][0]])
    rows = []
    for name, v in ms.items():
        bind_ms = statistics.median(v)
        check = (
            f"{statistics.median(checks[name]):.2f} "
            f"({statistics.median(checks[name]) / bind_ms:.1%} of a bind)"
            if checks[name]
            else "-"
        )
        rows.append([name, f"{bind_ms:.1f}", f"{bind_ms / base:.3f}", check])
    print_table(
        ["process", "ResNet-50 simple_bind ms (median)", "x", "the patch's look for our nodes, ms"],
        rows,
        args.markdown,
    )


if __name__ == "__main__":
    main()
