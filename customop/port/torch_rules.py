"""MXNet operator -> PyTorch: one rule per operator of the native graphs.

Each rule takes the node's :class:`~customop.port.runner.Attrs` and its input tensors and
returns a tensor (or a tuple, for several outputs), computing what MXNet 1.9.1's operator
computes (comparisons give the input's dtype, indices come as floats unless ``dtype``
says otherwise, ``take``/``pick`` clip their indices).  ``tests/port/test_rules.py`` checks
every entry against MXNet on random inputs.  Adding an operator is one entry here and one
in :mod:`customop.port.jax_rules`.
"""

from __future__ import annotations

import threading

import torch

from .box_deltas import center_deltas
from .runner import SCALAR_ARITHMETIC, Attrs, mx_reshape
from .runner import reduce_axes as _axes


class _Device(threading.local):
    """Where tensors made from attributes alone (``_full``, ``_arange``) go: the device of
    the call's inputs, set by the port before it runs a graph (customop.port.torch_port).
    One per thread, so that two threads calling ports on different devices do not race."""

    def __init__(self):
        self.value = None


DEVICE = _Device()

DTYPES = {
    "float16": torch.float16,
    "float32": torch.float32,
    "float64": torch.float64,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int32": torch.int32,
    "int64": torch.int64,
    "bool": torch.bool,
}


def _dtype(a: Attrs, default: str = "float32") -> torch.dtype:
    return DTYPES[a.str("dtype", default)]


def _reduce(fn):
    def rule(a: Attrs, x):
        axes = _axes(a, x.dim(), a.bool("exclude"))
        keep = a.bool("keepdims")
        if axes is None:
            out = fn(x, tuple(range(x.dim())), False)
            return out.reshape((1,) * x.dim()) if keep else out.reshape((1,))  # MXNet: no 0-d
        out = fn(x, axes, keep)
        return out.reshape((1,)) if out.dim() == 0 else out

    return rule


def _amax(x, axes, keep):
    return torch.amax(x, dim=axes, keepdim=keep)


def _amin(x, axes, keep):
    return torch.amin(x, dim=axes, keepdim=keep)


def _sum(x, axes, keep):
    return torch.sum(x, dim=axes, keepdim=keep)


def _mean(x, axes, keep):
    return torch.mean(x, dim=axes, keepdim=keep)


def _prod(x, axes, keep):
    for d in sorted(axes, reverse=True):
        x = torch.prod(x, dim=d, keepdim=keep)
    return x


def _bound(bind):
    """A rule with ``bind(attrs) -> fn(*tensors)``: the graph compiler reads the node's
    attributes once (:func:`customop.port.runner.compile_graph`); a call costs no reads."""

    def rule(a: Attrs, *xs):
        return bind(a)(*xs)

    rule.bind = bind  # type: ignore[attr-defined]
    return rule


def _scalar(fn):
    def bind(a: Attrs):
        s = a.float("scalar")
        return lambda x: fn(x, s)

    return _bound(bind)


def _cmp_scalar(fn):
    def bind(a: Attrs):
        s = a.float("scalar")
        return lambda x: fn(x, s).to(x.dtype)

    return _bound(bind)


def _cmp(fn):
    return _bound(lambda a: lambda x, y: fn(x, y).to(x.dtype))


def _unary(fn):
    return _bound(lambda a: fn)


def _binary(fn):
    return _bound(lambda a: fn)


def _softsign(x):
    return x / (1 + x.abs())


_ACTIVATIONS = {
    "sigmoid": torch.sigmoid,
    "relu": torch.relu,
    "tanh": torch.tanh,
    "softrelu": lambda x: _softrelu(x),
    "softsign": _softsign,
}


def _bind_activation(a: Attrs):
    kind = a.str("act_type")
    if kind not in _ACTIVATIONS:
        raise NotImplementedError(f"Activation act_type={kind!r}")
    return _ACTIVATIONS[kind]


_SOFTRELU_SMALL = 1 << 15  # elements (2x100x5: 0.29 ms a step with softplus, 0.33 without)


def _softrelu(x):
    """MXNet's ``softrelu``, log(1 + exp(x)), to a few ulp, tiny values included, with
    gradient sigmoid(x) (0.5 at 0, as MXNet).  torch's ``softplus`` and ``log1p`` are not
    vectorised on CPU (torch 2.14: about 10x ``log``), and the focal loss's graph holds two:
    ``max(x, 0) + log1p(exp(-|x|))`` with log1p(u) = log(w) * u / (w - 1), w = 1 + u
    (Goldberg's correction; the factor, 1 up to rounding, is held constant for the
    gradient).  Small tensors, where each of its seven calls costs more than the work,
    take ``softplus`` (same values within 2 ulp, same gradient)."""
    if x.numel() < _SOFTRELU_SMALL:
        return torch.nn.functional.softplus(x)
    u = torch.exp(-x.abs())
    w = 1 + u
    one = w == 1
    factor = (u / torch.where(one, torch.ones_like(w), w - 1)).detach()
    return torch.maximum(x, x.new_zeros(())) + torch.where(one, u, torch.log(w) * factor)


def _smooth_l1(a: Attrs, x):
    s2 = a.float("scalar", 1.0) ** 2
    ax = x.abs()
    return torch.where(ax < 1.0 / s2, 0.5 * s2 * x * x, ax - 0.5 / s2)


def _reshape(a: Attrs, x):
    return x.reshape(mx_reshape(x.shape, a.shape("shape"), a.bool("reverse")))


def _reshape_like(a: Attrs, x, y):
    return x.reshape(y.shape)


def _broadcast_like(a: Attrs, x, y):
    la, ra = a.value("lhs_axes"), a.value("rhs_axes")
    if la is None:
        return x.expand(y.shape)
    shape = list(x.shape)
    for i, j in zip(la, ra):
        shape[i] = y.shape[j]
    return x.expand(shape)


def _broadcast_to(a: Attrs, x):
    shape = [s if s != 0 else d for s, d in zip(a.shape("shape"), x.shape)]
    return x.expand(shape)


def _broadcast_axis(a: Attrs, x):
    axes = a.shape("axis")
    sizes = a.shape("size")
    shape = list(x.shape)
    for ax, n in zip(axes, sizes):
        shape[ax] = n
    return x.expand(shape)


def _slice_axis(a: Attrs, x):
    ax = a.int("axis") % x.dim()
    n = x.shape[ax]
    b, e = a.int("begin", 0), a.int("end", None)
    b = b + n if b < 0 else b
    e = n if e is None else (e + n if e < 0 else e)
    return x.narrow(ax, b, e - b)


def _slice(a: Attrs, x):
    begin, end = a.shape("begin"), a.shape("end")
    step = a.shape("step") or (None,) * len(begin)
    idx = tuple(slice(b, e, s) for b, e, s in zip(begin, end, step))
    return x[idx]


def _split(a: Attrs, x):
    ax = a.int("axis", 1) % x.dim()
    parts = torch.chunk(x, a.int("num_outputs"), dim=ax)
    if a.bool("squeeze_axis"):
        parts = tuple(p.squeeze(ax) for p in parts)
    return tuple(parts)


def _concat(a: Attrs, *xs):
    return torch.cat(xs, dim=a.int("dim", 1))


def _stack(a: Attrs, *xs):
    return torch.stack(xs, dim=a.int("axis", 0))


def _add_n(a: Attrs, *xs):
    out = xs[0]
    for x in xs[1:]:
        out = out + x
    return out


def _bind_expand_dims(a: Attrs):
    axis = a.int("axis")
    return lambda x: x.unsqueeze(axis)


def _squeeze(a: Attrs, x):
    axes = a.axes("axis")
    if axes is None:
        return x.squeeze()
    axes = (axes,) if isinstance(axes, int) else axes
    return x.squeeze(tuple(axes))


def _transpose(a: Attrs, x):
    axes = a.shape("axes")
    return x.permute(tuple(axes) if axes else tuple(range(x.dim() - 1, -1, -1)))


def _swapaxes(a: Attrs, x):
    return x.transpose(a.int("dim1", 0), a.int("dim2", 0))


def _full(a: Attrs):
    return torch.full(a.shape("shape"), a.float("value"), dtype=_dtype(a), device=DEVICE.value)


def _zeros(a: Attrs):
    return torch.zeros(a.shape("shape"), dtype=_dtype(a), device=DEVICE.value)


def _ones(a: Attrs):
    return torch.ones(a.shape("shape"), dtype=_dtype(a), device=DEVICE.value)


def _arange(a: Attrs):
    start, stop, step = a.float("start", 0.0), a.float("stop"), a.float("step", 1.0)
    if stop is None:
        start, stop = 0.0, start
    out = torch.arange(start, stop, step, dtype=torch.float64, device=DEVICE.value)
    rep = a.int("repeat", 1)
    if rep > 1:
        out = out.repeat_interleave(rep)
    return out.to(_dtype(a))


def _arange_like(a: Attrs, x):
    start, step = a.float("start", 0.0), a.float("step", 1.0)
    ax = a.int("axis")
    if ax is None:
        flat = torch.arange(x.numel(), dtype=x.dtype, device=x.device)
        return (flat * step + start).reshape(x.shape)
    return torch.arange(x.shape[ax], dtype=x.dtype, device=x.device) * step + start


def _cast(a: Attrs, x):
    return x.to(_dtype(a))


def _bind_one_hot(a: Attrs):
    depth, dtype = a.int("depth"), _dtype(a)
    on, off = a.float("on_value", 1.0), a.float("off_value", 0.0)

    def one_hot(x):
        hot = x.to(torch.int64).unsqueeze(-1) == torch.arange(depth, device=x.device)
        return torch.where(hot, on, off).to(dtype)

    return one_hot


def _take(a: Attrs, x, idx):
    ax = a.int("axis", 0) % x.dim()
    n = x.shape[ax]
    i = idx.to(torch.int64)
    i = i % n if a.str("mode", "clip") == "wrap" else i.clamp(0, n - 1)
    out = torch.index_select(x, ax, i.reshape(-1))
    return out.reshape(x.shape[:ax] + idx.shape + x.shape[ax + 1 :])


def _pick(a: Attrs, x, idx):
    ax = a.int("axis", -1) % x.dim()
    n = x.shape[ax]
    i = idx.to(torch.int64)
    i = i % n if a.str("mode", "clip") == "wrap" else i.clamp(0, n - 1)
    if i.dim() < x.dim():
        i = i.unsqueeze(ax)
    out = torch.gather(x, ax, i)
    return out if a.bool("keepdims") else out.squeeze(ax)


def _gather_nd(a: Attrs, x, idx):
    i = idx.to(torch.int64)
    return x[tuple(i[k] for k in range(i.shape[0]))]


def _where(a: Attrs, c, x, y):
    if c.dim() == 1 and x.dim() > 1:
        c = c.reshape((-1,) + (1,) * (x.dim() - 1))
    return torch.where(c != 0, x, y)


def _bind_clip(a: Attrs):
    lo, hi = a.float("a_min"), a.float("a_max")
    return lambda x: x.clamp(lo, hi)


def _softmax(a: Attrs, x):
    t = a.float("temperature", None)
    return torch.softmax(x / t if t else x, dim=a.int("axis", -1))


def _log_softmax(a: Attrs, x):
    t = a.float("temperature", None)
    return torch.log_softmax(x / t if t else x, dim=a.int("axis", -1))


def _topk(a: Attrs, x):
    ax = a.int("axis", -1)
    ax = None if ax is None else ax % x.dim()
    if ax is None:
        x, ax = x.reshape(-1), 0
    k = a.int("k", 1)
    k = x.shape[ax] if k < 1 else k
    vals, idx = torch.topk(x, k, dim=ax, largest=not a.bool("is_ascend"), sorted=True)
    kind = a.str("ret_typ", "indices")
    if kind == "value":
        return vals
    if kind == "mask":
        return torch.zeros_like(x).scatter(ax, idx, 1.0)
    idx = idx.to(_dtype(a))
    return (vals, idx) if kind == "both" else idx


def _sort(a: Attrs, x):
    return torch.sort(x, dim=a.int("axis", -1), descending=not a.bool("is_ascend", True))[0]


def _argsort(a: Attrs, x):
    i = torch.sort(x, dim=a.int("axis", -1), descending=not a.bool("is_ascend", True))[1]
    return i.to(_dtype(a))


def _arg_reduce(fn):
    def rule(a: Attrs, x):
        ax = a.int("axis", None)
        out = fn(x, dim=ax, keepdim=a.bool("keepdims")) if ax is not None else fn(x)
        return out.to(x.dtype)

    return rule


def _dot(a: Attrs, x, y):
    if a.bool("transpose_a"):
        x = x.permute(tuple(range(x.dim() - 1, -1, -1)))
    if a.bool("transpose_b"):
        y = y.permute(tuple(range(y.dim() - 1, -1, -1)))
    return torch.tensordot(x, y, dims=1)


def _batch_dot(a: Attrs, x, y):
    if a.bool("transpose_a"):
        x = x.transpose(-1, -2)
    if a.bool("transpose_b"):
        y = y.transpose(-1, -2)
    return torch.matmul(x, y)


def _cumsum(a: Attrs, x):
    ax = a.int("axis", None)
    return torch.cumsum(x.reshape(-1) if ax is None else x, dim=0 if ax is None else ax)


def _box_iou(a: Attrs, lhs, rhs):
    return box_iou(lhs, rhs, a.str("format", "corner"))


def corners(b, fmt: str):
    if fmt == "center":
        x, y, w, h = b.unbind(-1)
        return x - w / 2, y - h / 2, x + w / 2, y + h / 2
    return b.unbind(-1)


def box_iou(lhs, rhs, fmt: str):
    """MXNet's ``_contrib_box_iou``: every box of ``lhs`` against every box of ``rhs``."""
    l1, t1, r1, b1 = (c.reshape(c.shape + (1,) * (rhs.dim() - 1)) for c in corners(lhs, fmt))
    l2, t2, r2, b2 = (c.reshape((1,) * (lhs.dim() - 1) + c.shape) for c in corners(rhs, fmt))
    w = (torch.minimum(r1, r2) - torch.maximum(l1, l2)).clamp(min=0)
    h = (torch.minimum(b1, b2) - torch.maximum(t1, t2)).clamp(min=0)
    inter = w * h
    union = (r1 - l1) * (b1 - t1) + (r2 - l2) * (b2 - t2) - inter
    ok = union > 0
    return torch.where(
        ok, inter / torch.where(ok, union, torch.ones_like(union)), torch.zeros_like(inter)
    )


def _box_encode(a: Attrs, samples, matches, anchors, refs, means, stds):
    b = torch.arange(refs.shape[0], device=refs.device).unsqueeze(1)
    m = refs[b, matches.to(torch.int64)]
    dx, dy, rw, rh = center_deltas(m, anchors)
    t = torch.stack([dx, dy, torch.log(rw), torch.log(rh)], -1)
    t = (t - means) / stds
    pos = (samples > 0.5).unsqueeze(-1)
    targets = torch.where(pos, t, torch.zeros_like(t))
    masks = pos.to(anchors.dtype).expand(t.shape)
    return targets, masks


def _box_nms(a: Attrs, data):
    from .nms import torch_box_nms

    return torch_box_nms(a, data)


RULES = {
    "BlockGrad": lambda a, x: x.detach(),
    "stop_gradient": lambda a, x: x.detach(),
    "_copy": lambda a, x: x.clone(),
    "identity": lambda a, x: x,
    "Cast": _cast,
    "cast": _cast,
    "Activation": _bound(_bind_activation),
    "sigmoid": _unary(torch.sigmoid),
    "relu": _unary(torch.relu),
    "tanh": _unary(torch.tanh),
    "exp": _unary(torch.exp),
    "expm1": _unary(torch.expm1),
    "log": _unary(torch.log),
    "log1p": _unary(torch.log1p),
    "abs": _unary(torch.abs),
    "sign": _unary(torch.sign),
    "sqrt": _unary(torch.sqrt),
    "rsqrt": _unary(torch.rsqrt),
    "square": _unary(torch.square),
    "reciprocal": _unary(torch.reciprocal),
    "negative": _unary(torch.neg),
    "floor": _unary(torch.floor),
    "ceil": _unary(torch.ceil),
    "sin": _unary(torch.sin),
    "cos": _unary(torch.cos),
    "zeros_like": _unary(torch.zeros_like),
    "ones_like": _unary(torch.ones_like),
    "smooth_l1": _smooth_l1,
    **{name: _scalar(fn) for name, fn in SCALAR_ARITHMETIC.items()},
    "_maximum_scalar": _scalar(lambda x, s: x.clamp(min=s)),
    "_minimum_scalar": _scalar(lambda x, s: x.clamp(max=s)),
    "_equal_scalar": _cmp_scalar(torch.eq),
    "_not_equal_scalar": _cmp_scalar(torch.ne),
    "_greater_scalar": _cmp_scalar(torch.gt),
    "_greater_equal_scalar": _cmp_scalar(torch.ge),
    "_lesser_scalar": _cmp_scalar(torch.lt),
    "_lesser_equal_scalar": _cmp_scalar(torch.le),
    "elemwise_add": _binary(torch.add),
    "elemwise_sub": _binary(torch.sub),
    "elemwise_mul": _binary(torch.mul),
    "elemwise_div": _binary(torch.div),
    "_plus": _binary(torch.add),
    "_minus": _binary(torch.sub),
    "_mul": _binary(torch.mul),
    "_div": _binary(torch.div),
    "broadcast_add": _binary(torch.add),
    "broadcast_plus": _binary(torch.add),
    "broadcast_sub": _binary(torch.sub),
    "broadcast_minus": _binary(torch.sub),
    "broadcast_mul": _binary(torch.mul),
    "broadcast_div": _binary(torch.div),
    "broadcast_power": _binary(torch.pow),
    "broadcast_maximum": _binary(torch.maximum),
    "broadcast_minimum": _binary(torch.minimum),
    "_maximum": _binary(torch.maximum),
    "_minimum": _binary(torch.minimum),
    "broadcast_equal": _cmp(torch.eq),
    "broadcast_not_equal": _cmp(torch.ne),
    "broadcast_greater": _cmp(torch.gt),
    "broadcast_greater_equal": _cmp(torch.ge),
    "broadcast_lesser": _cmp(torch.lt),
    "broadcast_lesser_equal": _cmp(torch.le),
    "_equal": _cmp(torch.eq),
    "_not_equal": _cmp(torch.ne),
    "_greater": _cmp(torch.gt),
    "_greater_equal": _cmp(torch.ge),
    "_lesser": _cmp(torch.lt),
    "_lesser_equal": _cmp(torch.le),
    "add_n": _add_n,
    "ElementWiseSum": _add_n,
    "sum": _reduce(_sum),
    "mean": _reduce(_mean),
    "prod": _reduce(_prod),
    "max": _reduce(_amax),
    "min": _reduce(_amin),
    "argmax": _arg_reduce(torch.argmax),
    "argmin": _arg_reduce(torch.argmin),
    "Reshape": _reshape,
    "reshape": _reshape,
    "reshape_like": _reshape_like,
    "broadcast_like": _broadcast_like,
    "broadcast_to": _broadcast_to,
    "broadcast_axis": _broadcast_axis,
    "expand_dims": _bound(_bind_expand_dims),
    "squeeze": _squeeze,
    "transpose": _transpose,
    "SwapAxis": _swapaxes,
    "swapaxes": _swapaxes,
    "slice_axis": _slice_axis,
    "slice": _slice,
    "SliceChannel": _split,
    "split": _split,
    "Concat": _concat,
    "concat": _concat,
    "stack": _stack,
    "tile": lambda a, x: torch.tile(x, a.shape("reps")),
    "shape_array": lambda a, x: torch.tensor(x.shape, dtype=torch.int64, device=x.device),
    "size_array": lambda a, x: torch.tensor([x.numel()], dtype=torch.int64, device=x.device),
    "_full": _full,
    "_zeros": _zeros,
    "_ones": _ones,
    "_arange": _arange,
    "_contrib_arange_like": _arange_like,
    "one_hot": _bound(_bind_one_hot),
    "take": _take,
    "pick": _pick,
    "gather_nd": _gather_nd,
    "where": _where,
    "clip": _bound(_bind_clip),
    "softmax": _softmax,
    "log_softmax": _log_softmax,
    "topk": _topk,
    "sort": _sort,
    "argsort": _argsort,
    "dot": _dot,
    "batch_dot": _batch_dot,
    "_np_cumsum": _cumsum,
    "cumsum": _cumsum,
    "_contrib_box_iou": _box_iou,
    "_contrib_box_encode": _box_encode,
    "_contrib_box_nms": _box_nms,
    "_contrib_box_non_maximum_suppression": _box_nms,
}
