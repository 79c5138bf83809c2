"""What code an operator's trace ran, as one digest: a saved verdict's key changes with it.

A verdict saved on disk (:mod:`customop.graphs.verdict_files`) holds for the code that was
checked, so its key names that code: every Python function the first recording called
(collected with :func:`sys.settrace` on the trace thread while it runs, :class:`Calls`),
the functions the operator names (its forward, its gradient closures' makers), and, read
statically from each function's bytecode, the functions, modules' functions and simple
constants (numbers, strings, arrays, tuples of them) its global names stand for, through
every function reached that way.  Each function counts by its code: bytecode, constants
(nested functions' code included), names, defaults and closure cells.  MXNet, NumPy,
customop itself and the standard library are named by their versions and customop's source
instead (:func:`customop_source`).  What Python hides from such a reading (mutable objects a
global names, a method called only at other values) is not in the digest: set
``CUSTOMOP_VERDICT_CACHE`` empty to turn saved verdicts off.

Example:
    >>> from customop.graphs import code_hash
    >>> def double(x):
    ...     return 2 * x
    >>> def triple(x):
    ...     return 3 * x
    >>> code_hash.digest([], [double]) == code_hash.digest([], [triple])
    False
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
import sysconfig
import types
from collections.abc import Iterable
from typing import Any

import numpy as np

from . import verdict_files

# Modules named by version or by customop's source (their code is not read function by
# function); and the standard library, by Python's version.
_NAMED = ("mxnet", "numpy", "customop")
_STDLIB = tuple({os.path.normcase(sysconfig.get_paths()[k]) for k in ("stdlib", "platstdlib")})
LIMIT = 4000  # functions read at most; past it the code is not keyed (no saved verdict)
_SIMPLE = (int, float, complex, str, bytes, bool, type(None), np.generic)


class Calls:
    """The code objects (and their globals) Python functions run on this thread while the
    block runs; ``ok`` is False when they were not wanted, or when another tracer (a
    debugger, coverage) was in place, which is left as it was (the calls are then not
    known)."""

    def __init__(self, wanted: bool = True) -> None:
        self.seen: dict[int, tuple[types.CodeType, dict]] = {}
        self.ok = wanted  # (not wanted: nothing is traced, at no cost)

    def _tracer(self, frame, event, arg):  # noqa: ANN001 - sys.settrace's signature
        code = frame.f_code
        if id(code) not in self.seen:
            self.seen[id(code)] = (code, frame.f_globals)
        return None  # no line events

    def __enter__(self) -> Calls:
        if sys.gettrace() is not None:
            self.ok = False
        elif self.ok:
            sys.settrace(self._tracer)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.ok:
            sys.settrace(None)

    def codes(self) -> list[tuple[types.CodeType, dict]]:
        return list(self.seen.values())


def digest(ran: Iterable[tuple[types.CodeType, dict]], roots: Iterable[Any]) -> str | None:
    """The digest of the code ``ran`` and ``roots`` (functions) stand for, and of what their
    global names reach; None when it cannot be read within :data:`LIMIT` functions."""
    work: list[tuple[types.CodeType, dict]] = []
    parts: dict[str, str] = {}
    for fn in roots:
        _function(fn, "root", parts, work)
    work.extend(ran)
    done: set[int] = set()
    while work:
        code, globs = work.pop()
        if id(code) in done or _named(code, globs):
            continue
        done.add(id(code))
        if len(done) > LIMIT:
            return None
        where = f"{globs.get('__name__')}:{getattr(code, 'co_qualname', code.co_name)}"
        parts[f"code {where}:{code.co_firstlineno}"] = _code_text(code)
        for name in _names(code):
            if name not in globs:
                continue
            value = globs[name]
            if isinstance(value, types.ModuleType):
                parts[f"{where} {name}"] = f"module {value.__name__}"
                if value.__name__.split(".")[0] in _NAMED:
                    continue
                for attr in _names(code):
                    inner = getattr(value, attr, None)
                    if inner is not None and not isinstance(inner, types.ModuleType):
                        _value(inner, f"{where} {name}.{attr}", parts, work)
            else:
                _value(value, f"{where} {name}", parts, work)
    text = "\n".join(f"{k}={parts[k]}" for k in sorted(parts))
    return hashlib.sha256(text.encode("utf-8", "backslashreplace")).hexdigest()


_source: list[str | None] = []


def customop_source() -> str | None:
    """The digest of customop's own source (its core, graphs, runtime and operator library),
    read once per process: the code that traces, builds and checks graphs; None when it
    cannot be told (then no verdict is read or saved): a file is missing, unreadable, or
    changed after this process imported customop (a checkout while it runs: the code in
    memory is not the files').

    A process that finds every file with the size and modification time an earlier process
    read (what Python's own bytecode cache trusts) takes that process's digest from the
    verdict files (:mod:`customop.graphs.verdict_files`): a stat a file instead of reading
    it.
    """
    if not _source:
        _source.append(_source_digest())
    return _source[0]


def source_known() -> bool:
    """Whether :func:`customop_source` was read in this process (a call costs nothing now)."""
    return bool(_source)


def _source_digest() -> str | None:
    try:
        files = [
            os.path.join(folder, name)
            for folder in source_folders()
            for name in sorted(os.listdir(folder))
            if name.endswith(".py")
        ]
        stamps = _stamps(files)
        if any(when > _imported_ns() for _, _, when in stamps):
            return None  # changed since the import: the code in memory may be the old one
        key = json.dumps(["customop source", stamps])
        saved = verdict_files.load(key)
        digest = saved.get("digest") if saved is not None else None
        if not isinstance(digest, str):
            digest = _read_digest(files)
            if json.dumps(["customop source", _stamps(files)]) == key:  # none changed meanwhile
                verdict_files.save(key, {"digest": digest})
        return digest
    except OSError:  # a file gone or unreadable (a checkout under way): no digest
        return None


def _imported_ns() -> int:
    return sys.modules["customop"]._imported_ns


def _stamps(files: list[str]) -> list[list]:
    stamps = []
    for path in files:
        info = os.stat(path)
        stamps.append([path, info.st_size, info.st_mtime_ns])
    return stamps


def _read_digest(files: list[str]) -> str:
    h = hashlib.sha256()
    for path in files:
        with open(path, "rb") as f:
            h.update(os.path.basename(path).encode() + b"\0" + f.read() + b"\0")
    return h.hexdigest()


def source_folders() -> list[str]:
    """The folders :func:`customop_source` reads: customop's core, ``graphs/`` and
    ``runtime/``, and the operator library (``customop.ops``)."""
    base = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    folders = [base, *(os.path.join(base, k) for k in ("graphs", "runtime"))]
    imported = sys.modules.get("customop.ops")  # (else found, not imported: 0.1 ms)
    if imported is not None and getattr(imported, "__path__", None) is not None:
        return folders + list(imported.__path__)
    library = importlib.util.find_spec("customop.ops")
    return folders + list((library and library.submodule_search_locations) or ())


def _named(code: types.CodeType, globs: dict) -> bool:
    module = str(globs.get("__name__") or "").split(".")[0]
    path = os.path.normcase(code.co_filename)
    if module in _NAMED and (module != "customop" or os.path.isabs(path)):
        return True  # (customop's own: read from its files; a doctest's code is read here)
    if path.startswith("<frozen"):
        return True
    # (site-packages may sit inside the standard library's folder, as in python.org's,
    # Docker's and conda's layouts: what is installed there is read, never named)
    return any(path.startswith(p) for p in _STDLIB) and not _installed(path)


def _installed(path: str) -> bool:
    if not _SITE:
        _SITE.extend(site_folders())
    parts = path.split(os.sep)
    return "site-packages" in parts or "dist-packages" in parts or path.startswith(tuple(_SITE))


_SITE: list[str] = []


def site_folders() -> list[str]:
    """The folders packages are installed in (never the standard library's, even inside it)."""
    import site

    found = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    try:
        found.update(site.getsitepackages())
    except AttributeError:  # (a virtualenv's old site module)
        pass
    try:
        found.add(site.getusersitepackages())
    except AttributeError:
        pass
    return sorted({os.path.normcase(os.path.join(f, "")) for f in found if f})


def _names(code: types.CodeType) -> list[str]:
    out = list(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out.extend(_names(c))
    return out


def _code_text(code: types.CodeType) -> str:
    consts = [
        _code_text(c) if isinstance(c, types.CodeType) else simple(c) or type(c).__name__
        for c in code.co_consts
    ]
    return repr(
        (
            code.co_code.hex(),
            consts,
            code.co_names,
            code.co_varnames,
            code.co_freevars,
            code.co_argcount,
            code.co_kwonlyargcount,
            code.co_flags,
        )
    )


def simple(value: Any) -> str:
    """The text of a constant whose value the digest holds ("" for other objects)."""
    if isinstance(value, _SIMPLE):
        return f"{type(value).__name__}:{value!r}"
    if isinstance(value, (tuple, frozenset)) and len(value) <= 64:
        items = [simple(v) for v in value]
        return repr(items) if all(items) else ""
    if isinstance(value, np.ndarray) and value.nbytes <= 1 << 20:
        data = hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest()
        return f"array {value.dtype} {value.shape} {data}"
    return ""


def _value(value: Any, where: str, parts: dict, work: list) -> None:
    text = simple(value)
    if text:
        parts[where] = text
    elif isinstance(value, (types.FunctionType, types.MethodType)) or callable(
        getattr(value, "__wrapped__", None)
    ):
        _function(value, where, parts, work)
    elif isinstance(value, type):
        parts[where] = f"class {value.__module__}.{value.__qualname__}"
        if value.__module__.split(".")[0] not in _NAMED:
            for name, member in sorted(vars(value).items()):
                if isinstance(member, (types.FunctionType, staticmethod, classmethod)):
                    _function(getattr(member, "__func__", member), f"{where}.{name}", parts, work)
    else:
        parts[where] = f"object {type(value).__module__}.{type(value).__qualname__}"


def _function(fn: Any, where: str, parts: dict, work: list) -> None:
    fn = getattr(fn, "__func__", fn)  # a bound method: its function
    while isinstance(getattr(fn, "__wrapped__", None), types.FunctionType) and not isinstance(
        fn, types.FunctionType
    ):
        fn = fn.__wrapped__
    if not isinstance(fn, types.FunctionType):
        parts[where] = f"callable {type(fn).__module__}.{type(fn).__qualname__}"
        return
    work.append((fn.__code__, fn.__globals__))
    for k, v in enumerate(fn.__defaults__ or ()):
        _value(v, f"{where} default {k}", parts, work)
    for k, v in sorted((fn.__kwdefaults__ or {}).items()):
        _value(v, f"{where} default {k}", parts, work)
    for k, cell in enumerate(fn.__closure__ or ()):
        try:
            v = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        _value(v, f"{where} cell {k}", parts, work)
