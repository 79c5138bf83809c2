"""Input checks shared by the operators: every message names the operator and the argument.

A message starts with ``customop 'ops.<name>': <argument> ...`` (the core's own quoting), so
it names the op once, whichever mode or call path raised it.  Parameters are checked for
type first (a string where a bool or a number belongs is a ``TypeError``: ``'False'`` would
otherwise read as true), then for value (NaN and infinity are a ``ValueError``).

Shapes and parameters are checked for free.  A check of *values* in ``'mxnet'``
mode (labels in range, ``sigma > 0``) goes through ``customop.require``
(:func:`require`): where the forward runs in Python it costs one device
synchronisation (the condition is reduced on the device and one element is read
back; the data itself never leaves the device) and raises the message below; in
a native graph (hybridized, bound, exported) it reads nothing back and makes the
operator's outputs NaN when it fails.
"""

from __future__ import annotations

import math
import numbers

import mxnet as mx
import numpy as np

import customop
from customop import value_checks as checks


def fail(op: str, arg: str, msg: str, cls: type = ValueError) -> Exception:
    return cls(f"customop 'ops.{op}': {arg} {msg}")


def require(ok: mx.nd.NDArray, arg: str, msg: str) -> None:
    """Every element of ``ok`` must be non-zero: else ``customop '<op>': <arg> <msg>`` where
    the forward runs in Python, NaN outputs in a native graph (see ``customop.require``)."""
    customop.require(ok, arg, msg)


def nan_unless(x: mx.nd.NDArray, ok: mx.nd.NDArray, arg: str, msg: str) -> mx.nd.NDArray:
    """``x``, checked by ``require(ok, arg, msg)``; in a native graph a failure makes ``x`` NaN
    (``x`` must reach every output element and gradient: see
    ``customop.value_checks.nan_unless``)."""
    return checks.nan_unless(x, ok, arg, msg)


# ---- parameters ----------------------------------------------------------------------------
def boolean(op: str, name: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise fail(op, name, f"must be a bool (True or False), got {value!r}", TypeError)
    return bool(value)


def number(
    op: str,
    name: str,
    value,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    finite: bool = True,
) -> float:
    """A real number (not a bool or a string), not NaN, finite unless ``finite=False``, in
    ``[low, high]`` (``(low, high]`` with ``low_open``)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise fail(op, name, f"must be a number, got {value!r}", TypeError)
    value = float(value)
    too_low = low is not None and (value <= low if low_open else value < low)
    too_high = high is not None and value > high
    if math.isnan(value) or (finite and math.isinf(value)) or too_low or too_high:
        bounds = [f"{'>' if low_open else '>='} {low:g}"] if low is not None else []
        bounds += [f"<= {high:g}"] if high is not None else []
        span = (
            f" in [{low:g}, {high:g}]"
            if len(bounds) == 2 and not low_open
            else "".join(" " + b for b in bounds[:1]) + "".join(" and " + b for b in bounds[1:])
        )
        raise fail(op, name, f"must be a {'finite ' if finite else ''}number{span}, got {value!r}")
    return value


def positive(op: str, name: str, value) -> float:
    return number(op, name, value, low=0, low_open=True)


def integer(op: str, name: str, value, low: int | None = None, high: int | None = None) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise fail(op, name, f"must be an int, got {value!r}", TypeError)
    if (low is not None and value < low) or (high is not None and value > high):
        span = f"[{'-inf' if low is None else low}, {'inf' if high is None else high}]"
        raise fail(op, name, f"must be an int in {span}, got {value!r}")
    return int(value)


def choice(op: str, name: str, value, choices: tuple) -> None:
    if not isinstance(value, str):
        raise fail(op, name, f"must be one of {choices}, got {value!r}", TypeError)
    if value not in choices:
        raise fail(op, name, f"must be one of {choices}, got {value!r}")


# ---- inputs ---------------------------------------------------------------------------------
def floating(op: str, name: str, dtype) -> None:
    """Float math on an integer array would truncate silently: refuse it, naming the input."""
    if not np.issubdtype(np.dtype(dtype), np.floating):
        raise fail(
            op,
            name,
            f"must be a float array (float16/32/64), got dtype "
            f"{np.dtype(dtype).name}; cast it first, e.g. x.astype('float32')",
            TypeError,
        )


def broadcastable(op: str, name: str, shape: tuple, to: tuple, to_name: str) -> None:
    try:
        ok = np.broadcast_shapes(tuple(shape), tuple(to)) == tuple(to)
    except ValueError:
        ok = False
    if not ok:
        raise fail(
            op,
            name,
            f"has shape {tuple(shape)}, which does not broadcast to {to_name}'s shape {tuple(to)}",
        )


def same_shape(op: str, name: str, shape: tuple, want: tuple, what: str) -> None:
    if tuple(shape) != tuple(want):
        raise fail(op, name, f"has shape {tuple(shape)} but must have shape {tuple(want)} ({what})")


def shape_is(op: str, name: str, shape: tuple, ok: bool, want: str) -> None:
    """``name`` must have shape ``want`` (described in words) unless ``ok``."""
    if not ok:
        raise fail(op, name, f"must have shape {want}, got {tuple(shape)}")


def class_indices(label: mx.nd.NDArray, num_class: int, msg: str) -> None:
    """``'mxnet'`` mode: every ``label`` is a class index, a whole number in
    ``[0, num_class - 1]`` (one flag read back: see :func:`require`); else ``label <msg>``."""
    require((1 - (label < 0)) * (label < num_class) * (label == mx.nd.floor(label)), "label", msg)


def class_indices_numpy(op: str, label: np.ndarray, num_class: int, msg: str) -> None:
    """``'numpy'`` mode: :func:`class_indices`, raised at once."""
    if np.any((label < 0) | (label >= num_class) | (label != np.floor(label))):
        raise fail(op, "label", msg)


# ---- boxes ----------------------------------------------------------------------------------
FORMATS = ("corner", "center")


def box_format(op: str, name: str, value) -> None:
    choice(op, name, value, FORMATS)


def boxes(op: str, name: str, shape: tuple, ndim: int | None = None) -> None:
    if len(shape) < 2 or shape[-1] != 4 or (ndim is not None and len(shape) != ndim):
        want = f"a {ndim}-d array" if ndim else "an array"
        raise fail(op, name, f"must be {want} of boxes with last axis 4, got shape {tuple(shape)}")
