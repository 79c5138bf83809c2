"""What a ``customop`` call costs next to native MXNet, a hand-written CustomOp and friends.

Run from the repository root (about 2 minutes on 2 CPU cores; ``--quick`` under 40 s)::

    .venv/bin/python benchmarks/overhead.py              # full run, plain-text table
    .venv/bin/python benchmarks/overhead.py --markdown   # the same, as Markdown
    .venv/bin/python benchmarks/overhead.py --quick
    .venv/bin/python benchmarks/overhead.py --repeats 50 --sizes 10,1e6 --ops 'x*x'
    .venv/bin/python -m cProfile -s cumtime benchmarks/overhead.py \\
        --sizes 1e6 --ops 'x*x' --passes fwd+bwd --variants mx/default --repeats 200

Two operations, each on float32 vectors of 10, 1e3, 1e5 and 1e6 elements:
``x*x`` (elementwise) and ``sum(x*x)`` (a loss reduced to a scalar); both have
the gradient ``2*x*g``.  Each is measured forward only (not recording) and
forward+backward (``mx.autograd.record()`` then ``backward()`` with a head
gradient of ones).  Variants:

* ``native``: the NDArray expression itself;
* ``handwritten``: an ``mx.operator.CustomOp``/``CustomOpProp`` pair in the
  style of MXNet's tutorial, called with ``mx.nd.Custom``;
* ``ag.Function``: an ``mx.autograd.Function`` subclass (one instance per call);
* ``mx/...`` and ``np/...``: ``@customop('mxnet')`` / ``@customop('numpy')``
  with default dispatch, each path pinned with ``forced_path`` (``direct`` is
  forward only, ``function`` is forward+backward only: unrecorded it *is*
  ``direct``), and ``mx.nd.Custom(x, op_type=op.op_type)`` called directly;
* ``mx/graph``: the native training graph pinned (``forced_path('graph')``): what
  ``mx/default`` runs under ``record()`` from a signature's second call;
* ``mx-auto/default``, ``mx-auto/native`` and ``mx-auto/function``: the ``'mxnet'``-mode
  op without ``def_grad``, with default dispatch (its native graph under ``record()``),
  recorded natively, and through the callback node with an automatic gradient (a
  second, recorded forward);
* ``hips``: HIPS ``autograd`` on NumPy (the plain function forward,
  ``make_vjp``/``grad`` for forward+backward), the reference for numpy mode.

Every timed call ends by synchronising (``wait_to_read`` on its result), so
MXNet's asynchronous work is counted.  Within one (op, size, pass) group the
variants are warmed up, then timed round-robin with a rotating order, so a
burst of load from another process hits all of them alike: each turn is one
untimed lead-in call (it absorbs the frees and thread wake-ups the previous
variant left behind, which otherwise land on the next variant's clock) and
four timed calls in a row.  The table gives per-call medians, the
interquartile range as a fraction of the median, and how many calls were
timed.  The garbage collector stays on: the garbage a path makes is part of
its cost.

glibc hands multi-MB buffers straight to ``mmap`` and trims the heap on free,
so whichever variant allocates next pays ~1000 page faults for a 4 MB buffer
at random: at 1e6 elements medians were bimodal (IQR near 100%) and identical
code paths differed 2x.  The script therefore re-executes itself once with
``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_`` and ``MALLOC_TOP_PAD_``
set (see ``ALLOCATOR``) unless they are already in the environment or
``--system-malloc`` is given; the header line records which was used.

Before timing, every variant's output and gradient are checked against
native on a small input.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import autograd
import autograd.numpy as anp
import mxnet as mx
import numpy as np

from customop import customop
from customop.dispatch import forced_path

SIZES = (10, 1_000, 100_000, 1_000_000)
PASSES = ("fwd", "fwd+bwd")
WARMUP = 3
BLOCK = 4  # timed calls in a row per variant and round


# ---- the operations, written once per framework ----------------------------------------
@dataclass(frozen=True)
class Kind:
    """One operation: its native NDArray form, its NumPy form, and its name."""

    name: str
    native: Callable
    numpy: Callable


SQUARE = Kind("x*x", lambda x: x * x, lambda x: x * x)
LOSS = Kind("sum(x*x)", lambda x: mx.nd.sum(x * x), lambda x: anp.sum(x * x))
KINDS = (SQUARE, LOSS)


def _grad(ans, x):
    return lambda g: 2 * x * g


@customop("mxnet", name="bench.mx_square")
def mx_square(x):
    return x * x


@customop("mxnet", name="bench.mx_loss")
def mx_loss(x):
    return mx.nd.sum(x * x)


@customop("numpy", name="bench.np_square")
def np_square(x):
    return x * x


@customop("numpy", name="bench.np_loss")
def np_loss(x):
    return np.sum(x * x)


for _op in (mx_square, mx_loss, np_square, np_loss):
    _op.def_grad(_grad)


# The same 'mxnet'-mode forwards without def_grad: recorded natively by default.
@customop("mxnet", name="bench.mx_auto_square")
def mx_auto_square(x):
    return x * x


@customop("mxnet", name="bench.mx_auto_loss")
def mx_auto_loss(x):
    return mx.nd.sum(x * x)


DECORATED = {
    ("mx", SQUARE.name): mx_square,
    ("mx", LOSS.name): mx_loss,
    ("np", SQUARE.name): np_square,
    ("np", LOSS.name): np_loss,
    ("mx-auto", SQUARE.name): mx_auto_square,
    ("mx-auto", LOSS.name): mx_auto_loss,
}


# ---- the hand-written CustomOp, as MXNet's tutorial writes one ---------------------------
class Square(mx.operator.CustomOp):
    def forward(self, is_train, req, in_data, out_data, aux):
        x = in_data[0]
        self.assign(out_data[0], req[0], x * x)

    def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
        self.assign(in_grad[0], req[0], 2 * in_data[0] * out_grad[0])


class SumSquares(mx.operator.CustomOp):
    def forward(self, is_train, req, in_data, out_data, aux):
        x = in_data[0]
        self.assign(out_data[0], req[0], mx.nd.sum(x * x))

    def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
        self.assign(in_grad[0], req[0], 2 * in_data[0] * out_grad[0])


@mx.operator.register("bench_square")
class SquareProp(mx.operator.CustomOpProp):
    def __init__(self):
        super().__init__(need_top_grad=True)

    def list_arguments(self):
        return ["data"]

    def list_outputs(self):
        return ["output"]

    def infer_shape(self, in_shape):
        return in_shape, [in_shape[0]], []

    def create_operator(self, ctx, shapes, dtypes):
        return Square()


@mx.operator.register("bench_sum_squares")
class SumSquaresProp(SquareProp):
    def infer_shape(self, in_shape):
        return in_shape, [(1,)], []

    def create_operator(self, ctx, shapes, dtypes):
        return SumSquares()


HANDWRITTEN = {SQUARE.name: "bench_square", LOSS.name: "bench_sum_squares"}


# ---- mx.autograd.Function -------------------------------------------------------------
class SquareFunction(mx.autograd.Function):
    def forward(self, x):
        self.save_for_backward(x)
        return x * x

    def backward(self, dy):
        (x,) = self.saved_tensors
        return 2 * x * dy


class SumSquaresFunction(SquareFunction):
    def forward(self, x):
        self.save_for_backward(x)
        return mx.nd.sum(x * x)


FUNCTIONS = {SQUARE.name: SquareFunction, LOSS.name: SumSquaresFunction}


# ---- variants: one timed callable per pass ----------------------------------------------
@dataclass
class Variant:
    """A way to run one Kind; ``run[pass](x)`` returns the output or the gradient, synced."""

    name: str
    run: dict[str, Callable]
    numpy_input: bool = False


def forward_of(f: Callable) -> Callable:
    def run(x):
        y = f(x)
        y.wait_to_read()
        return y

    return run


def fwd_bwd_of(f: Callable) -> Callable:
    def run(x):
        with mx.autograd.record():
            y = f(x)
        y.backward()
        x.grad.wait_to_read()
        return x.grad

    return run


def pinned(op, path: str) -> Callable:
    def call(x):
        with forced_path(path):
            return op(x)

    return call


def both(f: Callable) -> dict[str, Callable]:
    return {"fwd": forward_of(f), "fwd+bwd": fwd_bwd_of(f)}


def decorated_variants(prefix: str, op) -> list[Variant]:
    return [
        Variant(f"{prefix}/default", both(op)),
        Variant(f"{prefix}/direct", {"fwd": forward_of(pinned(op, "direct"))}),
        Variant(f"{prefix}/function", {"fwd+bwd": fwd_bwd_of(pinned(op, "function"))}),
        Variant(f"{prefix}/graph", {"fwd+bwd": fwd_bwd_of(pinned(op, "graph"))}),
        Variant(f"{prefix}/custom", both(pinned(op, "custom"))),
        Variant(f"{prefix}/nd.Custom", both(lambda x: mx.nd.Custom(x, op_type=op.op_type))),
    ]


def hips_variant(kind: Kind) -> Variant:
    if kind is LOSS:
        fwd_bwd = autograd.grad(kind.numpy)
    else:

        def fwd_bwd(x):
            vjp, ans = autograd.make_vjp(kind.numpy)(x)
            return vjp(np.ones_like(ans))

    return Variant("hips", {"fwd": kind.numpy, "fwd+bwd": fwd_bwd}, numpy_input=True)


def variants_for(kind: Kind) -> list[Variant]:
    function = FUNCTIONS[kind.name]
    op_type = HANDWRITTEN[kind.name]
    return [
        Variant("native", both(kind.native)),
        Variant("handwritten", both(lambda x: mx.nd.Custom(x, op_type=op_type))),
        Variant("ag.Function", both(lambda x: function()(x))),
        *decorated_variants("mx", DECORATED["mx", kind.name]),
        *decorated_variants("np", DECORATED["np", kind.name]),
        Variant("mx-auto/default", {"fwd+bwd": fwd_bwd_of(DECORATED["mx-auto", kind.name])}),
        Variant(
            "mx-auto/native",
            {"fwd+bwd": fwd_bwd_of(pinned(DECORATED["mx-auto", kind.name], "native"))},
        ),
        Variant(
            "mx-auto/function",
            {"fwd+bwd": fwd_bwd_of(pinned(DECORATED["mx-auto", kind.name], "function"))},
        ),
        hips_variant(kind),
    ]


# ---- correctness first -------------------------------------------------------------------
def make_input(size: int, seed: int = 0) -> tuple[mx.nd.NDArray, np.ndarray]:
    x_np = np.random.default_rng(seed).uniform(-1, 1, size).astype(np.float32)
    x_nd = mx.nd.array(x_np, dtype=np.float32)
    x_nd.attach_grad()
    return x_nd, x_np


def as_numpy(value) -> np.ndarray:
    return np.ravel(value.asnumpy() if isinstance(value, mx.nd.NDArray) else np.asarray(value))


def check_variants(kinds: list[Kind], names: set[str] | None) -> None:
    """Assert that every variant's output and gradient match native's on a small input."""
    x_nd, x_np = make_input(7, seed=1)
    for kind in kinds:
        variants = variants_for(kind)
        native = variants[0]
        for pass_ in PASSES:
            want = as_numpy(native.run[pass_](x_nd))
            for v in variants[1:]:
                if pass_ not in v.run or names is not None and v.name not in names:
                    continue
                got = as_numpy(v.run[pass_](x_np if v.numpy_input else x_nd))
                if got.shape != want.shape or not np.allclose(got, want, rtol=1e-5, atol=1e-6):
                    raise AssertionError(
                        f"{v.name} {kind.name} {pass_}: got {got}, "
                        f"native gives {want}; not timing a broken variant"
                    )


# ---- timing --------------------------------------------------------------------------------
@dataclass
class Budget:
    """How long to time one (op, size, pass) group: fixed repeats, or a time budget."""

    seconds: float
    min_rounds: int
    max_rounds: int
    repeats: int | None = None

    def rounds(self, seconds_per_round: float) -> int:
        if self.repeats is not None:
            return math.ceil(self.repeats / BLOCK)
        wanted = int(self.seconds / max(seconds_per_round, 1e-9))
        return max(self.min_rounds, min(self.max_rounds, wanted))


def timed(fn: Callable, x) -> float:
    start = time.perf_counter()
    fn(x)
    return time.perf_counter() - start


def measure_group(calls: list[tuple[str, Callable, object]], budget: Budget) -> dict:
    """Median seconds per call and timed calls for each (name, fn, input).

    Round-robin with a rotating order; each turn is one untimed lead-in call,
    which absorbs what the previous variant left running on MXNet's threads,
    then BLOCK timed calls.
    """
    per_call = {}
    for name, fn, x in calls:
        for _ in range(WARMUP):
            fn(x)
        per_call[name] = min(timed(fn, x) for _ in range(WARMUP))
    rounds = budget.rounds(sum(per_call.values()) * (BLOCK + 1))
    samples: dict[str, list[float]] = {name: [] for name, _, _ in calls}
    for r in range(rounds):
        shift = r % len(calls)
        for name, fn, x in calls[shift:] + calls[:shift]:
            fn(x)
            samples[name] += [timed(fn, x) for _ in range(BLOCK)]
    return {name: summary(s) for name, s in samples.items()}


def summary(seconds: list[float]) -> tuple[float, float, int]:
    """Median, interquartile range relative to the median, and the number of samples."""
    q1, median, q3 = statistics.quantiles(seconds, n=4) if len(seconds) > 1 else seconds * 3
    return median, (q3 - q1) / median, len(seconds)


# Keep freed buffers in the heap: no mmap/munmap and page faults per multi-MB buffer.
ALLOCATOR = {
    "MALLOC_MMAP_THRESHOLD_": str(1 << 30),
    "MALLOC_TRIM_THRESHOLD_": str(1 << 30),
    "MALLOC_TOP_PAD_": str(64 << 20),
}


def with_steady_allocator(argv: list[str]) -> None:
    """Re-execute this script once with ALLOCATOR in the environment (glibc reads it at start)."""
    if "--system-malloc" in argv or all(k in os.environ for k in ALLOCATOR):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(
        sys.executable,
        [sys.executable, os.path.abspath(__file__), *argv],
        {**os.environ, **ALLOCATOR},
    )


REFERENCES = ("native", "handwritten")  # timed in every group: the ratios need them


@dataclass
class Row:
    kind: str
    size: int
    pass_: str
    variant: str
    ms: float
    spread: float
    calls: int
    vs_native: float
    vs_handwritten: float


def run_all(
    kinds: list[Kind],
    sizes: list[int],
    passes: list[str],
    names: set[str] | None,
    budget: Budget,
    progress: Callable[[str], None],
) -> list[Row]:
    rows = []
    for kind in kinds:
        for size in sizes:
            x_nd, x_np = make_input(size)
            for pass_ in passes:
                calls = [
                    (v.name, v.run[pass_], x_np if v.numpy_input else x_nd)
                    for v in variants_for(kind)
                    if pass_ in v.run and (names is None or v.name in names or v.name in REFERENCES)
                ]
                progress(f"{kind.name} n={size_label(size)} {pass_}: {len(calls)} variants")
                medians = measure_group(calls, budget)
                native = medians["native"][0]
                handwritten = medians["handwritten"][0]
                rows += [
                    Row(
                        kind.name,
                        size,
                        pass_,
                        name,
                        sec * 1e3,
                        spread,
                        n,
                        sec / native,
                        sec / handwritten,
                    )
                    for name, (sec, spread, n) in medians.items()
                ]
    return rows


# ---- the targets -----------------------------------------------------------------
TARGETS = (
    # (what, variants, sizes, column, limit)
    (
        "imperative mx op vs handwritten, 10 and 1e3 elements",
        ("mx/default",),
        (10, 1_000),
        "vs_handwritten",
        0.5,
    ),
    ("imperative mx op vs native, 1e6 elements", ("mx/default",), (1_000_000,), "vs_native", 1.5),
    (
        "mx.nd.Custom path vs handwritten, all sizes",
        ("mx/custom", "mx/nd.Custom"),
        SIZES,
        "vs_handwritten",
        1.1,
    ),
    # issue 41: imperative training at native speed (fwd+bwd rows only)
    (
        "def_grad op under record() vs native, 10 and 1e3 elements",
        ("mx/default",),
        (10, 1_000),
        "vs_native",
        1.3,
        "fwd+bwd",
    ),
    (
        "def_grad op under record() vs native, 1e6 elements",
        ("mx/default",),
        (1_000_000,),
        "vs_native",
        1.05,
        "fwd+bwd",
    ),
    (
        "op without def_grad under record() vs native, 10 and 1e3 elements",
        ("mx-auto/default",),
        (10, 1_000),
        "vs_native",
        1.3,
        "fwd+bwd",
    ),
)


def target_lines(rows: list[Row]) -> list[str]:
    lines = []
    for what, variants, sizes, column, limit, *passes in TARGETS:
        for variant in variants:
            hits = [
                r
                for r in rows
                if r.variant == variant and r.size in sizes and (not passes or r.pass_ in passes)
            ]
            if not hits:
                continue
            worst = max(hits, key=lambda r: getattr(r, column))
            met = sum(getattr(r, column) <= limit for r in hits)
            verdict = "met" if met == len(hits) else "MISSED"
            lines.append(
                f"{what} (<= {limit}x), {variant}: {verdict} ({met} of "
                f"{len(hits)} rows within; worst {getattr(worst, column):.2f}x at "
                f"{worst.kind} n={size_label(worst.size)} {worst.pass_})"
            )
    return lines


# ---- output --------------------------------------------------------------------------------
def size_label(size: int) -> str:
    exponent = len(str(size)) - 1
    return f"1e{exponent}" if size >= 1000 and size == 10**exponent else str(size)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def shown_path(path: str) -> str:
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def header_lines() -> list[str]:
    return [
        f"date: {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}",
        f"machine: {cpu_model()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}",
        f"python {platform.python_version()}, mxnet {mx.__version__}, numpy {np.__version__}, "
        f"autograd {importlib.metadata.version('autograd')}",
        f"MXNET_ENGINE_TYPE={os.environ.get('MXNET_ENGINE_TYPE', '(unset: threaded engine)')}, "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '(unset)')}, allocator: "
        + (
            ", ".join(f"{k}={os.environ[k]}" for k in ALLOCATOR)
            if all(k in os.environ for k in ALLOCATOR)
            else "glibc defaults (--system-malloc)"
        ),
        "command: "
        + " ".join([shown_path(sys.executable), shown_path(sys.argv[0]), *sys.argv[1:]]),
    ]


COLUMNS = (
    "op",
    "size",
    "pass",
    "variant",
    "median ms",
    "IQR",
    "calls",
    "vs native",
    "vs handwritten",
)
NUMERIC = set(COLUMNS[4:]) | {"size"}


def cells(row: Row) -> list[str]:
    return [
        row.kind,
        size_label(row.size),
        row.pass_,
        row.variant,
        f"{row.ms:.4g}",
        f"{row.spread:.0%}",
        str(row.calls),
        f"{row.vs_native:.2f}x",
        f"{row.vs_handwritten:.2f}x",
    ]


def render_text(rows: list[Row]) -> str:
    table = [list(COLUMNS)] + [cells(r) for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(COLUMNS))]
    out = []
    for i, line in enumerate(table):
        out.append(
            "  ".join(
                c.rjust(w) if name in NUMERIC else c.ljust(w)
                for c, w, name in zip(line, widths, COLUMNS)
            ).rstrip()
        )
        if i == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def render_markdown(rows: list[Row]) -> str:
    out = [
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "|".join("---:" if c in NUMERIC else "---" for c in COLUMNS) + "|",
    ]
    out += ["| " + " | ".join(cells(r)) + " |" for r in rows]
    return "\n".join(out)


def report(rows: list[Row], markdown: bool) -> str:
    head, targets = header_lines(), target_lines(rows)
    if markdown:
        return "\n".join(
            [
                "\n".join(f"- {line}" for line in head),
                "",
                render_markdown(rows),
                "",
                "Targets:",
                "",
                *(f"- {line}" for line in targets),
            ]
        )
    return "\n".join(
        [*head, "", render_text(rows), "", "Targets:", *(f"  {line}" for line in targets)]
    )


# ---- command line -----------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a smaller time budget (under ~40 s)")
    p.add_argument(
        "--repeats",
        type=int,
        metavar="N",
        help="time N calls per variant, rounded up to a multiple of 4 "
        "(default: a time budget per group)",
    )
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    p.add_argument(
        "--sizes",
        default=",".join(str(s) for s in SIZES),
        help="comma-separated element counts (1e3 notation allowed)",
    )
    p.add_argument(
        "--ops",
        default=",".join(k.name for k in KINDS),
        help="comma-separated operations: " + ", ".join(k.name for k in KINDS),
    )
    p.add_argument(
        "--passes", default=",".join(PASSES), help="comma-separated passes: " + ", ".join(PASSES)
    )
    p.add_argument(
        "--system-malloc",
        action="store_true",
        help="keep glibc's default allocator settings (noisy medians at 1e6)",
    )
    p.add_argument(
        "--variants",
        help="comma-separated variants to time (native and "
        "handwritten are always timed, for the ratios)",
    )
    args = p.parse_args(argv)
    if args.repeats is not None and args.repeats < 1:
        p.error("--repeats must be at least 1")
    args.sizes = [int(float(s)) for s in args.sizes.split(",")]
    by_name = {k.name: k for k in KINDS}
    try:
        args.kinds = [by_name[name] for name in args.ops.split(",")]
    except KeyError as exc:
        p.error(f"unknown op {exc}; choose from {', '.join(by_name)}")
    args.passes = args.passes.split(",")
    if not set(args.passes) <= set(PASSES):
        p.error(f"--passes takes {', '.join(PASSES)}")
    args.names = None if args.variants is None else set(args.variants.split(","))
    known = [v.name for v in variants_for(SQUARE)]
    if args.names is not None and not args.names <= set(known):
        p.error(
            f"unknown variant(s) {', '.join(sorted(args.names - set(known)))}; "
            f"choose from {', '.join(known)}"
        )
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if argv is None:
        with_steady_allocator(sys.argv[1:])
    if args.quick:
        budget = Budget(seconds=1.2, min_rounds=3, max_rounds=25, repeats=args.repeats)
    else:
        budget = Budget(seconds=8.0, min_rounds=10, max_rounds=250, repeats=args.repeats)
    start = time.perf_counter()
    check_variants(args.kinds, args.names)

    def progress(msg: str) -> None:
        print(f"[{time.perf_counter() - start:6.1f} s] {msg}", file=sys.stderr, flush=True)

    progress("every variant matches native on a small input")
    rows = run_all(args.kinds, args.sizes, args.passes, args.names, budget, progress)
    progress("done")
    print(report(rows, args.markdown))


if __name__ == "__main__":
    main()
