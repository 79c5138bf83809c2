"""AuxSync: one set of auxiliary states on every device, equal to one device on the whole batch."""
import mxnet as mx
import numpy as np
import pytest

from customop import customop
from customop.auxsync import AuxSync

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
            self.totals = self.params.get("totals", shape=(NUM_CLASS, DIM), init=mx.init.Zero(),
                                          grad_req="null")

    def hybrid_forward(self, F, x, label, totals):
        return self.dense(class_totals(x, label, totals, num_class=NUM_CLASS))


def _gluon(ctxs, kvstore, hybridize, sync=True):
    mx.random.seed(0)
    net = Net()
    net.initialize(mx.init.Xavier(), ctx=ctxs)
    if hybridize:
        net.hybridize()
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05},
                               kvstore=kvstore)
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
    np.testing.assert_allclose(two.dense.weight.data(TWO[1]).asnumpy(),
                               one.dense.weight.data().asnumpy(), rtol=1e-6, atol=1e-7)


def test_without_sync_the_devices_diverge():  # what AuxSync fixes (the test above can fail)
    with pytest.raises(AssertionError):
        _gluon(TWO, "device", False, sync=False)


def _module(ctxs, kvstore, fit):
    mx.random.seed(0)
    data, label = mx.sym.var("data"), mx.sym.var("label")
    out = mx.sym.FullyConnected(class_totals(data, label, num_class=NUM_CLASS, name="ct"),
                                num_hidden=2, name="fc")
    mod = mx.mod.Module(mx.sym.MakeLoss(mx.sym.sum(out * out)), data_names=["data"],
                        label_names=["label"], context=ctxs)
    mod.bind(data_shapes=[("data", (BATCH, DIM))], label_shapes=[("label", (BATCH,))])
    mod.init_params(mx.init.Xavier())
    mod.init_optimizer(kvstore=kvstore, optimizer_params={"learning_rate": 0.05})
    sync = AuxSync(mod)
    assert sync.names == ["ct_totals"]
    x, y = _data()
    if fit:
        mod.fit(mx.io.NDArrayIter(x, y, batch_size=BATCH), num_epoch=2, kvstore=kvstore,
                eval_metric="loss", batch_end_callback=sync)
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
def test_module_two_devices_hold_the_one_device_value(kvstore, fit):
    two = _module(TWO, kvstore, fit).get_params()[0]["fc_weight"].asnumpy()
    one = _module([mx.cpu(0)], kvstore, fit).get_params()[0]["fc_weight"].asnumpy()
    np.testing.assert_allclose(two, one, rtol=1e-5, atol=1e-6)


def test_bad_sources_are_named():
    p = mx.gluon.Parameter("w", shape=(2,))
    p.initialize()
    with pytest.raises(ValueError, match="AuxSync: Parameter 'w' has grad_req='write'"):
        AuxSync([p])
    with pytest.raises(TypeError, match="AuxSync: expected Gluon Parameters"):
        AuxSync([mx.nd.zeros(2)])
