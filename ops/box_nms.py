"""``ops.box_nms``: ``mx.nd.contrib.box_nms`` plus ``legacy_box`` (+1 widths)."""

from __future__ import annotations

import mxnet as mx
import numpy as np

from customop import customop

from . import _checks, _rows
from ._boxes import to_center, to_corner

# box_nms's parameters, by how they are checked
_KINDS = (
    (_checks.number, ("overlap_thresh", "valid_thresh")),
    (_checks.integer, ("topk", "coord_start", "score_index", "id_index", "background_id")),
    (_checks.boolean, ("force_suppress",)),
    (_checks.box_format, ("in_format", "out_format")),
    (_checks.boolean, ("legacy_box",)),
)


def _check(data, **params):
    op = "box_nms"
    for check, names in _KINDS:
        for name in names:
            check(op, name, params[name])
    coord_start, score_index, id_index = (
        params[k] for k in ("coord_start", "score_index", "id_index")
    )
    shape = data.shape
    _checks.shape_is(op, "data", shape, len(shape) >= 2, "(..., N, K)")
    _checks.floating(op, "data", data.dtype)
    width = shape[-1]
    coords = set(range(coord_start, coord_start + 4))
    if not 0 <= coord_start <= width - 4:
        raise _checks.fail(
            op,
            "coord_start",
            f"must leave 4 coordinates inside the last axis "
            f"of data, of length {width}, got {coord_start}",
        )
    if not 0 <= score_index < width or score_index in coords:
        raise _checks.fail(
            op,
            "score_index",
            f"must be in [0, {width}) and not one of the "
            f"coordinates {sorted(coords)}, got {score_index}",
        )
    if id_index >= 0 and (id_index >= width or id_index in coords or id_index == score_index):
        raise _checks.fail(
            op,
            "id_index",
            f"must be -1 or in [0, {width}), apart from the "
            f"score and the coordinates, got {id_index}",
        )
    if width < 5 + (id_index > 0):
        raise _checks.fail(
            op,
            "data",
            f"needs at least {5 + (id_index > 0)} entries on its "
            f"last axis (score, 4 coordinates{', id' if id_index > 0 else ''}), "
            f"got {width}",
        )


def _convert(coords, in_format, out_format, one):
    if in_format == out_format:
        return coords
    return (to_center if out_format == "center" else to_corner)(*coords, one)


@customop("mxnet", name="ops.box_nms", auto_grad=False)
def box_nms(
    data,
    *,
    overlap_thresh=0.5,
    valid_thresh=0.0,
    topk=-1,
    coord_start=2,
    score_index=1,
    id_index=-1,
    background_id=-1,
    force_suppress=False,
    in_format="corner",
    out_format="corner",
    legacy_box=False,
):
    r"""Greedy non-maximum suppression per image, as ``mx.nd.contrib.box_nms``.

    Per image (all leading axes of ``data``): a box is valid iff
    ``score > valid_thresh`` and its class is not ``background_id``; the valid
    boxes are sorted by descending score (ties: lower index first) and the first
    ``topk`` (all for -1) enter NMS. Going down that list, a box is kept unless a
    kept box of the same class (any class with ``force_suppress`` or
    ``id_index=-1``) overlaps it with

    .. math::

        \mathrm{IoU}(a, b) > \mathrm{overlap\_thresh},\qquad
        w = x_2 - x_1 + \delta,\ h = y_2 - y_1 + \delta

    (:math:`\delta = 1` when ``legacy_box``, see :func:`ops.box_iou`). The output
    has ``data``'s shape: the kept rows in that order, then rows of -1.
    With ``legacy_box=False`` this is ``mx.nd.contrib.box_nms`` exactly, including
    its quirk that a kept row whose first coordinate is negative is not converted
    when ``out_format != in_format``. With ``legacy_box=True`` the kept rows are
    the input rows bit for bit (no +1 drift), converted with the legacy center
    ``x1 + w / 2`` when ``out_format != in_format`` (every kept row).

    Not differentiable: the gradient is zero (MXNet's ``box_nms`` copies the
    gradients of kept rows back instead; NMS is a selection, and a detector's
    loss does not flow through it).

    ``ops.box_nms`` is the ``'mxnet'``-mode op: for ``legacy_box`` it runs
    ``contrib.box_nms`` on a copy with the far corners shifted by 1 (for corner
    boxes, IoU with +1 sides is exactly IoU of the shifted boxes) and an index
    column appended, then gathers the kept input rows. ``ops.box_nms.numpy`` is
    the readable ``'numpy'`` twin.

    Parameters
    ----------
    overlap_thresh : finite float, default 0.5
        Suppress a box whose IoU with a kept box is above this.
    valid_thresh : finite float, default 0
        Boxes with ``score <= valid_thresh`` are dropped first.
    topk : int, default -1
        Apply NMS to the ``topk`` highest-scoring valid boxes only; -1: all; 0 returns
        ``data`` unchanged (as MXNet does).
    coord_start, score_index, id_index : int, default 2, 1, -1
        Columns of the 4 coordinates, the score and the class id (-1: no class).
    background_id : int, default -1
        Boxes of this class are dropped (-1: none).
    force_suppress : bool, default False
        Suppress across classes.
    in_format, out_format : {'corner', 'center'}, default 'corner'
    legacy_box : bool, default False
        Widths and heights are ``x2 - x1 + 1``, ``y2 - y1 + 1``.

    Notes
    -----
    Shapes: ``data`` (..., N, K) with K >= 5, float (integer: ``TypeError``); output the
    same shape.

    Example:
        >>> import mxnet as mx
        >>> from customop import ops
        >>> d = mx.nd.array([[0, 0.9, 0, 0, 9, 9], [0, 0.8, 5, 5, 14, 14]], dtype='float64')
        >>> ops.box_nms(d, overlap_thresh=0.12)[:, 1].asnumpy().tolist()   # IoU 16/146 = 0.110
        [0.9, 0.8]
        >>> ops.box_nms(d, overlap_thresh=0.12, legacy_box=True)[:, 1].asnumpy().tolist()
        [0.9, -1.0]
    """
    _check(**locals())  # the arguments, by name
    common = dict(
        overlap_thresh=overlap_thresh,
        valid_thresh=valid_thresh,
        topk=topk,
        coord_start=coord_start,
        score_index=score_index,
        id_index=id_index,
        background_id=background_id,
        force_suppress=force_suppress,
        in_format=in_format,
    )
    if not legacy_box:
        return mx.nd.contrib.box_nms(data, out_format=out_format, **common)
    if topk == 0:  # MXNet's box_nms returns its input as is
        return data.copy()
    # Shapes come from data through operators (reshape with 0/-1, slice_axis, arange_like,
    # broadcast_like, reshape_like), never as numbers: a graph of it serves any batch.
    ctx, width = data.context, data.shape[-1]
    rows = mx.nd.reshape(data, shape=(-1, 0, 0), reverse=True)  # (B, N, K)
    # float32 at least: the index column below rides through contrib.box_nms in work's dtype
    work = rows.astype("float32") if rows.dtype == np.float16 else rows
    if in_format == "corner":
        shift = np.zeros(width)
        shift[coord_start + 2 : coord_start + 4] = 1
        work = mx.nd.broadcast_add(work, mx.nd.array(shift, ctx=ctx, dtype=work.dtype))
    column = mx.nd.slice_axis(work, axis=2, begin=0, end=1)  # (B, N, 1)
    index = mx.nd.reshape(_rows.index_along(column, 1).astype(work.dtype), shape=(1, -1, 1))
    work = mx.nd.concat(work, mx.nd.broadcast_like(index, column), dim=-1)
    kept = mx.nd.slice_axis(
        mx.nd.contrib.box_nms(work, out_format=in_format, **common),
        axis=2,
        begin=width,
        end=width + 1,
    )  # (B, N, 1): input row or -1
    keep = kept >= 0
    images = mx.nd.reshape(column, shape=(0, 1, -1))  # (B, 1, N): a row per image
    flat = mx.nd.broadcast_add(
        mx.nd.where(keep, kept, mx.nd.zeros_like(kept)).astype("int64"), _rows.row_starts(images)
    )  # + b N, where image b starts
    out = mx.nd.take(
        mx.nd.reshape(rows, shape=(-1, 0), reverse=True), mx.nd.reshape(flat, shape=(-1,))
    )
    out = mx.nd.reshape_like(out, rows)
    if in_format != out_format:
        lo, hi = coord_start, coord_start + 4
        coords = _convert(
            mx.nd.split(mx.nd.slice_axis(out, axis=2, begin=lo, end=hi), 4, axis=-1),
            in_format,
            out_format,
            1,
        )
        parts = [mx.nd.slice_axis(out, axis=2, begin=0, end=lo)] if lo else []
        parts += list(coords)
        parts += [mx.nd.slice_axis(out, axis=2, begin=hi, end=width)] if hi < width else []
        out = mx.nd.concat(*parts, dim=-1)
    keep = mx.nd.broadcast_like(keep.astype(out.dtype), out)
    return mx.nd.reshape_like(mx.nd.where(keep, out, -mx.nd.ones_like(out)), data)


@box_nms.twin("numpy")
def _box_nms_numpy(
    data,
    *,
    overlap_thresh,
    valid_thresh,
    topk,
    coord_start,
    score_index,
    id_index,
    background_id,
    force_suppress,
    in_format,
    out_format,
    legacy_box,
):
    _check(**locals())  # the arguments, by name
    if topk == 0:  # MXNet's box_nms returns its input as is
        return data.copy()
    one = 1 if legacy_box else 0
    lo, hi = coord_start, coord_start + 4
    # the image count as a number: reshape(-1, 0, K) cannot infer -1 for images without boxes
    rows = data.reshape(int(np.prod(data.shape[:-2])), *data.shape[-2:])
    out = -np.ones_like(rows)
    for b, boxes in enumerate(rows):
        score = boxes[:, score_index]
        valid = score > valid_thresh
        if id_index >= 0 and background_id >= 0:
            valid &= boxes[:, id_index] != background_id
        order = [i for i in np.argsort(-score, kind="stable") if valid[i]]
        order = order[:topk] if topk >= 0 else order
        corners = boxes[:, lo:hi].astype(np.float64)
        if in_format == "center":
            corners = np.stack(to_corner(*corners.T, one), axis=-1)
        kept = []
        for i in order:
            rivals = [
                j
                for j in kept
                if force_suppress or id_index < 0 or boxes[j, id_index] == boxes[i, id_index]
            ]
            if not rivals or _iou(corners[i], corners[rivals], one).max() <= overlap_thresh:
                kept.append(i)
        out[b, : len(kept)] = boxes[kept]
        if in_format != out_format and kept:
            convert = np.ones(len(kept), bool) if legacy_box else boxes[kept, lo] >= 0
            coords = np.stack(_convert(boxes[kept, lo:hi].T, in_format, out_format, one), -1)
            out[b, : len(kept), lo:hi] = np.where(convert[:, None], coords, boxes[kept, lo:hi])
    return out.reshape(data.shape)


def _iou(box, others, one):
    """IoU of one corner box with several (negative sides: area 0, as in MXNet)."""
    iw = np.minimum(box[2], others[:, 2]) - np.maximum(box[0], others[:, 0]) + one
    ih = np.minimum(box[3], others[:, 3]) - np.maximum(box[1], others[:, 1]) + one
    inter = np.maximum(iw, 0) * np.maximum(ih, 0)

    def area(b):
        w, h = b[..., 2] - b[..., 0] + one, b[..., 3] - b[..., 1] + one
        return np.where((w < 0) | (h < 0), 0, w * h)

    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(inter > 0, inter / (area(box) + area(others) - inter), 0)
