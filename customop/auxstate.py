"""The one place that makes updates of auxiliary states land, in order, where MXNet reads them.

A Python ``CustomOp`` gets its aux arrays as fresh NDArrays over the same
memory but with their own engine variables, and ``_backward_Custom`` does not
declare that it writes them: an update pushed from the worker thread is not
ordered with later reads (measured: lost in a bound executor, racy
imperatively); nor does the graph's forward node order a read of the aux
array after it (measured: a read right after ``exe.forward`` returned the old
value while reading the output waited).  So every update is finished before
the callback returns (:func:`write_back`), and once an op with aux states is in
use, MXNet's graph entry points (executor forward/backward, CachedOp calls,
``autograd.backward``) wait for the engine before returning (:func:`install`),
so a read after them sees the new values.
"""
from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from typing import Any

import mxnet as mx
import numpy as np

# Set once an operator with aux states has been bound or recorded in this process; from then
# on every backward waits for the engine.  (Per call would race: a graph's forward callback
# may run after the caller's backward() has already returned.)
_active = threading.Event()
_thread = threading.local()


@contextlib.contextmanager
def in_callback() -> Iterator[None]:
    """Mark code running inside MXNet's engine (a CustomOp callback): it must never wait."""
    old = getattr(_thread, "inside", False)
    _thread.inside = True
    try:
        yield
    finally:
        _thread.inside = old


def write_back(mode_name: str, dst: list[mx.nd.NDArray], values: list[Any],
               wait: bool) -> None:
    """Store the (possibly updated) aux values into MXNet's arrays.

    ``'numpy'`` mode copies the host arrays back; in ``'mxnet'`` mode the values
    are those NDArrays, updated in place.  ``wait``: finish the writes now (on
    MXNet's worker threads nothing else orders them).
    """
    for nd, value in zip(dst, values):
        if mode_name == "numpy":
            nd[:] = np.asarray(value).reshape(nd.shape).astype(nd.dtype, copy=False)
        if wait:
            nd.wait_to_read()


def expect_update() -> None:
    """An op with aux states was bound or recorded: later backward passes may update them."""
    _active.set()


def _settled(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        result = fn(*args, **kwargs)
        # Threads MXNet created (custom-op workers: Python sees them as dummy threads) run
        # inside an engine operation; waiting there for the engine would wait for ourselves.
        if _active.is_set() and not getattr(_thread, "inside", False) and not isinstance(
                threading.current_thread(), threading._DummyThread):
            mx.nd.waitall()  # aux writes happen on MXNet's worker threads, unordered with reads
        return result
    wrapper._customop_settled = True
    return wrapper


def install() -> None:
    """Make MXNet's graph entry points settle aux updates before returning (idempotent)."""
    for owner, name in ((mx.autograd, "backward"), (mx.nd.NDArray, "backward"),
                        (mx.executor.Executor, "forward"), (mx.executor.Executor, "backward"),
                        (mx.nd.CachedOp, "__call__")):
        fn = getattr(owner, name)
        if not getattr(fn, "_customop_settled", False):
            setattr(owner, name, _settled(fn))
