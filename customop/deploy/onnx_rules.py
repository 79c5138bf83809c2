"""ONNX translations of the MXNet operators our exports hold that MXNet 1.9.1's converter lacks.

:data:`RULES` is one table, MXNet operator name -> its rule, each entry written
beside its rule.  A rule has the signature of the converter's own translations
(``mxnet/onnx/mx2onnx/_op_translations``): ``rule(node, **kwargs)`` returns the
ONNX nodes (or ``(nodes, output dtypes)``) that compute the node's outputs,
named ``name`` (one output) or ``name0``, ``name1``, ...  They write opset-13
operators, the opset :func:`customop.to_onnx` declares.  The ``onnxops`` patch
(:mod:`customop.deploy.onnxops`) registers the entries the converter lacks,
when :func:`customop.to_onnx` first runs; an entry MXNet has is never replaced.

Each rule computes what MXNet's kernel computes (``src/operator``), checked by
running the converted models in ONNX Runtime against MXNet
(``tests/deploy/run_onnxruntime.py``) and in onnx's reference evaluator
(``tests/customop/test_onnx_rules.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

RULES: dict[str, Callable[..., Any]] = {}


def _rule(*ops: str) -> Callable:
    def add(rule: Callable) -> Callable:
        for op in ops:
            RULES[op] = rule
        return rule

    return add


def _inputs(node: dict, kwargs: dict) -> tuple[str, list[str], dict]:
    lookup = kwargs["outputs_lookup"]
    return (node["name"], [lookup[i][k].name for i, k, *_ in node["inputs"]], node.get("attrs", {}))


def _dtypes(node: dict, kwargs: dict) -> list[np.dtype]:
    lookup = kwargs["outputs_lookup"]
    return [np.dtype(lookup[i][k].dtype) for i, k, *_ in node["inputs"]]


# onnx comes with the `onnx` extra: it is imported when a rule runs (inside to_onnx, which
# names the extra when onnx is missing), so that this module imports without it.
def make_node(*args: Any, **kwargs: Any) -> Any:
    from onnx.helper import make_node as make

    return make(*args, **kwargs)


def make_tensor(*args: Any, **kwargs: Any) -> Any:
    from onnx.helper import make_tensor as make

    return make(*args, **kwargs)


def _tensor_type(dtype: Any) -> int:
    from onnx.helper import np_dtype_to_tensor_dtype

    return np_dtype_to_tensor_dtype(np.dtype(dtype))


def _const(name: str, value: Any, dtype: Any) -> Any:
    """A Constant node ``name`` holding ``value`` (a 1-D tensor, or a scalar if 0-D)."""
    arr = np.asarray(value, dtype=dtype)
    return make_node(
        "Constant",
        [],
        [name],
        value=make_tensor(
            name + "_value", _tensor_type(arr.dtype), arr.shape, arr.ravel().tolist()
        ),
    )


def _int_axis(attrs: dict, op: str, default: str = "-1") -> int:
    axis = attrs.get("axis", default)
    if axis in ("None", None):
        raise NotImplementedError(
            f"customop.to_onnx: {op} with axis=None has no ONNX translation here (give an axis)"
        )
    return int(axis)


# --- comparisons and logic: MXNet returns 0/1 in the input's dtype -------------------------

_COMPARE = {
    "equal": ("Equal", False),
    "not_equal": ("Equal", True),
    "greater": ("Greater", False),
    "greater_equal": ("GreaterOrEqual", False),
    "lesser": ("Less", False),
    "lesser_equal": ("LessOrEqual", False),
}


def _compare(onnx_op: str, negate: bool, name: str, lhs: str, rhs: str, dtype: Any) -> list:
    nodes = [make_node(onnx_op, [lhs, rhs], [name + "_cmp"])]
    if negate:
        nodes.append(make_node("Not", [name + "_cmp"], [name + "_not"]))
    nodes.append(
        make_node("Cast", [nodes[-1].output[0]], [name], to=_tensor_type(dtype), name=name)
    )
    return nodes


@_rule(*(f"_{c}_scalar" for c in _COMPARE))
def _compare_scalar(node: dict, **kwargs: Any) -> list:
    """``_<cmp>_scalar(x, scalar)``: ``x <cmp> scalar``, 0/1 in ``x``'s dtype."""
    name, (x,), attrs = _inputs(node, kwargs)
    dtype = _dtypes(node, kwargs)[0]
    onnx_op, negate = _COMPARE[node["op"][1 : -len("_scalar")]]
    scalar = float(attrs.get("scalar", 0))
    return [_const(name + "_rhs", scalar, dtype)] + _compare(
        onnx_op, negate, name, x, name + "_rhs", dtype
    )


@_rule(*(f"_{c}" for c in _COMPARE))
def _compare_elementwise(node: dict, **kwargs: Any) -> list:
    """``_<cmp>(lhs, rhs)`` (same shapes): 0/1 in ``lhs``'s dtype."""
    name, (lhs, rhs), _ = _inputs(node, kwargs)
    onnx_op, negate = _COMPARE[node["op"][1:]]
    return _compare(onnx_op, negate, name, lhs, rhs, _dtypes(node, kwargs)[0])


@_rule("_logical_and", "_logical_or", "_logical_xor")
def _logical(node: dict, **kwargs: Any) -> list:
    """``_logical_<op>(lhs, rhs)``: on the inputs' nonzero-ness, 0/1 in ``lhs``'s dtype."""
    name, (lhs, rhs), _ = _inputs(node, kwargs)
    onnx_op = {"_logical_and": "And", "_logical_or": "Or", "_logical_xor": "Xor"}[node["op"]]
    boolean = _tensor_type(np.bool_)
    return [
        make_node("Cast", [lhs], [name + "_l"], to=boolean),
        make_node("Cast", [rhs], [name + "_r"], to=boolean),
        make_node(onnx_op, [name + "_l", name + "_r"], [name + "_b"]),
        make_node(
            "Cast", [name + "_b"], [name], to=_tensor_type(_dtypes(node, kwargs)[0]), name=name
        ),
    ]


@_rule("_npi_isnan")
def _isnan(node: dict, **kwargs: Any) -> tuple:
    """``_npi_isnan(x)``: a boolean array."""
    name, (x,), _ = _inputs(node, kwargs)
    return [make_node("IsNaN", [x], [name], name=name)], [np.dtype(bool)]


# --- elementwise math ----------------------------------------------------------------------


@_rule("log1p")
def _log1p(node: dict, **kwargs: Any) -> list:
    """``log1p(x)`` as ``x * log(u) / (u - 1)``, ``u = 1 + x`` (Goldberg's correction:
    ``x`` where ``u == 1``, ``log(u)`` where ``u - 1 == x`` exactly, infinities included),
    which keeps log1p's precision for small ``x`` that ``log(1 + x)`` loses."""
    name, (x,), _ = _inputs(node, kwargs)
    dtype = _dtypes(node, kwargs)[0]
    n = name + "_"
    return [
        _const(n + "one", 1.0, dtype),
        make_node("Add", [x, n + "one"], [n + "u"]),
        make_node("Sub", [n + "u", n + "one"], [n + "d"]),
        make_node("Log", [n + "u"], [n + "log"]),
        make_node("Mul", [n + "log", x], [n + "num"]),
        make_node("Div", [n + "num", n + "d"], [n + "ratio"]),
        make_node("Equal", [n + "d", x], [n + "same"]),  # u - 1 == x: log(u) is exact
        make_node("Where", [n + "same", n + "log", n + "ratio"], [n + "out"]),
        make_node("Equal", [n + "u", n + "one"], [n + "tiny"]),
        make_node("Where", [n + "tiny", x, n + "out"], [name], name=name),
    ]


@_rule("smooth_l1")
def _smooth_l1(node: dict, **kwargs: Any) -> list:
    """``smooth_l1(x, scalar=s)``: ``|x| - 0.5/s^2`` where ``|x| > 1/s^2``, else
    ``0.5 * (s*x)^2`` (mshadow_op::smooth_l1_loss)."""
    name, (x,), attrs = _inputs(node, kwargs)
    dtype = _dtypes(node, kwargs)[0]
    s2 = float(attrs.get("scalar", 1.0)) ** 2
    n = name + "_"
    return [
        _const(n + "inv", 1.0 / s2, dtype),
        _const(n + "half_inv", 0.5 / s2, dtype),
        _const(n + "half_s2", 0.5 * s2, dtype),
        make_node("Abs", [x], [n + "abs"]),
        make_node("Greater", [n + "abs", n + "inv"], [n + "far"]),
        make_node("Sub", [n + "abs", n + "half_inv"], [n + "linear"]),
        make_node("Mul", [x, x], [n + "sq"]),
        make_node("Mul", [n + "sq", n + "half_s2"], [n + "quad"]),
        make_node("Where", [n + "far", n + "linear", n + "quad"], [name], name=name),
    ]


# --- sorting, picking, cumulative sums --------------------------------------------------------


@_rule("sort")
def _sort(node: dict, **kwargs: Any) -> list:
    """``sort(x, axis, is_ascend)``: TopK over the whole axis."""
    name, (x,), attrs = _inputs(node, kwargs)
    axis = _int_axis(attrs, "sort")
    ascend = attrs.get("is_ascend", "True") in ("True", "1", "true")
    n = name + "_"
    return [
        make_node("Shape", [x], [n + "shape"]),
        _const(n + "axis", [axis], np.int64),
        make_node("Gather", [n + "shape", n + "axis"], [n + "k"]),
        # MXNet's sort has a hidden second output: its value is ``<name>0``
        make_node(
            "TopK",
            [x, n + "k"],
            [name + "0", n + "indices"],
            axis=axis,
            largest=int(not ascend),
            sorted=1,
            name=name,
        ),
    ]


@_rule("pick")
def _pick(node: dict, **kwargs: Any) -> list:
    """``pick(data, index, axis, keepdims, mode)``: GatherElements, the index clipped to
    the axis (``mode='clip'``) or wrapped (``'wrap'``) as MXNet does."""
    name, (data, index), attrs = _inputs(node, kwargs)
    axis = _int_axis(attrs, "pick")
    keepdims = attrs.get("keepdims", "False") in ("True", "1", "true")
    n = name + "_"
    nodes = [
        make_node("Cast", [index], [n + "idx"], to=_tensor_type(np.int64)),
        make_node("Shape", [data], [n + "shape"]),
        _const(n + "axis", [axis], np.int64),
        make_node("Gather", [n + "shape", n + "axis"], [n + "dim"]),
    ]
    if attrs.get("mode", "clip") == "wrap":
        nodes.append(make_node("Mod", [n + "idx", n + "dim"], [n + "fit"]))
    else:
        nodes += [
            _const(n + "zero", [0], np.int64),
            _const(n + "one", [1], np.int64),
            make_node("Sub", [n + "dim", n + "one"], [n + "last"]),
            make_node("Max", [n + "idx", n + "zero"], [n + "low"]),
            make_node("Min", [n + "low", n + "last"], [n + "fit"]),
        ]
    # the index as the picked shape (data's, 1 on the axis): MXNet takes it with or
    # without that axis
    tail = axis + 1 if axis != -1 else 2**62
    nodes += [
        _const(n + "start", [0], np.int64),
        _const(n + "tail", [tail], np.int64),
        _const(n + "end", [2**62], np.int64),
        _const(n + "unit", [1], np.int64),
        make_node("Slice", [n + "shape", n + "start", n + "axis"], [n + "head"]),
        make_node("Slice", [n + "shape", n + "tail", n + "end"], [n + "rest"]),
        make_node("Concat", [n + "head", n + "unit", n + "rest"], [n + "kshape"], axis=0),
        make_node("Reshape", [n + "fit", n + "kshape"], [n + "kept"]),
    ]
    if keepdims:
        return nodes + [
            make_node("GatherElements", [data, n + "kept"], [name], axis=axis, name=name)
        ]
    return nodes + [
        make_node("GatherElements", [data, n + "kept"], [n + "picked"], axis=axis),
        make_node("Squeeze", [n + "picked", n + "axis"], [name], name=name),
    ]


@_rule("_np_cumsum")
def _cumsum(node: dict, **kwargs: Any) -> Any:
    """``_np_cumsum(a, axis, dtype)``: CumSum (``axis=None``: over the flattened array)."""
    name, (x,), attrs = _inputs(node, kwargs)
    n = name + "_"
    nodes = []
    if attrs.get("axis", "None") == "None":
        nodes += [
            _const(n + "flat", [-1], np.int64),
            make_node("Reshape", [x, n + "flat"], [n + "x"]),
        ]
        x, axis = n + "x", 0
    else:
        axis = int(attrs["axis"])
    dtype = attrs.get("dtype", "None")
    if dtype == "None":
        return nodes + [
            _const(n + "axis", axis, np.int64),
            make_node("CumSum", [x, n + "axis"], [name], name=name),
        ]
    return nodes + [
        make_node("Cast", [x], [n + "cast"], to=_tensor_type(dtype)),
        _const(n + "axis", axis, np.int64),
        make_node("CumSum", [n + "cast", n + "axis"], [name], name=name),
    ], [np.dtype(dtype)]


# --- constants ------------------------------------------------------------------------------


@_rule("_full")
def _full(node: dict, **kwargs: Any) -> tuple:
    """``_full(shape, value, dtype)``: ConstantOfShape."""
    name, _, attrs = _inputs(node, kwargs)
    shape = [int(s) for s in attrs["shape"].strip("()[] ").split(",") if s.strip()]
    dtype = np.dtype(attrs.get("dtype", "float32"))
    value = make_tensor(
        name + "_value",
        _tensor_type(dtype),
        [1],
        [np.asarray(float(attrs.get("value", 0)), dtype).item()],
    )
    return [
        _const(name + "_shape", shape, np.int64),
        make_node("ConstantOfShape", [name + "_shape"], [name], value=value, name=name),
    ], [dtype]


# --- boxes (src/operator/contrib/bounding_box-inl.h) -----------------------------------------


def _corners(nodes: list, box: str, center: bool, n: str) -> tuple[str, ...]:
    """Split ``box`` (..., 4) into its xmin, ymin, xmax, ymax (each (..., 1))."""
    nodes.append(make_node("Split", [box], [n + p for p in "abcd"], axis=-1))
    if not center:
        return tuple(n + p for p in "abcd")
    half = n + "half"
    nodes += [
        _const(half, 0.5, np.float32),
        make_node("Mul", [n + "c", half], [n + "hw"]),
        make_node("Mul", [n + "d", half], [n + "hh"]),
        make_node("Sub", [n + "a", n + "hw"], [n + "x0"]),
        make_node("Sub", [n + "b", n + "hh"], [n + "y0"]),
        make_node("Add", [n + "a", n + "hw"], [n + "x1"]),
        make_node("Add", [n + "b", n + "hh"], [n + "y1"]),
    ]
    return n + "x0", n + "y0", n + "x1", n + "y1"


def _area(nodes: list, x0: str, y0: str, x1: str, y1: str, n: str) -> str:
    """``(x1-x0)*(y1-y0)``, 0 where either side is negative (BoxArea)."""
    nodes += [
        make_node("Sub", [x1, x0], [n + "w"]),
        make_node("Sub", [y1, y0], [n + "h"]),
        _const(n + "zero", 0.0, np.float32),
        make_node("Less", [n + "w", n + "zero"], [n + "wneg"]),
        make_node("Less", [n + "h", n + "zero"], [n + "hneg"]),
        make_node("Or", [n + "wneg", n + "hneg"], [n + "neg"]),
        make_node("Mul", [n + "w", n + "h"], [n + "wh"]),
        make_node("Where", [n + "neg", n + "zero", n + "wh"], [n + "area"]),
    ]
    return n + "area"


@_rule("_contrib_box_iou")
def _box_iou(node: dict, **kwargs: Any) -> list:
    """``box_iou(lhs (..., 4), rhs (..., 4), format)``: (lhs.shape[:-1] + rhs.shape[:-1])."""
    name, (lhs, rhs), attrs = _inputs(node, kwargs)
    center = attrs.get("format", "corner") == "center"
    n = name + "_"
    nodes = [
        _const(n + "rows", [-1, 1, 4], np.int64),
        _const(n + "cols", [1, -1, 4], np.int64),
        make_node("Cast", [lhs], [n + "lf"], to=_tensor_type(np.float32)),
        make_node("Cast", [rhs], [n + "rf"], to=_tensor_type(np.float32)),
        make_node("Reshape", [n + "lf", n + "rows"], [n + "l"]),
        make_node("Reshape", [n + "rf", n + "cols"], [n + "r"]),
    ]
    a = _corners(nodes, n + "l", center, n + "la")
    b = _corners(nodes, n + "r", center, n + "rb")
    zero = n + "zero"
    nodes += [
        _const(zero, 0.0, np.float32),
        make_node("Max", [a[0], b[0]], [n + "ix0"]),
        make_node("Max", [a[1], b[1]], [n + "iy0"]),
        make_node("Min", [a[2], b[2]], [n + "ix1"]),
        make_node("Min", [a[3], b[3]], [n + "iy1"]),
        make_node("Sub", [n + "ix1", n + "ix0"], [n + "iw0"]),
        make_node("Sub", [n + "iy1", n + "iy0"], [n + "ih0"]),
        make_node("Max", [n + "iw0", zero], [n + "iw"]),
        make_node("Max", [n + "ih0", zero], [n + "ih"]),
        make_node("Mul", [n + "iw", n + "ih"], [n + "inter"]),
    ]
    area_a = _area(nodes, *a, n + "aa")
    area_b = _area(nodes, *b, n + "ab")
    nodes += [
        make_node("Add", [area_a, area_b], [n + "sum"]),
        make_node("Sub", [n + "sum", n + "inter"], [n + "union"]),
        make_node("Div", [n + "inter", n + "union"], [n + "iou3"]),
        # (N, M, 1) -> lhs.shape[:-1] + rhs.shape[:-1]
        make_node("Shape", [lhs], [n + "lshape"]),
        make_node("Shape", [rhs], [n + "rshape"]),
        _const(n + "start", [0], np.int64),
        _const(n + "end", [-1], np.int64),
        make_node("Slice", [n + "lshape", n + "start", n + "end"], [n + "lhead"]),
        make_node("Slice", [n + "rshape", n + "start", n + "end"], [n + "rhead"]),
        make_node("Concat", [n + "lhead", n + "rhead"], [n + "oshape"], axis=0),
        make_node("Reshape", [n + "iou3", n + "oshape"], [n + "iou"]),
        make_node(
            "Cast", [n + "iou"], [name], to=_tensor_type(_dtypes(node, kwargs)[0]), name=name
        ),
    ]
    return nodes


@_rule("_contrib_box_encode")
def _box_encode(node: dict, **kwargs: Any) -> list:
    """``box_encode(samples (B, N), matches (B, N), anchors (B, N, 4), refs (B, M, 4),
    means (4,), stds (4,))``: targets and masks (B, N, 4); 0 where ``samples <= 0.5``."""
    name, (samples, matches, anchors, refs, means, stds), _ = _inputs(node, kwargs)
    dtype = _dtypes(node, kwargs)[2]
    n = name + "_"
    nodes = [
        _const(n + "last", [-1], np.int64),
        _const(n + "one", [1], np.int64),
        _const(n + "zero_i", [0], np.int64),
        _const(n + "half", 0.5, dtype),
        _const(n + "zero", 0.0, dtype),
        # refs[b, matches[b, i]], the index kept inside refs (masked out where invalid)
        make_node("Cast", [matches], [n + "m"], to=_tensor_type(np.int64)),
        make_node("Shape", [refs], [n + "rshape"]),
        make_node("Gather", [n + "rshape", n + "one"], [n + "nref"]),
        make_node("Sub", [n + "nref", n + "one"], [n + "maxi"]),
        make_node("Max", [n + "m", n + "zero_i"], [n + "m0"]),
        make_node("Min", [n + "m0", n + "maxi"], [n + "m1"]),
        make_node("Unsqueeze", [n + "m1", n + "last"], [n + "m2"]),
        make_node("Shape", [anchors], [n + "ashape"]),
        make_node("Expand", [n + "m2", n + "ashape"], [n + "m4"]),
        make_node("GatherElements", [refs, n + "m4"], [n + "g"], axis=1),
    ]
    g = _corners(nodes, n + "g", False, n + "g")
    a = _corners(nodes, anchors, False, n + "a")

    def center(box: tuple, p: str) -> tuple:
        nodes.extend(
            [
                make_node("Sub", [box[2], box[0]], [p + "w"]),
                make_node("Sub", [box[3], box[1]], [p + "h"]),
                make_node("Mul", [p + "w", n + "half"], [p + "hw"]),
                make_node("Mul", [p + "h", n + "half"], [p + "hh"]),
                make_node("Add", [box[0], p + "hw"], [p + "x"]),
                make_node("Add", [box[1], p + "hh"], [p + "y"]),
            ]
        )
        return p + "x", p + "y", p + "w", p + "h"

    gx, gy, gw, gh = center(g, n + "gc")
    ax, ay, aw, ah = center(a, n + "ac")
    nodes += [
        make_node("Sub", [gx, ax], [n + "dx"]),
        make_node("Div", [n + "dx", aw], [n + "t0"]),
        make_node("Sub", [gy, ay], [n + "dy"]),
        make_node("Div", [n + "dy", ah], [n + "t1"]),
        make_node("Div", [gw, aw], [n + "rw"]),
        make_node("Log", [n + "rw"], [n + "t2"]),
        make_node("Div", [gh, ah], [n + "rh"]),
        make_node("Log", [n + "rh"], [n + "t3"]),
        make_node("Concat", [n + "t0", n + "t1", n + "t2", n + "t3"], [n + "t"], axis=-1),
        make_node("Sub", [n + "t", means], [n + "tm"]),
        make_node("Div", [n + "tm", stds], [n + "ts"]),
        make_node("Greater", [samples, n + "half"], [n + "valid2"]),
        make_node("Unsqueeze", [n + "valid2", n + "last"], [n + "valid3"]),
        make_node("Expand", [n + "valid3", n + "ashape"], [n + "valid"]),
        make_node("Where", [n + "valid", n + "ts", n + "zero"], [name + "0"]),
        make_node("Cast", [n + "valid"], [name + "1"], to=_tensor_type(dtype)),
    ]
    return nodes
