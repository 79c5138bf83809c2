"""What a thread that runs MXNet operators costs: MXNet's per-thread resources, never freed.

Run from the repository root (a few seconds)::

    .venv/bin/python benchmarks/thread_resources.py [--markdown]

Plain MXNet, no customop code.  Each row is a fresh process: the main thread runs the
work, then a ``threading.Thread`` runs it and ends, then a ``ThreadPoolExecutor`` thread
runs it and stays; after each, ``mx.nd.waitall()``, ``gc.collect()``, ``VmRSS`` and glibc's
``mallinfo2()`` (live mmapped allocations: the large ones).  The work is ``x * x``, a draw of
random numbers, or a sum, a convolution and ``topk`` (operators that ask MXNet for
temporary space) on ``(8, 64, 16, 16)`` floats.  customop's two helper threads
(``customop-trace``, ``customop-infer``) pay this once each (BENCHMARKS.md, *Peak memory of
the RetinaNet-style head*).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import subprocess
import sys
import threading

WORK = ["x * x", "random numbers", "sum, convolution, topk"]


def child(work: str) -> dict:
    from concurrent.futures import ThreadPoolExecutor

    import mallinfo
    import mxnet as mx

    libc = mallinfo.glibc()

    def run() -> None:
        x = mx.nd.ones((8, 64, 16, 16))
        if work == "x * x":
            (x * x).wait_to_read()
        elif work == "random numbers":
            mx.nd.random.normal(shape=(100,)).wait_to_read()
        else:
            mx.nd.sum(x, axis=1).wait_to_read()
            mx.nd.Convolution(
                x, mx.nd.ones((16, 64, 3, 3)), kernel=(3, 3), num_filter=16, no_bias=True
            ).wait_to_read()
            mx.nd.topk(x.reshape((8, -1)), k=3).wait_to_read()

    def reading() -> tuple:
        mx.nd.waitall()
        gc.collect()
        with open("/proc/self/status") as f:
            rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        return rss / 1024, libc.mallinfo2().hblkhd / 2**20

    found = {"before": reading()}
    run()
    found["main thread"] = reading()
    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    found["a thread, ended"] = reading()
    with ThreadPoolExecutor(1) as pool:
        pool.submit(run).result()
        found["a pool thread, alive"] = reading()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child)))
        return
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import mxnet as mx
    from tables import print_table

    print(
        f"# {datetime.date.today()}, Python {platform.python_version()}, MXNet "
        f"{mx.__version__}; each row a fresh process; RSS / live mmapped allocations, MiB"
    )
    rows = []
    for work in WORK:
        proc = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--child", work],
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
        found = json.loads(proc.stdout.strip().splitlines()[-1])
        rows.append([work, *(f"{r:.1f} / {m:.1f}" for r, m in found.values())])
    print_table(
        ["work", "before", "main thread", "a thread, ended", "a pool thread, alive"],
        rows,
        args.markdown,
        "---|---:|---:|---:|---:",
    )


if __name__ == "__main__":
    main()
