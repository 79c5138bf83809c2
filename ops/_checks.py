"""Input checks shared by the operators: every message names the operator and the argument.

Shapes and parameters are checked for free.  A check of *values* in ``'mxnet'``
mode (labels in range, ``sigma > 0``) costs one device synchronisation: all of an
operator's value conditions are reduced on the device to a single flag and only
that one element is read back (:func:`any_nd`); the data itself never leaves the
device.
"""
from __future__ import annotations

import mxnet as mx
import numpy as np


def fail(op: str, arg: str, msg: str, cls: type[Exception] = ValueError) -> Exception:
    return cls(f"ops.{op}: {arg} {msg}")


def any_nd(*conditions: mx.nd.NDArray) -> bool:
    """Whether any element of any 0/1 condition array is set: one 1-element read-back."""
    flags = [c.reshape((-1,)).max() for c in conditions]
    flag = flags[0] if len(flags) == 1 else mx.nd.maximum(*flags) if len(flags) == 2 \
        else mx.nd.max(mx.nd.concat(*flags, dim=0))
    return bool(flag.asnumpy()[0])


def positive(op: str, name: str, value: float) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
        raise fail(op, name, f"must be a number > 0, got {value!r}")


def broadcastable(op: str, name: str, shape: tuple, to: tuple, to_name: str) -> None:
    try:
        ok = np.broadcast_shapes(tuple(shape), tuple(to)) == tuple(to)
    except ValueError:
        ok = False
    if not ok:
        raise fail(op, name, f"has shape {tuple(shape)}, which does not broadcast to "
                   f"{to_name}'s shape {tuple(to)}")


def same_shape(op: str, name: str, shape: tuple, want: tuple, what: str) -> None:
    if tuple(shape) != tuple(want):
        raise fail(op, name, f"has shape {tuple(shape)} but must have shape {tuple(want)} "
                   f"({what})")
