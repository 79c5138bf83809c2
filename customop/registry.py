"""Operators by ``op_type``: registering them with MXNet, finding them, pickling them by name.

MXNet finds a custom operator by its ``op_type`` string (graphs and exported
symbol files store nothing else), so this table is the one place that maps
that string to the operator object.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from . import errors, opinfo, prop

_OPS: dict[str, opinfo.Registered] = {}


def lookup(op_type: str) -> opinfo.Registered | None:
    """The decorated operator registered as ``op_type``, or None.

    Example:
        >>> import customop.registry
        >>> from customop import ops
        >>> customop.registry.lookup('ops.focal_loss') is ops.focal_loss
        True
    """
    return _OPS.get(op_type)


def op_types() -> list:
    """Every ``op_type`` registered through ``@customop`` in this process."""
    return sorted(_OPS)


def register(op: opinfo.Registered, named: bool) -> None:
    """Register ``op`` under its ``op_type``; a redefinition of the same function replaces it.

    ``named``: the user chose the name (``name=``), so a second function of the
    same qualified name is not suspected of being a different operator.
    """
    old = _OPS.get(op.op_type)
    same = old is not None and (old.fn.__module__, old.fn.__qualname__) == (
        op.fn.__module__,
        op.fn.__qualname__,
    )
    if old is not None and not same:
        raise ValueError(
            f"customop name {op.op_type!r} is already used by "
            f"{old.fn.__module__}.{old.fn.__qualname__}; pass a different name= to @customop"
        )
    if old is not None and not named and _distinct(old.fn, op.fn):
        raise errors.op_error(
            op.op_type,
            ValueError,
            (
                f"another function of the same name is already registered "
                f"({_made_by(old.fn)}; this one is {_made_by(op.fn)}); graphs, hybridized blocks "
                "and mx.nd.Custom find an op by its name and would run only the last one: pass "
                "name= to @customop to give each its own"
            ),
        )
    if old is None:
        prop.register(op.op_type, _OPS.__getitem__)
    _OPS[op.op_type] = op  # a redefinition (notebook re-run, reload) replaces the old one


def by_reference(op_type: str, module: str) -> opinfo.Registered:
    """The operator registered as ``op_type``, importing ``module`` first (unpickling)."""
    if op_type not in _OPS:
        importlib.import_module(module)
    try:
        return _OPS[op_type]
    except KeyError:
        raise errors.op_error(
            op_type,
            LookupError,
            (
                f"cannot unpickle the operator: importing {module!r} did not define it; define "
                "ops at module level (not inside a function or a notebook cell the receiving "
                "process never runs)"
            ),
        ) from None


def module_of(fn: Callable) -> str:
    """The module an operator's function belongs to, as every process names it.

    multiprocessing's spawn/forkserver children run the parent's main script as
    ``'__mp_main__'`` (also reachable as ``'__main__'``); its ops keep the parent's name.
    """
    module = getattr(fn, "__module__", None) or "__main__"
    return "__main__" if module == "__mp_main__" else module


def _distinct(old: Callable, new: Callable) -> bool:
    """Whether two same-named functions are different operators rather than a redefinition.

    A re-run notebook cell or a reloaded module compiles new code (or the same code in a new
    file): that replaces.  One factory called twice shares its code object, so only its
    closure and defaults can differ; two lambdas of one file differ by their line.
    """
    if old is new:
        return False
    a, b = old.__code__, new.__code__
    if a is b:
        return not (
            _same_values(old.__defaults__, new.__defaults__)
            and _same_values(old.__kwdefaults__, new.__kwdefaults__)
            and _same_values(
                [c.cell_contents for c in old.__closure__ or ()],
                [c.cell_contents for c in new.__closure__ or ()],
            )
        )
    return a.co_filename == b.co_filename and a.co_firstlineno != b.co_firstlineno


def _same_values(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_values(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_values(x, y) for x, y in zip(a, b))
    literal = (bool, int, float, complex, str, bytes, type(None))
    return type(a) is type(b) and isinstance(a, literal) and a == b


def _made_by(fn: Callable) -> str:
    code = fn.__code__
    return f"{fn.__qualname__} at {code.co_filename}:{code.co_firstlineno}"
