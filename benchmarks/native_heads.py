"""The Faster R-CNN-style and face-embedding example heads in MXNet's own operators.

``benchmarks/composed.py``'s ``NativeRetinaHead`` is the RetinaNet-style head written
without our ops; these are the other two example heads the same way, for
``benchmarks/op_counts.py`` (and checked equal to ours, outputs and gradients, in
``tests/test_examples.py``):

* ``NativeRCNNHead`` (``examples/faster_rcnn_head.py``): ``ops.softmax_ce`` becomes
  ``SoftmaxOutput``, ``ops.smooth_l1`` (sigma 1) ``smooth_l1(scalar=1)``, and
  ``ops.ohem_sampler`` its own body written in ``F``'s operators (``native_ohem``).  The
  example's proposal sampler is the user's own NumPy op in both heads: MXNet has no
  operator for it, and a user would write it as a ``Custom`` operator anyway.
* ``NativeFaceHead`` (``examples/face_embedding.py``): ``ops.softmax_ce`` becomes
  ``SoftmaxOutput``, and ``ops.CenterLoss`` its loss in MXNet's operators
  (``NativeCenterLoss``): the same loss and gradient.  MXNet's operators cannot move an
  auxiliary state in a backward pass, so the native centers stay where they are (a user
  would update them outside the graph); ours move.  The counts compare the graphs, which
  is what the update does not change.

Example:
    >>> import mxnet as mx
    >>> head = NativeFaceHead(prefix="face_")
    >>> head.initialize()
    >>> probs, centers, embedding = head(mx.nd.ones((8, 12)), mx.nd.zeros(8))
    >>> probs.shape, centers.shape, embedding.shape
    ((8, 4), (8,), (8, 3))
"""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))

import face_embedding as FE  # noqa: E402
import faster_rcnn_head as FR  # noqa: E402

from customop import ops  # noqa: E402


def native_ohem(F, conf_data, conf_target, conf_weight, ratio, min_neg, ignore_label=-1):
    """``ops.ohem_sampler(..., from_logits=True)``, line for line in ``F``'s operators (no
    gradient: wrap it in ``BlockGrad``, as ours gives zeros)."""
    f64 = "float64"
    weight = conf_weight
    conf_weight = F.reshape_like(conf_weight, conf_target)
    conf_data = F.log_softmax(conf_data, axis=-1)
    loss = -F.cast(F.reshape(F.slice_axis(conf_data, axis=2, begin=0, end=1), shape=(0, 0)), f64)
    usable = (conf_weight > 0) * (conf_target != ignore_label)
    pos = F.cast(usable * (conf_target > 0), f64)
    neg = F.cast(usable * (conf_target == 0), f64)
    wanted = F.maximum(F.floor(F.sum(pos, axis=1) * ratio), float(min_neg))
    num_neg = F.reshape(F.minimum(wanted, F.sum(neg, axis=1)), shape=(-1, 1))
    key = F.where(neg, loss, F.log(F.zeros_like(loss)))
    ranked = F.sort(key, axis=1, is_ascend=False)
    cut = F.pick(ranked, F.reshape(F.maximum(num_neg - 1, 0), shape=(-1,)), axis=1, keepdims=True)
    above = neg * F.broadcast_greater(key, cut)
    at_cut = neg * F.broadcast_equal(key, cut)
    room = num_neg - F.sum(above, axis=1, keepdims=True)
    kept_ties = at_cut * F.broadcast_lesser_equal(F.cumsum(at_cut, axis=1), room)
    return F.reshape_like(F.cast(pos + above + kept_ties, "float32"), weight)


class NativeRCNNHead(FR.RCNNHead):
    """``RCNNHead`` with MXNet's operators in place of our three ops, line for line."""

    def hybrid_forward(self, F, roi_feat, proposals, gt_boxes, gt_labels):
        hidden = self.hidden(roi_feat)
        index, label, box_target, box_weight = FR.sample_proposals(proposals, gt_boxes, gt_labels)
        cls_pred = F.take(F.reshape(self.cls(hidden), (-1, FR.NUM_CLASS + 1)), index)
        box_pred = F.take(F.reshape(self.box(hidden), (-1, 4)), index)

        per_image = F.reshape(label, (-1, FR.NUM_SAMPLE))
        keep = native_ohem(
            F,
            F.reshape(cls_pred, (-1, FR.NUM_SAMPLE, FR.NUM_CLASS + 1)),
            per_image,
            F.ones_like(per_image),
            ratio=2.0,
            min_neg=1,
        )
        keep = F.BlockGrad(F.reshape(keep, (-1, 1)))
        weighted = F.broadcast_mul(cls_pred, keep) + F.BlockGrad(
            F.broadcast_mul(cls_pred, 1 - keep)
        )
        probs = F.SoftmaxOutput(weighted, label)
        box_loss = F.sum(F.smooth_l1(box_pred - box_target, scalar=1.0) * box_weight)
        return probs, F.make_loss(box_loss), F.BlockGrad(label), F.BlockGrad(keep)


class NativeCenterLoss(ops.CenterLoss):
    """``ops.CenterLoss``'s loss and gradient in MXNet's operators; its centers do not move."""

    def hybrid_forward(self, F, pred, label, centers):
        diff = pred - F.take(centers, label, axis=0)
        return 0.5 * self._op_params["scale"] * F.sum(diff * diff, axis=1)


class NativeFaceHead(FE.FaceHead):
    """``FaceHead`` with ``SoftmaxOutput`` and ``NativeCenterLoss`` (the same parameter names)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        ours = self.center_loss
        self.center_loss = NativeCenterLoss(
            num_class=FE.NUM_ID,
            feature_dim=FE.EMBEDDING,
            scale=ours._op_params["scale"],
            alpha=ours._op_params["alpha"],
            prefix=ours.prefix,
        )

    def hybrid_forward(self, F, descriptor, identity):
        embedding = self.embed(descriptor)
        probs = F.SoftmaxOutput(self.classify(embedding), identity)
        centers = self.center_loss(embedding, identity)
        return probs, F.make_loss(centers), F.BlockGrad(embedding)


def make_rcnn_head():
    """A fresh ``NativeRCNNHead`` (the example's prefix: its parameter names)."""
    return NativeRCNNHead(prefix="rcnn_")


def make_face_head():
    """A fresh ``NativeFaceHead`` (the example's prefix: its parameter names)."""
    return NativeFaceHead(prefix="face_")
