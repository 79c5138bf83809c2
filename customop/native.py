"""Whether an operator's forward may stand in a graph as MXNet's own operators, and that graph.

For one operator, parameter set and input signature (shapes, dtypes), and one
purpose, :func:`native_graph` answers with a :class:`NativeGraph` (a piece of
symbol JSON whose inputs are the operator's inputs) or the reason the ``Custom``
node stays.  The purposes:

* ``'train'``: hybridized blocks and bound graphs, which may be differentiated.
  MXNet's gradient of the graph must be the operator's: an automatic gradient
  differentiates the forward; ``def_grad`` closures and output layers
  (``need_top_grad=False``) are transposed into the graph
  (:mod:`customop.custom_grad`).  The graph must hold at every input shape the
  block may see later (checked at other shapes).
* ``'export'``: a deployed graph, inference only.  ``def_grad`` operators
  qualify too; the graph may be specialized to the exported shapes; arrays the
  forward builds become parameters of the exported model.

The forward is recorded (:mod:`customop.trace`) twice on different values of one
signature and once or more at other signatures; the graph is kept only when it
does not depend on the values, reads nothing back to Python, calls no random
operator, and, evaluated, gives the forward's own outputs at the other values
and signatures.  Answers are cached per operator, parameters, signature and
purpose.
"""
from __future__ import annotations

import json
import os
import random
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import mxnet as mx
import numpy as np

from . import errors, runtime, trace

if TYPE_CHECKING:
    from .operator import CustomOperator

TRAIN, EXPORT = "train", "export"
PURPOSES = (TRAIN, EXPORT)
# MXNet operators with auxiliary states (moving statistics): in a graph these must be fed
# by variables, and they update them in place.
STATEFUL = frozenset({"BatchNorm", "BatchNorm_v1", "SyncBatchNorm", "_contrib_SyncBatchNorm"})
_SMALL = 64  # elements: a constant up to this size may be written out node by node
_lock = threading.RLock()
_cache: dict[tuple, Verdict] = {}


@dataclass
class NativeGraph:
    """An operator's forward as MXNet operators, for one signature.

    ``nodes``: ``{"op", "name", "attrs", "inputs"}`` in topological order, each
    input a reference: ``("in", i)`` (the operator's input ``i``), ``("const",
    name)`` (an array of ``constants``, export only) or ``("node", k, output)``.
    ``heads``: a reference per output.
    """

    nodes: list[dict[str, Any]]
    heads: list[tuple]
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    specialized: str = ""  # why the graph holds only at this signature ("" when it does not)
    note: str = ""  # how a def_grad op's gradient is carried (customop.custom_grad)
    dtype_generic: bool = True

    def operators(self) -> list[str]:
        return [n["op"] for n in self.nodes]


@dataclass
class Verdict:
    """What :func:`native_graph` found: ``graph``, or ``reason`` the ``Custom`` node stays."""

    op_type: str
    purpose: str
    shapes: tuple
    dtypes: tuple
    graph: NativeGraph | None = None
    reason: str = ""

    @property
    def inlines(self) -> bool:
        return self.graph is not None


def static_reason(op: CustomOperator, purpose: str) -> str:
    """Why ``op`` never inlines for ``purpose``, whatever its inputs ("" when it may)."""
    if op.mode != "mxnet":
        return ("a 'numpy'-mode operator: its forward runs on NumPy arrays, outside "
                "MXNet's graph")
    if not getattr(op, "inline", True):
        return "declared inline=False"
    if op.signature.aux:
        return ("it has auxiliary states (aux=), which it updates in place; MXNet's own "
                "operators cannot")
    if runtime.disabled("trace"):
        return "CUSTOMOP_RUNTIME_OFF keeps the trace hooks out"
    return ""


def native_graph(op: CustomOperator, params: dict[str, Any], shapes: Sequence[Sequence[int]],
                 dtypes: Sequence[Any], purpose: str,
                 values: Sequence[np.ndarray] | None = None,
                 closures: Callable[..., NativeGraph] | None = None) -> Verdict:
    """The native graph of ``op`` at this signature for ``purpose``, or why there is none.

    ``values``: the inputs to trace on first (default: random placeholders).
    ``closures(op, params, shapes, dtypes, values)``: builds the training graph of an op
    with its own gradient (``customop.custom_grad.native_graph`` passes its own; without
    it such an op keeps its ``Custom`` node in training).
    """
    if purpose not in PURPOSES:
        raise ValueError(f"purpose must be one of {PURPOSES}, got {purpose!r}")
    shapes = tuple(tuple(int(d) for d in s) for s in shapes)
    dtypes = tuple(np.dtype(d) for d in dtypes)
    key = (op, repr(sorted(params.items())), shapes, dtypes, purpose)
    found = _cache.get(key)
    if found is None or values is not None:
        found = _cache[key] = _aside(_decide, op, dict(params), shapes, dtypes, purpose, values,
                                     closures)
    return found


_worker: Any = None  # a ThreadPoolExecutor of one thread, made on first use (per process)
_worker_pid = 0


def _aside(fn, *args):
    """``fn(*args)`` on customop's trace thread, the caller's random streams kept.

    Traces run forwards that may draw random numbers: MXNet's generators are per
    thread (so the caller's stream is untouched there) and NumPy's and Python's
    global ones are put back.  The caller's autograd state is untouched too.
    """
    global _worker, _worker_pid
    if threading.current_thread().name.startswith("customop-trace"):
        return fn(*args)
    with _lock:
        if _worker is None or _worker_pid != os.getpid():  # threads do not survive fork()
            # imported here: on Python 3.8 importing concurrent.futures registers an atexit hook
            from concurrent.futures import ThreadPoolExecutor

            _worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="customop-trace")
            _worker_pid = os.getpid()
    np_state, py_state = np.random.get_state(), random.getstate()
    try:
        return _worker.submit(fn, *args).result()
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)


def _decide(op, params, shapes, dtypes, purpose, values, closures) -> Verdict:
    verdict = Verdict(errors.shown(op.op_type), purpose, shapes, dtypes)
    verdict.reason = static_reason(op, purpose)
    if not verdict.reason:
        try:
            if purpose == TRAIN and (op.grads or not op.need_top_grad):
                if closures is None:
                    raise _NotNative("its gradient is its own (def_grad or need_top_grad="
                                     "False): customop.custom_grad builds its training graph")
                verdict.graph = closures(op, params, shapes, dtypes, values)
            else:
                verdict.graph = _Tracer(op, params, purpose).graph(shapes, dtypes, values)
        except _NotNative as exc:
            verdict.reason = str(exc)
    return verdict


class _NotNative(Exception):
    """The reason an operator's forward does not stand in as a native graph."""


def placeholders(shapes, dtypes, seed: int) -> list[np.ndarray]:
    """Input values to trace on: uniform in [0.1, 1) for floats, 0 or 1 for integers."""
    rng = np.random.RandomState(seed)
    out = []
    for shape, dtype in zip(shapes, dtypes):
        if np.issubdtype(dtype, np.floating):
            out.append(rng.uniform(0.1, 1.0, size=shape).astype(dtype))
        else:
            out.append(rng.randint(0, 2, size=shape).astype(dtype))
    return out


class _Tracer:
    """Records one operator's forward and checks the graph (see the module docstring)."""

    def __init__(self, op: CustomOperator, params: dict[str, Any], purpose: str):
        self.op, self.params, self.purpose = op, params, purpose

    def record(self, values) -> trace.Recording:
        try:
            return trace.record(self.op, list(values), self.params)
        except Exception as exc:  # noqa: BLE001 - any failure of the forward is the reason
            raise _NotNative(f"its forward failed while being traced on placeholder "
                             f"inputs: {type(exc).__name__}: {exc}") from None

    def graph(self, shapes, dtypes, values) -> NativeGraph:
        first = list(values) if values is not None else placeholders(shapes, dtypes, 1)
        second = _perturbed(first)
        rec1 = self.record(first)
        self.check(rec1)
        rec2 = self.record(second)
        self.check(rec2)
        if _structure(rec1) != _structure(rec2):
            raise _NotNative("its graph depends on the input values (control flow on values "
                             "read from its inputs)")
        changed = [rec1.nodes[i]["name"] for i in rec1.free
                   if not _same(rec1.free[i], rec2.free[i])]
        if changed:
            raise _NotNative("it computes arrays from its inputs outside the recorded graph "
                             "(detach(), or new arrays from values it read); the graph would "
                             "hold them as constants")
        graph = self.fragment(rec1, shapes)
        if not _close(evaluate(graph, second), rec2.outputs):
            raise _NotNative("its recorded graph does not give its outputs on other input "
                             "values")
        if self.purpose == TRAIN:  # an export holds at the shapes it is exported with
            graph.specialized = self.generality(graph, shapes, dtypes, first)
            if graph.specialized:
                raise _NotNative(f"its graph holds only at the traced input shapes "
                                 f"({graph.specialized}); a hybridized block may see others")
        return graph

    def check(self, rec: trace.Recording) -> None:
        for inner in rec.inner:
            reason = static_reason(inner, self.purpose)
            if not reason and self.purpose == TRAIN and (inner.grads or not inner.need_top_grad):
                # Its forward would be recorded into this graph and differentiated by MXNet.
                reason = ("its gradient is its own (def_grad or need_top_grad=False); inside "
                          "another op's forward MXNet would differentiate its forward instead")
            if reason:
                raise _NotNative(f"it calls customop {errors.shown(inner.op_type)!r}, which "
                                 f"cannot be inlined: {reason}")
        if rec.reads:
            raise _NotNative(f"it reads values back to Python (asnumpy, asscalar, bool) at "
                             f"{rec.reads[0]}; a graph would keep what it read once")
        if rec.randoms:
            raise _NotNative(f"it calls random operators ({', '.join(rec.randoms)})")
        stateful = sorted({n["op"] for n in rec.nodes if n["op"] in STATEFUL})
        if stateful:
            raise _NotNative(f"it calls operators that update auxiliary states "
                             f"({', '.join(stateful)})")
        if rec.unknown_free:
            raise _NotNative("it uses arrays whose values the trace could not read")
        foreign = sorted({n["op"] for n in rec.nodes if n["op"] in ("_CustomFunction",
                                                                       "Custom")})
        if foreign:
            raise _NotNative("it calls a custom operator that cannot be inlined itself "
                             "(a 'numpy'-mode op, one with def_grad in training, or one with "
                             "auxiliary states)")

    def generality(self, graph: NativeGraph, shapes, dtypes, first) -> str:
        """"" when the graph holds at other shapes tried; else what differs."""
        tried: list[str] = []
        for other in _other_shapes(shapes):
            values = _resized(first, other)
            try:
                rec = trace.record(self.op, values, self.params)
                self.check(rec)
                alt = self.fragment(rec, other)
            except (_NotNative, Exception) as exc:  # noqa: BLE001 - the op refuses this shape
                tried.append(f"{_shapes_text(other)}: {type(exc).__name__}")
                continue
            diff = _difference(graph, alt)
            if diff:
                return f"{diff} at input shapes {_shapes_text(other)}"
            if not _close(evaluate(graph, values, alt.constants), rec.outputs):
                return f"other outputs at input shapes {_shapes_text(other)}"
            graph.dtype_generic = self.dtype_generic(graph, dtypes, first)
            return ""
        return ("not checked: the forward refused every other input shape tried ("
                + "; ".join(tried) + ")")

    def dtype_generic(self, graph: NativeGraph, dtypes, first) -> bool:
        other = tuple(np.dtype(np.float64 if d == np.float32 else np.float32)
                      if np.issubdtype(d, np.floating) else d for d in dtypes)
        if other == tuple(dtypes):
            return True
        try:
            rec = trace.record(self.op, [v.astype(d) for v, d in zip(first, other)],
                               self.params)
            alt = self.fragment(rec, [v.shape for v in first])
        except Exception:  # noqa: BLE001 - then calls are keyed by dtype
            return False
        return not _difference(graph, alt)

    # ---- the recorded graph as a NativeGraph ------------------------------------------------
    def fragment(self, rec: trace.Recording, shapes) -> NativeGraph:
        nodes = [dict(n, attrs=dict(n["attrs"])) for n in rec.nodes]
        for n in nodes:
            if n["op"] == "_copyto":  # astype() or a device copy: the graph runs on one device
                dtype = n["attrs"].pop("__dtype__", None)
                n["op"], n["attrs"] = ("Cast", {"dtype": dtype}) if dtype else ("_copy", {})
        slot = {node: i for i, node in enumerate(rec.inputs) if node is not None}
        const, values = _folded(nodes, slot, rec.free, rec.heads)
        out_nodes: list[dict[str, Any]] = []
        constants: dict[str, np.ndarray] = {}
        refs: dict[tuple[int, int], tuple] = {}
        placed: dict[int, int] = {}

        def ref(j: int, k: int) -> tuple:
            found = refs.get((j, k))
            if found is None:
                if j in slot:
                    found = ("in", slot[j])
                    if self._frozen(slot[j]):  # no gradient reaches it (MXNet would give one)
                        found = _add(out_nodes, "BlockGrad", {}, [found])
                elif const[j]:
                    found = self._constant(values[(j, k)], out_nodes, constants, shapes,
                                           f"{nodes[j]['name']}_{k}")
                else:
                    found = ("node", placed[j], k)
                refs[(j, k)] = found
            return found

        stopped: dict[tuple, tuple] = {}

        def leaving(j: int, k: int, into: int | None) -> tuple:
            # A value computed inside mx.autograd.pause() carries no gradient out of it.
            r = ref(j, k)
            if (self.purpose == TRAIN and j in rec.paused and r[0] == "node"
                    and (into is None or into not in rec.paused)):
                if r not in stopped:
                    stopped[r] = _add(out_nodes, "BlockGrad", {}, [r])
                r = stopped[r]
            return r

        for j, n in enumerate(nodes):
            if j in slot or const[j]:
                continue
            if n["op"] == "null":
                raise _NotNative("it uses an array the trace could not read")
            inputs = [leaving(e[0], e[1], j) for e in n["inputs"]]
            out_nodes.append({"op": n["op"], "name": n["name"], "attrs": n["attrs"],
                              "inputs": inputs})
            placed[j] = len(out_nodes) - 1
        heads = []
        for j, k in rec.heads:
            r = leaving(j, k, None)
            if r[0] != "node" or out_nodes[r[1]]["op"] == "BlockGrad":
                r = _add(out_nodes, "_copy", {}, [r])  # an input or a constant returned as is
            heads.append(r)
        return NativeGraph(out_nodes, heads, constants)

    def _frozen(self, i: int) -> bool:
        op = self.op
        if self.purpose != TRAIN:
            return False
        return op.signature.inputs[i] in op.no_grad or not op.auto_grad

    def _constant(self, value: np.ndarray, nodes, constants, shapes, name) -> tuple:
        if self.purpose == EXPORT:
            constants[name] = value
            return ("const", name)
        start = len(nodes)
        expressed = _expressed(value, nodes, shapes)
        if expressed is None:
            raise _NotNative(f"it builds a constant array of shape {value.shape} "
                             f"({value.dtype}) that a graph cannot hold without a parameter")
        # MXNet parses number attributes itself: the written constant must be exact.
        probe = NativeGraph([dict(n, inputs=[_shifted(r, start) for r in n["inputs"]])
                             for n in nodes[start:]], [_shifted(expressed, start)])
        try:
            got = evaluate(probe, [np.zeros(s, np.float32) for s in shapes])[0]
        except mx.base.MXNetError as exc:
            got = exc
        if not isinstance(got, np.ndarray) or not _same(got.reshape(value.shape)
                                                         if got.size == value.size else got,
                                                         value):
            raise _NotNative(f"it builds a constant array of shape {value.shape} "
                             f"({value.dtype}) that the graph cannot write exactly")
        return expressed


def _shifted(r: tuple, start: int) -> tuple:
    return ("node", r[1] - start, r[2]) if r[0] == "node" else r


def _add(nodes: list, op: str, attrs: dict, inputs: list) -> tuple:
    nodes.append({"op": op, "name": f"{op.strip('_').lower()}{len(nodes)}", "attrs": attrs,
                  "inputs": inputs})
    return ("node", len(nodes) - 1, 0)


# ---- constants ---------------------------------------------------------------------------------
def _folded(nodes, slot, free, heads) -> tuple[list[bool], dict[tuple[int, int], np.ndarray]]:
    """Values of the constant entries that non-constant nodes (or outputs) read.

    An entry is constant when its node is a free variable, or an operator all of
    whose inputs are constant; the latter are evaluated here, once.
    """
    const = [False] * len(nodes)
    for j, n in enumerate(nodes):
        if j in slot:
            continue
        const[j] = j in free or (n["op"] != "null" and bool(n["inputs"]) and all(
            const[e[0]] for e in n["inputs"]))
    wanted: list[tuple[int, int]] = []
    for j, n in enumerate(nodes):
        if not const[j]:
            wanted += [(e[0], e[1]) for e in n["inputs"] if const[e[0]]]
    wanted += [h for h in heads if const[h[0]]]
    values: dict[tuple[int, int], np.ndarray] = {}
    computed = [e for e in dict.fromkeys(wanted) if e[0] not in free]
    for e in dict.fromkeys(wanted):
        if e[0] in free:
            values[e] = free[e[0]]
    if computed:
        graph = {"nodes": [], "heads": []}
        index: dict[int, int] = {}
        for j, n in enumerate(nodes):
            if const[j]:
                index[j] = len(graph["nodes"])
                graph["nodes"].append({"op": n["op"], "name": f"n{j}", "attrs": n["attrs"],
                                       "inputs": [[index[e[0]], e[1], 0] for e in n["inputs"]]})
        graph["heads"] = [[index[j], k, 0] for j, k in computed]
        args = {f"n{j}": mx.nd.array(free[j], dtype=free[j].dtype) for j in free if const[j]}
        for e, out in zip(computed, _run(graph, args)):
            values[e] = out
    return const, values


def _expressed(value: np.ndarray, nodes: list, shapes) -> tuple | None:
    """Nodes that build ``value`` inside the graph (appended to ``nodes``), or None."""
    dtype = np.dtype(value.dtype).name
    flat = value.reshape(-1)
    if flat.size == 0:
        return None
    if _same(flat, np.full_like(flat, flat[0])):
        u = _number(flat[0])
        like = next((i for i, s in enumerate(shapes) if tuple(s) == value.shape), None)
        if like is not None and value.ndim:
            ones = (1,) * value.ndim
            full = _add(nodes, "_full", {"shape": str(ones), "value": u, "dtype": dtype}, [])
            return _add(nodes, "broadcast_like", {}, [full, ("in", like)])
        return _add(nodes, "_full", {"shape": str(value.shape or (1,)), "value": u,
                                     "dtype": dtype}, [])
    core = value
    for axis in range(value.ndim):  # drop the axes it is constant along
        first = np.take(core, [0], axis=axis)
        if core.shape[axis] > 1 and _same(core, np.broadcast_to(first, core.shape)):
            core = first
    line = core.reshape(-1)
    steps = np.diff(line.astype(np.float64))
    if line.size > 1 and np.all(steps == steps[0]) and steps[0] != 0:
        start, step = float(line[0]), float(steps[0])
        node = _add(nodes, "_arange", {"start": _number(start), "stop": _number(
            start + step * line.size), "step": _number(step), "repeat": "1",
            "dtype": dtype}, [])
    elif line.size <= _SMALL:
        parts = [_add(nodes, "_full", {"shape": "(1,)", "value": _number(v), "dtype": dtype},
                      []) for v in line]
        node = parts[0] if len(parts) == 1 else _add(
            nodes, "Concat", {"dim": "0", "num_args": str(len(parts))}, parts)
    else:
        return None
    node = _add(nodes, "Reshape", {"shape": str(core.shape)}, [node])
    if core.shape != value.shape:
        node = _add(nodes, "broadcast_to", {"shape": str(value.shape)}, [node])
    return node


def _number(v: Any) -> str:
    v = float(v)
    return repr(v) if np.isfinite(v) else ("nan" if np.isnan(v) else
                                           ("inf" if v > 0 else "-inf"))


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if np.issubdtype(a.dtype, np.floating):
        return bool(np.array_equal(a, b, equal_nan=True))
    return bool(np.array_equal(a, b))


# ---- evaluating and comparing graphs ----------------------------------------------------------
def to_json(graph: NativeGraph, input_names: Sequence[str],
            const_names: dict[str, str] | None = None) -> dict[str, Any]:
    """``graph`` as a standalone symbol JSON whose inputs are variables ``input_names``."""
    nodes: list[dict[str, Any]] = []
    index: dict[tuple, int] = {}

    def entry(r):
        if r[0] == "node":
            return [index[("node", r[1])], r[2], 0]
        if r not in index:
            index[r] = len(nodes)
            name = input_names[r[1]] if r[0] == "in" else (const_names or {}).get(r[1], r[1])
            nodes.append({"op": "null", "name": name, "inputs": []})
        return [index[r], 0, 0]

    for k, n in enumerate(graph.nodes):
        inputs = [entry(r) for r in n["inputs"]]
        index[("node", k)] = len(nodes)
        nodes.append({"op": n["op"], "name": n["name"], "attrs": dict(n["attrs"]),
                      "inputs": inputs})
    heads = [entry(r) for r in graph.heads]
    return {"nodes": nodes, "heads": heads}


def _run(graph: dict[str, Any], args: dict[str, mx.nd.NDArray]) -> list[np.ndarray]:
    # A CachedOp (binding an executor prints MKLDNN notices), which needs an input.
    n = len(graph["heads"])
    graph = {"nodes": [*graph["nodes"], {"op": "null", "name": "_customop_unused",
                                         "inputs": []}],
             "heads": graph["heads"]}
    graph["nodes"].append({"op": "_copy", "name": "_customop_unused_copy",
                           "inputs": [[len(graph["nodes"]) - 1, 0, 0]]})
    graph["heads"] = [*graph["heads"], [len(graph["nodes"]) - 1, 0, 0]]
    args = dict(args, _customop_unused=mx.nd.zeros((1,)))
    sym = load(graph)
    with mx.autograd.pause():
        outs = mx.nd.CachedOp(sym)(*[args[name] for name in sym.list_inputs()])
    return [o.asnumpy() for o in outs[:n]]


def load(graph: dict[str, Any]) -> mx.sym.Symbol:
    """A Symbol from JSON nodes and heads (``arg_nodes`` and versions filled in)."""
    nodes = [dict(n, attrs={k: str(v) for k, v in (n.get("attrs") or {}).items()})
             for n in graph["nodes"]]
    for n in nodes:
        if not n["attrs"]:
            n.pop("attrs")
        n["inputs"] = [list(e) + [0] * (3 - len(e)) for e in n["inputs"]]
    text = json.dumps({"nodes": nodes,
                       "arg_nodes": [i for i, n in enumerate(nodes) if n["op"] == "null"],
                       "heads": [list(h) + [0] * (3 - len(h)) for h in graph["heads"]],
                       "attrs": {"mxnet_version": ["int", 10901]}})
    return mx.sym.load_json(text)


def evaluate(graph: NativeGraph, inputs: Sequence[np.ndarray],
             constants: dict[str, np.ndarray] | None = None) -> list[np.ndarray]:
    """``graph``'s outputs on these inputs (its constants, or those given)."""
    names = [f"input{i}" for i in range(len(inputs))]
    args = {n: mx.nd.array(v, dtype=v.dtype) for n, v in zip(names, inputs)}
    for name, value in (constants if constants is not None else graph.constants).items():
        args[name] = mx.nd.array(value, dtype=value.dtype)
    return _run(to_json(graph, names), args)


def _close(got: list[np.ndarray], want: list[np.ndarray]) -> bool:
    if len(got) != len(want):
        return False
    for g, w in zip(got, want):
        g = g.reshape(w.shape) if g.size == w.size else g
        if g.shape != w.shape:
            return False
        if np.issubdtype(w.dtype, np.floating):
            tol = 1e-2 if w.dtype == np.float16 else 1e-5
            if not np.allclose(g, w, rtol=tol, atol=tol * 0.1, equal_nan=True):
                return False
        elif not np.array_equal(g, w):
            return False
    return True


def _structure(rec: trace.Recording) -> list:
    return [(n["op"], sorted(n["attrs"].items()), n["inputs"], i in rec.free)
            for i, n in enumerate(rec.nodes)] + [rec.heads, rec.inputs]


def _difference(a: NativeGraph, b: NativeGraph) -> str:
    """The first difference between two graphs of one operator ("" when they are alike)."""
    if len(a.nodes) != len(b.nodes):
        return f"{len(a.nodes)} operators, {len(b.nodes)}"
    for x, y in zip(a.nodes, b.nodes):
        if x["op"] != y["op"] or x["inputs"] != y["inputs"]:
            return f"operator {x['op']} becomes {y['op']}"
        if x["attrs"] != y["attrs"]:
            key = next(k for k in sorted(set(x["attrs"]) | set(y["attrs"]))
                       if x["attrs"].get(k) != y["attrs"].get(k))
            return f"{x['op']} {key}={x['attrs'].get(key)} becomes {y['attrs'].get(key)}"
    if a.heads != b.heads:
        return "other outputs"
    for name, value in a.constants.items():
        other = b.constants.get(name)
        if other is None or other.shape != value.shape or other.dtype != value.dtype:
            return f"a constant of shape {value.shape}"
    return ""


def _perturbed(values: list[np.ndarray]) -> list[np.ndarray]:
    """Other values of the same signature: negative, zero and positive numbers."""
    out = placeholders([v.shape for v in values], [v.dtype for v in values], 2)
    for v in out:
        if np.issubdtype(v.dtype, np.floating):
            flat = v.reshape(-1)
            flat[:] = flat * 2 - 1.1
            flat[::4] = 0
    return out


def _other_shapes(shapes) -> Iterable[tuple]:
    """Other input signatures to trace at: one size of the given shapes grown by one."""
    sizes: list[int] = []
    for s in shapes:
        for axis, d in enumerate(s):
            if (d > 1 or axis == 0) and d not in sizes:
                sizes.append(d)
    batch = shapes[0][0] if shapes and shapes[0] else None
    if batch in sizes:  # the batch axis first
        sizes.remove(batch)
        sizes.insert(0, batch)
    for size in sizes[:3]:
        yield tuple(tuple(d + 1 if d == size and (d > 1 or axis == 0) else d
                          for axis, d in enumerate(s)) for s in shapes)


def _resized(values: list[np.ndarray], shapes) -> list[np.ndarray]:
    return placeholders(shapes, [v.dtype for v in values], 3)


def _shapes_text(shapes) -> str:
    return ", ".join(str(tuple(s)) for s in shapes)


def clear_cache() -> None:
    """Forget every traced graph (an operator redefined in place is traced again anyway)."""
    with _lock:
        _cache.clear()


# ---- shared with customop.custom_grad (which checks training graphs the same way) ------------
perturbed, structure, same, close = _perturbed, _structure, _same, _close
difference, other_shapes, shapes_text = _difference, _other_shapes, _shapes_text
Tracer, NotNative = _Tracer, _NotNative
