"""budget.py: the per-signature tables are bounded by memory."""

import gc
import weakref

import mxnet as mx
import numpy as np
import pytest

import customop as customop_package
from customop import budget, customop, inference
from customop.graphs import binding, graph_verdicts, imperative


@pytest.fixture
def collector_off():
    # Dead tables of earlier tests (operators in cycles) go now, and none while a test
    # counts: an automatic collection would take their entries out of its sums
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.fixture
def tiny_budget(monkeypatch, collector_off):
    for module in (imperative, graph_verdicts, binding):  # their tables empty
        module.clear_cache()
    # 200 KiB (three traced verdicts) more than what the tables left hold (operators' shape
    # inference, kept by earlier tests)
    held = budget.total()
    monkeypatch.setenv(budget.ENV, str((held + 200 * 1024) / 2**20))
    yield held
    for module in (imperative, graph_verdicts, binding):
        module.clear_cache()


def test_a_table_lets_its_oldest_entries_go_past_the_budget(tiny_budget):
    table = budget.Table()
    start = tiny_budget
    for i in range(5):
        table.keep(i, str(i), 64 * 1024)
    assert list(table) == [2, 3, 4]  # 3 x 64 KiB fit in 200 KiB, 4 do not
    assert budget.total() - start == 3 * 64 * 1024
    table.keep(2, "again", 64 * 1024)  # used again: the newest, 3 the oldest
    table.keep(5, "5", 64 * 1024)
    assert list(table) == [4, 2, 5]
    table.clear()
    assert budget.total() == start


def test_a_bad_setting_names_the_variable(monkeypatch):
    monkeypatch.setenv(budget.ENV, "lots")
    with pytest.raises(ValueError, match="CUSTOMOP_CACHE_MB='lots'"):
        budget.limit()


@customop("mxnet")
def shaped_square(x):
    # shapes read from x.shape: the graph holds only at its own signature, so every new
    # signature is traced (and refused) again
    return (x * x).reshape((1, x.shape[0])).reshape((-1,))


shaped_square.def_grad(lambda ans, x: lambda g: 2 * x * g)


def test_many_signatures_keep_what_the_budget_holds_and_evicted_ones_come_back_right(tiny_budget):
    def check(n):
        x = mx.nd.array(np.arange(n, dtype=np.float64) / 7)
        x.attach_grad()
        with mx.autograd.record():
            y = shaped_square(x)
        y.backward(mx.nd.ones_like(y) * 3)
        ref = np.arange(n, dtype=np.float64) / 7
        np.testing.assert_allclose(y.asnumpy(), ref * ref, rtol=1e-6)
        np.testing.assert_allclose(x.grad.asnumpy(), 6 * ref, rtol=1e-6)

    for n in range(5, 25):
        check(n)
        check(n)  # its second call asks for its graph: a trace
    assert 1 <= len(graph_verdicts._cache) <= 3  # (the caches were empty: every verdict is its own)
    assert len(imperative._plans) < 20
    assert budget.total() <= tiny_budget + 200 * 1024
    check(5)  # evicted long ago: planned again, same numbers
    check(5)


@customop("mxnet")
def scaled(x, *, k=1.0):
    return x * k


scaled.def_grad(lambda ans, x, *, k=1.0: lambda g: g * (2 * k))  # a surrogate: 2k, not k


def test_families_and_their_cached_ops_are_under_the_budget_and_freed_when_let_go(tiny_budget):
    def check(k):
        x = mx.nd.array(np.arange(6, dtype=np.float64) / 7)
        x.attach_grad()
        with mx.autograd.record():
            y = scaled(x, k=float(k))
        y.backward()
        ref = np.arange(6, dtype=np.float64) / 7
        np.testing.assert_allclose(y.asnumpy(), ref * k, rtol=1e-6)
        np.testing.assert_allclose(x.grad.asnumpy(), np.full(6, 2.0 * k), rtol=1e-6)

    check(1)
    check(1)  # its second call builds its graph: a family, and a graph with its CachedOps
    (family,) = graph_verdicts._families.values()
    (graph,) = imperative._graphs.values()
    families, graphs = weakref.ref(family[0]), weakref.ref(graph)
    del family, graph
    for k in range(2, 14):  # a parameter value each: a family each
        check(k)
        check(k)
    assert 1 <= len(graph_verdicts._families) <= 3 and 1 <= len(imperative._graphs) <= 3
    assert budget.total() <= tiny_budget + 200 * 1024
    gc.collect()
    assert families() is None and graphs() is None  # evicted: nothing else held them
    check(1)  # back: planned and traced again, same numbers
    check(1)


def test_cache_budget_sets_the_budget_at_run_time_and_lets_entries_go_at_once(tiny_budget):
    table = budget.Table()
    try:
        for i in range(3):
            table.keep(i, str(i), 64 * 1024)
        assert customop_package.cache_budget(0) == 0  # every table keeps its newest only
        assert list(table) == [2]
        assert customop_package.cache_budget(1) == 1.0
        table.keep(3, "3", 64 * 1024)
        assert list(table) == [2, 3]
        assert budget.limit() == 2**20
    finally:
        table.clear()
        customop_package.cache_budget(reset=True)
    assert abs(budget.limit() - (tiny_budget + 200 * 1024)) <= 1  # the environment's again
    for bad in (-1, float("nan"), float("inf"), "lots"):
        with pytest.raises(ValueError, match="customop.cache_budget: mb"):
            customop_package.cache_budget(bad)


def test_static_cachedops_count_against_the_budget_and_go_with_their_graph(tiny_budget):
    # a small signature runs a static CachedOp, which holds its buffers between calls (about
    # the graph's operators times its inputs' bytes): a graph's entry counts them, and a
    # graph the budget lets go drops them, though a plan may still hold the graph
    n, room = 8192, 1536 * 1024  # 32 KiB of float32: 160 KiB a graph (5 operators)

    def check(k):
        x = mx.nd.array(np.arange(n, dtype=np.float64) / n)
        x.attach_grad()
        with mx.autograd.record():
            y = scaled(x, k=float(k))
        y.backward()
        ref = np.arange(n, dtype=np.float64) / n
        np.testing.assert_allclose(y.asnumpy(), ref * k, rtol=1e-6)
        np.testing.assert_allclose(x.grad.asnumpy(), np.full(n, 2.0 * k), rtol=1e-6)

    def static_bytes():  # what the live graphs' static CachedOps hold, by the estimate
        found = [
            runner.operators * n * 4
            for graph in list(imperative._live.values())
            for runner in (graph.full, graph._alone)
            if runner is not None and getattr(runner.statics, "op", None) is not None
        ]
        return sum(found), len(found)

    try:  # room for the entries of a few graphs by their Symbols (about 100 KiB each) and
        # their static buffers; all 12 by their Symbols alone
        budget.cache_budget((tiny_budget + room) / 2**20)
        for k in range(1, 13):  # a parameter value each: a graph each
            check(k)
            check(k)  # its graph and its static CachedOp
            assert budget.total() <= tiny_budget + room
            held, graphs = static_bytes()
            assert held <= room and graphs <= k
        assert 2 <= graphs < 12
        for graph in imperative._graphs.values():
            assert imperative._graphs.costs[id(graph.graph)] >= graph.full.operators * n * 4
        plan = list(imperative._plans.values())[-1]  # k = 12's graph
        imperative._graphs.clear()  # let go while its plan holds it: no static CachedOp left
        assert static_bytes() == (0, 0) and not plan.kept
        check(12)  # called again: counted again
        assert plan.kept and static_bytes()[1] == 1
        assert imperative._graphs.costs[id(plan.graph)] >= plan.full.operators * n * 4
        check(1)  # evicted long ago: planned and traced again, same numbers
        check(1)
    finally:
        budget.cache_budget(reset=True)


@customop("mxnet")
def sliced(x):
    return x[1:]  # one element fewer on the first axis: the shape pass runs the forward


def test_shape_inference_keeps_what_the_budget_holds_and_evicted_shapes_come_back_right(
    tiny_budget,
):
    tables = sliced.inference.by_signature, sliced.inference.by_shapes
    sym = sliced(mx.sym.var("x"))
    try:  # room for 8 entries more than held now
        budget.cache_budget((budget.total() + 8 * inference.INFERRED) / 2**20)
        for n in range(2, 60):
            assert sym.infer_shape(x=(n, 3))[1] == [(n - 1, 3)]
        assert 1 <= sum(len(t) for t in tables) <= 8 + 2  # (each table keeps its newest)
        assert sym.infer_shape(x=(2, 3))[1] == [(1, 3)]  # evicted: run again, same answer
    finally:
        budget.cache_budget(reset=True)


def test_a_table_that_dies_leaves_the_registry_at_once(collector_off):
    # cache_budget walks every live table; a dead one's entry goes with it, not at the next
    # cache_budget call (tables made and dropped again and again leave nothing behind)
    before = len(budget._tables)
    tables = [budget.Table() for _ in range(100)]
    assert len(budget._tables) == before + 100
    del tables
    assert len(budget._tables) == before
    cycle = budget.Table()
    cycle["me"] = cycle
    del cycle
    gc.collect()
    assert len(budget._tables) == before
