"""Imperative calls that run the op's native training graph.

An ``'mxnet'``-mode operator whose forward (and ``def_grad`` closures) inlines in
training graphs (:func:`customop.graphs.graph_verdicts.native_graph`) has a native graph that
MXNet differentiates itself.  Called on NDArrays under ``mx.autograd.record()``, such an
op runs that graph as a ``CachedOp``, recorded by MXNet's autograd like any operator: its
backward runs no Python.  Not recording, it runs the same graph's forward alone, a
``def_grad`` op's without its transposed closures' coefficients (faster than its forward in
Python, measured in ``benchmarks/imperative.py``).  The graph is the one a
hybridized block runs, with its checks (a failed :func:`customop.require` makes the outputs
and gradients NaN).

:func:`call` answers for one call: the outputs, or that the caller's usual path
(``function`` or ``native`` in :mod:`customop.dispatch`) runs it:

* a signature (input shapes and dtypes, parameters, train mode) runs the usual path until
  one call there returned (its forward's own checks passed: :func:`seen`), so shapes that
  change every call pay no trace, and its graph from the next call on;
* an op or signature with no native graph (``explain`` says why), or whose graph MXNet's
  shape inference refuses at that signature, keeps the usual path (which raises the op's
  own error there).

Plans are kept per operator, parameters and signature, within the memory budget of
:mod:`customop.budget` (least recently used out); a verified graph also serves
the signatures that differ from its own in the size it was checked at another value of
(:mod:`customop.graphs.graph_verdicts`), and each thread runs its own ``CachedOp`` of it
(a static one for small inputs, :data:`STATIC_BYTES`, its buffers counted in the budget).
``CUSTOMOP_RUNTIME_OFF=inline`` (every op keeps its ``Custom`` node in graphs) keeps
imperative calls on their Python paths too.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import mxnet as mx
import numpy as np

from .. import budget, runtime, symbol_json
from ..opinfo import Differentiable
from . import graph_verdicts
from .call_key import signature
from .rules import TRAIN

# A graph's Symbol and CachedOp, run once: 35 KiB of resident memory for a 2-operator graph
# (7 nodes with its variables), 137 KiB for ops.focal_loss's (52 nodes): about 16 KiB and
# 2.5 KiB a node (a thread's CachedOp, or the forward alone, more; BENCHMARKS.md).
GRAPH_COST, NODE_COST = 16 * 1024, 2560
_NDARRAY, _NP_ARRAY = mx.nd.NDArray, mx.np.ndarray
_SEEN, _REFUSED = "seen", "refused"
# A CachedOp call of a small graph is mostly MXNet's setup (shape inference and memory
# planning, each call): with static_alloc and static_shape it is done once per shape, and a
# recorded focal_loss call at 2 x 48 x 3 costs 0.69x (2 x 500 x 3: 0.70x; 8 x 1000 x 20: 0.98x,
# measured), but the CachedOp then holds its intermediate buffers between calls.  So a call
# takes the static one only where those stay small: its inputs' bytes times the graph's
# operators (the estimate of what it holds) at most STATIC_BYTES, per graph and thread.  The
# estimate counts in the graph's entry of the shared budget, and a graph the budget lets go
# drops its static CachedOps (1,000 graphs of 0.9 MiB each held 1.1 GiB uncounted, measured).
STATIC_BYTES = 2**20
_STATIC_FLAGS = [("static_alloc", True), ("static_shape", True)]


class Pending(tuple):
    """A signature the usual path runs now; :func:`seen` once that call returned."""


_lock = threading.Lock()
_plans = budget.Table()  # signature -> _SEEN, _REFUSED or a _Graph (the shared budget)
# id(NativeGraph) -> its _Graph with its CachedOps (one per family; the budget), and every
# _Graph still alive (a plan may hold one the budget let go: it comes back when called)
_graphs = budget.Table(released=lambda graph: graph.release())
_live: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_never: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # op -> (switch, eligible())


class _Runner:
    """One graph as a Symbol, and a ``CachedOp`` of it per thread: a static one (and what
    it may hold, told to ``grew``) for small inputs, else a dynamic one."""

    def __init__(self, graph: symbol_json.NativeGraph, n: int, grew: weakref.WeakMethod):
        names = [f"input{i}" for i in range(n)]
        self.symbol = symbol_json.load(symbol_json.to_json(graph, names))
        self.used = set(self.symbol.list_inputs())
        self.order = [names.index(u) for u in self.symbol.list_inputs()]
        self.operators = sum(node["op"] != "null" for node in graph.nodes)
        self.grew = grew  # (weak: the graph holds its runners)
        self.dynamic = threading.local()  # .op
        self.statics = threading.local()  # .op, .held: its estimated bytes

    def __call__(self, inputs: list[mx.nd.NDArray]) -> list[mx.nd.NDArray]:
        held = self.operators * sum(_bytes(a) for a in inputs)
        if held <= STATIC_BYTES:
            here = self.statics
            cached = getattr(here, "op", None)
            if cached is None:
                cached = here.op = mx.nd.CachedOp(self.symbol, flags=_STATIC_FLAGS)
                here.held = 0
            if held > here.held:  # (a larger shape: its buffers grow)
                grew = self.grew()
                if grew is not None:
                    grew(held - here.held)
                here.held = held
        else:
            cached = getattr(self.dynamic, "op", None)
            if cached is None:
                cached = self.dynamic.op = mx.nd.CachedOp(self.symbol)
        outs = cached(*[inputs[i] for i in self.order])
        return [outs] if isinstance(outs, mx.nd.NDArray) else list(outs)

    def drop_statics(self) -> None:
        """Let every thread's static CachedOp go (a call in flight keeps its own)."""
        self.statics = threading.local()


def _bytes(array: mx.nd.NDArray) -> int:
    size = 1
    for d in array.shape:
        size *= d
    return size * np.dtype(array.dtype).itemsize


class _Graph:
    """One native graph, and its forward without the transposed closures (a ``def_grad``
    op's ``forward_only``), which calls that are not recorded run: nothing can need their
    coefficients there.  Its entry in ``_graphs`` costs :data:`GRAPH_COST`, :data:`NODE_COST`
    a node and what its static CachedOps may hold."""

    def __init__(self, graph: symbol_json.NativeGraph, n: int):
        self.graph, self.n = graph, n
        self.base = GRAPH_COST + NODE_COST * len(graph.nodes)
        self.held = 0  # bytes every thread's static CachedOps may hold
        self.kept = False  # in _graphs
        self.full = _Runner(graph, n, weakref.WeakMethod(self._grew))
        self._alone: _Runner | None = None

    def keep(self) -> None:
        """(under _lock) In ``_graphs`` as the newest, at its cost now."""
        self.kept = True  # (before: an eviction during keep() must leave it False)
        _graphs.keep(id(self.graph), self, self.base + self.held)

    def _grew(self, more: int) -> None:
        with _lock:
            self.held += more
            self.keep()

    def release(self) -> None:
        """Let go by ``_graphs`` (under the budget's lock: no other lock here): its static
        CachedOps go; a plan that still holds it enters it again when it calls."""
        self.kept = False
        self.held = 0
        for runner in (self.full, self._alone):
            if runner is not None:
                runner.drop_statics()

    def holds(self, shapes, dtypes) -> bool:
        """Whether MXNet's shape and type inference of the graph pass at this signature (a
        graph of the shape family serves signatures its op never ran at: one whose sizes
        do not broadcast keeps the usual path, which raises the op's own error)."""
        names = [f"input{i}" for i in range(len(shapes))]
        symbol, used = self.full.symbol, self.full.used
        given = {n: s for n, s in zip(names, shapes) if n in used}
        try:
            _, outs, _ = symbol.infer_shape(**given)
            symbol.infer_type(**{n: d for n, d in zip(names, dtypes) if n in used})
        except mx.base.MXNetError:
            return False
        return outs is not None and all(s and all(d > 0 for d in s) for s in outs)

    def __call__(self, inputs: list[mx.nd.NDArray], recording: bool = True) -> list[mx.nd.NDArray]:
        if not self.kept:  # let go by the budget, still held by a plan: counted again
            with _lock:
                self.keep()
        if recording or self.graph.forward_only is None:
            return self.full(inputs)
        alone = self._alone
        if alone is None:
            alone = self._alone = _Runner(
                self.graph.forward_only, self.n, weakref.WeakMethod(self._grew)
            )
        return alone(inputs)


def eligible(op: Differentiable) -> str:
    """Why ``op`` never runs a native graph imperatively ("" when it may): the reason of the
    first entry of ``rules.OP_REFUSALS`` that refuses it for training."""
    return graph_verdicts.static_reason(op, TRAIN)


def call(
    op: Differentiable,
    inputs: list[mx.nd.NDArray],
    params: dict[str, Any],
    at_once: bool = False,
    recording: bool = True,
) -> list[mx.nd.NDArray] | Pending | None:
    """``op``'s outputs from its native training graph (recorded when ``recording``; not
    recording, a ``def_grad`` op's graph without its transposed closures); else the usual
    path runs the call (a :class:`Pending` signature: tell :func:`seen` when it returned).

    ``at_once``: build the graph at a signature's first call (``forced_path('graph')``).
    """
    for a in inputs:
        if type(a) is not _NDARRAY and isinstance(a, _NP_ARRAY):
            return None  # the mx.np interface keeps its path (outputs must be mx.np arrays)
    off = runtime.SWITCH.raw()  # (read per call: the cheap read of the entry)
    if off and runtime.disabled("inline"):
        return None  # every op keeps its Custom node, and its Python path imperatively
    never = _never.get(op)
    if never is None or never[0] != off:  # (the trace-off rule reads the switch)
        never = _never[op] = (off, eligible(op))
    if never[1]:
        return None  # an op no signature inlines builds no signature key
    key = Pending(
        (
            op,
            repr(sorted(params.items())) if params else "",
            signature(inputs, range(len(inputs))),
            mx.autograd.is_training(),
        )
    )
    plan = _plans.get(key)  # (one C call under the GIL; _remember changes it under _lock)
    if plan is not None:
        try:
            _plans.move_to_end(key)
        except KeyError:  # another thread's _remember let it go meanwhile
            pass
    if plan is _REFUSED:
        return None
    if plan is None and not at_once:
        return key
    if not isinstance(plan, _Graph):
        plan = _planned(op, params, inputs)
        with _lock:
            _remember(key, plan)
        if plan is _REFUSED:
            return None
    return plan(inputs, recording)


def seen(key: Pending) -> None:
    """The usual path ran the call of signature ``key`` and returned: the next call there
    runs the graph."""
    with _lock:
        if key not in _plans:
            _remember(key, _SEEN)


def _planned(op: Differentiable, params: dict[str, Any], inputs: list[mx.nd.NDArray]) -> Any:
    # (call() has asked eligible(op) already; native_graph applies the same rules)
    shapes, dtypes = tuple(a.shape for a in inputs), tuple(np.dtype(a.dtype) for a in inputs)
    verdict = graph_verdicts.native_graph(op, params, shapes, dtypes, TRAIN)
    if verdict.graph is None:
        return _REFUSED
    with _lock:
        found = _live.get(id(verdict.graph))
        if found is None or found.graph is not verdict.graph:
            found = _live[id(verdict.graph)] = _Graph(verdict.graph, len(inputs))
        found.keep()
    if not found.holds(shapes, dtypes):
        return _REFUSED
    return found


def _remember(key: tuple, plan: Any) -> None:
    _plans.keep(key, plan, budget.RECALLED)


def clear_cache() -> None:
    """Forget every plan (tests; an operator redefined in place is planned anew anyway)."""
    with _lock:
        _plans.clear()
        _graphs.clear()
        _never.clear()
