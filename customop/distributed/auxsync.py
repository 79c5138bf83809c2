"""Keeping auxiliary states equal by hand: :class:`AuxSync`, for loops MXNet's trainers do not run.

``gluon.Trainer`` and ``Module`` keep our ops' aux states equal on every device and
worker by themselves (see :mod:`customop.aux_merge`).  :class:`AuxSync` runs
the same merge (each state's rule: ``'sum'``, ``'mean'``, ``'first'`` or ``'local'``)
after a step that neither runs: a hand-written kvstore loop, another trainer,
Parameters outside the Trainer's, or ``CUSTOMOP_RUNTIME_OFF=auxsync``::

    sync = AuxSync([net.centers], trainer)   # Gluon: the aux Parameters
    ...; my_update(); sync()

    sync = AuxSync(mod)                      # Module: found in its symbol
    ...; my_module_step(); sync()

    sync = AuxSync([net.centers], hvd)       # Horovod, gradients allreduced by hand
    ...; trainer.step(batch); sync()

Under Horovod, ``hvd.DistributedTrainer`` (and a Trainer or Module whose optimizer is
``hvd.DistributedOptimizer``) merge the states across the ranks by themselves; a
Trainer or Module Horovod does not drive leaves them to this call, and the next
training pass without it raises :class:`AuxStateError`.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import mxnet as mx

from .. import allreduce, aux_merge, registry
from ..aux_merge import AuxStateError, AuxStateWarning

__all__ = ["AuxSync", "AuxStateError", "AuxStateWarning"]

_int_keys = itertools.count(1 << 24)  # Gluon's Trainer uses keys 0..n-1


class AuxSync:
    """Sum per-device (and per-worker) deltas of auxiliary states after every training step.

    Needed only where no ``gluon.Trainer.step``/``update`` or ``Module.update`` runs the
    step (those keep their aux states equal by themselves, see the module doc): a
    hand-written kvstore loop, another trainer, Parameters outside the Trainer's, or
    ``CUSTOMOP_RUNTIME_OFF=auxsync``.  Calling it after such a step as well is harmless.

    Args:
        source: a ``mx.mod.Module`` after ``init_optimizer`` (its customop aux
            states are found in its symbol), or the Gluon ``Parameter``\\ s holding
            aux states (one, a list, or a ``ParameterDict``).
        kvstore: a Gluon ``Trainer`` (its kvstore; its first-step broadcast is done
            now, before any update), an ``mx.kv.KVStore``, the ``horovod.mxnet`` module
            in a Horovod job (its ranks, by ``hvd.allreduce_``), or ``None`` (Module: its
            own kvstore; Gluon: devices of this process only; refused in a Horovod job
            of several ranks).

    Create it before the first training step, at the same point on every worker;
    call it (no arguments, or as Module's ``batch_end_callback``) after every step.
    """

    def __init__(self, source: Any, kvstore: Any = None):
        labels: list[Any] = []
        if isinstance(source, mx.mod.Module):
            names, copies, kv, on_kv, labels = _module_aux(source)
            kv = kvstore if kvstore is not None else kv
            kv = allreduce.horovod_of(kv) or allreduce.horovod_of(source) or kv
            keys: list[Any] = [f"customop_aux:{n}" for n in names]
        else:
            names, copies = _gluon_aux(source)
            kv, on_kv = _gluon_kvstore(kvstore)
            keys = [next(_int_keys) for _ in names]
            labels = [None] * len(names)
        self.names = names
        self.copies = copies
        if isinstance(kv, allreduce.HorovodWorkers):
            self.kvstore: Any = kv
        else:
            self.kvstore = kv if kv is not None and kv.num_workers > 1 else None
            if self.kvstore is None and allreduce.horovod_ranks() > 1:
                raise ValueError(
                    f"customop.AuxSync: this is a Horovod job of {allreduce.horovod_ranks()} "
                    "ranks, and without Horovod the states would be merged on this process's "
                    "devices only; pass it: AuxSync([...], hvd) (import horovod.mxnet as hvd)"
                )
        if isinstance(self.kvstore, mx.kv.KVStore) and on_kv:
            raise ValueError(
                "customop.AuxSync: the kvstore runs the optimizer on its servers "
                "(update_on_kvstore=True), which would apply it to the aux deltas too; create "
                "the Trainer with update_on_kvstore=False (Module: set "
                "MXNET_UPDATE_ON_KVSTORE=0 before init_optimizer)"
            )
        if isinstance(self.kvstore, mx.kv.KVStore) and "async" in self.kvstore.type:
            raise ValueError(
                f"customop.AuxSync: kvstore {self.kvstore.type!r} does not wait for "
                "every worker's push, so deltas cannot be summed; use dist_sync"
            )
        self.keys = keys
        mx.nd.waitall()
        # Start from one value everywhere: the first device's (worker 0's, through the
        # Trainer's or Module's own broadcast of initial values).
        self._plan = aux_merge.Plan(names, copies, keys)
        for devs, label in zip(copies, labels):
            for d in devs:
                aux_merge.own(d, label)
            if aux_merge.copies_rule(devs) == "local":
                continue  # each copy keeps its own
            for d in devs[1:]:
                devs[0].copyto(d)
        if isinstance(self.kvstore, mx.kv.KVStore):
            for key, devs in zip(keys, copies):
                self.kvstore.init(key, mx.nd.zeros(devs[0].shape, devs[0].context, devs[0].dtype))
            self._plan.inited = set(keys)  # every worker starts from worker 0's value

    def __call__(self, *_: Any) -> None:
        """Add every device's and worker's change since the last step to every copy."""
        aux_merge.begin(self._plan)
        aux_merge.finish(self._plan, self.kvstore)

    def __repr__(self) -> str:
        engine = getattr(self.kvstore, "type", self.kvstore)
        where = "devices" if self.kvstore is None else f"devices and {engine}"
        return f"<customop.AuxSync {', '.join(self.names)} over {where}>"


def _gluon_aux(source: Any) -> tuple[list[str], list[list[mx.nd.NDArray]]]:
    if isinstance(source, mx.gluon.Parameter):
        params = [source]
    elif isinstance(source, mx.gluon.ParameterDict):
        params = list(source.values())
    else:
        params = list(source)
    for p in params:
        if not isinstance(p, mx.gluon.Parameter):
            raise TypeError(
                f"customop.AuxSync: expected Gluon Parameters holding aux states "
                f"(or a Module), got {type(p).__name__}"
            )
        if p.grad_req != "null":
            raise ValueError(
                f"customop.AuxSync: Parameter {p.name!r} has grad_req="
                f"{p.grad_req!r}; aux states are Parameters with grad_req='null'"
            )
    return [p.name for p in params], [p.list_data() for p in params]


def _gluon_kvstore(kvstore: Any) -> tuple[Any, bool]:
    horovod = allreduce.horovod_of(kvstore)
    if horovod is not None:  # the hvd module, or Horovod's trainer
        return horovod, False
    if isinstance(kvstore, mx.gluon.Trainer):
        trainer = kvstore
        aux_merge.initial_broadcast(trainer)  # initial values everywhere, before any update
        return trainer._kvstore, bool(trainer._update_on_kvstore)
    if kvstore is None or isinstance(kvstore, mx.kv.KVStore):
        return kvstore, False
    if isinstance(kvstore, str):
        return mx.kv.create(kvstore), False
    raise TypeError(
        f"customop.AuxSync: kvstore must be a Trainer, an mx.kv.KVStore, "
        f"horovod.mxnet (in a Horovod job) or None, got {type(kvstore).__name__}"
    )


def _module_aux(
    mod: mx.mod.Module,
) -> tuple[list[str], list[list[mx.nd.NDArray]], Any, bool, list[tuple[str, str]]]:
    if not (mod.binded and mod.params_initialized):
        raise ValueError(
            "customop.AuxSync: bind the Module and init_params (and init_optimizer "
            "for a kvstore) before creating AuxSync"
        )
    graph = json.loads(mod.symbol.tojson())
    nodes = graph["nodes"]
    wanted: dict[str, tuple[str, str]] = {}
    for node in nodes:
        op = (
            registry.lookup(node.get("attrs", {}).get("op_type", ""))
            if node["op"] == "Custom"
            else None
        )
        if op is not None and op.signature.aux:
            for entry, state in zip(node["inputs"][-len(op.signature.aux) :], op.signature.aux):
                wanted[nodes[entry[0]]["name"]] = (op.op_type, state)
    group = mod._exec_group
    names = [n for n in group.aux_names if n in wanted]
    copies = [group.aux_arrays[group.aux_names.index(n)] for n in names]
    return (
        names,
        copies,
        getattr(mod, "_kvstore", None),
        bool(getattr(mod, "_update_on_kvstore", False)),
        [wanted[n] for n in names],
    )
