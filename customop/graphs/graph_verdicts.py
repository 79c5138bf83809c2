"""Whether an operator's forward may stand in a graph as MXNet's own operators, and that graph.

For one operator, parameter set and input signature (shapes, dtypes), and one
purpose, :func:`native_graph` answers with a :class:`NativeGraph` (a piece of
symbol JSON whose inputs are the operator's inputs) or the reason the ``Custom``
node stays.  The purposes:

* ``'train'``: hybridized blocks and bound graphs, which may be differentiated.
  MXNet's gradient of the graph must be the operator's: an automatic gradient
  differentiates the forward (:mod:`customop.graphs.forward` builds it); ``def_grad``
  closures and output layers (``need_top_grad=False``) are transposed into the graph
  (:mod:`customop.graphs.backward`).  The graph must hold at every input shape the
  block may see later (checked at other shapes).
* ``'export'``: a deployed graph, inference only.  ``def_grad`` operators
  qualify too; the graph may be specialized to the exported shapes; arrays the
  forward builds become parameters of the exported model.

Whoever builds it, the graph passes one check (:func:`customop.graphs.verify.verified`):
the op is recorded (:mod:`customop.graphs.trace`) twice on different values of one
signature and once or more at other signatures; the graph is kept only when it does
not depend on the values, reads nothing back to Python, calls no random operator,
and, evaluated, gives the op's own outputs (and closures' gradients) at the other
values and signatures.  Every refusal is a table entry of :mod:`customop.graphs.rules`.
Answers are cached per operator, parameters, signature and purpose, within the memory
budget of :mod:`customop.budget` (least recently used out); a training graph serves
every signature of its shape family without another trace (:func:`_family`).  Between
processes, verdicts are kept on disk: a library op's with its graph, which a later process
takes without a trace (:mod:`customop.graphs.saved_graphs`), any op's under its first
recording and the code it ran (:mod:`customop.graphs.verify`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mxnet as mx
import numpy as np

from .. import budget, errors, families
from ..modes import BFLOAT16
from ..opinfo import Differentiable
from ..symbol_json import NativeGraph
from . import rules, saved_graphs
from .rules import EXPORT, PURPOSES, TRAIN, NotNative  # noqa: F401 - native.EXPORT names a purpose

_lock = threading.RLock()
_cache = budget.Table()  # verdicts by signature, least recent first (the shared budget)
# A training graph by shape family: verified at one signature and at a grown one, it serves
# every signature of the family (see _family) without a trace.  Under the same budget: a
# family's entry carries the cost of the graphs it keeps (budget.TRACED each), the verdict
# whose trace made one the cost of a recalled entry.
_families = budget.Table()


@dataclass
class Verdict:
    """What :func:`native_graph` found: ``graph``, or ``reason`` the ``Custom`` node stays."""

    op_type: str
    purpose: str
    shapes: tuple
    dtypes: tuple
    graph: NativeGraph | None = None
    reason: str = ""
    rule: str = ""  # the refusal's name in customop.graphs.rules' tables

    @property
    def inlines(self) -> bool:
        return self.graph is not None


def static_reason(op: Differentiable, purpose: str) -> str:
    """Why ``op`` never inlines for ``purpose``, whatever its inputs ("" when it may)."""
    found = rules.op_refusal(op, purpose)
    return found.reason if found is not None else ""


def native_graph(
    op: Differentiable,
    params: dict[str, Any],
    shapes: Sequence[Sequence[int]],
    dtypes: Sequence[Any],
    purpose: str,
    values: Sequence[np.ndarray] | None = None,
    saved: dict | None = None,
) -> Verdict:
    """The native graph of ``op`` at this signature for ``purpose``, or why there is none.

    The one entry point: every graph, explain and export asks here, for ops with their
    own gradient too.  ``values``: the inputs to trace on first (default: placeholders).
    A verdict traced on given values is not cached: the cached verdict, which every graph
    uses, is a function of the operator, its parameters and the signature only, whatever
    ran before.  ``saved``: a library op's outcome an earlier process saved for this
    verdict, read by the caller with its own entry (:mod:`customop.graphs.saved_splices`),
    taken where this op's own entry would be read.
    """
    if purpose not in PURPOSES:
        raise ValueError(f"purpose must be one of {PURPOSES}, got {purpose!r}")
    shapes = tuple(tuple(int(d) for d in s) for s in shapes)
    dtypes = tuple(np.dtype(d) for d in dtypes)
    if values is not None:
        return _traced(op, dict(params), shapes, dtypes, purpose, values)
    key = (op, repr(sorted(params.items())), shapes, dtypes, purpose)
    found = _recalled(_cache, key)
    if found is None:
        family = _family(key)
        known = _recalled(_families, family) if family is not None else None
        graph = next((v.graph for v in known or () if _serves(v, shapes)), None)
        if graph is not None:
            found = Verdict(errors.shown(op.op_type), purpose, shapes, dtypes, graph)
            cost = budget.RECALLED
        else:
            found = _saved(op, params, shapes, dtypes, purpose, saved)
            if found is None:
                found = _traced(op, dict(params), shapes, dtypes, purpose, None)
                if rules.op_refusal(op, purpose) is None:  # (a registration's refusal: not saved)
                    saved_graphs.keep(op, params, shapes, dtypes, purpose, found)
            cost = budget.TRACED
            if family is not None and found.graph is not None and found.graph.generic:
                kept = [found, *(known or ())][:FAMILY_SIZE]
                with _lock:
                    _families.keep(family, kept, budget.TRACED * len(kept))
                cost = budget.RECALLED  # (its graph counted in its family's entry)
        with _lock:
            _cache.keep(key, found, cost)
    return found


FAMILY_SIZE = 8  # verified graphs kept per family


def _family(key: tuple) -> tuple | None:
    """Where training graphs that may serve this signature are kept: the same op,
    parameters, dtypes and ranks (None: not a training key, or an empty axis)."""
    op, params, shapes, dtypes, purpose = key
    if purpose != TRAIN or any(0 in s for s in shapes):
        return None
    return (op, params, tuple(len(s) for s in shapes), dtypes)


def _serves(verdict: Verdict, shapes: tuple) -> bool:
    """Whether ``verdict``'s graph holds at ``shapes``: a signature of its shape family
    (:func:`customop.families.serves`; a graph without sizes that may change serves
    none but its own, which the table finds by key)."""
    generic = verdict.graph.generic
    return bool(generic) and families.serves(verdict.shapes, generic, shapes)


def _recalled(table: OrderedDict, key: tuple) -> Verdict | None:
    with _lock:
        found = table.get(key)
        if found is not None:
            table.move_to_end(key)
        return found


def _saved(op, params, shapes, dtypes, purpose, given=None) -> Verdict | None:
    """A library op's verdict a process saved before (:mod:`customop.graphs.saved_graphs`);
    None for an op its registration refuses (``inline=False``...): that refusal is decided
    here, never read from a file."""
    if rules.op_refusal(op, purpose) is not None:
        return None
    saved = saved_graphs.recalled(op, params, shapes, dtypes, purpose, given)
    if saved is None:
        return None
    return Verdict(errors.shown(op.op_type), purpose, shapes, dtypes, **saved)


def _traced(*args) -> Verdict:
    # The tracing and checking machinery is imported at the first trace: a process whose
    # verdicts were all saved never loads it.
    from . import trace

    return trace.aside(_decide, *args)


# The checks run a few thousand small operators on the trace thread, which MXNet's engine
# takes in segments of _BULK (mx.engine.bulk: a setting of this thread only, put back after)
# instead of one push and one hand-off to its worker each: the RetinaNet head's four ops
# checked in 69.5 ms instead of 76.4 (medians of 8, MXNet 1.9.1, 2 cores).  The same
# operators run in the same order, so the values are the same; a read waits for the segment.
_BULK = 16


def _decide(op, params, shapes, dtypes, purpose, values) -> Verdict:
    with mx.engine.bulk(_BULK):
        return _decided(op, params, shapes, dtypes, purpose, values)


def _decided(op, params, shapes, dtypes, purpose, values) -> Verdict:
    from . import backward, verify
    from .forward import ForwardGraph
    from .sample_inputs import placeholders

    verdict = Verdict(errors.shown(op.op_type), purpose, shapes, dtypes)
    refused = rules.op_refusal(op, purpose)
    if refused is not None:
        verdict.reason, verdict.rule = refused.reason, refused.name
        return verdict
    try:
        if BFLOAT16 in dtypes:
            raise NotNative.of("bfloat16")
        first = list(values) if values is not None else placeholders(shapes, dtypes, 1)
        passing = False
        if purpose == TRAIN and backward.has_own_gradient(op):
            builder = backward.TransposedGraph(op, params)
            passing = values is None  # (placeholders: values the op's checks pass on)
        else:
            builder = ForwardGraph(op, params, purpose)
        verdict.graph = verify.verified(builder, shapes, dtypes, first, passing)
    except NotNative as exc:
        verdict.reason, verdict.rule = str(exc), exc.rule
    return verdict


def clear_cache() -> None:
    """Forget every traced graph (an operator redefined in place is traced again anyway)."""
    with _lock:
        _cache.clear()
        _families.clear()
