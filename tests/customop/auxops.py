"""Operators with auxiliary states, shared by the aux tests (importable by subprocesses)."""
import mxnet as mx
import numpy as np

from customop import customop


@customop("numpy", aux={"count": lambda x: (1,)})
def counted(x, count):
    """x * 2; every backward adds 1 to ``count``."""
    return x * 2


def _counted_grad(ans, x, count):
    def grad(g):
        count[...] += 1
        return g * 2
    return grad


counted.def_grad(_counted_grad)


@customop("mxnet", aux={"count": lambda x: (1,)})
def counted_nd(x, count):
    return x * 2


def _counted_nd_grad(ans, x, count):
    def grad(g):
        count[:] = count + 1
        return g * 2
    return grad


counted_nd.def_grad(_counted_nd_grad)


@customop("numpy", aux={"seen": lambda x: (1,)})
def training_forwards(x, seen):
    """Identity; counts the forwards run in training mode (``mx.autograd.is_training()``)."""
    if mx.autograd.is_training():
        seen += 1
    return x + 0


training_forwards.def_grad(lambda ans, x, seen: lambda g: g)


@customop("numpy", aux={"sums": lambda x, label, num_class=3, **_: (num_class, x[1])})
def class_sums(x, label, sums, num_class=3):
    """Adds each row of x to its class's row of ``sums`` in backward (np.add.at)."""
    return (x * x).sum(axis=1)


def _class_sums_grad(ans, x, label, sums, num_class=3):
    def grad(g):
        np.add.at(sums, label.astype(np.int64), x)
        return 2 * x * g[:, None]
    return grad


class_sums.def_grad(_class_sums_grad)


class CountedBlock(mx.gluon.HybridBlock):
    """A Dense layer followed by ``counted``, which owns its count as a Parameter."""

    def __init__(self, op=counted, **kwargs):
        super().__init__(**kwargs)
        self.op = op
        with self.name_scope():
            self.dense = mx.gluon.nn.Dense(3)
            self.count = self.params.get("count", shape=(1,), init=mx.init.Zero(),
                                         grad_req="null")

    def hybrid_forward(self, F, x, count):
        return self.op(self.dense(x), count)
