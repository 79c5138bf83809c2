"""graphs/budget.py: the per-signature tables are bounded by memory."""
import mxnet as mx
import numpy as np
import pytest

from customop import customop
from customop.graphs import budget, imperative, native


@pytest.fixture
def tiny_budget(monkeypatch):
    imperative.clear_cache()
    native.clear_cache()
    monkeypatch.setenv(budget.ENV, str(200 / 1024))  # 200 KiB: three traced verdicts
    yield
    imperative.clear_cache()
    native.clear_cache()


def test_a_table_lets_its_oldest_entries_go_past_the_budget(tiny_budget):
    table = budget.Table()
    start = budget.total()
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


def test_many_signatures_keep_what_the_budget_holds_and_evicted_ones_come_back_right(
        tiny_budget):
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
    assert 1 <= len(native._cache) <= 3  # (the caches were empty: every verdict is its own)
    assert len(imperative._plans) < 20
    assert budget.total() <= 200 * 1024
    check(5)  # evicted long ago: planned again, same numbers
    check(5)
