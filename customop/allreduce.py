"""The one place that adds an array up over a job's workers: MXNet's kvstore or Horovod.

:func:`customop.aux_merge.finish` merges each aux state's delta on this
process's devices, then needs three things of the engine that joins the processes:
start every worker from worker 0's value of a state, add a delta up over the
workers in place, and know this worker's rank.  Each engine is one small class
here, chosen by what trains:

* a ``dist_*`` kvstore (a ``gluon.Trainer``'s or a ``Module``'s, or the one given to
  ``AuxSync``): :class:`KVStoreWorkers`, the kvstore's ``init`` + ``pull`` and
  ``push`` + ``pull`` (its servers add what workers push);
* Horovod (``hvd.DistributedTrainer``, or ``hvd.DistributedOptimizer`` in a
  ``Trainer`` or ``Module``, or ``AuxSync(..., hvd)``): :class:`HorovodWorkers`,
  ``hvd.broadcast_`` from rank 0 and ``hvd.allreduce_`` with ``op=hvd.Sum`` over the
  trainer's process set.

Both run as operations of MXNet's engine, ordered with the reads and writes of the
arrays.  Horovod is never imported here: a trainer or optimizer of Horovod's means
the job imported ``horovod.mxnet`` already (:func:`horovod_of` looks in
``sys.modules``).
"""

from __future__ import annotations

import sys
from typing import Any

import mxnet as mx


class KVStoreWorkers:
    """Sums over the workers of a ``dist_sync`` kvstore."""

    def __init__(self, kv: Any):
        self.kv = kv
        self.rank = kv.rank

    def start(self, key: Any, value: mx.nd.NDArray, priority: int) -> None:
        """``value`` becomes worker 0's (the first push of a key: the servers keep it)."""
        self.kv.init(key, value)
        self.kv.pull(key, out=value, priority=priority)
        # MXNet does not order this pull with the push that follows (another array, the
        # same key): sent after every worker's push, it returns their sum (measured:
        # Module's centers 3.05 apart on 2 workers in 9 runs of 14; see
        # aux_merge.initial_broadcast). Wait for it, once per key.
        value.wait_to_read()

    def sum(self, key: Any, value: mx.nd.NDArray, priority: int, first: bool) -> None:
        """``value`` becomes the sum of every worker's ``value`` (``first``: the key's first
        use, which initialises it on the servers)."""
        if first:
            self.kv.init(key, mx.nd.zeros_like(value))
        self.kv.push(key, value, priority=priority)
        self.kv.pull(key, out=value, priority=priority)


class HorovodWorkers:
    """Sums over the ranks of a Horovod process set (``horovod.mxnet``'s in-place ops)."""

    def __init__(self, hvd: Any, process_set: Any = None):
        self.hvd = hvd
        self.process_set = process_set if process_set is not None else hvd.global_process_set
        self.rank = self.process_set.rank()
        self.size = self.process_set.size()

    def _name(self, key: Any, what: str) -> str:
        # Horovod matches one operation across ranks by its name; keys are the same on
        # every rank (the parameter's index in its Trainer, the aux state's name)
        return f"customop.aux.{key}.{what}"

    def start(self, key: Any, value: mx.nd.NDArray, priority: int) -> None:
        self.hvd.broadcast_(
            value,
            root_rank=0,
            name=self._name(key, "start"),
            priority=priority,
            process_set=self.process_set,
        )

    def sum(self, key: Any, value: mx.nd.NDArray, priority: int, first: bool) -> None:
        self.hvd.allreduce_(
            value,
            name=self._name(key, "delta"),
            priority=priority,
            op=self.hvd.Sum,
            process_set=self.process_set,
        )

    def __repr__(self) -> str:
        return f"Horovod ({self.size} ranks)"


def _horovod() -> Any:
    return sys.modules.get("horovod.mxnet")  # imported by the job, never by us


def horovod_of(owner: Any) -> HorovodWorkers | None:
    """Horovod's workers where ``owner`` (a ``gluon.Trainer``, a ``Module``, the ``hvd``
    module, or an optimizer) joins the ranks of a job of more than one, else None."""
    hvd = _horovod()
    if hvd is None:
        return None
    process_set = None
    if owner is hvd:
        process_set = hvd.global_process_set
    elif isinstance(owner, hvd.DistributedTrainer):
        process_set = owner._process_set
    else:
        optimizer = getattr(owner, "_optimizer", owner)
        if isinstance(optimizer, hvd.DistributedOptimizer):
            process_set = optimizer._process_set
    if process_set is None or not hvd.is_initialized():
        return None
    if not process_set.included() or process_set.size() <= 1:
        return None
    return HorovodWorkers(hvd, process_set)


def horovod_ranks() -> int:
    """How many ranks a Horovod job joined here has (1: none, or Horovod not initialised)."""
    hvd = _horovod()
    if hvd is None or not hvd.is_initialized():
        return 1
    return hvd.size()
