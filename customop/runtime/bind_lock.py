"""The ``binds`` patch: binds of graphs holding our ops run one at a time.

Off-switch: ``CUSTOMOP_RUNTIME_OFF=binds``; installed by the first graph node or
``mx.nd.Custom`` call of one of our ops.

MXNet's ``Executor::SimpleBind`` and ``Executor::Bind`` partition every graph
with the subgraph backend (``MKLDNN`` by default in the CPU wheel, "Subgraph
backend MKLDNN is activated"), and that pass keeps its working state in the
backend's process-wide subgraph properties: each bind sets and removes their
``graph`` and ``op_names`` attributes (``src/executor/graph_executor.cc``,
``BuildSubgraph``).  Two threads binding at once corrupt that map or partition
each other's graph (apache/mxnet#20296 saw it in the C predict API): threads binding
one Symbol aborted the process, for a graph of MXNet's own operators (customop not
imported: segmentation fault, ``std::length_error``) as for one holding our ops (with
the ``shapes`` and ``names`` fixes: ``free(): invalid pointer``, ``free(): invalid
size``; under gdb, a crash in the attribute map's ``erase`` called from
``Executor::SimpleBind``), and never with ``MXNET_SUBGRAPH_BACKEND=NONE`` (measured:
docs/design.md, *What customop changes in MXNet*).  So ``Symbol.simple_bind``
and ``Symbol.bind`` are wrapped: a graph holding a ``Custom`` node of ours, or
the inlined graph the ``inline`` patch binds in its place (:func:`serialized`),
is bound under one process-wide lock; any other graph is bound at once, after
one ``debug_str``, as MXNet binds it (binds of MXNet's own graphs from several
threads stay as unsafe as MXNet makes them: set ``MXNET_SUBGRAPH_BACKEND=NONE``,
or bind from one thread).  With it, no bind of our Symbol failed, inlined or not.  A child
forked while a thread of the parent binds starts with a free lock.  Switched off,
binds of our graphs run concurrently again.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from typing import Any

import mxnet as mx

from .. import runtime, symbol_json

_lock = threading.RLock()  # held around MXNet's bind of a graph of ours
_inside = threading.local()  # .depth: the serialized() contexts this thread is in
_ours: set[str] = set()  # the op_types of our props MXNet has created


def adopt_prop(op_type: str) -> None:
    """MXNet created a prop of ours (a graph node or ``mx.nd.Custom`` call): install ``binds``,
    and bind graphs holding ``op_type`` one at a time."""
    if op_type not in _ours:
        _ours.add(op_type)
    runtime.install("binds")


def serialized() -> Any:
    """A context in which to bind a graph of ours that holds no ``Custom`` node of ours (the
    ``inline`` patch's inlined graphs): the lock, or nothing when ``binds`` is off.  A bind
    inside it skips the look for our nodes (the lock is this thread's already)."""
    return _held() if runtime.is_installed("binds") else contextlib.nullcontext()


@contextlib.contextmanager
def _held() -> Any:
    with _lock:
        _inside.depth = getattr(_inside, "depth", 0) + 1
        try:
            yield
        finally:
            _inside.depth -= 1


def holds_ours(sym: mx.sym.Symbol) -> bool:
    """Whether ``sym`` holds a ``Custom`` node of one of our ops."""
    graph = symbol_json.graph_of(sym)
    return graph is not None and any(
        op_type in _ours for _, _, op_type in symbol_json.custom_nodes(graph)
    )


def _new_lock() -> None:
    # a child forked while another thread of the parent was binding would wait forever
    global _lock
    _lock = threading.RLock()


def install() -> None:
    os.register_at_fork(after_in_child=_new_lock)
    simple_bind, bind = mx.sym.Symbol.simple_bind, mx.sym.Symbol.bind

    # (inside serialized() the lock is held: no debug_str of the inlined graph, 0.04 ms)
    def simple_bind_(self, *args, **kwargs):
        if getattr(_inside, "depth", 0) or not holds_ours(self):
            return simple_bind(self, *args, **kwargs)
        with _lock:
            return simple_bind(self, *args, **kwargs)

    def bind_(self, *args, **kwargs):
        if getattr(_inside, "depth", 0) or not holds_ours(self):
            return bind(self, *args, **kwargs)
        with _lock:
            return bind(self, *args, **kwargs)

    functools.update_wrapper(simple_bind_, simple_bind)
    functools.update_wrapper(bind_, bind)
    mx.sym.Symbol.simple_bind, mx.sym.Symbol.bind = simple_bind_, bind_
