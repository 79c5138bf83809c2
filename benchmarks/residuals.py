"""Forward+backward with residuals (the forward hands its work to the backward) vs recomputation.

Run from the repository root (3-4 minutes on 2 CPU cores; ``--quick`` about 15 s)::

    .venv/bin/python benchmarks/residuals.py [--markdown] [--quick] [--only focal_loss]

Three operators, each in two versions that compute the same numbers:

* ``softmax_ce``: ``ops.softmax_ce`` (the ``'mxnet'`` op keeps ``onehot(label)``, the
  ``'numpy'`` twin the validated integer labels, as residuals) next to the same op with its
  previous closures, which build them again in the backward.  Its backward already receives
  the probabilities as ``ans``, so only the one-hot / index work is saved.
* ``focal_loss``: ``ops.focal_loss`` (both twins keep the focal weights ``alpha t (1-p)^gamma``
  and ``(1-alpha)(1-t) p^gamma``, the two softplus terms, the valid mask and the normalizer)
  next to the same op with its previous closures, which build the one-hot targets, mask,
  softplus terms, weights and normalizer again in the backward.
* ``arc_margin``: ArcFace's additive angular margin ``cos(arccos(clip(x)) + m)`` (the
  operator of issue 21): the residual version keeps ``theta`` and ``sin(theta)`` for the
  backward; the other one recomputes clip, arccos and the square root there.

One timed call is ``mx.autograd.record()``, the forward, ``backward()``, and a wait for the
input's gradient.  Each is timed on the default recording path (``function``) and on
``mx.nd.Custom`` (``custom``: the path of symbols, Module and hybridized blocks).  The two
versions alternate call by call; the table gives each one's median and the median of the
per-pair ratios.  Both versions' outputs and gradients are compared before timing.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
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
from customop import customop, residuals  # noqa: E402
from customop.dispatch import forced_path  # noqa: E402


# ---- softmax_ce with its previous closures (one-hot / indices built in the backward) --------
@customop("mxnet", need_top_grad=False, infer_shape=lambda data, label: data)
def softmax_ce_recompute(data, label):
    num_class = data.shape[1]
    if ((label < 0) + (label >= num_class) + (label != mx.nd.floor(label))).sum().asscalar():
        raise ValueError("bad label")
    return mx.nd.softmax(data, axis=1)


@softmax_ce_recompute.twin("numpy")
def _softmax_ce_recompute_np(data, label):
    num_class = data.shape[1]
    if np.any((label < 0) | (label >= num_class) | (label != np.floor(label))):
        raise ValueError("bad label")
    e = np.exp(data - data.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _onehot_grad(ans, data, label):
    return lambda _: ans - mx.nd.one_hot(label, ans.shape[1], dtype=ans.dtype)


def _index_grad(ans, data, label):
    def grad(_):
        d = ans.copy()
        d[np.arange(len(d)), label.astype(np.int64)] -= 1
        return d

    return grad


softmax_ce_recompute.def_grad(_onehot_grad)
softmax_ce_recompute.def_grad(lambda ans, data, label: lambda _: mx.nd.zeros_like(label), 1)
softmax_ce_recompute.numpy.def_grad(_index_grad)
softmax_ce_recompute.numpy.def_grad(lambda ans, data, label: lambda _: np.zeros_like(label), 1)


# ---- focal_loss with its previous closures (targets, weights, normalizer built again) ---------
_fl = importlib.import_module("ops.focal_loss")  # its checks and helpers, shared by both versions


@customop(
    "mxnet", optional=("normalizer",), no_grad=("label",), infer_shape=lambda pred, *_, **__: pred
)
def focal_loss_recompute(
    pred,
    label,
    normalizer=None,
    *,
    alpha=0.25,
    gamma=2.0,
    normalization="positive",
    ignore_label=-1,
):
    _fl._check(pred, label, normalizer, alpha, gamma, normalization, ignore_label)
    num_class = pred.shape[-1]
    label = label.astype(pred.dtype, copy=False)
    bad = ((label < 0) + (label > num_class) + (1 - (label == mx.nd.floor(label)))) * (
        1 - (label == ignore_label)
    )
    _fl._checks.require(bad == 0, "label", _fl._label_message(num_class, ignore_label))
    alpha_t, alpha_1t, valid = _fl._targets_nd(label, num_class, ignore_label, alpha)
    sp_pos = mx.nd.Activation(pred, act_type="softrelu")
    sp_neg = mx.nd.Activation(-pred, act_type="softrelu")
    loss = (
        alpha_t * mx.nd.exp(-gamma * sp_pos) * sp_neg
        + alpha_1t * mx.nd.exp(-gamma * sp_neg) * sp_pos
    )
    return mx.nd.broadcast_div(
        mx.nd.broadcast_mul(loss, valid),
        _fl._normalizer_nd(label, valid, normalizer, normalization, ignore_label, pred),
    )


@focal_loss_recompute.twin("numpy")
def _focal_loss_recompute_np(
    pred,
    label,
    normalizer=None,
    *,
    alpha=0.25,
    gamma=2.0,
    normalization="positive",
    ignore_label=-1,
):
    _fl._check(pred, label, normalizer, alpha, gamma, normalization, ignore_label)
    num_class = pred.shape[-1]
    if np.any(
        ((label < 0) | (label > num_class) | (label != np.floor(label))) & (label != ignore_label)
    ):
        raise _fl._checks.fail("focal_loss", "label", _fl._label_message(num_class, ignore_label))
    t, valid = _fl._targets_np(label, num_class, ignore_label, pred.dtype)
    sp_pos = np.logaddexp(0, pred)
    sp_neg = np.logaddexp(0, -pred)
    loss = (
        t * alpha * np.exp(-gamma * sp_pos) * sp_neg
        + (1 - t) * (1 - alpha) * np.exp(-gamma * sp_neg) * sp_pos
    )
    return (loss * valid / _fl._normalizer_np(label, valid, normalizer, normalization)).astype(
        pred.dtype, copy=False
    )


def _focal_grad_nd(
    ans,
    pred,
    label,
    normalizer=None,
    *,
    alpha=0.25,
    gamma=2.0,
    normalization="positive",
    ignore_label=-1,
):
    def grad(g):
        lab = label.astype(pred.dtype, copy=False)
        alpha_t, alpha_1t, valid = _fl._targets_nd(lab, pred.shape[-1], ignore_label, alpha)
        p, q = mx.nd.sigmoid(pred), mx.nd.sigmoid(-pred)
        sp_pos = mx.nd.Activation(pred, act_type="softrelu")
        sp_neg = mx.nd.Activation(-pred, act_type="softrelu")
        d = -alpha_t * mx.nd.exp(-gamma * sp_pos) * (q + gamma * p * sp_neg) + alpha_1t * mx.nd.exp(
            -gamma * sp_neg
        ) * (p + gamma * q * sp_pos)
        z = _fl._normalizer_nd(lab, valid, normalizer, normalization, ignore_label, pred)
        return g * mx.nd.broadcast_div(mx.nd.broadcast_mul(d, valid), z)

    return grad


def _focal_grad_np(
    ans,
    pred,
    label,
    normalizer=None,
    *,
    alpha=0.25,
    gamma=2.0,
    normalization="positive",
    ignore_label=-1,
):
    def grad(g):
        t, valid = _fl._targets_np(label, pred.shape[-1], ignore_label, pred.dtype)
        sp_pos, sp_neg = np.logaddexp(0, pred), np.logaddexp(0, -pred)
        p, q = np.exp(-sp_neg), np.exp(-sp_pos)
        d = -t * alpha * np.exp(-gamma * sp_pos) * (q + gamma * p * sp_neg) + (1 - t) * (
            1 - alpha
        ) * np.exp(-gamma * sp_neg) * (p + gamma * q * sp_pos)
        return g * (d * valid / _fl._normalizer_np(label, valid, normalizer, normalization))

    return grad


focal_loss_recompute.def_grad(_focal_grad_nd)
focal_loss_recompute.numpy.def_grad(_focal_grad_np)


# ---- ArcFace's angular margin: y = cos(theta + m), theta = arccos(clip(x)) ------------------
EPS = 1e-6


@customop("mxnet")
def arc_margin(x, m=0.5):
    theta = mx.nd.arccos(mx.nd.clip(x, -1 + EPS, 1 - EPS))
    return mx.nd.cos(theta + m)


# dy/dx = sin(theta + m) / sin(theta), and 0 where x was clipped
arc_margin.def_grad(
    lambda ans, x, m=0.5: _arc_grad(x, mx.nd.arccos(mx.nd.clip(x, -1 + EPS, 1 - EPS)), m)
)


@customop("mxnet")
def arc_margin_saved(x, m=0.5):
    theta = mx.nd.arccos(mx.nd.clip(x, -1 + EPS, 1 - EPS))
    return residuals(mx.nd.cos(theta + m), theta=theta)


arc_margin_saved.def_grad(lambda ans, x, theta, m=0.5: _arc_grad(x, theta, m))


def _arc_grad(x, theta, m):
    inside = mx.nd.abs(x) < 1 - EPS
    return lambda g: g * inside * mx.nd.sin(theta + m) / mx.nd.sin(theta)


# ---- timing ------------------------------------------------------------------------------------
def cases(quick):
    n, c = (128, 100) if quick else (1024, 1000)
    rng = np.random.RandomState(0)
    data = mx.nd.array(rng.normal(size=(n, c)).astype(np.float32))
    label = mx.nd.array(rng.randint(0, c, size=n).astype(np.float32))
    cosine = mx.nd.array(rng.uniform(-0.99, 0.99, size=(n, c)).astype(np.float32))
    # detection-like: (images, anchors, classes) logits, mostly background, a few ignored
    shape = (2, 500, 16) if quick else (8, 2000, 64)
    logits = mx.nd.array(rng.normal(scale=2.0, size=shape).astype(np.float32))
    kind = rng.uniform(size=shape[:2])
    anchors = np.where(
        kind < 0.05, -1, np.where(kind < 0.15, rng.randint(1, shape[2] + 1, size=shape[:2]), 0)
    )
    anchor_label = mx.nd.array(anchors.astype(np.float32))
    return (
        [
            (
                "focal_loss 'mxnet'",
                (focal_loss_recompute.mxnet, ops.focal_loss.mxnet),
                [logits, anchor_label],
                {},
            ),
            (
                "focal_loss 'numpy'",
                (focal_loss_recompute.numpy, ops.focal_loss.numpy),
                [logits, anchor_label],
                {},
            ),
            (
                "softmax_ce 'mxnet'",
                (softmax_ce_recompute.mxnet, ops.softmax_ce.mxnet),
                [data, label],
                {},
            ),
            (
                "softmax_ce 'numpy'",
                (softmax_ce_recompute.numpy, ops.softmax_ce.numpy),
                [data, label],
                {},
            ),
            ("arc_margin 'mxnet'", (arc_margin, arc_margin_saved), [cosine], {"m": 0.5}),
        ],
        (n, c),
        shape,
    )


def fwd_bwd(op, inputs, params, path):
    x = inputs[0]
    with forced_path(path), mx.autograd.record():
        y = op(*inputs, **params)
    y.backward()
    x.grad.wait_to_read()
    return y


def check(op_pair, inputs, params, path):
    got = []
    for op in op_pair:
        y = fwd_bwd(op, inputs, params, path)
        got.append((y.asnumpy(), inputs[0].grad.asnumpy()))
    for a, b in zip(*got):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def time_pair(op_pair, inputs, params, path, pairs):
    # One call of each version per pair, in alternating order, so load from elsewhere hits
    # both alike; the speed-up is the median of the per-pair ratios.
    times = [[], []]
    for k in (0, 1):
        fwd_bwd(op_pair[k], inputs, params, path)  # lead-in
    for t in range(pairs):
        for k in (0, 1) if t % 2 == 0 else (1, 0):
            start = time.perf_counter()
            fwd_bwd(op_pair[k], inputs, params, path)
            times[k].append(time.perf_counter() - start)
    ratio = statistics.median(a / b for a, b in zip(*times))
    return [statistics.median(ts) * 1e3 for ts in times] + [ratio]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--only",
        default="",
        metavar="TEXT",
        help="only the operators whose name contains TEXT (e.g. focal_loss)",
    )
    args = parser.parse_args(argv)
    pairs = 6 if args.quick else 60
    all_cases, (n, c), focal_shape = cases(args.quick)
    load = [os.getloadavg()[0]]
    rows = []
    for name, pair, inputs, params in all_cases:
        if args.only not in name:
            continue
        inputs[0].attach_grad()
        for path in ("function", "custom"):
            check(pair, inputs, params, path)
            recompute, saved, ratio = time_pair(pair, inputs, params, path, pairs)
            rows.append([name, path, f"{recompute:.2f}", f"{saved:.2f}", f"{ratio:.2f}x"])
    load.append(os.getloadavg()[0])
    machine = platform.processor() or platform.machine()
    print(
        f"# {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC, {machine}, {os.cpu_count()} "
        f"cores, load average {load[0]:.1f} -> {load[1]:.1f}, python "
        f"{platform.python_version()}, mxnet {mx.__version__}, numpy {np.__version__}"
        f"; inputs ({n}, {c}) float32, focal_loss {focal_shape}; medians of {pairs} calls"
    )
    print_table(
        ["operator", "path", "recompute ms", "residuals ms", "speed-up (median ratio)"],
        rows,
        args.markdown,
        "---|---|---:|---:|---:",
    )


if __name__ == "__main__":
    main()
