"""Errors that name the operator, and getting them out of MXNet's worker threads.

MXNet runs CustomOp ``forward``/``backward`` (and ``autograd.Function``
backward) on worker threads; an exception there becomes a bare ``MXNetError:
Check failed: ...callbacks[kCustomOp...]`` at the next synchronisation point.
We keep the real exception and hand it back at that point by wrapping
``mxnet.base.get_last_ffi_error``, the one function through which every MXNet
C API error reaches Python.
"""
from __future__ import annotations

import threading
from collections import deque

import mxnet as mx

_pending: deque[BaseException] = deque(maxlen=16)
_lock = threading.Lock()
_CALLBACK_FAILURES = ("params.info->callbacks[", "callbacks[kCustom", "CustomFunctionBwdFunc")


def named(exc: BaseException, op: str, where: str) -> BaseException:
    """Return an exception of ``exc``'s type whose message names op and place.

    Exceptions we raise ourselves already name the operator and are returned as is.
    """
    if getattr(exc, "_customop_named", False):
        return exc
    detail = str(exc.args[0]) if len(exc.args) == 1 else str(exc)
    msg = f"customop {op!r} ({where}): {type(exc).__name__}: {detail}"
    try:
        new = type(exc)(msg)
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


def stash(exc: BaseException) -> None:
    """Remember an exception raised on an MXNet worker thread."""
    with _lock:
        _pending.append(exc)


def clear() -> None:
    with _lock:
        _pending.clear()


def _take() -> BaseException | None:
    # Newest first: an older entry is one whose MXNetError was never read.
    with _lock:
        return _pending.pop() if _pending else None


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
    try:
        from mxnet._ffi._ctypes import function as _ffi_function
    except ImportError:  # pragma: no cover - built without the ctypes FFI
        return
    _ffi_function.get_last_ffi_error = _get_last_ffi_error
