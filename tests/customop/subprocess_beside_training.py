"""Threads start subprocesses while other threads train (issue #42, item 1).

``python tests/customop/subprocess_beside_training.py [--ops none|mxnet|numpy|both]
[--train N] [--spawn M] [--runs R]``: N threads train (a decorated op of each mode asked
for, then ``mx.nd.dot``, under ``mx.autograd.record()``, with backward) while M threads each
call ``subprocess.run([sys.executable, '-c', 'pass'])`` R times, from the trainers' first
step on; prints ``ok`` and exits 0 when every thread finished. ``--ops none`` trains MXNet's
own operators only. On Python 3.8 and 3.9 ``subprocess`` forks, and MXNet's fork handlers
stop its engine under the training threads (measured: docs/design.md, *Errors and
threads*, *subprocess beside training*). Run it under a timeout: a hang is the failure.
"""

import argparse
import subprocess
import sys
import threading

import mxnet as mx


def make_ops(which):
    if which == "none":
        return []
    from customop import customop

    ops = []
    if which in ("mxnet", "both"):

        @customop("mxnet", name="soak.sq_nd")
        def sq_nd(x):
            return x * x

        sq_nd.def_grad(lambda ans, x: lambda g: 2 * x * g)
        ops.append(sq_nd)
    if which in ("numpy", "both"):

        @customop("numpy", name="soak.sq_np")
        def sq_np(x):
            return x * x

        sq_np.def_grad(lambda ans, x: lambda g: 2 * x * g)
        ops.append(sq_np)
    return ops


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ops", choices=["none", "mxnet", "numpy", "both"], default="both")
    parser.add_argument("--train", type=int, default=2)
    parser.add_argument("--spawn", type=int, default=2)
    parser.add_argument("--runs", type=int, default=25)
    opts = parser.parse_args()
    ops = make_ops(opts.ops)
    failed = []
    spawning = threading.Event()
    spawning.set()
    # the spawners start once every trainer made a step: before an op of ours has run, the
    # process is native MXNet's (customop's patches are installed by the first call)
    started = threading.Barrier(opts.train + 1)

    def train(k):
        try:
            w = mx.nd.random.uniform(shape=(16, 16))
            x = mx.nd.random.uniform(shape=(8, 16))
            x.attach_grad()
            steps = 0
            while spawning.is_set() or steps < 20:
                with mx.autograd.record():
                    h = x
                    for op in ops:
                        h = op(h)
                    loss = mx.nd.dot(h, w).sum()
                loss.backward()
                x.grad.wait_to_read()
                steps += 1
                if steps == 1:
                    started.wait()
        except BaseException as exc:  # noqa: BLE001 - reported below
            failed.append(("train", k, repr(exc)))
            started.abort()

    def spawn(k):
        try:
            for _ in range(opts.runs):
                subprocess.run([sys.executable, "-c", "pass"], check=True)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failed.append(("spawn", k, repr(exc)))

    trainers = [threading.Thread(target=train, args=(k,)) for k in range(opts.train)]
    spawners = [threading.Thread(target=spawn, args=(k,)) for k in range(opts.spawn)]
    for t in trainers:
        t.start()
    try:
        started.wait()
    except threading.BrokenBarrierError:
        pass  # a trainer failed: reported below
    for t in spawners:
        t.start()
    for t in spawners:
        t.join()
    spawning.clear()
    for t in trainers:
        t.join()
    if failed:
        print("failed", failed, flush=True)
        sys.exit(1)
    print("ok", opts.ops, opts.train, opts.spawn, opts.runs, flush=True)


if __name__ == "__main__":
    main()
