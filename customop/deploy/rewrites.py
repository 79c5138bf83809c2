"""The exported graph's JSON made what a deployer expects: names, shapes, batch sizes.

:func:`customop.export` writes the block's graph with our ops spliced in as MXNet
operators (:mod:`customop.graphs.splice`); the rewrites here then act on that graph's JSON:

* :func:`annotate_constants`: the arrays an op builds (saved as parameters) get
  ``__shape__``/``__dtype__``.  Loaders that infer shapes from the data inputs alone
  (the C predict API's ``MXPredCreate``, ``mx.mod.Module.bind``, ``sym.infer_shape``)
  otherwise fail inside ``topk`` or ``arr_pick`` (measured on MXNet 1.9.1).
* :func:`rename_constants`: their variables are named after the op that built them.
* :func:`rename_inputs` / :func:`name_outputs`: the names a user chose.
* :func:`guard_inputs`: a graph that holds at its exported shapes only gets a shape
  check on each data input, so that every loader fed other shapes refuses them at shape
  inference (naming the op) instead of broadcasting a frozen constant to wrong numbers.
* :func:`customop.deploy.batch_sizes.batch_free` (called by :func:`deployable`): constants
  that depend only on the batch size become operators of the input's shape
  (``_contrib_arange_like``, ``broadcast_like``), so the export runs at other batch sizes.
"""

from __future__ import annotations

from typing import Any

import mxnet as mx
import numpy as np
from mxnet.ndarray.ndarray import _DTYPE_NP_TO_MX

from .. import errors, registry, symbol_json
from . import batch_sizes


def dtype_code(dtype: Any) -> str:
    """MXNet's ``__dtype__`` attribute for a NumPy dtype (``float32`` is ``"0"``)."""
    return str(_DTYPE_NP_TO_MX[np.dtype(dtype).type])


def hosts(graph: dict[str, Any]) -> dict[str, str]:
    """``{Custom node name: the op as its user knows it}`` for our ops in a block's graph."""
    return {
        node["name"]: errors.shown(op_type)
        for _, node, op_type in symbol_json.custom_nodes(graph)
        if registry.lookup(op_type) is not None
    }


def rename_constants(
    graph: dict[str, Any], constants: dict[str, np.ndarray], ops: dict[str, str]
) -> dict[str, np.ndarray]:
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


def _data_inputs(nodes: list[dict[str, Any]], inputs: dict[str, Any]):
    # (index, node, example value, shape) of each variable that is a data input
    for i, node in enumerate(list(nodes)):
        value = inputs.get(node["name"]) if node["op"] == "null" else None
        if value is not None:
            yield i, node, value, tuple(int(d) for d in value.shape)


def _read_through(graph: dict[str, Any], guarded: dict[int, int], readers: list) -> None:
    # ``readers`` and the heads read each guarded input through its guard node
    for node in readers:
        node["inputs"] = [[guarded.get(e[0], e[0]), e[1], 0] for e in node["inputs"]]
    graph["heads"] = [[guarded.get(h[0], h[0]), h[1], 0] for h in graph["heads"]]
    graph.pop("node_row_ptr", None)


def guard_inputs(graph: dict[str, Any], inputs: dict[str, Any], why: str) -> None:
    """Make these data inputs hold at their exported shape only: every loader fed another
    shape then fails shape inference in a node named ``<input>_fixed_at_<shape>_by_<why>``.

    (A ``__shape__`` on the variable is not enough: ``Module.bind``'s shapes override it.)
    Each consumer of the input reads ``_identity_with_attr_like_rhs(input, _zeros(shape))``,
    whose inputs must have one shape.
    """
    nodes = graph["nodes"]
    guarded: dict[int, int] = {}
    for i, node, value, shape in _data_inputs(nodes, inputs):
        text = "x".join(map(str, shape)) or "scalar"
        nodes.append(
            {
                "op": "_zeros",
                "name": f"{node['name']}_exported_shape",
                "inputs": [],
                "attrs": {"shape": str(shape), "dtype": np.dtype(value.dtype).name},
            }
        )
        nodes.append(
            {
                "op": GUARD,
                "name": f"{node['name']}_fixed_at_{text}_by_{why}",
                "inputs": [[i, 0, 0], [len(nodes) - 1, 0, 0]],
            }
        )
        guarded[i] = len(nodes) - 1
    _read_through(graph, guarded, [n for n in nodes if n["op"] != GUARD])


def guard_other_axes(graph: dict[str, Any], inputs: dict[str, Any], batched: list[str]) -> None:
    """Make every data input hold at its exported shape, but for axis 0 of the ``batched``
    ones: a loader fed another shape fails shape inference in a node named
    ``<input>_must_have_shape_<dims>`` (``N`` for a free batch axis).

    The ops' own shape checks ran at the exported shapes only; MXNet's operators would
    broadcast a wrong one silently (``ops.wing_loss`` with a ``(4, 1)`` target for a
    ``(4, 6)`` prediction).  A batched input is compared with zeros of its exported shape
    whose axis 0 is broadcast like the input's (``broadcast_like`` on axis 0), so only its
    other axes are pinned.
    """
    nodes = graph["nodes"]
    first = len(nodes)
    guarded: dict[int, int] = {}
    for i, node, value, shape in _data_inputs(nodes, inputs):
        free = node["name"] in batched and len(shape) > 0
        text = "x".join(["N", *map(str, shape[1:])] if free else map(str, shape)) or "scalar"
        zeros_shape = (1, *shape[1:]) if free else shape
        nodes.append(
            {
                "op": "_zeros",
                "name": f"{node['name']}_exported_shape",
                "inputs": [],
                "attrs": {"shape": str(zeros_shape), "dtype": np.dtype(value.dtype).name},
            }
        )
        like = len(nodes) - 1
        if free:
            nodes.append(
                {
                    "op": "broadcast_like",
                    "name": f"{node['name']}_batch_like",
                    "inputs": [[like, 0, 0], [i, 0, 0]],
                    "attrs": {"lhs_axes": "(0,)", "rhs_axes": "(0,)"},
                }
            )
            like = len(nodes) - 1
        nodes.append(
            {
                "op": GUARD,
                "name": f"{node['name']}_must_have_shape_{text}",
                "inputs": [[i, 0, 0], [like, 0, 0]],
            }
        )
        guarded[i] = len(nodes) - 1
    _read_through(graph, guarded, nodes[:first])  # the graph's own nodes; ours read inputs


def unguarded(graph: dict[str, Any]) -> dict[str, Any]:
    """``graph`` without :func:`guard_inputs`' nodes (for converters that lack them)."""
    nodes = graph["nodes"]
    through = {i: n["inputs"][0][0] for i, n in enumerate(nodes) if n["op"] == GUARD}
    out = dict(
        graph,
        nodes=[
            dict(n, inputs=[[through.get(e[0], e[0]), e[1], 0] for e in n["inputs"]]) for n in nodes
        ],
    )
    out["heads"] = [[through.get(h[0], h[0]), h[1], 0] for h in graph["heads"]]
    out.pop("node_row_ptr", None)
    return symbol_json.toposorted(symbol_json.reachable(out))


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


def run(sym: mx.sym.Symbol, arrays: dict[str, Any]) -> list[np.ndarray]:
    """``sym``'s outputs, run on these arrays (inputs and parameters) by name."""
    return symbol_json.run(
        symbol_json.parse(sym),
        {
            k: (v if isinstance(v, mx.nd.NDArray) else mx.nd.array(v, dtype=v.dtype))
            for k, v in arrays.items()
            if k in set(sym.list_inputs())
        },
    )


def guarded(sym: mx.sym.Symbol, inputs: dict[str, Any], why: str) -> mx.sym.Symbol:
    graph = symbol_json.parse(sym)
    guard_inputs(graph, inputs, why)
    return symbol_json.load(symbol_json.toposorted(graph))


def guarded_other_axes(
    sym: mx.sym.Symbol, inputs: dict[str, Any], batched: list[str]
) -> mx.sym.Symbol:
    graph = symbol_json.parse(sym)
    guard_other_axes(graph, inputs, batched)
    return symbol_json.load(symbol_json.toposorted(graph))


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

    def __init__(
        self,
        symbol: mx.sym.Symbol,
        constants: dict[str, np.ndarray],
        fixed: list[str],
        batched: list[str],
    ):
        self.symbol, self.constants, self.fixed = symbol, constants, fixed
        self.batched = batched


def deployable(
    block_sym: mx.sym.Symbol,
    spliced: Any,
    data: list[str],
    names: list[str],
    inputs: list[Any],
    output_names: Any,
    retrace: Any,
) -> Deployable:
    """The graph :func:`customop.export` writes.

    ``block_sym``: the block's graph; ``spliced``: :func:`customop.graphs.splice.inline`'s
    result for it (or None); ``data``: the block's input names as Gluon calls them,
    ``names``: as the user does; ``inputs``: the example inputs; ``retrace(shapes)``:
    the splice at other data shapes (to see which constants depend on the batch size).
    """
    sym = spliced.symbol if spliced is not None else block_sym
    graph = symbol_json.parse(sym)
    constants = dict(spliced.constants) if spliced is not None else {}
    ops = hosts(symbol_json.parse(block_sym))
    variables = {n["name"] for n in graph["nodes"] if n["op"] == "null"} | set(names)
    if output_names is None:  # Gluon's names (a block's export lists the same)
        output_names = [
            n[: -len("_output")] if n.endswith("_output") else n for n in block_sym.list_outputs()
        ]
        output_names = [f"{n}_copy" if n in variables else n for n in output_names]
    else:
        output_names = [output_names] if isinstance(output_names, str) else list(output_names)
        _check_output_names(graph, output_names, variables)
    fixed: list[str] = []
    batched: list[str] = []
    if spliced is not None and spliced.inlined:
        constants, fixed, batched = batch_sizes.batch_free(
            graph, constants, ops, data, inputs, retrace, rename_constants, len(spliced.kept)
        )
    annotate_constants(graph, constants)
    rename_inputs(graph, dict(zip(data, names)))
    if fixed:
        guard_inputs(graph, dict(zip(names, inputs)), fixed_by(fixed))
    name_outputs(graph, output_names)
    return Deployable(symbol_json.load(symbol_json.toposorted(graph)), constants, fixed, batched)


def _check_output_names(graph: dict[str, Any], chosen: list[str], inputs: set) -> None:
    if len(chosen) != len(graph["heads"]) or not all(isinstance(n, str) and n for n in chosen):
        raise ValueError(
            f"customop.export: output_names must name each of the "
            f"{len(graph['heads'])} output(s) of the block, in order; got "
            f"{chosen!r}"
        )
    if len(set(chosen)) != len(chosen) or set(chosen) & inputs:
        raise ValueError(
            f"customop.export: output_names must differ from each other and "
            f"from the names of inputs and parameters; got {chosen!r}"
        )
