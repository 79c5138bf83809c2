"""How many outputs a call or graph node has: the one place that reads ``num_outputs=``.

``num_outputs=`` is an int, or a function of the operator's parameters when the
count depends on one (``ret_typ='both'``); every call path, graph node and
gradient asks :meth:`OutputCount.of` with its own parameters.
"""
from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

from . import errors
from .gradients import keywords
from .signature import Signature


class OutputCount:
    """An operator's declared output count, resolved per set of parameters."""

    def __init__(self, declared: int | Callable[..., int], signature: Signature, op_type: str):
        self.op_type = op_type
        self.defaults = signature.defaults
        if callable(declared):
            found, var_kw = keywords(declared, 0)
            names = signature.param_names
            unknown = [p.name for p in found if p.name not in names]
            if unknown:
                raise errors.op_error(op_type, TypeError, (
                    f"num_outputs= takes {', '.join(map(repr, unknown))}, which "
                    f"{'is' if len(unknown) == 1 else 'are'} not a parameter of the op "
                    f"(parameters: {', '.join(names) or 'none'}); it is called with the op's "
                    "parameters by keyword"))
            self.wanted = None if var_kw else {p.name for p in found}
        elif isinstance(declared, bool) or not isinstance(declared, numbers.Integral) or \
                declared < 1:
            raise errors.op_error(op_type, TypeError, (
                "num_outputs= must be an int >= 1 or a function of the op's parameters "
                f"returning one, got {declared!r}"))
        else:
            declared = int(declared)
        self.declared = declared
        self.by_parameters = callable(declared)

    def of(self, params: dict[str, Any]) -> int:
        """The count for a call with these parameters (defaults filled in)."""
        if not self.by_parameters:
            return self.declared
        every = {**self.defaults, **params}
        try:
            n = self.declared(**{k: v for k, v in every.items()
                                 if self.wanted is None or k in self.wanted})
        except Exception as exc:
            errors.reraise(exc, self.op_type, "num_outputs")
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
            raise errors.op_error(self.op_type, TypeError, (
                f"num_outputs= returned {n!r} for the parameters {_shown(every)}; it must "
                "return an int >= 1"))
        return int(n)

    def mismatch(self, got: int, params: dict[str, Any]) -> str:
        """What a forward that returned ``got`` outputs was told to return, and the fix."""
        n = self.of(params)
        if self.by_parameters:
            return (f"the op declares {n} for the parameters {_shown({**self.defaults, **params})}"
                    f" (num_outputs=); make num_outputs= return {got} for them, or return "
                    "that many outputs")
        return f"the op declares {n}; pass num_outputs={got} to @customop"

    def __repr__(self) -> str:
        return "by parameters" if self.by_parameters else str(self.declared)


def _shown(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in params.items()) or "none"
