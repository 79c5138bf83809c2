"""How many outputs a call or graph node has, and their names: the one place that reads
``num_outputs=`` and ``outputs=``.

``num_outputs=`` is an int, or a function of the operator's parameters when the
count depends on one (``ret_typ='both'``); every call path, graph node and
gradient asks :meth:`OutputCount.of` with its own parameters.  ``outputs=``
names them (``('rois', 'label')``: a graph node lists ``<node>_rois``,
``<node>_label``, as a hand-written ``CustomOpProp.list_outputs`` does); a tuple,
or a function of the parameters returning one, and then it gives the count too.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

import mxnet as mx

from . import errors
from .arguments import Signature
from .gradients import keywords


class OutputCount:
    """An operator's declared output count (and names), resolved per set of parameters."""

    def __init__(
        self,
        declared: int | Callable[..., int] | None,
        signature: Signature,
        op_type: str,
        names: Any = None,
        counted: int = 1,
    ):
        self.op_type = op_type
        self.defaults = signature.defaults
        self.param_names = signature.param_names
        self.names_wanted: set | None = None
        self.names_declared = self._checked_names(names)
        self.count_by_names = declared is None and callable(self.names_declared)
        if declared is None:
            if self.names_declared is None:
                declared = counted  # read from the forward's return statements
            elif self.count_by_names:
                declared = self._count_from_names
            else:
                declared = len(self.names_declared)
        elif (
            self.names_declared is not None
            and not callable(self.names_declared)
            and not callable(declared)
            and declared != len(self.names_declared)
        ):
            raise errors.op_error(
                op_type,
                TypeError,
                (
                    f"num_outputs={declared!r} but outputs= names {len(self.names_declared)} "
                    f"({', '.join(map(repr, self.names_declared))}); give one of them"
                ),
            )
        if callable(declared):
            self.wanted = self._wanted(declared, "num_outputs=")
        elif (
            isinstance(declared, bool) or not isinstance(declared, numbers.Integral) or declared < 1
        ):
            raise errors.op_error(
                op_type,
                TypeError,
                (
                    "num_outputs= must be an int >= 1 or a function of the op's parameters "
                    f"returning one, got {declared!r}"
                ),
            )
        else:
            declared = int(declared)
        self.declared = declared
        self.by_parameters = callable(declared)

    def _wanted(self, fn: Callable, what: str) -> set | None:
        found, var_kw = keywords(fn, 0)
        unknown = [p.name for p in found if p.name not in self.param_names]
        if unknown:
            raise errors.op_error(
                self.op_type,
                TypeError,
                (
                    f"{what} takes {', '.join(map(repr, unknown))}, which "
                    f"{'is' if len(unknown) == 1 else 'are'} not a parameter of the op "
                    f"(parameters: {', '.join(self.param_names) or 'none'}); it is called with the "
                    "op's parameters by keyword"
                ),
            )
        return None if var_kw else {p.name for p in found}

    def _checked_names(self, names: Any) -> Any:
        if names is None or callable(names):
            if callable(names):
                self.names_wanted = self._wanted(names, "outputs=")
            return names
        if isinstance(names, str):
            names = (names,)
        names = tuple(names)
        problem = _names_problem(names)
        if problem:
            raise errors.op_error(
                self.op_type,
                TypeError,
                (
                    f"outputs= must name each output once with a non-empty string, got "
                    f"{names!r} ({problem})"
                ),
            )
        return names

    def _call(self, fn: Callable, wanted: set | None, params: dict[str, Any], what: str) -> Any:
        every = {**self.defaults, **params}
        try:
            return fn(**{k: v for k, v in every.items() if wanted is None or k in wanted})
        except Exception as exc:
            errors.reraise(exc, self.op_type, what)

    def _count_from_names(self, **params: Any) -> int:
        return len(self.names(params))

    def of(self, params: dict[str, Any]) -> int:
        """The count for a call with these parameters (defaults filled in)."""
        if not self.by_parameters:
            return self.declared
        if self.count_by_names:
            return len(self.names(params))
        n = self._call(self.declared, self.wanted, params, "num_outputs")
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
            raise errors.op_error(
                self.op_type,
                TypeError,
                (
                    f"num_outputs= returned {n!r} for the parameters "
                    f"{_shown({**self.defaults, **params})}; it must return an int >= 1"
                ),
            )
        return int(n)

    def names(self, params: dict[str, Any]) -> tuple[str, ...]:
        """The names of a node's outputs, as its ``CustomOpProp.list_outputs`` gives them.

        Without ``outputs=``: ``output`` for one, ``output0``, ``output1``, ... for several.
        """
        declared = self.names_declared
        if declared is None:
            n = self.of(params)
            return ("output",) if n == 1 else tuple(f"output{i}" for i in range(n))
        if not callable(declared):
            return declared
        names = self._call(declared, self.names_wanted, params, "outputs")
        names = (
            (names,)
            if isinstance(names, str)
            else tuple(names)
            if isinstance(names, (tuple, list))
            else names
        )
        problem = _names_problem(names) if isinstance(names, tuple) else "not a tuple"
        if problem:
            raise errors.op_error(
                self.op_type,
                TypeError,
                (
                    f"outputs= returned {names!r} for the parameters "
                    f"{_shown({**self.defaults, **params})}; it must return a tuple of distinct, "
                    f"non-empty names ({problem})"
                ),
            )
        return names

    def mismatch(self, got: int, params: dict[str, Any]) -> str:
        """What a forward that returned ``got`` outputs was told to return, and the fix."""
        n = self.of(params)
        if self.names_declared is not None:
            names = ", ".join(map(repr, self.names(params)))
            return (
                f"the op declares {n} ({names}, outputs=); return that many outputs, or "
                "name as many as it returns"
            )
        if self.by_parameters:
            return (
                f"the op declares {n} for the parameters {_shown({**self.defaults, **params})}"
                f" (num_outputs=); make num_outputs= return {got} for them, or return "
                "that many outputs"
            )
        return f"the op declares {n}; pass num_outputs={got} to @customop"

    def __repr__(self) -> str:
        if self.names_declared is not None and not callable(self.names_declared):
            return f"({', '.join(self.names_declared)})"
        return "by parameters" if self.by_parameters else str(self.declared)


def _names_problem(names: tuple) -> str:
    if not names:
        return "none given"
    bad = [n for n in names if not isinstance(n, str) or not n]
    if bad:
        return f"{bad[0]!r} is not a non-empty string"
    if len(set(names)) != len(names):
        return "a name repeats"
    return ""


def _shown(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in params.items()) or "none"


class OutputsSymbol(mx.sym.Symbol):
    """The Symbol of one of our nodes with several outputs: ``s[-1]`` is its last output.

    MXNet's ``Symbol.__getitem__`` hands a negative index to C as an unsigned int
    (measured: ``Check failed: index < nreturn (4294967295 vs. 2)``, also for its own
    ``mx.sym.topk(ret_typ='both')``).  Only our nodes' Symbols get this class (their
    ``__class__`` is set where the node is made); every other Symbol keeps MXNet's.
    """

    __slots__ = ()

    def __getitem__(self, index):
        """``s[i]`` as Python indexes: negative ``i`` from the end, ``IndexError`` outside."""
        if isinstance(index, numbers.Integral) and not isinstance(index, bool):
            count = len(self)
            if not -count <= index < count:
                raise IndexError(
                    f"output index {index} is out of range for a node with "
                    f"{count} outputs ({', '.join(self.list_outputs())})"
                )
            index = int(index) % count
        return super().__getitem__(index)

    def __repr__(self) -> str:
        return super().__repr__().replace(type(self).__name__, "Symbol", 1)
