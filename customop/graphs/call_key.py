"""An NDArray call's input signature, read with two C calls an array.

The per-call key of the graphs that run a call's inputs (a hybridized block's inlined
``CachedOp`` in :mod:`customop.graphs.inline`, an imperative call's native graph in
:mod:`customop.graphs.imperative`): half what ``.shape`` and ``.dtype`` cost.
"""

from __future__ import annotations

import ctypes
import threading

from mxnet.base import _LIB

_buffers = threading.local()  # .out: this thread's ctypes out-parameters
_get_shape, _get_dtype = _LIB.MXNDArrayGetShapeEx, _LIB.MXNDArrayGetDType


def signature(args, which) -> tuple:
    """``((shape, dtype code), ...)`` of ``args[i]`` for ``i`` in ``which``."""
    out = getattr(_buffers, "out", None)
    if out is None:
        ndim, dims, dtype = ctypes.c_int(), ctypes.POINTER(ctypes.c_int)(), ctypes.c_int()
        out = _buffers.out = (
            ndim,
            dims,
            dtype,
            ctypes.byref(ndim),
            ctypes.byref(dims),
            ctypes.byref(dtype),
        )
    ndim, dims, dtype, ndim_ref, dims_ref, dtype_ref = out
    key = []
    for i in which:
        handle = args[i].handle
        _get_shape(handle, ndim_ref, dims_ref)
        _get_dtype(handle, dtype_ref)
        key.append((tuple(dims[: ndim.value]), dtype.value))
    return tuple(key)
