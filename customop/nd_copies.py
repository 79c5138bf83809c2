"""NDArrays made from NumPy values without waiting for MXNet's engine: :func:`ndarray`.

``mx.nd.array(value)`` copies synchronously: it pushes a write to MXNet's engine and waits
for the engine's thread, and a first run's checks of a model's graphs make hundreds of them
(measured: docs/design.md).  :func:`ndarray` copies the value in NumPy and hands MXNet that
copy (``mx.nd.from_numpy`` with ``zero_copy``: MXNet keeps the copy alive until it frees
the array), so the values are the same bytes and nothing waits.  Where MXNet cannot take the
copy (another device, a dtype outside its DLPack table, no elements, no axes) it is
``mx.nd.array``.
"""

from __future__ import annotations

import mxnet as mx
import numpy as np

# the dtypes whose DLPack code MXNet 1.9.1 reads back as themselves (its table also lists
# bool as 1 bit, and unsigned widths MXNet's NDArray has no type for)
_TAKEN = frozenset({"float16", "float32", "float64", "int32", "int64", "uint8"})


def ndarray(value: np.ndarray, ctx: mx.Context | None = None, dtype=None) -> mx.nd.NDArray:
    """An NDArray holding a copy of ``value``'s values, as ``mx.nd.array(value, ctx, dtype)``
    (``dtype``: ``value``'s by default; a cast is NumPy's, as ``mx.nd.array``'s is).

    Example:
        >>> import numpy as np
        >>> from customop.nd_copies import ndarray
        >>> a = ndarray(np.arange(6, dtype=np.int32).reshape(2, 3))
        >>> a.dtype.__name__, a.shape, a.asnumpy().tolist()
        ('int32', (2, 3), [[0, 1, 2], [3, 4, 5]])
    """
    value = np.asarray(value)
    dtype = value.dtype if dtype is None else np.dtype(dtype)
    if (
        (ctx is not None and ctx != mx.cpu())
        or value.ndim == 0
        or value.size == 0
        or dtype.name not in _TAKEN
    ):
        return mx.nd.array(value, ctx=ctx, dtype=dtype)
    return mx.nd.from_numpy(np.array(value, dtype=dtype, order="C"), zero_copy=True)
