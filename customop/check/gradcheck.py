"""Gradient checking through MXNet itself: ``check_grad`` (and ``python -m customop.check``).

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

import typing
from collections.abc import Sequence
from typing import Any

import mxnet as mx
import numpy as np

from ..dispatch import forced_path
from ..graphs import graph_verdicts, imperative
from ..operator import CustomOperator
from .numeric import (
    bind,
    floating,
    imperative_grads,
    make_target,
    name_of,
    numeric_grads,
    symbolic_grads,
    to_numpy,
    with_float64,
)
from .report import (
    ARGNUM_SKIP,
    COMPARISONS,
    GRAPH_COMPARISON,
    INTEGER_SKIP,
    NO_GRAD_SKIP,
    TOLERANCES,
    GradReport,
    GradRow,
    Tolerance,
    row,
    worse,
)

__all__ = ["check_grad"]

Loss = typing.Callable[[typing.List[np.ndarray], typing.List[np.ndarray]], float]  # noqa: UP006
# (typing's generics: evaluated at run time, and Python 3.8 has no list[...])


def check_grad(
    op: Any,
    *inputs: Any,
    argnums: Sequence[int | str] | None = None,
    eps: float | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    output_layer: bool | None = None,
    loss: Loss | None = None,
    seed: int = 0,
    num_heads: int = 3,
    ctx: mx.Context | None = None,
    **params: Any,
) -> GradReport:
    """Check an operator's gradients against float64 finite differences, through MXNet.

    ``op`` is a :func:`customop` operator, an ``mx.sym.Symbol`` or a tuple of
    them (inputs in ``sym.list_arguments()`` order), or a function building
    one, such as ``mx.sym.smooth_l1`` (called on one variable per input, named
    after its parameters, and ``**params``).
    Inputs are NumPy arrays or NDArrays; their dtypes are kept, integer inputs
    are skipped ("integer input, not differentiable").  An operator's
    auxiliary states may follow its inputs (default: zeros); every evaluation
    starts from them, so an update made by one does not move the next.

    For each input in ``argnums`` (default: every floating input the operator does
    not declare ``no_grad``; indices or names) the imperative gradient
    (``mx.autograd``), the symbolic one (a bound executor; ``mx.nd.CachedOp`` gives
    native symbols their imperative side) and central finite differences of ``sum_i
    sum(head_i * output_i)`` (forward in float64) must agree. Heads are
    ``num_heads`` seeded normal draws; with ``output_layer=True`` (default for
    ``need_top_grad=False`` ops) they are ones, and ``loss(outputs, inputs) ->
    float`` replaces the objective when the layer's output is not its loss.

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
    arrays = [to_numpy(a) for a in inputs]
    ctx = ctx or next((a.context for a in inputs if isinstance(a, mx.nd.NDArray)), mx.cpu())
    target = make_target(op, arrays, params, ctx)
    arrays = arrays[: len(target.names)]  # auxiliary states, if given, are the target's
    # By default an input the operator declares no_grad is not checked; asked for, it is.
    skip = target.no_grad if argnums is None else frozenset()
    wrt = [
        i
        for i in _resolve_argnums(argnums, target.names)
        if floating(arrays[i]) and target.names[i] not in skip
    ]
    output_layer = _resolve_output_layer(op, output_layer, loss)
    tols = {i: _tolerance(arrays[i].dtype, eps, rtol, atol) for i in wrt}
    heads_list, heads_text = _heads(
        target.run64(with_float64(arrays)), arrays, output_layer, loss, num_heads, seed
    )

    graph = _has_imperative_graph(op, arrays, params)
    results, inlined = (
        _run_comparisons(target, arrays, wrt, tols, heads_list, loss, ctx, graph)
        if wrt
        else ({}, False)
    )
    report = GradReport(target.label, heads_text, _rows(target.names, arrays, wrt, results, skip))
    if inlined:
        report.notes.append(
            "symbolic: the bound graph ran as MXNet's own operators (inlined, "
            "gradient closures transposed; customop.explain); imperative: "
            "the Custom node"
        )
    if graph and wrt:
        report.notes.append(
            "graph: the imperative call's native graph (what record() runs "
            "from a signature's second call), compared with the imperative "
            "call's closures"
        )
    if target.run_nd is None and wrt:
        report.notes.append("no imperative check: the symbol has auxiliary states")
    if not report.passed and output_layer and loss is None:
        report.notes.append(
            "an output layer is compared with d sum(outputs) / d input; if its "
            "output is not its loss (SoftmaxOutput: probabilities), pass loss="
        )
    if not report.passed:
        raise AssertionError(str(report))
    return report


def _has_imperative_graph(op: Any, arrays, params) -> bool:
    """Whether imperative calls of ``op`` at this signature run its native graph."""
    if not isinstance(op, CustomOperator) or imperative.eligible(op) or op.variants:
        return False
    shapes, dtypes = [a.shape for a in arrays], [a.dtype for a in arrays]
    return (
        len(arrays) == len(op.signature.inputs)
        and graph_verdicts.native_graph(op, params, shapes, dtypes, graph_verdicts.TRAIN).inlines
    )


def _run_comparisons(target, arrays, wrt, tols, heads_list, loss, ctx, graph=False):
    """The worst row over all head draws, by (input index, comparison)."""
    names = target.names
    numeric = {
        i: numeric_grads(target.run64, arrays, i, tols[i].eps, heads_list, loss) for i in wrt
    }
    ex = bind(
        target.symbol,
        names,
        arrays,
        ctx,
        {n: "write" if i in wrt else "null" for i, n in enumerate(names)},
    )
    results: dict[tuple[int, str], GradRow] = {}
    for h, heads in enumerate(heads_list):
        grads = {
            "numeric": {i: numeric[i][h] for i in wrt},
            "symbolic": symbolic_grads(ex, names, arrays, heads, wrt, ctx, target.aux),
        }
        if target.run_nd is not None:
            with forced_path("native"):  # the closures (or MXNet's recorded forward)
                grads["imperative"] = imperative_grads(target, arrays, heads, wrt, ctx)
        if graph:
            with forced_path("graph"):
                grads["graph"] = imperative_grads(target, arrays, heads, wrt, ctx)
        for i in wrt:
            for comparison in (*COMPARISONS, GRAPH_COMPARISON):
                got, want = comparison.split(" vs ")
                if got in grads:
                    found = row(
                        names[i], arrays[i], comparison, tols[i], grads[got][i], grads[want][i]
                    )
                    results[i, comparison] = worse(results.get((i, comparison)), found)
    return results, hasattr(ex, "customop_inlined")


def _rows(names, arrays, wrt, results, no_grad=frozenset()) -> list[GradRow]:
    rows = []
    for i, (name, a) in enumerate(zip(names, arrays)):
        if i in wrt:
            rows += [results[i, c] for c in (*COMPARISONS, GRAPH_COMPARISON) if (i, c) in results]
        else:
            status = (
                INTEGER_SKIP
                if not floating(a)
                else NO_GRAD_SKIP
                if name in no_grad
                else ARGNUM_SKIP
            )
            rows.append(GradRow(name, a.shape, str(a.dtype), status=status))
    return rows


def _heads(outs, arrays, output_layer, loss, num_heads, seed):
    # Integer outputs (an argmax) have no gradient: their heads are zero everywhere.
    outs = [np.asarray(o) for o in outs]
    if output_layer:
        heads = [np.ones(o.shape) if floating(o) else np.zeros(o.shape) for o in outs]
        return [heads], "ones (output layer)" + (", loss=" + name_of(loss) if loss else "")
    if num_heads < 1:
        raise ValueError(f"check_grad: num_heads must be at least 1, got {num_heads}")
    # Round the heads to the lowest input precision so every side sees the same numbers.
    floats = [a.dtype for a in arrays if floating(a)]
    low = min(floats, key=lambda d: d.itemsize) if floats else np.dtype(np.float32)
    rng = np.random.RandomState(seed)
    draws = [
        [
            rng.normal(size=o.shape).astype(low).astype(np.float64)
            if floating(o)
            else np.zeros(o.shape)
            for o in outs
        ]
        for _ in range(num_heads)
    ]
    return draws, f"{num_heads} random draw{'s' if num_heads > 1 else ''}, seed {seed}"


def _resolve_argnums(argnums, names: list[str]) -> list[int]:
    if argnums is None:
        return list(range(len(names)))
    if isinstance(argnums, (int, str)):
        argnums = [argnums]
    out = []
    for a in argnums:
        i = names.index(a) if isinstance(a, str) and a in names else a
        if not isinstance(i, int) or not 0 <= i < len(names):
            raise ValueError(
                f"check_grad: argnums entry {a!r} is not an input; the inputs are "
                f"{', '.join(f'{k}={n}' for k, n in enumerate(names))}"
            )
        out.append(i)
    return sorted(set(out))


def _resolve_output_layer(op, output_layer, loss) -> bool:
    default = isinstance(op, CustomOperator) and not op.need_top_grad
    if output_layer is None:
        output_layer = default or loss is not None
    if loss is not None and not output_layer:
        raise ValueError(
            "check_grad: loss= describes an output layer; it cannot be combined "
            "with output_layer=False"
        )
    return bool(output_layer)


def _tolerance(dtype, eps, rtol, atol) -> Tolerance:
    base = TOLERANCES.get(np.dtype(dtype), TOLERANCES[np.dtype(np.float32)])
    return Tolerance(
        base.eps if eps is None else eps,
        base.rtol if rtol is None else rtol,
        base.atol if atol is None else atol,
    )
