"""The one place that decides where each input's gradient comes from.

Order, per input: integer inputs get zero; a ``def_grad`` closure wins; else,
when the operator allows it (``auto_grad=True``), an automatic gradient: HIPS
``autograd`` (``make_vjp``) over the forward in ``'numpy'`` mode, ``mx.autograd``
recording the forward again in ``'mxnet'`` mode; else zero (``None``).
"""
from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import mxnet as mx
import numpy as np

from . import errors

if TYPE_CHECKING:
    from .operator import CustomOperator


def compute_all(op: CustomOperator, ans: Any, args: list[Any], g: Any,
                params: dict[str, Any], wanted: list[bool]) -> list[Any | None]:
    """Gradients for every input (``None`` means zero) given upstream gradient ``g``."""
    grads: list[Any | None] = [None] * len(args)
    auto = []
    for i, (arg, want) in enumerate(zip(args, wanted)):
        if not want or not np.issubdtype(op.mode_impl.dtype(arg), np.floating):
            continue
        if i in op.grads:
            grads[i] = _from_closure(op, i, ans, args, g, params)
        elif op.auto_grad:
            auto.append(i)
    if auto:
        found = (_numpy_vjp if op.mode == "numpy" else _mxnet_vjp)(op, auto, ans, args, g, params)
        for i, grad in zip(auto, found):
            grads[i] = grad
    return grads


def _from_closure(op, i, ans, args, g, params):
    name = op.signature.inputs[i]
    try:
        grad = op.grads[i](ans, *args, **params)(g)
    except Exception as exc:
        new = errors.ours(exc, op.op_type, f"gradient for input {name!r}")
        if new is exc:
            raise
        raise new from exc
    if grad is None:  # a forgotten `return`, not a zero gradient
        raise TypeError(
            f"customop {op.op_type!r} (gradient for input {name!r}): the gradient closure "
            "returned None; return the gradient (zeros for none)")
    return grad


def _untraceable(op, argnums, how: str, cause: BaseException | str) -> BaseException:
    names = ", ".join(repr(op.signature.inputs[i]) for i in argnums)
    return errors.op_error(op.op_type, TypeError, (
        f"cannot compute an automatic gradient for input(s) {names}: {cause}. {how} or register "
        "a gradient with def_grad."))


_NUMPY_HOW = ("Write the forward with `import autograd.numpy as np` "
              "(HIPS autograd traces only its wrapped functions)")


def _numpy_vjp(op, argnums, ans, args, g, params):
    import autograd  # imported here: only 'numpy'-mode ops without def_grad need it
    import autograd.builtins

    def traced(*xs):
        out = op.fn(*_substituted(args, argnums, xs), **params)
        # A plain tuple of boxes is invisible to the tracer; autograd's own tuple is not.
        return autograd.builtins.tuple(out) if isinstance(out, (tuple, list)) else out

    heads = _ones_like_outputs(ans) if g is None else g
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)  # "Output seems independent of input"
            vjp, _ = autograd.make_vjp(traced, tuple(range(len(argnums))))(
                *[args[i] for i in argnums])
            found = vjp(heads)
    except UserWarning as w:
        raise _untraceable(op, argnums, _NUMPY_HOW, f"the output does not depend on them "
                           f"through autograd.numpy ({w})") from None
    except Exception as exc:
        if errors.names_op(str(exc), op.op_type):
            raise
        raise _untraceable(op, argnums, _NUMPY_HOW, f"{type(exc).__name__}: {exc}") from exc
    return [np.asarray(x) for x in found]


def _mxnet_vjp(op, argnums, ans, args, g, params):
    xs = [args[i].copy() for i in argnums]
    for x in xs:
        x.attach_grad()
    how = "Write the forward with differentiable mx.nd operators (no asnumpy)"
    try:
        with mx.autograd.record():
            outs = op.fn(*_substituted(args, argnums, xs), **params)
        outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
        heads = [mx.nd.ones_like(o) for o in outs] if g is None else (
            list(g) if isinstance(g, (tuple, list)) else [g])
        mx.autograd.backward(outs, head_grads=heads)
        return [x.grad for x in xs]
    except mx.base.MXNetError as exc:
        raise _untraceable(op, argnums, how, errors.mxnet_text(exc)) from exc
    except Exception as exc:
        new = errors.ours(exc, op.op_type, "automatic gradient")
        if new is exc:
            raise
        raise new from exc


def _substituted(args, argnums, xs):
    # The forward's inputs with those being differentiated replaced by traced copies.
    full = list(args)
    for i, x in zip(argnums, xs):
        full[i] = x
    return full


def _ones_like_outputs(ans):
    if isinstance(ans, tuple):
        return tuple(np.ones_like(a) for a in ans)
    return np.ones_like(ans)
