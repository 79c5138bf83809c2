"""Box conventions shared by the box operators: the one place that knows what ``legacy_box`` means.

MXNet's box operators measure a corner box ``[x1, y1, x2, y2]`` as ``w = x2 - x1``;
Caffe/Detectron (``legacy_box=True``) count pixels, ``w = x2 - x1 + 1``, with the
center at ``x1 + w / 2`` and so ``x2 = cx + w / 2 - 1``. A center box ``[cx, cy, w, h]``
carries its width itself in both conventions. These helpers are plain arithmetic, so
they work on NumPy arrays and NDArrays alike.
"""

from __future__ import annotations


def to_center(x1, y1, x2, y2, one):
    """Corner to center coordinates; ``one`` is 1 for legacy boxes, else 0."""
    w = x2 - x1 + one
    h = y2 - y1 + one
    return x1 + w * 0.5, y1 + h * 0.5, w, h


def to_corner(cx, cy, w, h, one):
    """Center to corner coordinates (inverse of :func:`to_center`)."""
    return cx - w * 0.5, cy - h * 0.5, cx + w * 0.5 - one, cy + h * 0.5 - one
