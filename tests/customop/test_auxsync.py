"""One set of auxiliary states on every device, equal to one device on the whole batch: by
Trainer/Module alone (the auxsync patch) and by AuxSync."""

import os
import sys
import textwrap
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest

import ops
from customop import customop
from customop.distributed.auxsync import AuxSync
from tests import fresh

ROOT = Path(__file__).resolve().parents[2]
NUM_CLASS, DIM, BATCH, STEPS = 3, 4, 8, 4
TWO = [mx.cpu(0), mx.cpu(1)]


@customop("numpy", aux={"totals": lambda x, label, num_class=3, **_: (num_class, x[1])})
def class_totals(x, label, totals, *, num_class=3):
    """Identity; in training adds each row of x to its class's row of ``totals``."""
    if mx.autograd.is_training():
        np.add.at(totals, label.astype(np.int64), x)
    return x + 0


class_totals.def_grad(lambda ans, x, label, totals, **_: lambda g: g)
class_totals.def_grad(lambda ans, x, label, totals, **_: lambda g: np.zeros_like(label), argnum=1)


def _data():
    rng = np.random.RandomState(0)
    x = rng.randint(-3, 4, size=(STEPS * BATCH, DIM)).astype(np.float32)  # sums are exact
    y = rng.randint(0, NUM_CLASS, size=STEPS * BATCH).astype(np.float32)
    return x, y


def _reference(x, y, upto):
    want = np.zeros((NUM_CLASS, DIM))  # float64, written from the definition
    for row, label in zip(x[:upto], y[:upto]):
        want[int(label)] += row
    return want


class Net(mx.gluon.HybridBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = mx.gluon.nn.Dense(2, in_units=DIM)
            self.totals = self.params.get(
                "totals", shape=(NUM_CLASS, DIM), init=mx.init.Zero(), grad_req="null"
            )

    def hybrid_forward(self, F, x, label, totals):
        return self.dense(class_totals(x, label, totals, num_class=NUM_CLASS))


def _gluon(ctxs, kvstore, hybridize, sync=True):
    mx.random.seed(0)
    net = Net()
    net.initialize(mx.init.Xavier(), ctx=ctxs)
    if hybridize:
        net.hybridize()
    trainer = mx.gluon.Trainer(
        net.collect_params(), "sgd", {"learning_rate": 0.05}, kvstore=kvstore
    )
    syncer = AuxSync([net.totals], trainer) if sync else None
    x, y = _data()
    for step in range(STEPS):
        rows = slice(step * BATCH, (step + 1) * BATCH)
        xs = mx.gluon.utils.split_and_load(mx.nd.array(x[rows]), ctxs)
        ys = mx.gluon.utils.split_and_load(mx.nd.array(y[rows]), ctxs)
        with mx.autograd.record():
            losses = [(net(a, b) ** 2).sum() for a, b in zip(xs, ys)]
        for loss in losses:
            loss.backward()
        trainer.step(BATCH)
        if syncer:
            syncer()
        for copy in net.totals.list_data():  # no waitall: the read sees the synced value
            np.testing.assert_array_equal(copy.asnumpy(), _reference(x, y, rows.stop))
    return net


@pytest.mark.parametrize("kvstore", ["device", "local"])
@pytest.mark.parametrize("hybridize", [False, True], ids=["plain", "hybridized"])
def test_gluon_two_devices_hold_the_one_device_value(kvstore, hybridize):
    two = _gluon(TWO, kvstore, hybridize)
    one = _gluon([mx.cpu(0)], kvstore, hybridize)
    np.testing.assert_allclose(
        two.dense.weight.data(TWO[1]).asnumpy(),
        one.dense.weight.data().asnumpy(),
        rtol=1e-6,
        atol=1e-7,
    )


@pytest.mark.parametrize("kvstore", ["device", "local"])
@pytest.mark.parametrize("hybridize", [False, True], ids=["plain", "hybridized"])
def test_gluon_trainer_alone_keeps_the_one_device_value(kvstore, hybridize):
    # no AuxSync: Trainer.step keeps the copies equal (the assertions inside _gluon)
    two = _gluon(TWO, kvstore, hybridize, sync=False)
    one = _gluon([mx.cpu(0)], kvstore, hybridize, sync=False)
    np.testing.assert_allclose(
        two.dense.weight.data(TWO[1]).asnumpy(),
        one.dense.weight.data().asnumpy(),
        rtol=1e-6,
        atol=1e-7,
    )


def _module(ctxs, kvstore, fit, by_hand=True):
    mx.random.seed(0)
    data, label = mx.sym.var("data"), mx.sym.var("label")
    out = mx.sym.FullyConnected(
        class_totals(data, label, num_class=NUM_CLASS, name="ct"), num_hidden=2, name="fc"
    )
    mod = mx.mod.Module(
        mx.sym.MakeLoss(mx.sym.sum(out * out)),
        data_names=["data"],
        label_names=["label"],
        context=ctxs,
    )
    mod.bind(data_shapes=[("data", (BATCH, DIM))], label_shapes=[("label", (BATCH,))])
    mod.init_params(mx.init.Xavier())
    mod.init_optimizer(kvstore=kvstore, optimizer_params={"learning_rate": 0.05})
    sync = AuxSync(mod) if by_hand else (lambda *_: None)
    assert not by_hand or sync.names == ["ct_totals"]
    x, y = _data()
    if fit:
        mod.fit(
            mx.io.NDArrayIter(x, y, batch_size=BATCH),
            num_epoch=2,
            kvstore=kvstore,
            eval_metric="loss",
            batch_end_callback=sync,
        )
        want = 2 * _reference(x, y, len(x))
    else:
        for step in range(STEPS):
            rows = slice(step * BATCH, (step + 1) * BATCH)
            mod.forward_backward(mx.io.DataBatch([mx.nd.array(x[rows])], [mx.nd.array(y[rows])]))
            mod.update()
            sync()
            for copy in mod._exec_group.aux_arrays[0]:
                np.testing.assert_array_equal(copy.asnumpy(), _reference(x, y, rows.stop))
        want = _reference(x, y, len(x))
    np.testing.assert_array_equal(mod.get_params()[1]["ct_totals"].asnumpy(), want)
    return mod


@pytest.mark.parametrize("kvstore", ["device", "local"])
@pytest.mark.parametrize("fit", [False, True], ids=["manual", "fit"])
@pytest.mark.parametrize("by_hand", [True, False], ids=["AuxSync", "alone"])
def test_module_two_devices_hold_the_one_device_value(kvstore, fit, by_hand):
    two = _module(TWO, kvstore, fit, by_hand).get_params()[0]["fc_weight"].asnumpy()
    one = _module([mx.cpu(0)], kvstore, fit, by_hand).get_params()[0]["fc_weight"].asnumpy()
    np.testing.assert_allclose(two, one, rtol=1e-5, atol=1e-6)


def test_bad_sources_are_named():
    p = mx.gluon.Parameter("w", shape=(2,))
    p.initialize()
    with pytest.raises(ValueError, match="AuxSync: Parameter 'w' has grad_req='write'"):
        AuxSync([p])
    with pytest.raises(TypeError, match="AuxSync: expected Gluon Parameters"):
        AuxSync([mx.nd.zeros(2)])


# ops.CenterLoss, the test case of issue #12: its centers move by a per-device normalised
# update, c_j += alpha * sum_{i: y_i = j} (x_i - c_j) / (1 + n_j), n_j counted on each device.
ALPHA, SCALE = 0.5, 0.7


def _center_reference(centers, feats, labels):
    """float64: the summed per-shard updates of ops.center_loss (alpha, 1 + n_j per shard)."""
    step = np.zeros_like(centers)
    for x, y in zip(feats, labels):
        for j in range(NUM_CLASS):
            mine = y == j
            step[j] += (x[mine] - centers[j]).sum(axis=0) / (1 + mine.sum())
    return centers + ALPHA * step


class CenterNet(mx.gluon.HybridBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.embed = mx.gluon.nn.Dense(DIM, in_units=DIM)
            self.center = ops.CenterLoss(NUM_CLASS, DIM, alpha=ALPHA, scale=SCALE)

    def hybrid_forward(self, F, x, label):
        feat = self.embed(x)
        return feat, self.center(feat, label)


def _center_steps(kvstore, hybridize, sync=True):
    """Train CenterNet on TWO; per step: (the centers' copies, float64 reference, whole batch)."""
    mx.random.seed(0)
    net = CenterNet(prefix="cn_")
    net.initialize(mx.init.Xavier(), ctx=TWO)
    if hybridize:
        net.hybridize()
    trainer = mx.gluon.Trainer(
        net.collect_params(), "sgd", {"learning_rate": 0.05}, kvstore=kvstore
    )
    syncer = AuxSync([net.center.centers], trainer) if sync else None
    x, y = _data()
    want = np.zeros((NUM_CLASS, DIM))  # float64 reference of the per-shard updates, summed
    whole = np.zeros((NUM_CLASS, DIM))  # one device on the whole batch (same features)
    for step in range(STEPS):
        rows = slice(step * BATCH, (step + 1) * BATCH)
        xs = mx.gluon.utils.split_and_load(mx.nd.array(x[rows]), TWO)
        ys = mx.gluon.utils.split_and_load(mx.nd.array(y[rows]), TWO)
        before = [c.asnumpy().astype(np.float64) for c in net.center.centers.list_data()]
        with mx.autograd.record():
            outs = [net(a, b) for a, b in zip(xs, ys)]
        mx.autograd.backward([loss for _, loss in outs])
        trainer.step(BATCH)
        if syncer:
            syncer()
        feats = [feat.asnumpy().astype(np.float64) for feat, _ in outs]
        labels = [b.asnumpy().astype(np.int64) for b in ys]
        for (_, loss), f, lab, c in zip(outs, feats, labels, before):  # each device's centers
            np.testing.assert_allclose(
                loss.asnumpy(), 0.5 * SCALE * ((f - c[lab]) ** 2).sum(axis=1), rtol=1e-5, atol=1e-5
            )
        want = _center_reference(want, feats, labels)
        whole = _center_reference(whole, [np.concatenate(feats)], [np.concatenate(labels)])
        yield net, [c.asnumpy() for c in net.center.centers.list_data()], want, whole


@pytest.mark.parametrize("kvstore", ["device", "local"])
@pytest.mark.parametrize("hybridize", [False, True], ids=["plain", "hybridized"])
@pytest.mark.parametrize("by_hand", [True, False], ids=["AuxSync", "standard-loop"])
def test_ops_center_loss_on_two_devices_holds_one_set_of_centers(kvstore, hybridize, by_hand):
    steps = list(_center_steps(kvstore, hybridize, sync=by_hand))
    for _, copies, want, _ in steps:
        np.testing.assert_array_equal(copies[1], copies[0])  # after every step
        np.testing.assert_allclose(copies[0], want, rtol=1e-5, atol=1e-5)
    net, _, want, whole = steps[-1]
    assert net.center.centers.name == "cn_centerloss0_centers"
    assert np.abs(want).max() > 0.5  # the centers moved
    assert np.abs(want - whole).max() > 1e-2  # the per-shard normalisation, as documented
    weights = net.embed.weight.list_data()  # the Trainer kept the weights equal as well
    np.testing.assert_array_equal(weights[1].asnumpy(), weights[0].asnumpy())


def test_ops_center_loss_with_the_auxsync_patch_off_the_centers_go_wrong():
    # MXNet's own behaviour, what the auxsync patch and AuxSync fix: in a fresh process
    out = fresh.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
        import numpy as np
        from tests.customop.test_auxsync import _center_steps
        steps = _center_steps("device", False, sync=False)
        _, copies, want, _ = next(steps)
        # The Trainer's first-step broadcast copies device 0's centers over device 1's update.
        np.testing.assert_array_equal(copies[1], copies[0])
        assert np.abs(copies[0] - want).max() > 1e-2
        _, copies, _, _ = next(steps)  # then every device goes its own way
        assert np.abs(copies[1] - copies[0]).max() > 1e-2
        from customop import runtime
        print(runtime.installed())
    """),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "CUSTOMOP_RUNTIME_OFF": "auxsync"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == (
        "['aux', 'backlog', 'binds', 'deps', 'errors', 'fork', 'names', 'release', 'runahead', "
        "'shapes']"
    )


def test_ops_center_loss_two_devices_bare_ndarrays_move_by_the_summed_shard_updates():
    centers = mx.gluon.Parameter(
        "centers", shape=(NUM_CLASS, DIM), init=mx.init.Zero(), grad_req="null"
    )
    centers.initialize(ctx=TWO)
    sync = AuxSync([centers])  # no kvstore: the devices of this process
    rng = np.random.RandomState(1)
    want = np.zeros((NUM_CLASS, DIM))
    for _ in range(3):
        x = rng.normal(size=(BATCH, DIM)).astype(np.float32)
        y = rng.randint(0, NUM_CLASS, size=BATCH)
        shards = (slice(0, BATCH // 2), slice(BATCH // 2, BATCH))
        for copy, rows in zip(centers.list_data(), shards):
            xs = mx.nd.array(x[rows], ctx=copy.context)
            xs.attach_grad()
            with mx.autograd.record():
                loss = ops.center_loss(
                    xs,
                    mx.nd.array(y[rows], ctx=copy.context),
                    copy,
                    num_class=NUM_CLASS,
                    alpha=ALPHA,
                    scale=SCALE,
                )
            loss.backward()
            diff = x[rows] - want[y[rows]]
            np.testing.assert_allclose(
                loss.asnumpy(), 0.5 * SCALE * (diff**2).sum(axis=1), rtol=1e-5, atol=1e-6
            )
            np.testing.assert_allclose(xs.grad.asnumpy(), SCALE * diff, rtol=1e-5, atol=1e-6)
        sync()
        want = _center_reference(want, [x[r] for r in shards], [y[r] for r in shards])
        for copy in centers.list_data():
            np.testing.assert_allclose(copy.asnumpy(), want, rtol=1e-5, atol=1e-6)
