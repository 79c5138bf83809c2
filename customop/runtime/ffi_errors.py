"""The ``errors`` patch: our callbacks' failures reach whoever reads their arrays, named.

Off-switch: ``CUSTOMOP_RUNTIME_OFF=errors``; installed by the first call of a decorated
op or the first graph that holds one.

Wraps ``mxnet.base.get_last_ffi_error`` (and its copy in the ctypes FFI
module), the one function through which MXNet's C errors reach Python.  A
callback of ours that fails on MXNet's worker thread makes the arrays it
should have written fail (``errors.poison``) and returns success, so the
failure reaches whoever reads those arrays and nobody else (MXNet's own
CustomOp error slot is one per process: measured, it handed our failure to a
hand-written op's caller, or lost it, in interleaved runs).  The wrapper
raises our exception, with its own type and message, for that read in place
of MXNet's text for the poisoned array; only failures queued for the reading
thread are handed out.  When nothing could be poisoned (0-size outputs,
NaiveEngine), the callback raises as before and the wrapper replaces MXNet's
bare ``MXNetError: Check failed: ...callbacks[kCustomOpForward]``; for that
case it also replaces ``print`` inside ``mxnet.operator`` and
``mxnet.autograd`` so that MXNet does not also dump the traceback of *our*
failures to stdout (everyone else's callback failures still print, and keep
MXNet's error).  Measured: without it every forward error in a graph reads
as one ``MXNetError`` whose text names no operator.
"""

from __future__ import annotations

import sys

import mxnet as mx

from .. import errors

_original_ffi_error = None


def _get_last_ffi_error():
    return errors.swap_in(_original_ffi_error())


def _print(*args, **kwargs):
    # Stands in for print() inside mxnet.operator / mxnet.autograd, whose callbacks print
    # "Error in ...: <traceback>" from within their except blocks.
    exc = sys.exc_info()[1]
    if exc is not None and args and str(args[0]).startswith("Error in "):
        if errors.is_ours(exc):
            return  # ours: the caller gets it, named, once
        named = errors.foreign_failure(str(args[0]), exc, sys._getframe(1).f_locals)
        errors.report_foreign(named)
        if named is not None:
            return  # its reader gets one exception naming the op, this one as its cause
    print(*args, **kwargs)


def install() -> None:
    global _original_ffi_error
    _original_ffi_error = mx.base.get_last_ffi_error
    mx.base.get_last_ffi_error = _get_last_ffi_error
    mx.operator.print = _print
    mx.autograd.print = _print
    try:
        from mxnet._ffi._ctypes import function as ffi_function
    except ImportError:  # pragma: no cover - built without the ctypes FFI
        return
    ffi_function.get_last_ffi_error = _get_last_ffi_error
