"""The one check every native graph passes, whoever builds it: :func:`verified`.

A builder (:class:`customop.graphs.forward.ForwardGraph`, or
:class:`customop.graphs.backward.TransposedGraph` for an op with its own gradient)
records the operator; here the recording is trusted only when two recordings on
different values of one signature have one structure and the same free values, the
graph built from the first gives the operator's results at the second (outputs, and
for a transposed graph the closures' gradients), and, for training, the graph is the
same at other input shapes (a hybridized block may see them) and says whether it is
the same at other dtypes.  Each refusal is an entry of
:data:`customop.graphs.rules.TRACE_REFUSALS`.
"""

from __future__ import annotations

from typing import Protocol

from ..symbol_json import NativeGraph
from . import compare, trace
from . import constants as consts
from .rules import TRAIN, NotNative
from .sample_inputs import other_dtypes, other_shapes, perturbed, shapes_text


class Builder(Protocol):
    """What :func:`verified` asks of a builder."""

    DIFFERS: str  # the refusal of TRACE_REFUSALS when its graph gives other results
    purpose: str

    def recorded(self, values, seed: int = 5) -> trace.Recording: ...

    def build(self, rec: trace.Recording, shapes) -> NativeGraph: ...

    def differs(self, graph: NativeGraph, first, second, rec2: trace.Recording) -> str: ...

    def other_values(self, first, shapes) -> list: ...

    def at(self, inputs, shapes) -> tuple[NativeGraph, trace.Recording]: ...

    def differs_at(
        self, graph: NativeGraph, inputs, rec: trace.Recording, alt: NativeGraph
    ) -> str: ...

    def guarded(self, graph: NativeGraph, rec: trace.Recording) -> NativeGraph: ...


def verified(builder: Builder, shapes, dtypes, first: list) -> NativeGraph:
    """The builder's graph at this signature, traced on ``first``, once it passes every
    check (raises :class:`~customop.graphs.rules.NotNative` naming the one it fails)."""
    second = perturbed(first)
    rec1 = builder.recorded(first, seed=5)
    rec2 = builder.recorded(second, seed=6)
    if compare.structure(rec1) != compare.structure(rec2):
        raise NotNative.of("value-dependent")
    if any(not consts.same(rec1.free[i], rec2.free[i]) for i in rec1.free):
        raise NotNative.of("outside-graph")
    graph = builder.build(rec1, shapes)
    graph.checks = rec1.checks  # its customop.require conditions, as NaN poisoning
    wrong = builder.differs(graph, first, second, rec2)
    if wrong:
        raise NotNative.of(builder.DIFFERS, wrong)
    if builder.purpose == TRAIN:  # an export holds at the shapes it is exported with
        graph.specialized = generality(builder, graph, shapes, first)
        if graph.specialized:
            raise NotNative.of("shape-specialized", graph.specialized)
        graph.dtype_generic = dtype_generic(builder, graph, shapes, dtypes, first)
    return builder.guarded(graph, rec1)


def generality(builder: Builder, graph: NativeGraph, shapes, first) -> str:
    """ "" when the graph is the same at the first other shape the op accepts; else what
    differs (or that no other shape was accepted).  The sizes grown where it is the same
    go to ``graph.generic`` (the first accepted one decides; the others are tried too, so
    that a graph verified once serves other values of each: customop.graphs.graph_verdicts)."""
    tried: list[str] = []
    generic: list[int] = []
    for other in other_shapes(shapes):
        inputs = builder.other_values(first, other)
        try:
            alt, rec = builder.at(inputs, other)
        except Exception as exc:  # noqa: BLE001 - the op refuses this shape
            tried.append(f"{shapes_text(other)}: {type(exc).__name__}")
            continue
        diff = compare.difference(graph, alt) or builder.differs_at(graph, inputs, rec, alt)
        if diff and not generic:
            return f"{diff} at input shapes {shapes_text(other)}"
        if not diff:
            generic.append(next(d for s, o in zip(shapes, other) for d, e in zip(s, o) if d != e))
    graph.generic = tuple(generic)
    if generic:
        return ""
    return (
        "not checked: the forward refused every other input shape tried (" + "; ".join(tried) + ")"
    )


def dtype_generic(builder: Builder, graph: NativeGraph, shapes, dtypes, first: list) -> bool:
    """Whether the graph is the same with the float inputs of another precision (then one
    graph serves both, else calls are keyed by dtype)."""
    other = other_dtypes(dtypes)
    if other == tuple(dtypes):
        return True
    try:
        alt, _ = builder.at([v.astype(d) for v, d in zip(first, other)], shapes)
    except Exception:  # noqa: BLE001 - then calls are keyed by dtype
        return False
    return not compare.difference(graph, alt)
