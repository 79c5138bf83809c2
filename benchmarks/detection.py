"""Detection operators (issue 11) side by side: ours vs MXNet's, 'mxnet' vs 'numpy' mode.

Run: ``python benchmarks/detection.py [--markdown] [--repeat N] [--images B] [--anchors N]``.
Each group times its variants round-robin (one untimed warm-up call each first); every
call synchronises (``mx.nd.waitall``). ``median ms`` is per forward call (not recording);
``vs native`` divides by the group's MXNet op, ``vs numpy`` by the ``'numpy'`` twin.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402
from tables import print_table  # noqa: E402  (benchmarks/ is sys.path[0] when run as a script)

import ops  # noqa: E402


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    for o in out if isinstance(out, (tuple, list)) else [out]:
        o.wait_to_read()
    return (time.perf_counter() - start) * 1e3


def _group(name, size, variants, repeat):
    """variants: [(label, fn)]; returns table rows."""
    for _, fn in variants:
        _timed(fn)
    times = {label: [] for label, _ in variants}
    for r in range(repeat):
        turn = variants[r % len(variants) :] + variants[: r % len(variants)]
        for label, fn in turn:
            times[label].append(_timed(fn))
    med = {label: statistics.median(t) for label, t in times.items()}
    native = next((m for label, m in med.items() if label.startswith("mx.nd")), None)
    numpy_ = next((m for label, m in med.items() if ".numpy" in label), None)
    rows = []
    for label, m in med.items():
        rows.append(
            [
                name,
                size,
                label,
                f"{m:.3f}",
                f"{m / native:.2f}x" if native else "",
                f"{m / numpy_:.3f}x" if numpy_ else "",
            ]
        )
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--anchors", type=int, default=20000)
    args = parser.parse_args(argv)
    b, n, rep = args.images, args.anchors, args.repeat
    rng = np.random.RandomState(0)
    nd = mx.nd.array

    # --- topk over anchor scores
    scores = nd(rng.rand(b, n).astype(np.float32))
    k = 1000
    rows = _group(
        "topk value",
        f"{b}x{n}, k={k}",
        [
            ("mx.nd.topk", lambda: mx.nd.topk(scores, k=k, ret_typ="value")),
            ("ops.topk do_sort=True", lambda: ops.topk(scores, k=k)),
            ("ops.topk do_sort=False", lambda: ops.topk(scores, k=k, do_sort=False)),
            ("ops.topk.numpy do_sort=False", lambda: ops.topk.numpy(scores, k=k, do_sort=False)),
        ],
        rep,
    )

    # --- NMS over detections (class, score, box)
    xy = rng.uniform(0, 600, (b, n, 2))
    wh = rng.uniform(8, 120, (b, n, 2))
    dets = nd(
        np.concatenate([rng.randint(0, 20, (b, n, 1)), rng.rand(b, n, 1), xy, xy + wh], -1).astype(
            np.float32
        )
    )
    nms = dict(overlap_thresh=0.5, valid_thresh=0.05, topk=1000, id_index=0)
    rows += _group(
        "box_nms",
        f"{b}x{n}, topk=1000",
        [
            ("mx.nd.contrib.box_nms", lambda: mx.nd.contrib.box_nms(dets, **nms)),
            ("ops.box_nms", lambda: ops.box_nms(dets, **nms)),
            ("ops.box_nms legacy_box", lambda: ops.box_nms(dets, legacy_box=True, **nms)),
            (
                "ops.box_nms.numpy legacy_box",
                lambda: ops.box_nms.numpy(dets, legacy_box=True, **nms),
            ),
        ],
        max(3, rep // 3),
    )

    # --- IoU of proposals with ground truth
    props, gts = dets[:, :, 2:6].reshape((-1, 4))[:4000], dets[0, :50, 2:6]
    rows += _group(
        "box_iou",
        "4000x50",
        [
            ("mx.nd.contrib.box_iou", lambda: mx.nd.contrib.box_iou(props, gts)),
            ("ops.box_iou legacy_box", lambda: ops.box_iou(props, gts, legacy_box=True)),
            (
                "ops.box_iou.numpy legacy_box",
                lambda: ops.box_iou.numpy(props, gts, legacy_box=True),
            ),
        ],
        rep,
    )

    # --- box coding
    anchors = dets[:, :, 2:6]
    refs = dets[:, :50, 2:6]
    samples = nd(rng.choice([-1, 0, 1], (b, n)).astype(np.float32))
    matches = nd(rng.randint(0, 50, (b, n)).astype(np.float32))
    means, stds = nd([0, 0, 0, 0]), nd([0.1, 0.1, 0.2, 0.2])
    enc = (samples, matches, anchors, refs, means, stds)
    rows += _group(
        "box_encode",
        f"{b}x{n}",
        [
            ("mx.nd.contrib.box_encode", lambda: mx.nd.contrib.box_encode(*enc)),
            ("ops.box_encode", lambda: ops.box_encode(*enc)),
            ("ops.box_encode legacy_box", lambda: ops.box_encode(*enc, legacy_box=True)),
            (
                "ops.box_encode.numpy legacy_box",
                lambda: ops.box_encode.numpy(*enc, legacy_box=True),
            ),
        ],
        rep,
    )
    offsets = nd(rng.normal(0, 0.3, (b, n, 4)).astype(np.float32))
    rows += _group(
        "box_decode",
        f"{b}x{n}",
        [
            (
                "mx.nd.contrib.box_decode",
                lambda: mx.nd.contrib.box_decode(offsets, anchors[:1], format="corner"),
            ),
            (
                "ops.box_decode legacy_box",
                lambda: ops.box_decode(offsets, anchors[:1], format="corner", legacy_box=True),
            ),
            (
                "ops.box_decode.numpy legacy_box",
                lambda: ops.box_decode.numpy(
                    offsets, anchors[:1], format="corner", legacy_box=True
                ),
            ),
        ],
        rep,
    )

    # --- OHEM and arr_pick ('mxnet' vs 'numpy' mode)
    conf = nd(rng.normal(size=(b, n, 21)).astype(np.float32))
    target = nd(rng.choice([-1, 0, 0, 0, 0, 0, 0, 0, 1, 5], (b, n)).astype(np.float32))
    weight = mx.nd.ones((b, n))
    rows += _group(
        "ohem_sampler",
        f"{b}x{n}x21",
        [
            ("ops.ohem_sampler", lambda: ops.ohem_sampler(conf, target, weight)),
            ("ops.ohem_sampler.numpy", lambda: ops.ohem_sampler.numpy(conf, target, weight)),
        ],
        rep,
    )
    arr = nd(rng.rand(b, 32, n).astype(np.float32))
    mask = np.zeros((b, 1, n), np.float32)
    for i in range(b):
        mask[i, 0, rng.choice(n, 100, replace=False)] = 1
    indicate = nd(mask)
    rows += _group(
        "arr_pick",
        f"{b}x32x{n}, num=100",
        [
            ("ops.arr_pick", lambda: ops.arr_pick(arr, indicate, num=100)),
            ("ops.arr_pick.numpy", lambda: ops.arr_pick.numpy(arr, indicate, num=100)),
        ],
        rep,
    )

    header = ["op", "size", "variant", "median ms", "vs native", "vs numpy"]
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(
        f"# {stamp}, {platform.machine()}, {os.cpu_count()} cores, python "
        f"{platform.python_version()}, mxnet {mx.__version__}, numpy {np.__version__}, "
        f"context cpu, {b} images x {n} anchors, repeat {rep}"
    )
    print_table(header, rows, args.markdown, align="---|---|---|---:|---:|---:")


if __name__ == "__main__":
    main()
