"""The center-size offsets of ``_contrib_box_encode`` (MXNet 1.9.1), for both rule tables:
plain Python arithmetic, the same on torch tensors and jax arrays."""

from __future__ import annotations

from typing import Any


def center_deltas(matched: Any, anchors: Any) -> tuple:
    """``(dx, dy, w ratio, h ratio)`` of corner boxes ``matched`` against corner ``anchors``:
    the offsets of the centers in anchor widths and heights, and the size ratios (whose
    logs the encoding holds)."""
    aw = anchors[..., 2] - anchors[..., 0]
    ah = anchors[..., 3] - anchors[..., 1]
    ax = anchors[..., 0] + aw * 0.5
    ay = anchors[..., 1] + ah * 0.5
    gw = matched[..., 2] - matched[..., 0]
    gh = matched[..., 3] - matched[..., 1]
    gx = matched[..., 0] + gw * 0.5
    gy = matched[..., 1] + gh * 0.5
    return (gx - ax) / aw, (gy - ay) / ah, gw / aw, gh / ah
