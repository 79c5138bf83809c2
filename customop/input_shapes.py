"""Shapes of inputs an operator says from the others (``infer_input_shape=``), and naming
the inputs whose shape nothing gives.

MXNet's own layers infer a weight's shape from the data (``FullyConnected``:
``(num_hidden, data.shape[1])``), so ``sym.infer_shape(data=...)``, ``Module.bind``
and Gluon's deferred initialization (a ``Parameter`` of shape ``(10, 0)``) leave
the weight out.  A hand-written ``CustomOpProp.infer_shape`` does it by
returning input shapes; here each such input declares one function of the input
shapes, ``fn(*input_shapes, **params) -> shape``, as ``aux=`` does for states.

MXNet's custom-op bridge cannot leave an input's shape unknown: whatever the
prop returns is taken as known, and ``()`` becomes a 0-d shape (measured: a later
``FullyConnected`` sharing that weight then fails with ``Shape inconsistent,
Provided = [], inferred shape=(3,5)``, and a bind goes on to create the operator
with shape ``()``).  So an input that nothing gives is named here: an
:class:`InputShapeWarning` at shape inference, an error where the graph is bound.
"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Callable
from typing import Any, Tuple  # noqa: UP035 - Tuple: evaluated at run time on Python 3.8

import mxnet as mx

from . import errors
from .runtime import gluonshape

Shape = Tuple[int, ...]  # noqa: UP006


class InputShapeWarning(UserWarning):
    """An operator's input has no known shape at shape inference, and the op does not infer it."""


def unknown_ndim(shape: Any) -> bool:
    """Whether MXNet passed ``shape`` for "nothing known": ``()`` under its legacy shapes (under
    NumPy shape semantics, ``mx.npx.set_np()``, ``()`` is a 0-d array and stays one)."""
    return len(shape) == 0 and not mx.util.is_np_shape()


def known(shape: Any) -> bool:
    """A legacy MXNet shape with every dimension known (``()`` and ``0``/``-1`` dims: unknown)."""
    return shape is not None and len(shape) > 0 and all(0 < int(d) < 2**31 - 1 for d in shape)


class InputShapes:
    """The ``infer_input_shape=`` declarations of one operator."""

    def __init__(
        self, declared: dict[str, Callable] | None, inputs: list[str], aux: list[str], op_type: str
    ):
        self.op_type = op_type
        self.inputs = list(inputs)
        declared = dict(declared or {})
        for name, fn in declared.items():
            if name not in self.inputs:
                what = (
                    "an auxiliary state (aux= gives its shape)" if name in aux else "not an input"
                )
                raise TypeError(
                    f"customop {errors.shown(op_type)!r}: infer_input_shape names "
                    f"{name!r}, which is {what}; the inputs are "
                    f"{', '.join(self.inputs) or 'none'}"
                )
            if not callable(fn):
                raise TypeError(
                    f"customop {errors.shown(op_type)!r}: infer_input_shape="
                    f"{{{name!r}: ...}} must map the input to a function of the input "
                    f"shapes returning its shape, got {type(fn).__name__}"
                )
        self.fns: dict[str, Callable] = declared

    def complete(self, given: list[Shape], params: dict[str, Any]) -> list[Shape]:
        """``given`` (MXNet's shapes: ``()`` or ``0``/``-1`` dims where unknown) with the
        declared inputs filled in once every other input is known.

        Each function sees ``None`` for an input not fully known; it may return
        ``None`` (cannot tell yet).  A given shape that contradicts what it says raises.
        """
        if not self.fns:
            return list(given)
        out = [tuple(int(d) for d in s) for s in given]
        others = [i for i, n in enumerate(self.inputs) if n not in self.fns]
        if not all(known(out[i]) for i in others):
            return out
        for name, fn in self.fns.items():
            i = self.inputs.index(name)
            seen = [s if known(s) else None for s in out]
            try:
                shape = fn(*seen, **params)
            except Exception as exc:
                errors.reraise(exc, self.op_type, f"infer_input_shape for input {name!r}")
            if shape is None:
                continue
            shape = self._checked(name, shape, shape)
            if not _agrees(out[i], shape):
                dims = tuple("?" if not 0 < d < 2**31 - 1 else d for d in out[i])
                raise ValueError(
                    f"customop {errors.shown(self.op_type)!r} (input {name!r}): given shape "
                    f"{dims}, but infer_input_shape says {shape} for the inputs "
                    f"{_listed(self.inputs, seen, skip=name)}; give it that shape (or leave it "
                    "out for the op to fill)"
                )
            out[i] = shape
        return out

    def _checked(self, name: str, shape: Any, returned: Any) -> Shape:
        if isinstance(shape, numbers.Integral):
            shape = (shape,)
        try:
            shape = tuple(int(d) for d in shape)
        except (TypeError, ValueError):
            shape = None
        if not shape or not all(d > 0 for d in shape):
            shape = returned
            raise TypeError(
                f"customop {errors.shown(self.op_type)!r} (infer_input_shape for input "
                f"{name!r}): must return a shape of positive ints (or None: cannot tell yet), "
                f"got {shape!r}"
            )
        return shape

    def unknown_message(self, name: str) -> str:
        """What to do about input ``name`` whose shape nothing gives."""
        how = (
            "infer_input_shape for it returned None"
            if name in self.fns
            else "the op does not infer it"
        )
        return (
            f"customop {errors.shown(self.op_type)!r} (input {name!r}): its shape is unknown: "
            f"nothing in the graph gives it and {how}. Give it: pass {name}=<shape> to "
            "simple_bind or sym.infer_shape, list it in Module.bind's data_shapes / "
            "label_shapes, or give its Gluon Parameter a full shape; or let the op infer it: "
            f"@customop(..., infer_input_shape={{{name!r}: lambda "
            f"{', '.join(self.inputs)}, **params: <shape>}})"
        )

    def warn_unknown(self, shapes: list[Shape]) -> None:
        """Warn about each input without any shape when another one is known (a partial
        pass: MXNet takes the ``()`` it gets back for a known 0-d shape).

        A shape with some unknown (or 0) dimensions is not named here: MXNet's legacy
        shapes cannot tell a Gluon ``Parameter`` of shape ``(10, 0)`` from an empty batch.
        """
        if not any(known(s) for s in shapes):
            return  # nothing given at all (infer_shape_partial()): nothing to say yet
        for name, shape in zip(self.inputs, shapes):
            if unknown_ndim(shape):
                warnings.warn(self.unknown_message(name), InputShapeWarning, stacklevel=2)

    def note_unknown(self, shapes: list[Shape]) -> None:
        """While Gluon's deferred initialization infers shapes on this thread (the
        ``gluonshape`` patch), list each input not fully known with what to do about it (a
        Gluon Parameter of shape ``(10, 0)`` among them, which :meth:`warn_unknown` leaves
        out)."""
        notes = gluonshape.notes()
        if notes is None:
            return
        for name, shape in zip(self.inputs, shapes):
            if not known(shape):
                dims = ", ".join("?" if not 0 < int(d) < 2**31 - 1 else str(int(d)) for d in shape)
                given = "" if unknown_ndim(shape) else f" (given ({dims}))"
                notes.append(
                    self.unknown_message(name).replace(
                        "its shape is unknown:", f"its shape is unknown{given}:", 1
                    )
                )

    def __bool__(self) -> bool:
        return bool(self.fns)


def _agrees(given: Shape, inferred: Shape) -> bool:
    if len(given) == 0:
        return True  # unknown
    return len(given) == len(inferred) and all(
        not 0 < g < 2**31 - 1 or g == d for g, d in zip(given, inferred)
    )


def _listed(names: list[str], shapes: list[Any], skip: str) -> str:
    return ", ".join(f"{n}={s}" for n, s in zip(names, shapes) if n != skip) or "none"
