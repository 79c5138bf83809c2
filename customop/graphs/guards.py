"""Index safety in native graphs: MXNet kernels that read at computed indices get them made safe.

A forward run in Python can check an index before it reaches MXNet (with
:func:`customop.require`); a native graph cannot stop, so the kernels below get
their indices made safe first, and an index outside the array makes every
floating output of that operator NaN (never an out-of-bounds read, never a
plausible number):

* ``_contrib_box_encode`` reads ``refs[matches]`` of each positive sample with no
  bound check (measured: out-of-range ``matches`` gave values that changed from
  run to run; on a GPU, an illegal memory access).  Its ``matches`` are clipped
  into ``[0, M)`` and its outputs poisoned when a positive sample's match was not.
* ``pick`` and ``take`` in their default ``mode='clip'`` read the nearest row for
  an index outside the axis: a number that looks right.  Their outputs are
  poisoned when an index is outside ``[0, length)`` (``mode='wrap'`` and
  ``'raise'`` are left alone: wrapping is their meaning, raising is not silent).

The rules are one table keyed by MXNet operator, ``customop.graphs.rules.INDEX_GUARDS``:
a rule gets the node, a way to add nodes and the traced dtypes of its outputs and
index input, and returns the entries that stand for the node's outputs (None:
the node stays as it is).  The formulas use operators MXNet's ONNX converter knows
(``shape_array``, ``slice_axis``, ``_contrib_arange_like``, comparisons without
``>=``/``!=``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable  # noqa: UP035 - Callable[...] evaluated at run time (3.8)

import numpy as np

Ref = (
    tuple  # ("in", i) | ("const", name) | ("node", k, output), as in customop.graphs.graph_verdicts
)
Add = Callable[[str, dict, list], Ref]  # adds one node (op, attrs, inputs) -> its entry


def _length(add: Add, of: Ref, axis: int) -> Ref:
    # The length of axis ``axis`` of ``of``, as a 1-element float64 array.
    shape = add("shape_array", {}, [of])
    end = "None" if axis == -1 else str(axis + 1)
    dim = add("slice_axis", {"axis": "0", "begin": str(axis), "end": end}, [shape])
    return add("Cast", {"dtype": "float64"}, [dim])


def _outside(add: Add, index: Ref, length: Ref) -> Ref:
    # 1.0 where index < 0 or index >= length (float64, index's shape)
    idx = add("Cast", {"dtype": "float64"}, [index])
    low = add("_lesser_scalar", {"scalar": "0.0"}, [idx])
    inside = add("broadcast_lesser", {}, [idx, length])
    high = add("_rminus_scalar", {"scalar": "1.0"}, [inside])
    return add("elemwise_add", {}, [low, high])


def _poisoned(add: Add, outputs: list[Ref], dtypes: list[Any], bad: Ref) -> list[Ref]:
    """``outputs`` times ``ok / ok`` (1, or 0 / 0 = NaN when any element of ``bad`` is set)."""
    anything = add("max", {}, [bad])
    ok = add("_rminus_scalar", {"scalar": "1.0"}, [add("Reshape", {"shape": "(1,)"}, [anything])])
    ok = add("BlockGrad", {}, [ok])
    nan_or_one = add("broadcast_div", {}, [ok, ok])
    out = []
    for ref, dtype in zip(outputs, dtypes):
        if dtype is None or not np.issubdtype(np.dtype(dtype), np.floating):
            out.append(ref)
            continue
        factor = add("Cast", {"dtype": np.dtype(dtype).name}, [nan_or_one])
        out.append(add("broadcast_mul", {}, [ref, factor]))
    return out


def _axis(attrs: dict, default: str) -> int | None:
    text = str(attrs.get("axis", default))
    return None if text in ("None", "") else int(text)


def along(default_axis: str) -> Callable[[dict, Add, list[Any]], list[Ref] | None]:
    """The guard of a kernel that reads ``data`` at ``index`` along ``axis`` (``mode='clip'``,
    which clips an index out of range to the last row instead of failing): the kernel's
    outputs are NaN where an index is outside ``[0, length)``.  ``take`` reads along axis 0
    by default, ``pick`` along -1."""

    def guard(node: dict, add: Add, dtypes: list[Any]) -> list[Ref] | None:
        attrs = node["attrs"]
        axis = _axis(attrs, default_axis)
        if attrs.get("mode", "clip") != "clip" or axis is None:
            return None
        data, index = node["inputs"][:2]
        bad = _outside(add, index, _length(add, data, axis))
        return _poisoned(add, [add(node["op"], attrs, node["inputs"])], dtypes, bad)

    return guard


def _clipped(of: Callable[[Ref], Any], index: Ref, data: Ref, axis: int) -> bool:
    # Whether ``index`` is broadcast_minimum(maximum(i, 0), max(arange_like(data, axis))), the
    # last index of data's axis, as a forward that makes its own indices safe writes it
    # (ops.box_encode): nothing to guard.
    node = of(_unblocked(of, index))
    if node is None or node["op"] != "broadcast_minimum":
        return False
    low, high = (of(_cast_away(of, r)) for r in node["inputs"])
    if low is None or high is None or (low["op"], high["op"]) != ("_maximum_scalar", "max"):
        return False
    if float(low["attrs"].get("scalar", "nan")) != 0 or high["attrs"]:
        return False
    count = of(_cast_away(of, high["inputs"][0]))
    return (
        count is not None
        and count["op"] == "_contrib_arange_like"
        and {k: str(v) for k, v in count["attrs"].items()} == {"axis": str(axis)}
        and _unblocked(of, count["inputs"][0]) == _unblocked(of, data)
    )


def _cast_away(of: Callable[[Ref], Any], ref: Ref) -> Ref:
    # the entry a chain of Cast nodes converts (the same integers: indices and lengths)
    while of(ref) is not None and of(ref)["op"] == "Cast":
        ref = of(ref)["inputs"][0]
    return ref


def _unblocked(of: Callable[[Ref], Any], ref: Ref) -> Ref:
    # the entry a chain of BlockGrad nodes passes on (the same values)
    while of(ref) is not None and of(ref)["op"] == "BlockGrad":
        ref = of(ref)["inputs"][0]
    return ref


def box_encode(
    node: dict, add: Add, dtypes: list[Any], of: Callable[[Ref], Any] | None = None
) -> list[Ref] | None:
    samples, matches, anchors, refs, means, stds = node["inputs"]
    if of is not None and _clipped(of, matches, refs, 1):
        # matches already clipped into [0, M) (the forward poisons what it clipped itself)
        op = add(node["op"], node["attrs"], node["inputs"])
        return [op, ("node", op[1], 1)]
    length = _length(add, refs, 1)
    positive = add(
        "Cast", {"dtype": "float64"}, [add("_greater_scalar", {"scalar": "0.5"}, [samples])]
    )
    bad = add("elemwise_mul", {}, [positive, _outside(add, matches, length)])
    # clipped into [0, M - 1] for the kernel, in matches' own dtype
    idx = add("relu", {}, [add("Cast", {"dtype": "float64"}, [matches])])
    last = add("_minus_scalar", {"scalar": "1.0"}, [length])
    safe = add("broadcast_minimum", {}, [idx, last])
    safe = add("Cast", {"dtype": np.dtype(dtypes[-1] or np.float32).name}, [safe])
    op = add(node["op"], node["attrs"], [samples, safe, anchors, refs, means, stds])
    return _poisoned(add, [op, ("node", op[1], 1)], dtypes[:2], bad)


def guarded(graph: Any, dtypes: dict[str, list], table: dict[str, Callable[..., Any]]) -> Any:
    """``graph`` (a :class:`customop.symbol_json.NativeGraph`) with the index guards of ``table``
    (``customop.graphs.rules.INDEX_GUARDS``) around the kernels they name.

    Applied once the graph is verified (a guard turns an out-of-range index into NaN
    where the forward run in Python would have read a clipped value).  ``dtypes``: by
    node name, the dtypes of its outputs and of its index input, as traced.
    """
    if not any(n["op"] in table for n in graph.nodes):
        return graph
    nodes: list[dict[str, Any]] = []
    moved: dict[int, int] = {}  # old node -> new node, for nodes kept as they are
    rewritten: dict[int, list[tuple]] = {}  # old node -> the entries of its outputs

    def remap(r: tuple) -> tuple:
        if r[0] != "node":
            return r
        return rewritten[r[1]][r[2]] if r[1] in rewritten else ("node", moved[r[1]], r[2])

    def of(r: tuple) -> dict[str, Any] | None:  # the (new) node of an entry
        return nodes[r[1]] if r[0] == "node" else None

    def add(op: str, attrs: dict, inputs: list) -> tuple:
        nodes.append(
            {
                "op": op,
                "name": f"guard{len(nodes)}_{op.strip('_').lower()}",
                "attrs": dict(attrs),
                "inputs": list(inputs),
            }
        )
        return ("node", len(nodes) - 1, 0)

    for k, n in enumerate(graph.nodes):
        node = dict(n, inputs=[remap(r) for r in n["inputs"]])
        rule = table.get(n["op"])
        outs = None
        if rule is not None and n["name"] in dtypes:
            outs = (
                rule(node, add, dtypes[n["name"]], of=of)
                if rule is box_encode
                else rule(node, add, dtypes[n["name"]])
            )
        if outs is None:
            nodes.append(node)
            moved[k] = len(nodes) - 1
        else:
            rewritten[k] = outs
    return dataclasses.replace(
        graph,
        nodes=nodes,
        heads=[remap(r) for r in graph.heads],
        guards=sorted({graph.nodes[k]["op"] for k in rewritten}),
    )
