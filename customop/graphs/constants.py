"""Constant arrays a traced forward builds: folded once, and written as graph nodes.

A recorded forward reads arrays it did not receive (``mx.nd.ones``, ``arange``,
values computed from constants).  :func:`folded` evaluates what is constant once;
:func:`expressed` writes a constant as MXNet operators when it has a form a graph
can hold without a parameter (uniform, an arithmetic run broadcast along axes, or
up to ``SMALL`` elements written out).  A new form is one more branch of
:func:`expressed` and a test.
"""

from __future__ import annotations

from typing import Any

import mxnet as mx
import numpy as np

from .. import symbol_json

SMALL = 64  # elements: a constant up to this size may be written out node by node


def add_node(nodes: list, op: str, attrs: dict, inputs: list) -> tuple:
    """Append a node of ``op`` to a native graph's ``nodes``; its first output's reference."""
    nodes.append(
        {"op": op, "name": f"{op.strip('_').lower()}{len(nodes)}", "attrs": attrs, "inputs": inputs}
    )
    return ("node", len(nodes) - 1, 0)


def folded(nodes, slot, free, heads) -> tuple[list[bool], dict[tuple[int, int], np.ndarray]]:
    """Values of the constant entries that non-constant nodes (or outputs) read.

    An entry is constant when its node is a free variable, or an operator all of
    whose inputs are constant; the latter are evaluated here, once.
    """
    const = [False] * len(nodes)
    for j, n in enumerate(nodes):
        if j in slot:
            continue
        const[j] = j in free or (
            n["op"] != "null" and bool(n["inputs"]) and all(const[e[0]] for e in n["inputs"])
        )
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
                graph["nodes"].append(
                    {
                        "op": n["op"],
                        "name": f"n{j}",
                        "attrs": n["attrs"],
                        "inputs": [[index[e[0]], e[1], 0] for e in n["inputs"]],
                    }
                )
        graph["heads"] = [[index[j], k, 0] for j, k in computed]
        args = {f"n{j}": mx.nd.array(free[j], dtype=free[j].dtype) for j in free if const[j]}
        for e, out in zip(computed, symbol_json.run(graph, args)):
            values[e] = out
    return const, values


def expressed(value: np.ndarray, nodes: list, shapes) -> tuple | None:
    """Nodes that build ``value`` inside the graph (appended to ``nodes``), or None."""
    dtype = np.dtype(value.dtype).name
    flat = value.reshape(-1)
    if flat.size == 0:
        return None
    if same(flat, np.full_like(flat, flat[0])):
        u = number_attr(flat[0])
        like = next((i for i, s in enumerate(shapes) if tuple(s) == value.shape), None)
        if like is not None and value.ndim:
            ones = (1,) * value.ndim
            full = add_node(nodes, "_full", {"shape": str(ones), "value": u, "dtype": dtype}, [])
            return add_node(nodes, "broadcast_like", {}, [full, ("in", like)])
        return add_node(
            nodes, "_full", {"shape": str(value.shape or (1,)), "value": u, "dtype": dtype}, []
        )
    core = value
    for axis in range(value.ndim):  # drop the axes it is constant along
        first = np.take(core, [0], axis=axis)
        if core.shape[axis] > 1 and same(core, np.broadcast_to(first, core.shape)):
            core = first
    line = core.reshape(-1)
    steps = np.diff(line.astype(np.float64))
    if line.size > 1 and np.all(steps == steps[0]) and steps[0] != 0:
        start, step = float(line[0]), float(steps[0])
        node = add_node(
            nodes,
            "_arange",
            {
                "start": number_attr(start),
                "stop": number_attr(start + step * line.size),
                "step": number_attr(step),
                "repeat": "1",
                "dtype": dtype,
            },
            [],
        )
    elif line.size <= SMALL:
        parts = [
            add_node(nodes, "_full", {"shape": "(1,)", "value": number_attr(v), "dtype": dtype}, [])
            for v in line
        ]
        node = (
            parts[0]
            if len(parts) == 1
            else add_node(nodes, "Concat", {"dim": "0", "num_args": str(len(parts))}, parts)
        )
    else:
        return None
    node = add_node(nodes, "Reshape", {"shape": str(core.shape)}, [node])
    if core.shape != value.shape:
        node = add_node(nodes, "broadcast_to", {"shape": str(value.shape)}, [node])
    return node


def number_attr(v: Any) -> str:
    """A number as an operator attribute (MXNet parses it: exact, and nan/inf spelled out)."""
    v = float(v)
    return repr(v) if np.isfinite(v) else ("nan" if np.isnan(v) else ("inf" if v > 0 else "-inf"))


def same(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two arrays are equal in shape, dtype and value (NaN equal to NaN)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if np.issubdtype(a.dtype, np.floating):
        return bool(np.array_equal(a, b, equal_nan=True))
    return bool(np.array_equal(a, b))
