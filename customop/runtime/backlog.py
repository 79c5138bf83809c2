"""The ``backlog`` fix: our ops' Python callbacks never pile up on MXNet's custom-op workers.

Off-switch: ``CUSTOMOP_RUNTIME_OFF=backlog``; in effect from the first call of a decorated
op that leaves Python to run in a backward (the ``function`` and ``custom`` paths, and
hybridized blocks whose graphs keep ``Custom`` nodes).

MXNet 1.9.1 runs every Python callback of a custom operator, and the backward of every
recorded function (``mx.autograd.Function`` and our ``function`` path), on the worker
threads of ``CustomOperator`` (``src/operator/custom/custom-inl.h``).  ``Push`` starts a
new thread whenever its queue holds more tasks than it has free workers, and no worker
ever ends.  A callback needs the GIL, which the training loop holds while it runs ahead:
a loop that does not read a result every step (``backward()`` returns at once) queues
one callback a step, every worker waits for the GIL, and each new task starts a thread.
Measured (``benchmarks/memory.py``, 1,000 floats, 2 cores): a hand-written ``CustomOp``
or our ``function`` path held 57-99 threads after 600 steps and 440-620 MiB resident,
against 8 threads and 195 MiB for the same loop in MXNet's own operators; the same
loops reading ``x.grad`` each step held 11 threads and 209 MiB.  ``MALLOC_ARENA_MAX=1``
changed nothing: the memory is the backlog (the queued steps' arrays, each worker's
state), not malloc arenas.

The fix: the thread that calls our ops counts the nodes of ours MXNet holds (recorded
function nodes, and operators MXNet created for ``Custom`` nodes, both freed by MXNet's
delete callbacks), and once :data:`LIMIT` more are alive than after its last wait, it
waits for MXNet's engine (``mx.nd.waitall()``, with the GIL released, so the queued
callbacks run).  A loop that reads its results every step never gets there; one that
does not waits once every :data:`LIMIT` calls.  Nothing waits on a thread MXNet started
(a callback's own thread: waiting there would wait for itself), nor where no Python
backward is queued.  Switched off, MXNet's workers grow with the backlog as they do for a
hand-written ``CustomOp``.

The wait is a synchronisation point, as MXNet's ``waitall()`` is: an earlier operator's
asynchronous failure is raised there (MXNet then clears every array's failure).  So it
is skipped while a failure of one of our callbacks waits for the reader of the arrays it
poisoned (:func:`customop.errors.pending`), which then gets it where it reads them.
"""

from __future__ import annotations

import threading
from typing import Any

import mxnet as mx

from .. import errors
from . import callbacks

LIMIT = 4  # our live nodes past the last wait before the calling thread waits for them
# the tables of our nodes MXNet holds, each emptied by MXNet's delete callbacks: operators
# (callbacks.watched) and recorded function nodes (customop.dispatch, which adds its own)
TABLES: list[Any] = [callbacks.watched]
_mark = threading.local()


def install() -> None:
    """Nothing to patch: :func:`throttle` acts where our ops are called."""


def throttle() -> None:
    """Called where a thread records one of our nodes (or MXNet creates an operator of ours).

    Waits for MXNet's engine when the nodes of ours MXNet holds (:data:`TABLES`) passed the
    count left after this thread's last wait by :data:`LIMIT` (see the module's doc);
    never on a daemon thread (MXNet's workers are).
    """
    live = sum(len(t) for t in TABLES)
    mark = getattr(_mark, "live", 0)
    if live < mark + LIMIT:
        if live < mark:
            _mark.live = live
        return
    if threading.current_thread().daemon:  # MXNet's workers (and daemon threads) never wait
        return
    if errors.pending():  # a failure of ours waits for its reader: waitall would clear it
        return
    mx.nd.waitall()
    _mark.live = live  # the nodes it freed lower the mark at the next call
