"""Comparing an operator's training graph with its gradient closures, on values.

:mod:`customop.graphs.transposed` builds a ``def_grad`` op's training graph; this
module says whether MXNet's gradients of it are the closures': it runs the
graph (:func:`run_graph`) and the closures (:func:`closure_gradients`) on the
same values and compares them (:func:`mismatch`), picks values on which the
op's own checks pass (:func:`passing`), finds when the forward alone will do
(:func:`forward_alone`), and checks the graph at other shapes and dtypes.
"""
from __future__ import annotations

from typing import Any

import mxnet as mx
import numpy as np

from ..runtime import trace as hooks
from . import compare, graph_json, native, trace


def run_graph(graph: native.NativeGraph, inputs: list[np.ndarray], head_grads: list[np.ndarray]
              ) -> tuple[list[np.ndarray], list[np.ndarray | None]]:
    """The graph's outputs and MXNet's gradients of its inputs for these head gradients."""
    names = [f"input{i}" for i in range(len(inputs))]
    sym = graph_json.load(graph_json.to_json(graph, names))
    arrays = {nm: mx.nd.array(v, dtype=v.dtype) for nm, v in zip(names, inputs)}
    for a in arrays.values():
        if np.issubdtype(a.dtype, np.floating):
            a.attach_grad()
    used = sym.list_inputs()
    cached = mx.nd.CachedOp(sym)
    with mx.autograd.record():
        outs = cached(*[arrays[nm] for nm in used])
    outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    mx.autograd.backward(outs, head_grads=[mx.nd.array(g, dtype=g.dtype) for g in head_grads])
    grads = [arrays[nm].grad.asnumpy() if nm in used and arrays[nm].grad is not None else None
             for nm in names]
    return [o.asnumpy() for o in outs], grads


class _Unrecorded(trace._Log):
    """A trace log for running an op eagerly as traced (is_tracing()), outside record()."""

    def pause_enter(self) -> None:
        pass

    def pause_exit(self) -> None:
        pass


def closure_gradients(op, params, inputs: list[np.ndarray], head_grads=None):
    """The operator's outputs and the gradients its closures (and MXNet) give.

    ``head_grads``: one per output, or a function of the outputs giving them.
    """
    from .. import kernel

    xs = [mx.nd.array(v, dtype=v.dtype) for v in inputs]
    # As traced: checks that read values back are skipped (is_tracing()), so placeholder
    # labels and scales compare like any other value.
    with hooks.tracing(_Unrecorded()):
        outs, saved = kernel.run_forward_saving(op, xs, dict(params))
        if callable(head_grads):
            head_grads = head_grads([o.asnumpy() for o in outs])
        gs = [mx.nd.array(g, dtype=g.dtype) for g in head_grads]
        grads = kernel.run_backward(op, xs, outs, gs, dict(params), [True] * len(xs), saved)
    return ([o.asnumpy() for o in outs],
            [None if g is None else (g.asnumpy() if isinstance(g, mx.nd.NDArray)
                                     else np.asarray(g)) for g in grads], head_grads)


def _tolerance(dtype) -> float:
    return {np.dtype(np.float16): 1e-2, np.dtype(np.float64): 1e-9}.get(np.dtype(dtype), 2e-4)


def mismatch(op, params, graph: native.NativeGraph, inputs: list[np.ndarray],
             seed: int = 11, tolerance: float | None = None) -> str:
    """"" when the graph's outputs and MXNet's gradients equal the op's; else what differs."""
    rng = np.random.RandomState(seed)
    try:
        want_out, want, heads = closure_gradients(op, params, inputs, lambda outs: [
            rng.uniform(-1, 1, o.shape).astype(o.dtype) for o in outs])
    except Exception as exc:  # noqa: BLE001 - a failing closure is the reason
        return f"its forward or gradient failed on these values ({type(exc).__name__}: {exc})"
    got_out, got = run_graph(graph, inputs, heads)
    # Where the forward is inf, h(0) = inf * 0 makes NaN: equal there is "not finite" too.
    got_out = [np.where(~np.isfinite(w) & ~np.isfinite(gv), w, gv) if gv.shape == w.shape
               and np.issubdtype(w.dtype, np.floating) else gv
               for gv, w in zip(got_out, want_out)]
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
            return (f"MXNet's gradient of its transposed closure differs from the closure's for "
                    f"input {names[i]!r} (max difference {np.nanmax(np.abs(g - w)):.3g})")
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
    fixed = [i for i, (name, v) in enumerate(zip(op.signature.inputs, first))
             if name in op.no_grad or not np.issubdtype(v.dtype, np.floating)]
    fills = [lambda v: np.ones_like(v), lambda v: np.zeros_like(v),
             lambda v: (np.arange(v.size) % 2).reshape(v.shape).astype(v.dtype)]
    candidates = [list(first)] + ([[fill(v) if i in fixed else v for i, v in enumerate(first)]
                                   for fill in fills] if fixed else [])
    for values in candidates:
        try:
            closure_gradients(op, params, values, lambda outs: [np.ones_like(o) for o in outs])
        except Exception:  # noqa: BLE001 - a check failed on these values: try the next
            continue
        return values
    return list(first)


MAGNITUDES = (-2.0, 3.0)  # log10 range of the values closure and MXNet's gradient meet on


def forward_alone(op, params, shapes, dtypes, first) -> native.NativeGraph | None:
    """The forward's own training graph, when MXNet's gradient of it is the closures'.

    Then nothing is transposed and the op costs what its forward's operators cost
    (e.g. a def_grad ``x * x``).  The closures and MXNet's gradient of the forward
    are compared on the traced values and on values of both signs spread from
    1e-2 to 1e3 in magnitude (inputs that get no gradient keep theirs), and at a
    grown shape, to float32 rounding; any difference (a closure that clips,
    rescales or passes gradients straight through) keeps the transposed closure.
    """
    if not op.need_top_grad:
        return None
    try:
        plain = native.Tracer(op, params, native.TRAIN).graph(shapes, dtypes, first)
    except Exception:  # noqa: BLE001 - the forward alone does not inline: transpose
        return None
    fixed = set(op.no_grad)
    trials = [list(first)]
    for seed in range(4):
        r = np.random.RandomState(100 + seed)
        trials.append([v if name in fixed or not np.issubdtype(v.dtype, np.floating) else
                       (np.sign(r.uniform(-1, 1, v.shape)) * 10 ** r.uniform(
                           *MAGNITUDES, v.shape)).astype(v.dtype)
                       for name, v in zip(op.signature.inputs, first)])
    bigger = next(iter(native.other_shapes(shapes)), None)
    if bigger is not None:
        trials.append(grown(first, bigger))
    for k, values in enumerate(trials):
        if mismatch(op, params, plain, values, seed=21 + k, tolerance=2e-5):
            return None
    plain.note = "MXNet's gradient of its forward equals its gradient closure's"
    return plain


def generality(b: Any, graph, shapes, first) -> str:
    tried = []
    for other in native.other_shapes(shapes):
        values = grown(first, other)
        try:
            alt = b.build(values, other)
        except Exception as exc:  # noqa: BLE001 - the op refuses this shape
            tried.append(f"{native.shapes_text(other)}: {type(exc).__name__}")
            continue
        diff = compare.difference(graph, alt)
        if diff:
            return f"{diff} at input shapes {native.shapes_text(other)}"
        wrong = mismatch(b.op, b.params, graph, values)
        if wrong:
            return f"{wrong} at input shapes {native.shapes_text(other)}"
        return ""
    return ("not checked: the forward refused every other input shape tried ("
            + "; ".join(tried) + ")")


def grown(values, shapes) -> list[np.ndarray]:
    """``values`` resized to ``shapes`` by repeating their entries (labels stay labels)."""
    out = []
    for v, shape in zip(values, shapes):
        for axis, d in enumerate(shape):
            if v.shape[axis] != d:
                v = np.take(v, np.arange(d) % v.shape[axis], axis=axis)
        out.append(np.ascontiguousarray(v))
    return out


def dtype_generic(b: Any, graph, shapes, dtypes, first) -> bool:
    other = tuple(np.dtype(np.float64 if d == np.float32 else np.float32)
                  if np.issubdtype(d, np.floating) else d for d in dtypes)
    if other == tuple(dtypes):
        return True
    try:
        alt = b.build([v.astype(d) for v, d in zip(first, other)], shapes)
    except Exception:  # noqa: BLE001 - then calls are keyed by dtype
        return False
    return not compare.difference(graph, alt)
