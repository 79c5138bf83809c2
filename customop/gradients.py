"""The one place that decides where an input's gradient comes from.

Order: a ``def_grad`` closure; else an automatic gradient (when the operator
allows it); else zero (``None``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import errors

if TYPE_CHECKING:
    from .operator import CustomOperator


def compute(op: CustomOperator, argnum: int, ans: Any, args: list[Any], g: Any,
            params: dict[str, Any]) -> Any | None:
    """Gradient of input ``argnum`` for upstream gradient ``g``, or ``None`` for zero."""
    maker = op.grads.get(argnum)
    if maker is None:
        return None
    name = op.signature.inputs[argnum]
    try:
        closure = maker(ans, *args, **params)
        return closure(g)
    except Exception as exc:
        raise errors.named(exc, op.op_type, f"gradient for input {name!r}") from None
