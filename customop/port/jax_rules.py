"""MXNet operator -> JAX: one rule per operator of the native graphs.

The twin of :mod:`customop.port.torch_rules` (same entries, same MXNet semantics), in
``jax.numpy`` and ``jax.lax``; every rule is traceable (``jit``, ``vmap``): shapes come
from the arrays, never from their values.  ``tests/port/test_rules.py`` checks every entry
against MXNet on random inputs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from .box_deltas import center_deltas
from .runner import SCALAR_ARITHMETIC, Attrs, mx_reshape
from .runner import reduce_axes as _axes

_NARROW = {"float64": "float32", "int64": "int32", "uint64": "uint32"}


def _dtype(a: Attrs, default: str = "float32"):
    name = a.str("dtype", default)
    if not jax.config.jax_enable_x64:  # jax's default: no 64-bit arrays (it would warn)
        name = _NARROW.get(name, name)
    return jnp.bool_ if name == "bool" else jnp.dtype(name)


def _reduce(fn):
    def rule(a: Attrs, x):
        axes = _axes(a, x.ndim, a.bool("exclude"))
        keep = a.bool("keepdims")
        if axes is None:
            out = fn(x, axis=None)
            return out.reshape((1,) * x.ndim) if keep else out.reshape((1,))  # MXNet: no 0-d
        out = fn(x, axis=axes, keepdims=keep)
        return out.reshape((1,)) if out.ndim == 0 else out

    return rule


def _scalar(fn):
    def rule(a: Attrs, x):
        return fn(x, jnp.asarray(a.float("scalar"), x.dtype))

    return rule


def _cmp_scalar(fn):
    def rule(a: Attrs, x):
        return fn(x, a.float("scalar")).astype(x.dtype)

    return rule


def _cmp(fn):
    def rule(a: Attrs, x, y):
        return fn(x, y).astype(x.dtype)

    return rule


def _unary(fn):
    def rule(a: Attrs, x):
        return fn(x)

    return rule


def _binary(fn):
    def rule(a: Attrs, x, y):
        return fn(x, y)

    return rule


def _activation(a: Attrs, x):
    kind = a.str("act_type")
    if kind == "sigmoid":
        return jax.nn.sigmoid(x)
    if kind == "relu":
        return jax.nn.relu(x)
    if kind == "tanh":
        return jnp.tanh(x)
    if kind == "softrelu":
        return jax.nn.softplus(x)
    if kind == "softsign":
        return x / (1 + jnp.abs(x))
    raise NotImplementedError(f"Activation act_type={kind!r}")


def _smooth_l1(a: Attrs, x):
    s2 = a.float("scalar", 1.0) ** 2
    ax = jnp.abs(x)
    return jnp.where(ax < 1.0 / s2, 0.5 * s2 * x * x, ax - 0.5 / s2)


def _reshape(a: Attrs, x):
    return x.reshape(mx_reshape(x.shape, a.shape("shape"), a.bool("reverse")))


def _broadcast_like(a: Attrs, x, y):
    la, ra = a.value("lhs_axes"), a.value("rhs_axes")
    if la is None:
        return jnp.broadcast_to(x, y.shape)
    shape = list(x.shape)
    for i, j in zip(la, ra):
        shape[i] = y.shape[j]
    return jnp.broadcast_to(x, shape)


def _broadcast_to(a: Attrs, x):
    shape = [s if s != 0 else d for s, d in zip(a.shape("shape"), x.shape)]
    return jnp.broadcast_to(x, shape)


def _broadcast_axis(a: Attrs, x):
    shape = list(x.shape)
    for ax, n in zip(a.shape("axis"), a.shape("size")):
        shape[ax] = n
    return jnp.broadcast_to(x, shape)


def _slice_axis(a: Attrs, x):
    ax = a.int("axis") % x.ndim
    n = x.shape[ax]
    b, e = a.int("begin", 0), a.int("end", None)
    b = b + n if b < 0 else b
    e = n if e is None else (e + n if e < 0 else e)
    return lax.slice_in_dim(x, b, e, axis=ax)


def _slice(a: Attrs, x):
    begin, end = a.shape("begin"), a.shape("end")
    step = a.shape("step") or (None,) * len(begin)
    return x[tuple(slice(b, e, s) for b, e, s in zip(begin, end, step))]


def _split(a: Attrs, x):
    ax = a.int("axis", 1) % x.ndim
    parts = jnp.split(x, a.int("num_outputs"), axis=ax)
    if a.bool("squeeze_axis"):
        parts = [p.squeeze(ax) for p in parts]
    return tuple(parts)


def _add_n(a: Attrs, *xs):
    out = xs[0]
    for x in xs[1:]:
        out = out + x
    return out


def _squeeze(a: Attrs, x):
    axes = a.axes("axis")
    return jnp.squeeze(x) if axes is None else jnp.squeeze(x, axes)


def _transpose(a: Attrs, x):
    axes = a.shape("axes")
    return jnp.transpose(x, tuple(axes) if axes else None)


def _arange(a: Attrs):
    start, stop, step = a.float("start", 0.0), a.float("stop"), a.float("step", 1.0)
    if stop is None:
        start, stop = 0.0, start
    import numpy as np

    out = np.arange(start, stop, step, dtype=np.float64)
    rep = a.int("repeat", 1)
    if rep > 1:
        out = np.repeat(out, rep)
    return jnp.asarray(out.astype(a.str("dtype", "float32")))


def _arange_like(a: Attrs, x):
    start, step = a.float("start", 0.0), a.float("step", 1.0)
    ax = a.int("axis")
    if ax is None:
        return (jnp.arange(x.size, dtype=x.dtype) * step + start).reshape(x.shape)
    return jnp.arange(x.shape[ax], dtype=x.dtype) * step + start


def _one_hot(a: Attrs, x):
    depth = a.int("depth")
    hot = x.astype(jnp.int32)[..., None] == jnp.arange(depth)
    on, off = a.float("on_value", 1.0), a.float("off_value", 0.0)
    return jnp.where(hot, on, off).astype(_dtype(a))


def _index(i, n, mode):
    i = i.astype(jnp.int32)
    return i % n if mode == "wrap" else jnp.clip(i, 0, n - 1)


def _take(a: Attrs, x, idx):
    ax = a.int("axis", 0) % x.ndim
    return jnp.take(x, _index(idx, x.shape[ax], a.str("mode", "clip")), axis=ax)


def _pick(a: Attrs, x, idx):
    ax = a.int("axis", -1) % x.ndim
    i = _index(idx, x.shape[ax], a.str("mode", "clip"))
    if i.ndim < x.ndim:
        i = jnp.expand_dims(i, ax)
    out = jnp.take_along_axis(x, i, axis=ax)
    return out if a.bool("keepdims") else jnp.squeeze(out, ax)


def _gather_nd(a: Attrs, x, idx):
    i = idx.astype(jnp.int32)
    return x[tuple(i[k] for k in range(i.shape[0]))]


def _where(a: Attrs, c, x, y):
    if c.ndim == 1 and x.ndim > 1:
        c = c.reshape((-1,) + (1,) * (x.ndim - 1))
    return jnp.where(c != 0, x, y)


def _softmax(a: Attrs, x):
    t = a.float("temperature", None)
    return jax.nn.softmax(x / t if t else x, axis=a.int("axis", -1))


def _log_softmax(a: Attrs, x):
    t = a.float("temperature", None)
    return jax.nn.log_softmax(x / t if t else x, axis=a.int("axis", -1))


def _topk(a: Attrs, x):
    ax = a.int("axis", -1)
    if ax is None:
        x, ax = x.reshape(-1), 0
    ax = ax % x.ndim
    k = a.int("k", 1)
    k = x.shape[ax] if k < 1 else k
    xl = jnp.moveaxis(x, ax, -1)
    vals, idx = lax.top_k(-xl if a.bool("is_ascend") else xl, k)
    if a.bool("is_ascend"):
        vals = -vals
    kind = a.str("ret_typ", "indices")
    if kind == "value":
        return jnp.moveaxis(vals, -1, ax)
    if kind == "mask":
        hot = (idx[..., None] == jnp.arange(xl.shape[-1])).any(-2)
        return jnp.moveaxis(hot.astype(x.dtype), -1, ax)
    idx = jnp.moveaxis(idx.astype(_dtype(a)), -1, ax)
    return (jnp.moveaxis(vals, -1, ax), idx) if kind == "both" else idx


def _sort(a: Attrs, x):
    out = jnp.sort(x, axis=a.int("axis", -1))
    return out if a.bool("is_ascend", True) else jnp.flip(out, axis=a.int("axis", -1))


def _argsort(a: Attrs, x):
    ax = a.int("axis", -1)
    i = jnp.argsort(x, axis=ax) if a.bool("is_ascend", True) else jnp.argsort(-x, axis=ax)
    return i.astype(_dtype(a))


def _arg_reduce(fn):
    def rule(a: Attrs, x):
        out = fn(x, axis=a.int("axis", None), keepdims=a.bool("keepdims"))
        return out.astype(x.dtype)

    return rule


def _dot(a: Attrs, x, y):
    if a.bool("transpose_a"):
        x = jnp.transpose(x)
    if a.bool("transpose_b"):
        y = jnp.transpose(y)
    return jnp.tensordot(x, y, axes=1)


def _batch_dot(a: Attrs, x, y):
    if a.bool("transpose_a"):
        x = jnp.swapaxes(x, -1, -2)
    if a.bool("transpose_b"):
        y = jnp.swapaxes(y, -1, -2)
    return jnp.matmul(x, y)


def _cumsum(a: Attrs, x):
    ax = a.int("axis", None)
    return jnp.cumsum(x.reshape(-1) if ax is None else x, axis=0 if ax is None else ax)


def corners(b, fmt: str):
    if fmt == "center":
        x, y, w, h = (b[..., i] for i in range(4))
        return x - w / 2, y - h / 2, x + w / 2, y + h / 2
    return tuple(b[..., i] for i in range(4))


def box_iou(lhs, rhs, fmt: str):
    """MXNet's ``_contrib_box_iou``: every box of ``lhs`` against every box of ``rhs``."""
    l1, t1, r1, b1 = (c.reshape(c.shape + (1,) * (rhs.ndim - 1)) for c in corners(lhs, fmt))
    l2, t2, r2, b2 = (c.reshape((1,) * (lhs.ndim - 1) + c.shape) for c in corners(rhs, fmt))
    w = jnp.maximum(jnp.minimum(r1, r2) - jnp.maximum(l1, l2), 0)
    h = jnp.maximum(jnp.minimum(b1, b2) - jnp.maximum(t1, t2), 0)
    inter = w * h
    union = (r1 - l1) * (b1 - t1) + (r2 - l2) * (b2 - t2) - inter
    return jnp.where(union > 0, inter / jnp.where(union > 0, union, 1), 0)


def _box_encode(a: Attrs, samples, matches, anchors, refs, means, stds):
    m = jnp.take_along_axis(refs, matches.astype(jnp.int32)[..., None], axis=1)
    dx, dy, rw, rh = center_deltas(m, anchors)
    t = jnp.stack([dx, dy, jnp.log(rw), jnp.log(rh)], -1)
    t = (t - means) / stds
    pos = (samples > 0.5)[..., None]
    return jnp.where(pos, t, 0).astype(t.dtype), jnp.broadcast_to(pos, t.shape).astype(
        anchors.dtype
    )


def _box_nms(a: Attrs, data):
    from .nms import jax_box_nms

    return jax_box_nms(a, data)


RULES = {
    "BlockGrad": lambda a, x: lax.stop_gradient(x),
    "stop_gradient": lambda a, x: lax.stop_gradient(x),
    "_copy": lambda a, x: x,
    "identity": lambda a, x: x,
    "Cast": lambda a, x: x.astype(_dtype(a)),
    "cast": lambda a, x: x.astype(_dtype(a)),
    "Activation": _activation,
    "sigmoid": _unary(jax.nn.sigmoid),
    "relu": _unary(jax.nn.relu),
    "tanh": _unary(jnp.tanh),
    "exp": _unary(jnp.exp),
    "expm1": _unary(jnp.expm1),
    "log": _unary(jnp.log),
    "log1p": _unary(jnp.log1p),
    "abs": _unary(jnp.abs),
    "sign": _unary(jnp.sign),
    "sqrt": _unary(jnp.sqrt),
    "rsqrt": _unary(lax.rsqrt),
    "square": _unary(jnp.square),
    "reciprocal": _unary(jnp.reciprocal),
    "negative": _unary(jnp.negative),
    "floor": _unary(jnp.floor),
    "ceil": _unary(jnp.ceil),
    "sin": _unary(jnp.sin),
    "cos": _unary(jnp.cos),
    "zeros_like": _unary(jnp.zeros_like),
    "ones_like": _unary(jnp.ones_like),
    "smooth_l1": _smooth_l1,
    **{name: _scalar(fn) for name, fn in SCALAR_ARITHMETIC.items()},
    "_maximum_scalar": _scalar(jnp.maximum),
    "_minimum_scalar": _scalar(jnp.minimum),
    "_equal_scalar": _cmp_scalar(jnp.equal),
    "_not_equal_scalar": _cmp_scalar(jnp.not_equal),
    "_greater_scalar": _cmp_scalar(jnp.greater),
    "_greater_equal_scalar": _cmp_scalar(jnp.greater_equal),
    "_lesser_scalar": _cmp_scalar(jnp.less),
    "_lesser_equal_scalar": _cmp_scalar(jnp.less_equal),
    "elemwise_add": _binary(jnp.add),
    "elemwise_sub": _binary(jnp.subtract),
    "elemwise_mul": _binary(jnp.multiply),
    "elemwise_div": _binary(jnp.divide),
    "_plus": _binary(jnp.add),
    "_minus": _binary(jnp.subtract),
    "_mul": _binary(jnp.multiply),
    "_div": _binary(jnp.divide),
    "broadcast_add": _binary(jnp.add),
    "broadcast_plus": _binary(jnp.add),
    "broadcast_sub": _binary(jnp.subtract),
    "broadcast_minus": _binary(jnp.subtract),
    "broadcast_mul": _binary(jnp.multiply),
    "broadcast_div": _binary(jnp.divide),
    "broadcast_power": _binary(jnp.power),
    "broadcast_maximum": _binary(jnp.maximum),
    "broadcast_minimum": _binary(jnp.minimum),
    "_maximum": _binary(jnp.maximum),
    "_minimum": _binary(jnp.minimum),
    "broadcast_equal": _cmp(jnp.equal),
    "broadcast_not_equal": _cmp(jnp.not_equal),
    "broadcast_greater": _cmp(jnp.greater),
    "broadcast_greater_equal": _cmp(jnp.greater_equal),
    "broadcast_lesser": _cmp(jnp.less),
    "broadcast_lesser_equal": _cmp(jnp.less_equal),
    "_equal": _cmp(jnp.equal),
    "_not_equal": _cmp(jnp.not_equal),
    "_greater": _cmp(jnp.greater),
    "_greater_equal": _cmp(jnp.greater_equal),
    "_lesser": _cmp(jnp.less),
    "_lesser_equal": _cmp(jnp.less_equal),
    "add_n": _add_n,
    "ElementWiseSum": _add_n,
    "sum": _reduce(jnp.sum),
    "mean": _reduce(jnp.mean),
    "prod": _reduce(jnp.prod),
    "max": _reduce(jnp.max),
    "min": _reduce(jnp.min),
    "argmax": _arg_reduce(jnp.argmax),
    "argmin": _arg_reduce(jnp.argmin),
    "Reshape": _reshape,
    "reshape": _reshape,
    "reshape_like": lambda a, x, y: x.reshape(y.shape),
    "broadcast_like": _broadcast_like,
    "broadcast_to": _broadcast_to,
    "broadcast_axis": _broadcast_axis,
    "expand_dims": lambda a, x: jnp.expand_dims(x, a.int("axis")),
    "squeeze": _squeeze,
    "transpose": _transpose,
    "SwapAxis": lambda a, x: jnp.swapaxes(x, a.int("dim1", 0), a.int("dim2", 0)),
    "swapaxes": lambda a, x: jnp.swapaxes(x, a.int("dim1", 0), a.int("dim2", 0)),
    "slice_axis": _slice_axis,
    "slice": _slice,
    "SliceChannel": _split,
    "split": _split,
    "Concat": lambda a, *xs: jnp.concatenate(xs, axis=a.int("dim", 1)),
    "concat": lambda a, *xs: jnp.concatenate(xs, axis=a.int("dim", 1)),
    "stack": lambda a, *xs: jnp.stack(xs, axis=a.int("axis", 0)),
    "tile": lambda a, x: jnp.tile(x, a.shape("reps")),
    "shape_array": lambda a, x: jnp.asarray(x.shape, dtype=jnp.int32),
    "size_array": lambda a, x: jnp.asarray([x.size], dtype=jnp.int32),
    "_full": lambda a: jnp.full(a.shape("shape"), a.float("value"), dtype=_dtype(a)),
    "_zeros": lambda a: jnp.zeros(a.shape("shape"), dtype=_dtype(a)),
    "_ones": lambda a: jnp.ones(a.shape("shape"), dtype=_dtype(a)),
    "_arange": _arange,
    "_contrib_arange_like": _arange_like,
    "one_hot": _one_hot,
    "take": _take,
    "pick": _pick,
    "gather_nd": _gather_nd,
    "where": _where,
    "clip": lambda a, x: jnp.clip(x, a.float("a_min"), a.float("a_max")),
    "softmax": _softmax,
    "log_softmax": _log_softmax,
    "topk": _topk,
    "sort": _sort,
    "argsort": _argsort,
    "dot": _dot,
    "batch_dot": _batch_dot,
    "_np_cumsum": _cumsum,
    "cumsum": _cumsum,
    "_contrib_box_iou": lambda a, x, y: box_iou(x, y, a.str("format", "corner")),
    "_contrib_box_encode": _box_encode,
    "_contrib_box_nms": _box_nms,
    "_contrib_box_non_maximum_suppression": _box_nms,
}
