"""The ``runahead`` fix: a thread calling our ops never runs far ahead of MXNet's engine.

Off-switch: ``CUSTOMOP_RUNTIME_OFF=runahead``; in effect from the first recorded call of a
decorated op, or the first graph that holds one; Linux (glibc) only.

MXNet's threaded engine runs a loop's operators behind Python: a training loop that
reads nothing back (``backward()`` returns at once) queues step after step, every queued
step's arrays are alive at once, and glibc keeps the freed heap when the engine catches
up.  Measured (``benchmarks/runahead.py``, MXNet alone, ``(8, 100, 5)`` floats, 2 cores):
``ops.focal_loss``'s native graph run as a raw ``mx.nd.CachedOp`` grew 24-76 KiB a call
over 6,000 calls (the heap in use flat, the free heap up to 340 MiB); 0.0 KiB when the loop
reads its output every 16 calls, waits for the engine every 16 calls, or runs
``NaiveEngine``.  Our default paths run such graphs (the imperative graph path, and a
hybridized block's cached graph with our ops inlined), so they grew the same way.

The fix, where our ops run (:func:`step`: the imperative ``graph``, ``native`` and
``direct`` paths of :mod:`customop.dispatch`, and the ``CachedOp`` a hybridized graph
holding our inlined ops runs, :class:`customop.graphs.inline.CachedPlan`): once every
:data:`EVERY` such calls a thread pushes a marker into MXNet's engine, an operation that
reads the call's outputs and does nothing, after waiting until the marker it pushed
:data:`EVERY` calls before has run.  The engine thus stays between one and two
:data:`EVERY` calls behind the thread (fed: never starved), never thousands.

The marker writes no array, and nothing waits on an array: in MXNet 1.9.1 waiting on an
array that failed (``WaitForVar``, ``wait_to_read``, ``asnumpy``) or on everything
(``waitall``) raises the failure and clears it (``ThreadedEngine::ThrowException`` sets the
``exception_ptr`` that every array depending on the failed one shares to null), so a
throttle that waited on our outputs would take a failure away from the user's own read.
The marker is pushed with ``MXEnginePushSyncND``, its function a C function that touches
no memory (``labs``), its parameter a POSIX semaphore, and its deleter ``sem_post``: the
engine frees a marker when it completes, failed dependency or not, and the thread waits
on the semaphore (``sem_wait``, without the GIL).  No Python runs on MXNet's threads, and a
failure still reaches the user's read (or the next ``waitall``) exactly as without the fix.

Nothing waits on a daemon thread (MXNet's workers are), on customop's own helper threads
(``customop-trace``, ``customop-infer``: their caller waits for them), inside a trace, or
in a thread that does not call our ops; code that does not use our ops never gets here.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import sys
import threading
from typing import Any

from mxnet.base import _LIB

from . import hooks

EVERY = 8  # our calls between two markers of a thread (measured: BENCHMARKS.md, runahead)
_NAME = b"customop_runahead"


class _Context(ctypes.Structure):  # mxnet::Context: DeviceType dev_type; int32_t dev_id
    _fields_ = [("dev_type", ctypes.c_int), ("dev_id", ctypes.c_int)]


_CPU = _Context(1, 0)  # the marker runs on the CPU: it only orders after its arrays' writes
_libc: Any = None
_noop = _post = None  # the marker's function (labs: no memory touched) and deleter (sem_post)
_spare: list[_Semaphore] = []  # semaphores of threads that ended
_spare_lock = threading.Lock()
_local = threading.local()


class _Semaphore:
    """A POSIX semaphore (glibc's ``sem_t`` is 32 bytes) and whether a marker holds it."""

    __slots__ = ("buf", "address", "pending")

    def __init__(self) -> None:
        self.buf = (ctypes.c_long * 8)()
        self.address = ctypes.c_void_p(ctypes.addressof(self.buf))
        self.pending = False
        if _libc.sem_init(self.address, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "sem_init failed")

    def wait(self) -> None:
        """Until the engine has freed the marker that holds it (retried on signals, so
        Ctrl-C raises between tries)."""
        if _libc.sem_trywait(self.address) != 0:
            while _libc.sem_wait(self.address) != 0:
                if ctypes.get_errno() != errno.EINTR:
                    break
        self.pending = False


class _Thread:
    __slots__ = ("calls", "exempt", "semaphore")

    def __init__(self) -> None:
        self.calls = 0
        thread = threading.current_thread()
        # MXNet's workers are daemon threads; ours (customop-trace, customop-infer) run
        # forwards for a caller that waits for them
        self.exempt = thread.daemon or thread.name.startswith("customop-")
        self.semaphore: _Semaphore | None = None

    def __del__(self) -> None:  # the thread ended: its semaphore goes to the spares (not
        try:  # weakref.finalize, which would register an atexit hook)
            if self.semaphore is not None:
                _give_back(self.semaphore)
        except (AttributeError, TypeError):  # pragma: no cover - interpreter shutdown
            pass


def install() -> None:
    """Finds glibc's semaphores; without them (not Linux) :func:`step` does nothing."""
    global _libc, _noop, _post
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    for name in ("sem_init", "sem_wait", "sem_trywait", "sem_post", "labs"):
        if not hasattr(libc, name):  # pragma: no cover - a libc without POSIX semaphores
            return
    _noop = ctypes.c_void_p(ctypes.cast(libc.labs, ctypes.c_void_p).value)
    _post = ctypes.c_void_p(ctypes.cast(libc.sem_post, ctypes.c_void_p).value)
    _libc = libc


def step(outs: Any) -> None:
    """One call of ours on this thread returned ``outs`` (an NDArray or a list of them):
    every :data:`EVERY` calls, wait for the marker pushed :data:`EVERY` calls before, and
    push one on ``outs`` (see the module's doc)."""
    mine = getattr(_local, "thread", None)
    if mine is None:
        mine = _local.thread = _Thread()
    mine.calls += 1
    if mine.calls < EVERY:
        return
    mine.calls = 0
    if mine.exempt or _libc is None or hooks.tracing_now() is not None:
        return
    semaphore = mine.semaphore
    if semaphore is None:
        semaphore = mine.semaphore = _semaphore()
    elif semaphore.pending:
        semaphore.wait()
    arrays = [outs] if hasattr(outs, "handle") else list(outs)
    if not arrays:
        return
    handles = (ctypes.c_void_p * len(arrays))(*[a.handle.value for a in arrays])
    semaphore.pending = True
    rc = _LIB.MXEnginePushSyncND(
        _noop, semaphore.address, _post, ctypes.byref(_CPU), handles, len(arrays), None, 0,
        None, 1, _NAME,
    )  # fmt: skip
    if rc != 0:  # pragma: no cover - MXNet refused the push: nothing to wait for
        semaphore.pending = False


def _semaphore() -> _Semaphore:
    # A thread's semaphore goes back to the spares when the thread ends; a spare still
    # held by a marker (its thread ended first) is taken once the marker has run.
    with _spare_lock:
        for i, spare in enumerate(_spare):
            if not spare.pending or _libc.sem_trywait(spare.address) == 0:
                spare.pending = False
                del _spare[i]
                return spare
    return _Semaphore()


def _give_back(semaphore: _Semaphore) -> None:
    with _spare_lock:
        _spare.append(semaphore)
