"""Loading saved graphs: only the code the caller chose registers the ``Custom`` nodes' ops.

A symbol file stores each custom node as ``op: "Custom"`` with its ``op_type``;
MXNet can only load it once the op is registered, and otherwise fails deep
inside ``bind`` with ``Cannot find custom operator`` (MXNet issue #8801).  Our
``op_type`` is ``"<module>.<qualname>"``, so the module can be named before MXNet
looks.  A model file is data, so the file never chooses what is imported: an
op's module must be imported already, be the operator library (``customop.ops``),
or be named by the caller (``modules=``); ``trust_op_modules=True`` is the
caller's explicit opt-in to import whatever module the file names (see
docs/security.md).
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any, Iterable

import mxnet as mx

from .. import registry
from ..symbol_json import custom_op_types

# Where an op_type's first part is installed: the operator library's op types are
# 'ops.<name>', and a wheel installs it as customop.ops (a top-level 'ops' may be Canonical's,
# or a file beside the model: it is never imported for a library op type unless trusted).
_HOMES = {"ops": "customop.ops"}
_SCRIPTS = ("__main__", "__mp_main__")


class UntrustedModuleError(ImportError):
    """A saved graph names an op whose module the caller did not choose; it was not imported.

    ``name`` is the first such module, ``path`` its file (where one was found).
    """


def ensure_registered(
    op_types: list[str],
    source: str,
    modules: Any = (),
    trust_op_modules: bool = False,
    caller: str = "customop.imports",
) -> None:
    """Register each ``op_type`` from code the caller chose; raise naming any that is not.

    ``modules`` (names or module objects) are imported first.  Then an op type that
    is still not registered is looked up without running code: the operator
    library's (``ops.``) imports ``customop.ops``; any other module is imported only
    with ``trust_op_modules=True``, and otherwise raises
    :class:`UntrustedModuleError`.  An ``op_type`` without a module part (``"myop"``,
    as ops registered by hand with ``mx.operator.register`` are often named), or
    whose module is imported already, is left for MXNet to find.
    """
    for name in _module_names(modules, caller):  # module objects are imported already
        importlib.import_module(name)
    missing, unknown, refused = [], [], []
    for op_type in op_types:
        if registry.lookup(op_type) is not None or "." not in op_type:
            continue
        home = _HOMES.get(op_type.split(".")[0])
        if trust_op_modules:
            tried = _import_defining_module(op_type)
            if registry.lookup(op_type) is not None:
                continue
            if not any(ok for _, ok in tried):
                missing.append((op_type, [m for m, _ in tried]))
            elif home is not None:
                unknown.append(op_type)
            continue
        if home is not None:
            importlib.import_module(home)  # registers every op type the library has
            if registry.lookup(op_type) is None:
                unknown.append(op_type)
            continue
        module, origin = _locate(op_type)
        if module is None or module in _SCRIPTS:
            missing.append((op_type, _prefixes(op_type)))
        elif module not in sys.modules:
            refused.append((op_type, module, origin))
        # else: imported, and the op is not ours (mx.operator.register): MXNet's to find
    if refused:
        lines = [f"  op type {t!r}: module {m!r}" + (f" ({o})" if o else "") for t, m, o in refused]
        names = sorted({m for _, m, _ in refused})
        raise UntrustedModuleError(
            f"{caller}: {source} names custom operators whose module was NOT imported: a "
            "model file does not choose which code runs.\n"
            + "\n".join(lines)
            + f"\nIf you trust that code, import it before loading, or pass modules={names!r} "
            f"to {caller}; trust_op_modules=True imports whatever module the file names "
            "(customop's docs, 'Security').",
            name=refused[0][1],
            path=refused[0][2],
        )
    if unknown:
        home = _HOMES[unknown[0].split(".")[0]]
        raise RuntimeError(
            f"customop: {source} uses op type(s) {', '.join(map(repr, unknown))}, which the "
            f"operator library ({home}) does not define: its op types are pinned (docs/"
            "operators.md, 'Retired op types'). A renamed one is listed there with its new op "
            "type; replace it in the symbol file."
        )
    if missing:
        found = "importable" if trust_op_modules else "imported or found"
        lines = [
            f"  {t!r}: no {found} module among {', '.join(map(repr, m)) or '-'}" for t, m in missing
        ]
        raise RuntimeError(
            f"customop: {source} uses custom operator(s) that are not registered, and the "
            "module named in their op_type cannot be found:\n"
            + "\n".join(lines)
            + "\nImport the module that defines them before loading (or name it in "
            "modules=); an op defined in a script is registered as '__main__.<name>' and "
            "must be defined there again before loading."
        )


def imports(
    symbol_file: str,
    input_names: str | list[str],
    param_file: str | None = None,
    ctx: Any = None,
    *,
    modules: Any = (),
    trust_op_modules: bool = False,
    **kwargs: Any,
) -> mx.gluon.SymbolBlock:
    """``gluon.SymbolBlock.imports`` that first registers its custom ops from code you chose.

    The ops of the operator library (``customop.ops``) and of modules already
    imported load as they are.  Any other module is imported only when you name it:
    ``modules=['my_ops']`` (names or module objects, imported first), or
    ``trust_op_modules=True`` to import the module each ``Custom`` node's op type
    names, as earlier versions of customop did (only for files you trust: importing
    a module runs its code).  A module the file names but you did not choose raises
    :class:`UntrustedModuleError`, naming the op type and the module, before
    anything is imported.

    Example:
        >>> import customop
        >>> net = customop.imports('model-symbol.json', ['data'],
        ...                        'model-0000.params')  # doctest: +SKIP
        >>> net = customop.imports('model-symbol.json', ['data'], 'model-0000.params',
        ...                        modules=['my_ops'])  # doctest: +SKIP
    """
    _register_file(symbol_file, modules, trust_op_modules, "customop.imports")
    return mx.gluon.SymbolBlock.imports(symbol_file, input_names, param_file, ctx, **kwargs)


def load_checkpoint(
    prefix: str, epoch: int, *, modules: Any = (), trust_op_modules: bool = False
) -> tuple[mx.sym.Symbol, dict, dict]:
    """``mx.model.load_checkpoint`` that first registers its custom ops from code you chose.

    Returns ``(symbol, arg_params, aux_params)``.  ``modules`` and
    ``trust_op_modules`` as in :func:`imports`.

    Example:
        >>> import customop
        >>> sym, args, auxs = customop.load_checkpoint('model', 1)  # doctest: +SKIP
        >>> sym, args, auxs = customop.load_checkpoint('model', 1,
        ...                                            modules=['my_ops'])  # doctest: +SKIP
    """
    _register_file(f"{prefix}-symbol.json", modules, trust_op_modules, "customop.load_checkpoint")
    return mx.model.load_checkpoint(prefix, epoch)


def _register_file(symbol_file: str, modules: Any, trust_op_modules: bool, caller: str) -> None:
    with open(symbol_file, encoding="utf-8") as f:
        ensure_registered(
            custom_op_types(f.read()), repr(symbol_file), modules, trust_op_modules, caller
        )


def _module_names(modules: Any, caller: str) -> list[str]:
    if modules is None:
        return []
    if isinstance(modules, (str, types.ModuleType)):
        modules = [modules]
    names = []
    for module in _iterable(modules, caller):
        if isinstance(module, types.ModuleType):
            continue
        if isinstance(module, str) and module:
            names.append(module)
        else:
            raise TypeError(
                f"{caller}: modules must hold module names (str) or modules, got {module!r}"
            )
    return names


def _iterable(modules: Any, caller: str) -> Iterable:
    try:
        return list(modules)
    except TypeError:
        raise TypeError(
            f"{caller}: modules must be a list of module names (str) or modules, got {modules!r}"
        ) from None


def _prefixes(op_type: str) -> list[str]:
    parts = op_type.split(".")
    return [".".join(parts[:k]) for k in range(len(parts) - 1, 0, -1)]


def _locate(op_type: str) -> tuple[str | None, str | None]:
    """(module, its file) of the longest dotted prefix of op_type that is a module.

    Found by the import system's finders only: no module's code runs (``find_spec`` of
    ``a.b`` would import ``a``; here ``a``'s search path is read from its spec).
    """
    parts = op_type.split(".")
    found: tuple[str | None, str | None] = (None, None)
    path = None  # where the next part is looked for; None: sys.path
    for k in range(1, len(parts)):
        if not parts[k - 1].isidentifier():  # no module has that name ('', '/x', '..')
            break
        name = ".".join(parts[:k])
        if name in sys.modules:
            module = sys.modules[name]
            origin = getattr(module, "__file__", None)
            path = getattr(module, "__path__", None)
        else:
            spec = _find_spec(name, path)
            if spec is None:
                break
            origin = spec.origin if spec.has_location else None
            path = spec.submodule_search_locations
        found = (name, origin)
        if path is None:  # a module, not a package: the rest is a qualified name
            break
    return found


def _find_spec(name: str, path: Any) -> Any:
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        try:
            spec = find(name, path)
        except (ImportError, ValueError):
            continue
        if spec is not None:
            return spec
    return None


def _import_defining_module(op_type: str) -> list[tuple[str, bool]]:
    """Import the longest importable dotted prefix of op_type; [(module, imported)].

    Only with ``trust_op_modules=True``: the file chooses what is imported.
    """
    parts = op_type.split(".")
    tried = []
    for k in range(len(parts) - 1, 0, -1):
        module = ".".join(parts[:k])
        if not all(p.isidentifier() for p in parts[:k]):
            tried.append((module, False))
            continue
        if module in _SCRIPTS:
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
