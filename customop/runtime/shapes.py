"""The ``shapes`` patch: the shapes our props hand MXNet stay alive while MXNet reads them.

Off-switch: ``CUSTOMOP_RUNTIME_OFF=shapes``; installed by the first graph node or
``mx.nd.Custom`` call of one of our ops.

MXNet's Python ``infer_shape_entry`` hands C++ the shapes it inferred in buffers it
keeps in one slot per prop (``infer_shape_entry._ref_holder``).  Binding one Symbol
from several threads runs the same prop's entry concurrently, and a second call
replaces (frees) the first call's buffers while C++ still copies them: binds then
fail with garbage shapes, for a hand-written CustomOp alike (measured:
docs/design.md, *What customop changes in MXNet*).  For each prop of *ours* only, the
infer-shape slot of the callback table MXNet made for it is pointed at a copy of
MXNet's entry (:func:`infer_shape`) whose buffers live until the same thread's next
shape inference (C++ copies them right after the callback returns, on that thread).
Switched off, concurrent binds of our ops share MXNet's slot again.
"""

from __future__ import annotations

import threading
from typing import Any

from . import callbacks

_props: dict[int, Any] = {}  # context key -> weak reference to a prop of ours
_held = threading.local()  # .buffers: the buffers of this thread's last shape answer


@callbacks.guarded
def infer_shape(num_tensor, tensor_dims, tensor_shapes, key, props=_props):
    """MXNet's ``infer_shape_entry`` for the prop ``props[key]``, holding the buffers it hands
    C++ per thread (the C callback :func:`adopt_prop` puts in a prop's infer-shape slot)."""
    ref = props.get(key)
    prop = ref() if ref is not None else None
    if prop is None:  # pragma: no cover - MXNet calls a prop only while it holds it
        return False
    n_in = len(prop.list_arguments())
    n_out = len(prop.list_outputs())
    n_aux = len(prop.list_auxiliary_states())
    if num_tensor != n_in + n_out + n_aux:  # pragma: no cover - MXNet's own assertion
        raise AssertionError(
            f"infer_shape: {num_tensor} tensors for {n_in} inputs, "
            f"{n_out} outputs and {n_aux} aux states"
        )
    given = callbacks.given_shapes(n_in, tensor_dims, tensor_shapes)
    ishape, oshape, ashape = prop.infer_shape(given)
    # C++ copies them right after this returns, on this thread
    _held.buffers = callbacks.answer_shapes(
        num_tensor, [*ishape, *oshape, *ashape], tensor_dims, tensor_shapes, given
    )
    return True


def adopt_prop(refs: Any, prop: Any) -> None:
    """MXNet created ``prop``, a prop of ours: point its infer-shape slot at
    :func:`infer_shape`, which finds the prop by a key (a weak reference, dropped with it).

    ``refs``: what MXNet's ``creator`` callback stores as the prop's ``_ref_holder``.
    """
    callbacks.adopt("shapes", refs, _SLOTS, lambda: callbacks.weak_key(_props, prop))


_SLOTS = {callbacks.PROP_INFER_SHAPE: ("infer_shape", callbacks.INFER_SHAPE_TYPE, infer_shape)}


def install() -> None:
    """Make the C callback (infer shape) props of ours get."""
    callbacks.entry(*_SLOTS[callbacks.PROP_INFER_SHAPE])
