"""The ``trace`` hooks: what a forward traced into a native graph calls, reads and pauses.

Off-switch: ``CUSTOMOP_RUNTIME_OFF=trace``; in place only while a forward is traced into
a native graph, for that thread.

Recording an op's forward as MXNet operators (:mod:`customop.graphs.graph_verdicts`) needs what
MXNet has no hook for: the arrays each operator reads (``mx.autograd.get_symbol``
names the forward's free variables ``nullN`` but gives no way to read their
values: the constants it built), every read of a value back to Python
(``asnumpy``; ``asscalar`` and ``bool()`` go through it), and what the forward
computes inside ``mx.autograd.pause()`` (recorded anyway and marked, so the graph
is whole and its training form stops gradients where the pause did).  For the
length of one trace, under a lock, ``mxnet.ndarray.register._imperative_invoke``
(every generated ``mx.nd`` operator runs through it), ``NDArray.asnumpy`` and
``autograd._RecordingStateScope.__enter__``/``__exit__`` are wrappers that report
to the tracing thread's log and pass every other thread through; the originals
are back when the trace ends.  Switched off, nothing is traced: every op keeps
its ``Custom`` node.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import mxnet as mx

_trace_lock = threading.RLock()  # one trace at a time: the swap below is process-wide
_trace_logs: dict[int, Any] = {}  # thread id -> the log of the forward that thread traces
_trace_saved: dict[str, Any] = {}


def _traced_invoke(handle, ndargs, *args):
    result = _trace_saved["invoke"](handle, ndargs, *args)
    log = _trace_logs.get(threading.get_ident())
    if log is not None:
        log.invoked(handle, ndargs, result)
    return result


def _traced_asnumpy(self):
    log = _trace_logs.get(threading.get_ident())
    if log is not None:
        log.read(self)
    return _trace_saved["asnumpy"](self)


def _traced_scope_enter(self):
    log = _trace_logs.get(threading.get_ident())
    if log is not None and self._enter_is_record is False:
        self._enter_is_record = None  # keep recording: the paused values join the graph
        self._customop_paused = True
        log.pause_enter()
    return _trace_saved["enter"](self)


def _traced_scope_exit(self, *exc):
    if getattr(self, "_customop_paused", False):
        log = _trace_logs.get(threading.get_ident())
        if log is not None:
            log.pause_exit()
    return _trace_saved["exit"](self, *exc)


@contextlib.contextmanager
def tracing(log: Any) -> Iterator[None]:
    """Within the block, this thread's forward is being traced into ``log`` (see ``trace``).

    ``log.invoked(handle, inputs, result)`` sees every MXNet operator call,
    ``log.read(array)`` every ``asnumpy`` (so also ``asscalar``, ``bool()``);
    ``mx.autograd.pause()`` keeps recording, between ``log.pause_enter()`` and
    ``log.pause_exit()``.  Other threads run through unchanged.
    """
    from mxnet.ndarray import register

    with _trace_lock:
        me = threading.get_ident()
        if me in _trace_logs:
            raise RuntimeError("customop: a forward traced inside a traced forward")
        outermost = not _trace_logs
        if outermost:
            scope = mx.autograd._RecordingStateScope
            _trace_saved.update(
                invoke=register._imperative_invoke,
                asnumpy=mx.nd.NDArray.asnumpy,
                enter=scope.__enter__,
                exit=scope.__exit__,
            )
            register._imperative_invoke = _traced_invoke
            mx.nd.NDArray.asnumpy = _traced_asnumpy
            scope.__enter__, scope.__exit__ = _traced_scope_enter, _traced_scope_exit
        _trace_logs[me] = log
        try:
            yield
        finally:
            del _trace_logs[me]
            if not _trace_logs:
                register._imperative_invoke = _trace_saved["invoke"]
                mx.nd.NDArray.asnumpy = _trace_saved["asnumpy"]
                scope = mx.autograd._RecordingStateScope
                scope.__enter__, scope.__exit__ = _trace_saved["enter"], _trace_saved["exit"]


def tracing_now() -> Any:
    """The trace log of this thread's forward, or None when it is not being traced."""
    return _trace_logs.get(threading.get_ident()) if _trace_logs else None
