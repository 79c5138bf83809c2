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

import contextlib
import functools
import sys
import threading
from collections.abc import Iterator

import mxnet as mx

_collected = threading.local()  # .notes: a list while Gluon infers shapes on this thread


@contextlib.contextmanager
def collecting() -> Iterator[list[str]]:
    """Within the block, the shape passes of our ops on this thread list what to do about each
    input whose shape stays unknown (:func:`notes`); the first is named in Gluon's
    deferred-initialization error."""
    outer = getattr(_collected, "notes", None)
    _collected.notes = []
    try:
        yield _collected.notes
    finally:
        _collected.notes = outer


def notes() -> list[str] | None:
    """The list inside :func:`collecting` on this thread, where a shape pass notes an input
    whose shape stays unknown; None outside (nothing to note)."""
    return getattr(_collected, "notes", None)


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
        with collecting() as found:
            try:
                result = original(self, *args, **kwargs)
            except Exception as exc:
                if found:  # -W error: MXNet's warning raised
                    raise ValueError(found[0]) from exc
                raise
        if result[0] is None and found:
            raise ValueError(found[0])
        return result

    mx.sym.Symbol.infer_shape = infer_shape
