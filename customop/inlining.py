"""Training graphs run our inlinable ops as MXNet's own operators: bound executors and CachedOps.

MXNet builds a graph's executor at ``Symbol.bind``/``simple_bind`` (shapes
known) and a hybridized block's ``CachedOp`` before its first call (shapes known
at that call).  At those moments the ``inline`` patch of :mod:`customop.runtime`
hands the graph here: each ``Custom`` node of an operator that inlines for
training (:mod:`customop.native`) is replaced by its native graph
(:mod:`customop.splice`), and the executor or CachedOp runs that graph.  What
users see stays the same: the executor's ``arg_dict``, ``arg_arrays`` (in the
original order, which Module relies on), ``output_dict`` and ``reshape``; the
CachedOp's inputs.  Graphs without such a node are left alone.
"""
from __future__ import annotations

import copy
import ctypes
import json
import sys
import threading
import warnings
import weakref
from typing import Any

import mxnet as mx
import numpy as np
from mxnet.base import _LIB

from . import native, runtime, splice


def may_inline(op: Any) -> bool:
    """Whether ``op`` may inline in training graphs (then the ``inline`` patch is needed)."""
    return not native.static_reason(op, native.TRAIN)


def _spliced(sym: mx.sym.Symbol, shapes: Any, dtypes: Any
             ) -> splice.Spliced | None:
    """``sym`` inlined for training, or None when nothing in it inlines.

    ``shapes``, ``dtypes``: by input name, or functions giving them (called only when the
    graph holds an op that may inline: a graph without one costs one ``debug_str``).
    """
    if runtime.disabled("inline"):
        return None
    graph = splice.graph_of(sym)
    if graph is None or not splice.candidates(graph, native.TRAIN):
        return None
    if callable(shapes):
        shapes = shapes()
    if callable(dtypes):
        dtypes = dtypes()
    try:
        found = splice.inline(sym, shapes, dtypes, native.TRAIN, graph=graph)
    except Exception as exc:  # noqa: BLE001 - the graph still runs, as Custom nodes
        warnings.warn(f"customop: the graph keeps its Custom nodes; inlining failed with "
                      f"{type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=4)
        return None
    if found is None or not found.inlined:
        return None
    if set(found.symbol.list_inputs()) != set(sym.list_inputs()):
        return None  # an input no inlined graph reads: the executor would lose it
    return found


def _default_dtypes(sym: mx.sym.Symbol, type_dict: dict | None) -> dict[str, Any]:
    # What simple_bind assumes: float32 for every argument without a __dtype__ attribute.
    attrs = sym.attr_dict()
    dtypes: dict[str, Any] = {n: np.float32 for n in sym.list_arguments()
                              if "__dtype__" not in attrs.get(n, {})}
    dtypes.update(type_dict or {})
    return dtypes


def simple_bind(original, sym, ctx, grad_req="write", type_dict=None, stype_dict=None,
                group2ctx=None, shared_arg_names=None, shared_exec=None, shared_buffer=None,
                **shapes):
    """``Symbol.simple_bind`` of ``sym`` with its inlinable ops inlined."""
    found = _spliced(sym, shapes, lambda: _default_dtypes(sym, type_dict))
    if found is None:
        return original(sym, ctx, grad_req, type_dict, stype_dict, group2ctx, shared_arg_names,
                        shared_exec, shared_buffer, **shapes)
    if isinstance(grad_req, (list, tuple)):
        grad_req = dict(zip(sym.list_arguments(), grad_req))
    exe = original(found.symbol, ctx, grad_req, type_dict, stype_dict, group2ctx,
                   shared_arg_names, shared_exec, shared_buffer, **_all_shapes(sym, shapes))
    return present(exe, sym, found.symbol)


def _all_shapes(sym: mx.sym.Symbol, shapes: dict[str, tuple]) -> dict[str, tuple]:
    # The shapes the original graph infers for every input: an op's infer_input_shape= (a
    # weight's shape from its parameters) leaves with its Custom node.
    args, _, aux = sym.infer_shape_partial(**shapes)
    found = {n: tuple(s) for n, s in zip(sym.list_arguments(), args or [])
             if s and all(d > 0 for d in s)}
    found.update((n, tuple(s)) for n, s in zip(sym.list_auxiliary_states(), aux or [])
                 if s and all(d > 0 for d in s))
    found.update(shapes)
    return found


def bind(original, sym, ctx, args, args_grad=None, grad_req="write", aux_states=None,
         group2ctx=None, shared_exec=None):
    """``Symbol.bind`` of ``sym`` with its inlinable ops inlined."""
    names, aux_names = sym.list_arguments(), sym.list_auxiliary_states()
    arg_map = dict(zip(names, args)) if isinstance(args, (list, tuple)) else dict(args)
    aux_map = (dict(zip(aux_names, aux_states)) if isinstance(aux_states, (list, tuple))
               else dict(aux_states or {}))
    arrays = {**arg_map, **aux_map}
    found = None
    if all(isinstance(a, mx.nd.NDArray) for a in arrays.values()):
        found = _spliced(sym, lambda: {n: a.shape for n, a in arrays.items()},
                         lambda: {n: a.dtype for n, a in arrays.items()})
    if found is None:
        return original(sym, ctx, args, args_grad, grad_req, aux_states, group2ctx, shared_exec)
    if isinstance(args_grad, (list, tuple)):
        args_grad = {n: g for n, g in zip(names, args_grad) if g is not None}
    if isinstance(grad_req, (list, tuple)):
        grad_req = dict(zip(names, grad_req))
    exe = original(found.symbol, ctx, arg_map, args_grad, grad_req, aux_map, group2ctx,
                   shared_exec)
    return present(exe, sym, found.symbol)


def present(exe: mx.executor.Executor, original: mx.sym.Symbol,
            inlined: mx.sym.Symbol) -> mx.executor.Executor:
    """Make an executor of ``inlined`` look like one of ``original`` (names, order, reshape)."""
    args, aux = inlined.list_arguments(), inlined.list_auxiliary_states()
    order = [args.index(n) for n in original.list_arguments()]
    aux_order = [aux.index(n) for n in original.list_auxiliary_states()]
    exe.arg_arrays = [exe.arg_arrays[i] for i in order]
    if exe.grad_arrays:
        exe.grad_arrays = [exe.grad_arrays[i] for i in order]
    exe.aux_arrays = [exe.aux_arrays[i] for i in aux_order]
    exe._symbol = copy.deepcopy(original)
    exe._arg_dict = exe._grad_dict = exe._aux_dict = exe._output_dict = None
    exe.customop_inlined = inlined  # the graph the executor runs
    exe.reshape = _Reshape(weakref.ref(exe), original, inlined)
    return exe


class _Reshape:
    """``Executor.reshape`` of an executor shown by :func:`present`: the result is shown alike.

    The ops' checks run at the new shapes first (the original graph's shape pass);
    when the graph inlined at the new shapes is the one the executor runs, MXNet's
    reshape serves (memory shared); else the original graph is bound anew at the
    new shapes (inlined there, or with ``Custom`` nodes), keeping the arrays whose
    shape stays.
    """

    def __init__(self, exe, original, inlined):
        self.exe, self.original, self.inlined = exe, original, inlined

    def __call__(self, partial_shaping=False, allow_up_sizing=False, **kwargs):
        exe = self.exe()
        given = {k: tuple(v) for k, v in kwargs.items()}
        names, aux_names = self.original.list_arguments(), self.original.list_auxiliary_states()
        with warnings.catch_warnings():  # an input the kwargs leave out keeps its shape
            warnings.simplefilter("ignore")
            args, _, aux = self.original.infer_shape_partial(**given)
        current = {**exe.arg_dict, **exe.aux_dict}
        shapes = {n: tuple(s) if s and all(d > 0 for d in s) else current[n].shape
                  for n, s in zip([*names, *aux_names], [*(args or []), *(aux or [])])}
        dtypes = {n: a.dtype for n, a in current.items()}
        checked(self.original, shapes, dtypes)
        found = _spliced(self.original, shapes, dtypes)
        if found is not None and _shape_of_graph(found.symbol) == _shape_of_graph(self.inlined):
            new = mx.executor.Executor.reshape(exe, partial_shaping, allow_up_sizing, **kwargs)
            return present(new, self.original, self.inlined)

        def same_or_new(arrays):
            return {n: a if a.shape == shapes[n] else mx.nd.zeros(shapes[n], a.context, a.dtype)
                    for n, a in arrays.items() if a is not None}

        grads = same_or_new(exe.grad_dict) or None
        return self.original.bind(exe._ctx, same_or_new(exe.arg_dict), grads, exe._grad_req,
                                  same_or_new(exe.aux_dict), exe._group2ctx)


# ---- hybridized blocks ----------------------------------------------------------------------
_buffers = threading.local()  # .out: this thread's ctypes out-parameters for signature()
_get_shape, _get_dtype = _LIB.MXNDArrayGetShapeEx, _LIB.MXNDArrayGetDType


def signature(args, which) -> tuple:
    """``((shape, dtype code), ...)`` of ``args[i]`` for ``i`` in ``which``: a CachedOp's
    per-call key, read with two C calls an array (half what ``.shape``/``.dtype`` cost)."""
    out = getattr(_buffers, "out", None)
    if out is None:
        ndim, dims, dtype = ctypes.c_int(), ctypes.POINTER(ctypes.c_int)(), ctypes.c_int()
        out = _buffers.out = (ndim, dims, dtype, ctypes.byref(ndim), ctypes.byref(dims),
                              ctypes.byref(dtype))
    ndim, dims, dtype, ndim_ref, dims_ref, dtype_ref = out
    key = []
    for i in which:
        handle = args[i].handle
        _get_shape(handle, ndim_ref, dims_ref)
        _get_dtype(handle, dtype_ref)
        key.append((tuple(dims[:ndim.value]), dtype.value))
    return tuple(key)


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
    """

    def __init__(self, sym: mx.sym.Symbol, flags, graph: dict[str, Any]):
        self.sym, self.flags, self.graph = sym, list(flags), graph
        self.names = sym.list_inputs()
        data = dict(self.flags).get("data_indices")
        self.data = list(data) if data is not None else list(range(len(self.names)))
        self.built: dict[Any, tuple[Any, list[int] | None]] = {}  # signature -> (CachedOp, order)
        self.by_graph: dict[str, tuple[Any, list[int] | None]] = {}  # inlined JSON -> same
        self.lock = threading.Lock()

    def call(self, outer, args, kwargs):
        key = signature(args, self.data)
        found = self.built.get(key)
        if found is None:
            with self.lock:
                found = self.built.get(key) or self._build(key, args)
        inner, order = found
        if order is not None:
            args = [args[i] for i in order]
        return inner(*args, **kwargs)

    def _build(self, key, args):
        shapes = {n: a.shape for n, a in zip(self.names, args)}
        dtypes = {n: a.dtype for n, a in zip(self.names, args)}
        if not all(d > 0 for i in self.data for d in args[i].shape) and self.by_graph:
            # An empty batch fails in MXNet's own passes as it does for native blocks
            # (documented with that baseline): it runs the graph settled first, unchecked.
            return next(iter(self.by_graph.values()))
        checked(self.sym, shapes, dtypes)
        found = _spliced(self.sym, shapes, dtypes)
        sym, order = self.sym, None
        if found is not None:
            sym = found.symbol.as_np_ndarray() if self.is_np_sym else found.symbol
            new = sym.list_inputs()
            order = [self.names.index(n) for n in new]
            if order == list(range(len(order))):
                order = None
        text = _shape_of_graph(sym)
        built = self.by_graph.get(text)
        if built is None:
            inner = runtime.inner_cached_op(sym, self._flags(sym.list_inputs()))
            built = self.by_graph[text] = (inner, order)
        self.built[key] = built
        return built

    is_np_sym = False  # the CachedOp's graph is a NumPy-API Symbol (set by the patch)

    def _flags(self, names: list[str]) -> list:
        # Gluon passes which inputs are data and which parameters, by position.
        out = []
        for key, value in self.flags:
            if key in ("data_indices", "param_indices"):
                chosen = {self.names[i] for i in value}
                value = [i for i, n in enumerate(names) if n in chosen]
            out.append((key, value))
        return out


def _shape_of_graph(sym: mx.sym.Symbol) -> str:
    # The graph without its operators' names (each trace numbers its nodes anew): two
    # signatures whose inlined graphs differ only in names share one CachedOp.
    graph = json.loads(sym.tojson())
    for node in graph["nodes"]:
        if node["op"] != "null":
            node["name"] = ""
    return json.dumps([graph["nodes"], graph["heads"]], sort_keys=True)


def checked(sym: mx.sym.Symbol, shapes: dict[str, Any], dtypes: dict[str, Any]) -> None:
    """Run ``sym``'s shape and type passes at this signature: its ops' checks raise here.

    The ``Custom`` nodes of our ops run their shape inference (the forward on
    placeholders, with its checks), so a bad signature raises the op's own
    named error, as a graph of ``Custom`` nodes would at its first call.
    """
    names = set(sym.list_inputs())
    sym.infer_shape_partial(**{k: tuple(v) for k, v in shapes.items() if k in names})
    sym.infer_type_partial(**{k: np.dtype(v) for k, v in dtypes.items() if k in names})


def cached_plan(sym: mx.sym.Symbol, flags) -> CachedPlan | None:
    """A plan for a new CachedOp of ``sym``, or None when nothing in it may inline."""
    if runtime.disabled("inline"):
        return None
    graph = splice.graph_of(sym)
    if graph is None or not splice.candidates(graph, native.TRAIN):
        return None
    return CachedPlan(sym, flags, graph)


runtime.set_inline_hooks(sys.modules[__name__])
