"""``customop.explain``: whether an op, or each op of a graph, runs as MXNet's own operators."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import mxnet as mx
import numpy as np

from .. import errors, symbol_json
from ..modes import BFLOAT16
from ..operator import CustomOperator
from . import graph_verdicts, imperative, splice

_WHERE = {
    graph_verdicts.TRAIN: "training (hybridized blocks, bound graphs)",
    graph_verdicts.EXPORT: "deploy export (customop.export)",
}


@dataclass
class OpReport:
    """One operator at one input signature: its verdict for training and for export."""

    op_type: str
    shapes: tuple
    dtypes: tuple
    train: graph_verdicts.Verdict
    export: graph_verdicts.Verdict
    imperative: str = ""  # which path an imperative call under record() takes, and why

    @property
    def inlines(self) -> bool:
        """Whether hybridized blocks and bound graphs run it as MXNet operators."""
        return self.train.inlines

    @property
    def exports(self) -> bool:
        """Whether :func:`customop.export` writes it as MXNet operators."""
        return self.export.inlines

    def __repr__(self) -> str:
        sig = ", ".join(f"{s} {np.dtype(d).name}" for s, d in zip(self.shapes, self.dtypes))
        lines = [f"customop {self.op_type!r} at {sig or 'no inputs'}"]
        for verdict in (self.train, self.export):
            lines.append(f"  {_WHERE[verdict.purpose]}: {_said(verdict)}")
        if self.imperative:
            lines.append(f"  imperative calls (mx.nd arrays): {self.imperative}")
        return "\n".join(lines)


@dataclass
class GraphReport:
    """Every ``Custom`` node of ours in a graph: inlined or kept, for training and for export."""

    nodes: list[tuple[str, str, str, str]] = field(default_factory=list)  # node, op, train, export

    @property
    def kept(self) -> dict[str, list[str]]:
        """Nodes that stay ``Custom`` nodes, per purpose."""
        return {
            p: [
                n
                for n, _, t, e in self.nodes
                if not (t if p == graph_verdicts.TRAIN else e).startswith("inlines")
            ]
            for p in graph_verdicts.PURPOSES
        }

    def __repr__(self) -> str:
        if not self.nodes:
            return "no Custom node of a customop operator in this graph"
        lines = []
        for node, op_type, train, export in self.nodes:
            lines += [
                f"node {node!r} (customop {op_type!r})",
                f"  {_WHERE[graph_verdicts.TRAIN]}: {train}",
                f"  {_WHERE[graph_verdicts.EXPORT]}: {export}",
            ]
        return "\n".join(lines)


def _said(verdict: graph_verdicts.Verdict) -> str:
    if verdict.graph is None:
        return f"stays a Custom node: {verdict.reason}"
    ops = verdict.graph.operators()
    names = sorted(set(ops))
    shown = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
    said = f"inlines as {len(ops)} MXNet operator{'s' if len(ops) != 1 else ''} ({shown})"
    if verdict.graph.note:
        said += f"; {verdict.graph.note}"
    if verdict.graph.checks:
        n = verdict.graph.checks
        said += f"; its customop.require checks ({n}) make the outputs NaN when one fails"
    if verdict.graph.guards:
        said += (
            f"; indices into {', '.join(verdict.graph.guards)} are guarded (NaN for one "
            f"out of range)"
        )
    return said


def explain(target: Any, *inputs: Any, **params: Any) -> OpReport | GraphReport:
    """Whether ``target`` runs as MXNet's own operators in graphs, and why not.

    ``target`` is a decorated operator (then ``inputs`` are its arrays, NDArrays
    or NumPy arrays, or shapes for float32 inputs, and ``params`` its
    parameters), or a ``HybridBlock`` (``inputs``: example inputs for its
    ``forward``), or a Symbol (``params``: input shapes by name).  The answer
    says, for training (hybridized blocks and bound graphs) and for a deploy
    export (:func:`customop.export`), whether each op inlines as the MXNet
    operators its forward calls, or stays a ``Custom`` node, and the reason.
    Only the inputs' shapes and dtypes count: the answer is the verdict every
    graph gets at that signature, traced on placeholder values.

    Example:
        >>> import mxnet as mx
        >>> import customop
        >>> from customop import ops
        >>> customop.explain(ops.box_decode, (2, 10, 4), (1, 10, 4)).inlines
        True
        >>> print(customop.explain(ops.center_loss, (4, 3), (4,), (5, 3), num_class=5))
        ... # doctest: +ELLIPSIS
        customop 'ops.center_loss' at (4, 3) float32, (4,) float32, (5, 3) float32
          training (hybridized blocks, bound graphs): stays a Custom node: it has auxiliary ...
          deploy export (customop.export): stays a Custom node: it has auxiliary states ...
          imperative calls (mx.nd arrays): the custom path ...
    """
    if isinstance(target, CustomOperator):
        return _explain_op(target, inputs, params)
    if isinstance(target, mx.gluon.HybridBlock):
        sym, shapes, dtypes = _block_graph(target, inputs)
        return _explain_graph(sym, shapes, dtypes)
    if isinstance(target, mx.sym.Symbol):
        return _explain_graph(target, {k: tuple(v) for k, v in params.items()}, {})
    raise TypeError(
        f"customop.explain: expected a decorated operator, a HybridBlock or a "
        f"Symbol, got {type(target).__name__}"
    )


def _explain_op(op: CustomOperator, inputs, params) -> OpReport:
    arrays, params = op.signature.bind(inputs, params)
    if op.variants and any(a is None for a in arrays):
        absent = frozenset(n for n, a in zip(op.signature.inputs, arrays) if a is None)
        op, arrays = op.variants[absent], [a for a in arrays if a is not None]
    values = []
    for name, a in zip(op.signature.arrays, arrays):
        if isinstance(a, (tuple, list)) and all(isinstance(d, int) for d in a):
            values.append(None)
            continue
        if isinstance(a, mx.nd.NDArray):
            a = a.asnumpy()
        if not isinstance(a, np.ndarray):
            raise errors.op_error(
                op.op_type,
                TypeError,
                (
                    f"explain: input {name!r} must be an array or a shape tuple, got "
                    f"{type(a).__name__}"
                ),
            )
        values.append(a)
    shapes = tuple(tuple(a) if v is None else v.shape for a, v in zip(arrays, values))
    dtypes = tuple(np.dtype(np.float32) if v is None else v.dtype for v in values)
    # The verdict graphs get at this signature (traced on placeholders, cached): the values
    # given only say the shapes and dtypes, so explain never answers otherwise than a graph.
    verdicts = [
        graph_verdicts.native_graph(op, params, shapes, dtypes, p) for p in graph_verdicts.PURPOSES
    ]
    imperative = _imperative_path(op, verdicts[0])
    if BFLOAT16 in dtypes:  # an imperative call casts them to float32 first (dispatch)
        wide = tuple(np.dtype(np.float32) if d == BFLOAT16 else d for d in dtypes)
        imperative = "bfloat16 inputs cast to float32, then " + _imperative_path(
            op, graph_verdicts.native_graph(op, params, shapes, wide, graph_verdicts.TRAIN)
        )
    return OpReport(errors.shown(op.op_type), shapes, dtypes, *verdicts, imperative=imperative)


def _imperative_path(op: CustomOperator, train: graph_verdicts.Verdict) -> str:
    if op.signature.aux:
        usual = "the custom path (mx.nd.Custom, its aux states inputs of MXNet's node)"
    elif op.records_natively:
        usual = "the native path (its forward's operators, recorded)"
    else:
        usual = "the function path (the forward, then its gradient closures in backward)"
    usual += " under mx.autograd.record(), else its forward in Python"
    why = imperative.eligible(op) or (
        "" if train.inlines else "it has no native training graph (see training above)"
    )
    if why:
        return f"{usual}: {why}"
    return (
        "its native graph (under mx.autograd.record() recorded by MXNet's autograd: no "
        "Python in backward), from a signature's second call; the first call takes "
        f"{usual}"
    )


def _block_graph(block: mx.gluon.HybridBlock, inputs) -> tuple:
    if not inputs:
        raise TypeError(
            "customop.explain(block, *inputs): pass example inputs for the "
            "block's forward (their shapes and dtypes are what is traced)"
        )
    _, out, shapes, dtypes = symbol_json.block_signature(block, inputs)
    return out, shapes, dtypes


def _explain_graph(sym: mx.sym.Symbol, shapes, dtypes) -> GraphReport:
    report = GraphReport()
    found = {p: splice.inline(sym, shapes, dtypes, p) for p in graph_verdicts.PURPOSES}
    if found[graph_verdicts.TRAIN] is None:
        return report
    said = {}
    for purpose, result in found.items():
        for name in result.inlined:
            verdict = result.verdicts.get(name)
            said[(name, purpose)] = _said(verdict) if verdict is not None else "inlines"
        for kept in result.kept:
            said[(kept.node, purpose)] = f"stays a Custom node: {kept.reason}"
    graph = symbol_json.graph_of(sym)
    for node in graph["nodes"] if graph else []:
        if (node["name"], graph_verdicts.TRAIN) in said:
            op_type = symbol_json.attrs(node).get("op_type", "?")
            report.nodes.append(
                (
                    node["name"],
                    errors.shown(op_type),
                    said[(node["name"], graph_verdicts.TRAIN)],
                    said.get((node["name"], graph_verdicts.EXPORT), "?"),
                )
            )
    return report
