"""The ``release`` patch: an operator of ours that MXNet deletes frees what it holds at once.

Off-switch: ``CUSTOMOP_RUNTIME_OFF=release``; installed by the first operator MXNet
creates for one of our ops: a graph node, a hybridized call or an ``mx.nd.Custom`` call.

MXNet's Python ``CustomOp`` sits in a reference cycle with the ctypes
callbacks MXNet builds around it (``cast()`` makes every callback refer to
itself), so when MXNet deletes the operator (its delete callback drops the
registry's reference) only Python's cycle collector frees it, with
everything it holds.  For our operator that is the forward's residuals and
host copies, kept from a training forward for its backward (measured with the
collector off: docs/design.md, *What customop changes in MXNet*).  For
each operator instance of *ours* only, the delete slot of the callback table
MXNet made for it is pointed at one deleter of ours, which drops what the
instance holds and then calls MXNet's own deleter; nothing else of MXNet
changes (the same deleter serves ``deps`` below, which needs to know when an
operator is gone).  Switched off, those values wait for the cycle collector.
"""

from __future__ import annotations

from typing import Any

from .. import runtime
from . import callbacks, deps


def _delete(
    key,
    watched=callbacks.watched,
    delete_type=callbacks.DELETE_TYPE,
    is_installed=runtime.is_installed,
):
    # MXNet deletes one of our operators. The tables are bound as defaults: MXNet may delete
    # operators while the interpreter shuts down, after this module's globals are gone.
    entry = watched.pop(key, None)
    if entry is None:  # pragma: no cover - every key we hand out is watched
        return True
    op, mxnet_delete, context = entry
    if is_installed("release"):
        op.release()
    return delete_type(mxnet_delete)(context)


def adopt_operator(op: Any, refs: Any) -> None:
    """MXNet created ``op``, an operator of ours: install ``release`` and ``deps`` for it.

    ``refs``: what MXNet's ``create_operator`` callback stores as ``op._ref_holder``.
    ``release`` calls ``op.release()`` when MXNet deletes it; ``deps`` runs its backward
    with ``op.dependencies`` (a set of MXNet's array numbers, and how many arrays are
    numbered) and ``op.ctx``.  Anything else (another MXNet) is left alone.
    """
    runtime.install("release")
    runtime.install("deps")
    own_backward = runtime.is_installed("deps")
    if not runtime.is_installed("release") and not own_backward:
        return
    found = callbacks.slots(refs, callbacks.OP_BACKWARD + 1)
    if found is None:
        return  # pragma: no cover - another MXNet
    slots, contexts = found
    key = next(callbacks.keys)
    callbacks.watched[key] = (op, slots[callbacks.OP_DELETE], contexts[callbacks.OP_DELETE])
    contexts[callbacks.OP_DELETE] = key
    slots[callbacks.OP_DELETE] = callbacks.entry("delete", callbacks.DELETE_TYPE, _delete)
    if own_backward:
        contexts[callbacks.OP_BACKWARD] = key
        slots[callbacks.OP_BACKWARD] = callbacks.entry("backward", callbacks.FB_TYPE, deps.backward)


def install() -> None:
    """Make the C callback (delete) operators of ours get."""
    callbacks.entry("delete", callbacks.DELETE_TYPE, _delete)
