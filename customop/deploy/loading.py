"""Loading saved graphs: import the module behind every ``Custom`` node first.

A symbol file stores each custom node as ``op: "Custom"`` with its ``op_type``;
MXNet can only load it once the op is registered, and otherwise fails deep
inside ``bind`` with ``Cannot find custom operator`` (MXNet issue #8801).  Our
``op_type`` is ``"<module>.<qualname>"``, so the module can be found and
imported before MXNet looks.
"""
from __future__ import annotations

import importlib
from typing import Any

import mxnet as mx

from .. import registry
from ..graphs.graph_json import custom_op_types


def ensure_registered(op_types: list[str], source: str) -> None:
    """Import the module that defines each ``op_type``; raise naming any that cannot be found.

    An ``op_type`` without a module part (``"myop"``, as ops registered by hand
    with ``mx.operator.register`` are often named), or whose module imports
    cleanly, is left for MXNet to find; except in the operator library (``ops.``),
    which registers every op type it has when imported: one it lacks is named.
    """
    missing, unknown = [], []
    for op_type in op_types:
        if registry.lookup(op_type) is not None or "." not in op_type:
            continue
        tried = _import_defining_module(op_type)
        if registry.lookup(op_type) is not None:
            continue
        if not any(ok for _, ok in tried):
            missing.append((op_type, [m for m, _ in tried]))
        elif op_type.split(".")[0] in _HOMES:
            unknown.append(op_type)
    if unknown:
        home = _HOMES[unknown[0].split(".")[0]]
        raise RuntimeError(
            f"customop: {source} uses op type(s) {', '.join(map(repr, unknown))}, which the "
            f"operator library ({home}) does not define: its op types are pinned (docs/"
            "operators.md, 'Retired op types'). A renamed one is listed there with its new op "
            "type; replace it in the symbol file.")
    if missing:
        lines = [f"  {t!r}: no importable module among {', '.join(map(repr, m)) or '-'}"
                 for t, m in missing]
        raise RuntimeError(
            f"customop: {source} uses custom operator(s) that are not registered, and the "
            "module named in their op_type cannot be imported:\n" + "\n".join(lines)
            + "\nMake the module importable (PYTHONPATH) or import it before loading; an op "
              "defined in a script is registered as '__main__.<name>' and must be defined "
              "there again before loading.")


def imports(symbol_file: str, input_names: str | list[str],
            param_file: str | None = None,
            ctx: Any = None, **kwargs: Any) -> mx.gluon.SymbolBlock:
    """``gluon.SymbolBlock.imports`` that first imports the modules defining its custom ops.

    Example:
        >>> import customop
        >>> net = customop.imports('model-symbol.json', ['data'],
        ...                        'model-0000.params')  # doctest: +SKIP
    """
    with open(symbol_file, encoding="utf-8") as f:
        ensure_registered(custom_op_types(f.read()), repr(symbol_file))
    return mx.gluon.SymbolBlock.imports(symbol_file, input_names, param_file, ctx, **kwargs)


def load_checkpoint(prefix: str, epoch: int) -> tuple[mx.sym.Symbol, dict, dict]:
    """``mx.model.load_checkpoint`` that first imports the modules defining its custom ops.

    Returns ``(symbol, arg_params, aux_params)``.

    Example:
        >>> import customop
        >>> sym, args, auxs = customop.load_checkpoint('model', 1)  # doctest: +SKIP
    """
    symbol_file = f"{prefix}-symbol.json"
    with open(symbol_file, encoding="utf-8") as f:
        ensure_registered(custom_op_types(f.read()), repr(symbol_file))
    return mx.model.load_checkpoint(prefix, epoch)


# Where an op_type's first part is installed: the operator library's op types are
# 'ops.<name>', and a wheel installs it as customop.ops (a top-level 'ops' may be Canonical's).
_HOMES = {"ops": "customop.ops"}


def _import_defining_module(op_type: str) -> list[tuple[str, bool]]:
    """Import the longest importable dotted prefix of op_type; [(module, imported)]."""
    parts = op_type.split(".")
    tried = []
    for k in range(len(parts) - 1, 0, -1):
        module = ".".join(parts[:k])
        if module in ("__main__", "__mp_main__"):
            tried.append((module, False))
            break
        candidates = [module]
        if parts[0] in _HOMES:
            candidates.insert(0, ".".join([_HOMES[parts[0]], *parts[1:k]]))
        for candidate in candidates:
            try:
                importlib.import_module(candidate)
            except ImportError:
                tried.append((candidate, False))
                continue
            tried.append((candidate, True))
            if registry.lookup(op_type) is not None:
                return tried
    return tried
