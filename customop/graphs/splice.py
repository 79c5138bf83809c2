"""Replacing the ``Custom`` nodes of a graph by the native graphs of their operators.

:func:`inline` takes a Symbol and the shapes and dtypes of its inputs, finds each
``Custom`` node of one of our ``'mxnet'``-mode operators, asks
:mod:`customop.graphs.graph_verdicts` for that operator's graph at the node's own input
signature, and writes the graph in the node's place (a new Symbol; the input
Symbol is unchanged).  Nodes it cannot inline stay, each with its reason.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import mxnet as mx
import numpy as np

from .. import budget, errors, registry, symbol_json
from ..prop import decode_cached
from . import graph_verdicts, rules, tidy


@dataclass
class Kept:
    """A ``Custom`` node left in the graph, and why (``rule``: the refusal's name in
    :mod:`customop.graphs.rules`' tables)."""

    node: str
    op_type: str
    reason: str
    rule: str = ""

    def __str__(self) -> str:
        return f"node {self.node!r} (customop {self.op_type!r}): {self.reason}"


@dataclass
class Spliced:
    """The graph with native graphs in place of ``Custom`` nodes."""

    symbol: mx.sym.Symbol
    inlined: list[str] = field(default_factory=list)  # the nodes replaced
    verdicts: dict[str, Any] = field(default_factory=dict)  # node -> its graph_verdicts.Verdict
    kept: list[Kept] = field(default_factory=list)
    constants: dict[str, np.ndarray] = field(default_factory=dict)  # new variables (export)
    # inputs of the graph whose need of a gradient chose a node's forward-only graph or its
    # full one (see inline's grads=)
    switches: set[str] = field(default_factory=set)
    # every input's shape the graph's shape pass found at this signature (None: not run)
    input_shapes: dict[str, tuple] | None = None
    # the JSON text of the graph spliced, where the caller gave it (customop.graphs.binding)
    source: str | None = None
    # each inlined node's input signature, by name: (shapes, dtypes) its graph was asked at
    signatures: dict[str, tuple] = field(default_factory=dict)
    # the graph ``symbol`` was loaded from (None: read back, customop.graphs.saved_splices)
    graph: dict[str, Any] | None = None
    # read back: the file key of the inlined ops' saved verdicts (customop.graphs.saved_splices)
    verdicts_key: str | None = None


@dataclass
class Inferred:
    """MXNet's shape and type passes over a graph at one signature: every node's outputs
    (rows of the graph's internals) and every input whose shape they found."""

    out_shapes: list
    out_types: list
    input_shapes: dict[str, tuple]


def inferred(
    sym: mx.sym.Symbol,
    shapes: dict[str, Any],
    dtypes: dict[str, Any],
    graph: dict[str, Any] | None = None,
    text: str | None = None,
) -> Inferred:
    """:class:`Inferred` of ``sym`` at these input shapes and dtypes (by name; names the
    graph lacks are ignored).  Raises what the passes raise: the ``Custom`` nodes of our
    ops answer them with their checks (a bad signature raises the op's named error).

    ``graph``, ``text``: ``sym`` parsed and as ``sym.tojson()`` wrote it, when the caller
    has them: a signature whose dtypes a type pass of the graph answered before then runs
    each of our nodes' type function (its checks) instead of the pass (:func:`_types_hold`).
    """
    internals = sym.get_internals()
    listed = None
    if graph is not None and text:
        with _types_lock:
            listed = _types.recall((text, None))
    if listed is None:
        listed = internals.list_arguments(), internals.list_auxiliary_states()
        if graph is not None and text:
            with _types_lock:  # (by the text: its names, read once)
                _types.keep((text, None), listed, budget.RECALLED)
    arg_names, aux_names = listed
    names = {*arg_names, *aux_names}  # (the internals' inputs are the graph's)
    args, out_shapes, aux = internals.infer_shape_partial(
        **{k: tuple(v) for k, v in shapes.items() if k in names}
    )
    given = {k: np.dtype(v) for k, v in dtypes.items() if k in names}
    key = (text, tuple(sorted(given.items()))) if graph is not None and text else None
    out_types = None
    if key is not None:
        with _types_lock:
            before = _types.recall(key)
        if before is not None and _types_hold(graph, out_shapes, before):
            out_types = before
    if out_types is None:
        _, out_types, _ = internals.infer_type_partial(**given)
        if key is not None and out_types and all(t is not None for t in out_types):
            with _types_lock:
                _types.keep(key, out_types, budget.RECALLED)
    found = {
        n: tuple(s)
        for n, s in zip([*arg_names, *aux_names], [*(args or []), *(aux or [])])
        if s and all(d > 0 for d in s)
    }
    return Inferred(out_shapes, out_types, found)


# A graph's type pass by its JSON text and input dtypes (and its inputs' names by the text).
# MXNet's own operators infer dtypes from dtypes alone, so at a new signature that changes
# shapes only, the pass can differ only where one of our nodes answers otherwise at its new
# input shapes: each node's type function runs (what its prop's infer_type runs, its checks
# with it), and the pass runs again where any answer differs or raises (a check's error is
# then raised by the pass, as before).  The type pass's callbacks cost 10-35 us a node
# (measured: the RetinaNet-style head's pass 51 us warm, 110-120 us inside a step).  Under
# the memory budget.
_types = budget.Table()
_types_lock = threading.Lock()


def _types_hold(graph: dict[str, Any], out_shapes: list, types: list) -> bool:
    """Whether the type pass that gave ``types`` gives them again at ``out_shapes`` (the
    shape pass's rows): every ``Custom`` node is one of ours without aux states, and its
    type function, run at its new input shapes, answers its outputs' dtypes as before."""
    rows = graph.get("node_row_ptr")
    if rows is None or len(types) != rows[-1] or len(out_shapes or ()) != rows[-1]:
        return False
    nodes = _typed_nodes(graph)
    if nodes is None:
        return False
    for op, params, pkey, entries, outs in nodes:
        try:
            in_shapes = tuple(tuple(int(d) for d in out_shapes[r]) for r in entries)
            if not all(s and all(d > 0 for d in s) for s in in_shapes):
                return False
            in_types = tuple(np.dtype(types[r]) for r in entries)
            metas = op.inference.outputs(pkey, dict(params), in_shapes, in_types)
        except Exception:  # noqa: BLE001 - the pass runs, and raises it as before
            return False
        if [m.dtype for m in metas] != [np.dtype(t) for t in types[outs]]:
            return False
    return True


# What _types_hold reads of each Custom node of a graph, by the graph (kept with it: its id
# is the key): the operator, its decoded parameters and their key, the rows of its inputs
# and the slice of its outputs; None where a node is not one of ours without aux states, or
# its attributes do not decode (the type pass then runs, and raises what it raises).  A
# graph binds and CachedOps splice is one object per JSON text (customop.graphs.binding),
# so each new signature finds it; an operator redefined in place is looked up again (its
# registration is in the key).  Under the memory budget of customop.budget.
_typed = budget.Table()
_typed_lock = threading.Lock()


def _typed_nodes(graph: dict[str, Any]) -> list | None:
    found_ops = [(i, node, registry.lookup(t)) for i, node, t in symbol_json.custom_nodes(graph)]
    key = (id(graph), tuple(op for _, _, op in found_ops))
    return _per_graph(_typed, _typed_lock, key, graph, lambda: _typed_read(graph, found_ops))


def _typed_read(graph: dict[str, Any], found_ops: list) -> list | None:
    rows = graph["node_row_ptr"]
    nodes: list | None = []
    for i, node, op in found_ops:
        if op is None or op.signature.aux:
            nodes = None
            break
        kwargs = {k: v for k, v in symbol_json.attrs(node).items() if k != "op_type"}
        kwargs.pop(errors.CALL_KEY, None)
        try:
            params, pkey = decode_cached(kwargs)
        except Exception:  # noqa: BLE001 - the pass runs, and raises it as before
            nodes = None
            break
        entries = tuple(rows[e[0]] + e[1] for e in node["inputs"])
        nodes.append((op, params, pkey, entries, slice(rows[i], rows[i + 1])))
    return nodes


def _per_graph(table: budget.Table, lock: threading.Lock, key: tuple, graph: dict, make) -> Any:
    # make()'s value kept in table under key (whose first item is id(graph)), with the graph
    # itself: a graph freed and another made at its address is not mistaken for it
    with lock:
        found = table.recall(key)
    if found is not None and found[0] is graph:
        return found[1]
    value = make()
    with lock:
        table.keep(key, (graph, value), budget.RECALLED)
    return value


def gradient_sources(graph: dict[str, Any], entries: list) -> set[str]:
    """Names of the variables of ``graph`` from which a gradient can reach ``entries``."""
    nodes, found, seen = graph["nodes"], set(), set()
    stack = [e[0] for e in entries]
    while stack:
        j = stack.pop()
        if j in seen:
            continue
        seen.add(j)
        node = nodes[j]
        if node["op"] == "null":
            found.add(node["name"])
            continue
        if node["op"] not in rules.NO_GRADIENT:
            stack += [e[0] for e in node["inputs"]]
        elif rules.NO_GRADIENT[node["op"]] is not None:
            stack += [
                e[0] for k, e in enumerate(node["inputs"]) if k not in rules.NO_GRADIENT[node["op"]]
            ]
    return found


# gradient_sources by graph and entries, for inline: the graphs binds and CachedOps splice are
# one object per JSON text (customop.graphs.binding keeps them), so each new signature of a
# graph finds them (the graph kept with them: its id is in the key).  Under the memory budget.
_sources = budget.Table()
_sources_lock = threading.Lock()


def _sources_of(graph: dict[str, Any], entries: list) -> frozenset[str]:
    key = (id(graph), tuple((e[0], e[1]) for e in entries))
    return _per_graph(
        _sources, _sources_lock, key, graph, lambda: frozenset(gradient_sources(graph, entries))
    )


def ours(graph: dict[str, Any]) -> list[tuple[int, Any]]:
    """``(index, operator)`` of the ``Custom`` nodes of decorated operators."""
    found = []
    for i, _, op_type in symbol_json.custom_nodes(graph):
        op = registry.lookup(op_type)
        if op is not None:
            found.append((i, op))
    return found


def foreign(graph: dict[str, Any]) -> list[str]:
    """The ``Custom`` nodes no decorated operator stands behind (hand-written CustomOps)."""
    return [
        f"node {node['name']!r} (op_type {symbol_json.attrs(node).get('op_type')!r}): not "
        "a customop operator (a hand-written mx.operator.CustomOp)"
        for _, node, op_type in symbol_json.custom_nodes(graph)
        if registry.lookup(op_type) is None
    ]


def candidates(graph: dict[str, Any], purpose: str) -> list[int]:
    """Nodes of ``graph`` that are ``Custom`` nodes of ours that may inline for ``purpose``."""
    return [i for i, op in ours(graph) if not graph_verdicts.static_reason(op, purpose)]


def inline(
    sym: mx.sym.Symbol,
    shapes: dict[str, tuple],
    dtypes: dict[str, Any],
    purpose: str,
    graph: dict[str, Any] | None = None,
    grads: set[str] | None = None,
    known: Inferred | None = None,
    text: str | None = None,
) -> Spliced | None:
    """``sym`` with native graphs in place of its inlinable ``Custom`` nodes.

    ``shapes``/``dtypes``: by input (argument and aux state) name.  None when
    the graph holds no ``Custom`` node of ours.  ``purpose``: ``'train'`` or
    ``'export'`` (see :mod:`customop.graphs.graph_verdicts`).  ``grads``: the inputs that can need a
    gradient (None: any); a ``def_grad`` op none of whose differentiated inputs is reached
    from one runs its forward alone (``NativeGraph.forward_only``).  ``known``: the graph's
    :func:`inferred` at these shapes and dtypes, when the caller ran it already; ``text``:
    ``graph`` as ``sym.tojson()`` wrote it, when the caller has it.
    """
    graph = graph if graph is not None else symbol_json.graph_of(sym)
    if graph is None:
        return None
    nodes = graph["nodes"]
    found_ours = ours(graph)
    if not found_ours:
        return None
    result = Spliced(sym)
    wanted = [i for i, op in found_ours if not graph_verdicts.static_reason(op, purpose)]
    for i, op in found_ours:
        if i not in wanted:
            refused = rules.op_refusal(op, purpose)
            result.kept.append(
                Kept(nodes[i]["name"], errors.shown(op.op_type), refused.reason, refused.name)
            )
    if not wanted:
        return result
    signatures = _input_signatures(sym, graph, wanted, shapes, dtypes, known, result, text)
    graphs: dict[int, graph_verdicts.NativeGraph] = {}
    for i in wanted:
        node = nodes[i]
        op = registry.lookup(symbol_json.attrs(node)["op_type"])
        found = signatures.get(i)
        if isinstance(found, _Refused):
            result.kept.append(
                Kept(node["name"], errors.shown(op.op_type), found.reason, found.rule)
            )
            continue
        params = decode_cached(
            {k: v for k, v in symbol_json.attrs(node).items() if k != "op_type"}
        )[0]
        verdict = graph_verdicts.native_graph(op, params, found[0], found[1], purpose)
        result.signatures[node["name"]] = found
        if verdict.graph is None:
            result.kept.append(Kept(node["name"], verdict.op_type, verdict.reason, verdict.rule))
        else:
            graphs[i] = verdict.graph
            result.verdicts[node["name"]] = verdict
            if verdict.graph.forward_only is not None and grads is not None:
                sources = _sources_of(
                    graph, [node["inputs"][k] for k in verdict.graph.differentiates]
                )
                result.switches |= sources
                if not sources & grads:
                    graphs[i] = verdict.graph.forward_only
    if graphs:
        new, result.constants = _spliced_once(graph, graphs, text)
        result.graph = tidy.tidied(new, shapes if purpose == graph_verdicts.TRAIN else None)
        result.symbol = _loaded(result.graph)
        result.inlined = [nodes[i]["name"] for i in graphs]
    return result


def ask(
    graph: dict[str, Any],
    signatures: dict[str, tuple],
    purpose: str,
    saved: dict[str, Any] | None = None,
) -> None:
    """Ask :mod:`customop.graphs.graph_verdicts` for the graph of each ``Custom`` node of ours
    named in ``signatures``, at its input signature there (``(shapes, dtypes)``, as
    :attr:`Spliced.signatures` holds them): what :func:`inline` asks, without splicing (its
    tables, the ops' shape families among them, are then filled as that splice fills them).
    ``saved``: by node, its op's saved verdict read with the splice (no file of its own)."""
    nodes = graph["nodes"]
    for i, op in ours(graph):
        name = nodes[i]["name"]
        found = signatures.get(name)
        if found is not None:
            kwargs = {k: v for k, v in symbol_json.attrs(nodes[i]).items() if k != "op_type"}
            given = (saved or {}).get(name)
            graph_verdicts.native_graph(op, decode_cached(kwargs)[0], *found, purpose, saved=given)


# Spliced graphs by the graph and the native graphs put in: a shape family's signatures get
# the same native graphs (customop.graphs.graph_verdicts' families), so one spliced graph object,
# which tidying then finds (its tables are by graph object first).  The native graphs are kept
# with it (their ids are in the key).  Under the memory budget of customop.budget.
_splices = budget.Table()
_splices_lock = threading.Lock()


def _spliced_once(
    graph: dict[str, Any], graphs: dict[int, graph_verdicts.NativeGraph], text: str | None = None
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    # (the key: the graph as MXNet wrote it, or written here; one graph can sit under both)
    text = text if text is not None else json.dumps(graph, sort_keys=True)
    key = (text, tuple(sorted((i, id(g)) for i, g in graphs.items())))
    with _splices_lock:
        found = _splices.recall(key)
    if found is None or any(found[0].get(i) is not g for i, g in graphs.items()):
        new, constants = _spliced(graph, graphs)
        found = (dict(graphs), new, constants)
        with _splices_lock:
            _splices.keep(key, found, budget.RECALLED + 400 * len(new["nodes"]) + len(text))
    return found[1], dict(found[2])


# Symbols by the graph they were loaded from: tidying gives a shape family's signatures one
# graph object (customop.graphs.tidy keeps it), so they share one Symbol (nothing changes a
# spliced Symbol: binds and CachedOps read it).  The graph is kept with its Symbol (its id
# is the key); under the memory budget of customop.budget.
_symbols = budget.Table()
_symbols_lock = threading.Lock()


def _loaded(graph: dict[str, Any]) -> mx.sym.Symbol:
    with _symbols_lock:
        found = _symbols.recall(id(graph))
    if found is not None and found[0] is graph:
        return found[1]
    sym = None
    if _adopted:  # (a Symbol read back is taken for the graph it was saved from)
        key = digest(graph)
        with _symbols_lock:
            found = _adopted.pop(key, None)
        if found is not None and all(
            (found[1].get(n["name"]) or None) == (n.get("attrs") or None)
            for n in graph["nodes"]
            if n["op"] == "null"
        ):
            sym = found[0]
    if sym is None:
        sym = symbol_json.load(graph)
    with _symbols_lock:
        _symbols.keep(id(graph), (graph, sym), budget.RECALLED + 400 * len(graph["nodes"]))
    return sym


# Symbols read back from the files of customop.graphs.saved_splices, by the digest of the
# graph they were saved from, with their variables' attributes: a process's first bind of a
# graph reads its Symbol there, and its next signature of the same shape family, splicing in
# memory, makes the same graph (loading it again: 1.2 ms for the RetinaNet-style head,
# measured).  Taken once, by a graph whose variables have those attributes (initializers
# included: the digest leaves them out).
_adopted: dict[str, tuple] = {}


def digest(graph: dict[str, Any]) -> str:
    """A digest of ``graph``'s nodes and heads, variables' initializers aside (Gluon names a
    ``Constant``'s by its ``id``, another in each process)."""
    text = json.dumps({"nodes": graph["nodes"], "heads": graph["heads"]}, sort_keys=True)
    return hashlib.sha256(symbol_json.without_initializers(text).encode("utf-8")).hexdigest()


def adopt(found: str, sym: mx.sym.Symbol, variables: dict[str, Any]) -> None:
    """Take ``sym`` as the Symbol of the graph whose :func:`digest` is ``found`` and whose
    variables have the attributes ``variables`` (by name), the next time a splice makes
    that graph."""
    with _symbols_lock:
        _adopted[found] = (sym, variables)


def clear_cache() -> None:
    """Forget the Symbols :func:`adopt` was given (tests)."""
    with _symbols_lock:
        _adopted.clear()


class _Refused(NamedTuple):
    rule: str  # a name of rules.NODE_REFUSALS
    reason: str

    @classmethod
    def of(cls, rule: str, *found: Any) -> _Refused:
        return cls(rule, rules.NODE_REFUSALS[rule].format(*found))


def _input_signatures(
    sym, graph, wanted, shapes, dtypes, known, result, text=None
) -> dict[int, Any]:
    """(shapes, dtypes) of each wanted node's inputs, or the refusal saying they are unknown
    (``result.input_shapes``: what the shape pass found for the graph's inputs)."""
    nodes = graph["nodes"]
    rows = graph.get("node_row_ptr")
    if rows is None:  # pragma: no cover - MXNet 1.9 always writes it
        return {i: _Refused.of("no-node-rows") for i in wanted}
    entries: list[tuple[int, int]] = []
    for i in wanted:
        entries += [(e[0], e[1]) for e in nodes[i]["inputs"]]
    entries = list(dict.fromkeys(entries))
    if not entries:  # operators without inputs
        return {i: ([], []) for i in wanted}
    # Every node's outputs, inferred over the whole graph: a Custom node may tell its own
    # inputs' shapes (infer_input_shape=), which a part of the graph would not know.
    if known is None:
        try:
            known = inferred(sym, shapes, dtypes, graph, text)
        except Exception as exc:  # noqa: BLE001 - binding the graph as it is raises it again
            refused = _Refused.of("signature-uninferable", errors.mxnet_text(exc))
            return {i: refused for i in wanted}
    out_shapes, out_types = known.out_shapes, known.out_types
    result.input_shapes = known.input_shapes
    if len(out_shapes) != rows[-1]:  # pragma: no cover - MXNet lists every node's outputs
        return {i: _Refused.of("rows-unmatched") for i in wanted}
    at = {
        (j, k): (
            tuple(out_shapes[rows[j] + k]) if out_shapes[rows[j] + k] else None,
            out_types[rows[j] + k],
        )
        for j, k in entries
    }
    found: dict[int, Any] = {}
    for i in wanted:
        sig = [at[(e[0], e[1])] for e in nodes[i]["inputs"]]
        if any(s is None or not all(d > 0 for d in s) or t is None for s, t in sig):
            found[i] = _Refused.of("input-shapes-unknown")
        else:
            found[i] = ([s for s, _ in sig], [np.dtype(t) for _, t in sig])
    return found


def _spliced(
    graph: dict[str, Any], graphs: dict[int, graph_verdicts.NativeGraph]
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    old = graph["nodes"]
    nodes: list[dict[str, Any]] = []
    where: dict[tuple[int, int], list[int]] = {}  # old entry -> new [node, output]
    constants: dict[str, np.ndarray] = {}

    moved: dict[int, int] = {}  # old node -> new node, for nodes copied as they are

    def entry(e) -> list[int]:
        found = where.get((e[0], e[1]))
        return list(found) if found is not None else [moved[e[0]], e[1]]

    for i, node in enumerate(old):
        if i not in graphs:
            copy = {k: v for k, v in node.items() if k != "inputs"}
            copy["inputs"] = [[*entry(e), 0] for e in node["inputs"]]
            nodes.append(copy)
            moved[i] = len(nodes) - 1
            continue
        inputs = [entry(e) for e in node["inputs"]]
        heads = _place(
            nodes,
            node["name"],
            inputs,
            graphs[i],
            constants,
            symbol_json.attrs(node).get("__ctx_group__"),
        )
        for k, h in enumerate(heads):
            where[(i, k)] = h
    out = {"nodes": nodes, "heads": [[*entry(h), 0] for h in graph["heads"]]}
    return out, constants


def _place(
    nodes: list[dict[str, Any]],
    host: str,
    inputs: list[list[int]],
    frag: graph_verdicts.NativeGraph,
    constants: dict[str, np.ndarray],
    group: str | None,
) -> list[list[int]]:
    """Append ``frag``'s nodes in place of node ``host``; return its outputs' entries."""
    placed: list[int] = []
    named: dict[str, int] = {}

    def ref(r) -> list[int]:
        if r[0] == "in":
            return inputs[r[1]]
        if r[0] == "const":
            name = f"{host}_{r[1]}"
            if name not in named:
                nodes.append({"op": "null", "name": name, "inputs": []})
                named[name] = len(nodes) - 1
                constants[name] = frag.constants[r[1]]
            return [named[name], 0]
        return [placed[r[1]], r[2]]

    for n in frag.nodes:
        attrs = {k: str(v) for k, v in n["attrs"].items()}
        if group is not None:
            attrs["__ctx_group__"] = group
        new = {
            "op": n["op"],
            "name": f"{host}_{n['name']}",
            "inputs": [[*ref(r), 0] for r in n["inputs"]],
        }
        if attrs:
            new["attrs"] = attrs
        nodes.append(new)
        placed.append(len(nodes) - 1)
    heads = [ref(r) for r in frag.heads]
    if len(heads) == 1:  # the output keeps its name (exe.output_dict, list_outputs)
        nodes[heads[0][0]]["name"] = host
    return heads
