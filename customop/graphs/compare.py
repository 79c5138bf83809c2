"""Comparing what two traces of one operator recorded, and two of its native graphs."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..modes import BFLOAT16

if TYPE_CHECKING:
    from ..symbol_json import NativeGraph
    from .trace import Recording


def host(a: np.ndarray) -> np.ndarray:
    """``a`` as NumPy computes with it: MXNet's ``bfloat16`` (a two-byte structured dtype,
    which no ufunc takes) widened to ``float32``, exactly; any other array as it is."""
    if a.dtype != BFLOAT16:
        return a
    return (a.view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def close(got: list[np.ndarray], want: list[np.ndarray]) -> bool:
    """Whether ``got`` equals ``want`` array by array (float tolerance by dtype, NaN equal)."""
    if len(got) != len(want):
        return False
    for g, w in zip(got, want):
        half = BFLOAT16 in (g.dtype, w.dtype) or w.dtype == np.float16
        g, w = host(g), host(w)
        g = g.reshape(w.shape) if g.size == w.size else g
        if g.shape != w.shape:
            return False
        if np.issubdtype(w.dtype, np.floating):
            tol = 1e-2 if half else 1e-5
            if not np.allclose(g, w, rtol=tol, atol=tol * 0.1, equal_nan=True):
                return False
        elif not np.array_equal(g, w):
            return False
    return True


def structure(rec: Recording) -> list:
    """What a recording's graph is, values left out: equal for traces on other values."""
    return [
        (n["op"], sorted(n["attrs"].items()), n["inputs"], i in rec.free)
        for i, n in enumerate(rec.nodes)
    ] + [rec.heads, rec.inputs]


def difference(a: NativeGraph, b: NativeGraph) -> str:
    """The first difference between two graphs of one operator ("" when they are alike)."""
    if len(a.nodes) != len(b.nodes):
        return f"{len(a.nodes)} operators, {len(b.nodes)}"
    for x, y in zip(a.nodes, b.nodes):
        if x["op"] != y["op"] or x["inputs"] != y["inputs"]:
            return f"operator {x['op']} becomes {y['op']}"
        if x["attrs"] != y["attrs"]:
            key = next(
                k
                for k in sorted(set(x["attrs"]) | set(y["attrs"]))
                if x["attrs"].get(k) != y["attrs"].get(k)
            )
            return f"{x['op']} {key}={x['attrs'].get(key)} becomes {y['attrs'].get(key)}"
    if a.heads != b.heads:
        return "other outputs"
    for name, value in a.constants.items():
        other = b.constants.get(name)
        if other is None or other.shape != value.shape or other.dtype != value.dtype:
            return f"a constant of shape {value.shape}"
    return ""
