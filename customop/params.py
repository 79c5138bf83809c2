"""Keyword parameters <-> the strings MXNet stores in CustomOp attributes.

MXNet hands every CustomOp keyword to ``CustomOpProp.__init__`` as ``str(v)``
and writes the same strings into exported symbol JSON.  We encode with
``repr`` (exact for floats, keeps tuple vs list, quotes strings) and decode
with a restricted literal evaluator, so Python types survive every path.
"""

from __future__ import annotations

import ast
import math
from typing import Any

import numpy as np

# Names MXNet's Custom front-ends reserve for themselves.
RESERVED = frozenset({"op_type", "name", "out", "attr", "ctx", "data"})

_NAMED = {"None": None, "True": True, "False": False, "inf": math.inf, "nan": math.nan}


def normalize(value: Any, op: str, key: str) -> Any:
    """Return ``value`` as a plain Python literal, or raise naming op and key."""
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (tuple, list)):
        items = [normalize(v, op, key) for v in value]
        return tuple(items) if isinstance(value, tuple) else items
    if isinstance(value, dict):
        return {normalize(k, op, key): normalize(v, op, key) for k, v in value.items()}
    kind = type(value).__module__ + "." + type(value).__qualname__
    raise TypeError(
        f"customop {op!r}: parameter {key!r} got a {kind}; parameters must be Python "
        "literals (number, str, bool, None, or tuples/lists/dicts of them). "
        "Pass arrays as positional inputs instead."
    )


def encode(value: Any) -> str:
    """Encode a normalized literal as the attribute string MXNet stores."""
    return repr(value)


def decode(text: str) -> Any:
    """Invert :func:`encode`; a string that is not a literal is returned as is.

    The fallback keeps ``mx.nd.Custom(..., mode='valid')`` working for users who
    call the registered op directly (MXNet sends ``valid`` unquoted).
    """
    try:
        return _literal(ast.parse(text, mode="eval").body)
    except (SyntaxError, ValueError):
        return text


def _literal(node: ast.AST) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name) and node.id in _NAMED:
        return _NAMED[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = _literal(node.operand)
        if isinstance(operand, (int, float)) and not isinstance(operand, bool):
            return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.Tuple):
        return tuple(_literal(e) for e in node.elts)
    if isinstance(node, ast.List):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values)}
    raise ValueError("not a literal")


def decode_attrs(attrs: dict[str, str]) -> dict[str, Any]:
    """Decode a CustomOpProp's kwargs, dropping MXNet's own ``__x__`` attributes."""
    return {k: decode(v) for k, v in attrs.items() if not k.startswith("__")}
