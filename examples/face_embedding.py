"""A face-embedding head: softmax cross-entropy plus center loss, whose centers are an aux state.

A small network maps a (synthetic) face descriptor to an embedding; a dense classifier
on the embedding is trained with ``ops.softmax_ce`` (an output layer: its forward gives
the class probabilities, its backward the cross-entropy gradient), and the embedding
itself with ``ops.CenterLoss`` (Wen et al. 2016), which pulls each embedding towards its
identity's center.  The centers are not learned by SGD: they are an **auxiliary state**
of the operator, moved by its backward pass and saved with the model's parameters.

What it shows: an output layer and an op with aux states in one graph train the same on
every path, and the centers travel with the model (``Module``'s aux params, the exported
file).  ``main()`` takes 4 SGD steps imperatively, hybridized, through ``Module`` and
exported-then-reloaded with ``customop.imports``, and prints the loss of each step on each
path::

    python examples/face_embedding.py
"""

from __future__ import annotations

import os
import sys

import mxnet as mx
import numpy as np

from customop import ops

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import four_paths  # noqa: E402

NUM_ID, DESCRIPTOR, HIDDEN, EMBEDDING, BATCH = 4, 12, 16, 3, 8
CENTER_WEIGHT = 0.1
INPUTS = ["descriptor", "identity"]


class FaceHead(mx.gluon.HybridBlock):
    """Returns (class probabilities, center loss per face, embedding): every output can
    take ``backward`` (an output layer, a loss, a value without gradient)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.embed = mx.gluon.nn.HybridSequential()
            self.embed.add(
                mx.gluon.nn.Dense(HIDDEN, activation="relu", in_units=DESCRIPTOR),
                mx.gluon.nn.Dense(EMBEDDING, in_units=HIDDEN),
            )
            self.classify = mx.gluon.nn.Dense(NUM_ID, in_units=EMBEDDING)
            self.center_loss = ops.CenterLoss(
                num_class=NUM_ID, feature_dim=EMBEDDING, alpha=0.5, scale=CENTER_WEIGHT
            )

    def hybrid_forward(self, F, descriptor, identity):
        embedding = self.embed(descriptor)
        probs = ops.softmax_ce(self.classify(embedding), identity)
        centers = self.center_loss(embedding, identity)
        return probs, F.make_loss(centers), F.BlockGrad(embedding)


class FaceInference(mx.gluon.HybridBlock):
    """The trained head at inference, as deployed (``customop.export``): (class
    probabilities, embedding) of each face.  ``ops.softmax_ce``'s label only shapes its
    gradient: the exported graph does not take it."""

    def __init__(self, head, **kwargs):
        super().__init__(**kwargs)
        self.head = head

    def hybrid_forward(self, F, descriptor, identity):
        embedding = self.head.embed(descriptor)
        return ops.softmax_ce(self.head.classify(embedding), identity), embedding


def make_block():
    """A fresh head (a fixed prefix: every copy has the same parameter names)."""
    return FaceHead(prefix="face_")


def loss_of(outputs, identity):
    """The summed cross-entropy plus the summed center loss, from one step's outputs."""
    probs, centers = outputs[0], outputs[1]
    picked = probs[np.arange(len(identity)), identity.astype(int)]
    return -np.log(picked.astype(np.float64)).sum() + centers.astype(np.float64).sum()


def make_batches(steps=4, seed=3):
    """Two batches of descriptors scattered around one prototype per identity, alternating
    for ``steps`` steps (so each one's loss can be seen to fall)."""
    rng = np.random.RandomState(seed)
    prototypes = rng.randn(NUM_ID, DESCRIPTOR) * 2
    batches = []
    for _ in range(2):
        identity = rng.randint(0, NUM_ID, BATCH)
        descriptor = prototypes[identity] + rng.randn(BATCH, DESCRIPTOR)
        batches.append((descriptor.astype(np.float32), identity.astype(np.float32)))
    return [batches[i % 2] for i in range(steps)]


def train_every_path(steps=4, lr=0.01):
    """``{path: [loss of each step]}`` for the four paths of :mod:`four_paths`."""
    return four_paths.train_every_path(
        make_block,
        make_batches(steps),
        lr,
        INPUTS,
        loss_of=lambda outs, batch: loss_of(outs, batch[1]),
    )


def main():
    four_paths.print_losses(train_every_path())


if __name__ == "__main__":
    main()
