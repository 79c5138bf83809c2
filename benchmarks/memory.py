"""Resident memory of training loops: growth per call after warm-up, and where it ends.

Run from the repository root (about 2 minutes on 2 CPU cores; ``--quick`` about 30 s)::

    .venv/bin/python benchmarks/memory.py [--markdown] [--quick] [--calls N] [--only "CASE;..."]

The loop a new user writes: ``x.attach_grad()``, a recorded call,
``backward()``, and nothing read back (so the engine may run behind Python).  Each case
runs in a fresh process: ``--warmup`` calls, then ``mx.nd.waitall()`` and ``gc.collect()``
and a reading of ``VmRSS``, then ``--calls`` more calls and a second reading.  The table
gives the growth per call between the two readings, the resident memory at the end, the
peak (``VmHWM``) and the OS threads the process holds at the end (``/proc/self/task``).

The op is an ``'mxnet'``-mode ``x * x`` with ``def_grad(lambda ans, x: lambda g: 2 * x * g)``
on 1,000 floats (``10 lengths``: 1,000 to 1,063 floats, cycled; ``1,000 lengths``: 1,000 to
7,993 floats, cycled: read its end, not its growth, with ``--calls 4000``; ``1,000 values of
k``: ``x * x * k`` on 32,768 floats, a graph for each value), next to the same loop in
MXNet's own operators, a hand-written ``CustomOp`` + ``CustomOpProp``, and
``mx.autograd.Function`` (capped at 300 calls: it grows about 2 MiB a call in MXNet 1.9.1);
then ``ops.focal_loss`` on ``(8, 100, 5)`` logits (and on ``(64, 1000, 5)``: 2 MiB a step,
so a loop that runs ahead of MXNet's engine shows), next to the same graph as MXNet's own
``CachedOp`` and the same formula in MXNet's operators (imperative and hybridized; on
``(64, 1000, 5)`` capped at 200 calls: MXNet's engine runs about 5 MiB a call behind), and a
``'numpy'``-mode ``def_grad`` op.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import itertools
import json
import os
import platform
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name -> (what it runs, how many input lengths are cycled)
CASES = {
    "mxnet x*x": ("native", 1),
    "mxnet x*x, 10 lengths": ("native", 10),
    "hand-written CustomOp": ("handwritten", 1),
    "mx.autograd.Function, 10 lengths": ("ag_function", 10),
    "ours, default": ("ours", 1),
    "ours, default, 10 lengths": ("ours", 10),
    "mxnet x*x, 1,000 lengths": ("native", 1000),
    "ours, default, 1,000 lengths": ("ours", 1000),
    "mxnet x*x*k, 1,000 values of k": ("native_k", 1000),
    "ours, 1,000 values of k (a graph each)": ("ours_k", 1000),
    "ours, forced_path('function')": ("ours:function", 1),
    "ours, forced_path('function'), 10 lengths": ("ours:function", 10),
    "ours, forced_path('custom')": ("ours:custom", 1),
    "ours, inline=False": ("noinline", 1),
    "ours, inline=False, 10 lengths": ("noinline", 10),
    "ours, hybridized": ("ours:hybrid", 1),
    "ours, inline=False, hybridized": ("noinline:hybrid", 1),
    "ours, 'numpy' mode": ("numpy", 1),
    "ours, 'numpy' mode, hybridized": ("numpy:hybrid", 1),
    "ours, 'numpy' mode, 10 lengths": ("numpy", 10),
    "ours, simple_bind executor": ("ours:executor", 1),
    "ours, joint closure with residuals, 2 inputs": ("joint", 1),
    "ours, joint closure with residuals, forced_path('function')": ("joint:function", 1),
    "ours, mx.np interface": ("npx", 1),
    "ops.CenterLoss (aux states), Gluon": ("center", 1),
    "ops.CenterLoss (aux states), hybridized": ("center:hybrid", 1),
    "ops.focal_loss, default": ("focal", 1),
    "ops.focal_loss, forced_path('function')": ("focal:function", 1),
    "ops.focal_loss, hybridized": ("focal:hybrid", 1),
    "mxnet: focal_loss's graph as a CachedOp": ("focal_graph", 1),
    "mxnet: focal loss in MXNet's operators": ("native_focal", 1),
    "mxnet: focal loss in MXNet's operators, hybridized": ("native_focal:hybrid", 1),
    "ops.focal_loss, (64, 1000, 5)": ("focal_big", 1),
    "ops.focal_loss, (64, 1000, 5), hybridized": ("focal_big:hybrid", 1),
    "mxnet: focal loss in MXNet's operators, (64, 1000, 5)": ("native_focal_big", 1),
}
BIG = (64, 1000, 5)  # the logits of the *_big cases (else (8, 100, 5))
K_SIZE = 32768  # the *_k cases' floats: ours runs a static CachedOp of about 0.9 MiB a graph


def _rss_kib(field: str = "VmRSS") -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(field)  # pragma: no cover - Linux only


def _step_function(kind: str, lengths: int):
    """The loop's step for ``kind``: a function of the call number."""
    import mxnet as mx
    import numpy as np

    xs = [mx.nd.random.uniform(shape=(1000 + 7 * i,)) for i in range(lengths)]
    extra: list = []  # further inputs of every call
    base, _, variant = kind.partition(":")
    if base == "native":
        f = lambda x: x * x  # noqa: E731
    elif base == "handwritten":

        class Square(mx.operator.CustomOp):
            def forward(self, is_train, req, in_data, out_data, aux):
                self.assign(out_data[0], req[0], in_data[0] * in_data[0])

            def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
                self.assign(in_grad[0], req[0], 2 * in_data[0] * out_grad[0])

        @mx.operator.register("memory_bench_square")
        class SquareProp(mx.operator.CustomOpProp):
            def __init__(self):
                super().__init__(need_top_grad=True)

            def infer_shape(self, in_shape):
                return in_shape, in_shape, []

            def create_operator(self, ctx, shapes, dtypes):
                return Square()

        f = lambda x: mx.nd.Custom(x, op_type="memory_bench_square")  # noqa: E731
    elif base == "ag_function":

        class Square(mx.autograd.Function):
            def forward(self, x):
                self.save_for_backward(x)
                return x * x

            def backward(self, g):
                (x,) = self.saved_tensors
                return 2 * x * g

        f = lambda x: Square()(x)  # noqa: E731
    elif base in ("native_k", "ours_k"):  # a parameter value a call, cycled
        from customop import customop

        @customop("mxnet", name="memory_bench.scaled_square")
        def scaled_square(x, *, k=1.0):
            return x * x * k

        scaled_square.def_grad(lambda ans, x, *, k=1.0: lambda g: 2 * k * x * g)
        xs = [mx.nd.random.uniform(shape=(K_SIZE,))]
        values = itertools.cycle(range(1, lengths + 1))
        if base == "native_k":
            f = lambda x: x * x * float(next(values))  # noqa: E731
        else:
            f = lambda x: scaled_square(x, k=float(next(values)))  # noqa: E731
    elif base in ("ours", "noinline", "numpy"):
        from customop import customop

        if base == "numpy":

            @customop("numpy", name="memory_bench.square")
            def square(x):
                return x * x
        else:

            @customop("mxnet", name="memory_bench.square", inline=base == "ours")
            def square(x):
                return x * x

        square.def_grad(lambda ans, x: lambda g: 2 * x * g)
        f = square
    elif base == "focal_graph":  # the reference: the same operators, MXNet alone
        from customop import ops
        from customop.graphs import imperative

        extra = [mx.nd.array(np.random.RandomState(0).randint(-1, 5, (8, 100)))]
        xs = [mx.nd.random.normal(shape=(8, 100, 5))]
        for _ in range(2):  # its second call builds the graph the default path runs
            with mx.autograd.record():
                ops.focal_loss(xs[0], extra[0])
        (runner,) = [g.full for g in imperative._graphs.values()]
        symbol = runner.symbol
        cached = mx.nd.CachedOp(symbol)
        f = lambda *args: cached(*[args[i] for i in runner.order])  # noqa: E731
    elif base in ("native_focal", "native_focal_big"):  # ops.focal_loss's formula in F ops
        shape = BIG if base.endswith("_big") else (8, 100, 5)
        extra = [mx.nd.array(np.random.RandomState(0).randint(-1, 5, shape[:-1]))]
        xs = [mx.nd.random.normal(shape=shape)]

        def focal(x, label, F=mx.nd, alpha=0.25, gamma=2.0):
            # (as benchmarks/composed.py's native head: normalization='positive')
            target = F.one_hot(label - 1, 5)  # background 0 and ignored -1: all zero
            p = F.sigmoid(x)
            log_p = -F.Activation(-x, act_type="softrelu")
            log_1p = -F.Activation(x, act_type="softrelu")
            loss = (
                -alpha * target * (1 - p) ** gamma * log_p
                - (1 - alpha) * (1 - target) * p**gamma * log_1p
            )
            valid = F.expand_dims(label != -1, axis=-1)
            return F.broadcast_div(F.broadcast_mul(loss, valid), F.maximum(F.sum(label > 0), 1))

        f = focal
        if variant == "hybrid":

            class NativeFocal(mx.gluon.HybridBlock):
                def hybrid_forward(self, F, x, label):
                    return focal(x, label, F)

            f = NativeFocal()
            f.hybridize()
            variant = ""
    elif base == "joint":
        from customop import customop, residuals

        @customop("mxnet", name="memory_bench.scaled")
        def scaled(x, w):
            t = mx.nd.tanh(x)
            return residuals(t * w, t=t)

        scaled.def_grad(lambda ans, x, w, t: lambda g: (g * w * (1 - t * t), g * t), argnum=(0, 1))
        extra = [mx.nd.random.uniform(shape=(1000,))]
        extra[0].attach_grad()
        f = scaled
    elif base == "npx":
        from customop import customop

        mx.npx.set_np()

        @customop("mxnet", name="memory_bench.square")
        def square(x):
            return x * x

        square.def_grad(lambda ans, x: lambda g: 2 * x * g)
        xs = [mx.np.random.uniform(size=(1000,))]
        f = square
    elif base == "center":
        from customop import ops

        extra = [mx.nd.array(np.random.RandomState(0).randint(0, 10, (32,)))]
        xs = [mx.nd.random.normal(shape=(32, 16))]
        f = ops.CenterLoss(num_class=10, feature_dim=16)
        f.initialize()
    elif base in ("focal", "focal_big"):
        from customop import ops

        shape = BIG if base.endswith("_big") else (8, 100, 5)
        extra = [mx.nd.array(np.random.RandomState(0).randint(-1, 5, shape[:-1]))]
        xs = [mx.nd.random.normal(shape=shape)]
        f = ops.focal_loss
    else:
        raise ValueError(kind)
    if variant == "executor":  # bound once: each step a forward and a backward
        data = mx.sym.Variable("x")
        executors = {}

        def f(x):
            exe = executors.get(x.shape)
            if exe is None:
                exe = executors[x.shape] = inner(data).simple_bind(mx.cpu(), x=x.shape)
            exe.arg_dict["x"][:] = x
            exe.forward(is_train=True)
            return exe

        inner = square

        def step(i: int) -> None:
            exe = f(xs[i % len(xs)])
            exe.backward(mx.nd.ones_like(exe.outputs[0]))

        return step
    if variant == "hybrid" and isinstance(f, mx.gluon.HybridBlock):
        f.hybridize()
    elif variant == "hybrid":
        inner = f

        class Block(mx.gluon.HybridBlock):
            def hybrid_forward(self, F, x, *more):
                return inner(x, *more)

        block = Block()
        block.hybridize()
        f = block

    def step(i: int) -> None:
        x = xs[i % len(xs)]
        x.attach_grad()
        with mx.autograd.record():
            y = f(x, *extra)
        y.backward()

    return step


def run_case(kind: str, lengths: int, warmup: int, calls: int) -> dict:
    """One case in this process: the readings (KiB) and thread count."""
    import mxnet as mx

    step = _step_function(kind, lengths)
    if kind.startswith("ag_function"):
        calls = min(calls, 300)
    elif kind.startswith("native_focal_big"):
        calls = min(calls, 200)  # MXNet's own run-ahead: about 5 MiB a call, 1 GiB at 200
    path = kind.partition(":")[2]
    if path in ("function", "custom"):
        from customop.dispatch import forced_path

        scope = forced_path(path)
    else:
        scope = contextlib.nullcontext()
    with scope:
        for i in range(warmup):
            step(i)
        mx.nd.waitall()
        gc.collect()
        start = _rss_kib()
        for i in range(warmup, warmup + calls):
            step(i)
        mx.nd.waitall()
        gc.collect()
    end = _rss_kib()
    return {
        "growth_kib": (end - start) / calls,
        "end_mib": end / 1024,
        "peak_mib": _rss_kib("VmHWM") / 1024,
        "threads": len(os.listdir("/proc/self/task")),
        "calls": calls,
    }


def measure(name: str, warmup: int, calls: int, timeout: float = 600) -> dict:
    """``name`` (a key of :data:`CASES`) run in a fresh interpreter: its readings."""
    kind, lengths = CASES[name]
    proc = subprocess.run(
        [
            sys.executable,
            os.path.abspath(__file__),
            "--child",
            kind,
            str(lengths),
            str(warmup),
            str(calls),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"case {name!r} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--quick", action="store_true", help="100 warm-up calls, 300 calls")
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--only", default="", help="case names, separated by semicolons")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, lengths, warmup, calls = args.child
        print(json.dumps(run_case(kind, int(lengths), int(warmup), int(calls))))
        return
    if args.quick:
        args.warmup, args.calls = 100, 300
    names = [n.strip() for n in args.only.split(";") if n.strip()] or list(CASES)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import mxnet as mx
    from tables import print_table

    print(
        f"# {datetime.date.today()}, Python {platform.python_version()}, MXNet "
        f"{mx.__version__}, {os.cpu_count()} CPUs; {args.warmup} warm-up calls, then "
        f"{args.calls}; each case in a fresh process"
    )
    rows = []
    for name in names:
        r = measure(name, args.warmup, args.calls)
        rows.append(
            [
                name,
                f"{r['growth_kib']:.1f}",
                f"{r['end_mib']:.0f}",
                f"{r['peak_mib']:.0f}",
                str(r["threads"]),
                str(r["calls"]),
            ]
        )
        if not args.markdown:
            print("  ".join(rows[-1]), file=sys.stderr, flush=True)
    print_table(
        ["case", "KiB a call", "ends at (MiB)", "peak (MiB)", "threads", "calls"],
        rows,
        args.markdown,
        "---|---:|---:|---:|---:|---:",
    )


if __name__ == "__main__":
    main()
