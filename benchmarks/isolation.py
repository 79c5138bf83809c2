"""What importing and using customop costs code that does not use its ops: nothing, measured.

Runs the same unrelated models in fresh processes: without customop; with
``customop`` and ``ops`` imported; after ``ops.CenterLoss`` (an op with
auxiliary states, the case that once made every model synchronous) trained
a step elsewhere in the process; and after a hybridized block whose op was
inlined (the ``inline`` patch wraps ``bind``/``simple_bind`` and
``CachedOp.__init__``; the unrelated models are built after it), and after one whose
``def_grad`` op inlined (``ops.box_encode``, its closure transposed: issue 33), and after
``def_grad`` ops trained imperatively ran their native graphs (issue 41).  For each it
prints the step time of a hybridized Gluon MLP and of a Module-style bound
executor (forward+backward, then a wait), and how long ``block(x)`` /
``exe.forward()`` take to *return* (MXNet runs asynchronously: a call that
returns before its work is done is what lets the host run ahead of a GPU).
Ratios are against the first process.  A last row measures the first
process's models again after ``ops.CenterLoss`` trained a step in that same
process (no process-to-process variation).

``python benchmarks/isolation.py [--steps 200] [--markdown]``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.rounds import fresh_rounds  # noqa: E402
from benchmarks.tables import print_table  # noqa: E402

SETUPS = {
    "without customop": "",
    "customop, ops imported": "import customop, ops",
    "ops.CenterLoss used elsewhere": """
import customop, ops
center = ops.CenterLoss(num_class=4, feature_dim=8)
center.initialize()
center.hybridize()
f = mx.nd.random.normal(shape=(16, 8)); f.attach_grad()
with mx.autograd.record():
    l = center(f, mx.nd.array([0, 1, 2, 3] * 4))
l.backward()
center.centers.data().wait_to_read()
""",
    "an op inlined in a block elsewhere": """
import customop, ops
from customop import runtime
class Decode(mx.gluon.HybridBlock):
    def hybrid_forward(self, F, d, a):
        return ops.box_decode(d, a)
decode = Decode()
decode.hybridize()
d = mx.nd.random.normal(shape=(2, 8, 4)); d.attach_grad()
with mx.autograd.record():
    y = decode(d, mx.nd.ones((1, 8, 4)))
y.backward()
d.grad.wait_to_read()
assert "inline" in runtime.installed()
""",
    "a def_grad op inlined in a block elsewhere": """
import customop, ops
from customop import runtime
from customop.graphs import backward
class Encode(mx.gluon.HybridBlock):  # issue 33: its closure transposed into the graph
    def hybrid_forward(self, F, s, m, a, r, means, stds):
        return ops.box_encode(s, m, a, r, means, stds)[0]
encode = Encode()
encode.hybridize()
a = mx.nd.array([[[0, 0, 4, 4], [1, 1, 6, 5]]]); a.attach_grad()
with mx.autograd.record():
    y = encode(mx.nd.array([[1, 1]]), mx.nd.array([[0, 0]]), a,
               mx.nd.array([[[0, 0, 5, 5]]]), mx.nd.zeros((4,)), mx.nd.ones((4,)))
y.backward()
a.grad.wait_to_read()
assert "inline" in runtime.installed()
""",
    "a def_grad op trained imperatively elsewhere (its graph path)": """
import customop, ops
from customop import customop as decorate
@decorate("mxnet")
def square(x):
    return x * x
square.def_grad(lambda ans, x: lambda g: 2 * x * g)
x = mx.nd.ones((4, 3)); x.attach_grad()
for _ in range(3):  # a signature's second call runs the native graph (issue 41)
    with mx.autograd.record():
        y = square(x) + ops.smooth_l1(x, mx.nd.array([3.0]))
    y.backward()
x.grad.wait_to_read()
""",
}

MEASURE = """
import json, time
import numpy as np
STEPS = {steps}

def median_ms(fn):
    times = []
    for _ in range(STEPS):
        t = time.perf_counter(); fn(); times.append(time.perf_counter() - t)
    return 1e3 * float(np.median(times))

net = mx.gluon.nn.HybridSequential()
net.add(mx.gluon.nn.Dense(512, activation="relu"), mx.gluon.nn.Dense(512, activation="relu"),
        mx.gluon.nn.Dense(10))
net.initialize(mx.init.Xavier())
net.hybridize()
trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {{"learning_rate": 0.01}})
ce = mx.gluon.loss.SoftmaxCrossEntropyLoss()
x = mx.nd.random.normal(shape=(128, 256)); y = mx.nd.array(np.arange(128) % 10)

def gluon_step():
    with mx.autograd.record():
        l = ce(net(x), y)
    l.backward()
    trainer.step(128)
    l.wait_to_read()

def gluon_call():
    net(x)

data = mx.sym.var("data")
h = mx.sym.FullyConnected(data, num_hidden=512, name="fc1")
out = mx.sym.FullyConnected(mx.sym.Activation(h, act_type="relu"), num_hidden=10, name="fc2")
exe = mx.sym.SoftmaxOutput(out, name="softmax").simple_bind(mx.cpu(), data=(128, 256))
for name, arr in exe.arg_dict.items():
    arr[:] = np.random.normal(scale=0.05, size=arr.shape)

def executor_step():
    exe.forward(is_train=True)
    exe.backward()
    exe.grad_dict["fc1_weight"].wait_to_read()

def executor_call():
    exe.forward(is_train=False)

def measure():
    rows = {{}}
    for name, fn in [("gluon_step", gluon_step), ("executor_step", executor_step),
                     ("gluon_call", gluon_call), ("executor_call", executor_call)]:
        fn(); mx.nd.waitall()
        if name.endswith("_call"):
            def one(fn=fn):
                t = time.perf_counter(); fn(); elapsed = time.perf_counter() - t
                mx.nd.waitall()  # not timed: the next call starts from an idle engine
                return elapsed
            rows[name] = 1e3 * float(np.median([one() for _ in range(STEPS)]))
        else:
            rows[name] = median_ms(fn)
    return rows

before = measure()
{after}
print(json.dumps([before, measure()]))
"""


def program(setup: str, steps: int) -> str:
    """Code printing [rows measured after ``setup``, rows measured again after
    ``ops.CenterLoss`` ran]."""
    after = SETUPS["ops.CenterLoss used elsewhere"]
    return "import mxnet as mx\n" + setup + "\n" + MEASURE.format(steps=steps, after=after)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="alternate the three processes this many times; medians of rounds",
    )
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    runs = fresh_rounds(
        [(name, setup, {}) for name, setup in SETUPS.items()],
        args.rounds,
        lambda setup: program(setup, args.steps),
    )
    found = {name: [before for before, _ in rounds] for name, rounds in runs.items()}
    # the same models, measured again in the first process
    found["same process, then ops.CenterLoss used"] = [
        after for _, after in runs["without customop"]
    ]
    med = {
        name: {k: sorted(r[k] for r in runs)[len(runs) // 2] for k in runs[0]}
        for name, runs in found.items()
    }
    base = med["without customop"]
    header = [
        "process",
        "Gluon MLP step ms",
        "x",
        "executor step ms",
        "x",
        "block(x) returns ms",
        "exe.forward() returns ms",
    ]
    rows = []
    for name, m in med.items():
        rows.append(
            [
                name,
                f"{m['gluon_step']:.2f}",
                f"{m['gluon_step'] / base['gluon_step']:.2f}",
                f"{m['executor_step']:.2f}",
                f"{m['executor_step'] / base['executor_step']:.2f}",
                f"{m['gluon_call']:.3f}",
                f"{m['executor_call']:.3f}",
            ]
        )
    print_table(header, rows, args.markdown)


if __name__ == "__main__":
    main()
