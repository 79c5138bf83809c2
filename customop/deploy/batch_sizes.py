"""An export at other batch sizes: constants that depend only on the batch become operators.

:func:`batch_free` traces the ops again with the batched inputs ``EXTRA`` rows
longer and compares the constants they build: one equal at both sizes stays a
parameter; one whose rows follow the batch (row offsets, a value repeated per
image) becomes ``_contrib_arange_like``/``broadcast_like`` of the input; a
``Reshape`` that differs by the batch factor gets ``-1`` on that axis; any other
constant is named as fixing the export's shapes (``done.fixed``).
"""

from __future__ import annotations

import ast
from typing import Any

import numpy as np

from .. import symbol_json

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
    return [
        np.take(a.asnumpy(), rows, axis=0) if n in batched else a.asnumpy()
        for n, a in zip(data, inputs)
    ]


def batch_free(graph, constants, ops, data, inputs, retrace, rename, kept_before=0):
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
        shapes = {
            n: ((batch + EXTRA,) + tuple(a.shape[1:]) if n in batched else tuple(a.shape))
            for n, a in zip(data, inputs)
        }
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
    fixed = _differing(
        graph,
        symbol_json.parse(again.symbol) if again is not None else None,
        ops,
        batch,
        batch + EXTRA if batch else None,
    )
    renamed = rename(graph, constants, ops)
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
            fixed.append(
                f"customop {ops.get(host, '?')!r} (node {host!r}) builds an array of "
                f"shape {tuple(value.shape)} from the input shapes, saved as "
                f"parameter {new!r}"
            )
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
        why = (
            "the graph could not be traced at another batch size"
            if other is None or longer is None
            else f"its graph has other operators at batch size {longer}"
        )
        return [
            f"customop {op!r} (node {host!r}): {why}"
            for host, op in ops.items()
            if not any(n["name"] == host for n in graph["nodes"] if n["op"] == "Custom")
        ]
    found: dict[str, str] = {}
    for a, b in zip(graph["nodes"], other["nodes"]):
        if a["op"] == b["op"] == "null":
            continue
        if a["op"] == b["op"] == "Reshape" and _batch_reshape(a, b, batch, longer):
            continue
        if a["op"] != b["op"] or _plain(symbol_json.attrs(a)) != _plain(symbol_json.attrs(b)):
            host = max(
                (h for h in ops if a["name"] == h or a["name"].startswith(h + "_")),
                key=len,
                default=None,
            )
            if host is not None and host not in found:
                found[host] = (
                    f"customop {ops[host]!r} (node {host!r}): its operator "
                    f"{a['op']} has {_plain(symbol_json.attrs(a))} here and "
                    f"{_plain(symbol_json.attrs(b))} at batch size {longer}"
                )
    return list(found.values())


def _batch_reshape(a, b, batch, longer) -> bool:
    """Relax ``Reshape`` node ``a`` to any batch size when ``b`` (at batch ``longer``) says
    how; False when it cannot be."""
    attrs, other = symbol_json.attrs(a), symbol_json.attrs(b)
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
    if (
        len(axes) != 1
        or mine[axes[0]] % batch
        or theirs[axes[0]] % longer
        or (mine[axes[0]] // batch != theirs[axes[0]] // longer)
    ):
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
        b, np.broadcast_to(base, b.shape).copy()
    ):
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
    nodes = [
        {
            "op": "_contrib_arange_like",
            "name": f"{name}_index",
            "attrs": {"axis": "0"},
            "inputs": [["like", 0]],
        },
        {
            "op": "Reshape",
            "name": f"{name}_rows",
            "attrs": {"shape": str((-1,) + ones)},
            "inputs": [[-1, 0]],
        },
        {"op": "Cast", "name": f"{name}_cast", "attrs": {"dtype": dtype}, "inputs": [[-1, 0]]},
    ]
    kept[f"{name}_base"] = base
    nodes.append({"op": "null", "name": f"{name}_base", "inputs": []})
    if step is None:
        nodes.append({"op": "zeros_like", "name": f"{name}_zeros", "inputs": [[-2, 0]]})
        nodes.append(
            {"op": "broadcast_add", "name": f"{name}_rows_of", "inputs": [[-1, 0], [-2, 0]]}
        )
    else:
        kept[f"{name}_step"] = step
        nodes.append({"op": "null", "name": f"{name}_step", "inputs": []})
        nodes.append({"op": "broadcast_mul", "name": f"{name}_times", "inputs": [[-3, 0], [-1, 0]]})
        nodes.append(
            {"op": "broadcast_add", "name": f"{name}_rows_of", "inputs": [[-1, 0], [-3, 0]]}
        )
    nodes.append(
        {"op": "Reshape", "name": name, "attrs": {"shape": str((-1,) + rest)}, "inputs": [[-1, 0]]}
    )
    for n in nodes:
        n["like"] = like
    return nodes


def _substitute(graph, replace):
    """Put each list of nodes in ``replace`` in place of the variable node it is keyed by.

    Inside a list, an input ``[-j, o]`` is the j-th node before it in the list and
    ``["like", o]`` the node ``n["like"]`` of the old graph; the last node stands for the
    old one.  Node order is fixed afterwards by :func:`customop.symbol_json.toposorted`.
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
            refs.append(
                [
                    ("old", like, e[1]) if e[0] == "like" else ("new", start + j + e[0], e[1])
                    for e in n["inputs"]
                ]
            )
            nodes.append(n)
        moved[i] = len(nodes) - 1
    for node, node_refs in zip(nodes, refs):
        node["inputs"] = [[moved[r[1]] if r[0] == "old" else r[1], r[2], 0] for r in node_refs]
    graph["nodes"] = nodes
    graph["heads"] = [[moved[h[0]], h[1], 0] for h in graph["heads"]]
    graph.pop("node_row_ptr", None)
