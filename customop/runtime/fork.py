"""The ``fork`` patch: ``fork()`` and exit never wait for a callback that needs the GIL.

Off-switch: ``CUSTOMOP_RUNTIME_OFF=fork``; installed by the first call of a decorated op.

``os.register_at_fork(before=...)`` and ``atexit`` run MXNet's own fork
"prepare" and "parent" steps (``mxnet::pthread_atfork_prepare`` /
``pthread_atfork_parent``, exported by ``libmxnet.so``) once more, through
ctypes, so with the GIL released.  MXNet's prepare step, which also runs
inside every ``fork()``, joins its engine and CustomOp worker threads while
the forking thread holds the GIL; a Python callback still pending there (a
forward, or the deleter of a finished op, which MXNet's engine runs *after*
``waitall()`` returns) waits for the GIL forever (DataLoader workers, ``os.fork``
and ``subprocess`` hung after training calls; bounded waits for the deleters lost
the race under load; measured: docs/design.md, *Errors and threads*, *fork*).  Run
first with the GIL released, the same step drains the queues and *joins* those
threads, so every pending callback has finished when it returns, by construction
rather than by timing; the parent step starts fresh, idle threads, and the prepare
step inside ``fork()`` then has nothing left that needs Python.  Costs one engine
stop/start per fork (and at exit) in processes that ran a decorated op.  On Python < 3.10,
``subprocess`` forks without running ``os.register_at_fork`` handlers, so
``subprocess.Popen._execute_child`` runs the same step first.  Forks go one at a
time (a lock from the step before a fork to the fork's end): two threads forking at once
stopped MXNet's engine twice and hung.
"""
from __future__ import annotations

import atexit
import functools
import os
import subprocess
import sys
import threading

import mxnet as mx
from mxnet.base import _LIB

from . import MXNET_FORK_STEPS


@functools.lru_cache(maxsize=None)
def _fork_steps():
    try:
        steps = [getattr(_LIB, name) for name in MXNET_FORK_STEPS]
    except AttributeError:  # pragma: no cover - another build of MXNet
        return None
    for step in steps:
        step.restype = None
    return steps


def settle() -> None:
    """Finish every pending MXNet callback and join MXNet's worker threads, GIL released."""
    try:
        mx.nd.waitall()  # nothing may reach the CustomOp queue once its thread has stopped
    except Exception:  # noqa: BLE001 - the failure stays with MXNet's arrays; fork must go on
        pass
    steps = _fork_steps()
    if steps is None:  # pragma: no cover
        return
    prepare, parent = steps
    prepare()  # a ctypes call: the GIL is released while MXNet joins its threads
    parent()


# One fork at a time: a thread's settle() (MXNet's prepare step, GIL released) beside another
# thread's fork() (the same step inside it) stops MXNet's engine twice, and both wait forever
# (measured: two threads starting subprocesses at once hung a Python 3.8 test run).
_forking = threading.RLock()


def _before_fork() -> None:
    _forking.acquire()
    settle()


def _after_fork_in_parent() -> None:
    _forking.release()


def _after_fork_in_child() -> None:
    global _forking
    _forking = threading.RLock()  # the child has one thread: the one that forked


def install() -> None:
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                        after_in_child=_after_fork_in_child)
    atexit.register(settle)
    if sys.version_info < (3, 10):  # noqa: UP036 - Python 3.8 and 3.9 are supported
        execute_child = subprocess.Popen._execute_child

        def _execute_child(self, *args, **kwargs):
            with _forking:
                settle()
                return execute_child(self, *args, **kwargs)
        subprocess.Popen._execute_child = _execute_child
