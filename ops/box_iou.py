"""``ops.box_iou``: ``mx.nd.contrib.box_iou`` plus ``legacy_box`` (+1 widths)."""

from __future__ import annotations

import mxnet as mx
import numpy as np

from customop import customop

from . import _checks
from ._boxes import to_corner


def _check_shapes(lhs, rhs, format, legacy_box):
    _checks.boxes("box_iou", "lhs", lhs)
    _checks.boxes("box_iou", "rhs", rhs)
    _checks.box_format("box_iou", "format", format)
    _checks.boolean("box_iou", "legacy_box", legacy_box)


def _check_dtypes(lhs, rhs):
    _checks.floating("box_iou", "lhs", lhs)
    _checks.floating("box_iou", "rhs", rhs)


def _check(lhs, rhs, format, legacy_box):
    _check_shapes(lhs.shape, rhs.shape, format, legacy_box)
    _check_dtypes(lhs.dtype, rhs.dtype)


# Symbols, Module and hybridized blocks ask for the output shape at every new signature (a
# new box count): answered from the shapes, with the forward's own checks, instead of by a
# forward on placeholder inputs (measured: 0.66 -> 0.06 ms a new signature; the RetinaNet-style
# head's simple_bind at a new box count 6.1-6.6 -> 4.7-4.8 ms, benchmarks/bind_cost.py)
def _infer_shape(lhs, rhs, *, format="corner", legacy_box=False):
    _check_shapes(lhs, rhs, format, legacy_box)
    return tuple(lhs[:-1]) + tuple(rhs[:-1])


def _infer_type(lhs, rhs, **_):
    # (bfloat16 arrives as a structured NumPy dtype: a float, computed on as float32)
    _check_dtypes(*(np.float32 if np.dtype(d).kind == "V" else d for d in (lhs, rhs)))
    return lhs


@customop(
    "mxnet",
    name="ops.box_iou",
    auto_grad=False,
    infer_shape=_infer_shape,
    infer_type=_infer_type,
)
def box_iou(lhs, rhs, *, format="corner", legacy_box=False):
    r"""Intersection over union of every box in ``lhs`` with every box in ``rhs``.

    .. math::

        \mathrm{IoU}(a, b) = \frac{|a \cap b|}{|a| + |b| - |a \cap b|},\qquad
        |a| = w_a h_a,\quad w = x_2 - x_1 + \delta,\ h = y_2 - y_1 + \delta

    with :math:`\delta = 1` when ``legacy_box`` (Caffe/Detectron pixel counting) and
    0 otherwise; the intersection's sides are ``min(x2) - max(x1) + δ``. As in
    MXNet, a box with a negative side has area 0 and a non-positive intersection
    gives IoU 0. With ``legacy_box=False`` this is ``mx.nd.contrib.box_iou``.
    A ``'center'`` box ``[x, y, w, h]`` states its size, so ``legacy_box`` does not
    change its IoU (its corners are ``x ± w/2`` minus δ on the far side).
    Not differentiable: zero gradient, like MXNet's ``box_iou``.

    ``ops.box_iou`` is the ``'mxnet'``-mode op (``contrib.box_iou`` on boxes whose
    far corners are shifted by δ: exact for integer coordinates);
    ``ops.box_iou.numpy`` is the ``'numpy'`` twin.

    Parameters
    ----------
    format : {'corner', 'center'}, default 'corner'
        ``[x1, y1, x2, y2]`` or ``[x, y, w, h]``.
    legacy_box : bool, default False
        Widths and heights are ``x2 - x1 + 1``, ``y2 - y1 + 1``.

    Notes
    -----
    Shapes: ``lhs`` (..., 4), ``rhs`` (..., 4), float (integer boxes: ``TypeError``); output
    ``lhs.shape[:-1] + rhs.shape[:-1]``.

    Example:
        >>> import mxnet as mx
        >>> from customop import ops
        >>> a, b = mx.nd.array([[0, 0, 9, 9]]), mx.nd.array([[5, 5, 14, 14]])
        >>> legacy, plain = ops.box_iou(a, b, legacy_box=True), ops.box_iou(a, b)
        >>> [round(float(x.asnumpy()[0, 0]) * n, 3) for x, n in ((legacy, 175), (plain, 146))]
        [25.0, 16.0]
    """
    _check(lhs, rhs, format, legacy_box)
    if legacy_box and format == "corner":
        shift = mx.nd.array([0, 0, 1, 1], ctx=lhs.context, dtype=lhs.dtype)
        lhs, rhs = mx.nd.broadcast_add(lhs, shift), mx.nd.broadcast_add(rhs, shift)
    return mx.nd.contrib.box_iou(lhs, rhs, format=format)


@box_iou.twin("numpy")
def _box_iou_numpy(lhs, rhs, *, format="corner", legacy_box=False):
    _check(lhs, rhs, format, legacy_box)
    one = 1 if legacy_box else 0
    a, b = lhs.reshape(-1, 1, 4), rhs.reshape(1, -1, 4)
    if format == "center":
        a = np.stack(to_corner(*np.moveaxis(a, -1, 0), one), axis=-1)
        b = np.stack(to_corner(*np.moveaxis(b, -1, 0), one), axis=-1)
    iw = np.maximum(np.minimum(a[..., 2], b[..., 2]) - np.maximum(a[..., 0], b[..., 0]) + one, 0)
    ih = np.maximum(np.minimum(a[..., 3], b[..., 3]) - np.maximum(a[..., 1], b[..., 1]) + one, 0)
    inter = iw * ih

    def area(box):
        w, h = box[..., 2] - box[..., 0] + one, box[..., 3] - box[..., 1] + one
        return np.where((w < 0) | (h < 0), 0, w * h)

    with np.errstate(divide="ignore", invalid="ignore"):
        iou = np.where(inter > 0, inter / (area(a) + area(b) - inter), 0)
    return iou.astype(lhs.dtype).reshape(lhs.shape[:-1] + rhs.shape[:-1])
