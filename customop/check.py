"""Gradient checking through MXNet itself: ``check_grad`` and ``python -m customop.check``.

For every floating input :func:`check_grad` compares three gradients:

* **numeric**: central finite differences of the forward evaluated in float64;
* **imperative**: ``mx.nd`` arrays, ``attach_grad``, ``mx.autograd.record()``,
  ``backward(heads)``;
* **symbolic**: a bound executor, ``forward(is_train=True)``,
  ``backward(out_grads=heads)``.

The objective is ``sum_i sum(head_i * output_i)`` with random head gradients.
An output (loss) layer, e.g. ``need_top_grad=False``, ignores its head
gradient, so its gradient is checked with ones heads (the gradient of
``sum(outputs)``), or against ``loss=`` when its output is not the loss
(``SoftmaxOutput`` outputs probabilities).  ``mx.test_utils.check_numeric_gradient``
cannot check such layers: it projects the output on random heads the layer never sees.

The command line runs the same check on random inputs::

    python -m customop.check my_ops:focal --shape x=4,5 --shape y=4 \\
        --dtype y=int32 --int-high y=5 --param alpha=0.25
"""
from __future__ import annotations

import argparse
import ast
import functools
import importlib
import inspect
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import mxnet as mx
import numpy as np

from .modes import NumpyMode
from .operator import CustomOperator

__all__ = ["check_grad", "GradReport", "GradRow", "Tolerance", "TOLERANCES", "main"]

Loss = Callable[[list[np.ndarray], list[np.ndarray]], float]


@dataclass(frozen=True)
class Tolerance:
    """Finite-difference step and the allowed error ``atol + rtol * |reference|``."""

    eps: float
    rtol: float
    atol: float


# The forward of the numeric side always runs in float64; these follow the
# precision in which MXNet computes the gradients being checked.
TOLERANCES: dict[np.dtype, Tolerance] = {
    np.dtype(np.float16): Tolerance(eps=1e-3, rtol=1e-2, atol=1e-2),
    np.dtype(np.float32): Tolerance(eps=1e-4, rtol=1e-3, atol=1e-5),
    np.dtype(np.float64): Tolerance(eps=1e-6, rtol=1e-5, atol=1e-8),
}

COMPARISONS = ("imperative vs numeric", "symbolic vs numeric", "imperative vs symbolic")
INTEGER_SKIP = "skipped: integer input, not differentiable"
ARGNUM_SKIP = "skipped: not in argnums"


@dataclass
class GradRow:
    """One input and one comparison (or why the input was skipped)."""

    input: str
    shape: tuple[int, ...]
    dtype: str
    comparison: str = ""
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    worst_index: tuple[int, ...] | None = None
    status: str = "ok"
    tolerance: Tolerance | None = None

    @property
    def passed(self) -> bool:
        return self.status != "FAIL"

    @property
    def skipped(self) -> bool:
        return self.status.startswith("skipped")


@dataclass
class GradReport:
    """What :func:`check_grad` compared; ``str(report)`` is an aligned table."""

    target: str
    heads: str
    rows: list[GradRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(row.passed for row in self.rows)

    def row(self, input: str, comparison: str = "") -> GradRow:
        """The row for ``input`` (and ``comparison``; any row when empty)."""
        for r in self.rows:
            if r.input == input and (not comparison or r.comparison == comparison):
                return r
        raise KeyError((input, comparison))

    def __str__(self) -> str:
        verdict = "passed" if self.passed else "FAILED"
        lines = [f"check_grad {self.target}: {verdict} (heads: {self.heads})"]
        lines += _table(["input", "shape", "dtype", "comparison", "max abs err",
                         "max rel err", "worst index", "status"],
                        [_cells(r) for r in self.rows])
        tols = sorted({(r.dtype, r.tolerance) for r in self.rows if r.tolerance is not None},
                      key=lambda dt: dt[0])
        lines += [f"{dtype}: eps={t.eps:g} rtol={t.rtol:g} atol={t.atol:g}"
                  for dtype, t in tols]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


# ---- what is being checked ---------------------------------------------------------------
@dataclass
class _Target:
    label: str
    names: list[str]
    symbol: mx.sym.Symbol
    run_nd: Callable[[list[mx.nd.NDArray]], Any] | None  # imperative call, None: not available
    run64: Callable[[list[np.ndarray]], list[np.ndarray]]  # float64 forward on NumPy arrays
    aux: dict[str, np.ndarray] = field(default_factory=dict)  # symbol aux name -> start value


def _target(obj: Any, arrays: list[np.ndarray], params: dict[str, Any], ctx) -> _Target:
    if isinstance(obj, CustomOperator):
        return _custom_target(obj, arrays, params)
    if isinstance(obj, tuple | list) and obj and all(isinstance(s, mx.sym.Symbol) for s in obj):
        obj = mx.sym.Group(list(obj))  # the outputs of a multi-output customop symbol
    if isinstance(obj, mx.sym.Symbol):
        if params:
            raise TypeError(f"check_grad: a Symbol is already built; got parameters "
                            f"{sorted(params)} (pass parameters with a symbol function instead)")
        return _symbol_target(obj, "symbol " + repr(obj.name), arrays, ctx)
    if callable(obj):
        names = _function_input_names(obj, len(arrays), params)
        sym = obj(*[mx.sym.var(n) for n in names], **params)
        return _symbol_target(sym, getattr(obj, "__name__", repr(obj)), arrays, ctx)
    raise TypeError(f"check_grad checks a customop, an mx.sym.Symbol or a function building "
                    f"one; got {type(obj).__name__}")


def _custom_target(op: CustomOperator, arrays, params) -> _Target:
    if op.signature.optional and len(arrays) < len(op.signature.inputs):
        op = op.variant(len(arrays))  # optional inputs left out
    names = list(op.signature.inputs)
    aux = _aux_start(op, names, arrays, params)
    if len(arrays) != len(names) + (len(aux) if len(arrays) > len(names) else 0):
        raise TypeError(f"check_grad: customop {op.op_type!r} takes {len(names)} input(s) "
                        f"({', '.join(names)}), got {len(arrays)}")
    out = _group(op(*[mx.sym.var(n) for n in names], **params))

    # Every evaluation starts from the same auxiliary states (an update in one must not
    # move the next); float64 runs get float64 copies.
    def run64(xs):
        outs = op(*xs, *[a.astype(np.float64) for a in aux], **params)
        return list(outs) if isinstance(outs, tuple) else [outs]

    def run_nd(xs):
        return op(*xs, *[mx.nd.array(a, ctx=xs[0].context, dtype=xs[0].dtype) for a in aux],
                  **params)

    return _Target(repr(op.op_type), names, out, run_nd, _float64_errors(op.op_type, run64),
                   dict(zip(out.list_auxiliary_states(), aux)))


def _aux_start(op: CustomOperator, names, arrays, params) -> list[np.ndarray]:
    # Given after the inputs, or zeros of the declared shapes.
    if not op.signature.aux:
        return []
    if len(arrays) > len(names):
        return [np.asarray(a) for a in arrays[len(names):]]
    shapes = op.aux_shapes([np.shape(a) for a in arrays[:len(names)]], params)
    dtype = arrays[0].dtype if arrays else np.float32
    return [np.zeros(s, dtype) for s in shapes]


def _symbol_target(sym: mx.sym.Symbol, label: str, arrays, ctx) -> _Target:
    names = sym.list_arguments()
    if len(arrays) != len(names):
        raise TypeError(f"check_grad: {label} has arguments {names}; pass {len(names)} "
                        f"input(s) in that order, got {len(arrays)}")
    run_nd = None
    if sym.list_inputs() == names:  # no auxiliary states: CachedOp runs it imperatively
        cached = mx.nd.CachedOp(sym)

        def run_nd(xs):
            return cached(*xs)
    ex = _bind(sym, names, arrays, ctx, "null", float64=True)

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
    if len(ps) == n and all(p.kind == p.POSITIONAL_OR_KEYWORD and p.name not in params
                            and p.name not in ("name", "attr", "out") for p in ps):
        return [p.name for p in ps]
    return [f"arg{i}" for i in range(n)]


def _float64_errors(label: str, run64):
    @functools.wraps(run64)
    def wrapped(xs):
        try:
            return run64(xs)
        except Exception as exc:
            exc.add_note(f"check_grad ran the forward of {label} on float64 inputs (finite "
                         "differences need them); a forward that fixes its own dtype fails there")
            raise
    return wrapped


def _group(out: Any) -> mx.sym.Symbol:
    return mx.sym.Group(list(out)) if isinstance(out, tuple | list) else out


def _bind(sym, names, arrays, ctx, grad_req, float64=False):
    def dtype(a):
        return np.float64 if float64 and _floating(a) else a.dtype
    ex = sym.simple_bind(ctx, grad_req=grad_req,
                         type_dict={n: dtype(a) for n, a in zip(names, arrays)},
                         **{n: _mx_shape(a) for n, a in zip(names, arrays)})
    for n, a in zip(names, arrays):
        ex.arg_dict[n][:] = a.reshape(_mx_shape(a)).astype(dtype(a))
    return ex


# ---- the three gradients -----------------------------------------------------------------
def _imperative_grads(target: _Target, arrays, heads, wrt, ctx) -> dict[int, np.ndarray]:
    xs = [NumpyMode.to_nd(a, ctx) for a in arrays]
    for i in wrt:
        xs[i].attach_grad()
    with mx.autograd.record():
        outs = target.run_nd(xs)
    outs = list(outs) if isinstance(outs, tuple | list) else [outs]
    mx.autograd.backward(outs, head_grads=_mx_heads(heads, outs, ctx))
    return {i: xs[i].grad.asnumpy().reshape(arrays[i].shape).astype(np.float64) for i in wrt}


def _symbolic_grads(ex, names, arrays, heads, wrt, ctx, aux) -> dict[int, np.ndarray]:
    for name, value in aux.items():
        ex.aux_dict[name][:] = value
    ex.forward(is_train=True)
    ex.backward(out_grads=_mx_heads(heads, ex.outputs, ctx))
    return {i: ex.grad_dict[names[i]].asnumpy().reshape(arrays[i].shape).astype(np.float64)
            for i in wrt}


def _numeric_grads(run64, arrays, i, eps, heads_list, loss) -> list[np.ndarray]:
    """Central differences of each objective with respect to input ``i``, in float64."""
    xs = _with_float64(arrays)
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


# ---- comparing ---------------------------------------------------------------------------
def _compare(got: np.ndarray, want: np.ndarray, tol: Tolerance):
    """(max abs err, max rel err, worst index, ok); rel err is |got-want| / max(|want|, atol)."""
    if want.size == 0:
        return 0.0, 0.0, None, True
    err = np.abs(got - want)
    err = np.where(np.isnan(err), np.inf, err)
    allowed = tol.atol + tol.rtol * np.abs(want)
    rel = err / np.maximum(np.abs(want), tol.atol)
    ok = bool(np.all(err <= allowed))
    if not err.any():
        return 0.0, 0.0, None, ok
    worst = np.unravel_index(int(np.argmax(err / allowed)), want.shape)
    return float(err.max()), float(rel.max()), tuple(int(k) for k in worst), ok


def _worse(a: GradRow | None, b: GradRow) -> GradRow:
    # Across head draws keep a failure over a pass, then the larger error.
    if a is None:
        return b
    return max(a, b, key=lambda r: (not r.passed, r.max_rel_err or 0.0, r.max_abs_err or 0.0))


# ---- the public check --------------------------------------------------------------------
def check_grad(op: Any, *inputs: Any, argnums: Sequence[int | str] | None = None,
               eps: float | None = None, rtol: float | None = None, atol: float | None = None,
               output_layer: bool | None = None, loss: Loss | None = None, seed: int = 0,
               num_heads: int = 3, ctx: mx.Context | None = None,
               **params: Any) -> GradReport:
    """Check an operator's gradients against float64 finite differences, through MXNet.

    ``op`` is a :func:`customop` operator, an ``mx.sym.Symbol`` or a tuple of
    them (inputs in ``sym.list_arguments()`` order), or a function building
    one, such as ``mx.sym.smooth_l1`` (called on one variable per input, named
    after its parameters, and ``**params``).
    Inputs are NumPy arrays or NDArrays; their dtypes are kept, integer inputs
    are skipped ("integer input, not differentiable").  An operator's
    auxiliary states may follow its inputs (default: zeros); every evaluation
    starts from them, so an update made by one does not move the next.

    For each input in ``argnums`` (default: every floating input; indices or
    names) the imperative gradient (``mx.autograd``), the symbolic one (a bound
    executor; ``mx.nd.CachedOp`` gives native symbols their imperative side) and
    central finite differences of ``sum_i sum(head_i * output_i)`` (forward in
    float64) must agree.  Heads are ``num_heads`` seeded normal draws; with
    ``output_layer=True`` (default for ``need_top_grad=False`` ops) they are
    ones, and ``loss(outputs, inputs) -> float`` replaces the objective when the
    layer's output is not its loss.

    Defaults by the input's dtype; an error is allowed up to
    ``atol + rtol * |reference|``:

    =========  ======  ======  ======
    dtype      eps     rtol    atol
    =========  ======  ======  ======
    float16    1e-3    1e-2    1e-2
    float32    1e-4    1e-3    1e-5
    float64    1e-6    1e-5    1e-8
    =========  ======  ======  ======

    Returns a :class:`GradReport`; raises ``AssertionError`` with the report's
    table (input, shape, dtype, comparison, max abs/rel error, worst index)
    when a comparison fails.  The relative error is ``|got - ref| / max(|ref|, atol)``.

    An operator parameter named like one of the options above (``eps``,
    ``loss``, ...) cannot be passed through ``**params``; check the built
    symbol instead: ``check_grad(op(mx.sym.var('x'), eps=0.1), x)``.

    Example:
        >>> import numpy as np
        >>> from customop import customop
        >>> from customop.check import check_grad
        >>> @customop('numpy')
        ... def cube(x, k=1.0):
        ...     return k * x ** 3
        >>> _ = cube.def_grad(lambda ans, x, k=1.0: lambda g: 3 * k * x ** 2 * g)
        >>> check_grad(cube, np.random.rand(3, 2).astype(np.float32), k=2.0).passed
        True
    """
    arrays = [_to_numpy(a) for a in inputs]
    ctx = ctx or next((a.context for a in inputs if isinstance(a, mx.nd.NDArray)), mx.cpu())
    target = _target(op, arrays, params, ctx)
    arrays = arrays[:len(target.names)]  # auxiliary states, if given, are the target's
    wrt = [i for i in _resolve_argnums(argnums, target.names) if _floating(arrays[i])]
    output_layer = _resolve_output_layer(op, output_layer, loss)
    tols = {i: _tolerance(arrays[i].dtype, eps, rtol, atol) for i in wrt}
    heads_list, heads_text = _heads(target.run64(_with_float64(arrays)), arrays, output_layer,
                                    loss, num_heads, seed)

    results = _run_comparisons(target, arrays, wrt, tols, heads_list, loss, ctx) if wrt else {}
    report = GradReport(target.label, heads_text, _rows(target.names, arrays, wrt, results))
    if target.run_nd is None and wrt:
        report.notes.append("no imperative check: the symbol has auxiliary states")
    if not report.passed and output_layer and loss is None:
        report.notes.append("an output layer is compared with d sum(outputs) / d input; if its "
                            "output is not its loss (SoftmaxOutput: probabilities), pass loss=")
    if not report.passed:
        raise AssertionError(str(report))
    return report


def _run_comparisons(target, arrays, wrt, tols, heads_list, loss, ctx):
    """The worst row over all head draws, by (input index, comparison)."""
    names = target.names
    numeric = {i: _numeric_grads(target.run64, arrays, i, tols[i].eps, heads_list, loss)
               for i in wrt}
    ex = _bind(target.symbol, names, arrays, ctx,
               {n: "write" if i in wrt else "null" for i, n in enumerate(names)})
    results: dict[tuple[int, str], GradRow] = {}
    for h, heads in enumerate(heads_list):
        grads = {"numeric": {i: numeric[i][h] for i in wrt},
                 "symbolic": _symbolic_grads(ex, names, arrays, heads, wrt, ctx, target.aux)}
        if target.run_nd is not None:
            grads["imperative"] = _imperative_grads(target, arrays, heads, wrt, ctx)
        for i in wrt:
            for comparison in COMPARISONS:
                got, want = comparison.split(" vs ")
                if got in grads:
                    row = _row(names[i], arrays[i], comparison, tols[i],
                               grads[got][i], grads[want][i])
                    results[i, comparison] = _worse(results.get((i, comparison)), row)
    return results


def _rows(names, arrays, wrt, results) -> list[GradRow]:
    rows = []
    for i, (name, a) in enumerate(zip(names, arrays)):
        if i in wrt:
            rows += [results[i, c] for c in COMPARISONS if (i, c) in results]
        else:
            status = INTEGER_SKIP if not _floating(a) else ARGNUM_SKIP
            rows.append(GradRow(name, a.shape, str(a.dtype), status=status))
    return rows


def _with_float64(arrays):
    return [np.array(a, dtype=np.float64) if _floating(a) else a for a in arrays]


def _row(name, a, comparison, tol, got, want) -> GradRow:
    abs_err, rel_err, worst, ok = _compare(got, want, tol)
    return GradRow(name, a.shape, str(a.dtype), comparison, abs_err, rel_err, worst,
                   "ok" if ok else "FAIL", tol)


def _heads(outs, arrays, output_layer, loss, num_heads, seed):
    # Integer outputs (an argmax) have no gradient: their heads are zero everywhere.
    outs = [np.asarray(o) for o in outs]
    if output_layer:
        heads = [np.ones(o.shape) if _floating(o) else np.zeros(o.shape) for o in outs]
        return [heads], "ones (output layer)" + (", loss=" + _name(loss) if loss else "")
    if num_heads < 1:
        raise ValueError(f"check_grad: num_heads must be at least 1, got {num_heads}")
    # Round the heads to the lowest input precision so every side sees the same numbers.
    floats = [a.dtype for a in arrays if _floating(a)]
    low = min(floats, key=lambda d: d.itemsize) if floats else np.dtype(np.float32)
    rng = np.random.RandomState(seed)
    draws = [[rng.normal(size=o.shape).astype(low).astype(np.float64) if _floating(o)
              else np.zeros(o.shape) for o in outs] for _ in range(num_heads)]
    return draws, f"{num_heads} random draw{'s' if num_heads > 1 else ''}, seed {seed}"


def _mx_heads(heads, outs, ctx):
    return [mx.nd.array(h.reshape(o.shape), ctx=ctx, dtype=o.dtype)
            if np.issubdtype(np.dtype(o.dtype), np.floating)
            else mx.nd.zeros(o.shape, ctx=ctx, dtype=o.dtype)
            for h, o in zip(heads, outs)]


def _resolve_argnums(argnums, names: list[str]) -> list[int]:
    if argnums is None:
        return list(range(len(names)))
    if isinstance(argnums, int | str):
        argnums = [argnums]
    out = []
    for a in argnums:
        i = names.index(a) if isinstance(a, str) and a in names else a
        if not isinstance(i, int) or not 0 <= i < len(names):
            raise ValueError(f"check_grad: argnums entry {a!r} is not an input; the inputs are "
                             f"{', '.join(f'{k}={n}' for k, n in enumerate(names))}")
        out.append(i)
    return sorted(set(out))


def _resolve_output_layer(op, output_layer, loss) -> bool:
    default = isinstance(op, CustomOperator) and not op.need_top_grad
    if output_layer is None:
        output_layer = default or loss is not None
    if loss is not None and not output_layer:
        raise ValueError("check_grad: loss= describes an output layer; it cannot be combined "
                         "with output_layer=False")
    return bool(output_layer)


def _tolerance(dtype, eps, rtol, atol) -> Tolerance:
    base = TOLERANCES.get(np.dtype(dtype), TOLERANCES[np.dtype(np.float32)])
    return Tolerance(base.eps if eps is None else eps, base.rtol if rtol is None else rtol,
                     base.atol if atol is None else atol)


# ---- small helpers -----------------------------------------------------------------------
def _to_numpy(a: Any) -> np.ndarray:
    return a.asnumpy() if isinstance(a, mx.nd.NDArray) else np.asarray(a)


def _floating(a) -> bool:
    return np.issubdtype(np.asarray(a).dtype, np.floating)


def _mx_shape(a: np.ndarray) -> tuple[int, ...]:
    return a.shape or (1,)  # legacy MXNet shapes: () means unknown


def _as64(outs) -> list[np.ndarray]:
    return [np.asarray(o, dtype=np.float64) for o in outs]


def _name(fn) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def _cells(r: GradRow) -> list[str]:
    def num(v):
        return "" if v is None else f"{v:.3g}"
    return [r.input, str(r.shape), r.dtype, r.comparison, num(r.max_abs_err),
            num(r.max_rel_err), "" if r.worst_index is None else str(r.worst_index), r.status]


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(c) for c in col) for col in zip(header, *rows)]
    return ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip()
            for line in [header, *rows]]


# ---- command line ------------------------------------------------------------------------
def _pairs(items: list[str] | None, flag: str, parse: Callable[[str], Any]) -> dict[str, Any]:
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{flag} expects NAME=VALUE, got {item!r}")
        try:
            out[key] = parse(value)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{flag} {item!r}: {exc}") from None
    return out


def _shape(text: str) -> tuple[int, ...]:
    return tuple(int(d) for d in text.split(",") if d.strip())


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _load(spec: str) -> Any:
    module, sep, attr = spec.partition(":")
    if not sep or not attr:
        raise ValueError(f"expected MODULE:NAME (e.g. my_ops:focal_loss), got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    return functools.reduce(getattr, attr.split("."), importlib.import_module(module))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m customop.check",
        description="Check an operator's gradients on random inputs (see customop.check).")
    p.add_argument("target", help="MODULE:NAME of a customop, an mx.sym.Symbol or a "
                   "function building one (e.g. mxnet.symbol:smooth_l1)")
    p.add_argument("--shape", action="append", metavar="NAME=D1,D2",
                   help="shape of an input (empty for a scalar); one flag per input, in order")
    p.add_argument("--dtype", action="append", metavar="NAME=DTYPE",
                   help="dtype of an input (default float32)")
    p.add_argument("--int-high", action="append", metavar="NAME=N",
                   help="integer inputs are uniform in [0, N) (default 2)")
    p.add_argument("--param", action="append", metavar="KEY=VALUE",
                   help="operator parameter, a Python literal (else a string)")
    p.add_argument("--wrt", action="append", metavar="NAME", help="check only these inputs")
    p.add_argument("--output-layer", action="store_true", default=None,
                   help="check with ones heads (default for need_top_grad=False ops)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-heads", type=int, default=3)
    for name in ("eps", "rtol", "atol"):
        p.add_argument(f"--{name}", type=float, default=None)
    return p


def _random_inputs(names, shapes, dtypes, highs, seed) -> list[np.ndarray]:
    rng = np.random.RandomState(seed)
    out = []
    for name in names:
        dtype = np.dtype(dtypes.get(name, "float32"))
        if np.issubdtype(dtype, np.integer):
            out.append(rng.randint(0, highs.get(name, 2), size=shapes[name]).astype(dtype))
        else:
            out.append(rng.normal(size=shapes[name]).astype(dtype))
    return out


def _cli_names(obj: Any, shapes: dict[str, Any]) -> list[str]:
    if isinstance(obj, CustomOperator):
        names = list(obj.signature.inputs)
    elif isinstance(obj, mx.sym.Symbol):
        names = obj.list_arguments()
    else:
        return list(shapes)  # a symbol function: the --shape flags, in order
    missing = [n for n in names if n not in shapes]
    extra = [n for n in shapes if n not in names]
    if missing or extra:
        raise ValueError(f"the inputs are {', '.join(names)}; give exactly one --shape each"
                         + (f" (missing: {', '.join(missing)})" if missing else "")
                         + (f" (unknown: {', '.join(extra)})" if extra else ""))
    return names


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: check ``MODULE:NAME`` on random inputs; 0 on pass, 1 on failure.

    Example:
        python -m customop.check tests.customop.checkme_ops:pick_nll \\
            --shape x=4,5 --shape y=4 --dtype y=int32 --int-high y=5
    """
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        obj = _load(args.target)
        shapes = _pairs(args.shape, "--shape", _shape)
        dtypes = _pairs(args.dtype, "--dtype", lambda s: np.dtype(s).name)
        highs = _pairs(args.int_high, "--int-high", int)
        params = _pairs(args.param, "--param", _literal)
        names = _cli_names(obj, shapes)
    except (ValueError, TypeError, ImportError, AttributeError) as exc:
        parser.error(str(exc))
    inputs = _random_inputs(names, shapes, dtypes, highs, args.seed)
    argnums = None
    if args.wrt:
        argnums = [names.index(n) if n in names else n for n in args.wrt]
    try:
        report = check_grad(obj, *inputs, argnums=argnums, eps=args.eps, rtol=args.rtol,
                            atol=args.atol, output_layer=args.output_layer, seed=args.seed,
                            num_heads=args.num_heads, **params)
    except AssertionError as exc:
        print(exc)
        return 1
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
