"""The ``auxsync`` patch: every copy of our ops' aux states agrees after a training step.

Off-switch: ``CUSTOMOP_RUNTIME_OFF=auxsync``; installed with ``aux``, by the first use
of an operator with aux states.

MXNet keeps one copy of an aux state per device and never reconciles them:
Gluon's ``Trainer`` broadcasts the first device's copy once, inside the first
``step()`` (after backward already moved each copy), and never again;
Module's kvstore skips aux states (measured with ``ops.CenterLoss`` on two devices:
docs/design.md, *What customop changes in MXNet*).  Wraps
``gluon.Trainer.step``, ``.allreduce_grads``, ``.update`` and
``mod.Module.update`` (so ``fit``): a Trainer whose parameters, or a Module
whose graph, hold aux states of our ops ends each step with every copy
equal to the devices' (and ``dist_sync`` workers') deltas merged by each
state's rule: summed by default, or their mean, or the first device's, or
none for ``'local'`` states, whose copies the first step's broadcast leaves
as they were (:mod:`customop.aux_merge`); under ``dist_*`` with
``update_on_kvstore=False`` such a Trainer's first step also finishes its
broadcast of initial values before any push (MXNet's does not order the two:
measured, a worker then starts from the summed gradient).  Any other Trainer or
Module runs MXNet's method unchanged.  The training passes of our ops (the ``aux``
classes above, recorded ``mx.nd.Custom`` calls) note the value of each aux
array the first time a step uses it.  No public hook exists: Gluon's
Trainer has no step callback, Module has one only in ``fit``.
"""

from __future__ import annotations

import functools

import mxnet as mx

from .. import aux_merge


def install() -> None:
    trainer, module = mx.gluon.Trainer, mx.mod.Module
    step, allreduce_grads, update = trainer.step, trainer.allreduce_grads, trainer.update
    module_update = module.update

    def _run(method, begin, finish, self, args, kwargs):
        aux_merge.note_step()
        plan = begin(self)
        if plan is None:
            return method(self, *args, **kwargs)
        try:
            out = method(self, *args, **kwargs)
        except BaseException:
            plan.pending = None
            raise
        if finish is not None:
            finish(plan, self)
        return out

    def step_(self, *args, **kwargs):
        return _run(step, aux_merge.trainer_begin, aux_merge.trainer_finish, self, args, kwargs)

    def allreduce_grads_(self, *args, **kwargs):
        # reads the deltas before the first call's broadcast; update() then finishes
        return _run(allreduce_grads, aux_merge.trainer_begin, None, self, args, kwargs)

    def update_(self, *args, **kwargs):
        return _run(update, aux_merge.trainer_begin, aux_merge.trainer_finish, self, args, kwargs)

    def module_update_(self, *args, **kwargs):
        return _run(
            module_update, aux_merge.module_begin, aux_merge.module_finish, self, args, kwargs
        )

    functools.update_wrapper(step_, step)
    functools.update_wrapper(allreduce_grads_, allreduce_grads)
    functools.update_wrapper(update_, update)
    functools.update_wrapper(module_update_, module_update)
    trainer.step, trainer.allreduce_grads, trainer.update = step_, allreduce_grads_, update_
    module.update = module_update_
    aux_merge.start_tracking()
