"""The ``shapes`` patch: the shapes our props hand MXNet stay alive while MXNet reads them.

Off-switch: ``CUSTOMOP_RUNTIME_OFF=shapes``; installed by the first graph node or
``mx.nd.Custom`` call of one of our ops.

MXNet's Python ``infer_shape_entry`` hands C++ the shapes it inferred in buffers it
keeps in one slot per prop (``infer_shape_entry._ref_holder``).  Binding one Symbol
from several threads runs the same prop's entry concurrently, and a second call
replaces (frees) the first call's buffers while C++ still copies them (measured: 4
threads binding one Symbol with ``ops.box_decode`` and ``ops.focal_loss`` 200 times
each failed 17 of 4,000 binds, "inferred shape=[1880410720,32732,4]"; a hand-written
CustomOp alike).  For each prop of *ours* only, the infer-shape slot of the callback
table MXNet made for it is pointed at a copy of MXNet's entry (``_infer_shape_entry`` in
:mod:`customop.prop`) whose buffers live until the same thread's next shape inference
(C++ copies them right after the callback returns, on that thread): 0 of 8,000 failed.
Switched off, concurrent binds of our ops share MXNet's slot again.
"""
from __future__ import annotations

import weakref
from typing import Any

from . import callbacks


def adopt_prop(refs: Any, prop: Any, props: dict[int, Any], entry: Any) -> None:
    """MXNet created ``prop``, a prop of ours: point its infer-shape slot at ``entry``.

    ``refs``: what MXNet's ``creator`` callback stores as the prop's ``_ref_holder``;
    ``entry(num_tensor, dims, shapes, key)``: MXNet's infer-shape callback, which finds
    the prop as ``props[key]`` (a weak reference, dropped with the prop) and keeps the
    buffers it hands MXNet alive until the same thread's next call (in
    :mod:`customop.prop`, which calls the prop).
    """
    found = callbacks.adopting("shapes", refs, callbacks.PROP_INFER_SHAPE + 1)
    if found is None:
        return  # switched off, or another MXNet
    slots, contexts = found
    key = next(callbacks.keys)
    props[key] = weakref.ref(prop, lambda _, key=key: props.pop(key, None))
    contexts[callbacks.PROP_INFER_SHAPE] = key
    slots[callbacks.PROP_INFER_SHAPE] = callbacks.entry("infer_shape",
                                                        callbacks.INFER_SHAPE_TYPE, entry)


def install() -> None:
    pass  # acts per prop (adopt_prop): nothing global to install
