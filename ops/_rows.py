"""Row numbers from an array's shape: the one place the operators count rows to gather by.

An op that gathers from its data flattened (``take``) needs where each row starts; written
with this call's numbers (``b * N``), a traced graph would keep the batch it was traced at.
So while traced the rows are counted from the data's shape through operators
(``slice_axis``, ``arange_like``, ``reshape``), and the graph serves any batch size; on arrays
the starts are this call's numbers, cached (:func:`flat_rows` counts from this call's
numbers also while traced: its graph keeps its batch).  They are counted in float64:
``arange_like`` counts in its input's dtype, and float16 is exact only to 2048 (past 2048
rows it gave wrong picks), float32 only to 2**24; float64 is exact to 2**53.  Traced or not is asked
with ``mx.autograd.is_recording()`` (customop traces recording, pauses included), not
``customop.is_tracing()``, which would keep the calling op's ``Custom`` node.
"""

from __future__ import annotations

import functools

import mxnet as mx
import numpy as np

_CACHED_ROWS = 1 << 22  # more row starts than this are made per call, not held


def index_along(x, axis):
    """``[0, 1, ..., x.shape[axis] - 1]`` (float64, 1-D), counted from ``x``'s shape."""
    axis = axis % x.ndim
    line = x
    for other in range(x.ndim):  # one line of x, so that only it is copied to float64
        if other != axis:
            line = mx.nd.slice_axis(line, axis=other, begin=0, end=1)
    return mx.nd.contrib.arange_like(line.astype("float64"), axis=axis)


def row_starts(x):
    """Where each row of ``x`` (along its last axis, length L) starts in ``x`` flattened:
    ``[[0], [L], [2 L], ...]`` (int64) of shape ``x.shape[:-1] + (1,)``.  Never write it."""
    if not mx.autograd.is_recording():
        rows = int(np.prod(x.shape[:-1]))
        make = _cached_starts if rows <= _CACHED_ROWS else _starts
        return make(tuple(x.shape), x.context)
    column = mx.nd.slice_axis(x, axis=-1, begin=0, end=1).astype("float64")
    row = mx.nd.contrib.arange_like(column).astype("int64")  # 0, 1, 2, ... in column's shape
    length = mx.nd.max(index_along(x, -1)).astype("int64") + 1
    return mx.nd.broadcast_mul(row, length.reshape((1,) * x.ndim))


def flat_rows(index, data):
    """``index[b, n] + b M`` (float64, flat ``(B N,)``): where row ``index[b, n]`` of
    ``data[b]`` (``data`` of shape ``(B, M, ...)``) sits in ``data`` reshaped to
    ``(B M, ...)``.  Counted from this call's numbers ``B``, ``M`` also while traced, so a
    graph keeps them (``box_encode``'s ``legacy_box`` gather)."""
    b, m = data.shape[:2]
    offsets = (mx.nd.arange(b, ctx=data.context, dtype="float64") * m).reshape((b, 1))
    return mx.nd.broadcast_add(index.astype("float64"), offsets).reshape((-1,))


def _starts(shape, context):
    lead = shape[:-1]
    starts = np.arange(int(np.prod(lead)), dtype=np.int64).reshape(lead + (1,)) * shape[-1]
    return mx.nd.array(starts, context, dtype="int64")


# Making these costs as much as another pass over the data: keep a few small ones.
_cached_starts = functools.lru_cache(maxsize=16)(_starts)
