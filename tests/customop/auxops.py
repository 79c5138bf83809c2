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
            self.count = self.params.get("count", shape=(1,), init=mx.init.Zero(), grad_req="null")

    def hybrid_forward(self, F, x, count):
        return self.op(self.dense(x), count)


def _column_shape(x, **_):
    return (x[1],)


@customop(
    "numpy",
    aux={
        "total": _column_shape,
        "average": (_column_shape, "mean"),
        "leader": (_column_shape, "first"),
        "own": (_column_shape, "local"),
        "steps": (lambda x: (1,), "first"),
    },
)
def merged(x, total, average, leader, own, steps):
    """Identity; every backward adds x's column sums to the first four states (merged by
    'sum', 'mean', 'first' and 'local') and 1 to ``steps`` (a schedule's counter, 'first')."""
    return x + 0


def _merged_grad(ans, x, total, average, leader, own, steps):
    def grad(g):
        for state in (total, average, leader, own):
            state += x.sum(axis=0)
        steps[...] += 1
        return g

    return grad


merged.def_grad(_merged_grad)
RULE_STATES = ("total", "average", "leader", "own", "steps")


class MergedBlock(mx.gluon.HybridBlock):
    """``merged`` then a Dense layer, owning ``merged``'s five states as Parameters (its
    backward, which moves them, runs where its input is differentiated)."""

    def __init__(self, dim, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = mx.gluon.nn.Dense(dim, in_units=dim)
            for name in RULE_STATES:
                shape = (1,) if name == "steps" else (dim,)
                setattr(
                    self,
                    name,
                    self.params.get(name, shape=shape, init=mx.init.Zero(), grad_req="null"),
                )

    def hybrid_forward(self, F, x, total, average, leader, own, steps):
        return self.dense(merged(x, total, average, leader, own, steps))


def merged_reference(shards):
    """float64 states after steps of ``shards[step][copy]`` (what ``merged``'s input held on
    each copy), from the rules' definitions: one dict per copy."""
    sums = np.array([[s.astype(np.float64).sum(axis=0) for s in step] for step in shards])
    steps, copies = sums.shape[:2]
    common = {
        "total": sums.sum(axis=(0, 1)),
        "average": sums.mean(axis=1).sum(axis=0),
        "leader": sums[:, 0].sum(axis=0),
        "steps": np.array([float(steps)]),
    }
    return [{**common, "own": sums[:, c].sum(axis=0)} for c in range(copies)]
