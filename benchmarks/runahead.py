"""Why a loop of reductions grows in MXNet alone: the engine's run-ahead, kept by malloc.

Run from the repository root (about 1 minute on 2 CPU cores)::

    .venv/bin/python benchmarks/runahead.py [--markdown] [--calls N]
    .venv/bin/python benchmarks/runahead.py --throughput [--markdown] [--rounds N]

No customop code runs in the loops: each case is the loop of ``benchmarks/memory.py``
(``x.attach_grad()``, a recorded call, ``backward()``, nothing read back) on ``(8, 100, 5)``
floats, in MXNet's own operators (``ops.focal_loss``'s graph is built once by customop,
then run as a raw ``mx.nd.CachedOp``).  Each case and setting runs in a fresh process: 200
warm-up calls, then ``--calls`` more; after each part ``mx.nd.waitall()`` and
``gc.collect()``, then ``VmRSS`` and glibc's ``mallinfo2()``: the heap in use (bytes
``malloc`` handed out and not freed) and the free heap (freed, kept by ``malloc``).  The
last column is ``VmRSS`` after ``malloc_trim(0)``, which gives the free heap back to the
system.  Settings: MXNet's defaults; the loop waiting for the engine every 16 calls
(``mx.nd.waitall()``), or reading the call's output every 16 calls (``asnumpy()``, as a loop
logging its loss); ``MXNET_ENGINE_TYPE=NaiveEngine`` (every operator runs before the
call returns); ``MALLOC_ARENA_MAX=1``; ``MXNET_MKLDNN_ENABLED=0``; ``OMP_NUM_THREADS=1``.

``--throughput``: what customop's ``runahead`` fix (``customop/runtime/runahead.py``: a
thread calling our ops waits, every 8 calls, for a marker it pushed into the engine 8 calls
before) costs in loops that read nothing back, in one process: rounds of each loop with the
fix on and off (``runahead.EVERY`` set past any call count: the per-call check stays), in
alternating order, each round timed until ``mx.nd.waitall()`` returns (the engine's work
included); per-step medians and the ratio on / off.  Loops: ``ops.focal_loss`` on
``(8, 100, 5)`` imperatively and in a hybridized block (``memory.py``'s loop), and on
``(64, 1000, 5)`` (2 MiB a step: the engine falls far behind without the fix); the
RetinaNet-style head of ``composed.py`` (8 x 64 x 16 x 16) imperatively and hybridized, with
``Trainer.step`` and no wait per step; a ``def_grad`` ``x * x`` on 1,000 floats (Python
bound: the engine never falls behind, the fix only checks).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = [
    "broadcast_div by a sum",
    "sum over an axis broadcast back",
    "min over an axis",
    "x * x",
    "focal_loss's graph as a CachedOp",
]
SETTINGS = {  # name -> (environment, wait for the engine every N calls or 0)
    "defaults": ({}, 0),
    "waitall every 16 calls": ({}, 16),
    "output read every 16 calls": ({}, -16),
    "NaiveEngine": ({"MXNET_ENGINE_TYPE": "NaiveEngine"}, 0),
    "MALLOC_ARENA_MAX=1": ({"MALLOC_ARENA_MAX": "1"}, 0),
    "MXNET_MKLDNN_ENABLED=0": (
        {"MXNET_MKLDNN_ENABLED": "0", "MXNET_STORAGE_FALLBACK_LOG_VERBOSE": "0"},
        0,
    ),
    "OMP_NUM_THREADS=1": ({"OMP_NUM_THREADS": "1"}, 0),
}


def _readings(libc) -> dict:
    import mxnet as mx

    mx.nd.waitall()
    gc.collect()
    with open("/proc/self/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    info = libc.mallinfo2()
    return {"rss": rss / 1024, "in_use": info.uordblks / 2**20, "free": info.fordblks / 2**20}


def _step_function(case: str):
    """The loop's step for ``case``: returns the call's output."""
    import mxnet as mx

    x = mx.nd.random.normal(shape=(8, 100, 5))
    args: list = []
    if case == "broadcast_div by a sum":
        f = lambda x: mx.nd.broadcast_div(x, x.sum())  # noqa: E731
    elif case == "sum over an axis broadcast back":
        f = lambda x: mx.nd.broadcast_mul(x, x.sum(axis=-1, keepdims=True))  # noqa: E731
    elif case == "min over an axis":
        f = lambda x: mx.nd.broadcast_mul(x, x.min(axis=-1, keepdims=True))  # noqa: E731
    elif case == "x * x":
        f = lambda x: x * x  # noqa: E731
    else:  # the graph the default path of ops.focal_loss runs, as MXNet's own CachedOp
        import numpy as np

        from customop import ops
        from customop.graphs import imperative

        label = mx.nd.array(np.random.RandomState(0).randint(-1, 5, (8, 100)))
        for _ in range(2):  # its second call builds the graph
            with mx.autograd.record():
                ops.focal_loss(x, label)
        mx.nd.waitall()
        (runner,) = [g.full for g in imperative._graphs.values()]
        cached = mx.nd.CachedOp(runner.symbol)
        args = [x, label]
        f = lambda x: cached(*[args[i] for i in runner.order])  # noqa: E731

    def step():
        x.attach_grad()
        with mx.autograd.record():
            y = f(x)
        y.backward()
        return y

    return step


def run_case(case: str, wait_every: int, warmup: int, calls: int) -> dict:
    """One case in this process: the readings after warm-up, at the end and after a trim."""
    import mallinfo
    import mxnet as mx

    libc = mallinfo.glibc()
    step = _step_function(case)
    for _ in range(warmup):
        step()
    start = _readings(libc)
    for i in range(calls):
        y = step()
        if wait_every > 0 and i % wait_every == 0:
            mx.nd.waitall()
        elif wait_every < 0 and i % wait_every == 0:  # as a loop logging its loss
            y.asnumpy()
    end = _readings(libc)
    libc.malloc_trim(0)
    return {"start": start, "end": end, "trimmed": _readings(libc)["rss"]}


def measure(case: str, setting: str, warmup: int, calls: int) -> dict:
    environ, wait_every = SETTINGS[setting]
    proc = subprocess.run(
        [
            sys.executable,
            os.path.abspath(__file__),
            "--child",
            case,
            str(wait_every),
            str(warmup),
            str(calls),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **environ},
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{case!r} ({setting}) failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _loops() -> dict:
    """name -> (one step, steps a round): the loops ``--throughput`` times."""
    import mxnet as mx
    import numpy as np

    from customop import customop, ops

    loops = {}
    label = mx.nd.array(np.random.RandomState(0).randint(-1, 5, (8, 100)))
    x = mx.nd.random.normal(shape=(8, 100, 5))

    class Focal(mx.gluon.HybridBlock):
        def hybrid_forward(self, F, x, label):
            return ops.focal_loss(x, label)

    block = Focal()
    block.hybridize()
    for name, f in (
        ("ops.focal_loss, imperative", ops.focal_loss),
        ("ops.focal_loss, hybridized", block),
    ):

        def step(f=f):
            x.attach_grad()
            with mx.autograd.record():
                y = f(x, label)
            y.backward()

        loops[name] = (step, 200)
    big_label = mx.nd.array(np.random.RandomState(0).randint(-1, 5, (64, 1000)))
    big = mx.nd.random.normal(shape=(64, 1000, 5))

    def step():
        big.attach_grad()
        with mx.autograd.record():
            y = ops.focal_loss(big, big_label)
        y.backward()

    loops["ops.focal_loss (64, 1000, 5), imperative"] = (step, 40)

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import composed

    data = composed.make_batch(8, 64, 16, 8)
    heads = composed.make_heads(64, 16)
    for name, key in (
        ("RetinaNet head, imperative", "ours imperative"),
        ("RetinaNet head, hybridized", "ours"),
    ):
        head = heads[key]
        trainer = mx.gluon.Trainer(head.collect_params(), "sgd", {"learning_rate": 1e-4})

        def step(head=head, trainer=trainer):
            with mx.autograd.record():
                loss = head(*data)
            loss.backward()
            trainer.step(1)

        loops[name] = (step, 30)

    @customop("mxnet", name="runahead_bench.square")
    def square(x):
        return x * x

    square.def_grad(lambda ans, x: lambda g: 2 * x * g)
    small = mx.nd.random.uniform(shape=(1000,))

    def step():
        small.attach_grad()
        with mx.autograd.record():
            y = square(small)
        y.backward()

    loops["def_grad x * x, 1,000 floats"] = (step, 400)
    return loops


def throughput(rounds: int, markdown: bool) -> None:
    """The ``--throughput`` table (see the module's doc)."""
    import statistics
    import time

    import mxnet as mx
    from tables import print_table

    from customop import runtime
    from customop.runtime import runahead

    if runtime.disabled("runahead"):
        raise SystemExit("CUSTOMOP_RUNTIME_OFF keeps the runahead fix out: nothing to compare")
    every = runahead.EVERY
    loops = _loops()
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    print(f"# load average before: {' '.join(load)}; {rounds} rounds a setting, alternating")
    rows = []
    for name, (step, steps) in loops.items():
        for _ in range(3):  # warm-up: graphs built, signatures planned
            step()
        mx.nd.waitall()
        times = {"on": [], "off": []}
        for r in range(rounds):
            for setting in ("on", "off") if r % 2 == 0 else ("off", "on"):
                runahead.EVERY = every if setting == "on" else sys.maxsize
                start = time.perf_counter()
                for _ in range(steps):
                    step()
                mx.nd.waitall()
                times[setting].append((time.perf_counter() - start) / steps * 1e3)
        runahead.EVERY = every
        on, off = (statistics.median(times[k]) for k in ("on", "off"))
        rows.append([name, f"{on:.3f}", f"{off:.3f}", f"{on / off:.2f}"])
        if not markdown:
            print("  ".join(rows[-1]), file=sys.stderr, flush=True)
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    print(f"# load average after: {' '.join(load)}")
    print_table(
        ["loop (nothing read back)", "ms a step, fix on", "fix off", "on / off"],
        rows,
        markdown,
        "---|---:|---:|---:",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--throughput", action="store_true")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--calls", type=int, default=6000)
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        case, wait_every, warmup, calls = args.child
        print(json.dumps(run_case(case, int(wait_every), int(warmup), int(calls))))
        return
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    if args.throughput:
        throughput(args.rounds, args.markdown)
        return
    import mxnet as mx
    from tables import print_table

    print(
        f"# {datetime.date.today()}, Python {platform.python_version()}, MXNet "
        f"{mx.__version__}, {os.cpu_count()} CPUs; {args.warmup} warm-up calls, then "
        f"{args.calls}; each row in a fresh process; MiB"
    )
    rows = []
    runs = [(c, "defaults") for c in CASES] + [
        ("focal_loss's graph as a CachedOp", s) for s in SETTINGS if s != "defaults"
    ]
    for case, setting in runs:
        r = measure(case, setting, args.warmup, args.calls)
        s, e = r["start"], r["end"]
        rows.append(
            [
                case,
                setting,
                f"{(e['rss'] - s['rss']) * 1024 / args.calls:.1f}",
                f"{s['rss']:.0f} -> {e['rss']:.0f}",
                f"{s['in_use']:.1f} -> {e['in_use']:.1f}",
                f"{s['free']:.1f} -> {e['free']:.1f}",
                f"{r['trimmed']:.0f}",
            ]
        )
        if not args.markdown:
            print("  ".join(rows[-1]), file=sys.stderr, flush=True)
    print_table(
        [
            "case",
            "setting",
            "KiB a call",
            "RSS",
            "heap in use",
            "free heap",
            "RSS after malloc_trim",
        ],
        rows,
        args.markdown,
        "---|---|---:|---:|---:|---:|---:",
    )


if __name__ == "__main__":
    main()
