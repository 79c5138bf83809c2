"""A sampler with four named outputs and no gradient, hand-written and ported: R-CNN's
proposal-target layer (Girshick, Fast R-CNN, 2015), simplified to one image.

Proposals ``rois`` ``(N, 4)`` (corners ``x1, y1, x2, y2``) and the ground truth
``gt_boxes`` ``(M, 5)`` (corners and a class in ``1..num_classes-1``) give ``batch_rois``
sampled proposals: up to ``fg_fraction`` of them foreground (IoU with their best ground
truth box ``>= fg_overlap``, drawn with NumPy's global RNG), the rest background. Outputs:
``rois_output`` ``(batch_rois, 4)``, ``label`` ``(batch_rois,)`` (0 for background),
``bbox_target`` and ``bbox_weight`` ``(batch_rois, 4 num_classes)``, the box regression
targets in the label's four columns (weights 1 there, 0 elsewhere).
"""

import mxnet as mx
import numpy as np

from customop import customop


def _iou(boxes, gt):
    """IoU of every box with every ground-truth box (corners, +1 pixel convention)."""
    x1 = np.maximum(boxes[:, None, 0], gt[None, :, 0])
    y1 = np.maximum(boxes[:, None, 1], gt[None, :, 1])
    x2 = np.minimum(boxes[:, None, 2], gt[None, :, 2])
    y2 = np.minimum(boxes[:, None, 3], gt[None, :, 3])
    inter = np.clip(x2 - x1 + 1, 0, None) * np.clip(y2 - y1 + 1, 0, None)

    def area(b):
        return (b[:, 2] - b[:, 0] + 1) * (b[:, 3] - b[:, 1] + 1)

    return inter / (area(boxes)[:, None] + area(gt)[None, :] - inter)


def _encode(boxes, gt):
    """The regression target that moves each box onto its ground-truth box."""
    w, h = boxes[:, 2] - boxes[:, 0] + 1, boxes[:, 3] - boxes[:, 1] + 1
    gw, gh = gt[:, 2] - gt[:, 0] + 1, gt[:, 3] - gt[:, 1] + 1
    return np.stack(
        [
            (gt[:, 0] + 0.5 * gw - boxes[:, 0] - 0.5 * w) / w,
            (gt[:, 1] + 0.5 * gh - boxes[:, 1] - 0.5 * h) / h,
            np.log(gw / w),
            np.log(gh / h),
        ],
        axis=1,
    )


def sample_rois(rois, gt_boxes, num_classes, batch_rois, fg_fraction, fg_overlap):
    """The sampling itself, in NumPy: the part a port keeps as it is."""
    all_rois = np.vstack([rois, gt_boxes[:, :4]])  # the ground truth is a proposal too
    overlaps = _iou(all_rois, gt_boxes[:, :4])
    best, max_overlap = overlaps.argmax(axis=1), overlaps.max(axis=1)
    fg = np.where(max_overlap >= fg_overlap)[0]
    fg_count = min(int(round(fg_fraction * batch_rois)), fg.size)
    if fg.size > fg_count:
        fg = np.random.choice(fg, size=fg_count, replace=False)
    bg = np.where(max_overlap < fg_overlap)[0]
    bg_count = batch_rois - fg_count
    bg = np.random.choice(bg, size=bg_count, replace=bg.size < bg_count)
    keep = np.concatenate([fg, bg])
    label = gt_boxes[best[keep], 4].copy()
    label[fg_count:] = 0
    targets = np.zeros((batch_rois, 4 * num_classes), np.float32)
    weights = np.zeros_like(targets)
    encoded = _encode(all_rois[keep[:fg_count]], gt_boxes[best[keep[:fg_count]], :4])
    for i, cls in enumerate(label[:fg_count].astype(np.int64)):
        targets[i, 4 * cls : 4 * cls + 4] = encoded[i]
        weights[i, 4 * cls : 4 * cls + 4] = 1
    return all_rois[keep].astype(np.float32), label.astype(np.float32), targets, weights


# original-begin
class ProposalTarget(mx.operator.CustomOp):
    def __init__(self, num_classes, batch_rois, fg_fraction, fg_overlap):
        super().__init__()
        self.num_classes, self.batch_rois = num_classes, batch_rois
        self.fg_fraction, self.fg_overlap = fg_fraction, fg_overlap

    def forward(self, is_train, req, in_data, out_data, aux):
        outputs = sample_rois(
            in_data[0].asnumpy(),
            in_data[1].asnumpy(),
            self.num_classes,
            self.batch_rois,
            self.fg_fraction,
            self.fg_overlap,
        )
        for i, value in enumerate(outputs):
            self.assign(out_data[i], req[i], mx.nd.array(value))

    def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
        for i in range(len(in_grad)):
            self.assign(in_grad[i], req[i], 0)


@mx.operator.register("porting_proposal_target")
class ProposalTargetProp(mx.operator.CustomOpProp):
    def __init__(self, num_classes, batch_rois=8, fg_fraction=0.25, fg_overlap=0.5):
        super().__init__(need_top_grad=False)
        self.num_classes, self.batch_rois = int(num_classes), int(batch_rois)
        self.fg_fraction, self.fg_overlap = float(fg_fraction), float(fg_overlap)

    def list_arguments(self):
        return ["rois", "gt_boxes"]

    def list_outputs(self):
        return ["rois_output", "label", "bbox_target", "bbox_weight"]

    def infer_shape(self, in_shape):
        n, c = self.batch_rois, 4 * self.num_classes
        return in_shape, [(n, 4), (n,), (n, c), (n, c)], []

    def declare_backward_dependency(self, out_grad, in_data, out_data):
        return []

    def create_operator(self, ctx, shapes, dtypes):
        return ProposalTarget(self.num_classes, self.batch_rois, self.fg_fraction, self.fg_overlap)


# original-end


# port-begin
def _shapes(rois, gt_boxes, *, num_classes, batch_rois=8, **_):
    return [
        (batch_rois, 4),
        (batch_rois,),
        (batch_rois, 4 * num_classes),
        (batch_rois, 4 * num_classes),
    ]


@customop(
    "numpy",
    outputs=("rois_output", "label", "bbox_target", "bbox_weight"),
    infer_shape=_shapes,
    need_top_grad=False,
    auto_grad=False,
)
def proposal_target(rois, gt_boxes, *, num_classes, batch_rois=8, fg_fraction=0.25, fg_overlap=0.5):
    """Sampled proposals, their labels, regression targets and weights (no gradient)."""
    return sample_rois(rois, gt_boxes, num_classes, batch_rois, fg_fraction, fg_overlap)


# port-end
