"""The loss operators of ``ops/`` next to what a user would otherwise write, forward+backward.

Run from the repository root (about 2-3 minutes on 2 CPU cores; ``--quick`` well under one)::

    .venv/bin/python benchmarks/losses.py              # plain-text table
    .venv/bin/python benchmarks/losses.py --markdown   # the same, as Markdown
    .venv/bin/python benchmarks/losses.py --quick --ops focal_loss

For each loss, at a realistic size, one timed call is ``mx.autograd.record()``, the forward,
``backward()`` with a head gradient of ones, and a wait for the input's gradient.  Variants:

* ``mxnet``: ``ops.<name>`` (``'mxnet'`` mode; under ``record()`` it takes the ``function``
  path: forward on the caller's thread, one autograd node calling the gradient closure);
* ``mxnet/custom``: the same op pinned to ``mx.nd.Custom`` (the path symbols, Module and
  hybridized blocks take);
* ``numpy``: ``ops.<name>.numpy``, the ``'numpy'``-mode twin;
* ``native``: the closest composition of ``mx.nd`` operators a user would write (GluonCV's
  focal loss, ``mx.nd.smooth_l1``, ``mx.nd.SoftmaxOutput``, ``mx.nd.tile``, ...), whose
  gradient MXNet's autograd derives.

Variants are timed round-robin (one untimed lead-in call per turn) so load from elsewhere hits
all alike; the table gives per-call medians and each variant's ratio to ``native``.  Before
timing, every variant's output and gradient are checked against ``native`` on the benchmark
inputs.  Like ``overhead.py``, the script re-executes itself once with glibc's mmap/trim
thresholds raised (``--system-malloc`` keeps the defaults) so big buffers do not pay page
faults at random.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import statistics
import sys
import time

import mxnet as mx
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tables import print_table  # noqa: E402  (benchmarks/ is sys.path[0] when run as a script)

import ops  # noqa: E402
from customop.dispatch import forced_path  # noqa: E402

ALLOCATOR = {
    "MALLOC_MMAP_THRESHOLD_": str(1 << 30),
    "MALLOC_TRIM_THRESHOLD_": str(1 << 30),
    "MALLOC_TOP_PAD_": str(64 << 20),
}
VARIANTS = ("mxnet", "mxnet/custom", "numpy", "native")


# ---- what a user writes without ops/ ---------------------------------------------------------
def native_focal(pred, label, alpha=0.25, gamma=2.0):
    # GluonCV's FocalLoss (sigmoid, one-hot, pt, (1-pt)^gamma log pt), masked and normalized
    # like ops.focal_loss(normalization='positive').
    num_class = pred.shape[-1]
    p = mx.nd.sigmoid(pred)
    one_hot = mx.nd.one_hot(label - 1, num_class)
    pt = mx.nd.where(one_hot, p, 1 - p)
    weight = mx.nd.where(one_hot, alpha * mx.nd.ones_like(p), (1 - alpha) * mx.nd.ones_like(p))
    loss = -weight * (1 - pt) ** gamma * mx.nd.log(mx.nd.minimum(pt + 1e-12, 1))
    valid = (label != -1).expand_dims(-1)
    num_pos = mx.nd.maximum(((label > 0) * (label != -1)).sum(), 1)
    return mx.nd.broadcast_div(mx.nd.broadcast_mul(loss, valid), num_pos.reshape((1, 1, 1)))


def native_wing(pred, target, w=10.0, epsilon=2.0):
    x = mx.nd.abs(pred - target)
    c = w - w * math.log(1 + w / epsilon)
    return mx.nd.where(x < w, w * mx.nd.log(1 + x / epsilon), x - c)


def native_center(data, label, centers, num_class, alpha=0.5):
    # The loss under autograd; the center update written by hand after it (as in the blog post)
    diff = data - mx.nd.take(centers, label)
    loss = 0.5 * (diff * diff).sum(axis=1)
    d = diff.detach()
    onehot = mx.nd.one_hot(label, num_class)
    centers[:] = centers + alpha * mx.nd.dot(onehot, d, transpose_a=True) / (
        1 + onehot.sum(axis=0)
    ).reshape((-1, 1))
    return loss


# ---- the cases --------------------------------------------------------------------------------
def cases(quick):
    rng = np.random.default_rng(0)
    scale = 8 if quick else 1
    n_img, anchors, classes = 8, 20000 // scale, 80
    pred = rng.normal(size=(n_img, anchors, classes)).astype(np.float32) * 2
    label = rng.integers(-1, classes + 1, size=(n_img, anchors)).astype(np.float32)
    label[rng.random(label.shape) < 0.9] = 0  # mostly background, as in detection
    yield (
        "focal_loss",
        f"{n_img}x{anchors}x{classes}",
        [pred, label],
        {},
        lambda op: op,
        lambda xs: native_focal(*xs),
    )

    boxes = rng.normal(size=(n_img, anchors * 4 // 4, 4)).astype(np.float32)
    sigma = np.array([3.0], np.float32)
    yield (
        "smooth_l1",
        f"{n_img}x{anchors}x4, sigma (1,)",
        [boxes, sigma],
        {},
        lambda op: op,
        lambda xs: mx.nd.smooth_l1(xs[0], scalar=3.0),
    )

    lm = rng.normal(size=(1024 // scale, 196), scale=8).astype(np.float32)
    yield (
        "wing_loss",
        f"{lm.shape[0]}x196",
        [lm, np.zeros_like(lm)],
        {},
        lambda op: op,
        lambda xs: native_wing(*xs),
    )

    feats = rng.normal(size=(256, 512)).astype(np.float32)
    ys = rng.integers(0, 1000, size=256).astype(np.float32)
    yield ("center_loss", "256x512, 1000 classes", [feats, ys], {"num_class": 1000}, "center", None)

    logits = rng.normal(size=(1024 // scale, 1000)).astype(np.float32)
    cls = rng.integers(0, 1000, size=logits.shape[0]).astype(np.float32)
    yield (
        "softmax_ce",
        f"{logits.shape[0]}x1000",
        [logits, cls],
        {},
        lambda op: op,
        lambda xs: mx.nd.SoftmaxOutput(xs[0], xs[1]),
    )

    img = rng.normal(size=(64 // scale, 256, 32)).astype(np.float32)
    yield (
        "tile",
        f"{img.shape[0]}x256x32, reps (1, 2, 4)",
        [img],
        {"reps": (1, 2, 4)},
        lambda op: op,
        lambda xs: mx.nd.tile(xs[0], reps=(1, 2, 4)),
    )


def make_calls(name, inputs, params, native):
    """One zero-argument callable per variant: forward+backward, returns (output, grad)."""
    op = getattr(ops, name)
    xs = [mx.nd.array(a) for a in inputs]
    xs[0].attach_grad()
    centers = {v: mx.nd.zeros((params.get("num_class", 1), inputs[0].shape[-1])) for v in VARIANTS}

    def call(variant):
        args = xs + [centers[variant]] if name == "center_loss" else xs
        with forced_path("custom" if variant == "mxnet/custom" else None):
            with mx.autograd.record():
                if variant == "native":
                    out = (
                        native_center(*xs, centers["native"], params["num_class"])
                        if name == "center_loss"
                        else native(xs)
                    )
                else:
                    out = (op.numpy if variant == "numpy" else op)(*args, **params)
            out.backward()
        xs[0].grad.wait_to_read()
        return out, xs[0].grad

    return {v: (lambda v=v: call(v)) for v in VARIANTS}


def check(name, calls):
    want_out, want_grad = (a.asnumpy() for a in calls["native"]())
    for v in VARIANTS[:-1]:
        out, grad = (a.asnumpy() for a in calls[v]())
        for what, got, want in (("output", out, want_out), ("gradient", grad, want_grad)):
            if not np.allclose(got, want, rtol=1e-4, atol=1e-6 * max(1, np.abs(want).max())):
                raise SystemExit(
                    f"{name}/{v}: {what} differs from native by {np.abs(got - want).max():.3g}"
                )


def time_all(calls, turns, per_turn):
    times = {v: [] for v in VARIANTS}
    for v in VARIANTS:  # warm-up: shape inference, allocator
        calls[v]()
    for turn in range(turns):
        order = VARIANTS[turn % len(VARIANTS) :] + VARIANTS[: turn % len(VARIANTS)]
        for v in order:
            calls[v]()  # lead-in, untimed
            for _ in range(per_turn):
                t0 = time.perf_counter()
                calls[v]()
                times[v].append(time.perf_counter() - t0)
    return {v: statistics.median(ts) * 1e3 for v, ts in times.items()}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if "--system-malloc" not in argv and not all(k in os.environ for k in ALLOCATOR):
        sys.stdout.flush()
        os.execve(
            sys.executable,
            [sys.executable, os.path.abspath(__file__), *argv],
            {**os.environ, **ALLOCATOR},
        )
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--ops", default="", help="comma-separated subset of the losses")
    ap.add_argument("--turns", type=int, default=None)
    ap.add_argument("--system-malloc", action="store_true")
    args = ap.parse_args(argv)
    turns = args.turns or (2 if args.quick else 3)
    wanted = [s for s in args.ops.split(",") if s]
    rows = []
    for name, size, inputs, params, _, native in cases(args.quick):
        if wanted and name not in wanted:
            continue
        calls = make_calls(name, inputs, params, native)
        check(name, calls)
        ms = time_all(calls, turns, per_turn=2)
        rows.append(
            [
                name,
                size,
                *(f"{ms[v]:.2f}" for v in VARIANTS),
                *(f"{ms[v] / ms['native']:.2f}x" for v in VARIANTS[:-1]),
            ]
        )
    header = [
        "loss",
        "size",
        *(f"{v} ms" for v in VARIANTS),
        *(f"{v} / native" for v in VARIANTS[:-1]),
    ]
    print(
        f"# benchmarks/losses.py, {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC, "
        f"python {platform.python_version()}, mxnet {mx.__version__}, numpy {np.__version__}, "
        f"{os.cpu_count()} CPUs, {turns} turns x 2 timed calls per variant, forward+backward "
        "medians"
    )
    print_table(header, rows, args.markdown)


if __name__ == "__main__":
    main()
