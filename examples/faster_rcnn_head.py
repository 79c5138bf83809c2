"""A Faster R-CNN-style second stage: a NumPy sampler op of your own beside the library's ops.

The region proposals of the first stage arrive with one pooled feature vector each.  A
small dense head predicts, per proposal, class logits and box offsets.  Training it needs
a fixed number of proposals per image, a quarter of them foreground: the sampler below
is a user's ``@customop('numpy')`` op that matches proposals to ground-truth boxes
(``ops.box_iou.numpy`` and ``ops.box_encode.numpy``, called on NumPy arrays inside it),
draws foreground and background proposals with NumPy's random generator and returns
their indices, labels, box targets and box weights: several outputs, no gradient.
Online hard example mining (``ops.ohem_sampler``) then keeps the positives and the
hardest negatives; the losses are ``ops.softmax_ce`` and ``ops.smooth_l1``.

What it shows: a user's sampler with several outputs and random draws, in one graph with
three library ops, trains the same on every path when NumPy's generator is seeded the
same (shape inference does not draw from it).  ``main()`` takes 4 SGD steps imperatively,
hybridized, through ``Module`` and exported-then-reloaded with ``customop.imports``, and
prints the loss of each step on each path::

    python examples/faster_rcnn_head.py
"""

from __future__ import annotations

import os
import sys

import mxnet as mx
import numpy as np

from customop import customop, ops

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import four_paths  # noqa: E402

NUM_CLASS, FEATURE, HIDDEN = 3, 10, 16  # foreground classes; class 0 is background
BATCH, PROPOSALS, NUM_GT, NUM_SAMPLE = 2, 24, 3, 8
MEANS, STDS = np.zeros(4, np.float32), np.array([0.1, 0.1, 0.2, 0.2], np.float32)
SEED = 7
INPUTS = ["roi_feat", "proposals", "gt_boxes", "gt_labels"]


@customop("numpy", no_grad=("proposals", "gt_boxes", "gt_labels"))
def sample_proposals(
    proposals, gt_boxes, gt_labels, num_sample=NUM_SAMPLE, fg_fraction=0.25, fg_iou=0.5
):
    """Draw ``num_sample`` proposals per image: up to ``fg_fraction`` of them foreground
    (IoU >= ``fg_iou`` with a ground-truth box), the rest background, at random.

    Shapes: ``proposals`` (B, P, 4), ``gt_boxes`` (B, M, 4) corner boxes, ``gt_labels``
    (B, M) classes 1..K.  Returns, for the B * num_sample drawn proposals, their flat
    indices into (B * P), labels (0: background), box targets (B * num_sample, 4) and box
    weights (1 on the foreground's 4 coordinates).
    """
    picks, labels, targets, weights = [], [], [], []
    for b in range(len(proposals)):
        iou = ops.box_iou.numpy(proposals[b], gt_boxes[b])  # (P, M)
        best, match = iou.max(axis=1), iou.argmax(axis=1)
        fg, bg = np.flatnonzero(best >= fg_iou), np.flatnonzero(best < fg_iou)
        fg = np.random.choice(fg, min(len(fg), int(fg_fraction * num_sample)), replace=False)
        bg = np.random.choice(bg, num_sample - len(fg), replace=len(bg) < num_sample - len(fg))
        keep = np.concatenate([fg, bg])
        is_fg = np.arange(num_sample) < len(fg)
        target, weight = ops.box_encode.numpy(
            np.where(is_fg, 1.0, -1.0)[None],
            match[keep][None].astype(np.float64),
            proposals[b][keep][None],
            gt_boxes[b][None],
            MEANS,
            STDS,
        )
        picks.append(keep + b * proposals.shape[1])
        labels.append(np.where(is_fg, gt_labels[b][match[keep]], 0))
        targets.append(target[0])
        weights.append(weight[0])
    return (
        np.concatenate(picks).astype(proposals.dtype),
        np.concatenate(labels).astype(proposals.dtype),
        np.concatenate(targets).astype(proposals.dtype),
        np.concatenate(weights).astype(proposals.dtype),
    )


class RCNNHead(mx.gluon.HybridBlock):
    """Returns (class probabilities of the drawn proposals, box loss, their labels, their
    OHEM weights): every output can take ``backward``."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.hidden = mx.gluon.nn.Dense(
                HIDDEN, activation="relu", flatten=False, in_units=FEATURE
            )
            self.cls = mx.gluon.nn.Dense(NUM_CLASS + 1, flatten=False, in_units=HIDDEN)
            self.box = mx.gluon.nn.Dense(4, flatten=False, in_units=HIDDEN)

    def hybrid_forward(self, F, roi_feat, proposals, gt_boxes, gt_labels):
        hidden = self.hidden(roi_feat)  # (B, P, HIDDEN)
        index, label, box_target, box_weight = sample_proposals(proposals, gt_boxes, gt_labels)
        cls_pred = F.take(F.reshape(self.cls(hidden), (-1, NUM_CLASS + 1)), index)
        box_pred = F.take(F.reshape(self.box(hidden), (-1, 4)), index)  # (B * NUM_SAMPLE, .)

        # OHEM: every positive and the 2 hardest negatives per positive (at least 1)
        per_image = F.reshape(label, (-1, NUM_SAMPLE))
        keep = ops.ohem_sampler(
            F.reshape(cls_pred, (-1, NUM_SAMPLE, NUM_CLASS + 1)),
            per_image,
            F.ones_like(per_image),
            ratio=2.0,
            min_neg=1,
        )
        keep = F.reshape(keep, (-1, 1))
        # softmax_ce is an output layer (its backward ignores the head gradient), so the
        # OHEM weight goes on the gradient reaching its input: the value stays cls_pred
        weighted = F.broadcast_mul(cls_pred, keep) + F.BlockGrad(
            F.broadcast_mul(cls_pred, 1 - keep)
        )
        probs = ops.softmax_ce(weighted, label)
        box_loss = F.sum(ops.smooth_l1(box_pred - box_target, F.ones((1,)), box_weight))
        return probs, F.make_loss(box_loss), F.BlockGrad(label), F.BlockGrad(keep)


class RCNNDetect(mx.gluon.HybridBlock):
    """The trained head at inference, as deployed (``customop.export``): per image, the
    proposals refined by the predicted offsets and kept by non-maximum suppression,
    ``[class, probability, x1, y1, x2, y2]`` (-1 rows for the others)."""

    def __init__(self, head, **kwargs):
        super().__init__(**kwargs)
        self.head = head

    def hybrid_forward(self, F, roi_feat, proposals):
        hidden = self.head.hidden(roi_feat)  # (B, P, HIDDEN)
        probs = F.softmax(self.head.cls(hidden), axis=-1)
        foreground = F.slice_axis(probs, axis=-1, begin=1, end=None)
        boxes = ops.box_decode(
            self.head.box(hidden),
            proposals,
            std0=0.1,
            std1=0.1,
            std2=0.2,
            std3=0.2,
            format="corner",
        )
        # the best class and its probability (topk, not max/pick: those do not convert to ONNX)
        probability, best = F.topk(foreground, axis=-1, k=1, ret_typ="both")
        dets = F.concat(best + 1, probability, boxes, dim=-1)
        return ops.box_nms(dets, overlap_thresh=0.5, valid_thresh=0.05, force_suppress=True)


def make_block():
    """A fresh head (a fixed prefix: every copy has the same parameter names)."""
    return RCNNHead(prefix="rcnn_")


def loss_of(outputs):
    """The OHEM-weighted summed cross-entropy plus the box loss, from one step's outputs."""
    probs, box_loss, label, keep = (o.astype(np.float64) for o in outputs)
    picked = probs[np.arange(len(label)), label.astype(int)]
    return -(keep[:, 0] * np.log(picked)).sum() + box_loss.sum()


def make_batches(steps=4, seed=5):
    """Two batches of (pooled features, proposals, ground-truth boxes, classes), alternating
    for ``steps`` steps: the proposals are the ground-truth boxes jittered."""
    rng = np.random.RandomState(seed)
    batches = []
    for _ in range(2):
        corner = rng.uniform(0, 40, (BATCH, NUM_GT, 2))
        gt = np.concatenate([corner, corner + rng.uniform(8, 20, (BATCH, NUM_GT, 2))], axis=2)
        labels = rng.randint(1, NUM_CLASS + 1, (BATCH, NUM_GT))
        owner = rng.randint(0, NUM_GT, (BATCH, PROPOSALS))
        jitter = rng.normal(0, 1, (BATCH, PROPOSALS, 4)) * np.array([3, 3, 3, 3])
        proposals = np.take_along_axis(gt, owner[..., None], axis=1) + jitter
        proposals[:, ::2] += rng.uniform(5, 15, (BATCH, PROPOSALS // 2, 4))  # half drift off
        owner_label = np.take_along_axis(labels, owner, axis=1)
        feat = rng.randn(BATCH, PROPOSALS, FEATURE) + owner_label[..., None]  # learnable
        batches.append(tuple(a.astype(np.float32) for a in (feat, proposals, gt, labels)))
    return [batches[i % 2] for i in range(steps)]


def train_every_path(steps=4, lr=0.01):
    """``{path: [loss of each step]}``; NumPy's generator is seeded before each path."""
    return four_paths.train_every_path(
        make_block,
        make_batches(steps),
        lr,
        INPUTS,
        loss_of=lambda outs, batch: loss_of(outs),
        before_path=lambda: np.random.seed(SEED),
    )


def main():
    four_paths.print_losses(train_every_path())


if __name__ == "__main__":
    main()
