"""Step time of the standard two-context ops.CenterLoss loop: copies kept equal by Trainer.step
itself (the ``auxsync`` patch) next to the same loop calling AuxSync by hand (patch off).

Each variant runs in its own fresh process, the two alternating ``--rounds`` times;
the table gives the median step over all rounds.  ``python benchmarks/aux_agreement.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.rounds import fresh_rounds  # noqa: E402


def child(args):
    import mxnet as mx

    import ops
    from customop.distributed.auxsync import AuxSync

    ctxs = [mx.cpu(0), mx.cpu(1)]
    mx.random.seed(0)
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(args.dim, activation="relu", in_units=args.dim))
    loss_fn = ops.CenterLoss(args.classes, args.dim)
    params = net.collect_params()
    params.update(loss_fn.collect_params())
    params.initialize(mx.init.Xavier(), ctx=ctxs)
    net.hybridize()
    trainer = mx.gluon.Trainer(params, "sgd", {"learning_rate": 0.01})
    sync = AuxSync([loss_fn.centers], trainer) if args.by_hand else None
    rng = np.random.RandomState(0)
    x = mx.nd.array(rng.normal(size=(args.batch, args.dim)))
    y = mx.nd.array(rng.randint(0, args.classes, size=args.batch))
    xs, ys = mx.gluon.utils.split_and_load(x, ctxs), mx.gluon.utils.split_and_load(y, ctxs)

    def step():
        with mx.autograd.record():
            losses = [loss_fn(net(a), b) for a, b in zip(xs, ys)]
        for loss in losses:
            loss.backward()
        trainer.step(args.batch)
        if sync is not None:
            sync()
        mx.nd.waitall()

    for _ in range(5):
        step()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    c = [d.asnumpy() for d in loss_fn.centers.list_data()]
    assert np.array_equal(c[0], c[1])
    print(json.dumps(times), flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--by-hand", action="store_true")
    args = parser.parse_args(argv)
    if args.child:
        return child(args)
    variants = [
        ("automatic (Trainer.step alone)", [], {}),
        (
            "AuxSync by hand (CUSTOMOP_RUNTIME_OFF=auxsync)",
            ["--by-hand"],
            {"CUSTOMOP_RUNTIME_OFF": "auxsync"},
        ),
    ]
    common = [f"--{k}={getattr(args, k)}" for k in ("batch", "dim", "classes", "steps")]
    found = fresh_rounds(
        variants,
        args.rounds,
        lambda flags: (
            f"from benchmarks.aux_agreement import main; main({['--child', *common, *flags]!r})"
        ),
    )
    times = {name: [t for run in runs for t in run] for name, runs in found.items()}
    print(
        f"two-context ops.CenterLoss loop, batch {args.batch}, dim {args.dim}, "
        f"{args.classes} classes: median step (ms) of {args.rounds} x {args.steps} steps"
    )
    base = float(np.median(times["AuxSync by hand (CUSTOMOP_RUNTIME_OFF=auxsync)"]))
    for name, t in times.items():
        ms = 1e3 * float(np.median(t))
        print(f"| {name} | {ms:.2f} | {ms / (1e3 * base):.3f} |")


if __name__ == "__main__":
    main()
