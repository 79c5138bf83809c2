"""The two array worlds a forward function can live in.

``'numpy'``: the forward and gradient closures see NumPy arrays (one
device-to-host copy per input) and return NumPy arrays (written straight into
MXNet's output buffers).  ``'mxnet'``: they see and return ``mx.nd.NDArray``
on the operator's own context; nothing leaves the device.
"""

from __future__ import annotations

from typing import Any

import mxnet as mx
import numpy as np

BFLOAT16 = np.dtype([("bfloat16", np.uint16)])  # how MXNet hands bfloat16 to NumPy


def widened(arr: mx.nd.NDArray) -> mx.nd.NDArray:
    """``arr``, a ``bfloat16`` one as ``float32``: a forward and its closures compute in
    float32 there (NumPy has no bfloat16, few MXNet CPU kernels take it), and their
    results are stored back as ``bfloat16`` (:meth:`NumpyMode.assign`)."""
    return arr.astype(np.float32) if arr.dtype == BFLOAT16 else arr


class NumpyMode:
    name = "numpy"
    array_types: tuple[type, ...] = (np.ndarray, np.generic, bool, int, float)

    @staticmethod
    def from_nd(arr: mx.nd.NDArray) -> np.ndarray:
        return widened(arr).asnumpy()

    @staticmethod
    def to_nd(value: np.ndarray, ctx: mx.Context) -> mx.nd.NDArray:
        value = np.asarray(value)
        return mx.nd.array(value.reshape(value.shape or (1,)), ctx=ctx, dtype=value.dtype)

    @staticmethod
    def from_numpy(value: np.ndarray) -> np.ndarray:
        return value

    @staticmethod
    def to_numpy(value: Any) -> np.ndarray:
        return np.asarray(value)

    @staticmethod
    def placeholder(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        return np.full(shape, 0 if np.issubdtype(dtype, np.integer) else 1, dtype=dtype)

    @staticmethod
    def zeros_like(arr: np.ndarray) -> np.ndarray:
        return np.zeros_like(arr)

    @staticmethod
    def copy(arr: Any) -> np.ndarray:
        return np.array(arr)

    @staticmethod
    def as_scalar_view(value: np.ndarray) -> np.ndarray:
        return value.reshape(())

    @staticmethod
    def assign(dst: mx.nd.NDArray, req: str, value: np.ndarray) -> None:
        if req == "null":
            return
        value = np.asarray(value)
        if dst.dtype == BFLOAT16:  # (NumPy cannot write it: cast on the device)
            value = mx.nd.array(value.reshape(dst.shape), ctx=dst.context, dtype=np.float32)
            MXNetMode.assign(dst, req, value)
        elif req == "add":
            dst += mx.nd.array(value.reshape(dst.shape), ctx=dst.context, dtype=dst.dtype)
        else:  # write / inplace: one host-to-device copy straight into the buffer
            dst[:] = value.reshape(dst.shape).astype(dst.dtype, copy=False)

    @staticmethod
    def shape(value: Any) -> tuple[int, ...]:
        return np.shape(value)

    @staticmethod
    def dtype(value: Any) -> np.dtype:
        return np.asarray(value).dtype


class MXNetMode:
    name = "mxnet"
    array_types: tuple[type, ...] = (mx.nd.NDArray,)

    @staticmethod
    def from_nd(arr: mx.nd.NDArray) -> mx.nd.NDArray:
        return widened(arr)

    @staticmethod
    def to_nd(value: mx.nd.NDArray, ctx: mx.Context) -> mx.nd.NDArray:
        return value if value.context == ctx else value.as_in_context(ctx)

    @staticmethod
    def from_numpy(value: np.ndarray) -> mx.nd.NDArray:
        value = np.asarray(value)
        return mx.nd.array(value.reshape(value.shape or (1,)), dtype=value.dtype)

    @staticmethod
    def to_numpy(value: mx.nd.NDArray) -> np.ndarray:
        return value.asnumpy()

    @staticmethod
    def placeholder(shape: tuple[int, ...], dtype: np.dtype) -> mx.nd.NDArray:
        return mx.nd.full(shape, 0 if np.issubdtype(dtype, np.integer) else 1, dtype=dtype)

    @staticmethod
    def zeros_like(arr: mx.nd.NDArray) -> mx.nd.NDArray:
        return mx.nd.zeros_like(arr)

    @staticmethod
    def copy(arr: mx.nd.NDArray) -> mx.nd.NDArray:
        return arr.copy()

    @staticmethod
    def as_scalar_view(value: mx.nd.NDArray) -> mx.nd.NDArray:
        return value  # legacy NDArrays have no 0-d shape; a scalar is (1,)

    @staticmethod
    def assign(dst: mx.nd.NDArray, req: str, value: mx.nd.NDArray) -> None:
        if req == "null":
            return
        if value.shape != dst.shape:
            value = value.reshape(dst.shape)
        if value.dtype != dst.dtype:
            value = value.astype(dst.dtype)
        if req == "add":
            dst += value
        else:
            value.copyto(dst)

    @staticmethod
    def shape(value: mx.nd.NDArray) -> tuple[int, ...]:
        return value.shape

    @staticmethod
    def dtype(value: mx.nd.NDArray) -> np.dtype:
        return np.dtype(value.dtype)


MODES = {"numpy": NumpyMode, "mxnet": MXNetMode}
