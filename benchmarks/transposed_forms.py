"""Forms of a transposed ``def_grad`` closure in a training graph, as raw MXNet graphs.

Run: ``python benchmarks/transposed_forms.py [--markdown] [--turns N] [--sizes 10,1000]``
(about 20 s on 2 cores).

The op is ``native_graphs.py``'s ``x * x`` with the closure ``lambda g: 2 * x * g``.  A
transposed closure is written ``forward(sg(x)) + c * (x - sg(x))``, here with
``c = 2 * sg(x)`` (``sg``: ``BlockGrad``; docs/deploying.md, "Gradients in training
graphs"); this closure is, operation for operation, the backward of MXNet's ``square``,
and the library writes ``square(x)`` (``customop.graphs.backward._own_operators``).
Each row is a Symbol written here by hand (one of them the library's own graph, from
``splice.inline``), run as
a hybridized ``SymbolBlock`` (``static_alloc``, ``static_shape``) forward and backward
under ``record()`` with a random head gradient, every call synchronised; turns round-robin
in a seeded shuffled order (each: one untimed call, then four timed ones).  Medians in ms,
and the ratio to MXNet's ``broadcast_mul(x, x)``.

Before timing, each row is compared bit for bit with NumPy in float32: the output
``x * x`` and the gradient ``(2 * x) * g``, the closure's numbers (the inputs include a
zero and a subnormal product ``x * g``); every row but the two native ones and the "cost
only" ones must agree.  MXNet's own gradient of ``x * x``, ``g * x + g * x``, does not at
the subnormal product.  The "cost only" rows measure what parts of a form cost: the form
without the coefficient and its multiply bounds any graph of this shape from below.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

import mxnet as mx
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tables import print_table  # noqa: E402

from customop import customop as decorate  # noqa: E402
from customop.graphs import splice  # noqa: E402

S = mx.sym


@decorate("mxnet", name="bench.square_own")
def square_own(x):
    return x * x


square_own.def_grad(lambda ans, x: lambda g: 2 * x * g)


def _spliced(size):
    sym = S.Custom(S.var("data"), op_type="bench.square_own")
    return splice.inline(sym, {"data": (size,)}, {"data": np.float32}, "train").symbol


def _form(fwd="broadcast_mul", add="elemwise_add", seed="sub", mul="elemwise_mul"):
    x = S.var("data")
    sg = S.BlockGrad(x)
    f = getattr(S, fwd)(sg, sg)
    d = S.elemwise_sub(x, sg) if seed == "sub" else S.elemwise_add(x, S.negative(sg))
    c = S._internal._mul_scalar(sg, scalar=2.0)
    if mul == "prelu":  # LeakyReLU's prelu: at d = 0 its gradient is gamma * g
        h = S.LeakyReLU(d, gamma=c, act_type="prelu")
    else:
        h = getattr(S, mul)(d, c)
    return S.add_n(f, h) if add == "add_n" else S.elemwise_add(f, h)


def _rows(size):
    x = S.var("data")
    sg = S.BlockGrad(x)
    return [  # (label, symbol, exact)
        ("native broadcast_mul(x, x)", S.broadcast_mul(x, x), False),
        ("native elemwise_mul(x, x)", S.elemwise_mul(x, x), False),
        ("the library's graph (splice.inline)", _spliced(size), True),
        ("MXNet's square(x): backward g * (2 * x)", S.square(x), True),
        ("form, fwd broadcast_mul", _form(), True),
        ("form, fwd elemwise_mul", _form(fwd="elemwise_mul"), True),
        ("form, add_n for the add", _form(add="add_n"), True),
        ("form, x + negative(sg) for x - sg", _form(seed="neg"), True),
        ("form, broadcast_mul for c * d", _form(mul="broadcast_mul"), True),
        ("form, LeakyReLU prelu(d, gamma=c) for c * d", _form(mul="prelu"), True),
        (
            "cost only: fwd(sg) + (x - sg)",
            S.elemwise_add(S.broadcast_mul(sg, sg), S.elemwise_sub(x, sg)),
            False,
        ),
        ("cost only: x * x + sg(x)", S.elemwise_add(S.broadcast_mul(x, x), sg), False),
    ]


def _inputs(size):
    rng = np.random.RandomState(0)
    x = rng.randn(size).astype("f")
    g = (rng.randn(size) * 4).astype("f")
    # a zero; a subnormal product, where MXNet's g * x + g * x is not the closure's (2 * x) * g
    x[:2], g[:2] = [0.0, 4.17022e-20], [5.0, 3.184612e-20]
    return x, g


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--sizes", default="10,1000")
    args = parser.parse_args(argv)
    table = []
    for size in [int(s) for s in args.sizes.split(",")]:
        xv, gv = _inputs(size)
        want_y, want_g = xv * xv, (np.float32(2) * xv) * gv
        x, g = mx.nd.array(xv), mx.nd.array(gv)
        x.attach_grad()
        steps, agrees = {}, {}
        for label, sym, exact in _rows(size):
            net = mx.gluon.SymbolBlock(sym, [S.var("data")])
            net.hybridize(static_alloc=True, static_shape=True)

            def step(net=net, x=x, g=g):
                with mx.autograd.record():
                    y = net(x)
                y.backward(g)
                x.grad.wait_to_read()
                return y

            y = step()
            same = np.array_equal(y.asnumpy(), want_y) and np.array_equal(x.grad.asnumpy(), want_g)
            assert same or not exact, label
            steps[label] = step
            agrees[label] = "yes" if same else "no"
        times = {label: [] for label in steps}
        rng = random.Random(0)
        for _ in range(max(args.turns, 2)):
            for label in rng.sample(list(steps), len(steps)):
                steps[label]()
                for _ in range(4):
                    t = time.perf_counter()
                    steps[label]()
                    times[label].append(time.perf_counter() - t)
        base = statistics.median(times["native broadcast_mul(x, x)"])
        for label in steps:
            m = statistics.median(times[label])
            table.append([f"{size:g}", label, agrees[label], f"{m * 1e3:.4f}", f"{m / base:.2f}x"])
    print(f"load average {os.getloadavg()[0]:.1f}; mxnet {mx.__version__}", file=sys.stderr)
    print_table(
        ["elements", "graph", "closure's numbers", "ms", "vs native"],
        table,
        args.markdown,
        "---|---|---|---:|---:",
    )


if __name__ == "__main__":
    import warnings

    warnings.filterwarnings("ignore", "Cannot decide type")
    main()
