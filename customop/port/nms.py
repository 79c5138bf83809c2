"""MXNet's ``_contrib_box_nms`` (1.9.1) in torch and in jax: greedy suppression in score
order, the kept rows first, every other row -1 (the semantics of ``ops.box_nms.numpy``).

Forward only, like MXNet's operator in ``ops.box_nms``'s graph (its gradient is the
op's closure, carried by the training graph's other nodes).
"""

from __future__ import annotations

from typing import Any

from .runner import Attrs


def _params(a: Attrs) -> dict[str, Any]:
    return dict(
        thresh=a.float("overlap_thresh", 0.5),
        valid=a.float("valid_thresh", 0.0),
        topk=a.int("topk", -1),
        lo=a.int("coord_start", 2),
        score=a.int("score_index", 1),
        cls=a.int("id_index", -1),
        bg=a.int("background_id", -1),
        force=a.bool("force_suppress"),
        fin=a.str("in_format", "corner"),
        fout=a.str("out_format", "corner"),
    )


def _convert(xp, c, fin, fout):
    """Coordinates (..., 4) from ``fin`` to ``fout`` ('corner' / 'center')."""
    if fin == fout:
        return c
    a, b, e, d = (c[..., i] for i in range(4))
    if fin == "center":
        return xp.stack([a - e / 2, b - d / 2, a + e / 2, b + d / 2], -1)
    return xp.stack([(a + e) / 2, (b + d) / 2, e - a, d - b], -1)


def _iou_matrix(xp, c):
    """Pairwise IoU of corner boxes (n, 4); a box with a negative side has area 0."""
    x1, y1, x2, y2 = (c[:, i] for i in range(4))
    iw = xp.minimum(x2[:, None], x2[None]) - xp.maximum(x1[:, None], x1[None])
    ih = xp.minimum(y2[:, None], y2[None]) - xp.maximum(y1[:, None], y1[None])
    inter = xp.maximum(iw, 0 * iw) * xp.maximum(ih, 0 * ih)
    w, h = x2 - x1, y2 - y1
    area = xp.where((w < 0) | (h < 0), 0 * w, w * h)
    union = area[:, None] + area[None] - inter
    safe = xp.where(inter > 0, union, 1 + 0 * union)
    return xp.where(inter > 0, inter / safe, 0 * inter)


def _torch_keep(valid, over):
    """``keep[i] = valid[i]`` and no kept box before ``i`` overlaps it (``over`` is
    symmetric: IoU and the class test are).  Greedy on the host: one pass over the boxes in
    score order, work only at the kept ones (as torchvision's CPU ``nms``); under a fake or
    compiling mode, where there are no values, a loop of tensor operations instead."""
    import torch

    n = valid.shape[0]
    if (
        type(over) is torch.Tensor
        and not torch.compiler.is_compiling()
        and torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is None
    ):
        import numpy as np

        o, suppressed = over.cpu().numpy(), ~valid.cpu().numpy()
        keep = np.zeros(n, bool)
        for i in range(n):
            if not suppressed[i]:
                keep[i] = True
                suppressed |= o[i]
        return torch.from_numpy(keep).to(valid.device)
    keep = torch.zeros(n, dtype=torch.bool, device=valid.device)
    for i in range(n):
        keep[i] = valid[i] & ~(keep[:i] & over[i, :i]).any()
    return keep


def _candidates(sb, p: dict, rank):
    # the score-sorted boxes NMS may keep: above valid_thresh, not background, within topk
    # (rank: the running count of a boolean vector, in the framework's own cumsum)
    valid = sb[:, p["score"]] > p["valid"]
    if p["cls"] >= 0 and p["bg"] >= 0:
        valid = valid & (sb[:, p["cls"]] != p["bg"])
    if p["topk"] > 0:
        valid = valid & (rank(valid) <= p["topk"])
    return valid


def torch_box_nms(a: Attrs, data):
    import torch

    p = _params(a)
    if p["topk"] == 0:
        return data.clone()
    shape = data.shape
    rows = data.reshape((-1,) + tuple(shape[-2:]))
    outs = []
    for boxes in rows:
        score = boxes[:, p["score"]]
        order = torch.sort(-score, stable=True)[1]
        sb = boxes[order]
        valid = _candidates(sb, p, lambda v: torch.cumsum(v.to(torch.int64), 0))
        corners = _convert(
            torch, sb[:, p["lo"] : p["lo"] + 4].to(torch.float64), p["fin"], "corner"
        )
        over = _iou_matrix(torch, corners) > p["thresh"]
        if p["cls"] >= 0 and not p["force"]:
            ids = sb[:, p["cls"]]
            over = over & (ids[:, None] == ids[None])
        keep = _torch_keep(valid, over)
        kept = sb[keep]
        if p["fin"] != p["fout"]:
            lo = p["lo"]
            conv = _convert(torch, kept[:, lo : lo + 4], p["fin"], p["fout"])
            kept = torch.cat([kept[:, :lo], conv, kept[:, lo + 4 :]], 1)
        out = -torch.ones_like(boxes)
        out[: kept.shape[0]] = kept
        outs.append(out)
    return torch.stack(outs).reshape(shape)


def jax_box_nms(a: Attrs, data):
    import jax
    import jax.numpy as jnp

    p = _params(a)
    if p["topk"] == 0:
        return data
    shape = data.shape
    rows = data.reshape((-1,) + tuple(shape[-2:]))
    n = rows.shape[1]

    def one(boxes):
        score = boxes[:, p["score"]]
        order = jnp.argsort(-score, stable=True)
        sb = boxes[order]
        valid = _candidates(sb, p, lambda v: jnp.cumsum(v.astype(jnp.int32)))
        corners = _convert(jnp, sb[:, p["lo"] : p["lo"] + 4], p["fin"], "corner")
        over = _iou_matrix(jnp, corners) > p["thresh"]
        if p["cls"] >= 0 and not p["force"]:
            ids = sb[:, p["cls"]]
            over = over & (ids[:, None] == ids[None])
        idx = jnp.arange(n)

        def body(i, keep):
            hit = jnp.any(keep & over[i] & (idx < i))
            return keep.at[i].set(valid[i] & ~hit)

        keep = jax.lax.fori_loop(0, n, body, jnp.zeros(n, bool))
        # kept rows first, in score order: a stable sort on "not kept"
        pos = jnp.argsort(~keep, stable=True)
        kept = sb[pos]
        if p["fin"] != p["fout"]:
            lo = p["lo"]
            conv = _convert(jnp, kept[:, lo : lo + 4], p["fin"], p["fout"])
            kept = jnp.concatenate([kept[:, :lo], conv, kept[:, lo + 4 :]], 1)
        count = keep.sum()
        return jnp.where((idx < count)[:, None], kept, -jnp.ones_like(kept))

    return jax.vmap(one)(rows).reshape(shape)
