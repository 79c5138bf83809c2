"""Operators pickle by reference: the same object back, and across multiprocessing children."""

import os
import pickle
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from customop import customop
from tests import concurrently, fresh
from tests.customop import auxops

ROOT = Path(__file__).resolve().parents[2]


@customop("mxnet", optional=("w",))
def _weighted(x, w=None, *, scale=1.0):
    return x * scale if w is None else x * w * scale


@_weighted.twin("numpy")
def _weighted_numpy(x, w=None, *, scale=1.0):
    return x * scale if w is None else x * w * scale


@pytest.mark.parametrize(
    "op",
    [auxops.counted, auxops.counted_nd, _weighted, _weighted.numpy, _weighted.variant(["x"])],
    ids=lambda o: o.op_type,
)
def test_pickle_returns_the_registered_op(op):
    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        assert pickle.loads(pickle.dumps(op, protocol)) is op


def test_unknown_op_names_itself():
    from customop.registry import by_reference

    with pytest.raises(LookupError, match="'tests.customop.auxops.nope'"):
        by_reference("tests.customop.auxops.nope", "tests.customop.auxops")
    assert pickle.loads(pickle.dumps(auxops.counted)) is auxops.counted  # still usable


# A main script: its op and a Symbol built on it travel to children under every start method.
SCRIPT = textwrap.dedent("""
    import multiprocessing as mp
    import pickle
    import sys

    import mxnet as mx
    import numpy as np

    from customop import customop


    @customop("numpy")
    def cube(x):
        return x ** 3


    cube.def_grad(lambda ans, x: lambda g: 3 * x * x * g)


    def child(op, sym_json, queue):
        x = mx.nd.array([1.0, 2.0])
        x.attach_grad()
        with mx.autograd.record():
            y = op(x)
        y.backward()
        ex = mx.sym.load_json(sym_json).bind(mx.cpu(), {"x": mx.nd.array([3.0])})
        queue.put((op.op_type, y.asnumpy().tolist(), x.grad.asnumpy().tolist(),
                   ex.forward()[0].asnumpy().tolist()))


    if __name__ == "__main__":
        ctx = mp.get_context(sys.argv[1])
        queue = ctx.Queue()
        proc = ctx.Process(target=child, args=(cube, cube(mx.sym.var("x")).tojson(), queue))
        proc.start()
        print(repr(queue.get(timeout=60)))
        proc.join(30)
        assert proc.exitcode == 0, proc.exitcode
        assert pickle.loads(pickle.dumps(cube)) is cube
""")


@pytest.fixture(scope="module")
def children(request, tmp_path_factory):
    """The script run once per selected start method, two runs at a time."""

    def run(method):
        work = tmp_path_factory.mktemp(method)
        (work / "main_script.py").write_text(SCRIPT)
        return lambda: fresh.run(
            [sys.executable, "main_script.py", method],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=work,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )

    runs = concurrently.run_selected({m: run(m) for m in concurrently.selected(request, "method")})
    yield runs
    runs.wait()


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_ops_and_graphs_reach_multiprocessing_children(method, children):
    proc = children[method]
    assert proc.returncode == 0, proc.stderr[-3000:]
    op_type, y, grad, sym_out = eval(proc.stdout.strip().splitlines()[-1])
    assert op_type == "__main__.cube"
    np.testing.assert_allclose(y, [1.0, 8.0])
    np.testing.assert_allclose(grad, [3.0, 12.0])
    np.testing.assert_allclose(sym_out, [27.0])
