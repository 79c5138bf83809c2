"""The one check every native graph passes, whoever builds it: :func:`verified`.

A builder (:class:`customop.graphs.forward.ForwardGraph`, or
:class:`customop.graphs.backward.TransposedGraph` for an op with its own gradient)
records the operator; here the recording is trusted only when two recordings on
different values of one signature have one structure and the same free values, the
graph built from the first gives the operator's results at the second (outputs, and
for a transposed graph the closures' gradients), and, for training, the graph is the
same at other input shapes (a hybridized block may see them) and says whether it is
the same at other dtypes.  Each refusal is an entry of
:data:`customop.graphs.rules.TRACE_REFUSALS`.  A verdict, a graph's or a refusal's, is
kept on disk under its first recording and the code that ran it
(:mod:`customop.graphs.verdict_files`): another process that records the same takes it.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Protocol

import numpy as np

from ..symbol_json import NativeGraph
from . import code_hash, compare, registration, trace, verdict_files
from . import constants as consts
from .rules import RECORDED_REFUSALS, TRACE_REFUSALS, TRAIN, NotNative
from .sample_inputs import other_shapes, perturbed, shapes_text


class Builder(Protocol):
    """What :func:`verified` asks of a builder."""

    DIFFERS: str  # the refusal of TRACE_REFUSALS when its graph gives other results
    purpose: str
    op: Any  # the operator (customop.opinfo.Differentiable)
    params: dict[str, Any]

    def recorded(self, values, seed: int = 5) -> trace.Recording: ...

    def build(self, rec: trace.Recording, shapes) -> NativeGraph: ...

    def differs(self, graph: NativeGraph, first, second, rec2: trace.Recording) -> str: ...

    def other_values(self, first, shapes) -> list: ...

    def at(self, inputs, shapes) -> tuple[NativeGraph, trace.Recording]: ...

    def differs_at(
        self, graph: NativeGraph, inputs, rec: trace.Recording, alt: NativeGraph
    ) -> str: ...

    def guarded(self, graph: NativeGraph, rec: trace.Recording) -> NativeGraph: ...

    # (asked only with verified(passing=True))
    def passing(self, first: list) -> list: ...

    def candidates(self, first: list) -> list[list]: ...


def verified(builder: Builder, shapes, dtypes, first: list, passing: bool = False) -> NativeGraph:
    """The builder's graph at this signature, traced on ``first``, once it passes every
    check (raises :class:`~customop.graphs.rules.NotNative` naming the one it fails).

    ``passing``: ``first`` are placeholders, and the values traced on are the first of
    ``builder.passing(first)``'s on which the op's own checks pass (see
    :func:`customop.graphs.closure_check.passing`).

    The first recording keys a verdict kept on disk (:mod:`customop.graphs.verdict_files`):
    when a process checked the same recording of the same code before, its verdict stands
    and the other recordings and checks do not run."""
    rec1, ran, first = _first_recording(builder, first, passing)
    key = saved_key(builder, shapes, dtypes, first, rec1, ran)
    if key is not None:
        graph = _recalled(builder, rec1, shapes, verdict_files.load(key))
        if graph is not None:
            return builder.guarded(graph, rec1)
    try:
        graph = _checked(builder, shapes, first, rec1)
    except NotNative as exc:
        if key is not None:
            verdict_files.save(key, {"rule": exc.rule, "reason": str(exc)})
        raise
    if key is not None:
        verdict_files.save(key, {"generic": list(graph.generic)})
    return builder.guarded(graph, rec1)


def _first_recording(builder: Builder, first: list, passing: bool):
    """The first recording, the code it ran and the values it ran on.

    With ``passing``, ``builder.passing``'s candidates are recorded in its order, and the
    first whose recording ran with every ``require`` check holding (``rec.held``) is taken:
    the one ``builder.passing`` takes, the first on which the op's forward and closures run
    without a failed check (it runs them once more for that).  Where a recording fails, or
    none holds, ``builder.passing`` picks the values as before and they are recorded."""
    on = verdict_files.folder() is not None  # (off: no tracer)
    if passing:
        for values in builder.candidates(first):
            with code_hash.Calls(on) as ran:
                try:
                    rec1 = builder.recorded(values, seed=5)
                except NotNative:
                    break
            if rec1.held:
                return rec1, ran, values
        first = builder.passing(first)
    with code_hash.Calls(on) as ran:
        rec1 = builder.recorded(first, seed=5)
    return rec1, ran, first


def _checked(builder: Builder, shapes, first: list, rec1: trace.Recording) -> NativeGraph:
    second = perturbed(first)
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
    return graph


# the refusals a check after the first recording raises, by name
_RULES = frozenset(TRACE_REFUSALS) | {r.name for r in RECORDED_REFUSALS}


def _recalled(builder: Builder, rec1: trace.Recording, shapes, saved) -> NativeGraph | None:
    """The graph a saved verdict stands for (raises its refusal); None for a miss or an
    entry that is not a verdict (read as a miss)."""
    if not isinstance(saved, dict):
        return None
    rule, reason = saved.get("rule"), saved.get("reason")
    if isinstance(rule, str) and isinstance(reason, str) and rule in _RULES:
        raise NotNative(reason, rule)
    generic = saved.get("generic")
    if not isinstance(generic, list):
        return None
    if not all(type(d) is int and d > 0 for d in generic):
        return None
    graph = builder.build(rec1, shapes)
    graph.checks = rec1.checks
    if builder.purpose == TRAIN:
        graph.generic = tuple(generic)
    return graph


def saved_key(builder: Builder, shapes, dtypes, first, rec1, ran: code_hash.Calls) -> str | None:
    """What a saved verdict of this check is kept under: the recording (its graph, free
    values, inputs and outputs), the code it ran (:mod:`customop.graphs.code_hash`), the
    operator's configuration, the signature, and the versions of everything that checks it;
    None when it cannot be told (then nothing is saved)."""
    if not ran.ok or verdict_files.folder() is None:
        return None
    op = builder.op
    try:
        code = code_hash.digest(ran.codes(), [op.fn, *op.grads.values()])
        if code is None:
            return None
        source = code_hash.customop_source()
        if source is None:  # (changed since the import, or unreadable)
            return None
        parts = [
            type(builder).__name__,
            builder.purpose,
            op.op_type,
            op.mode,
            repr(sorted(builder.params.items())),
            [list(s) for s in shapes],
            [str(d) for d in dtypes],
            registration.fields(op),
            compare.structure(rec1),
            _arrays(first),
            _arrays(rec1.free[i] for i in sorted(rec1.free)),
            _arrays(rec1.outputs),
            [rec1.reads, rec1.randoms, sorted(rec1.paused), rec1.unknown_free, rec1.asked],
            [rec1.checks, _guarded(rec1), rec1.forward_reads],
            [getattr(inner, "op_type", repr(inner)) for inner in rec1.inner],
            [
                (i, c.first, c.inputs, c.label)
                for i, c in getattr(rec1.closures, "picks", None) or ()
            ],
            code,
            source,
            verdict_files.VERSIONS,
        ]
        return json.dumps(parts, default=repr)
    except Exception:  # noqa: BLE001 - a key that cannot be told is no key
        return None


def _guarded(rec: trace.Recording) -> list:
    # by node index: a node's name numbers the process's operators traced before it
    index = {n["name"]: i for i, n in enumerate(rec.nodes)}
    return sorted((index.get(name, name), list(map(str, d))) for name, d in rec.guarded.items())


def _arrays(values) -> list[str]:
    out = []
    for v in values:
        a = np.ascontiguousarray(v)
        out.append(f"{a.dtype} {a.shape} {hashlib.sha256(a.tobytes()).hexdigest()}")
    return out


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
