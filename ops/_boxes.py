"""Box conventions shared by the box operators: the one place that knows what ``legacy_box`` means.

MXNet's box operators measure a corner box ``[x1, y1, x2, y2]`` as ``w = x2 - x1``;
Caffe/Detectron (``legacy_box=True``) count pixels, ``w = x2 - x1 + 1``, with the
center at ``x1 + w / 2`` and so ``x2 = cx + w / 2 - 1``. A center box ``[cx, cy, w, h]``
carries its width itself in both conventions. These helpers are plain arithmetic, so
they work on NumPy arrays and NDArrays alike.
"""
from __future__ import annotations

FORMATS = ("corner", "center")


def to_center(x1, y1, x2, y2, one):
    """Corner to center coordinates; ``one`` is 1 for legacy boxes, else 0."""
    w = x2 - x1 + one
    h = y2 - y1 + one
    return x1 + w * 0.5, y1 + h * 0.5, w, h


def to_corner(cx, cy, w, h, one):
    """Center to corner coordinates (inverse of :func:`to_center`)."""
    return cx - w * 0.5, cy - h * 0.5, cx + w * 0.5 - one, cy + h * 0.5 - one


def check_format(op, name, value):
    if value not in FORMATS:
        raise ValueError(f"ops.{op}: {name} must be 'corner' or 'center', got {value!r}")


def check_boxes(op, name, shape, ndim=None):
    if len(shape) < 2 or shape[-1] != 4 or (ndim is not None and len(shape) != ndim):
        want = f"{ndim}-d " if ndim else ""
        raise ValueError(f"ops.{op}: {name} must be a {want}array of boxes with last axis 4, "
                         f"got shape {tuple(shape)}")
