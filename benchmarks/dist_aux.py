"""Cost of keeping aux states in sync (AuxSync, the kvstore round trip) next to the op's own cost.

Runs the in-process rows itself, then starts itself as 2 ``dist_sync`` workers +
1 server on 127.0.0.1 (``python -m customop.distributed.launch``), then as 2 Horovod ranks
(Gloo, ``tests/horovodrun.py``: ``horovodrun`` on 127.0.0.1; skipped, said so, where Horovod is
not installed: ``nox -s horovod`` builds it) for the rest, and prints one table.
``python benchmarks/dist_aux.py [--batch 256 --dim 512 --classes 10]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import mxnet as mx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import ops  # noqa: E402
from customop.distributed.auxsync import AuxSync  # noqa: E402


def median_ms(fn, reps):
    fn()
    mx.nd.waitall()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        mx.nd.waitall()
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))


def center_step(ctxs, args, kv=None):
    """One forward+backward of ops.center_loss ('numpy' twin) per device, and an AuxSync."""
    rng = np.random.RandomState(0)
    centers = mx.gluon.Parameter(
        "centers", shape=(args.classes, args.dim), init=mx.init.Zero(), grad_req="null"
    )
    centers.initialize(ctx=ctxs)
    per = args.batch // len(ctxs)
    xs = [mx.nd.array(rng.normal(size=(per, args.dim)), ctx=c) for c in ctxs]
    ys = [mx.nd.array(rng.randint(0, args.classes, size=per), ctx=c) for c in ctxs]
    for x in xs:
        x.attach_grad()

    def op():
        for x, y, c in zip(xs, ys, centers.list_data()):
            with mx.autograd.record():
                loss = ops.center_loss.numpy(x, y, c, num_class=args.classes)
            loss.backward()

    return op, AuxSync([centers], kv)


def in_process(args):
    op1, _ = center_step([mx.cpu(0)], args)
    op2, sync2 = center_step([mx.cpu(0), mx.cpu(1)], args)
    return {
        "op, 1 device": median_ms(op1, args.reps),
        "AuxSync, 2 devices (no kvstore)": median_ms(sync2, args.reps),
    }


def worker(args):
    kv = mx.kv.create("dist_sync")
    op, sync = center_step([mx.cpu(0)], args, kv)
    key, value = 99, mx.nd.zeros((args.classes, args.dim))
    kv.init(key, value)

    def roundtrip():
        kv.push(key, value)
        kv.pull(key, out=value)

    rows = {
        "kvstore push+pull of the centers, 2 dist_sync workers": median_ms(roundtrip, args.reps),
        "AuxSync, 2 dist_sync workers": median_ms(sync, args.reps),
        "op, 1 device, in a dist_sync worker": median_ms(op, args.reps),
    }
    if kv.rank == 0:
        print("ROWS " + json.dumps(rows), flush=True)


def horovod_rank(args):
    import horovod.mxnet as hvd

    hvd.init()
    op, sync = center_step([mx.cpu(0)], args, hvd)
    value = mx.nd.zeros((args.classes, args.dim))

    def allreduce():
        hvd.allreduce_(value, name="bench.centers", op=hvd.Sum)

    net = mx.gluon.nn.Dense(args.dim, in_units=args.dim)
    net.initialize()
    trainer = hvd.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.0})
    x = mx.nd.ones((8, args.dim))

    def grads():  # what Horovod's own step costs for a Dense layer of the centers' width
        with mx.autograd.record():
            loss = net(x).sum()
        loss.backward()
        trainer.step(1)

    rows = {
        "hvd.allreduce_ of the centers, 2 Horovod ranks": median_ms(allreduce, args.reps),
        "AuxSync, 2 Horovod ranks (what DistributedTrainer.step adds)": median_ms(sync, args.reps),
        f"DistributedTrainer.step of a Dense({args.dim}) layer, 2 Horovod ranks": median_ms(
            grads, args.reps
        ),
        "op, 1 device, in a Horovod rank": median_ms(op, args.reps),
    }
    if hvd.rank() == 0:
        print("ROWS " + json.dumps(rows), flush=True)


def _horovod_installed() -> bool:
    spec = importlib.util.find_spec("horovod")
    return spec is not None and any(
        Path(p, "mxnet").glob("mpi_lib*.so") for p in spec.submodule_search_locations or ()
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--horovod-rank", action="store_true")
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    if args.horovod_rank:
        return horovod_rank(args)
    rows = in_process(args)
    cmd = [
        sys.executable,
        "-m",
        "customop.distributed.launch",
        "-n",
        "2",
        "-s",
        "1",
        "--timeout",
        "300",
        sys.executable,
        __file__,
        "--worker",
        *sys.argv[1:],
    ]
    out = subprocess.run(
        cmd,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=360,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    if out.returncode != 0:
        sys.exit(f"dist_sync part failed:\n{out.stderr[-3000:]}")
    rows.update(json.loads(out.stdout.split("ROWS ", 1)[1].splitlines()[0]))
    note = ""
    if _horovod_installed():
        cmd = [
            sys.executable,
            str(ROOT / "tests" / "horovodrun.py"),
            "--gloo",
            "-np",
            "2",
            "-H",
            "localhost:2",
            "--network-interface",
            "lo",
            sys.executable,
            __file__,
            "--horovod-rank",
            *sys.argv[1:],
        ]
        out = subprocess.run(
            cmd,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=360,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        if out.returncode != 0:
            sys.exit(f"Horovod part failed:\n{out.stderr[-3000:]}")
        line = next(t for t in out.stdout.splitlines() if "ROWS " in t)
        rows.update(json.loads(line.split("ROWS ", 1)[1]))
    else:
        note = "(Horovod rows skipped: Horovod is not installed; `nox -s horovod` builds it)"
    base = rows["op, 1 device"]
    print(
        f"center loss, batch {args.batch}, dim {args.dim}, {args.classes} classes "
        f"(median of {args.reps}, ms; ratio to the op on 1 device)"
    )
    width = max(len(k) for k in rows)
    print(f"{'':{width}}  {'ms':>8}  {'x op':>6}")
    for name, ms in rows.items():
        print(f"{name:{width}}  {ms:8.3f}  {ms / base:6.2f}")
    if note:
        print(note)


if __name__ == "__main__":
    main()
