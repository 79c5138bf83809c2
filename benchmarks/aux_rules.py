"""What each aux merge rule makes of center-loss centers on two devices: a measured table.

The same center loss (``ops.center_loss``'s forward and gradient) is declared once per merge
rule (``'sum'``, ``'mean'``, ``'first'``, ``'local'``) and trained with ``Module`` on 2 CPU
contexts for a few SGD steps (features from a ``FullyConnected`` layer, so the centers' values
feed back into the weights).  Each result is compared with

* the same op on **one device on the whole batch** (what the rule should reproduce), and
* a **hand-written** ``CustomOp`` center loss, the port's original, on the same 2 devices: MXNet
  keeps one copy of its aux state per device and never reconciles them.

Every variant starts from the same weights, data and zero centers; the centers read are
``Module.get_params()``'s aux params (what a checkpoint saves: MXNet averages the copies).
The table gives the largest absolute difference in the centers.  With few classes (``--classes 4``,
the default) every class has samples on both devices at every step; with many
(``--classes 64``) most classes are seen on one device only.  Run::

    python benchmarks/aux_rules.py [--steps 3] [--classes 4] [--markdown]

(about 5 s).  :func:`measure` returns the numbers (``tests/ops/test_center_loss.py`` checks
what the aux-states how-to says of each rule with it).
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from pathlib import Path

import mxnet as mx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from customop import customop  # noqa: E402
from ops import center_loss  # noqa: E402
from ops.center_loss import _centers_shape  # noqa: E402

RULES = ("sum", "mean", "first", "local")
NUM_CLASS, DIM, BATCH = 4, 3, 16
ALPHA = 0.5


def _declare(rule: str):
    op = customop(
        "mxnet",
        name=f"bench.aux_rules.center_loss_{rule}",
        aux={"centers": (_centers_shape, rule)},
        infer_shape=lambda data, *_, **__: (data[0],),
        no_grad=("label",),
    )(center_loss.fn)
    return op.def_grad(center_loss.grads[0])


OPS = {rule: _declare(rule) for rule in RULES}


# ---- the original: a hand-written CustomOp whose centers are its aux state ----------------
class _CenterLossOp(mx.operator.CustomOp):
    def __init__(self, num_class, alpha, scale):
        super().__init__()
        self.num_class, self.alpha, self.scale = num_class, alpha, scale

    def forward(self, is_train, req, in_data, out_data, aux):
        data, label, centers = in_data[0], in_data[1], aux[0]
        diff = data - mx.nd.take(centers, label, axis=0)
        self.assign(out_data[0], req[0], 0.5 * self.scale * (diff * diff).sum(axis=1))

    def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
        data, label, centers = in_data[0], in_data[1], aux[0]
        diff = data - mx.nd.take(centers, label, axis=0)
        self.assign(in_grad[0], req[0], self.scale * diff * out_grad[0].reshape((-1, 1)))
        self.assign(in_grad[1], req[1], mx.nd.zeros_like(label))
        onehot = mx.nd.one_hot(label, self.num_class, dtype=data.dtype)
        sums = mx.nd.dot(onehot, diff, transpose_a=True)
        counts = (1 + onehot.sum(axis=0)).reshape((-1, 1))
        centers[:] = centers + self.alpha * sums / counts


@mx.operator.register("bench_aux_rules_center_loss")
class _CenterLossProp(mx.operator.CustomOpProp):
    def __init__(self, num_class, alpha=0.5, scale=1.0):
        super().__init__(need_top_grad=True)
        self.num_class, self.alpha, self.scale = int(num_class), float(alpha), float(scale)

    def list_arguments(self):
        return ["data", "label"]

    def list_auxiliary_states(self):
        return ["centers"]

    def infer_shape(self, in_shape):
        data, label = in_shape
        return [data, label], [(data[0],)], [(self.num_class, data[1])]

    def create_operator(self, ctx, shapes, dtypes):
        return _CenterLossOp(self.num_class, self.alpha, self.scale)


# ---- training ---------------------------------------------------------------------------------
def _symbol(variant: str, num_class: int) -> mx.sym.Symbol:
    data, label = mx.sym.var("data"), mx.sym.var("label")
    feat = mx.sym.FullyConnected(data, num_hidden=DIM, name="fc")
    if variant == "handwritten":
        loss = mx.sym.Custom(
            feat,
            label,
            op_type="bench_aux_rules_center_loss",
            num_class=num_class,
            alpha=ALPHA,
            name="cl",
        )
    else:
        loss = OPS[variant](feat, label, num_class=num_class, alpha=ALPHA, name="cl")
    return mx.sym.MakeLoss(mx.sym.mean(loss))


def train(variant: str, devices: int, steps: int, num_class: int = NUM_CLASS) -> np.ndarray:
    """The centers (``get_params()``'s aux value) after ``steps`` SGD steps."""
    rng = np.random.RandomState(0)
    x = rng.normal(size=(BATCH, 5)).astype(np.float32)
    y = rng.randint(0, num_class, size=BATCH).astype(np.float32)
    w = rng.normal(scale=0.5, size=(DIM, 5)).astype(np.float32)
    ctx = [mx.cpu(i) for i in range(devices)]
    mod = mx.mod.Module(
        _symbol(variant, num_class), data_names=["data"], label_names=["label"], context=ctx
    )
    mod.bind(data_shapes=[("data", x.shape)], label_shapes=[("label", y.shape)])
    mod.init_params(
        arg_params={"fc_weight": mx.nd.array(w), "fc_bias": mx.nd.zeros(DIM)},
        aux_params={"cl_centers": mx.nd.zeros((num_class, DIM))},
    )
    mod.init_optimizer(optimizer="sgd", optimizer_params={"learning_rate": 0.1})
    batch = mx.io.DataBatch([mx.nd.array(x)], [mx.nd.array(y)])
    for step in range(steps):
        # a new batch each step (the same one for every variant)
        xs = rng.normal(size=x.shape).astype(np.float32) if step else x
        batch = mx.io.DataBatch([mx.nd.array(xs)], [mx.nd.array(y)])
        mod.forward_backward(batch)
        mod.update()
    mx.nd.waitall()
    return mod.get_params()[1]["cl_centers"].asnumpy()


def measure(steps: int = 3, num_class: int = NUM_CLASS) -> dict[str, dict[str, float]]:
    """Per rule: the largest difference of the centers from one device on the whole batch
    (``'vs one device'``) and from the hand-written original on 2 devices
    (``'vs hand-written'``); also the hand-written op's own one-device row."""
    one = {rule: train(rule, 1, steps, num_class) for rule in RULES}
    hand_two = train("handwritten", 2, steps, num_class)
    hand_one = train("handwritten", 1, steps, num_class)
    out = {}
    for rule in RULES:
        two = train(rule, 2, steps, num_class)
        out[rule] = {
            "vs one device": float(np.abs(two - one[rule]).max()),
            "vs hand-written": float(np.abs(two - hand_two).max()),
            "one device vs hand-written": float(np.abs(one[rule] - hand_one).max()),
        }
    out["hand-written"] = {
        "vs one device": float(np.abs(hand_two - hand_one).max()),
        "vs hand-written": 0.0,
        "one device vs hand-written": 0.0,
    }
    out["size of the centers"] = {
        "vs one device": float(np.abs(hand_one).max()),
        "vs hand-written": float(np.abs(hand_two).max()),
        "one device vs hand-written": float("nan"),
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument(
        "--classes",
        type=int,
        default=NUM_CLASS,
        help=f"number of classes (default {NUM_CLASS}: every class on both "
        f"devices; 64: most classes on one device per step; batch {BATCH})",
    )
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    rows = measure(args.steps, args.classes)
    print(
        f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; "
        f"mxnet {mx.__version__}; Module, 2 CPU contexts vs 1, {args.steps} SGD steps, "
        f"batch {BATCH}, {args.classes} classes, feature dim {DIM}, alpha {ALPHA}; load "
        f"{os.getloadavg()[0]:.1f}"
    )
    print(
        f"command: python benchmarks/aux_rules.py --steps {args.steps} --classes {args.classes}"
        f"{' --markdown' if args.markdown else ''}\n"
    )
    head = (
        "rule",
        "largest difference vs one device on the whole batch",
        "vs the hand-written original on 2 devices",
    )
    lines = [head] + [
        (f"'{r}'" if r in RULES else r, f"{v['vs one device']:.3g}", f"{v['vs hand-written']:.3g}")
        for r, v in rows.items()
        if r != "size of the centers"
    ]
    if args.markdown:
        print("| " + " | ".join(head) + " |\n|---|---:|---:|")
        for line in lines[1:]:
            print("| " + " | ".join(line) + " |")
    else:
        widths = [max(len(line[i]) for line in lines) for i in range(3)]
        for line in lines:
            print("  ".join(cell.ljust(w) for cell, w in zip(line, widths)))
    size = rows["size of the centers"]
    print(
        f"\nlargest center, one device: {size['vs one device']:.3g}; the same rule on one "
        "device vs the hand-written op on one device: "
        f"{max(rows[r]['one device vs hand-written'] for r in RULES):.3g}"
    )


if __name__ == "__main__":
    main()
