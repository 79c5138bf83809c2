"""The exported graph's JSON made what a deployer expects: names, shapes, batch sizes.

:func:`customop.export` writes the block's graph with our ops spliced in as MXNet
operators (:mod:`customop.splice`); the rewrites here then act on that graph's JSON:

* :func:`annotate_constants`: the arrays an op builds (saved as parameters) get
  ``__shape__``/``__dtype__``.  Loaders that infer shapes from the data inputs alone
  (the C predict API's ``MXPredCreate``, ``mx.mod.Module.bind``, ``sym.infer_shape``)
  otherwise fail inside ``topk`` or ``arr_pick`` (measured on MXNet 1.9.1).
* :func:`rename_constants`: their variables are named after the op that built them.
* :func:`rename_inputs` / :func:`name_outputs`: the names a user chose.
* :func:`guard_inputs`: a graph that holds at its exported shapes only gets a shape
  check on each data input, so that every loader fed other shapes refuses them at shape
  inference (naming the op) instead of broadcasting a frozen constant to wrong numbers.
* :func:`batch_free`: constants that depend only on the batch size become operators of
  the input's shape (``_contrib_arange_like``, ``broadcast_like``), so the export runs
  at other batch sizes.
"""
from __future__ import annotations

import ast
from typing import Any

import mxnet as mx
import numpy as np
from mxnet.ndarray.ndarray import _DTYPE_NP_TO_MX

from . import errors, graph_json, registry


def dtype_code(dtype: Any) -> str:
    """MXNet's ``__dtype__`` attribute for a NumPy dtype (``float32`` is ``"0"``)."""
    return str(_DTYPE_NP_TO_MX[np.dtype(dtype).type])


def hosts(graph: dict[str, Any]) -> dict[str, str]:
    """``{Custom node name: the op as its user knows it}`` for our ops in a block's graph."""
    return {node["name"]: errors.shown(op_type)
            for _, node, op_type in graph_json.custom_nodes(graph)
            if registry.lookup(op_type) is not None}


def rename_constants(graph: dict[str, Any], constants: dict[str, np.ndarray],
                     ops: dict[str, str]) -> dict[str, np.ndarray]:
    """Name each constant ``<custom node>_<op>_constant<k>``; return the renamed dict.

    ``ops``: :func:`hosts` of the graph before splicing (a constant's name starts
    with the name of the ``Custom`` node it replaced).
    """
    renamed: dict[str, str] = {}
    count: dict[str, int] = {}
    for name in constants:
        host = max((h for h in ops if name.startswith(h + "_")), key=len, default=None)
        if host is None:
            renamed[name] = name
            continue
        k = count[host] = count.get(host, -1) + 1
        renamed[name] = f"{host}_{ops[host].rsplit('.', 1)[-1]}_constant{k}"
    for node in graph["nodes"]:
        if node.get("op") == "null" and node["name"] in renamed:
            node["name"] = renamed[node["name"]]
    return {renamed[k]: v for k, v in constants.items()}


def annotate_constants(graph: dict[str, Any], constants: dict[str, np.ndarray]) -> None:
    """Give each constant's variable its ``__shape__`` and ``__dtype__``."""
    for node in graph["nodes"]:
        value = constants.get(node["name"]) if node.get("op") == "null" else None
        if value is not None:
            attrs = node.setdefault("attrs", {})
            attrs["__shape__"] = str(tuple(int(d) for d in value.shape))
            attrs["__dtype__"] = dtype_code(value.dtype)


def rename_inputs(graph: dict[str, Any], names: dict[str, str]) -> None:
    """Rename variables: ``names`` maps old to new."""
    for node in graph["nodes"]:
        if node.get("op") == "null" and node["name"] in names:
            node["name"] = names[node["name"]]


GUARD = "_identity_with_attr_like_rhs"  # its output is its first input; both of one shape


def guard_inputs(graph: dict[str, Any], inputs: dict[str, Any], why: str) -> None:
    """Make these data inputs hold at their exported shape only: every loader fed another
    shape then fails shape inference in a node named ``<input>_fixed_at_<shape>_by_<why>``.

    (A ``__shape__`` on the variable is not enough: ``Module.bind``'s shapes override it.)
    Each consumer of the input reads ``_identity_with_attr_like_rhs(input, _zeros(shape))``,
    whose inputs must have one shape.
    """
    nodes = graph["nodes"]
    guarded: dict[int, int] = {}
    for i, node in enumerate(list(nodes)):
        value = inputs.get(node["name"]) if node["op"] == "null" else None
        if value is None:
            continue
        shape = tuple(int(d) for d in value.shape)
        text = "x".join(map(str, shape)) or "scalar"
        nodes.append({"op": "_zeros", "name": f"{node['name']}_exported_shape", "inputs": [],
                      "attrs": {"shape": str(shape),
                                "dtype": np.dtype(value.dtype).name}})
        nodes.append({"op": GUARD, "name": f"{node['name']}_fixed_at_{text}_by_{why}",
                      "inputs": [[i, 0, 0], [len(nodes) - 1, 0, 0]]})
        guarded[i] = len(nodes) - 1
    for node in nodes:
        if node["op"] != GUARD:
            node["inputs"] = [[guarded.get(e[0], e[0]), e[1], 0] for e in node["inputs"]]
    graph["heads"] = [[guarded.get(h[0], h[0]), h[1], 0] for h in graph["heads"]]
    graph.pop("node_row_ptr", None)


def unguarded(graph: dict[str, Any]) -> dict[str, Any]:
    """``graph`` without :func:`guard_inputs`' nodes (for converters that lack them)."""
    nodes = graph["nodes"]
    through = {i: n["inputs"][0][0] for i, n in enumerate(nodes) if n["op"] == GUARD}
    out = dict(graph, nodes=[dict(n, inputs=[[through.get(e[0], e[0]), e[1], 0]
                                             for e in n["inputs"]]) for n in nodes])
    out["heads"] = [[through.get(h[0], h[0]), h[1], 0] for h in graph["heads"]]
    out.pop("node_row_ptr", None)
    return graph_json.toposorted(graph_json.reachable(out))


def name_outputs(graph: dict[str, Any], names: list[str]) -> None:
    """Make output ``k`` a ``_copy`` node named ``names[k]`` (MXNet lists ``<name>_output``).

    Always a node of its own: MXNet's ONNX converter finds a graph output only by the
    name of the ONNX node it writes last for it, which for some operators (``box_nms``)
    is another name.  An operator node already called so is renamed ``<name>_value``.
    """
    nodes, heads = graph["nodes"], graph["heads"]
    if len(names) != len(heads):
        raise ValueError(f"{len(names)} output name(s) for {len(heads)} output(s)")
    taken = {n["name"]: n for n in nodes}
    for name in names:
        if name in taken:
            taken[name]["name"] = f"{name}_value"
    for k, (head, name) in enumerate(zip(list(heads), names)):
        nodes.append({"op": "_copy", "name": name, "inputs": [[head[0], head[1], 0]]})
        heads[k] = [len(nodes) - 1, 0, 0]
    graph.pop("node_row_ptr", None)  # recomputed by MXNet on load


EXTRA = 3  # rows added to the batch to see what depends on it


def batch_candidates(data: list[str], inputs: list[Any]) -> list[list[str]]:
    """Which inputs may carry the batch on axis 0, most likely first: every input as long
    there as the first one, then the first one alone."""
    first = inputs[0]
    if not first.ndim:
        return []
    same = [n for n, a in zip(data, inputs) if a.ndim and a.shape[0] == first.shape[0]]
    return [same] if len(same) == 1 else [same, same[:1]]


def longer_batch(data: list[str], inputs: list[Any], batched: list[str]) -> list[np.ndarray]:
    """The example inputs with ``EXTRA`` more rows in the ``batched`` ones (rows repeated)."""
    batch = inputs[data.index(batched[0])].shape[0]
    rows = np.arange(batch + EXTRA) % batch
    return [np.take(a.asnumpy(), rows, axis=0) if n in batched else a.asnumpy()
            for n, a in zip(data, inputs)]


def run(sym: mx.sym.Symbol, arrays: dict[str, Any]) -> list[np.ndarray]:
    """``sym``'s outputs, run on these arrays (inputs and parameters) by name."""
    return graph_json.run(graph_json.parse(sym), {
        k: (v if isinstance(v, mx.nd.NDArray) else mx.nd.array(v, dtype=v.dtype))
        for k, v in arrays.items() if k in set(sym.list_inputs())})


def guarded(sym: mx.sym.Symbol, inputs: dict[str, Any], why: str) -> mx.sym.Symbol:
    graph = graph_json.parse(sym)
    guard_inputs(graph, inputs, why)
    return graph_json.load(graph_json.toposorted(graph))


def fixed_by(fixed: list[str]) -> str:
    """The ops named in ``fixed`` (``"customop 'ops.topk' ..."``), for a node name."""
    found = []
    for line in fixed:
        if line.startswith("customop '"):
            op = line.split("'")[1].rsplit(".", 1)[-1]
            if op not in found:
                found.append(op)
    return "_".join(found) or "the_export"


# ---- the export's graph, put together -----------------------------------------------------------
class Deployable:
    """The exported graph, the constants it saves as parameters, why it holds at fixed
    input shapes only (``fixed``, [] when it runs at other batch sizes), and the inputs
    whose axis 0 was taken for the batch (``batched``, Gluon's names)."""

    def __init__(self, symbol: mx.sym.Symbol, constants: dict[str, np.ndarray],
                 fixed: list[str], batched: list[str]):
        self.symbol, self.constants, self.fixed = symbol, constants, fixed
        self.batched = batched


def deployable(block_sym: mx.sym.Symbol, spliced: Any, data: list[str], names: list[str],
               inputs: list[Any], output_names: Any, retrace: Any) -> Deployable:
    """The graph :func:`customop.export` writes.

    ``block_sym``: the block's graph; ``spliced``: :func:`customop.splice.inline`'s
    result for it (or None); ``data``: the block's input names as Gluon calls them,
    ``names``: as the user does; ``inputs``: the example inputs; ``retrace(shapes)``:
    the splice at other data shapes (to see which constants depend on the batch size).
    """
    sym = spliced.symbol if spliced is not None else block_sym
    graph = graph_json.parse(sym)
    constants = dict(spliced.constants) if spliced is not None else {}
    ops = hosts(graph_json.parse(block_sym))
    variables = {n["name"] for n in graph["nodes"] if n["op"] == "null"} | set(names)
    if output_names is None:  # Gluon's names (a block's export lists the same)
        output_names = [n[:-len("_output")] if n.endswith("_output") else n
                        for n in block_sym.list_outputs()]
        output_names = [f"{n}_copy" if n in variables else n for n in output_names]
    else:
        output_names = [output_names] if isinstance(output_names, str) else list(output_names)
        _check_output_names(graph, output_names, variables)
    fixed: list[str] = []
    batched: list[str] = []
    if spliced is not None and spliced.inlined:
        constants, fixed, batched = _batch_free(graph, constants, ops, data, inputs, retrace,
                                                len(spliced.kept))
    annotate_constants(graph, constants)
    rename_inputs(graph, dict(zip(data, names)))
    if fixed:
        guard_inputs(graph, dict(zip(names, inputs)), fixed_by(fixed))
    name_outputs(graph, output_names)
    return Deployable(graph_json.load(graph_json.toposorted(graph)), constants, fixed, batched)


def _check_output_names(graph: dict[str, Any], chosen: list[str], inputs: set) -> None:
    if len(chosen) != len(graph["heads"]) or not all(isinstance(n, str) and n for n in chosen):
        raise ValueError(f"customop.export: output_names must name each of the "
                         f"{len(graph['heads'])} output(s) of the block, in order; got "
                         f"{chosen!r}")
    if len(set(chosen)) != len(chosen) or set(chosen) & inputs:
        raise ValueError(f"customop.export: output_names must differ from each other and "
                         f"from the names of inputs and parameters; got {chosen!r}")


def _batch_free(graph, constants, ops, data, inputs, retrace, kept_before=0):
    """Constants that depend on the batch size only, as operators of the input's shape.

    The splice is done again with the batched inputs (axis 0 as long as the first
    input's) three rows longer.  A constant equal in both stays a parameter; one whose
    rows are ``base + i * step`` in both (row offsets) or all equal (a value broadcast
    to the batch) becomes ``_contrib_arange_like`` of that input; any other is named in
    the returned ``fixed`` list.
    """
    first = inputs[0]
    batch = first.shape[0] if first.ndim else None
    other = again = None
    batched: list[str] = []
    for batched in batch_candidates(data, inputs):
        shapes = {n: ((batch + EXTRA,) + tuple(a.shape[1:]) if n in batched
                      else tuple(a.shape)) for n, a in zip(data, inputs)}
        try:
            again = retrace(shapes)
        except Exception:  # noqa: BLE001 - the ops refuse these shapes: the next guess
            again = None
        if again is not None and len(again.kept) <= kept_before:
            other = dict(again.constants)
            break
        again = None
    else:
        batched = []
    paired = _pair(constants, other, ops)
    kept: dict[str, np.ndarray] = {}
    fixed = _differing(graph, graph_json.parse(again.symbol) if again is not None else None,
                       ops, batch, batch + EXTRA if batch else None)
    renamed = rename_constants(graph, constants, ops)
    new_names = dict(zip(constants, renamed))
    index = {n["name"]: i for i, n in enumerate(graph["nodes"])}
    replace: dict[int, list[dict[str, Any]]] = {}
    for name, value in constants.items():
        new = new_names[name]
        twin = paired.get(name)
        if twin is not None and _same(value, twin):
            kept[new] = value
            continue
        rows = _rows(value, twin, batch, batch + EXTRA) if twin is not None else None
        like = next((index[n] for n in batched if n in index), None)
        if rows is None or like is None:
            kept[new] = value
            host = max((h for h in ops if name.startswith(h + "_")), key=len, default=name)
            fixed.append(f"customop {ops.get(host, '?')!r} (node {host!r}) builds an array of "
                         f"shape {tuple(value.shape)} from the input shapes, saved as "
                         f"parameter {new!r}")
            continue
        k, base, step = rows
        replace[index[new]] = _batch_nodes(new, like, k, value, base, step, kept)
    if replace:
        _substitute(graph, replace)
    return kept, fixed, batched


def _differing(graph, other, ops, batch, longer) -> list[str]:
    """The ops whose operators differ in the splice at batch size ``longer``: the graph
    holds at its exported shapes only.

    A ``Reshape`` whose shape differs in one axis only, by the batch size's factor (the
    recorded ``x.reshape((-1,))`` of a batch), is written with ``-1`` there instead: it
    then holds at every batch size.
    """
    if longer is None or other is None or len(other["nodes"]) != len(graph["nodes"]):
        why = ("the graph could not be traced at another batch size" if other is None or
               longer is None else f"its graph has other operators at batch size {longer}")
        return [f"customop {op!r} (node {host!r}): {why}" for host, op in ops.items()
                if not any(n["name"] == host for n in graph["nodes"] if n["op"] == "Custom")]
    found: dict[str, str] = {}
    for a, b in zip(graph["nodes"], other["nodes"]):
        if a["op"] == b["op"] == "null":
            continue
        if a["op"] == b["op"] == "Reshape" and _batch_reshape(a, b, batch, longer):
            continue
        if a["op"] != b["op"] or _plain(graph_json.attrs(a)) != _plain(graph_json.attrs(b)):
            host = max((h for h in ops if a["name"] == h or a["name"].startswith(h + "_")),
                       key=len, default=None)
            if host is not None and host not in found:
                found[host] = (f"customop {ops[host]!r} (node {host!r}): its operator "
                               f"{a['op']} has {_plain(graph_json.attrs(a))} here and "
                               f"{_plain(graph_json.attrs(b))} at batch size {longer}")
    return list(found.values())


def _batch_reshape(a, b, batch, longer) -> bool:
    """Relax ``Reshape`` node ``a`` to any batch size when ``b`` (at batch ``longer``) says
    how; False when it cannot be."""
    attrs, other = graph_json.attrs(a), graph_json.attrs(b)
    if set(attrs) != set(other) or _plain(attrs).keys() != {"shape"}:
        return False
    try:
        mine = list(ast.literal_eval(attrs["shape"]))
        theirs = list(ast.literal_eval(other["shape"]))
    except (ValueError, TypeError, SyntaxError):
        mine = theirs = None
    if not isinstance(mine, list) or not isinstance(theirs, list) or len(mine) != len(theirs):
        return False
    if any(d < 0 for d in mine):  # -1, or -2/-3/-4: MXNet's special values; not ours to move
        return False
    axes = [i for i, (m, t) in enumerate(zip(mine, theirs)) if m != t]
    if len(axes) != 1 or mine[axes[0]] % batch or theirs[axes[0]] % longer or (
            mine[axes[0]] // batch != theirs[axes[0]] // longer):
        return False
    mine[axes[0]] = -1
    a["attrs"]["shape"] = str(tuple(mine))
    return True


def _plain(attrs: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in attrs.items() if not k.startswith("__")}


def _pair(constants, other, ops):
    """``{constant: its twin in the other splice}``, matched by op node and order."""
    if other is None:
        return {}
    def by_host(found):
        groups: dict[str, list[str]] = {}
        for name in found:
            host = max((h for h in ops if name.startswith(h + "_")), key=len, default="")
            groups.setdefault(host, []).append(name)
        return groups
    mine, theirs = by_host(constants), by_host(other)
    paired = {}
    for host, names in mine.items():
        twins = theirs.get(host, [])
        if host and len(twins) == len(names):
            for a, b in zip(names, twins):
                if constants[a].dtype == other[b].dtype:
                    paired[a] = other[b]
    return paired


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if np.issubdtype(a.dtype, np.floating):
        return bool(np.array_equal(a, b, equal_nan=True))
    return bool(np.array_equal(a, b))


def _rows(value, twin, batch, longer):
    """``(k, base, step)`` when both arrays are ``k`` rows per batch entry, row ``i`` of
    ``(batch, k, ...)`` being ``base + i * step`` (``step`` None: ``base`` for every i)."""
    if not value.ndim or value.shape[1:] != twin.shape[1:] or value.shape[0] % batch:
        return None
    k = value.shape[0] // batch
    if twin.shape[0] != k * longer:
        return None
    rest = value.shape[1:]
    a, b = value.reshape((batch, k) + rest), twin.reshape((longer, k) + rest)
    base = b[:1]
    if _same(a, np.broadcast_to(base, a.shape).copy()) and _same(
            b, np.broadcast_to(base, b.shape).copy()):
        return k, base, None
    if not (np.all(np.isfinite(b)) if np.issubdtype(b.dtype, np.floating) else True):
        return None
    step = (b[1:2] - b[:1]).astype(b.dtype)
    for got, n in ((a, batch), (b, longer)):
        i = np.arange(n).astype(b.dtype).reshape((n,) + (1,) * (b.ndim - 1))
        if not _same(got, (i * step + base).astype(b.dtype)):
            return None
    return k, base, step


def _batch_nodes(name, like, k, value, base, step, kept):
    """Nodes computing ``value``'s batch rows from input node ``like``; the last is it."""
    rest = tuple(value.shape[1:])
    ones = (1,) * (1 + len(rest))
    dtype = np.dtype(value.dtype).name
    nodes = [{"op": "_contrib_arange_like", "name": f"{name}_index",
              "attrs": {"axis": "0"}, "inputs": [["like", 0]]},
             {"op": "Reshape", "name": f"{name}_rows", "attrs": {"shape": str((-1,) + ones)},
              "inputs": [[-1, 0]]},
             {"op": "Cast", "name": f"{name}_cast", "attrs": {"dtype": dtype},
              "inputs": [[-1, 0]]}]
    kept[f"{name}_base"] = base
    nodes.append({"op": "null", "name": f"{name}_base", "inputs": []})
    if step is None:
        nodes.append({"op": "zeros_like", "name": f"{name}_zeros", "inputs": [[-2, 0]]})
        nodes.append({"op": "broadcast_add", "name": f"{name}_rows_of", "inputs": [[-1, 0],
                                                                                  [-2, 0]]})
    else:
        kept[f"{name}_step"] = step
        nodes.append({"op": "null", "name": f"{name}_step", "inputs": []})
        nodes.append({"op": "broadcast_mul", "name": f"{name}_times", "inputs": [[-3, 0],
                                                                                [-1, 0]]})
        nodes.append({"op": "broadcast_add", "name": f"{name}_rows_of", "inputs": [[-1, 0],
                                                                                  [-3, 0]]})
    nodes.append({"op": "Reshape", "name": name, "attrs": {"shape": str((-1,) + rest)},
                  "inputs": [[-1, 0]]})
    for n in nodes:
        n["like"] = like
    return nodes


def _substitute(graph, replace):
    """Put each list of nodes in ``replace`` in place of the variable node it is keyed by.

    Inside a list, an input ``[-j, o]`` is the j-th node before it in the list and
    ``["like", o]`` the node ``n["like"]`` of the old graph; the last node stands for the
    old one.  Node order is fixed afterwards by :func:`customop.graph_json.toposorted`.
    """
    old = graph["nodes"]
    nodes: list[dict[str, Any]] = []
    refs: list[list[tuple]] = []  # per new node: ("old", index, output) or ("new", pos, output)
    moved: dict[int, int] = {}
    for i, node in enumerate(old):
        group = replace.get(i)
        if group is None:
            refs.append([("old", e[0], e[1]) for e in node["inputs"]])
            moved[i] = len(nodes)
            nodes.append(node)
            continue
        start = len(nodes)
        for j, n in enumerate(group):
            like = n.pop("like")
            refs.append([("old", like, e[1]) if e[0] == "like" else ("new", start + j + e[0], e[1])
                         for e in n["inputs"]])
            nodes.append(n)
        moved[i] = len(nodes) - 1
    for node, node_refs in zip(nodes, refs):
        node["inputs"] = [[moved[r[1]] if r[0] == "old" else r[1], r[2], 0] for r in node_refs]
    graph["nodes"] = nodes
    graph["heads"] = [[moved[h[0]], h[1], 0] for h in graph["heads"]]
    graph.pop("node_row_ptr", None)
