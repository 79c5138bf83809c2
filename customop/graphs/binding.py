"""Bound and hybridized models run with our inlinable ops inlined, shown as the original.

A model's executors and CachedOps, not one op's graph (built by
:mod:`customop.graphs.forward` and :mod:`customop.graphs.backward`).

MXNet builds a graph's executor at ``Symbol.bind``/``simple_bind`` (shapes
known) and a hybridized block's ``CachedOp`` before its first call (shapes known
at that call).  At those moments the ``inline`` patch (:mod:`customop.graphs.inline`)
hands the graph here: each ``Custom`` node of an operator that inlines for
training (:mod:`customop.graphs.graph_verdicts`) is replaced by its native graph
(:mod:`customop.graphs.splice`), and the executor or CachedOp runs that graph.  What
users see stays the same: the executor's ``arg_dict``, ``arg_arrays`` (in the
original order, which Module relies on), ``output_dict`` and ``reshape``; the
CachedOp's inputs.  Graphs without such a node are left alone.
"""

from __future__ import annotations

import copy
import json
import threading
import warnings
import weakref
from typing import Any

import mxnet as mx
import numpy as np

from .. import budget, runtime, symbol_json
from ..runtime import bind_lock
from . import graph_verdicts, saved_splices, splice

# Splices by graph, its ops, signature and the inputs that need gradients: a rebind at a
# signature seen before (Module.reshape back, a bucket seen before, a serving process)
# splices and tidies nothing.  Under the memory budget of customop.budget, least
# recently used out: an entry costs its key's graph JSON and the spliced graph (estimated
# at SPLICE_FACTOR times that text), or a recalled entry's cost when nothing inlined.
_splices = budget.Table()
_splices_lock = threading.Lock()
SPLICE_FACTOR = 3


def spliced(
    sym: mx.sym.Symbol,
    shapes: Any,
    dtypes: Any,
    grads: set[str] | None = None,
    known: splice.Inferred | None = None,
    text: str | None = None,
    saved: bool = False,
    remember: bool = True,
) -> splice.Spliced | None:
    """``sym`` inlined for training, or None when nothing in it inlines.

    ``shapes``, ``dtypes``: by input name, or functions giving them (called only when the
    graph holds an op that may inline: a graph without one costs one ``debug_str``;
    ``dtypes`` is given the graph's :class:`_Read`, where ``simple_bind``'s defaults are kept).
    ``grads``: the inputs that can need a gradient (None: any; see :func:`splice.inline`), or
    a function of the graph's :class:`_Read` giving them.
    ``known``: what :func:`checked` returned at these shapes and dtypes (its passes are
    not run again).  ``text``: ``sym.tojson()``, from a caller that keeps it (a Symbol
    nothing changes).  ``saved``: a process's first splice of this graph may be read from
    (and is written to) :mod:`customop.graphs.saved_splices` (executors' binds: a process
    often binds a model once; a hybridized block, which meets many signatures, fills this
    process's tables at its first one instead).  ``remember``: the splice is kept in this
    module's table by signature (binds); a caller that keeps its own per signature (a
    hybridized block's plan) passes False: its entries would only be found again by that
    caller, which never asks twice, and would take the budget's room from the others.
    """
    if runtime.disabled("inline"):
        return None
    if text is None:
        handle = sym.handle.value
        if handle not in _holding:
            if "Op:Custom," not in sym.debug_str():  # symbol_json.graph_of's cheap look
                return None
            if len(_holding) >= _HOLDING_MAX:
                _holding.clear()
            _holding.add(handle)
        text = sym.tojson()
    read = _read(text)
    graph = read.graph
    ours = splice.ours(graph)
    if not any(not graph_verdicts.static_reason(op, graph_verdicts.TRAIN) for _, op in ours):
        return None
    if callable(shapes):
        shapes = shapes()
    if callable(dtypes):
        dtypes = dtypes(read)
    if callable(grads):
        grads = grads(read)
    key = None
    if remember or saved:
        key = (
            text,
            tuple(op for _, op in ours),
            _signature(shapes),
            _signature(dtypes),
            None if grads is None else frozenset(grads),
        )
        with _splices_lock:
            if key in _splices:
                _splices.move_to_end(key)
                return _splices[key]
    # (a process's first look at the graph reads the splice an earlier process saved)
    file_key = saved_splices.key_of(text, list(key[1]), key[2:]) if saved else None
    found = saved_splices.recalled(file_key, graph) if file_key is not None else None
    if found is not None:
        found.source = text
        cost = budget.RECALLED + SPLICE_FACTOR * len(text)
        with _splices_lock:
            _splices.keep(key, found, cost)
            _read_first[text] = (found.signatures, found.verdicts_key)
        return found
    with _splices_lock:
        first = _read_first.pop(text, None)
    if first is not None:  # (the first splice of this graph was read: its tables are empty)
        _fill(first, graph)
    try:
        found = splice.inline(
            sym,
            shapes,
            dtypes,
            graph_verdicts.TRAIN,
            graph=graph,
            grads=grads,
            known=known,
            text=text,
        )
    except Exception as exc:  # noqa: BLE001 - the graph still runs, as Custom nodes
        warnings.warn(
            f"customop: the graph keeps its Custom nodes; inlining failed with "
            f"{type(exc).__name__}: {exc}",
            RuntimeWarning,
            stacklevel=4,
        )
        return None
    if found is None or not found.inlined:
        found = None
    elif _inputs_of(found.symbol) != read.inputs_of(sym):
        found = None  # an input no inlined graph reads: the executor would lose it
    else:
        found.source = text
    if found is not None and file_key is not None:
        saved_splices.keep(file_key, found)
    if key is not None:
        cost = budget.RECALLED + (SPLICE_FACTOR * len(text) if found is not None else len(text))
        with _splices_lock:
            _splices.keep(key, found, cost)
    return found


# The handles of Symbols seen holding a Custom node: a rebind of the same Symbol skips the
# cheap look for one (debug_str, 0.05-0.1 ms of a rebind of the RetinaNet-style head,
# measured) and reads its text, which decides everything else.  Only "holds one" is kept: a
# Symbol changed in place (``_compose``), or another one at a freed handle's address, is
# read from its text all the same (one without our nodes then binds as it is).
_holding: set[int] = set()
_HOLDING_MAX = 4096


# Graphs whose first splice in this process was read from the saved files
# (customop.graphs.saved_splices), by text, with the input signature of each node that
# splice inlined and the key of the ops' verdicts saved with it: before another signature of
# the graph splices, the ops' graphs are asked for at those signatures, as the first splice
# asked (taken from those verdicts: one file, not one per op),
# which fills their shape families, so that the new signature is served by its family as it
# would have been (else it would be traced and checked anew: its own verdict was never
# saved, its family's was).  The rest of what a first splice fills (the spliced graph, its
# tidying and Symbol) is read back too (customop.graphs.saved_tidy, splice.adopt).
_read_first: dict[str, tuple] = {}


def _fill(first: tuple, graph: dict[str, Any]) -> None:
    signatures, key = first  # (the ops' verdicts saved with the splice: one file)
    try:
        saved = saved_splices.verdicts(key) if key is not None else None
        splice.ask(graph, signatures, graph_verdicts.TRAIN, saved)
    except Exception:  # noqa: BLE001 - it passed in the process that saved it: the next one
        pass  # splices as it would have anyway


def clear_cache() -> None:
    """Forget every splice (tests; an op redefined in place is spliced again anyway)."""
    with _splices_lock:
        _splices.clear()
        _read_first.clear()
        _holding.clear()
    splice.clear_cache()
    with _texts_lock:
        _texts.clear()
    with _orders_lock:
        _orders.clear()


class _Read:
    """What binds read from one graph's JSON text: the graph, and the dtypes ``simple_bind``
    assumes for its arguments (filled at the first bind that asks)."""

    __slots__ = ("graph", "default_dtypes", "arguments", "inputs")

    def __init__(self, graph: dict[str, Any]) -> None:
        self.graph, self.default_dtypes = graph, None
        self.arguments: list[str] | None = None  # the Symbol's list_arguments(), once asked
        self.inputs: frozenset[str] | None = None  # and its list_inputs()

    def inputs_of(self, sym: mx.sym.Symbol) -> frozenset[str]:
        """``sym.list_inputs()`` as a set (``sym``: a Symbol of this text), read once."""
        if self.inputs is None:
            self.inputs = frozenset(sym.list_inputs())
        return self.inputs

    def arguments_of(self, sym: mx.sym.Symbol) -> list[str]:
        """``sym.list_arguments()`` (``sym``: a Symbol of this text), read once."""
        if self.arguments is None:
            self.arguments = sym.list_arguments()
        return self.arguments


# _Read by a graph's JSON text: a rebind of a graph bound before parses nothing (json.loads
# and attr_dict, 0.06 and 0.07 ms for the RetinaNet-style head: most of a rebind's Python).
# Nothing changes a graph read here (the splice copies the nodes it writes).  Under the
# memory budget of customop.budget (a parsed graph estimated at SPLICE_FACTOR times its text).
_texts = budget.Table()
_texts_lock = threading.Lock()


def _read(text: str) -> _Read:
    with _texts_lock:
        found = _texts.recall(text)
    if found is None:
        found = _Read(json.loads(text))
        with _texts_lock:
            _texts.keep(text, found, budget.RECALLED + SPLICE_FACTOR * len(text))
    return found


def _signature(by_name: dict[str, Any]) -> tuple:
    # (a dtype stays a np.dtype, equal and hashed as its name: str() costs 2 us each)
    return tuple(
        sorted(
            (n, tuple(map(int, v)) if isinstance(v, (tuple, list)) else np.dtype(v))
            for n, v in by_name.items()
        )
    )


def _default_dtypes(
    sym: mx.sym.Symbol, type_dict: dict | None, read: _Read | None = None
) -> dict[str, Any]:
    # What simple_bind assumes: float32 for every argument without a __dtype__ attribute
    # (``read``: the graph's _Read, which keeps them).
    found = read.default_dtypes if read is not None else None
    if found is None and read is not None:  # (the variables' attributes, read from its text)
        attrs = {n["name"]: symbol_json.attrs(n) for n in read.graph["nodes"] if n["op"] == "null"}
        found = read.default_dtypes = {
            n: np.float32 for n in read.arguments_of(sym) if "__dtype__" not in attrs.get(n, {})
        }
    elif found is None:
        attrs = sym.attr_dict()
        found = {n: np.float32 for n in sym.list_arguments() if "__dtype__" not in attrs.get(n, {})}
    return {**found, **(type_dict or {})}


def simple_bind(
    original,
    sym,
    ctx,
    grad_req="write",
    type_dict=None,
    stype_dict=None,
    group2ctx=None,
    shared_arg_names=None,
    shared_exec=None,
    shared_buffer=None,
    **shapes,
):
    """``Symbol.simple_bind`` of ``sym`` with its inlinable ops inlined."""
    if isinstance(grad_req, (list, tuple)):
        grad_req = dict(zip(sym.list_arguments(), grad_req))
    asked: list[set[str]] = []  # (the graph's names are read once per text: _Read)

    def grads(read: _Read) -> set[str]:
        asked.append(wanting(sym, grad_req, names=read.arguments_of(sym)))
        return asked[-1]

    def call(symbol, shapes):
        return original(
            symbol,
            ctx,
            grad_req,
            type_dict,
            stype_dict,
            group2ctx,
            shared_arg_names,
            shared_exec,
            shared_buffer,
            **shapes,
        )

    found = spliced(
        sym, shapes, lambda read: _default_dtypes(sym, type_dict, read), grads, saved=True
    )
    if found is None:
        return call(sym, shapes)
    wanted = asked[-1] if asked else wanting(sym, grad_req)
    # (the shape pass that found the ops' input signatures found every input's shape too)
    all_shapes = (
        {**found.input_shapes, **shapes}
        if found.input_shapes is not None
        else _all_shapes(sym, shapes)
    )
    with bind_lock.serialized():  # MXNet's binds race (customop.runtime.bind_lock)
        exe = call(found.symbol, all_shapes)
    return present(exe, sym, found.symbol, wanted, found.source)


def wanting(
    sym: mx.sym.Symbol, grad_req: Any, args_grad: Any = True, names: list[str] | None = None
) -> set[str]:
    """The arguments of ``sym`` a bind with ``grad_req`` (and ``args_grad``) gives gradients
    (``names``: ``sym.list_arguments()``, when the caller has it)."""
    names = names if names is not None else sym.list_arguments()
    if args_grad is None:
        return set()
    if isinstance(args_grad, dict):
        names = [n for n in names if args_grad.get(n) is not None]
    if isinstance(grad_req, str):
        return set(names) if grad_req != "null" else set()
    return {n for n in names if grad_req.get(n, "null") != "null"}


def _all_shapes(sym: mx.sym.Symbol, shapes: dict[str, tuple]) -> dict[str, tuple]:
    # The shapes the original graph infers for every input: an op's infer_input_shape= (a
    # weight's shape from its parameters) leaves with its Custom node.
    # (simple_bind takes shapes of names the graph lacks, ignored: so are they here)
    inputs = set(sym.list_inputs())
    args, _, aux = sym.infer_shape_partial(**{k: v for k, v in shapes.items() if k in inputs})
    found = {
        n: tuple(s) for n, s in zip(sym.list_arguments(), args or []) if s and all(d > 0 for d in s)
    }
    found.update(
        (n, tuple(s))
        for n, s in zip(sym.list_auxiliary_states(), aux or [])
        if s and all(d > 0 for d in s)
    )
    found.update(shapes)
    return found


def bind(
    original,
    sym,
    ctx,
    args,
    args_grad=None,
    grad_req="write",
    aux_states=None,
    group2ctx=None,
    shared_exec=None,
):
    """``Symbol.bind`` of ``sym`` with its inlinable ops inlined."""
    names, aux_names = sym.list_arguments(), sym.list_auxiliary_states()
    arg_map = dict(zip(names, args)) if isinstance(args, (list, tuple)) else dict(args)
    aux_map = (
        dict(zip(aux_names, aux_states))
        if isinstance(aux_states, (list, tuple))
        else dict(aux_states or {})
    )
    arrays = {**arg_map, **aux_map}
    found = None
    grad_map = (
        {n: g for n, g in zip(names, args_grad) if g is not None}
        if isinstance(args_grad, (list, tuple))
        else args_grad
    )
    req = dict(zip(names, grad_req)) if isinstance(grad_req, (list, tuple)) else grad_req
    grads = wanting(sym, req, grad_map)
    if all(isinstance(a, mx.nd.NDArray) for a in arrays.values()):
        found = spliced(
            sym,
            lambda: {n: a.shape for n, a in arrays.items()},
            lambda _: {n: a.dtype for n, a in arrays.items()},
            grads,
            saved=True,
        )
    if found is None:
        return original(sym, ctx, args, args_grad, grad_req, aux_states, group2ctx, shared_exec)
    with bind_lock.serialized():  # MXNet's binds race (customop.runtime.bind_lock)
        exe = original(found.symbol, ctx, arg_map, grad_map, req, aux_map, group2ctx, shared_exec)
    return present(exe, sym, found.symbol, grads, found.source)


def present(
    exe: mx.executor.Executor,
    original: mx.sym.Symbol,
    inlined: mx.sym.Symbol,
    grads: set[str] | None = None,
    source: str | None = None,
) -> mx.executor.Executor:
    """Make an executor of ``inlined`` look like one of ``original`` (names, order, reshape;
    ``source``: ``original.tojson()``, when the caller has it)."""
    order, aux_order = _order(original, inlined, source)
    exe.arg_arrays = [exe.arg_arrays[i] for i in order]
    if exe.grad_arrays:
        exe.grad_arrays = [exe.grad_arrays[i] for i in order]
    exe.aux_arrays = [exe.aux_arrays[i] for i in aux_order]
    exe._symbol = copy.deepcopy(original)
    exe._arg_dict = exe._grad_dict = exe._aux_dict = exe._output_dict = None
    exe.customop_inlined = inlined  # the graph the executor runs
    exe.reshape = _Reshape(weakref.ref(exe), original, inlined, grads)
    return exe


# Where each argument and aux state of a graph sits in its inlined graph's lists, by the
# inlined Symbol (one a shape family: customop.graphs.splice) and the graph's JSON text, and
# the inlined Symbol's inputs by the Symbol: a bind at a new signature of a family reads no
# names (six list calls and the lookups, 65 us of a bind, measured).  Under the memory
# budget of customop.budget.
_orders = budget.Table()
_orders_lock = threading.Lock()


def _inputs_of(inlined: mx.sym.Symbol) -> frozenset[str]:
    # an inlined Symbol's inputs, read once (nothing changes the Symbols a splice makes)
    with _orders_lock:
        found = _orders.recall(id(inlined))
    if found is not None and found[0] is inlined:
        return found[1]
    inputs = frozenset(inlined.list_inputs())
    with _orders_lock:
        _orders.keep(id(inlined), (inlined, inputs), budget.RECALLED)
    return inputs


def _order(
    original: mx.sym.Symbol, inlined: mx.sym.Symbol, source: str | None
) -> tuple[list[int], list[int]]:
    key = (id(inlined), source)
    if source is not None:
        with _orders_lock:
            found = _orders.recall(key)
        if found is not None and found[0] is inlined:
            return found[1], found[2]
    args, aux = inlined.list_arguments(), inlined.list_auxiliary_states()
    order = [args.index(n) for n in original.list_arguments()]
    aux_order = [aux.index(n) for n in original.list_auxiliary_states()]
    if source is not None:
        with _orders_lock:  # (the inlined Symbol kept with it: its id is in the key)
            _orders.keep(key, (inlined, order, aux_order), budget.RECALLED)
    return order, aux_order


class _Reshape:
    """``Executor.reshape`` of an executor shown by :func:`present`: the result is shown alike.

    The ops' checks run at the new shapes first (the original graph's shape pass);
    when the graph inlined at the new shapes is the one the executor runs, MXNet's
    reshape serves (memory shared); else the original graph is bound anew at the
    new shapes (inlined there, or with ``Custom`` nodes), keeping the arrays whose
    shape stays.
    """

    def __init__(self, exe, original, inlined, grads):
        self.exe, self.original, self.inlined, self.grads = exe, original, inlined, grads

    def __call__(self, partial_shaping=False, allow_up_sizing=False, **kwargs):
        exe = self.exe()
        given = {k: tuple(v) for k, v in kwargs.items()}
        names, aux_names = self.original.list_arguments(), self.original.list_auxiliary_states()
        with warnings.catch_warnings():  # an input the kwargs leave out keeps its shape
            warnings.simplefilter("ignore")
            args, _, aux = self.original.infer_shape_partial(**given)
        current = {**exe.arg_dict, **exe.aux_dict}
        shapes = {
            n: tuple(s) if s and all(d > 0 for d in s) else current[n].shape
            for n, s in zip([*names, *aux_names], [*(args or []), *(aux or [])])
        }
        dtypes = {n: a.dtype for n, a in current.items()}
        known = checked(self.original, shapes, dtypes)
        found = spliced(self.original, shapes, dtypes, self.grads, known)
        if found is not None and (
            symbol_json.anonymous(found.symbol) == symbol_json.anonymous(self.inlined)
        ):
            new = mx.executor.Executor.reshape(exe, partial_shaping, allow_up_sizing, **kwargs)
            return present(new, self.original, self.inlined, self.grads)

        def same_or_new(arrays):
            return {
                n: a if a.shape == shapes[n] else mx.nd.zeros(shapes[n], a.context, a.dtype)
                for n, a in arrays.items()
                if a is not None
            }

        grads = same_or_new(exe.grad_dict) or None
        return self.original.bind(
            exe._ctx,
            same_or_new(exe.arg_dict),
            grads,
            exe._grad_req,
            same_or_new(exe.aux_dict),
            exe._group2ctx,
        )


def checked(
    sym: mx.sym.Symbol, shapes: dict[str, Any], dtypes: dict[str, Any], text: str | None = None
) -> splice.Inferred:
    """Run ``sym``'s shape and type passes at this signature: its ops' checks raise here.

    The ``Custom`` nodes of our ops run their shape inference (the forward on
    placeholders, or their ``infer_shape=``, with their checks), so a bad signature raises
    the op's own named error, as a graph of ``Custom`` nodes would at its first call.
    Returns what the passes found, for :func:`spliced`'s ``known``.  ``text``:
    ``sym.tojson()``, from a caller that keeps it (see :func:`splice.inferred`).
    """
    graph = _read(text).graph if text is not None else None
    return splice.inferred(sym, shapes, dtypes, graph, text)


def holds_inlinable(sym: mx.sym.Symbol) -> bool:
    """Whether ``sym`` holds a ``Custom`` node of ours that may inline in training."""
    graph = symbol_json.graph_of(sym)
    return graph is not None and bool(splice.candidates(graph, graph_verdicts.TRAIN))
