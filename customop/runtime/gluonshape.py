"""The ``gluonshape`` patch: Gluon's deferred initialization names our op's unknown input.

Off-switch: ``CUSTOMOP_RUNTIME_OFF=gluonshape``; installed by the first Symbol call of
one of our ops (:func:`customop.runtime.note_graph_op`).

Gluon's deferred initialization (``HybridBlock._infer_attrs``) raises
``ValueError(w[0].message)`` from the warnings it records around
``Symbol.infer_shape``; under ``-W ignore`` nothing is recorded and the user reads
``Deferred initialization failed because shape cannot be inferred. list index out
of range``, and with warnings on only the Parameter is named (``net0_weight: (10,
0)``).  Wraps ``Symbol.infer_shape``: called from ``_infer_attrs`` (found by its
code object; every other caller gets MXNet's method at once), it lets our ops'
shape passes list each input whose shape stays unknown, and when the inference
fails with one listed it raises ``ValueError`` naming the op, the input and the
fix (give the Parameter a full shape, or ``infer_input_shape=``) in place of
Gluon's.  Switched off, Gluon's messages stay.
"""
from __future__ import annotations

import functools
import sys

import mxnet as mx

from .. import input_shapes


def install() -> None:
    """Wrap ``Symbol.infer_shape`` for calls from Gluon's ``HybridBlock._infer_attrs``."""
    original = mx.sym.Symbol.infer_shape
    asker = getattr(mx.gluon.HybridBlock, "_infer_attrs", None)  # MXNet 1.x's Gluon
    if asker is None:  # pragma: no cover - another MXNet: Gluon's own messages stay
        return
    gluon_asks = asker.__code__

    @functools.wraps(original)
    def infer_shape(self, *args, **kwargs):
        if sys._getframe(1).f_code is not gluon_asks:
            return original(self, *args, **kwargs)
        with input_shapes.collecting() as notes:
            try:
                result = original(self, *args, **kwargs)
            except Exception as exc:
                if notes:  # -W error: MXNet's warning raised
                    raise ValueError(notes[0]) from exc
                raise
        if result[0] is None and notes:
            raise ValueError(notes[0])
        return result
    mx.sym.Symbol.infer_shape = infer_shape
