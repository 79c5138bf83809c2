"""Mixed precision: the RetinaNet-style head trained under MXNet's AMP.

``mxnet.contrib.amp`` runs the convolutions in ``bfloat16`` on a CPU (``float16`` on a
GPU); our operators then receive half-precision arrays.  Each of them does what AMP does
to a ``Custom`` node: it casts a ``float16``/``bfloat16`` input to ``float32`` on entry (a
recorded cast: the gradient flows back in the input's dtype) and returns ``float32``, on
every path, imperatively and hybridized.  So the losses are summed in ``float32``, as
AMP's lists have MXNet's own losses do.  ``main()`` takes 4 steps with
``amp.init_trainer`` and ``amp.scale_loss``, imperatively and hybridized, and prints the
losses (they agree to ``bfloat16`` rounding, and fall)::

    python examples/amp_training.py

One change to the head: its ``F.full((1,), 3.0)`` fails under AMP in symbol mode (MXNet
1.9.1's AMP wrapper of an operator without array inputs), so the constant is made from
one of the head's own constants.
"""

from __future__ import annotations

import os
import sys

import mxnet as mx
from mxnet.contrib import amp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import retinanet_head as R  # noqa: E402


class AmpRetinaHead(R.RetinaHead):
    """``RetinaHead`` with its ``sigma`` constant made from ``stds`` (works under AMP)."""

    def sigma(self, F, stds):
        return F.ones_like(F.slice_axis(stds, axis=0, begin=0, end=1)) * 3.0


def train(block, hybridize, steps=4, lr=1.0, seed=0):
    """The loss of each of ``steps`` SGD steps under AMP (``amp.init()`` has run), and the
    block's parameters after them."""
    mx.random.seed(seed)
    block.initialize(mx.init.Xavier())
    if hybridize:
        block.hybridize()
    trainer = mx.gluon.Trainer(block.collect_params(), "sgd", {"learning_rate": lr})
    amp.init_trainer(trainer)
    losses = []
    for feat, boxes, labels in R.make_batches(steps):
        batch = [mx.nd.array(a) for a in (feat, boxes, labels)]
        with mx.autograd.record():
            loss = block(*batch)
            with amp.scale_loss(loss, trainer) as scaled:
                mx.autograd.backward(scaled)
        trainer.step(1)
        losses.append(float(loss.astype("float32").asscalar()))
    return losses, {
        name[len(block.prefix) :]: p.data().asnumpy() for name, p in block.collect_params().items()
    }


def main():
    amp.init(target_dtype="bfloat16" if mx.context.num_gpus() == 0 else "float16")
    for hybridize in (False, True):
        losses, _ = train(AmpRetinaHead(R.make_anchors(), prefix="retina_"), hybridize)
        print("hybridized " if hybridize else "imperative", " ".join(f"{v:.4f}" for v in losses))


if __name__ == "__main__":
    main()
