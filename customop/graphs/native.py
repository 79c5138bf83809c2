"""Whether an operator's forward may stand in a graph as MXNet's own operators, and that graph.

For one operator, parameter set and input signature (shapes, dtypes), and one
purpose, :func:`native_graph` answers with a :class:`NativeGraph` (a piece of
symbol JSON whose inputs are the operator's inputs) or the reason the ``Custom``
node stays.  The purposes:

* ``'train'``: hybridized blocks and bound graphs, which may be differentiated.
  MXNet's gradient of the graph must be the operator's: an automatic gradient
  differentiates the forward; ``def_grad`` closures and output layers
  (``need_top_grad=False``) are transposed into the graph by the builder
  :mod:`customop.graphs.transposed` passes (``closures=``).  The graph must hold at
  every input shape the block may see later (checked at other shapes).
* ``'export'``: a deployed graph, inference only.  ``def_grad`` operators
  qualify too; the graph may be specialized to the exported shapes; arrays the
  forward builds become parameters of the exported model.

The forward is recorded (:mod:`customop.graphs.trace`) twice on different values of one
signature and once or more at other signatures; the graph is kept only when it
does not depend on the values, reads nothing back to Python, calls no random
operator, and, evaluated, gives the forward's own outputs at the other values
and signatures.  Answers are cached per operator, parameters, signature and
purpose.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import mxnet as mx
import numpy as np

from .. import errors
from . import compare, guards, rules, trace
from . import constants as consts
from .graph_json import evaluate
from .rules import EXPORT, PURPOSES, TRAIN

if TYPE_CHECKING:
    from ..operator import CustomOperator

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
    checks: int = 0  # customop.require conditions carried as NaN poisoning
    guards: list[str] = field(default_factory=list)  # operators given index guards
    dtype_generic: bool = True
    note: str = ""  # how a def_grad op's gradient is carried (customop.graphs.transposed)
    # A def_grad op's graph without its transposed closures, for graphs where none of the
    # inputs ``differentiates`` (by index) can need a gradient (customop.graphs.splice).
    forward_only: NativeGraph | None = None
    differentiates: tuple = ()

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
    rule: str = ""  # the name of the refusal (customop.graphs.rules), when a table entry refused it

    @property
    def inlines(self) -> bool:
        return self.graph is not None


def static_reason(op: CustomOperator, purpose: str) -> str:
    """Why ``op`` never inlines for ``purpose``, whatever its inputs ("" when it may)."""
    found = rules.op_refusal(op, purpose)
    return found.reason if found is not None else ""


def native_graph(op: CustomOperator, params: dict[str, Any], shapes: Sequence[Sequence[int]],
                 dtypes: Sequence[Any], purpose: str,
                 values: Sequence[np.ndarray] | None = None,
                 closures: Callable[..., NativeGraph] | None = None) -> Verdict:
    """The native graph of ``op`` at this signature for ``purpose``, or why there is none.

    ``values``: the inputs to trace on first (default: random placeholders).  A verdict
    traced on given values is not cached: the cached verdict, which every graph uses, is a
    function of the operator, its parameters and the signature only, whatever ran before.
    ``closures(op, params, shapes, dtypes, values)``: builds the training graph of an op
    with its own gradient (``customop.graphs.transposed.native_graph`` passes its own; without
    it such an op keeps its ``Custom`` node in training).
    """
    if purpose not in PURPOSES:
        raise ValueError(f"purpose must be one of {PURPOSES}, got {purpose!r}")
    shapes = tuple(tuple(int(d) for d in s) for s in shapes)
    dtypes = tuple(np.dtype(d) for d in dtypes)
    key = (op, repr(sorted(params.items())), shapes, dtypes, purpose, closures)
    if values is not None:
        return trace.aside(_decide, op, dict(params), shapes, dtypes, purpose, values, closures)
    found = _cache.get(key)
    if found is None:
        found = _cache[key] = trace.aside(_decide, op, dict(params), shapes, dtypes, purpose,
                                          None, closures)
    return found


def _decide(op, params, shapes, dtypes, purpose, values, closures) -> Verdict:
    verdict = Verdict(errors.shown(op.op_type), purpose, shapes, dtypes)
    refused = rules.op_refusal(op, purpose)
    if refused is not None:
        verdict.reason, verdict.rule = refused.reason, refused.name
    else:
        try:
            if purpose == TRAIN and (op.grads or not op.need_top_grad):
                if closures is None:
                    raise _NotNative.of("own-gradient")
                verdict.graph = closures(op, params, shapes, dtypes, values)
            else:
                verdict.graph = _Tracer(op, params, purpose).graph(shapes, dtypes, values)
        except _NotNative as exc:
            verdict.reason, verdict.rule = str(exc), exc.rule
    return verdict


class _NotNative(Exception):
    """The reason an operator's forward does not stand in as a native graph (and its rule)."""

    def __init__(self, reason: str, rule: str = ""):
        super().__init__(reason)
        self.rule = rule

    @classmethod
    def of(cls, rule: str, *found: Any) -> _NotNative:
        """The refusal ``rule`` of :data:`customop.graphs.rules.TRACE_REFUSALS`, filled in."""
        return cls(rules.TRACE_REFUSALS[rule].format(*found), rule)


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
            raise _NotNative.of("forward-failed", f"{type(exc).__name__}: {exc}") from None

    def graph(self, shapes, dtypes, values) -> NativeGraph:
        first = list(values) if values is not None else placeholders(shapes, dtypes, 1)
        second = _perturbed(first)
        rec1 = self.record(first)
        self.check(rec1)
        rec2 = self.record(second)
        self.check(rec2)
        if compare.structure(rec1) != compare.structure(rec2):
            raise _NotNative.of("value-dependent")
        changed = [rec1.nodes[i]["name"] for i in rec1.free
                   if not consts.same(rec1.free[i], rec2.free[i])]
        if changed:
            raise _NotNative.of("outside-graph")
        graph = self.fragment(rec1, shapes)
        graph.checks = rec1.checks
        if not compare.close(evaluate(graph, second), rec2.outputs):
            raise _NotNative.of("other-outputs")
        if self.purpose == TRAIN:  # an export holds at the shapes it is exported with
            graph.specialized = self.generality(graph, shapes, dtypes, first)
            if graph.specialized:
                raise _NotNative.of("shape-specialized", graph.specialized)
        return guards.guarded(graph, rec1.guarded, rules.INDEX_GUARDS)

    def check(self, rec: trace.Recording) -> None:
        found = rules.recorded_refusal(rec, self.purpose)
        if found is not None:
            raise _NotNative(found[1], found[0].name)

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
            diff = compare.difference(graph, alt)
            if diff:
                return f"{diff} at input shapes {_shapes_text(other)}"
            if not compare.close(evaluate(graph, values, alt.constants), rec.outputs):
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
        return not compare.difference(graph, alt)

    # ---- the recorded graph as a NativeGraph ------------------------------------------------
    def fragment(self, rec: trace.Recording, shapes) -> NativeGraph:
        nodes = [dict(n, attrs=dict(n["attrs"])) for n in rec.nodes]
        for n in nodes:
            rewrite = rules.REWRITES.get(n["op"])
            if rewrite is not None:
                n["op"], n["attrs"] = rewrite(n["attrs"])
        slot = {node: i for i, node in enumerate(rec.inputs) if node is not None}
        const, values = consts.folded(nodes, slot, rec.free, rec.heads)
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
                        found = consts.add_node(out_nodes, "BlockGrad", {}, [found])
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
                    stopped[r] = consts.add_node(out_nodes, "BlockGrad", {}, [r])
                r = stopped[r]
            return r

        for j, n in enumerate(nodes):
            if j in slot or const[j]:
                continue
            if n["op"] == "null":
                raise _NotNative.of("unread-array")
            inputs = [leaving(e[0], e[1], j) for e in n["inputs"]]
            out_nodes.append({"op": n["op"], "name": n["name"], "attrs": n["attrs"],
                              "inputs": inputs})
            placed[j] = len(out_nodes) - 1
        heads = []
        for j, k in rec.heads:
            r = leaving(j, k, None)
            if r[0] != "node" or out_nodes[r[1]]["op"] == "BlockGrad":
                r = consts.add_node(out_nodes, "_copy", {}, [r])  # an input or a constant as is
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
        expressed = consts.expressed(value, nodes, shapes)
        if expressed is None:
            raise _NotNative.of("constant-unheld", value.shape, value.dtype)
        # MXNet parses number attributes itself: the written constant must be exact.
        probe = NativeGraph([dict(n, inputs=[_shifted(r, start) for r in n["inputs"]])
                             for n in nodes[start:]], [_shifted(expressed, start)])
        try:
            got = evaluate(probe, [np.zeros(s, np.float32) for s in shapes])[0]
        except mx.base.MXNetError as exc:
            got = exc
        if not isinstance(got, np.ndarray) or not consts.same(got.reshape(value.shape)
                                                         if got.size == value.size else got,
                                                         value):
            raise _NotNative.of("constant-inexact", value.shape, value.dtype)
        return expressed


def _shifted(r: tuple, start: int) -> tuple:
    return ("node", r[1] - start, r[2]) if r[0] == "node" else r


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


# ---- shared with customop.graphs.transposed (which checks training graphs the same way) ---
perturbed, other_shapes, shapes_text = _perturbed, _other_shapes, _shapes_text
Tracer, NotNative = _Tracer, _NotNative
