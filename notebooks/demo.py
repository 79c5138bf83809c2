"""End-to-end demo: a small MLP trained with a decorated softmax cross-entropy loss.

Run with ``make demo``.  The loss is a plain NumPy function plus a gradient
closure (MinPy style); ``@customop('numpy')`` makes it an MXNet operator that
records under ``mx.autograd.record()`` like any native op.
"""

import mxnet as mx
import numpy

from customop import customop


@customop("numpy")
def softmax_ce(x, y):
    probs = numpy.exp(x - numpy.max(x, axis=1, keepdims=True))
    probs /= numpy.sum(probs, axis=1, keepdims=True)
    n = x.shape[0]
    return -numpy.sum(numpy.log(probs[numpy.arange(n), y])) / n


def softmax_ce_grad(ans, x, y):
    def grad(g):
        n = x.shape[0]
        probs = numpy.exp(x - numpy.max(x, axis=1, keepdims=True))
        probs /= numpy.sum(probs, axis=1, keepdims=True)
        probs[numpy.arange(n), y] -= 1
        return g * probs / n

    return grad


softmax_ce.def_grad(softmax_ce_grad)


def spirals(n_per_class=200, classes=3, seed=0):
    """The classic interleaved-spirals toy problem: not linearly separable."""
    rng = numpy.random.RandomState(seed)
    xs, ys = [], []
    for c in range(classes):
        r = numpy.linspace(0.05, 1, n_per_class)
        t = numpy.linspace(c * 4, (c + 1) * 4, n_per_class) + rng.normal(0, 0.2, n_per_class)
        xs.append(numpy.stack([r * numpy.sin(t), r * numpy.cos(t)], axis=1))
        ys.append(numpy.full(n_per_class, c))
    return numpy.concatenate(xs).astype("float32"), numpy.concatenate(ys).astype("int32")


def main(steps=400, batch=100):
    mx.random.seed(0)
    x_all, y_all = spirals()
    net = mx.gluon.nn.Sequential()
    net.add(mx.gluon.nn.Dense(64, activation="relu"), mx.gluon.nn.Dense(3))
    net.initialize(mx.init.Xavier())
    trainer = mx.gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 0.01})
    print(softmax_ce)
    rng = numpy.random.RandomState(1)
    first = None
    for step in range(1, steps + 1):
        idx = rng.randint(0, len(x_all), batch)
        x, y = mx.nd.array(x_all[idx]), mx.nd.array(y_all[idx], dtype="int32")
        with mx.autograd.record():
            loss = softmax_ce(net(x), y)
        loss.backward()
        trainer.step(1)  # the loss already averages over the batch
        value = float(loss.asscalar())
        first = first if first is not None else value
        if step == 1 or step % 50 == 0:
            print(f"step {step:4d}  loss {value:.4f}")
    pred = net(mx.nd.array(x_all)).asnumpy().argmax(axis=1)
    accuracy = float((pred == y_all).mean())
    print(f"loss {first:.3f} -> {value:.3f}; training accuracy {accuracy:.1%}")
    return first, value, accuracy


if __name__ == "__main__":
    main()
