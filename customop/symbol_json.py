"""Symbol graph JSON: loading and running it, node attributes, our Custom nodes, a block's graph.

MXNet's graphs travel as JSON (``Symbol.tojson``, symbol files): ``nodes`` in
topological order, each with ``op``, ``name``, its attributes (``attrs``; older
files say ``attr`` or ``param``) and ``inputs`` as ``[node, output, version]``
entries, and ``heads``.  A decorated op stands in a graph as an ``op: "Custom"``
node whose ``op_type`` attribute names it.  Everything in customop that reads
or writes that JSON (splicing native graphs in, export, explain, loading symbol
files, the runtime's ``aux`` patch) does it through this module; the rewrites of an
exported graph (names, batch sizes, shape checks) are :mod:`customop.deploy.rewrites`'s.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import mxnet as mx
import numpy as np

from .nd_copies import ndarray


@dataclass
class NativeGraph:
    """An operator's forward as MXNet operators, for one signature (a piece of graph JSON).

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
    # Not checked (False): a signature at another dtype is verified on its own, as the
    # verdicts and their shape families are keyed by dtype (customop.graphs.verify).
    dtype_generic: bool = False
    generic: tuple = ()  # the sizes the graph was checked to hold at another value of
    note: str = ""  # how a def_grad op's gradient is carried (customop.graphs.backward)
    # A def_grad op's graph without its transposed closures, for graphs where none of the
    # inputs ``differentiates`` (by index) can need a gradient (customop.graphs.splice).
    forward_only: NativeGraph | None = None
    differentiates: tuple = ()

    def operators(self) -> list[str]:
        return [n["op"] for n in self.nodes]


def attrs(node: dict[str, Any]) -> dict[str, str]:
    """A node's attributes, whatever the MXNet version that wrote it called them."""
    return node.get("attrs") or node.get("attr") or node.get("param") or {}


def parse(sym: mx.sym.Symbol) -> dict[str, Any]:
    """``sym``'s graph as JSON."""
    return json.loads(sym.tojson())


def anonymous(sym: mx.sym.Symbol) -> str:
    """``sym``'s graph as text without its operators' names (each trace numbers its nodes
    anew): two graphs that differ only in those names give the same text."""
    graph = parse(sym)
    for node in graph["nodes"]:
        if node["op"] != "null":
            node["name"] = ""
    return json.dumps([graph["nodes"], graph["heads"]], sort_keys=True)


def graph_of(sym: mx.sym.Symbol) -> dict[str, Any] | None:
    """The symbol's JSON graph, or None when it holds no ``Custom`` node (cheap then)."""
    # (debug_str: cheaper than tojson, measured: docs/design.md)
    if "Op:Custom," not in sym.debug_str():
        return None
    return parse(sym)


def custom_nodes(graph: dict[str, Any]) -> list[tuple[int, dict[str, Any], str]]:
    """``(index, node, op_type)`` of every ``Custom`` node of ``graph``, in graph order."""
    return [
        (i, node, attrs(node).get("op_type", ""))
        for i, node in enumerate(graph.get("nodes", []))
        if node.get("op") == "Custom"
    ]


def custom_op_types(symbol_json: str) -> list[str]:
    """The ``op_type`` of every ``Custom`` node in a symbol's JSON text, in graph order."""
    seen: list[str] = []
    for _, _, op_type in custom_nodes(json.loads(symbol_json)):
        if op_type and op_type not in seen:
            seen.append(op_type)
    return seen


# ---- a block's graph --------------------------------------------------------------------------
def block_graph(block: mx.gluon.HybridBlock, inputs) -> tuple:
    """``(input symbols, output symbol)`` of ``block`` for these inputs, without hybridizing it.

    A block not run yet runs once (imperatively unless hybridized, not recording), so that
    its parameters finish their deferred initialization.
    """
    if not block._cached_graph:
        with mx.autograd.pause():
            block(*inputs)
        if not block._cached_graph:
            block._get_graph(*inputs)
    return block._cached_graph


def block_signature(block: mx.gluon.HybridBlock, inputs) -> tuple:
    """``(input symbols, output symbol, shapes, dtypes)`` of ``block`` for these inputs.

    ``shapes``/``dtypes`` by input name: the data inputs', then every initialized
    parameter's (what :func:`customop.export` and :func:`customop.explain` trace at).
    """
    data, sym = block_graph(block, inputs)
    shapes = {d.name: a.shape for d, a in zip(data, inputs)}
    dtypes = {d.name: a.dtype for d, a in zip(data, inputs)}
    for name, param in block.collect_params().items():
        if param._data is not None:
            shapes[name], dtypes[name] = param.shape, param.dtype
    return data, sym, shapes, dtypes


# ---- graphs of MXNet operators as JSON: written, loaded, run ------------------------------------
def to_json(
    graph: Any, input_names: Sequence[str], const_names: dict[str, str] | None = None
) -> dict[str, Any]:
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
        nodes.append(
            {"op": n["op"], "name": n["name"], "attrs": dict(n["attrs"]), "inputs": inputs}
        )
    heads = [entry(r) for r in graph.heads]
    return {"nodes": nodes, "heads": heads}


def run(graph: dict[str, Any], args: dict[str, mx.nd.NDArray]) -> list[np.ndarray]:
    # A CachedOp (binding an executor prints MKLDNN notices), which needs an input.
    n = len(graph["heads"])
    graph = {
        "nodes": [*graph["nodes"], {"op": "null", "name": "_customop_unused", "inputs": []}],
        "heads": graph["heads"],
    }
    graph["nodes"].append(
        {
            "op": "_copy",
            "name": "_customop_unused_copy",
            "inputs": [[len(graph["nodes"]) - 1, 0, 0]],
        }
    )
    graph["heads"] = [*graph["heads"], [len(graph["nodes"]) - 1, 0, 0]]
    args = dict(args, _customop_unused=mx.nd.zeros((1,)))
    sym, cached = cached_op(graph)
    with mx.autograd.pause():
        outs = cached(*[args[name] for name in sym.list_inputs()])
    return [o.asnumpy() for o in outs[:n]]


_kept = threading.local()  # .ops: this thread's graphs' text -> (Symbol, CachedOp)
KEPT_OPS = 8


def cached_op(graph: dict[str, Any]) -> tuple[mx.sym.Symbol, mx.nd.CachedOp]:
    """``graph``'s Symbol and a ``CachedOp`` of it, kept for this thread's last
    :data:`KEPT_OPS` graphs.

    A graph's checks run it several times (on other values, at grown shapes): loading it and
    making its ``CachedOp`` cost a third of a run, and a ``CachedOp``'s first call sets up
    its graph (measured: docs/design.md).  Per thread: one ``CachedOp`` is never called from
    two threads at once.

    Example:
        >>> import mxnet as mx
        >>> from customop import symbol_json
        >>> graph = {"nodes": [{"op": "null", "name": "x", "inputs": []},
        ...                    {"op": "negative", "name": "y", "inputs": [[0, 0]]}],
        ...          "heads": [[1, 0]]}
        >>> sym, op = symbol_json.cached_op(graph)
        >>> op(mx.nd.array([1.0, -2.0])).asnumpy().tolist()
        [-1.0, 2.0]
        >>> symbol_json.cached_op(graph)[1] is op
        True
    """
    text = _text(graph)
    ops = getattr(_kept, "ops", None)
    if ops is None:
        ops = _kept.ops = OrderedDict()
    found = ops.get(text)
    if found is None:
        sym = mx.sym.load_json(text)
        found = ops[text] = (sym, mx.nd.CachedOp(sym))
        while len(ops) > KEPT_OPS:
            ops.popitem(last=False)
    else:
        ops.move_to_end(text)
    return found


_INIT = re.compile(r'"__init__": "(?:[^"\\]|\\.)*"')  # a variable's initializer in JSON text


def without_initializers(text: str) -> str:
    """A graph's JSON ``text`` with each variable's initializer left empty: it computes
    nothing in the graph, and Gluon names a ``Constant``'s by its ``id`` (another in each
    process), so keys and digests of a graph leave it out.

    Example:
        >>> from customop.symbol_json import without_initializers
        >>> without_initializers('{"attrs": {"__init__": "[\\\\"constant_13\\\\", {}]"}}')
        '{"attrs": {"__init__": ""}}'
    """
    return _INIT.sub('"__init__": ""', text)


def load(graph: dict[str, Any]) -> mx.sym.Symbol:
    """A Symbol from JSON nodes and heads (``arg_nodes`` and versions filled in)."""
    return mx.sym.load_json(_text(graph))


def _text(graph: dict[str, Any]) -> str:
    nodes = [
        dict(n, attrs={k: str(v) for k, v in (n.get("attrs") or {}).items()})
        for n in graph["nodes"]
    ]
    for n in nodes:
        if not n["attrs"]:
            n.pop("attrs")
        n["inputs"] = [list(e) + [0] * (3 - len(e)) for e in n["inputs"]]
    return json.dumps(
        {
            "nodes": nodes,
            "arg_nodes": [i for i, n in enumerate(nodes) if n["op"] == "null"],
            "heads": [list(h) + [0] * (3 - len(h)) for h in graph["heads"]],
            "attrs": {"mxnet_version": ["int", 10901]},
        }
    )


def evaluate(
    graph: Any, inputs: Sequence[np.ndarray], constants: dict[str, np.ndarray] | None = None
) -> list[np.ndarray]:
    """``graph``'s outputs on these inputs (its constants, or those given)."""
    names = [f"input{i}" for i in range(len(inputs))]
    args = {n: ndarray(v) for n, v in zip(names, inputs)}
    for name, value in (constants if constants is not None else graph.constants).items():
        args[name] = ndarray(value)
    return run(to_json(graph, names), args)


# ---- reordering and pruning (customop.deploy.rewrites's rewrites) --------------------------------
def toposorted(graph: dict[str, Any]) -> dict[str, Any]:
    """``graph`` with its nodes in an order where every node comes after its inputs
    (the old order wherever it already was)."""
    nodes = graph["nodes"]
    order: list[int] = []
    state = [0] * len(nodes)  # 0 new, 1 on the stack, 2 placed
    for root in range(len(nodes)):
        stack = [(root, 0)]
        while stack:
            i, k = stack.pop()
            if state[i] == 2:
                continue
            state[i] = 1
            ins = nodes[i]["inputs"]
            if k < len(ins):
                stack.append((i, k + 1))
                j = ins[k][0]
                if state[j] == 0:
                    stack.append((j, 0))
                continue
            state[i] = 2
            order.append(i)
    where = {old: new for new, old in enumerate(order)}
    out = dict(graph)
    out["nodes"] = [
        dict(nodes[i], inputs=[[where[e[0]], e[1], 0] for e in nodes[i]["inputs"]]) for i in order
    ]
    out["heads"] = [[where[h[0]], h[1], 0] for h in graph["heads"]]
    out["arg_nodes"] = [i for i, n in enumerate(out["nodes"]) if n["op"] == "null"]
    out.pop("node_row_ptr", None)
    return out


def reachable(graph: dict[str, Any]) -> dict[str, Any]:
    """``graph`` without the nodes its heads do not read (an input a loss dropped)."""
    nodes = graph["nodes"]
    seen, stack = set(), [h[0] for h in graph["heads"]]
    while stack:
        i = stack.pop()
        if i not in seen:
            seen.add(i)
            stack += [e[0] for e in nodes[i]["inputs"]]
    keep = sorted(seen)
    where = {old: new for new, old in enumerate(keep)}
    out = dict(
        graph,
        nodes=[
            dict(nodes[i], inputs=[[where[e[0]], e[1], 0] for e in nodes[i]["inputs"]])
            for i in keep
        ],
    )
    out["heads"] = [[where[h[0]], h[1], 0] for h in graph["heads"]]
    return out


def entry_signatures(frag: Any, shapes, dtypes) -> dict:
    """(shape, dtype) of every node output of ``frag`` (a
    :class:`customop.graphs.graph_verdicts.NativeGraph`) at these input shapes and dtypes, by
    ``(node, output)``."""
    names = [f"input{i}" for i in range(len(shapes))]
    graph = to_json(frag, names)
    sym = load(graph)
    internals = sym.get_internals()
    args = set(sym.list_inputs())
    _, out_shapes, _ = internals.infer_shape_partial(
        **{nm: tuple(s) for nm, s in zip(names, shapes) if nm in args}
    )
    _, out_types, _ = internals.infer_type_partial(
        **{nm: np.dtype(d) for nm, d in zip(names, dtypes) if nm in args}
    )
    # (list_outputs names each visible output "<node>_<output name>"; some operators have
    # hidden outputs, so the graph's node_row_ptr does not index these lists)
    wanted = {nd["name"]: k for k, nd in enumerate(frag.nodes)}
    counts: dict[int, int] = {}
    found: dict[tuple[int, int], tuple] = {}
    for pos, label in enumerate(internals.list_outputs()):
        node, _, _ = label.rpartition("_output")
        k = wanted.get(node)
        if k is None:
            continue
        out = counts.get(k, 0)
        counts[k] = out + 1
        s = out_shapes[pos]
        found[(k, out)] = (tuple(s) if s is not None else None, out_types[pos])
    return found
