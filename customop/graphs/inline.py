"""The ``inline`` patch: bound executors and hybridized blocks run inlinable ops as MXNet's own.

Off-switch: ``CUSTOMOP_RUNTIME_OFF=inline``; installed by the first Symbol call, or
graph load, of an ``'mxnet'``-mode op that may inline in training: no aux,
``inline=True`` (``def_grad`` ops too: their closures are transposed,
:mod:`customop.graphs.backward`).

Wraps ``Symbol.simple_bind``, ``Symbol.bind`` and ``CachedOp.__init__``.  A graph
without a ``Custom`` node of such an op is bound or cached as before, after one
``debug_str`` per bind or CachedOp, never per call (unrelated models' steps unchanged,
``benchmarks/isolation.py``).
In a graph with one, each such node whose forward traces faithfully is replaced
by its operators
(:mod:`customop.graphs.binding`): an executor binds the inlined graph and is shown with
the original argument order, names and ``reshape`` (a reshape to a signature the
inlined graph does not serve binds again); a CachedOp settles each new input
signature once (the original graph's shape and type passes run the ops' checks,
then the graph is inlined at that signature) and runs MXNet's CachedOp of the
graph settled for the signature of each call (one dict lookup).  An inlined op costs
about what the same operators written natively cost, a ``Custom`` node several times
that (measured, ``benchmarks/native_graphs.py``: docs/design.md, *What customop changes
in MXNet*).  Switched off, every op keeps its ``Custom`` node.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from typing import Any

import mxnet as mx
from mxnet.base import _LIB

from .. import runtime, symbol_json
from ..runtime import aux_wait, runahead
from . import binding, graph_verdicts
from .call_key import signature

_plans: dict[int, Any] = {}  # id(CachedOp) -> its CachedPlan
_inner = threading.local()  # .building: a CachedOp made for a plan (never planned itself)


def wanted(op: Any) -> bool:
    """Whether ``op`` may inline in training graphs (then this patch is needed)."""
    return not graph_verdicts.static_reason(op, graph_verdicts.TRAIN)


class _PlannedCachedOp(mx.nd.CachedOp):
    """A CachedOp whose graph holds ops that inline: each call runs what its plan settled
    for the call's input signature (see :class:`CachedPlan`)."""

    __slots__ = ()

    def __call__(self, *args, **kwargs):
        return _plans[id(self)].call(self, args, kwargs)

    def __del__(self):
        _plans.pop(id(self), None)
        super().__del__()


def inner_cached_op(sym, flags) -> mx.nd.CachedOp:
    """The CachedOp a plan runs (the ``aux`` patch applies to it; ``inline`` does not)."""
    _inner.building = True
    try:
        return mx.nd.CachedOp(sym, flags)
    finally:
        _inner.building = False


_get_symbol, _free_symbol = _LIB.MXAutogradGetSymbol, _LIB.MXSymbolFree
_get_grad, _free_array = _LIB.MXNDArrayGetGrad, _LIB.MXNDArrayFree


def _in_autograd(arr) -> bool:
    # Whether autograd can carry a gradient to ``arr``: it has one attached or was recorded
    # (MXNet keeps a node for it; costly for an array without one, measured in
    # docs/design.md: the failed call builds an error with a stack trace).
    handle = ctypes.c_void_p()
    if _get_symbol(arr.handle, ctypes.byref(handle)) != 0:
        return False
    _free_symbol(handle)
    return True


def _has_grad(arr) -> bool:
    # Whether ``arr`` has a gradient attached (cheap, never fails): all a Gluon parameter's
    # data can have, as it is never the output of a recorded operator.
    handle = ctypes.c_void_p()
    _get_grad(arr.handle, ctypes.byref(handle))
    if not handle.value:
        return False
    _free_array(handle)
    return True


def needs_grad(args, which, params=()) -> tuple:
    """Which of ``args[i]`` (``i`` in ``which``) can get a gradient from this call
    (``params``: the positions of Gluon parameters among them, asked the cheap way)."""
    if not mx.autograd.is_recording():
        return (False,) * len(which)
    return tuple(_has_grad(args[i]) if i in params else _in_autograd(args[i]) for i in which)


class CachedPlan:
    """What a CachedOp of a graph with inlinable ops runs, settled per input signature.

    MXNet's CachedOp takes any input shapes and dtypes, but an inlined graph was
    traced at one signature and runs none of the op's Python checks.  So each
    new signature (the shapes and dtypes of the data inputs; parameters keep
    theirs) is settled once, under a lock: the original graph's shape and type
    passes run first (the ops' own checks: a bad signature raises the op's named
    error before anything computes), then the graph is inlined at that
    signature.  Signatures whose inlined graphs are the same share one CachedOp
    of it; a signature where nothing inlines runs a CachedOp of the original
    graph (``Custom`` nodes).  A graph traced for one signature never runs at
    another it was not settled for.  A repeated signature costs one dict lookup.
    Where a ``def_grad`` op can run its forward alone (none of its differentiated
    inputs can need a gradient), the graph also depends on which inputs feeding it
    autograd records in this call (:func:`needs_grad`: one C call per such input,
    none when not recording).
    """

    is_np_sym = False  # the CachedOp's graph is a NumPy-API Symbol (set by the patch)

    def __init__(self, sym: mx.sym.Symbol, flags):
        self.sym, self.flags = sym, list(flags)
        self.names = sym.list_inputs()
        data = dict(self.flags).get("data_indices")
        self.data = list(data) if data is not None else list(range(len(self.names)))
        self.params = frozenset(dict(self.flags).get("param_indices") or ())
        self.built: dict[Any, tuple[Any, list[int] | None]] = {}  # signature -> (CachedOp, order)
        self.by_graph: dict[str, tuple[Any, list[int] | None]] = {}  # anonymous graph -> same
        self.by_symbol: dict[int, tuple[Any, Any]] = {}  # id of a spliced Symbol -> it, same
        self.text: str | None = None  # self.sym.tojson(), once (nothing changes the Symbol)
        self.lock = threading.Lock()

    def call(self, outer, args, kwargs):
        key = signature(args, self.data)
        found = self.built.get(key)
        if found is None:
            with self.lock:  # (_build answers for this call: no second look at the grads)
                found = self.built.get(key) or self._build(key, args)
        if isinstance(found, _ByGrads):
            mask = needs_grad(args, found.inputs, self.params)
            by_mask = found.built.get(mask)
            if by_mask is None:
                with self.lock:
                    by_mask = found.built.get(mask) or self._build(key, args, found, mask)
            found = by_mask
        inner, order = found
        if order is not None:
            args = [args[i] for i in order]
        outs = inner(*args, **kwargs)
        if runtime.is_installed("runahead"):
            runahead.step(outs)
        return outs

    def _build(self, key, args, by_grads=None, mask=None):
        if not all(d > 0 for i in self.data for d in args[i].shape) and self.by_graph:
            # An empty batch fails in MXNet's own passes as it does for native blocks
            # (documented with that baseline): it runs the graph settled first, unchecked.
            return next(iter(self.by_graph.values()))
        shapes = {n: a.shape for n, a in zip(self.names, args)}
        dtypes = {n: a.dtype for n, a in zip(self.names, args)}
        known = None
        if self.text is None:
            self.text = self.sym.tojson()
        if by_grads is None:
            known = binding.checked(self.sym, shapes, dtypes, self.text)
            everything = range(len(self.names))
            grads = {
                self.names[i]
                for i, m in zip(everything, needs_grad(args, everything, self.params))
                if m
            }
        else:
            grads = {self.names[i] for i, m in zip(by_grads.inputs, mask) if m}
        found = binding.spliced(
            self.sym, shapes, dtypes, grads, known, self.text, remember=False
        )  # (kept here, by signature: self.built)
        built = self._cached(found)
        if by_grads is not None:
            by_grads.built[mask] = built
            return built
        if found is not None and found.switches:
            # which graph runs depends on which of these inputs can need a gradient
            which = [i for i, n in enumerate(self.names) if n in found.switches]
            by_grads = self.built[key] = _ByGrads(which)
            by_grads.built[tuple(self.names[i] in grads for i in which)] = built
            return built
        self.built[key] = built
        return built

    def _cached(self, found):
        sym, order = self.sym, None
        known = self.by_symbol.get(id(found.symbol)) if found is not None else None
        if known is not None and known[0] is found.symbol:
            return known[1]  # a shape family's signatures share the spliced Symbol
        if found is not None:
            sym = found.symbol.as_np_ndarray() if self.is_np_sym else found.symbol
            order = [self.names.index(n) for n in sym.list_inputs()]
            if order == list(range(len(order))):
                order = None
        shape = symbol_json.anonymous(sym)
        built = self.by_graph.get(shape)
        if built is None:
            inner = inner_cached_op(sym, self._flags(sym.list_inputs()))
            built = self.by_graph[shape] = (inner, order)
        if found is not None:
            if len(self.by_symbol) >= 8:  # (a few: a new Symbol a signature would pile up)
                del self.by_symbol[next(iter(self.by_symbol))]
            self.by_symbol[id(found.symbol)] = (found.symbol, built)
        return built

    def _flags(self, names: list[str]) -> list:
        # Gluon passes which inputs are data and which parameters, by position.
        out = []
        for key, value in self.flags:
            if key in ("data_indices", "param_indices"):
                chosen = {self.names[i] for i in value}
                value = [i for i, n in enumerate(names) if n in chosen]
            out.append((key, value))
        return out


class _ByGrads:
    """Graphs of one signature by which of ``inputs`` can need a gradient: a ``def_grad`` op
    none of whose differentiated inputs can runs its forward alone (:func:`splice.inline`)."""

    __slots__ = ("inputs", "built")

    def __init__(self, inputs: list[int]):
        self.inputs, self.built = inputs, {}


def cached_plan(sym: mx.sym.Symbol, flags) -> CachedPlan | None:
    """A plan for a new CachedOp of ``sym``, or None when nothing in it may inline."""
    if runtime.disabled("inline") or not binding.holds_inlinable(sym):
        return None
    return CachedPlan(sym, flags)


def install() -> None:
    simple_bind, bind = mx.sym.Symbol.simple_bind, mx.sym.Symbol.bind
    cached_init = mx.nd.CachedOp.__init__

    # (MXNet's signatures, which update_wrapper shows, are binding.simple_bind's and bind's)
    def simple_bind_(self, ctx, *args, **kwargs):
        return binding.simple_bind(simple_bind, self, ctx, *args, **kwargs)

    def bind_(self, ctx, args, *rest, **kwargs):
        return binding.bind(bind, self, ctx, args, *rest, **kwargs)

    def cached_init_(self, sym, flags=()):
        cached_init(self, sym, flags)
        if getattr(_inner, "building", False):
            return
        plan = cached_plan(sym, flags)
        if plan is not None:
            plan.is_np_sym = self.is_np_sym
            aux_wait.forget(self)  # the graph it runs is the plan's
            _plans[id(self)] = plan
            self.__class__ = _PlannedCachedOp

    functools.update_wrapper(simple_bind_, simple_bind)
    functools.update_wrapper(bind_, bind)
    mx.sym.Symbol.simple_bind, mx.sym.Symbol.bind = simple_bind_, bind_
    mx.nd.CachedOp.__init__ = cached_init_
