"""Several ops in one hybridized graph: a training step of the RetinaNet-style head, ours vs native.

Run from the repository root (about 20 s on 2 CPU cores; ``--quick`` a few seconds)::

    .venv/bin/python benchmarks/composed.py              # plain-text table
    .venv/bin/python benchmarks/composed.py --markdown   # the same, as Markdown

``ours`` is ``examples/retinanet_head.py``'s ``RetinaHead``: targets from ``ops.box_iou`` +
``ops.box_encode``, losses ``ops.focal_loss`` + ``ops.smooth_l1`` (four custom nodes in one
CachedOp graph).  ``native`` is the same head with MXNet's operators only: the targets
from ``contrib.box_iou`` + ``contrib.box_encode``, the focal loss written by hand with
``F`` ops (sigmoid, one-hot, softrelu for the logs, as ``ops.focal_loss`` computes it) and
``F.smooth_l1``.  Both are hybridized and start from the same parameters; ``ours
imperative`` and ``native imperative`` are the same heads not hybridized, trained
imperatively under ``record()`` (our ops run their native graphs from a signature's second
call), and ``ours imperative, function path`` the first of them with
``forced_path('function')`` (the forward and closures in Python, as before the graph path).
Before timing, the loss and every parameter's gradient of each are checked to agree with
native's (float32); the script stops if they do not.

One timed step is ``record()``, the forward, ``backward()``, ``Trainer.step`` (plain SGD)
and a wait for every parameter.  The variants are timed round-robin (each turn: one
untimed step, then ``--calls`` timed ones) so load from elsewhere hits them alike; the
table gives per-step medians, the interquartile range as a fraction of the median, and
the ratio to ``native`` (hybridized rows) or ``native imperative`` (imperative rows).  The
load average is printed before and after.

``--peak STEPS`` instead trains each head ``STEPS`` steps in a fresh process and prints
its peak and final resident memory, with glibc's heap in use, live mmapped allocations,
free heap and the process's threads at the end (where an extra over native is).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402
import retinanet_head as R  # noqa: E402
from tables import print_table  # noqa: E402  (benchmarks/ is sys.path[0] when run as a script)

from customop.dispatch import forced_path  # noqa: E402


def native_focal(F, pred, label, alpha=0.25, gamma=2.0):
    """``ops.focal_loss(pred, label)`` (normalization='positive', ignore_label=-1) in F ops."""
    target = F.one_hot(label - 1, R.NUM_CLASS)  # background 0 and ignored -1: all zero
    p = F.sigmoid(pred)
    log_p = -F.Activation(-pred, act_type="softrelu")  # log p = -softplus(-x)
    log_1p = -F.Activation(pred, act_type="softrelu")  # log (1 - p) = -softplus(x)
    loss = (
        -alpha * target * (1 - p) ** gamma * log_p - (1 - alpha) * (1 - target) * p**gamma * log_1p
    )
    valid = F.expand_dims(label != -1, axis=-1)
    return F.broadcast_div(F.broadcast_mul(loss, valid), F.maximum(F.sum(label > 0), 1))


class NativeRetinaHead(R.RetinaHead):
    """``RetinaHead`` with MXNet's own operators in place of ours, line for line."""

    def hybrid_forward(self, F, feat, gt_boxes, gt_labels, anchors, means, stds):
        cls_pred = F.reshape(F.transpose(self.cls(feat), (0, 2, 3, 1)), (0, -1, self.num_class))
        box_pred = F.reshape(F.transpose(self.box(feat), (0, 2, 3, 1)), (0, -1, 4))

        iou = F.transpose(F.contrib.box_iou(anchors, gt_boxes), (1, 0, 2))
        best, match = F.max(iou, axis=2), F.argmax(iou, axis=2)
        samples = (best >= 0.5) - (best < 0.4)
        label = F.pick(F.broadcast_like(F.expand_dims(gt_labels, 1), iou), match, axis=2)
        cls_target = F.where(samples > 0, label, -1 - samples)
        anchors = F.broadcast_like(F.expand_dims(anchors, 0), box_pred, lhs_axes=0, rhs_axes=0)
        box_target, box_mask = F.contrib.box_encode(samples, match, anchors, gt_boxes, means, stds)

        cls_loss = F.sum(native_focal(F, cls_pred, cls_target))
        box_loss = F.sum(box_mask * F.smooth_l1(box_pred - box_target, scalar=3.0))
        return F.make_loss(cls_loss + F.broadcast_div(box_loss, F.maximum(F.sum(samples > 0), 1)))


def make_batch(batch, channels, size, num_gt, seed=0):
    """Features and ground truth for a ``size`` x ``size`` map (anchors of examples' sizes)."""
    rng = np.random.RandomState(seed)
    extent = size * R.STRIDE
    corner = rng.uniform(0, extent - 6, (batch, num_gt, 2))
    boxes = np.concatenate([corner, corner + rng.uniform(2.5, 6, (batch, num_gt, 2))], axis=2)
    labels = rng.randint(1, R.NUM_CLASS + 1, (batch, num_gt))
    feat = rng.randn(batch, channels, size, size)
    return [mx.nd.array(a, dtype=np.float32) for a in (feat, boxes, labels)]


def make_heads(channels, size, seed=0):
    """``{'ours': head, 'native': head, ...}`` with equal parameters: hybridized, and (keys
    ending ``imperative``) not hybridized, trained imperatively under ``record()``."""
    anchors = R.make_anchors(size, size)
    heads = {
        "ours": R.RetinaHead(anchors, channels=channels, prefix="head_"),
        "native": NativeRetinaHead(anchors, channels=channels, prefix="head_"),
        "ours imperative": R.RetinaHead(anchors, channels=channels, prefix="head_"),
        "native imperative": NativeRetinaHead(anchors, channels=channels, prefix="head_"),
    }
    mx.random.seed(seed)
    heads["ours"].initialize(mx.init.Xavier())
    for key in list(heads)[1:]:
        heads[key].initialize()
        for name, p in heads[key].collect_params().items():
            p.set_data(heads["ours"].collect_params()[name].data().copy())
    heads["ours"].hybridize()
    heads["native"].hybridize()
    return heads


def loss_and_grads(head, data):
    with mx.autograd.record():
        loss = head(*data)
    loss.backward()
    return loss.asnumpy(), {
        n: p.grad().asnumpy() for n, p in head.collect_params().items() if p.grad_req != "null"
    }


def check_agreement(heads, data):
    """Raise unless every head gives native's loss and gradients (float32 tolerance)."""
    want_loss, want = loss_and_grads(heads["native"], data)
    for key in heads:
        for _ in range(2):  # (imperatively, a signature's second call runs the native graph)
            loss, got = loss_and_grads(heads[key], data)
        np.testing.assert_allclose(loss, want_loss, rtol=1e-5, err_msg=key)
        assert sorted(got) == sorted(want)
        for name in want:
            scale = np.abs(want[name]).max()
            assert scale > 0, f"{name}: zero gradient, nothing compared"
            np.testing.assert_allclose(
                got[name], want[name], rtol=1e-4, atol=1e-5 * scale, err_msg=f"{key}: {name}"
            )
    return float(want_loss[0])


def _step(head, trainer, data):
    with mx.autograd.record():
        loss = head(*data)
    loss.backward()
    trainer.step(1)
    for p in head.collect_params().values():
        p.data().wait_to_read()


def time_steps(heads, data, turns, calls):
    trainers = {
        k: mx.gluon.Trainer(h.collect_params(), "sgd", {"learning_rate": 1e-4})
        for k, h in heads.items()
    }
    variants = [(k, None) for k in heads] + [("ours imperative, function path", "function")]
    times = {name: [] for name, _ in variants}
    for turn in range(turns):
        shift = turn % len(variants)
        for name, path in variants[shift:] + variants[:shift]:
            k = name.split(",")[0]
            with forced_path(path):
                _step(heads[k], trainers[k], data)  # untimed lead-in
                for _ in range(calls):
                    start = time.perf_counter()
                    _step(heads[k], trainers[k], data)
                    times[name].append((time.perf_counter() - start) * 1e3)
    return times


def _rss_mib(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":")) / 1024


def peak_child(variant, steps):
    """Train ``variant`` (a key of make_heads) ``steps`` steps at 8x64x16x16 in this
    process; print its peak and final resident memory (MiB) as one JSON line."""
    data = make_batch(8, 64, 16, 8)
    heads = make_heads(64, 16)
    head = heads[variant]
    heads.clear()
    trainer = mx.gluon.Trainer(head.collect_params(), "sgd", {"learning_rate": 1e-4})
    for _ in range(steps):
        _step(head, trainer, data)
    mx.nd.waitall()
    print(
        json.dumps(
            {
                "peak": _rss_mib("VmHWM"),
                "end": _rss_mib("VmRSS"),
                **_heap(),
                "threads": len(os.listdir("/proc/self/task")),
            }
        )
    )


def _heap():
    """glibc's ``mallinfo2()`` in MiB: heap in use, live mmapped allocations, free heap."""
    import mallinfo

    try:
        info = mallinfo.glibc().mallinfo2()
    except (OSError, AttributeError):  # not glibc 2.33+
        return {}
    return {
        "in_use": info.uordblks / 2**20,
        "mmapped": info.hblkhd / 2**20,
        "free": info.fordblks / 2**20,
    }


def peak_table(steps, markdown):
    """Each head trained ``steps`` steps in a fresh process: peak and final RSS."""
    rows, found = [], {}
    for variant in ("native", "ours", "native imperative", "ours imperative"):
        proc = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--peak-child", variant, str(steps)],
            capture_output=True,
            text=True,
            check=True,
        )
        found[variant] = r = json.loads(proc.stdout.strip().splitlines()[-1])
        native = found["native imperative" if "imperative" in variant else "native"]
        heap = [f"{r[k]:.1f}" if k in r else "-" for k in ("in_use", "mmapped", "free")]
        rows.append(
            [
                variant,
                f"{r['peak']:.0f}",
                f"{r['end']:.0f}",
                f"{r['peak'] / native['peak']:.2f}x",
                *heap,
                str(r["threads"]),
            ]
        )
    print(
        f"peak resident memory, {steps} steps at 8x64x16x16, each head in a fresh process; "
        f"at the end, glibc's heap in use, live mmapped allocations and free heap (MiB)"
    )
    print_table(
        [
            "variant",
            "peak RSS (MiB)",
            "end RSS (MiB)",
            "peak vs native",
            "heap in use",
            "mmapped",
            "free heap",
            "threads",
        ],
        rows,
        markdown,
        align="---|---:|---:|---:|---:|---:|---:|---:",
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--quick", action="store_true", help="small sizes, few steps")
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--calls", type=int, default=4)
    parser.add_argument(
        "--peak",
        type=int,
        metavar="STEPS",
        default=0,
        help="instead: each head's peak RSS over STEPS steps, fresh processes",
    )
    parser.add_argument("--peak-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.peak_child:
        peak_child(args.peak_child[0], int(args.peak_child[1]))
        return
    if args.peak:
        peak_table(args.peak, args.markdown)
        return
    # (batch, channels, map size, ground-truth boxes): a tiny head, where the fixed cost of
    # four custom nodes shows, and one of a realistic small size
    sizes = [(2, 8, 4, 2)] if args.quick else [(2, 8, 4, 2), (8, 64, 16, 8)]
    turns = 2 if args.quick else args.turns
    rows = []
    load_before = os.getloadavg()
    for batch, channels, size, num_gt in sizes:
        data = make_batch(batch, channels, size, num_gt)
        heads = make_heads(channels, size)
        loss = check_agreement(heads, data)
        print(
            f"{batch}x{channels}x{size}x{size}: loss and every gradient agree (loss {loss:.6g})",
            file=sys.stderr,
        )
        times = time_steps(heads, data, turns, args.calls)
        for k in times:
            native = statistics.median(
                times["native imperative" if "imperative" in k else "native"]
            )
            q = statistics.quantiles(times[k], n=4)
            med = statistics.median(times[k])
            rows.append(
                [
                    f"RetinaNet-style head, {batch}x{channels}x{size}x{size}, "
                    f"{size * size * len(R.SIZES)} anchors",
                    k,
                    f"{med:.3f}",
                    f"{(q[2] - q[0]) / med:.0%}",
                    len(times[k]),
                    f"{med / native:.2f}x",
                ]
            )
    load_after = os.getloadavg()
    print(
        f"date: {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC; {platform.machine()}, "
        f"{os.cpu_count()} cores; python {platform.python_version()}, mxnet {mx.__version__}, "
        f"numpy {np.__version__}; load average (1 min) before {load_before[0]:.2f}, after "
        f"{load_after[0]:.2f}"
    )
    print_table(
        ["model", "variant", "median ms/step", "IQR", "steps", "vs native"],
        rows,
        args.markdown,
        align="---|---|---:|---:|---:|---:",
    )


if __name__ == "__main__":
    main()
