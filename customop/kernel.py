"""Running an operator on arrays: the forward, the backward, aux write-back, and checking results.

Every call path (direct, recorded, ``mx.nd.Custom``, graphs) ends here with
MXNet's arrays or the mode's arrays in hand; nothing in this module decides
*how* a call reaches MXNet (that is :mod:`customop.dispatch` and
:mod:`customop.prop`).
"""

from __future__ import annotations

from typing import Any

import mxnet as mx
import numpy as np

from . import errors, gradients, opinfo, value_checks
from .intermediates import residuals
from .modes import BFLOAT16, MODES


def run_forward(
    op: opinfo.Forward, args: list[Any], params: dict[str, Any], where: str = "forward"
) -> list[Any]:
    """Call the forward on mode arrays; return its outputs as a validated list."""
    return run_forward_saving(op, args, params, where)[0]


def run_forward_saving(
    op: opinfo.Forward, args: list[Any], params: dict[str, Any], where: str = "forward"
) -> tuple[list[Any], dict[str, Any]]:
    """The forward's outputs (validated) and the residuals it handed to its closures."""
    try:
        with value_checks.running(op.op_type):
            result = op.fn(*args, **params)
    except Exception as exc:
        empty = _empty_input(op, args)
        if empty is not None and isinstance(exc, mx.base.MXNetError):
            errors.raise_as(errors.empty_batch(exc, op.op_type, empty), exc)
        errors.reraise(exc, op.op_type, where)
    saved: dict[str, Any] = {}
    if isinstance(result, residuals):
        result, saved = result.outputs, result.saved
        _check_residual_names(op, saved)
    return check_outputs(op, result, params), saved


def _empty_input(op: opinfo.Forward, args: list[Any]) -> str | None:
    # The first input with a 0-size array, if any (MXNet's operators refuse those).
    for name, a in zip(op.signature.inputs, args):
        if getattr(a, "size", None) == 0:
            return name
    return None


def forward_nd(
    op: opinfo.Forward, arrays: list[mx.nd.NDArray], params: dict[str, Any], wait: bool
) -> tuple[list[Any], list[Any], dict[str, Any]]:
    """The forward on MXNet's arrays (inputs, then aux states), storing aux updates.

    Returns the mode arrays it ran on, its outputs and its residuals.  ``wait``:
    finish the aux writes before returning (needed on MXNet's worker threads).
    """
    args = [op.mode_impl.from_nd(a) for a in arrays]
    outs, saved = run_forward_saving(op, args, params)
    n = len(op.signature.inputs)
    if op.signature.aux:
        write_back(op.mode, arrays[n:], args[n:], wait)
    return args, outs, saved


def backward_nd(
    op: opinfo.Differentiable,
    args: list[Any],
    aux: list[mx.nd.NDArray],
    outs: list[Any],
    out_grads: list[Any] | None,
    params: dict[str, Any],
    reqs: list[str],
    in_grads: list[mx.nd.NDArray],
    saved: dict[str, Any] | None = None,
) -> None:
    """Gradients into MXNet's buffers ``in_grads`` per ``reqs``, storing aux updates.

    ``args`` are the inputs as mode arrays; the aux states are read as they are now.
    ``saved``: the forward's residuals, ``None`` where none were kept.
    Runs on MXNet's worker threads, so aux writes are finished before returning.
    """
    mode = op.mode_impl
    states = [mode.from_nd(a) for a in aux]
    grads = run_backward(
        op, [*args, *states], outs, out_grads, params, [r != "null" for r in reqs], saved
    )
    if aux:
        write_back(op.mode, aux, states, wait=True)
    for dst, req, grad in zip(in_grads, reqs, grads):
        if grad is not None:
            mode.assign(dst, req, grad)
        elif req in ("write", "inplace"):
            dst[:] = 0


def run_backward(
    op: opinfo.Differentiable,
    args: list[Any],
    outs: list[Any],
    out_grads: list[Any] | None,
    params: dict[str, Any],
    wanted: list[bool],
    saved: dict[str, Any] | None = None,
) -> list[Any | None]:
    """Gradients for each input (``None`` means zero); see :mod:`customop.gradients`.

    ``args``: inputs then aux states, as mode arrays.  ``saved``: the forward's
    residuals; ``None``: none were kept, so a closure asking for one gets them from
    the forward run again (on copies of the aux states, which it must not move).
    """
    single = op.outputs.of(params) == 1
    ans = outs[0] if single else tuple(outs)
    g = None
    if op.need_top_grad and out_grads is not None:
        g = out_grads[0] if single else tuple(out_grads)
    n = len(op.signature.inputs)
    wanted = [*wanted[:n], *[False] * (len(args) - n)]
    if saved is None:
        found: list[dict[str, Any]] = []

        def fetch() -> dict[str, Any]:
            if not found:
                copies = [*args[:n], *[op.mode_impl.copy(s) for s in args[n:]]]
                found.append(
                    run_forward_saving(op, copies, params, "forward (run again for its residuals)")[
                        1
                    ]
                )
            return found[0]
    else:

        def fetch() -> dict[str, Any]:
            return saved

    grads = gradients.compute_all(op, ans, args, g, params, wanted, fetch)[:n]
    return [
        None if grad is None else _checked_grad(op, i, arg, grad)
        for i, (arg, grad) in enumerate(zip(args, grads))
    ]


def write_back(mode_name: str, dst: list[mx.nd.NDArray], values: list[Any], wait: bool) -> None:
    """Store the (possibly updated) aux values into MXNet's arrays.

    ``'numpy'`` mode copies the host arrays back; in ``'mxnet'`` mode the values
    are those NDArrays, updated in place.  ``wait``: finish the writes now (on
    MXNet's worker threads nothing else orders them).
    """
    for nd, value in zip(dst, values):
        if nd.dtype == BFLOAT16:  # computed on a float32 copy (modes.widened)
            MODES[mode_name].assign(nd, "write", value)
        elif mode_name == "numpy":
            nd[:] = np.asarray(value).reshape(nd.shape).astype(nd.dtype, copy=False)
        if wait:
            nd.wait_to_read()


def aux_shapes(
    op: opinfo.Forward, input_shapes: list[tuple[int, ...]], params: dict[str, Any]
) -> list[tuple[int, ...]]:
    """The shape of every auxiliary state for inputs of these shapes."""
    out = []
    for name in op.signature.aux:
        try:
            shape = op.aux_shape_fns[name](*[tuple(s) for s in input_shapes], **params)
            shape = (
                (int(shape),)
                if isinstance(shape, (int, np.integer))
                else tuple(int(d) for d in shape)
            )
        except Exception as exc:
            errors.reraise(exc, op.op_type, f"shape of auxiliary state {name!r}")
        out.append(shape)
    return out


def aux_dtype_for(dtypes) -> np.dtype:
    """The dtype of an op's aux states: its first floating input's (float32 without one)."""
    return next((np.dtype(d) for d in dtypes if floating(d)), np.dtype(np.float32))


def floating(dtype) -> bool:
    """Whether ``dtype`` is a float one, MXNet's ``bfloat16`` (a structured dtype) too."""
    dtype = np.dtype(dtype)  # (kind "f": np.issubdtype's answer, at a tenth of its cost)
    return dtype.kind == "f" or dtype == BFLOAT16


def check_aux(op: opinfo.Forward, arrays: list[Any], params: dict[str, Any]) -> None:
    """Raise unless the auxiliary states given with the inputs have the declared shape."""
    n = len(op.signature.inputs)
    if not op.signature.aux:
        return
    if len(arrays) == n:
        raise errors.op_error(
            op.op_type,
            TypeError,
            (
                f"auxiliary state(s) {', '.join(op.signature.aux)} missing; with arrays, pass them "
                "after the inputs (they are updated in place). Only Symbol calls may leave them "
                "out."
            ),
        )
    shapes = aux_shapes(op, [np.shape(a) for a in arrays[:n]], params)
    dtype = aux_dtype_for([_dtype(a) for a in arrays[:n]])
    for name, a, want in zip(op.signature.aux, arrays[n:], shapes):
        got = np.shape(a)
        if got != tuple(want):
            raise errors.op_error(
                op.op_type,
                ValueError,
                (
                    f"auxiliary state {name!r} has shape {got}, but for these inputs it must be "
                    f"{tuple(want)}"
                ),
            )
        if _dtype(a) != dtype:
            # MXNet's type pass refuses it too, naming nothing ("Type inconsistent")
            raise errors.op_error(
                op.op_type,
                TypeError,
                (
                    f"{name} (an auxiliary state) has dtype {_dtype(a).name}, but for these inputs "
                    f"it must be {dtype.name}: an op's aux states take the dtype of its first "
                    f"floating input (float32 without one); pass {name}.astype({dtype.name!r})"
                ),
            )


def _dtype(a: Any) -> np.dtype:
    return np.dtype(getattr(a, "dtype", None) or np.asarray(a).dtype)


def _check_residual_names(op: opinfo.Forward, saved: dict[str, Any]) -> None:
    taken = set(op.signature.arrays) | set(op.signature.param_names) | {"ans"}
    clash = sorted(taken & set(saved))
    if clash:
        raise errors.op_error(
            op.op_type,
            TypeError,
            (
                f"residual(s) {', '.join(map(repr, clash))} share a name with the op's inputs or "
                "parameters (or 'ans'); gradient closures receive residuals by name, so rename them"
            ),
        )


def detached(saved: dict[str, Any]) -> dict[str, Any]:
    """Residuals with NDArrays detached from autograd (a node must not hold itself)."""

    def one(v):
        if isinstance(v, mx.nd.NDArray):
            return v.detach()
        if type(v) in (tuple, list):
            return type(v)(one(x) for x in v)
        return v

    return {k: one(v) for k, v in saved.items()}


def check_outputs(op: opinfo.Forward, result: Any, params: dict[str, Any]) -> list[Any]:
    """The forward's result as a list of as many arrays of the op's mode as the op declares
    for these parameters."""
    n = op.outputs.of(params)
    if isinstance(result, (tuple, list)):
        if n == 1:
            raise errors.op_error(
                op.op_type,
                TypeError,
                (
                    f"forward returned a {type(result).__name__} of {len(result)} values but "
                    f"{op.outputs.mismatch(len(result), params)}"
                ),
            )
        outs = list(result)
    else:
        outs = [result]
    if len(outs) != n:
        msg = f"forward returned {len(outs)} output(s) but {op.outputs.mismatch(len(outs), params)}"
        raise errors.op_error(op.op_type, TypeError, msg)
    return [_checked_array(op, o, f"output {i}") for i, o in enumerate(outs)]


def _checked_array(op: opinfo.Forward, value: Any, what: str) -> Any:
    if op.mode == "mxnet":
        if not isinstance(value, mx.nd.NDArray):
            msg = (
                f"{what} is a {type(value).__name__}; in 'mxnet' mode return mx.nd.NDArray "
                "(or decorate with 'numpy')"
            )
            raise errors.op_error(op.op_type, TypeError, msg)
        return value
    if isinstance(value, mx.nd.NDArray):
        raise errors.op_error(
            op.op_type,
            TypeError,
            (
                f"{what} is an mx.nd.NDArray; in 'numpy' mode return numpy arrays (or decorate "
                "with 'mxnet')"
            ),
        )
    arr = np.asarray(value)
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_):
        raise errors.op_error(
            op.op_type,
            TypeError,
            (
                f"{what} is a {type(value).__name__} (dtype {arr.dtype}); return numeric numpy "
                "arrays"
            ),
        )
    return arr


def _checked_grad(op: opinfo.Forward, i: int, arg: Any, grad: Any) -> Any:
    name = op.signature.inputs[i]
    grad = _checked_array(op, grad, f"the gradient for input {name!r} (argnum {i})")
    want, got = op.mode_impl.shape(arg), op.mode_impl.shape(grad)
    if tuple(want) != tuple(got) and not (np.prod(want) == 1 == np.prod(got)):
        raise errors.op_error(
            op.op_type,
            ValueError,
            (
                f"the gradient for input {name!r} (argnum {i}) has shape {tuple(got)} but "
                f"the input has shape {tuple(want)}"
            ),
        )
    return grad
