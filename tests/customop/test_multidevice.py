"""Decorated losses under Gluon's Trainer: two devices train like one (kvstore device, local)."""

import mxnet as mx
import numpy as np
import pytest

from customop import customop
from customop.dispatch import forced_path


@customop("mxnet")
def half_sq(pred, label):
    """Per-sample 0.5 * ||pred - label||^2."""
    return 0.5 * ((pred - label) ** 2).sum(axis=1)


half_sq.def_grad(lambda ans, pred, label: lambda g: g.reshape((-1, 1)) * (pred - label))
half_sq.def_grad(lambda ans, pred, label: lambda g: mx.nd.zeros_like(label), argnum=1)


@half_sq.twin("numpy")
def _half_sq_numpy(pred, label):
    return 0.5 * ((pred - label) ** 2).sum(axis=1)


_half_sq_numpy.def_grad(lambda ans, pred, label: lambda g: g[:, None] * (pred - label))
_half_sq_numpy.def_grad(lambda ans, pred, label: lambda g: np.zeros_like(label), argnum=1)


class Net(mx.gluon.HybridBlock):
    def __init__(self, loss, **kwargs):
        super().__init__(**kwargs)
        self.loss = loss
        with self.name_scope():
            self.dense = mx.gluon.nn.Dense(3, in_units=5)

    def hybrid_forward(self, F, x, label):
        return self.loss(self.dense(x), label)


def _train(ctxs, loss, kvstore, path):
    mx.random.seed(0)
    net = Net(loss, prefix="net_")
    net.initialize(mx.init.Xavier(), ctx=ctxs)
    if path == "hybridized":
        net.hybridize()
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, kvstore=kvstore)
    rng = np.random.RandomState(0)
    with forced_path("custom" if path == "custom" else None):
        for _ in range(4):
            x, y = rng.normal(size=(8, 5)), rng.normal(size=(8, 3))
            xs = mx.gluon.utils.split_and_load(mx.nd.array(x), ctxs)
            ys = mx.gluon.utils.split_and_load(mx.nd.array(y), ctxs)
            with mx.autograd.record():
                losses = [net(a, b) for a, b in zip(xs, ys)]
            for loss_value in losses:
                loss_value.backward()
            trainer.step(8)
    return [p.list_data() for p in net.collect_params().values()]


@pytest.mark.parametrize("mode", ["numpy", "mxnet"])
@pytest.mark.parametrize("path", ["plain", "custom", "hybridized"])
@pytest.mark.parametrize("kvstore", ["device", "local"])
def test_two_devices_train_like_one(mode, path, kvstore):
    loss = half_sq.numpy if mode == "numpy" else half_sq.mxnet
    one = _train([mx.cpu(0)], loss, kvstore, path)
    two = _train([mx.cpu(0), mx.cpu(1)], loss, kvstore, path)
    for (want,), copies in zip(one, two):
        for got in copies:
            np.testing.assert_allclose(got.asnumpy(), want.asnumpy(), rtol=1e-6, atol=4e-7)
        assert np.abs(want.asnumpy()).max() > 0.05
