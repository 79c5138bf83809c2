"""Native graphs (issue 28): an op inlined as MXNet operators vs its Custom node vs native.

Run: ``python benchmarks/native_graphs.py [--markdown] [--repeat N] [--onnxruntime PYTHON]``
(``make bench-native``).  Four tables, each timed round-robin in one process (turns in a
seeded shuffled order; each turn: one untimed lead-in call, then four timed ones; every
call synchronised):

1. Hybridized forward+backward of a decorated ``x * x`` with an automatic
   gradient: inlined (the default), the same block with its ``Custom`` node
   (``CUSTOMOP_RUNTIME_OFF=inline`` while the block is built), and the same
   composition written natively (``x * x`` on NDArrays records ``broadcast_mul``;
   ``F``'s ``x * x`` in a graph is ``elemwise_mul``, shown too); at 10, 1e3 and
   1e6 elements.  A ``def_grad`` twin (its closure ``2 x g`` is MXNet's gradient; since issue 51
   transposed all the same) and a surrogate-gradient twin (``3 x g``: its closure transposed
   into the graph), each inlined and as a ``Custom`` node.
2. Inference latency of a detection post-processing block (``ops.box_decode`` ->
   ``ops.box_nms`` -> ``ops.topk``): with ``Custom`` nodes; hybridized with
   training inlining (all three inlined since issue 33); exported with
   ``customop.export`` and loaded by ``SymbolBlock.imports`` (every op inlined); and the
   same composition written with MXNet's own operators.  With ``--onnxruntime PYTHON``
   (an interpreter with onnxruntime, e.g. ``.venv-ort/bin/python`` made by
   ``make bench-native``), the exported model converted by ``customop.to_onnx`` is timed
   there too, for information (another runtime, another process).
3. A training step (forward, backward, ``Trainer.step``, a wait) of the
   RetinaNet-style head of ``examples/retinanet_head.py`` (``ops.box_iou``,
   ``ops.box_encode``, ``ops.focal_loss``, ``ops.smooth_l1``), before (every op a
   ``Custom`` node) and after (the default: all four inlined; ``box_encode``'s inputs
   need no gradient there, so it runs its forward alone), beside
   ``benchmarks/composed.py``'s head written with MXNet's operators.
4. A hybridized training step of each example head (``examples/``: RetinaNet-style,
   Faster R-CNN-style, face embedding), its ops as ``Custom`` nodes and with the default
   inlining.

Outputs (and, for the head, the loss) are compared with the native variant's before timing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402
from tables import print_table  # noqa: E402  (benchmarks/ is sys.path[0] when run as a script)

import customop  # noqa: E402
from customop import customop as decorate  # noqa: E402
from customop import ops, runtime  # noqa: E402


@decorate("mxnet", name="bench.square")
def square(x):
    return x * x


@decorate("mxnet", name="bench.square_def_grad")
def square_def_grad(x):
    return x * x


square_def_grad.def_grad(lambda ans, x: lambda g: 2 * x * g)


@decorate("mxnet", name="bench.square_surrogate")
def square_surrogate(x):
    return x * x


# not MXNet's gradient of x * x (a surrogate): its training graph carries the transposed closure
square_surrogate.def_grad(lambda ans, x: lambda g: 3 * x * g)


class Fn(mx.gluon.HybridBlock):
    def __init__(self, fn, **kwargs):
        super().__init__(**kwargs)
        self.fn = fn

    def hybrid_forward(self, F, *xs):
        return self.fn(F, *xs)


def built(fn, inputs, inline=True, record=False):
    """A hybridized block of ``fn``, called once (its graph settles at the first call)."""
    old = os.environ.get("CUSTOMOP_RUNTIME_OFF")
    if not inline:
        os.environ["CUSTOMOP_RUNTIME_OFF"] = "inline"
    try:
        net = Fn(fn)
        net.hybridize(static_alloc=True, static_shape=True)
        if record:
            with mx.autograd.record():
                net(*inputs).backward()
        else:
            net(*inputs)
        mx.nd.waitall()
    finally:
        if old is None:
            os.environ.pop("CUSTOMOP_RUNTIME_OFF", None)
        else:
            os.environ["CUSTOMOP_RUNTIME_OFF"] = old
    return net


def without_lookup(net):
    """``net`` calling MXNet's CachedOp of its inlined graph directly, as before issue 32:
    the cost of the per-call signature lookup (which runs the ops' checks on a new
    signature) is the difference to the ``inlined`` row."""
    plan = runtime.patch("inline")._plans[id(net._cached_op)]
    ((inner, order),) = plan.by_graph.values()
    assert order is None
    net._cached_op = inner
    return net


def timed(fn):
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def round_robin(variants, repeat, calls=4):
    """Median ms per call: turns in a shuffled order (seeded), each one untimed lead-in call
    (it absorbs some of what the previous variant left behind: frees, engine threads
    waking) and ``calls`` timed ones, until each variant has about ``repeat`` timed calls.

    Shuffled, each variant follows each other about equally often.  (A rotating order
    does not: with three variants, the third always followed the second.  A variant run
    after a ``Custom``-node one pays for the threads it left busy: measured on the
    RetinaNet-style head, 1.12-1.16x native after the Custom-node variant against 1.06x
    with the two alone.)"""
    rng = random.Random(0)
    times = {label: [] for label, _ in variants}
    for _ in range(max(repeat // calls, 2)):
        for label, fn in rng.sample(variants, len(variants)):
            fn()
            times[label] += [timed(fn) for _ in range(calls)]
    return {label: statistics.median(t) for label, t in times.items()}


def training_table(repeat):
    rows = []
    for size in (10, 1000, 1000000):
        x = mx.nd.array(np.random.RandomState(0).rand(size).astype(np.float32))
        x.attach_grad()
        nets = {
            "native broadcast_mul": built(lambda F, v: F.broadcast_mul(v, v), [x], record=True),
            "native x*x (elemwise_mul)": built(lambda F, v: v * v, [x], record=True),
            "inlined": built(lambda F, v: square(v), [x], record=True),
            "inlined, no signature lookup": without_lookup(
                built(lambda F, v: square(v), [x], record=True)
            ),
            "Custom node": built(lambda F, v: square(v), [x], inline=False, record=True),
            "def_grad inlined": built(lambda F, v: square_def_grad(v), [x], record=True),
            "def_grad (Custom node)": built(
                lambda F, v: square_def_grad(v), [x], inline=False, record=True
            ),
            "surrogate def_grad, transposed": built(
                lambda F, v: square_surrogate(v), [x], record=True
            ),
            "surrogate def_grad (Custom node)": built(
                lambda F, v: square_surrogate(v), [x], inline=False, record=True
            ),
        }
        want = None
        for label, net in nets.items():
            with mx.autograd.record():
                y = net(x)
            y.backward()
            got = (y.asnumpy(), x.grad.asnumpy())
            if want is None:
                want = got
            scale = 1.5 if label.startswith("surrogate") else 1.0  # its gradient is 3x, not 2x
            assert np.allclose(got[0], want[0], rtol=1e-6), label
            assert np.allclose(got[1], want[1] * scale, rtol=1e-6), label

        def step(net, x=x):
            def run():
                with mx.autograd.record():
                    y = net(x)
                y.backward()
                x.grad.wait_to_read()

            return run

        reps = repeat if size < 1e6 else max(repeat // 10, 20)
        med = round_robin([(label, step(net)) for label, net in nets.items()], reps)
        base = med["native broadcast_mul"]
        for label, m in med.items():
            rows.append([f"{size:g}", label, f"{m:.3f}", f"{m / base:.2f}x"])
    return rows


class PostProcess(mx.gluon.HybridBlock):
    def __init__(self, native=False, **kwargs):
        super().__init__(**kwargs)
        self.native = native

    def hybrid_forward(self, F, offsets, scores, anchors):
        std = dict(std0=0.1, std1=0.1, std2=0.2, std3=0.2)
        if self.native:
            boxes = F.contrib.box_decode(offsets, anchors, format="corner", **std)
        else:
            boxes = ops.box_decode(offsets, anchors, format="corner", **std)
        dets = F.concat(F.zeros_like(scores), scores, boxes, dim=-1)
        nms = dict(overlap_thresh=0.5, valid_thresh=0.05, force_suppress=True)
        kept = F.contrib.box_nms(dets, **nms) if self.native else ops.box_nms(dets, **nms)
        best = kept.slice_axis(axis=-1, begin=1, end=2).reshape((0, -1))
        return F.topk(best, k=100, ret_typ="value") if self.native else ops.topk(best, k=100)


def postprocess_table(repeat, images, anchors, onnxruntime):
    rng = np.random.RandomState(0)
    xy = rng.rand(1, anchors, 2) * 600
    inputs = [
        mx.nd.array(rng.randn(images, anchors, 4) * 0.3, dtype="float32"),
        mx.nd.array(rng.rand(images, anchors, 1), dtype="float32"),
        mx.nd.array(
            np.concatenate([xy, xy + 16 + rng.rand(1, anchors, 2) * 100], -1), dtype="float32"
        ),
    ]

    def hybrid(net, inline=True):
        old = os.environ.get("CUSTOMOP_RUNTIME_OFF")
        if not inline:
            os.environ["CUSTOMOP_RUNTIME_OFF"] = "inline"
        net.hybridize(static_alloc=True, static_shape=True)
        net(*inputs)
        mx.nd.waitall()
        if old is None:
            os.environ.pop("CUSTOMOP_RUNTIME_OFF", None)
        else:
            os.environ["CUSTOMOP_RUNTIME_OFF"] = old
        return net

    work = tempfile.mkdtemp(prefix="customop-bench-")
    done = customop.export(PostProcess(), os.path.join(work, "post"), *inputs)
    imported = mx.gluon.SymbolBlock.imports(done.symbol_file, list(done.inputs), done.params_file)
    imported.hybridize(static_alloc=True, static_shape=True)
    nets = {
        "native composition": hybrid(PostProcess(native=True)),
        "Custom nodes": hybrid(PostProcess(), inline=False),
        "hybridized (all inlined for training)": hybrid(PostProcess()),
        "exported (all inlined), SymbolBlock.imports": imported,
    }
    want = nets["native composition"](*inputs).asnumpy()
    for label, net in nets.items():
        got = net(*inputs).asnumpy()
        assert np.allclose(got, want, rtol=1e-5, atol=1e-5), label
    med = round_robin(
        [(label, lambda n=net: n(*inputs).wait_to_read()) for label, net in nets.items()], repeat
    )
    base = med["native composition"]
    rows = [[label, f"{m:.3f}", f"{m / base:.2f}x"] for label, m in med.items()]
    if onnxruntime:
        onnx_file = os.path.join(work, "post.onnx")
        converted = customop.to_onnx(done, onnx_file)
        np.savez(
            os.path.join(work, "inputs.npz"),
            **{n: a.asnumpy() for n, a in zip(done.inputs, inputs)},
        )
        out = subprocess.run(
            [
                onnxruntime,
                "-c",
                ORT_TIMING,
                onnx_file,
                os.path.join(work, "inputs.npz"),
                json.dumps(converted.inputs),
                str(repeat),
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if out.returncode:
            raise SystemExit(out.stderr)
        m, ok = json.loads(out.stdout.strip().splitlines()[-1])
        got = np.load(os.path.join(work, "ort_out.npy"))
        same = np.allclose(got, want, rtol=1e-5, atol=1e-5)
        rows.append(
            [
                f"ONNX Runtime (onnxruntime {ok}, for information)",
                f"{m:.3f}",
                f"{m / base:.2f}x" + ("" if same else " (outputs differ!)"),
            ]
        )
    return rows


def head_table(turns, batch=2, channels=8, size=4, num_gt=2):
    import composed  # benchmarks/composed.py: the head written with MXNet's operators
    import retinanet_head

    data = composed.make_batch(batch, channels, size, num_gt)
    heads = composed.make_heads(channels, size)
    before = retinanet_head.RetinaHead(
        retinanet_head.make_anchors(size, size), channels=channels, prefix="head_"
    )
    before.initialize()
    for name, p in before.collect_params().items():
        p.set_data(heads["ours"].collect_params()[name].data().copy())
    os.environ["CUSTOMOP_RUNTIME_OFF"] = "inline"
    try:
        before.hybridize()
        composed.loss_and_grads(before, data)  # its CachedOp settles now, without inlining
    finally:
        os.environ.pop("CUSTOMOP_RUNTIME_OFF")
    heads = {
        "native": heads["native"],
        "before: Custom nodes": before,
        "after (default inlining)": heads["ours"],
    }
    want = composed.loss_and_grads(heads["native"], data)[0]
    for label, head in heads.items():
        assert np.allclose(composed.loss_and_grads(head, data)[0], want, rtol=1e-5), label
    trainers = {
        k: mx.gluon.Trainer(h.collect_params(), "sgd", {"learning_rate": 1e-4})
        for k, h in heads.items()
    }
    med = round_robin(
        [(k, lambda k=k: composed._step(heads[k], trainers[k], data)) for k in heads], turns
    )
    base = med["native"]
    anchors = size * size * len(retinanet_head.SIZES)
    return [
        [f"{batch}x{channels}x{size}x{size}, {anchors} anchors", k, f"{m:.3f}", f"{m / base:.2f}x"]
        for k, m in med.items()
    ]


def examples_table(turns):
    """A hybridized training step of each example head: Custom nodes vs default inlining."""
    import four_paths

    rows = []
    for name in ("retinanet_head", "faster_rcnn_head", "face_embedding"):
        module = __import__(name)
        state = np.random.get_state()
        batch = [mx.nd.array(a) for a in module.make_batches(1)[0]]
        np.random.set_state(state)
        params = four_paths.initial_params(module.make_block)
        nets, trainers = {}, {}
        for label, inline in (("before: Custom nodes", False), ("after: default inlining", True)):
            old = os.environ.pop("CUSTOMOP_RUNTIME_OFF", None)
            if not inline:
                os.environ["CUSTOMOP_RUNTIME_OFF"] = "inline"
            try:
                net = four_paths._fresh(module.make_block, params)
                net.hybridize()
                trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.0})
                four_paths._gluon_step(net, trainer, [a.asnumpy() for a in batch])
            finally:
                os.environ.pop("CUSTOMOP_RUNTIME_OFF", None)
                if old is not None:
                    os.environ["CUSTOMOP_RUNTIME_OFF"] = old
            nets[label], trainers[label] = net, trainer

        def step(net, trainer, batch=batch):
            def run():
                with mx.autograd.record():
                    outs = four_paths._outputs(net(*batch))
                mx.autograd.backward(outs)
                trainer.step(1)
                mx.nd.waitall()

            return run

        med = round_robin([(label, step(nets[label], trainers[label])) for label in nets], turns)
        base = med["before: Custom nodes"]
        rows += [[name, label, f"{m:.3f}", f"{m / base:.2f}x"] for label, m in med.items()]
    return rows


ORT_TIMING = """
import json, os, statistics, sys, time
import numpy as np, onnxruntime as ort
path, data, names = sys.argv[1], np.load(sys.argv[2]), json.loads(sys.argv[3])
repeat = int(sys.argv[4])
options = ort.SessionOptions(); options.log_severity_level = 3
session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
feed = {n: data[n] for n in names}
out = session.run(None, feed)
np.save(os.path.join(os.path.dirname(path), "ort_out.npy"), out[0])
times = []
for _ in range(repeat):
    t = time.perf_counter(); session.run(None, feed); times.append((time.perf_counter() - t) * 1e3)
print(json.dumps([statistics.median(times), ort.__version__]))
"""


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--images", type=int, default=2)
    parser.add_argument("--anchors", type=int, default=1000)
    parser.add_argument("--quick", action="store_true", help="the small head only")
    parser.add_argument("--tables", default="1,2,3,4", help="which tables, e.g. 1,4")
    parser.add_argument(
        "--onnxruntime",
        default=None,
        help="a Python with onnxruntime (no MXNet needed) to time ONNX there",
    )
    args = parser.parse_args(argv)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(
        f"python {platform.python_version()}, mxnet {mx.__version__}, {os.cpu_count()} "
        f"CPUs, load {os.getloadavg()[0]:.1f}, {when}"
    )
    tables = {int(t) for t in args.tables.split(",")}
    if 1 in tables:
        print("\nHybridized forward+backward of a decorated x*x (median ms per step)\n")
        print_table(
            ["elements", "variant", "median ms", "vs native"],
            training_table(args.repeat),
            args.markdown,
        )
    if 2 in tables:
        postprocess(args)
    if 3 in tables:
        heads(args)
    if 4 in tables:
        print(
            "\nThe example heads (examples/), one hybridized training step, before and "
            "after (median ms)\n"
        )
        print_table(
            ["example", "variant", "median ms", "vs before"],
            examples_table(args.repeat // 2),
            args.markdown,
        )


def postprocess(args):
    print(
        f"\nPost-processing block inference, {args.images} images x {args.anchors} anchors "
        f"(median ms per call)\n"
    )
    print_table(
        ["variant", "median ms", "vs native"],
        postprocess_table(max(args.repeat // 4, 20), args.images, args.anchors, args.onnxruntime),
        args.markdown,
    )


def heads(args):
    print("\nRetinaNet-style head (examples/retinanet_head.py), one training step (median ms)\n")
    rows = head_table(args.repeat // 2)
    if not args.quick:
        rows += head_table(args.repeat // 2, batch=8, channels=64, size=16, num_gt=8)
    print_table(["head", "variant", "median ms", "vs native"], rows, args.markdown)


if __name__ == "__main__":
    main()
