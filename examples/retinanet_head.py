"""A RetinaNet-style detection head: four of the library's operators in one hybridized graph.

Per anchor of a tiny feature map, a 3x3 convolution predicts class logits and another
predicts box offsets.  The training targets are computed inside the same graph: each
anchor is matched to the ground-truth box it overlaps most (``ops.box_iou``; IoU >= 0.5
positive, < 0.4 background, in between ignored) and the matched box is encoded as
offsets (``ops.box_encode``).  The loss is ``ops.focal_loss`` on the logits plus
``ops.smooth_l1`` on the offsets of the positive anchors, divided by their number.

What it shows: several custom operators, in any order, in one graph, train the same on
every path MXNet has.  ``main()`` takes 4 SGD steps imperatively, hybridized, through
``Module`` (the Symbol the block builds) and exported-then-reloaded with
``customop.imports``, and prints the loss of each step on each path (they agree to
float32 rounding)::

    python examples/retinanet_head.py
"""

from __future__ import annotations

import os
import sys

import mxnet as mx
import numpy as np

from customop import ops

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import four_paths  # noqa: E402

NUM_CLASS, SIZES, STRIDE = 3, (3.0, 4.5, 6.0), 2.0  # SIZES: the anchors of one location
NUM_SIZE = len(SIZES)
BATCH, CHANNELS, HEIGHT, WIDTH, NUM_GT = 2, 8, 4, 4, 2
INPUTS = ["feat", "gt_boxes", "gt_labels"]


def make_anchors(height=HEIGHT, width=WIDTH, sizes=SIZES, stride=STRIDE):
    """Square corner anchors ``(height * width * len(sizes), 4)``, in (row, column, size) order."""
    rows, cols, size = np.meshgrid(np.arange(height), np.arange(width), sizes, indexing="ij")
    cx, cy = (cols.ravel() + 0.5) * stride, (rows.ravel() + 0.5) * stride
    half = size.ravel() / 2
    return np.stack([cx - half, cy - half, cx + half, cy + half], axis=1).astype(np.float32)


class RetinaHead(mx.gluon.HybridBlock):
    """Class logits and box offsets per anchor; returns the training loss (one value)."""

    def __init__(
        self, anchors, channels=CHANNELS, num_class=NUM_CLASS, num_size=NUM_SIZE, **kwargs
    ):
        super().__init__(**kwargs)
        self.num_class = num_class
        with self.name_scope():
            self.cls = mx.gluon.nn.Conv2D(num_size * num_class, 3, padding=1, in_channels=channels)
            self.box = mx.gluon.nn.Conv2D(num_size * 4, 3, padding=1, in_channels=channels)
            self.anchors = self.params.get_constant("anchors", anchors)
            self.means = self.params.get_constant("means", [0.0, 0.0, 0.0, 0.0])
            self.stds = self.params.get_constant("stds", [0.1, 0.1, 0.2, 0.2])

    def hybrid_forward(self, F, feat, gt_boxes, gt_labels, anchors, means, stds):
        # (B, sizes * k, H, W) -> (B, H * W * sizes, k): one row per anchor
        cls_pred = F.reshape(F.transpose(self.cls(feat), (0, 2, 3, 1)), (0, -1, self.num_class))
        box_pred = F.reshape(F.transpose(self.box(feat), (0, 2, 3, 1)), (0, -1, 4))

        # targets: match each anchor to the ground-truth box it overlaps most
        iou = F.transpose(ops.box_iou(anchors, gt_boxes), (1, 0, 2))  # (B, anchors, gt)
        best, match = F.max(iou, axis=2), F.argmax(iou, axis=2)
        samples = (best >= 0.5) - (best < 0.4)  # +1 positive, -1 background, 0 ignored
        label = F.pick(F.broadcast_like(F.expand_dims(gt_labels, 1), iou), match, axis=2)
        cls_target = F.where(samples > 0, label, -1 - samples)  # background 0, ignored -1
        anchors = F.broadcast_like(F.expand_dims(anchors, 0), box_pred, lhs_axes=0, rhs_axes=0)
        box_target, box_mask = ops.box_encode(samples, match, anchors, gt_boxes, means, stds)

        # losses: focal loss (normalized by the positives itself) + smooth L1 on positives
        cls_loss = F.sum(ops.focal_loss(cls_pred, cls_target))
        box_loss = F.sum(ops.smooth_l1(box_pred - box_target, self.sigma(F, stds), box_mask))
        return F.make_loss(cls_loss + F.broadcast_div(box_loss, F.maximum(F.sum(samples > 0), 1)))

    def sigma(self, F, stds):
        """smooth-L1's ``sigma`` (shape ``(1,)``), a constant of the graph (``amp_training.py``
        makes it another way: ``F.full`` fails under AMP in symbol mode)."""
        return F.full((1,), 3.0)


class RetinaDetect(mx.gluon.HybridBlock):
    """The trained head at inference, as deployed (``customop.export``): per image, the
    boxes kept by non-maximum suppression ``[class, score, x1, y1, x2, y2]`` (-1 rows for
    the others) and the indices of the ``k`` best scores."""

    def __init__(self, head, k=5, **kwargs):
        super().__init__(**kwargs)
        self.head, self.k = head, k
        with self.name_scope():
            self.anchors = self.params.get_constant("anchors", head.anchors.data().expand_dims(0))

    def hybrid_forward(self, F, feat, anchors):
        head = self.head
        cls_pred = F.reshape(F.transpose(head.cls(feat), (0, 2, 3, 1)), (0, -1, head.num_class))
        box_pred = F.reshape(F.transpose(head.box(feat), (0, 2, 3, 1)), (0, -1, 4))
        scores = F.sigmoid(cls_pred)
        boxes = ops.box_decode(
            box_pred, anchors, std0=0.1, std1=0.1, std2=0.2, std3=0.2, format="corner"
        )
        # the best class and its score (topk, not max/pick: those do not convert to ONNX)
        score, best = F.topk(scores, axis=2, k=1, ret_typ="both")
        dets = F.concat(best + 1, score, boxes, dim=2)
        kept = ops.box_nms(dets, overlap_thresh=0.5, valid_thresh=0.05, force_suppress=True)
        return kept, ops.topk(
            F.reshape(F.slice_axis(kept, axis=2, begin=1, end=2), (0, -1)), k=self.k
        )


def make_block():
    """A fresh head over this example's anchors (a fixed prefix: every copy has the same names)."""
    return RetinaHead(make_anchors(), prefix="retina_")


def make_batches(steps=4, seed=1):
    """Two batches of (features, ground-truth boxes, their classes 1..NUM_CLASS), alternating
    for ``steps`` steps (so each one's loss can be seen to fall)."""
    rng = np.random.RandomState(seed)
    batches = []
    for _ in range(2):
        feat = rng.randn(BATCH, CHANNELS, HEIGHT, WIDTH).astype(np.float32)
        corner = rng.uniform(0, HEIGHT * STRIDE - 4, (BATCH, NUM_GT, 2))
        size = rng.uniform(2.5, 5, (BATCH, NUM_GT, 2))
        boxes = np.concatenate([corner, corner + size], axis=2).astype(np.float32)
        labels = rng.randint(1, NUM_CLASS + 1, (BATCH, NUM_GT)).astype(np.float32)
        batches.append((feat, boxes, labels))
    return [batches[i % 2] for i in range(steps)]


def train_every_path(steps=4, lr=0.03):
    """``{path: [loss of each step]}`` for the four paths of :mod:`four_paths`."""
    return four_paths.train_every_path(
        make_block, make_batches(steps), lr, INPUTS, loss_of=lambda outs, batch: outs[0].item()
    )


def main():
    four_paths.print_losses(train_every_path())


if __name__ == "__main__":
    main()
