"""The ``inline`` patch: bound executors and hybridized blocks run inlinable ops as MXNet's own.

Off-switch: ``CUSTOMOP_RUNTIME_OFF=inline``; installed by the first Symbol call, or
graph load, of an ``'mxnet'``-mode op that may inline in training: no aux,
``inline=True`` (``def_grad`` ops too: their closures are transposed,
:mod:`customop.custom_grad`).

Wraps ``Symbol.simple_bind``, ``Symbol.bind`` and ``CachedOp.__init__``.  A graph
without a ``Custom`` node of such an op is bound or cached as before, after one
``debug_str`` per bind or CachedOp, never per call (measured: 0.04 ms on a
60-node graph; unrelated models' steps unchanged, ``benchmarks/isolation.py``).
In a graph with one, each such node whose forward traces faithfully is replaced
by its operators
(:mod:`customop.training_graphs`): an executor binds the inlined graph and is shown with
the original argument order, names and ``reshape``; a CachedOp settles at its
first call (when the input shapes are known) and from then on is MXNet's
CachedOp of the inlined graph (its handle moved into the one Gluon holds), or,
when that graph lists its inputs in another order or depends on the input
dtype, reorders its inputs per call.  Measured (``benchmarks/native_graphs.py``):
hybridized forward+backward of one decorated ``x * x`` cost 5.6x / 5.5x / 2.2x the
same ``broadcast_mul`` written natively at 10 / 1e3 / 1e6 elements as a ``Custom``
node, and 0.95-1.00x inlined.  Switched off, every op keeps its ``Custom`` node.
"""
from __future__ import annotations

import functools
import threading
from typing import Any

import mxnet as mx

from .. import native, runtime, training_graphs
from . import aux

_plans: dict[int, Any] = {}  # id(CachedOp) -> its CachedPlan, until the first call
_inner = threading.local()  # .building: a CachedOp made for a plan (never planned itself)


def wanted(op: Any) -> bool:
    """Whether ``op`` may inline in training graphs (then this patch is needed)."""
    return not native.static_reason(op, native.TRAIN)


class _PlannedCachedOp(mx.nd.CachedOp):
    """A CachedOp whose graph holds ops that inline: settled at its first call."""

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


def adopt(outer: mx.nd.CachedOp, inner: mx.nd.CachedOp) -> None:
    """``outer`` runs ``inner``'s graph from now on, as a CachedOp of MXNet's own class."""
    outer.handle, inner.handle = inner.handle, outer.handle  # each frees the one it holds
    outer.is_np_sym = inner.is_np_sym
    _plans.pop(id(outer), None)
    aux.moved(outer, inner)
    outer.__class__ = type(inner)


class CachedPlan:
    """What a CachedOp of a graph with inlinable ops runs, settled at its first call.

    At the first call the input shapes are known: the graph is inlined and a
    CachedOp of the inlined graph is made.  When its inputs come in the same
    order and its graph holds for every input dtype, that CachedOp's handle is
    moved into the one Gluon holds (:func:`adopt`), so later calls cost what
    MXNet's own cost; else each call reorders its inputs (and picks the graph of
    its input dtypes).
    """

    def __init__(self, sym: mx.sym.Symbol, flags):
        self.sym, self.flags = sym, list(flags)
        self.names = sym.list_inputs()
        self.built: dict[Any, tuple[Any, list[int] | None]] = {}  # dtypes -> (CachedOp, order)
        self.keyed = False
        self.lock = threading.Lock()

    def call(self, outer, args, kwargs):
        key = tuple(a.dtype for a in args) if self.keyed else None
        found = self.built.get(key)
        if found is None:
            with self.lock:
                found = self.built.get(key) or self._build(outer, args)
            if found is None:  # moved into ``outer``, which is a plain CachedOp again
                return outer(*args, **kwargs)
        inner, order = found
        if order is not None:
            args = [args[i] for i in order]
        return inner(*args, **kwargs)

    def _build(self, outer, args):
        shapes = {n: a.shape for n, a in zip(self.names, args)}
        dtypes = {n: a.dtype for n, a in zip(self.names, args)}
        found = training_graphs.spliced(self.sym, shapes, dtypes)
        sym, order = self.sym, None
        if found is not None:
            sym = found.symbol.as_np_ndarray() if outer.is_np_sym else found.symbol
            new = sym.list_inputs()
            order = [self.names.index(n) for n in new]
            if order == list(range(len(order))):
                order = None
            self.keyed = not found.dtype_generic
        inner = inner_cached_op(sym, self._flags(sym.list_inputs()))
        if not self.keyed and order is None:
            adopt(outer, inner)
            return None
        key = tuple(a.dtype for a in args) if self.keyed else None
        self.built[key] = (inner, order)
        return inner, order

    def _flags(self, names: list[str]) -> list:
        # Gluon passes which inputs are data and which parameters, by position.
        out = []
        for key, value in self.flags:
            if key in ("data_indices", "param_indices"):
                chosen = {self.names[i] for i in value}
                value = [i for i, n in enumerate(names) if n in chosen]
            out.append((key, value))
        return out


def cached_plan(sym: mx.sym.Symbol, flags) -> CachedPlan | None:
    """A plan for a new CachedOp of ``sym``, or None when nothing in it may inline."""
    if runtime.disabled("inline") or not training_graphs.holds_inlinable(sym):
        return None
    return CachedPlan(sym, flags)


def install() -> None:
    simple_bind, bind = mx.sym.Symbol.simple_bind, mx.sym.Symbol.bind
    cached_init = mx.nd.CachedOp.__init__

    def simple_bind_(self, ctx, grad_req="write", type_dict=None, stype_dict=None,
                     group2ctx=None, shared_arg_names=None, shared_exec=None,
                     shared_buffer=None, **kwargs):
        return training_graphs.simple_bind(simple_bind, self, ctx, grad_req, type_dict,
                                           stype_dict, group2ctx, shared_arg_names,
                                           shared_exec, shared_buffer, **kwargs)

    def bind_(self, ctx, args, args_grad=None, grad_req="write", aux_states=None,
              group2ctx=None, shared_exec=None):
        return training_graphs.bind(bind, self, ctx, args, args_grad, grad_req, aux_states,
                                    group2ctx, shared_exec)

    def cached_init_(self, sym, flags=()):
        cached_init(self, sym, flags)
        if getattr(_inner, "building", False):
            return
        plan = cached_plan(sym, flags)
        if plan is not None:
            aux.forget(self)  # the graph it runs is the plan's
            _plans[id(self)] = plan
            self.__class__ = _PlannedCachedOp

    functools.update_wrapper(simple_bind_, simple_bind)
    functools.update_wrapper(bind_, bind)
    mx.sym.Symbol.simple_bind, mx.sym.Symbol.bind = simple_bind_, bind_
    mx.nd.CachedOp.__init__ = cached_init_
