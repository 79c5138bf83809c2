"""Imperative training at native speed (issue 41): an op whose forward and closures inline
runs, under record(), as its native graph from a signature's second call; its backward runs
no Python, its numbers are the closures', and what does not inline keeps its path.
Not recording, it runs the same graph's forward."""

import sys
import textwrap
import threading
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest

import customop
from customop import customop as decorate
from customop.dispatch import forced_path
from customop.graphs import imperative
from tests import fresh as fresh_process

ROOT = Path(__file__).resolve().parents[2]
calls = {"forward": 0, "closure": 0}


@decorate("mxnet")
def surrogate(x, w):
    calls["forward"] += 1
    return mx.nd.broadcast_mul(x * x, w)


def _surrogate_grad(ans, x, w):
    calls["closure"] += 1
    return lambda g: mx.nd.broadcast_mul(g, w) * 3 * x  # 1.5x the derivative: a surrogate


surrogate.def_grad(_surrogate_grad)


@decorate("mxnet", no_grad=("label",))
def checked_loss(x, label):
    customop.require(label >= 0, "label", "must be >= 0")
    return x * mx.nd.broadcast_greater_equal(label, mx.nd.zeros((1,)))


@decorate("mxnet")
def automatic(x):
    calls["forward"] += 1
    return mx.nd.tanh(x) * 2


@decorate("numpy")
def numpy_square(x):
    return x * x


numpy_square.def_grad(lambda ans, x: lambda g: 2 * x * g)


def _reference(x, w, g=None):  # the forward and the surrogate closure, float64
    g = np.ones_like(x) if g is None else g
    return x * x * w, g * w * 3 * x


def _step(op, *arrays, req="write"):
    xs = [mx.nd.array(a) for a in arrays]
    xs[0].attach_grad(grad_req=req)
    with mx.autograd.record():
        y = op(*xs)
    y.backward()
    return y.asnumpy(), xs[0].grad.asnumpy()


@pytest.fixture(autouse=True)
def fresh():
    imperative.clear_cache()
    calls.update(forward=0, closure=0)


def test_from_a_signatures_second_call_the_native_graph_runs_and_backward_runs_no_python():
    x, w = np.random.RandomState(0).randn(4, 3), np.full((1, 3), 0.5)
    for turn in range(4):
        before = dict(calls)
        y, gx = _step(surrogate, x, w)
        want_y, want_g = _reference(x, w)
        np.testing.assert_allclose(y, want_y, rtol=1e-5)
        np.testing.assert_allclose(gx, want_g, rtol=1e-5)
        if turn >= 2:  # (the second call builds the graph)
            assert calls == before, "the forward or a closure ran in Python"


def test_a_new_signature_first_takes_the_function_path():
    rng = np.random.RandomState(1)
    w = np.full((1, 3), 0.5)
    for rows in range(2, 8):
        x = rng.randn(rows, 3)
        before = calls["forward"]
        _step(surrogate, x, w)
        assert calls["forward"] == before + 1  # seen once: the function path
    for rows in range(2, 8):
        x = rng.randn(rows, 3)
        before = dict(calls)
        y, gx = _step(surrogate, x, w)
        np.testing.assert_allclose(gx, _reference(x, w)[1], rtol=1e-5)
        _step(surrogate, x, w)


@pytest.mark.parametrize("path", ["function", "graph"])
def test_the_paths_give_equal_numbers(path):
    x, w = np.random.RandomState(2).randn(5, 3), np.random.RandomState(3).rand(1, 3)
    with forced_path(path):
        y, gx = _step(surrogate, x, w)
    np.testing.assert_allclose(y, _reference(x, w)[0], rtol=1e-5)
    np.testing.assert_allclose(gx, _reference(x, w)[1], rtol=1e-5)


def test_an_op_without_def_grad_runs_its_graph_too():
    x = np.random.RandomState(4).randn(3, 4)
    for _ in range(3):
        before = calls["forward"]
        y, gx = _step(automatic, x)
    assert calls["forward"] == before
    np.testing.assert_allclose(y, np.tanh(x) * 2, rtol=1e-5)
    np.testing.assert_allclose(gx, 2 * (1 - np.tanh(x) ** 2), rtol=1e-5)


def _made(runner):
    """The kinds of CachedOp this thread made of ``runner``'s graph."""
    return {kind for kind in ("statics", "dynamic") if getattr(runner, kind).__dict__}


def test_unrecorded_calls_run_the_graphs_forward_from_a_signatures_second_call():
    # (evaluation loops: faster than the forward in Python, benchmarks/imperative.py)
    x, w = np.random.RandomState(6).randn(4, 3), np.full((1, 3), 0.5)
    for turn in range(4):
        before = dict(calls)
        y = surrogate(mx.nd.array(x), mx.nd.array(w)).asnumpy()
        np.testing.assert_allclose(y, _reference(x, w)[0], rtol=1e-5)
        assert calls["forward"] == before["forward"] + (turn == 0)  # Python only at first
        assert calls["closure"] == before["closure"]
    # not recorded, nothing can need the closure's coefficients: the graph without them ran
    (plan,) = [p for p in imperative._plans.values() if isinstance(p, imperative._Graph)]
    alone, full = plan._alone.symbol.tojson(), plan.full.symbol.tojson()
    assert alone.count('"op": "BlockGrad"') == 0 < full.count('"op": "BlockGrad"')
    assert _made(plan.full) == set()  # (the full graph's CachedOp was never made)
    with forced_path("function"):  # the debugging switch: Python on every call
        before = calls["forward"]
        surrogate(mx.nd.array(x), mx.nd.array(w)).wait_to_read()
        assert calls["forward"] == before + 1
    with forced_path("direct"):
        surrogate(mx.nd.array(x), mx.nd.array(w)).wait_to_read()
        assert calls["forward"] == before + 2
    # train mode is part of the signature: its first call is a Python forward again
    with mx.autograd.train_mode():
        surrogate(mx.nd.array(x), mx.nd.array(w)).wait_to_read()
    assert calls["forward"] == before + 3
    # recorded (train mode), the full graph runs, the closure's gradient included
    for _ in range(2):
        before = dict(calls)
        y, gx = _step(surrogate, x, w)
        np.testing.assert_allclose(gx, _reference(x, w)[1], rtol=1e-5)
    assert calls == before
    assert _made(plan.full) != set()


@pytest.mark.parametrize("static_bytes", [imperative.STATIC_BYTES, 0])
def test_small_signatures_run_a_static_cachedop_with_the_same_numbers(monkeypatch, static_bytes):
    # static_alloc keeps intermediate buffers between calls: two calls in one recording,
    # outputs held across calls and a second backward must still give the closure's numbers
    monkeypatch.setattr(imperative, "STATIC_BYTES", static_bytes)
    rng = np.random.RandomState(7)
    x1, x2, w = rng.randn(4, 3), rng.randn(4, 3), np.full((1, 3), 0.5)
    _step(surrogate, x1, w)  # the signature's first call: Python
    a, b = mx.nd.array(x1), mx.nd.array(x2)
    a.attach_grad()
    b.attach_grad()
    with mx.autograd.record():
        ya = surrogate(a, mx.nd.array(w))
        yb = surrogate(b, mx.nd.array(w))
        total = (ya * 2).sum() + (yb * 3).sum()
    total.backward(retain_graph=True)
    first = a.grad.asnumpy().copy()
    total.backward()
    for got, want in [(ya, _reference(x1, w)[0]), (yb, _reference(x2, w)[0])]:
        np.testing.assert_allclose(got.asnumpy(), want, rtol=1e-5)
    for grad in (first, a.grad.asnumpy()):
        np.testing.assert_allclose(grad, _reference(x1, w, np.full_like(x1, 2.0))[1], rtol=1e-5)
    np.testing.assert_allclose(
        b.grad.asnumpy(), _reference(x2, w, np.full_like(x2, 3.0))[1], rtol=1e-5
    )
    (plan,) = [p for p in imperative._plans.values() if isinstance(p, imperative._Graph)]
    assert _made(plan.full) == ({"statics"} if static_bytes else {"dynamic"})


def test_grad_req_add_accumulates():
    x, w = np.random.RandomState(5).randn(4, 3), np.full((1, 3), 2.0)
    xs, ws = mx.nd.array(x), mx.nd.array(w)
    xs.attach_grad(grad_req="add")
    ws.attach_grad(grad_req="write")
    for _ in range(3):
        with mx.autograd.record():
            y = surrogate(xs, ws)
        y.backward()
    np.testing.assert_allclose(xs.grad.asnumpy(), 3 * _reference(x, w)[1], rtol=1e-5)
    # w has no closure: MXNet's gradient of the forward, x * x summed over rows
    np.testing.assert_allclose(ws.grad.asnumpy(), (x * x).sum(0, keepdims=True), rtol=1e-5)


def test_a_failed_value_check_gives_nan_and_forced_function_raises_the_named_error():
    x = np.ones((2, 3))
    good, bad = np.zeros((2, 1)), np.full((2, 1), -1.0)
    for _ in range(2):
        _step(checked_loss, x, good)
    y, gx = _step(checked_loss, x, bad)
    assert np.isnan(y).all() and np.isnan(gx).all()
    with forced_path("function"), pytest.raises(ValueError, match="checked_loss.*label"):
        _step(checked_loss, x, bad)
    y, _ = _step(checked_loss, x, good)  # still usable
    np.testing.assert_array_equal(y, x)


def test_shape_errors_raise_as_on_the_function_path_on_every_call():
    def error(path=None):
        with forced_path(path), pytest.raises(Exception) as found:
            _step(surrogate, np.ones((4, 3)), np.ones((1, 5)))
        return type(found.value)

    expected = error("function")
    assert [error() for _ in range(3)] == [expected] * 3
    _step(surrogate, np.ones((4, 3)), np.ones((1, 3)))  # still usable
    from customop import ops

    for _ in range(3):  # a library op's named shape error, on every call
        with pytest.raises(ValueError, match="'ops.softmax_ce': label has shape"):
            _step(ops.softmax_ce, np.ones((4, 3)), np.ones(5))


def test_ops_that_do_not_inline_keep_their_path():
    assert "numpy" in imperative.eligible(numpy_square)
    from tests.customop import auxops

    assert "auxiliary" in imperative.eligible(auxops.counted_nd)
    x = np.random.RandomState(6).randn(3)
    for _ in range(3):
        y, gx = _step(numpy_square, x)
    np.testing.assert_allclose(gx, 2 * x, rtol=1e-5)


def test_a_closure_that_raises_keeps_the_function_path_and_its_named_error():
    @decorate("mxnet")
    def broken(x):
        return x * 2

    def grad(ans, x):
        def g(gy):
            raise RuntimeError("closure fails")

        return g

    broken.def_grad(grad)
    for _ in range(3):
        x = mx.nd.ones((3,))
        x.attach_grad()
        with mx.autograd.record():
            y = broken(x)
        with pytest.raises(Exception, match="broken"):
            y.backward()
            x.grad.asnumpy()


def test_four_threads_agree_with_one():
    rng = np.random.RandomState(7)
    data = [(rng.randn(4, 3), rng.rand(1, 3)) for _ in range(4)]
    want = [_reference(x, w) for x, w in data]
    got, failures = {}, []

    def work(k):
        try:
            for _ in range(5):
                got[k] = _step(surrogate, *data[k])
        except Exception as exc:  # noqa: BLE001 - reported below
            failures.append(repr(exc))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert failures == [] and len(got) == 4
    for k in range(4):
        np.testing.assert_allclose(got[k][0], want[k][0], rtol=1e-5)
        np.testing.assert_allclose(got[k][1], want[k][1], rtol=1e-5)


def test_explain_says_which_path_an_imperative_call_takes():
    text = str(customop.explain(surrogate, mx.nd.ones((4, 3)), mx.nd.ones((1, 3))))
    assert "imperative" in text and "native graph" in text
    text = str(customop.explain(numpy_square, mx.nd.ones((3,))))
    assert "imperative" in text and "'numpy'-mode" in text


CHILD = textwrap.dedent("""
    import multiprocessing as mp
    import sys

    import mxnet as mx
    import numpy as np

    from tests.customop.test_imperative import _reference, _step, surrogate


    def work(queue):
        x, w = np.arange(6.0).reshape(2, 3), np.full((1, 3), 0.5)
        for _ in range(3):
            y, gx = _step(surrogate, x, w)
        queue.put(bool(np.allclose(gx, _reference(x, w)[1])))


    if __name__ == "__main__":
        work_queue = mp.get_context(sys.argv[1]).Queue()
        for _ in range(3):
            _step(surrogate, np.ones((2, 3)), np.ones((1, 3)))  # the parent runs the graph
        proc = mp.get_context(sys.argv[1]).Process(target=work, args=(work_queue,))
        proc.start()
        print(work_queue.get(timeout=60))
        proc.join(60)
""")


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_forked_and_spawned_workers_run_the_graph(method, tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    done = fresh_process.run(
        [sys.executable, str(script), method],
        cwd=str(ROOT),
        timeout=180,
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.stdout.strip().splitlines()[-1] == "True", done.stderr[-2000:]


@decorate("mxnet")
def cube(x):
    return x * x * x


cube.def_grad(lambda ans, x: lambda g: 3 * x * x * g)


def test_check_grad_compares_the_imperative_graph_with_the_closures():
    from customop.check import GRAPH_COMPARISON, check_grad

    report = check_grad(cube, np.random.RandomState(8).rand(3, 4).astype("f") + 0.5)
    rows = [r for r in report.rows if r.comparison == GRAPH_COMPARISON]
    assert len(rows) == 1 and rows[0].passed and rows[0].max_abs_err < 1e-5
    assert any("graph:" in n for n in report.notes)
    report = check_grad(numpy_square, np.random.RandomState(9).rand(3).astype("f"))
    assert not [r for r in report.rows if r.comparison == GRAPH_COMPARISON]


def test_runtime_off_inline_keeps_imperative_calls_on_their_python_paths(monkeypatch):
    x, w = np.ones((2, 3)), np.ones((1, 3))
    for _ in range(3):
        _step(surrogate, x, w)
    monkeypatch.setenv("CUSTOMOP_RUNTIME_OFF", "inline")
    before = calls["forward"]
    _step(surrogate, x, w)
    assert calls["forward"] == before + 1


def test_an_op_no_signature_inlines_builds_no_signature_key(monkeypatch):
    @decorate("mxnet", inline=False)
    def kept(x):
        return x * 2

    for n in (3, 4, 3, 4):
        _, gx = _step(kept, np.ones(n))
        np.testing.assert_allclose(gx, np.full(n, 2.0))
        kept(mx.nd.ones(n))  # unrecorded too
    assert not [k for k in imperative._plans if k[0] is kept]
    # the trace-off switch is read per call: an op that inlines is refused while it is set
    x, w = np.ones((2, 3)), np.ones((1, 3))
    monkeypatch.setenv("CUSTOMOP_RUNTIME_OFF", "trace")
    for _ in range(3):
        _step(surrogate, x, w)
    assert not [k for k in imperative._plans if k[0] is surrogate]
    monkeypatch.delenv("CUSTOMOP_RUNTIME_OFF")
    for _ in range(3):
        before = dict(calls)
        _step(surrogate, x, w)
    assert calls == before  # the graph ran
