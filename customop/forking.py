"""What a ``fork()`` must find: nothing of ours in flight, nothing of ours half-made.

MXNet's own ``pthread_atfork`` handler stops its engine and joins the
CustomOperator worker thread while the forking thread holds the GIL; if that
worker is still inside a Python callback (one of our forwards, backwards or
deleters) it waits for the GIL forever.  Before a fork we therefore let
MXNet's queues drain with the GIL released; after it, the child gets fresh
copies of the threads we own.
"""
from __future__ import annotations

import atexit
import os
import time

import mxnet as mx

_SETTLE_S = 0.002  # a deleter waiting for the GIL runs within this once we let go of it
_MAX_WAIT_S = 0.5


def _live_ops() -> int:
    return len(mx.operator._registry.ref_holder)


def _before() -> None:
    try:
        mx.nd.waitall()  # releases the GIL until the engine is idle
    except Exception:  # noqa: BLE001 - the failure stays with MXNet's arrays; fork must go on
        pass
    # Finished ops are deleted on the CustomOperator thread right after they complete, through
    # a Python callback: give it the GIL until the count of live ops stops moving.
    deadline = time.monotonic() + _MAX_WAIT_S
    seen = _live_ops()
    while time.monotonic() < deadline:
        time.sleep(_SETTLE_S)
        now = _live_ops()
        if now == seen:
            break
        seen = now


def install() -> None:
    """Register the fork handlers (once per process)."""
    os.register_at_fork(before=_before)
    # After a fork, MXNet's own exit handler can wait forever for work still queued on its
    # CustomOperator thread (measured: an unread 'mxnet'-mode backward); finish it first.
    atexit.register(_drain)


def _drain() -> None:
    try:
        mx.nd.waitall()
    except Exception:  # noqa: BLE001 - exiting; the error belonged to arrays nobody reads
        pass
