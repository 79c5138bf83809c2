"""Ported ops against what a PyTorch or JAX user would otherwise run, side by side.

Run from the repository root (needs ``pip install 'customop[port]'``; about 2 minutes on 2
CPU cores with the compiled rows, ``--quick`` well under one)::

    .venv/bin/python benchmarks/port.py              # plain-text table
    .venv/bin/python benchmarks/port.py --markdown   # the same, as Markdown
    .venv/bin/python benchmarks/port.py --quick      # fewer calls, no torch.compile rows

One timed call of a loss is a training step: the labels turned into targets inside the step
on both sides (one-hot, ignore mask, number of positives), the forward, and the gradient
with respect to the logits.  Rows:

* ``torch eager``: ``customop.to_torch(ops.focal_loss)`` against
  ``torchvision.ops.sigmoid_focal_loss`` (targets, ignore mask and the positives' count
  written around it);
* ``torch.compile``: both steps compiled (inductor), the same comparison; the port is
  decomposed into its forward graph's torch operators there, which inductor fuses;
* ``jax jit``: ``customop.to_jax(ops.focal_loss)`` against the same loss written by hand in
  ``jax.numpy``, both under ``jax.jit(jax.value_and_grad(...))``;
* ``box_iou``, ``box_nms`` (forward): the ports against ``torchvision.ops.box_iou`` and
  ``torchvision.ops.batched_nms`` on one image.

Variants of a row are timed round-robin (one untimed lead-in each) so load from elsewhere hits
both alike; the table gives per-call medians and the port's ratio to the reference.  Values
and gradients are checked against each other before timing.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# torch.compile's on-disk caches key a compiled graph by the op's name and call, not by the
# op's definition: a graph compiled before the port's code changed would be timed instead
os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import torch  # noqa: E402
import torchvision  # noqa: E402
from tables import print_table  # noqa: E402

import customop  # noqa: E402
from customop import ops  # noqa: E402

SIZES = [(2, 100, 5), (8, 9000, 20)]
ALPHA, GAMMA = 0.25, 2.0


def _inputs(shape, seed=0):
    r = np.random.RandomState(seed)
    n, a, c = shape
    labels = r.randint(-1, c + 1, (n, a))
    labels[r.rand(n, a) < 0.8] = 0  # mostly background, as in detection
    return r.randn(*shape).astype(np.float32), labels.astype(np.float32)


# ---- torch ----------------------------------------------------------------------------------
def torchvision_step(logits, labels):
    c = logits.shape[-1]
    valid = (labels != -1).to(logits.dtype).unsqueeze(-1)
    targets = torch.nn.functional.one_hot(labels.clamp(min=0).long(), c + 1)[..., 1:]
    npos = (labels > 0).sum().clamp(min=1)
    loss = torchvision.ops.sigmoid_focal_loss(
        logits, targets.to(logits.dtype), alpha=ALPHA, gamma=GAMMA, reduction="none"
    )
    return (loss * valid).sum() / npos


PORT = None


def port_step(logits, labels):
    return PORT(logits, labels).sum()


def _torch_grad(step):
    def run(x, labels):
        x = x.detach().requires_grad_(True)
        value = step(x, labels)
        (g,) = torch.autograd.grad(value, x)
        return value, g

    return run


def _time(calls: dict, rounds: int) -> dict:
    times = {k: [] for k in calls}
    for _ in range(rounds):
        for k, fn in calls.items():
            fn()  # lead-in
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def _rounds(shape, quick):
    big = shape[1] * shape[2] > 10000
    return (5 if big else 50) if quick else (15 if big else 300)


def torch_rows(quick, compiled):
    rows = []
    for shape in SIZES:
        x, lab = (torch.tensor(a) for a in _inputs(shape))
        pairs = {"port": _torch_grad(port_step), "torchvision": _torch_grad(torchvision_step)}
        kinds = [("torch eager", pairs)]
        if compiled:
            kinds.append(
                (
                    "torch.compile",
                    {
                        "port": _torch_grad(torch.compile(port_step, fullgraph=True)),
                        "torchvision": _torch_grad(torch.compile(torchvision_step, fullgraph=True)),
                    },
                )
            )
        for kind, fns in kinds:
            (v1, g1), (v2, g2) = fns["port"](x, lab), fns["torchvision"](x, lab)
            torch.testing.assert_close(v1, v2, rtol=1e-4, atol=1e-6)
            torch.testing.assert_close(g1, g2, rtol=1e-4, atol=1e-6)
            t = _time(
                {k: (lambda f=f, x=x, lab=lab: f(x, lab)) for k, f in fns.items()},
                _rounds(shape, quick),
            )
            rows.append(
                [
                    kind,
                    "focal_loss",
                    "x".join(map(str, shape)),
                    f"{t['port'] * 1e3:.3f}",
                    f"{t['torchvision'] * 1e3:.3f}",
                    "torchvision.ops.sigmoid_focal_loss",
                    f"{t['port'] / t['torchvision']:.2f}x",
                ]
            )
    return rows


# ---- jax ------------------------------------------------------------------------------------
def jnp_focal(logits, labels):
    c = logits.shape[-1]
    valid = (labels != -1).astype(logits.dtype)[..., None]
    t = (labels[..., None] == jnp.arange(1, c + 1)).astype(logits.dtype)
    npos = jnp.maximum((labels > 0).sum(), 1)
    p = jax.nn.sigmoid(logits)
    log_p, log_1p = -jax.nn.softplus(-logits), -jax.nn.softplus(logits)
    loss = -ALPHA * t * (1 - p) ** GAMMA * log_p - (1 - ALPHA) * (1 - t) * p**GAMMA * log_1p
    return (loss * valid).sum() / npos


def jax_rows(quick):
    rows = []
    port = customop.to_jax(ops.focal_loss)
    mine = jax.jit(jax.value_and_grad(lambda x, lab: port(x, lab).sum()))
    ref = jax.jit(jax.value_and_grad(jnp_focal))
    for shape in SIZES:
        x, lab = (jnp.asarray(a) for a in _inputs(shape))
        (v1, g1), (v2, g2) = mine(x, lab), ref(x, lab)
        np.testing.assert_allclose(float(v1), float(v2), rtol=1e-4)
        np.testing.assert_allclose(np.asarray(g1), np.asarray(g2), rtol=1e-3, atol=1e-6)

        def call(f, x=x, lab=lab):
            return lambda: jax.block_until_ready(f(x, lab))

        t = _time({"port": call(mine), "ref": call(ref)}, _rounds(shape, quick))
        rows.append(
            [
                "jax jit",
                "focal_loss",
                "x".join(map(str, shape)),
                f"{t['port'] * 1e3:.3f}",
                f"{t['ref'] * 1e3:.3f}",
                "the loss in jax.numpy",
                f"{t['port'] / t['ref']:.2f}x",
            ]
        )
    return rows


# ---- boxes ----------------------------------------------------------------------------------
def box_rows(quick):
    rows = []
    r = np.random.RandomState(1)

    def boxes(n):
        lo = r.uniform(0, 500, (n, 2))
        return np.concatenate([lo, lo + r.uniform(5, 100, (n, 2))], -1).astype(np.float32)

    iou = customop.to_torch(ops.box_iou)
    for n, m in ((100, 10), (2000, 50)):
        a, b = torch.tensor(boxes(n)), torch.tensor(boxes(m))
        torch.testing.assert_close(iou(a, b), torchvision.ops.box_iou(a, b))
        t = _time(
            {
                "port": lambda a=a, b=b: iou(a, b),
                "tv": lambda a=a, b=b: torchvision.ops.box_iou(a, b),
            },
            20 if quick else 200,
        )
        rows.append(
            [
                "torch eager",
                "box_iou (forward)",
                f"{n}x{m}",
                f"{t['port'] * 1e3:.3f}",
                f"{t['tv'] * 1e3:.3f}",
                "torchvision.ops.box_iou",
                f"{t['port'] / t['tv']:.2f}x",
            ]
        )
    nms = customop.to_torch(ops.box_nms)
    for n in (100, 1000):
        bx = torch.tensor(boxes(n))
        scores = torch.tensor(r.rand(n).astype(np.float32))
        ids = torch.tensor(r.randint(0, 3, n).astype(np.float32))
        data = torch.cat([ids[:, None], scores[:, None], bx], 1)[None]
        kw = dict(overlap_thresh=0.5, id_index=0, valid_thresh=-1.0)
        kept = torchvision.ops.batched_nms(bx, scores, ids.long(), 0.5)
        ours = nms(data, **kw)[0]
        assert int((ours[:, 0] >= 0).sum()) == len(kept)
        t = _time(
            {
                "port": lambda data=data, kw=kw: nms(data, **kw),
                "tv": lambda bx=bx, s=scores, i=ids: torchvision.ops.batched_nms(
                    bx, s, i.long(), 0.5
                ),
            },
            5 if quick else 30,
        )
        rows.append(
            [
                "torch eager",
                "box_nms (forward)",
                f"{n} boxes",
                f"{t['port'] * 1e3:.3f}",
                f"{t['tv'] * 1e3:.3f}",
                "torchvision.ops.batched_nms",
                f"{t['port'] / t['tv']:.2f}x",
            ]
        )
    return rows


def main():
    global PORT
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-compile", action="store_true")
    args = ap.parse_args()
    # one intra-op thread on both sides: on this shared 2-core machine a second thread made
    # single calls wait on a descheduled worker (medians 3-30x apart between runs)
    torch.set_num_threads(1)
    PORT = customop.to_torch(ops.focal_loss)
    rows = torch_rows(args.quick, not (args.quick or args.no_compile))
    rows += jax_rows(args.quick)
    rows += box_rows(args.quick)
    print(
        f"{datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC, {platform.processor() or 'cpu'}"
        f", {os.cpu_count()} cores, torch {torch.__version__}, jax {jax.__version__}"
    )
    print_table(
        ["framework", "op", "size", "port ms", "reference ms", "reference", "ratio"],
        rows,
        args.markdown,
    )


if __name__ == "__main__":
    main()
