"""The one place that keeps an operator's auxiliary states identical on every device and worker.

MXNet keeps one copy of an aux state per device and never reconciles them:
Gluon's ``Trainer`` broadcasts it once, Module's kvstore skips it, and
``Module.get_params()`` averages diverged copies.  Here each training step's
change of an aux state is a *delta* (``copy - value when the step first used
it``), and the state's **merge rule** (``aux={'name': (shape_fn, rule)}``, one of
:data:`AUX_RULES`) says how the deltas of every device and worker become one:

* ``'sum'`` (the default): the deltas are added up.  For an additive update (a
  running count or sum) that is exactly what one device computes on the whole
  batch.  An update normalised per shard (a center loss divides each class's
  step by ``1 + n_j``, with ``n_j`` counted per device) is reproduced by no rule:
  ``benchmarks/aux_rules.py`` measures how far each lands.  Wrong for a counter
  of steps: it advances once per copy.
* ``'mean'``: their mean over every copy (a running average each device moves
  with its own shard; a step counter every copy advances alike).
* ``'first'``: the first device's (worker 0's) delta, as if the others had not
  run (a schedule, a value every copy computes alike).
* ``'local'``: nothing is merged: each copy keeps its own (per-device state);
  Gluon's first-step broadcast of it is undone.

The merged delta is summed over the workers through the kvstore (push, then
pull, so MXNet's engine orders them with the reads and writes of the arrays;
``'mean'`` also sums the copy counts, ``'first'`` pushes zeros on workers other
than rank 0), or over Horovod's ranks (``hvd.allreduce_``, where
``hvd.DistributedTrainer`` or ``hvd.DistributedOptimizer`` trains; the engines:
:mod:`customop.allreduce`), and ``value before the step + merged delta`` is
written into every copy.  All copies then hold the same value.  In a Horovod job a
Trainer or Module that Horovod does not drive merges nothing: ``AuxSync(..., hvd)``
does, and a training pass after a step without it raises :class:`AuxStateError`.

**Automatic** (the ``auxsync`` patch of :mod:`customop.runtime`, installed by the
first use of an op with aux states): every ``gluon.Trainer.step`` (or
``allreduce_grads`` + ``update``) whose parameters hold an aux state of our ops,
and every ``Module.update`` (so ``fit`` too) whose graph holds one, ends with
every copy equal.  Nothing to write beyond the standard loop.

**By hand**, :class:`customop.distributed.auxsync.AuxSync` runs the same sum
(:func:`begin` + :func:`finish`) after a step that neither runs.

The first time a training pass uses an aux array (and again after each sync),
:func:`touch` takes a copy of it (the *base*); the Trainer's or Module's step reads
every device's ``copy - base`` before MXNet's own first-step broadcast (from the
first device, after backward already moved each copy) overwrites them.

On a ``dist_*`` kvstore the servers must only add what workers push, so create the
``Trainer`` with ``update_on_kvstore=False`` (Module: ``MXNET_UPDATE_ON_KVSTORE=0``);
parameters are then updated on every worker from the same summed gradients (such a
Trainer's first-step broadcast is finished before any push: :func:`initial_broadcast`).
Where copies can drift and nothing keeps them equal, :class:`AuxStateWarning` says so
once, naming the op, the state and the fix.
"""

from __future__ import annotations

import os
import sys
import warnings
import weakref
from typing import Any

import mxnet as mx

from . import allreduce as workers_mod

_AUTO_KEY = 1 << 25  # + the parameter's index in its Trainer: the same on every worker

# How the copies of one aux state become one (aux={'name': (shape_fn, rule)}); see merge().
AUX_RULES = ("sum", "mean", "first", "local")

# What customop reads of MXNet's internals to keep aux states equal, the one list
# (tests/customop/test_aux_merge.py::test_the_mxnet_internals_we_read_are_there fails loudly when
# MXNet changes them).
MXNET_INTERNALS = {
    "gluon.Trainer": (
        "_params",
        "_kvstore",
        "_update_on_kvstore",
        "_kv_initialized",
        "_init_kvstore",
        "_params_to_init",
        "_init_params",
        "_kvstore_params",
    ),
    "mod.Module": ("_exec_group", "_kvstore", "_update_on_kvstore"),
    "DataParallelExecutorGroup": ("execs", "aux_names", "aux_arrays"),
}


class AuxStateWarning(UserWarning):
    """Copies of an operator's aux state can drift apart and nothing keeps them equal."""


class AuxStateError(RuntimeError):
    """A training pass in a Horovod job would move an aux state that the last step left
    unmerged (a Trainer or Module Horovod does not drive, and no ``AuxSync(..., hvd)``): the
    ranks' copies would drift apart."""


# ---- which arrays are aux states of our ops, and their value when a step first used them ----
class _Tracked:
    __slots__ = (
        "array",
        "base",
        "op_type",
        "state",
        "passes",
        "step_mark",
        "synced",
        "first",
        "last",
        "ranks_left",
    )

    def __init__(self, array, op_type, state):
        self.array, self.op_type, self.state = array, op_type, state
        self.base = None  # None: equal to the last synced value, untouched since
        self.passes = 0  # training passes since the last sync
        self.step_mark = 0
        self.synced = False
        self.first = self.last = 0  # touch() calls counted when the base was taken / last
        self.ranks_left = ""  # left unmerged by a step in a Horovod job: what stepped


_tracked: dict[int, _Tracked] = {}  # handle value -> the array (held) and its base
_rules: dict[tuple[str, str], str] = {}  # (op_type, state) -> merge rule, when not 'sum'
_COUNT_KEY = 1 << 28  # + an int key: the kvstore key of a 'mean' state's copy count


def declare_rules(op_type: str, rules: dict[str, str]) -> None:
    """The merge rule of each aux state of ``op_type`` (``aux=`` of the decorator)."""
    for state, rule in rules.items():
        if rule == "sum":
            _rules.pop((op_type, state), None)
        else:
            _rules[(op_type, state)] = rule


def rule_of(op_type: str, state: str) -> str:
    """The merge rule of an op's aux state: one of :data:`AUX_RULES`."""
    return _rules.get((op_type, state), "sum")


_touches = 0  # touch() calls so far
_tracking = False  # the auxsync patch is installed: bases come from touch()
_generation = 0  # bumps when a new array is tracked (plans are cached against it)
_steps = 0  # Trainer/Module steps seen in this process
_prune_at = 64
_warned: set = set()
UNSYNCED_PASSES = 8  # training passes of a multi-copy state with no step at all: warn


def start_tracking() -> None:
    """From now on, :func:`touch` records bases (called by the ``auxsync`` patch)."""
    global _tracking
    _tracking = True


def touch(arrays: list[mx.nd.NDArray], labels: list[tuple[str, str]]) -> None:
    """A training pass is about to use (and may update) these aux arrays; ``labels``: the
    ``(op_type, state name)`` of each."""
    if not _tracking:
        return
    global _generation, _touches
    _touches += 1
    taken = []
    for a, (op_type, state) in zip(arrays, labels):
        entry = _tracked.get(a.handle.value)  # held here, so its handle is not reused
        if entry is None or entry.op_type == "?":
            if entry is None:
                entry = _tracked[a.handle.value] = _Tracked(a, op_type, state)
                _generation += 1
                if len(_tracked) > _prune_at:
                    _prune()
            entry.op_type, entry.state = op_type, state
        entry.last = _touches
        if entry.ranks_left:
            _ranks_unmerged(entry)
        if entry.base is None:
            with mx.autograd.pause():
                entry.base = a.copy()
            taken.append(entry.base)
            entry.passes, entry.step_mark, entry.first = 0, _steps, _touches
        else:
            entry.passes += 1
            _check_unsynced(entry)
    for base in taken:
        # Finished now: the op writes its aux arrays through copies whose engine variables
        # MXNet does not order with this read (see ``aux`` in customop.runtime); without the
        # wait, one loaded dist_sync run ended with a step's delta missing on a worker.
        base.wait_to_read()


def note_step() -> None:
    """A Trainer or Module step began (any, with or without aux states of ours)."""
    global _steps
    _steps += 1


def _prune() -> None:
    global _prune_at
    for key in [k for k, e in _tracked.items() if sys.getrefcount(e.array) <= 2]:
        del _tracked[key]  # only we held it: the array is gone for its user
    _prune_at = max(64, 2 * len(_tracked))


def _several_copies(entry: _Tracked) -> list[str]:
    # Copies: arrays of the same op, state and shape used on other devices while this one
    # was waiting for a sync (another model's, long gone, does not count).
    _prune()
    key = (entry.op_type, entry.state, entry.array.shape)
    places = sorted(
        {
            str(e.array.context)
            for e in _tracked.values()
            if (e.op_type, e.state, e.array.shape) == key and e.last >= entry.first
        }
    )
    workers = int(os.environ.get("DMLC_NUM_WORKER", "1") or 1)
    if os.environ.get("DMLC_ROLE") == "worker" and workers > 1:
        places.append(f"{workers} workers")
    return places if len(places) > 1 else []


def _check_unsynced(entry: _Tracked) -> None:
    if rule_of(entry.op_type, entry.state) == "local":
        return  # its copies are meant to differ
    if entry.synced and _steps == entry.step_mark:
        return  # accumulating over several passes before the next step
    if _steps > entry.step_mark:
        why = (
            "a gluon.Trainer or Module stepped, but it is not among that Trainer's "
            "parameters or that Module's graph"
        )
    elif entry.passes >= UNSYNCED_PASSES and not entry.synced:
        why = (
            f"{entry.passes} training passes ran with no gluon.Trainer.step/update, "
            "Module.update or AuxSync call"
        )
    else:
        return
    places = _several_copies(entry)
    if places:
        warn(
            entry.op_type,
            entry.state,
            f"its copies on {', '.join(places)} are updated and nothing keeps them equal ({why})",
            "put it in the parameters of the gluon.Trainer you step (e.g. the block that "
            "owns it in Trainer(net.collect_params(), ...)), or create "
            "customop.distributed.auxsync.AuxSync([...its Parameter...], trainer) and call "
            "it after every step",
            "unsynced",
        )


def _ranks_unmerged(entry: _Tracked) -> None:
    owner, entry.ranks_left = entry.ranks_left, ""
    if rule_of(entry.op_type, entry.state) == "local":
        return  # its copies are meant to differ
    raise AuxStateError(
        f"customop {entry.op_type!r} (aux state {entry.state!r}): the last {owner} step left "
        f"its copies unmerged: this is a Horovod job of {workers_mod.horovod_ranks()} ranks "
        f"and Horovod does not drive that {owner} (gradients summed by hand), so each rank's "
        "copy would drift apart. Fix: train with hvd.DistributedTrainer (or "
        "hvd.DistributedOptimizer), which merge it across the ranks themselves, or create "
        "customop.distributed.auxsync.AuxSync([...its Parameter...], hvd) before the first "
        "step and call it after every step"
    )


def warn(op_type: str, state: str, what: str, fix: str, kind: str) -> None:
    """One :class:`AuxStateWarning` per op, state and kind of problem."""
    if (op_type, state, kind) in _warned:
        return
    _warned.add((op_type, state, kind))
    warnings.warn(
        f"customop {op_type!r} (aux state {state!r}): {what}; the copies will drift "
        f"apart and whichever one is saved wins. Fix: {fix}.",
        AuxStateWarning,
        stacklevel=4,
    )


# ---- the sum over devices and workers, written once ------------------------------------------
class Plan:
    """The aux states of one Trainer, Module or AuxSync: copies, kvstore keys, the step."""

    def __init__(self, names: list[str], copies: list[list[mx.nd.NDArray]], keys: list[Any]):
        self.names, self.copies, self.keys = names, copies, keys
        self.pending: list | None = None  # per state: (rule, value before the step, delta)
        self.restore_local = False  # undo the coming step's overwrite of 'local' states
        self.inited: set = set()  # kvstore keys initialised
        self.counts_inited: set = set()  # keys whose copy-count key ('mean') is initialised
        self.generation = _generation
        self.group: Any = None  # a Module's executor group, for Modules


def _entry(copy: mx.nd.NDArray) -> _Tracked | None:
    entry = _tracked.get(copy.handle.value)
    return entry if entry is not None and entry.array is copy else None


def copies_rule(devs: list[mx.nd.NDArray]) -> str:
    """The merge rule of the aux state these arrays are copies of ('sum' if unknown)."""
    for d in devs:
        entry = _entry(d)
        if entry is not None and entry.op_type != "?":
            return rule_of(entry.op_type, entry.state)
    return "sum"  # never used by a training pass: no delta to merge anyway


def begin(plan: Plan) -> None:
    """Each state's value before the step and its local merged delta (async reads, before
    MXNet's first-step broadcast overwrites the copies)."""
    if plan.pending is not None:
        return
    pending = []
    for devs in plan.copies:
        rule = copies_rule(devs)
        if rule == "local":
            # each copy keeps its own: only what a Trainer's first step overwrites comes back
            pending.append((rule, [d.copy() for d in devs] if plan.restore_local else None, None))
            continue
        ctx = devs[0].context
        entries = [_entry(d) for d in devs]
        bases = [e.base if e is not None else None for e in entries]
        start = bases[0] if bases[0] is not None else devs[0]
        start = start.copy()
        total = None
        for k, (d, b) in enumerate(zip(devs, bases)):
            if b is None or (rule == "first" and k > 0):
                continue  # untouched since the last sync: no change of its own
            delta = d - b if d.context == ctx else d.as_in_context(ctx) - b.as_in_context(ctx)
            total = delta if total is None else total + delta
        pending.append((rule, start, total if total is not None else mx.nd.zeros_like(start)))
    plan.pending = pending


def _count_key(key: Any) -> Any:
    return key + _COUNT_KEY if isinstance(key, int) else f"{key}:count"


def finish(plan: Plan, kv: Any, priority_base: int = 0) -> None:
    """Merge the pending deltas over the workers (``kv``: a kvstore, or the engine of
    :mod:`customop.allreduce`; None: this process's devices only), write every
    copy, reset bases."""
    pending, plan.pending = plan.pending, None
    if pending is None:
        return
    workers = workers_mod.KVStoreWorkers(kv) if isinstance(kv, mx.kv.KVStore) else kv
    for i, (key, (rule, start, total), devs) in enumerate(zip(plan.keys, pending, plan.copies)):
        if rule == "local":
            for d, saved in zip(devs, start or ()):
                saved.copyto(d)
            _mark_synced(devs, None)
            continue
        count = None
        if rule == "mean":
            count = mx.nd.full((1,), len(devs), ctx=total.context, dtype=total.dtype)
        if workers is not None:
            priority = priority_base - i
            if key not in plan.inited:
                # Every worker starts from worker 0's value (dist_*: MXNet's own broadcast
                # of the initial value came after this step's updates).
                workers.start(key, start, priority)
                plan.inited.add(key)
            if rule == "first" and workers.rank != 0:
                total[:] = 0  # worker 0's first device wins
            workers.sum(key, total, priority, first=False)
            if count is not None:
                workers.sum(_count_key(key), count, priority, first=key not in plan.counts_inited)
                plan.counts_inited.add(key)
        if count is not None:
            total = mx.nd.broadcast_div(total, count.reshape((1,) * total.ndim))
        start += total
        for d in devs:
            start.copyto(d)
        _mark_synced(devs, start)
    for devs in plan.copies:
        for d in devs:
            d.wait_to_read()  # reads right after see the new values


def _mark_synced(devs: list[mx.nd.NDArray], value: mx.nd.NDArray | None) -> None:
    for d in devs:
        entry = _entry(d)
        if entry is not None:
            entry.synced, entry.passes, entry.step_mark = True, 0, _steps
            entry.ranks_left = ""
            # with tracking, the next pass takes its own base (a write between steps,
            # e.g. set_params, is not a delta); without, the synced value is the base
            entry.base = None if _tracking or value is None else value.copyto(d.context)


def _checked_kvstore(plan: Plan, kv: Any, on_kv: bool, owner: str) -> Any:
    """The kvstore to sum over workers with, or None (this process's devices only; warned)."""
    if kv is None or kv.num_workers <= 1:
        return None
    problem = None
    if not isinstance(kv, mx.kv.KVStore):
        problem = (
            f"the kvstore {type(kv).__name__} is not MXNet's KVStore, whose push and "
            "pull sum the workers' deltas",
            "use kvstore='dist_sync', or sum the deltas yourself with that kvstore",
        )
    elif "async" in kv.type:
        problem = (
            f"kvstore {kv.type!r} does not wait for every worker's push",
            "use kvstore='dist_sync'",
        )
    elif on_kv:
        problem = (
            "the kvstore runs the optimizer on its servers (update_on_kvstore=True), "
            "which would apply it to the aux deltas",
            "create the Trainer with update_on_kvstore=False (Module: set "
            "MXNET_UPDATE_ON_KVSTORE=0 before init_optimizer or fit)",
        )
    if problem is None:
        return kv
    for devs in plan.copies:
        entry = _entry(devs[0])
        if entry is not None:
            warn(
                entry.op_type,
                entry.state,
                f"{owner} keeps the copies on this worker's devices "
                f"equal but not across workers: {problem[0]}",
                problem[1],
                "kvstore",
            )
    return None


# ---- the automatic hooks: one Trainer or Module --------------------------------------------
def trainer_plan(trainer: mx.gluon.Trainer) -> Plan | None:
    """The aux states of our ops among ``trainer``'s parameters (cached), or None."""
    plan = getattr(trainer, "_customop_aux_plan", None)
    if plan is not None and (plan.pending is not None or plan.generation == _generation):
        return plan if plan.names else None
    names, copies, keys = [], [], []
    for i, p in enumerate(trainer._params):
        if p.grad_req != "null":
            continue
        try:
            data = p.list_data()
        except RuntimeError:  # not initialised yet
            continue
        if any(_entry(d) is not None for d in data):
            names.append(p.name)
            copies.append(data)
            keys.append(_AUTO_KEY + i)
    new = Plan(names, copies, keys)
    if plan is not None:
        new.inited, new.counts_inited = plan.inited, plan.counts_inited
    trainer._customop_aux_plan = new
    return new if names else None


def initial_broadcast(trainer: mx.gluon.Trainer) -> None:
    """Run the broadcast of initial values that ``trainer``'s first step would run, now, and
    wait for it.

    Under ``dist_*`` with ``update_on_kvstore=False``, MXNet's first step pulls every
    Parameter's initial value and then pushes its gradient through the same kvstore key,
    unordered (the pull writes the weights, the push reads the gradients): a pull that
    reaches the servers after every worker's push returns the summed gradient, and that
    worker trains from it (measured without customop: a plain Dense net on 2 workers, one
    worker's weights off by 25 in 3 runs of 20; 0 of 30 with this wait)."""
    if not trainer._kv_initialized:
        trainer._init_kvstore()
    before = list(trainer._params_to_init)
    if not before:
        return
    trainer._init_params()
    deferred = trainer._params_to_init  # not initialised yet: MXNet broadcasts them later
    for p in before:
        if not any(p is q for q in deferred):
            for d in p.list_data():
                d.wait_to_read()


def _updates_on_workers(trainer: mx.gluon.Trainer) -> bool:
    # What the Trainer's kvstore set-up will decide (mxnet.model._create_kvstore reads the
    # variable when the argument is None; a dist kvstore then updates on its servers).
    config = trainer._kvstore_params["update_on_kvstore"]
    if config is None:
        return not int(os.environ.get("MXNET_UPDATE_ON_KVSTORE", "1"))
    return not config


def trainer_begin(trainer: mx.gluon.Trainer) -> Plan | None:
    plan = trainer_plan(trainer)
    if plan is not None and _left_to_auxsync(
        plan, trainer, trainer._kvstore_params["kvstore"], "gluon.Trainer"
    ):
        return None
    if plan is not None:
        # the first step broadcasts every Parameter (under dist_*: worker 0's), 'local'
        # states too
        plan.restore_local = bool(trainer._params_to_init)
        begin(plan)  # reads the deltas before the broadcast below overwrites the copies
        if trainer._params_to_init and _updates_on_workers(trainer):
            # creating the kvstore early is safe: no optimizer goes to the servers
            if not trainer._kv_initialized:
                trainer._init_kvstore()
            kv = trainer._kvstore
            if kv is not None and "dist" in kv.type:
                initial_broadcast(trainer)  # MXNet's own first step races there
    return plan


def trainer_finish(plan: Plan, trainer: mx.gluon.Trainer) -> None:
    workers = workers_mod.horovod_of(trainer)  # hvd.DistributedTrainer, DistributedOptimizer
    if workers is None:
        workers = _checked_kvstore(
            plan, trainer._kvstore, bool(trainer._update_on_kvstore), "gluon.Trainer"
        )
    finish(plan, workers)


def _left_to_auxsync(plan: Plan, owner: Any, kvstore: Any, what: str) -> bool:
    """In a Horovod job of several ranks, a Trainer or Module that Horovod does not drive
    (its gradients summed by hand) merges nothing: ``AuxSync(..., hvd)`` after the step
    merges the devices' and ranks' deltas, and the next training pass without that call
    raises :class:`AuxStateError` (see :func:`touch`)."""
    if workers_mod.horovod_ranks() <= 1 or workers_mod.horovod_of(owner) is not None:
        return False
    if "dist" in str(getattr(kvstore, "type", kvstore) or ""):
        return False  # a dist_* kvstore joins the processes
    plan.pending = None
    for devs in plan.copies:
        for d in devs:
            entry = _entry(d)
            if entry is not None:
                entry.ranks_left = what
    return True


# executor -> the aux states of our ops in its graph, by name (noted by the ``aux`` patch)
_executor_states: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def note_executor(executor: mx.executor.Executor, names: list[str]) -> None:
    """``executor``'s graph holds aux states ``names`` of our ops (what the ``aux`` patch
    finds when the executor is made; :func:`module_plan` reads it)."""
    _executor_states[executor] = names


def module_plan(mod: mx.mod.Module) -> Plan | None:
    """The aux states of our ops in ``mod``'s executors (cached), or None."""
    group = getattr(mod, "_exec_group", None)
    plan = getattr(mod, "_customop_aux_plan", None)
    if plan is not None and plan.group is group:
        return plan if plan.names else None
    ours: set = set()
    for exe in getattr(group, "execs", ()):
        ours.update(_executor_states.get(exe, ()))
    names = [n for n in group.aux_names if n in ours] if ours else []
    copies = [group.aux_arrays[group.aux_names.index(n)] for n in names]
    plan = Plan(names, copies, [f"customop_auto:{n}" for n in names])
    plan.group = group
    mod._customop_aux_plan = plan
    return plan if names else None


def module_begin(mod: mx.mod.Module) -> Plan | None:
    plan = module_plan(mod)
    if plan is not None and _left_to_auxsync(plan, mod, mod._kvstore, "Module"):
        return None
    if plan is not None:
        begin(plan)
    return plan


def module_finish(plan: Plan, mod: mx.mod.Module) -> None:
    workers = workers_mod.horovod_of(mod)  # hvd.DistributedOptimizer
    if workers is None:
        workers = _checked_kvstore(plan, mod._kvstore, bool(mod._update_on_kvstore), "Module")
    finish(plan, workers)


def own(copy: mx.nd.NDArray, label: tuple[str, str] | None = None) -> None:
    # An array AuxSync keeps: without tracking its base is its value now (the value at the
    # last call after that); with tracking, the first pass of each step takes it.
    # ``label``: its (op_type, state) where AuxSync knows it (a Module's symbol).
    entry = _entry(copy)
    if entry is None:
        entry = _tracked[copy.handle.value] = _Tracked(copy, "?", "?")
    if label is not None and entry.op_type == "?":
        entry.op_type, entry.state = label
    if entry.base is None and not _tracking:
        entry.base = copy.copy()
