"""Errors that name the operator, and getting them out of MXNet's worker threads.

MXNet runs CustomOp ``forward``/``backward`` (and ``autograd.Function``
backward) on worker threads; an exception there becomes a bare ``MXNetError:
Check failed: ...callbacks[kCustomOp...]`` at the next synchronisation point.
We keep the real exception and hand it back at that point by wrapping
``mxnet.base.get_last_ffi_error``, the one function through which every MXNet
C API error reaches Python.

MXNet's Python callbacks also print a traceback of every such failure
(``Error in CustomOp.forward: ...``).  For our exceptions that text is
dropped (the user sees ours once); a failure of someone else's ``CustomOp`` or
``autograd.Function`` still prints, and leaves a marker in the queue so that
its ``MXNetError`` is not swapped for one of our older, unread exceptions.
An MXNet operator failing inside an ``'mxnet'``-mode forward is reported as a
``ValueError`` (MXNet's text kept), as NumPy's errors are in ``'numpy'`` mode:
one type for one mistake (and ``simple_bind`` does not rewrap it).
"""
from __future__ import annotations

import builtins
import sys
import threading
from collections import deque

import mxnet as mx

_FOREIGN = object()  # a failure of a callback that is not ours: MXNet's error stands
# (thread that will read it, exception or _FOREIGN), oldest first
_pending: deque[tuple[int | None, BaseException | object]] = deque(maxlen=32)
_lock = threading.Lock()
_CALLBACK_FAILURES = ("params.info->callbacks[", "callbacks[kCustom", "CustomFunctionBwdFunc")


def named(exc: BaseException, op: str, where: str) -> BaseException:
    """Return an exception of ``exc``'s type whose message names op and place.

    Exceptions we raise ourselves already name the operator and are returned as is.
    """
    if getattr(exc, "_customop_named", False):
        return exc
    detail = str(exc.args[0]) if len(exc.args) == 1 else str(exc)
    cls = type(exc)
    if isinstance(exc, mx.base.MXNetError):
        cls = ValueError  # an MXNet operator refused the values or shapes it was given
        lines = [ln for ln in detail.strip().splitlines() if ln.strip()]
        detail = lines[-1] if lines else detail
    msg = f"customop {op!r} ({where}): {type(exc).__name__}: {detail}"
    try:
        new = cls(msg)
    except Exception:
        exc.add_note(f"raised in customop {op!r} ({where})")
        new = exc
    else:
        new.__cause__ = exc
        new.__traceback__ = exc.__traceback__
    new._customop_named = True
    return new


def mark(exc: BaseException) -> BaseException:
    exc._customop_named = True
    return exc


class Call:
    """One imperative ``mx.nd.Custom`` call: where its forward leaves its own failure."""

    __slots__ = ("failure",)

    def __init__(self):
        self.failure: BaseException | None = None


calls = threading.local()  # .current: the Call being made on this thread, if any


def stash(exc: BaseException, reader: int | None = None) -> None:
    """Remember an exception raised in an MXNet callback, for the thread that will read it.

    ``reader``: the thread that bound or recorded the failing op (default: this one,
    right for callbacks MXNet makes synchronously, such as shape inference).
    """
    with _lock:
        _pending.append((threading.get_ident() if reader is None else reader, exc))


def clear() -> None:
    with _lock:
        _pending.clear()


def _take() -> BaseException | None:
    # This thread's newest entry (an older one is an error nobody read); another thread's
    # exceptions are never handed out here, and a foreign marker leaves MXNet's error.
    me = threading.get_ident()
    with _lock:
        for i in range(len(_pending) - 1, -1, -1):
            reader, entry = _pending[i]
            if entry is _FOREIGN or reader == me:
                del _pending[i]
                return None if entry is _FOREIGN else entry
    return None


def _print(*args, **kwargs):
    # Stands in for print() inside mxnet.operator / mxnet.autograd, whose callbacks print
    # "Error in ...: <traceback>" from within their except blocks.
    exc = sys.exc_info()[1]
    if exc is not None and args and str(args[0]).startswith("Error in "):
        if getattr(exc, "_customop_named", False):
            return  # ours: the caller gets it, named, once
        with _lock:
            _pending.append((None, _FOREIGN))
    builtins.print(*args, **kwargs)


_original = mx.base.get_last_ffi_error


def _get_last_ffi_error():
    err = _original()
    if isinstance(err, mx.base.MXNetError) and any(s in str(err) for s in _CALLBACK_FAILURES):
        real = _take()
        if real is not None:
            real.__context__ = err
            return real
    return err


def install() -> None:
    """Route worker-thread exceptions from our ops back to the caller (idempotent)."""
    mx.base.get_last_ffi_error = _get_last_ffi_error
    mx.operator.print = _print
    mx.autograd.print = _print
    try:
        from mxnet._ffi._ctypes import function as _ffi_function
    except ImportError:  # pragma: no cover - built without the ctypes FFI
        return
    _ffi_function.get_last_ffi_error = _get_last_ffi_error
