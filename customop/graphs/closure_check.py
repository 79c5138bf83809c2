"""Comparing an operator's training graph with its gradient closures, on values.

:mod:`customop.graphs.backward` builds a ``def_grad`` op's training graph; this
module says whether MXNet's gradients of it are the closures': it runs the
graph (:func:`run_graph`) and the closures (:func:`closure_gradients`) on the
same values and compares them (:func:`mismatch`), and picks values on which the
op's own checks pass (:func:`passing`).
"""

from __future__ import annotations

import mxnet as mx
import numpy as np

from .. import kernel, symbol_json
from ..nd_copies import ndarray
from ..runtime import hooks
from ..symbol_json import NativeGraph
from . import compare, trace


def run_graph(
    graph: NativeGraph, inputs: list[np.ndarray], head_grads: list[np.ndarray]
) -> tuple[list[np.ndarray], list[np.ndarray | None]]:
    """The graph's outputs and MXNet's gradients of its inputs for these head gradients."""
    names = [f"input{i}" for i in range(len(inputs))]
    sym, cached = symbol_json.cached_op(symbol_json.to_json(graph, names))
    arrays = {nm: ndarray(v) for nm, v in zip(names, inputs)}
    for a in arrays.values():
        if np.issubdtype(a.dtype, np.floating):
            a.attach_grad()
    used = sym.list_inputs()
    with mx.autograd.record():
        outs = cached(*[arrays[nm] for nm in used])
    outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    if any(arrays[nm].grad is not None for nm in used):  # (no floating input: no gradient)
        mx.autograd.backward(outs, head_grads=[ndarray(g) for g in head_grads])
    grads = [
        arrays[nm].grad.asnumpy() if nm in used and arrays[nm].grad is not None else None
        for nm in names
    ]
    return [o.asnumpy() for o in outs], grads


def closure_gradients(op, params, inputs: list[np.ndarray], head_grads=None):
    """The operator's outputs and the gradients its closures (and MXNet) give.

    ``head_grads``: one per output, or a function of the outputs giving them.
    """
    xs = [ndarray(v) for v in inputs]
    # As traced: checks that read values back are skipped (is_tracing()), so placeholder
    # labels and scales compare like any other value.
    with hooks.tracing(trace.Log(recorded=False)):
        outs, saved = kernel.run_forward_saving(op, xs, dict(params))
        if callable(head_grads):
            head_grads = head_grads([o.asnumpy() for o in outs])
        gs = [ndarray(g) for g in head_grads]
        grads = kernel.run_backward(op, xs, outs, gs, dict(params), [True] * len(xs), saved)
    return (
        [o.asnumpy() for o in outs],
        [
            None if g is None else (g.asnumpy() if isinstance(g, mx.nd.NDArray) else np.asarray(g))
            for g in grads
        ],
        head_grads,
    )


def _tolerance(dtype) -> float:
    return {np.dtype(np.float16): 1e-2, np.dtype(np.float64): 1e-9}.get(np.dtype(dtype), 2e-4)


def mismatch(
    op,
    params,
    graph: NativeGraph,
    inputs: list[np.ndarray],
    seed: int = 11,
    tolerance: float | None = None,
) -> str:
    """ "" when the graph's outputs and MXNet's gradients equal the op's; else what differs."""
    rng = np.random.RandomState(seed)
    try:
        want_out, want, heads = closure_gradients(
            op,
            params,
            inputs,
            lambda outs: [rng.uniform(-1, 1, o.shape).astype(o.dtype) for o in outs],
        )
    except Exception as exc:  # noqa: BLE001 - a failing closure is the reason
        return f"its forward or gradient failed on these values ({type(exc).__name__}: {exc})"
    return _compared(op, graph, inputs, want_out, want, heads, tolerance)


def replayed(op, graph: NativeGraph, inputs: list[np.ndarray], rec: trace.Recording) -> str | None:
    """:func:`mismatch` of a graph alike to the one built from ``rec`` (a recording of the
    forward and closures on ``inputs``), with what that run gave as the op's values.

    The recording ran the forward and every closure on ``inputs`` once, for a random head
    gradient ``g`` (its variable's values): its outputs are the forward's outputs and the
    closures' gradients for that ``g``, the values :func:`closure_gradients` would compute
    again, as :meth:`customop.graphs.forward.ForwardGraph.differs_at` compares a forward's
    graph with its recording's outputs.  None where the recording cannot stand for that
    run: a failed ``require`` check (there the run raises, the recording is NaN), or an
    input whose gradient MXNet takes through the forward (not recorded); then
    :func:`mismatch` runs the op again.
    """
    done = rec.closures
    if done is None or not rec.held or _differentiated(op, inputs):
        return None
    n_out = len(rec.heads) - len(done.picks)
    want_out = rec.outputs[:n_out]
    want: list[np.ndarray | None] = [None] * len(inputs)
    for (i, _), grad in zip(done.picks, rec.outputs[n_out:]):
        want[i] = grad
    if done.heads:
        heads = [g.asnumpy() for g in done.heads]
    else:  # an output layer's closures take no g: any head gradient, as mismatch draws it
        rng = np.random.RandomState(11)
        heads = [rng.uniform(-1, 1, o.shape).astype(o.dtype) for o in want_out]
    return _compared(op, graph, inputs, want_out, want, heads, None)


def _differentiated(op, inputs: list[np.ndarray]) -> bool:
    # whether an input mismatch compares gets MXNet's gradient of the forward (no closure)
    names = op.signature.inputs
    return op.auto_grad and any(
        names[i] not in op.no_grad
        and np.issubdtype(v.dtype, np.floating)
        and i not in op.grads
        and i not in op.grad_groups
        for i, v in enumerate(inputs)
    )


def _compared(op, graph, inputs, want_out, want, heads, tolerance) -> str:
    got_out, got = run_graph(graph, inputs, heads)
    # Where the forward is inf, h(0) = inf * 0 makes NaN: equal there is "not finite" too.
    got_out = [
        np.where(~np.isfinite(w) & ~np.isfinite(gv), w, gv)
        if gv.shape == w.shape and np.issubdtype(w.dtype, np.floating)
        else gv
        for gv, w in zip(got_out, want_out)
    ]
    if not compare.close(got_out, want_out):
        return "its graph does not give the forward's outputs"
    names = op.signature.inputs
    for i, (w, g) in enumerate(zip(want, got)):
        if names[i] in op.no_grad or not np.issubdtype(inputs[i].dtype, np.floating):
            continue
        w = np.zeros_like(inputs[i]) if w is None else np.asarray(w).reshape(inputs[i].shape)
        g = np.zeros_like(inputs[i]) if g is None else g.reshape(inputs[i].shape)
        tol = tolerance or _tolerance(inputs[i].dtype)
        finite = np.abs(w[np.isfinite(w)])
        scale = max(1.0, float(finite.max()) if finite.size else 1.0)
        if not np.allclose(g, w, rtol=tol, atol=tol * scale, equal_nan=True):
            diff = np.abs(g - w)
            numbers = diff[~np.isnan(diff)]  # (np.nanmax of only NaN warns in the user's process)
            return (
                f"MXNet's gradient of its transposed closure differs from the closure's for "
                f"input {names[i]!r} (max difference "
                f"{f'{numbers.max():.3g}' if numbers.size else 'NaN against numbers'})"
            )
    return ""


def passing(op, params, first: list[np.ndarray]) -> list[np.ndarray]:
    """``first`` with the inputs that get no gradient (labels, indices, scales) set so that
    the op's own checks pass, when placeholders fail them.

    The closures are compared with MXNet's gradient on these values (the fixed inputs
    keep them): on values that fail a ``customop.require`` check, the forward raises
    in Python and the graph gives NaN, which compares nothing.  Tried in order: the
    placeholders, then every fixed input all 1, all 0, alternating 0 and 1.  When none
    passes, ``first`` is returned and the comparison names the failure.  Only the
    signature decides (never the values a graph will see): the verdict is cached by it.
    """
    for values in candidates(op, first):
        try:
            closure_gradients(op, params, values, lambda outs: [np.ones_like(o) for o in outs])
        except Exception:  # noqa: BLE001 - a check failed on these values: try the next
            continue
        return values
    return list(first)


def candidates(op, first: list[np.ndarray]) -> list[list[np.ndarray]]:
    """The values :func:`passing` tries, in its order."""
    fixed = [
        i
        for i, (name, v) in enumerate(zip(op.signature.inputs, first))
        if name in op.no_grad or not np.issubdtype(v.dtype, np.floating)
    ]
    fills = [
        lambda v: np.ones_like(v),
        lambda v: np.zeros_like(v),
        lambda v: (np.arange(v.size) % 2).reshape(v.shape).astype(v.dtype),
    ]
    return [list(first)] + (
        [[fill(v) if i in fixed else v for i, v in enumerate(first)] for fill in fills]
        if fixed
        else []
    )
