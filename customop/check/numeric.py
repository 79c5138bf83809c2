"""The three gradients a check compares: imperative (``mx.autograd``), symbolic (a bound
executor) and numeric (central finite differences of a float64 forward), and what they run."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import mxnet as mx
import numpy as np

from .. import errors, kernel
from ..modes import NumpyMode
from ..operator import CustomOperator


@dataclass
class _Target:
    label: str
    names: list[str]
    symbol: mx.sym.Symbol
    run_nd: Callable[[list[mx.nd.NDArray]], Any] | None  # imperative call, None: not available
    run64: Callable[[list[np.ndarray]], list[np.ndarray]]  # float64 forward on NumPy arrays
    aux: dict[str, np.ndarray] = field(default_factory=dict)  # symbol aux name -> start value
    no_grad: frozenset = frozenset()  # inputs the operator declares gradient-free


def make_target(obj: Any, arrays: list[np.ndarray], params: dict[str, Any], ctx) -> _Target:
    if isinstance(obj, CustomOperator):
        return _custom_target(obj, arrays, params)
    if isinstance(obj, (tuple, list)) and obj and all(isinstance(s, mx.sym.Symbol) for s in obj):
        obj = mx.sym.Group(list(obj))  # the outputs of a multi-output customop symbol
    if isinstance(obj, mx.sym.Symbol):
        if params:
            raise TypeError(
                f"check_grad: a Symbol is already built; got parameters "
                f"{sorted(params)} (pass parameters with a symbol function instead)"
            )
        return _symbol_target(obj, "symbol " + repr(obj.name), arrays, ctx)
    if callable(obj):
        names = _function_input_names(obj, len(arrays), params)
        sym = obj(*[mx.sym.var(n) for n in names], **params)
        return _symbol_target(sym, getattr(obj, "__name__", repr(obj)), arrays, ctx)
    raise TypeError(
        f"check_grad checks a customop, an mx.sym.Symbol or a function building "
        f"one; got {type(obj).__name__}"
    )


def _custom_target(op: CustomOperator, arrays, params) -> _Target:
    if op.signature.optional and len(arrays) < len(op.signature.inputs):
        op = op.variant(len(arrays))  # optional inputs left out
    names = list(op.signature.inputs)
    aux = _aux_start(op, names, arrays, params)
    if len(arrays) != len(names) + (len(aux) if len(arrays) > len(names) else 0):
        raise TypeError(
            f"check_grad: customop {errors.shown(op.op_type)!r} takes {len(names)} "
            f"input(s) ({', '.join(names)}), got {len(arrays)}"
        )
    out = _group(op(*[mx.sym.var(n) for n in names], **params))

    # Every evaluation starts from the same auxiliary states (an update in one must not
    # move the next); float64 runs get float64 copies.
    def run64(xs):
        outs = op(*xs, *[a.astype(np.float64) for a in aux], **params)
        return list(outs) if isinstance(outs, tuple) else [outs]

    def run_nd(xs):
        return op(
            *xs, *[mx.nd.array(a, ctx=xs[0].context, dtype=xs[0].dtype) for a in aux], **params
        )

    return _Target(
        repr(op.op_type),
        names,
        out,
        run_nd,
        _float64_errors(op.op_type, run64),
        dict(zip(out.list_auxiliary_states(), aux)),
        op.no_grad,
    )


def _aux_start(op: CustomOperator, names, arrays, params) -> list[np.ndarray]:
    # Given after the inputs, or zeros of the declared shapes.
    if not op.signature.aux:
        return []
    if len(arrays) > len(names):
        return [np.asarray(a) for a in arrays[len(names) :]]
    shapes = kernel.aux_shapes(op, [np.shape(a) for a in arrays[: len(names)]], params)
    dtype = arrays[0].dtype if arrays else np.float32
    return [np.zeros(s, dtype) for s in shapes]


def _symbol_target(sym: mx.sym.Symbol, label: str, arrays, ctx) -> _Target:
    names = sym.list_arguments()
    if len(arrays) != len(names):
        raise TypeError(
            f"check_grad: {label} has arguments {names}; pass {len(names)} "
            f"input(s) in that order, got {len(arrays)}"
        )
    run_nd = None
    if sym.list_inputs() == names:  # no auxiliary states: CachedOp runs it imperatively
        cached = mx.nd.CachedOp(sym)

        def run_nd(xs):
            return cached(*xs)

    ex = bind(sym, names, arrays, ctx, "null", float64=True)

    def run64(xs):
        for n, x in zip(names, xs):
            ex.arg_dict[n][:] = np.reshape(x, ex.arg_dict[n].shape)
        ex.forward(is_train=True)
        return [o.asnumpy() for o in ex.outputs]

    return _Target(label, names, sym, run_nd, _float64_errors(label, run64))


def _function_input_names(fn: Callable, n: int, params: dict[str, Any]) -> list[str]:
    # Name the variables after the function's own parameters (mx.sym.SoftmaxOutput: data,
    # label) when it has them; else after positions.
    try:
        ps = list(inspect.signature(fn).parameters.values())[:n]
    except (TypeError, ValueError):
        ps = []
    if len(ps) == n and all(
        p.kind == p.POSITIONAL_OR_KEYWORD
        and p.name not in params
        and p.name not in ("name", "attr", "out")
        for p in ps
    ):
        return [p.name for p in ps]
    return [f"arg{i}" for i in range(n)]


def _float64_errors(label: str, run64):
    @functools.wraps(run64)
    def wrapped(xs):
        try:
            return run64(xs)
        except Exception as exc:
            errors.add_context(
                exc,
                f"check_grad ran the forward of {label} on float64 inputs "
                "(finite differences need them); a forward that fixes its own "
                "dtype fails there",
            )
            raise

    return wrapped


def _group(out: Any) -> mx.sym.Symbol:
    return mx.sym.Group(list(out)) if isinstance(out, (tuple, list)) else out


def bind(sym, names, arrays, ctx, grad_req, float64=False):
    def dtype(a):
        return np.float64 if float64 and floating(a) else a.dtype

    ex = sym.simple_bind(
        ctx,
        grad_req=grad_req,
        type_dict={n: dtype(a) for n, a in zip(names, arrays)},
        **{n: _mx_shape(a) for n, a in zip(names, arrays)},
    )
    for n, a in zip(names, arrays):
        ex.arg_dict[n][:] = a.reshape(_mx_shape(a)).astype(dtype(a))
    return ex


# ---- the three gradients -----------------------------------------------------------------
def imperative_grads(target: _Target, arrays, heads, wrt, ctx) -> dict[int, np.ndarray]:
    xs = [NumpyMode.to_nd(a, ctx) for a in arrays]
    for i in wrt:
        xs[i].attach_grad()
    with mx.autograd.record():
        outs = target.run_nd(xs)
    outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
    mx.autograd.backward(outs, head_grads=_mx_heads(heads, outs, ctx))
    return {i: xs[i].grad.asnumpy().reshape(arrays[i].shape).astype(np.float64) for i in wrt}


def symbolic_grads(ex, names, arrays, heads, wrt, ctx, aux) -> dict[int, np.ndarray]:
    for name, value in aux.items():
        ex.aux_dict[name][:] = value
    ex.forward(is_train=True)
    ex.backward(out_grads=_mx_heads(heads, ex.outputs, ctx))
    return {
        i: ex.grad_dict[names[i]].asnumpy().reshape(arrays[i].shape).astype(np.float64) for i in wrt
    }


def numeric_grads(run64, arrays, i, eps, heads_list, loss) -> list[np.ndarray]:
    """Central differences of each objective with respect to input ``i``, in float64."""
    xs = with_float64(arrays)
    x = xs[i]
    grads = [np.zeros(x.shape) for _ in heads_list]

    def at(value):
        x[idx] = value
        outs = _as64(run64(xs))
        return outs, (None if loss is None else float(loss(outs, xs)))

    for idx in np.ndindex(*x.shape):
        orig = x[idx]
        (plus, loss_plus), (minus, loss_minus) = at(orig + eps), at(orig - eps)
        x[idx] = orig
        if loss is not None:
            grads[0][idx] = (loss_plus - loss_minus) / (2 * eps)
            continue
        diffs = [p - m for p, m in zip(plus, minus)]
        for g, heads in zip(grads, heads_list):
            g[idx] = sum(np.sum(h * d) for h, d in zip(heads, diffs)) / (2 * eps)
    return grads


def to_numpy(a: Any) -> np.ndarray:
    return a.asnumpy() if isinstance(a, mx.nd.NDArray) else np.asarray(a)


def floating(a) -> bool:
    return np.issubdtype(np.asarray(a).dtype, np.floating)


def _mx_shape(a: np.ndarray) -> tuple[int, ...]:
    return a.shape or (1,)  # legacy MXNet shapes: () means unknown


def with_float64(arrays):
    return [np.array(a, dtype=np.float64) if floating(a) else a for a in arrays]


def _as64(outs) -> list[np.ndarray]:
    return [np.asarray(o, dtype=np.float64) for o in outs]


def name_of(fn) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def _mx_heads(heads, outs, ctx):
    return [
        mx.nd.array(h.reshape(o.shape), ctx=ctx, dtype=o.dtype)
        if np.issubdtype(np.dtype(o.dtype), np.floating)
        else mx.nd.zeros(o.shape, ctx=ctx, dtype=o.dtype)
        for h, o in zip(heads, outs)
    ]
