"""Aux states kept equal by MXNet's own trainers (the auxsync patch); loud where they cannot be.

The sums themselves are checked against float64 references in test_auxsync.py (standard
loops, with and without AuxSync) and tests/test_dist_train.py (dist_sync workers)."""

import warnings

import mxnet as mx
import numpy as np
import pytest

from customop import aux_merge
from customop.distributed.auxsync import AuxStateWarning
from tests.customop.test_auxsync import (
    BATCH,
    DIM,
    NUM_CLASS,
    STEPS,
    TWO,
    CenterNet,
    _center_reference,
    _data,
)


def test_the_mxnet_internals_we_read_are_there():
    # If this fails, MXNet changed what customop.aux_merge reads: fix it there.
    p = mx.gluon.Parameter("w", shape=(2,), grad_req="null")
    p.initialize(ctx=TWO)
    trainer = mx.gluon.Trainer([p], "sgd", {"learning_rate": 0.1}, kvstore="device")
    x = mx.sym.var("x")
    mod = mx.mod.Module(
        mx.sym.MakeLoss(mx.sym.sum(mx.sym.FullyConnected(x, num_hidden=2))),
        data_names=["x"],
        label_names=None,
        context=TWO,
    )
    mod.bind(data_shapes=[("x", (4, 3))])
    mod.init_params()
    mod.init_optimizer(kvstore="device")
    owners = {
        "gluon.Trainer": trainer,
        "mod.Module": mod,
        "DataParallelExecutorGroup": mod._exec_group,
    }
    assert sorted(owners) == sorted(aux_merge.MXNET_INTERNALS)
    for owner, names in aux_merge.MXNET_INTERNALS.items():
        for name in names:
            assert hasattr(owners[owner], name), f"MXNet's {owner} has no {name}"
    assert not trainer._kv_initialized and trainer._params == [p]
    # The behaviour the hook is placed for: the first step() broadcasts the first device's
    # copy of every Parameter (grad_req='null' too) over the others, after backward.
    p.list_data()[1][:] = 5
    trainer.step(1)
    assert trainer._kv_initialized and not trainer._params_to_init
    np.testing.assert_array_equal(p.list_data()[1].asnumpy(), p.list_data()[0].asnumpy())
    assert p.list_data()[0].asnumpy().tolist() != [5, 5]
    assert isinstance(trainer._kvstore, mx.kv.KVStore) and trainer._update_on_kvstore
    assert trainer._kvstore_params == {"kvstore": "device", "update_on_kvstore": None}
    group = mod._exec_group
    assert group.aux_names == [] and group.aux_arrays == [] and len(group.execs) == 2
    assert isinstance(mod._kvstore, mx.kv.KVStore) and mod._update_on_kvstore


@pytest.mark.parametrize("update_on_kvstore", [None, False, True])
@pytest.mark.parametrize("variable", [None, "0", "1"])
def test_where_the_trainer_will_update_is_read_as_mxnet_decides_it(
    update_on_kvstore, variable, monkeypatch
):
    # aux_merge._updates_on_workers answers before the Trainer's kvstore exists (the hook finishes
    # the first-step broadcast early only where no optimizer goes to the servers).
    if variable is None:
        monkeypatch.delenv("MXNET_UPDATE_ON_KVSTORE", raising=False)
    else:
        monkeypatch.setenv("MXNET_UPDATE_ON_KVSTORE", variable)
    p = mx.gluon.Parameter("w", shape=(2,))
    p.initialize(ctx=TWO)
    trainer = mx.gluon.Trainer([p], "sgd", kvstore="local", update_on_kvstore=update_on_kvstore)
    predicted = aux_merge._updates_on_workers(trainer)
    trainer._init_kvstore()
    assert predicted == (not trainer._update_on_kvstore)


def test_the_first_step_broadcast_run_early_is_mxnets_own():
    p = mx.gluon.Parameter("w", shape=(2,), init=mx.init.One())
    p.initialize(ctx=TWO)
    trainer = mx.gluon.Trainer([p], "sgd", kvstore="local", update_on_kvstore=False)
    p.list_data()[1][:] = 5
    aux_merge.initial_broadcast(trainer)
    assert trainer._kv_initialized and trainer._params_to_init == []
    for copy in p.list_data():
        assert copy.asnumpy().tolist() == [1, 1]  # device 0's value everywhere


def _two_device_loop(trainer_params, steps, ctxs=TWO, call=None, kvstore="device", **trainer_args):
    mx.random.seed(0)
    net = CenterNet(prefix="cn_")
    net.initialize(mx.init.Xavier(), ctx=ctxs)
    params = trainer_params(net)
    trainer = (
        mx.gluon.Trainer(params, "sgd", {"learning_rate": 0.05}, kvstore=kvstore, **trainer_args)
        if params is not None
        else None
    )
    x, y = _data()
    want = np.zeros((NUM_CLASS, DIM))
    for step in range(steps):
        rows = slice((step % STEPS) * BATCH, (step % STEPS + 1) * BATCH)
        xs = mx.gluon.utils.split_and_load(mx.nd.array(x[rows]), ctxs)
        ys = mx.gluon.utils.split_and_load(mx.nd.array(y[rows]), ctxs)
        with mx.autograd.record():
            outs = [net(a, b) for a, b in zip(xs, ys)]
        mx.autograd.backward([loss for _, loss in outs])
        if call is not None:
            call(trainer, net)
        elif trainer is not None:
            trainer.step(BATCH)
        feats = [feat.asnumpy().astype(np.float64) for feat, _ in outs]
        want = _center_reference(want, feats, [b.asnumpy().astype(np.int64) for b in ys])
    return net, want


def test_allreduce_grads_then_update_keeps_one_set_of_centers():
    def call(trainer, net):
        trainer.allreduce_grads()  # the first one broadcasts device 0's copy: read before
        trainer.update(BATCH)

    net, want = _two_device_loop(
        lambda net: net.collect_params(), 3, call=call, update_on_kvstore=False
    )
    copies = [c.asnumpy() for c in net.center.centers.list_data()]
    np.testing.assert_array_equal(copies[1], copies[0])
    np.testing.assert_allclose(copies[0], want, rtol=1e-5, atol=1e-5)


def test_a_write_between_steps_is_not_a_delta():
    mx.random.seed(0)
    net = CenterNet(prefix="cn_")
    net.initialize(mx.init.Xavier(), ctx=TWO)
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05})
    x, y = _data()
    for step in range(2):
        if step == 1:
            net.center.centers.set_data(mx.nd.ones((NUM_CLASS, DIM)))  # e.g. a reload
            want = _center_reference(np.ones((NUM_CLASS, DIM)), *_shards(net, x, y, step))
        xs, ys = _split(x, y, step)
        with mx.autograd.record():
            outs = [net(a, b) for a, b in zip(xs, ys)]
        mx.autograd.backward([loss for _, loss in outs])
        trainer.step(BATCH)
    for copy in net.center.centers.list_data():
        np.testing.assert_allclose(copy.asnumpy(), want, rtol=1e-5, atol=1e-5)


def _split(x, y, step):
    rows = slice(step * BATCH, (step + 1) * BATCH)
    return (
        mx.gluon.utils.split_and_load(mx.nd.array(x[rows]), TWO),
        mx.gluon.utils.split_and_load(mx.nd.array(y[rows]), TWO),
    )


def _shards(net, x, y, step):
    xs, ys = _split(x, y, step)
    feats = [net.embed(a).asnumpy().astype(np.float64) for a in xs]
    return feats, [b.asnumpy().astype(np.int64) for b in ys]


def _caught(fn):
    aux_merge._warned.clear()
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        result = fn()
    return result, [w for w in got if issubclass(w.category, AuxStateWarning)]


def test_centers_outside_the_trainers_parameters_are_named_at_the_next_step():
    # The Trainer holds only the embedding: nothing keeps the two copies of the centers equal.
    (net, _), got = _caught(lambda: _two_device_loop(lambda net: net.embed.collect_params(), 3))
    assert len(got) == 1
    text = str(got[0].message)
    assert "customop 'ops.center_loss' (aux state 'centers')" in text
    assert "cpu(0), cpu(1)" in text and "not among that Trainer's parameters" in text
    assert "Fix:" in text and "AuxSync" in text
    copies = [c.asnumpy() for c in net.center.centers.list_data()]
    assert np.abs(copies[1] - copies[0]).max() > 1e-3  # what the warning is about


def test_a_custom_loop_without_any_trainer_is_named():
    def sgd(trainer, net):  # a hand-written optimizer: no Trainer, no Module, no AuxSync
        for p in net.embed.collect_params().values():
            for w, g in zip(p.list_data(), p.list_grad()):
                w[:] -= 0.05 * g

    (_, _), got = _caught(
        lambda: _two_device_loop(lambda net: None, aux_merge.UNSYNCED_PASSES + 2, call=sgd)
    )
    assert len(got) == 1
    assert "(aux state 'centers')" in str(got[0].message)
    assert "no gluon.Trainer.step/update, Module.update or AuxSync" in str(got[0].message)


class _TwoWorkerStore(mx.kv.base.TestStore):
    """A kvstore that is not MXNet's KVStore and says it has 2 workers (it sums this
    process's devices only)."""

    @property
    def num_workers(self):
        return 2


def test_a_kvstore_that_is_not_mxnets_is_named():
    # The devices of this process still agree; the other workers' deltas cannot be summed.
    (net, want), got = _caught(
        lambda: _two_device_loop(lambda net: net.collect_params(), 3, kvstore=_TwoWorkerStore())
    )
    assert len(got) == 1
    text = str(got[0].message)
    assert "customop 'ops.center_loss' (aux state 'centers')" in text
    assert "_TwoWorkerStore is not MXNet's KVStore" in text and "not across workers" in text
    assert "Fix: use kvstore='dist_sync'" in text
    copies = [c.asnumpy() for c in net.center.centers.list_data()]
    np.testing.assert_array_equal(copies[1], copies[0])
    np.testing.assert_allclose(copies[0], want, rtol=1e-5, atol=1e-5)


def test_standard_loops_and_one_device_do_not_warn():
    _, got = _caught(lambda: _two_device_loop(lambda net: net.collect_params(), 12))
    assert got == []

    def sgd(trainer, net):
        pass

    # one device: there is nothing to keep equal
    _, got = _caught(lambda: _two_device_loop(lambda net: None, 12, ctxs=[mx.cpu(0)], call=sgd))
    assert got == []


def test_gradient_accumulation_over_several_passes_sums_every_pass():
    mx.random.seed(0)
    net = CenterNet(prefix="cn_")
    net.initialize(mx.init.Xavier(), ctx=TWO)
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05})
    x, y = _data()
    common = np.zeros((NUM_CLASS, DIM))  # float64: each device moves its own copy per pass

    def accumulate():
        nonlocal common
        for _ in range(2):
            mine = [common.copy(), common.copy()]
            for micro in range(3):  # three passes, then one step
                feats, labels = _shards(net, x, y, micro)
                xs, ys = _split(x, y, micro)
                with mx.autograd.record():
                    outs = [net(a, b) for a, b in zip(xs, ys)]
                mx.autograd.backward([loss for _, loss in outs])
                mine = [_center_reference(c, [f], [lab]) for c, f, lab in zip(mine, feats, labels)]
            common = common + sum(c - common for c in mine)
            trainer.step(3 * BATCH)

    _, got = _caught(accumulate)
    assert got == []
    for copy in net.center.centers.list_data():
        np.testing.assert_allclose(copy.asnumpy(), common, rtol=1e-5, atol=1e-5)
