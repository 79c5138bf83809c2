"""ops/_rows.py: row numbers from an array's shape, exact past 2048 rows in float16, any batch."""

import mxnet as mx
import numpy as np
import pytest

import customop
import ops
from ops import _rows
from tests.ops.detection import OpBlock

SHAPES = [
    ((5000, 3), np.float16),
    ((2, 3000, 2), np.float16),
    ((7,), np.float32),
    ((3, 4, 5), np.float64),
    ((1, 1), np.float32),
]


def _run(monkeypatch, how, fn, *args):
    """``fn(*args)`` as the operators call it: on arrays (cached or not), or traced (recording)."""
    if how == "uncached":
        monkeypatch.setattr(_rows, "_CACHED_ROWS", 0)
    if how != "traced":
        return fn(*args)
    with mx.autograd.record():
        return fn(*args)


@pytest.mark.parametrize("how", ["eager", "uncached", "traced"])
@pytest.mark.parametrize("shape, dtype", SHAPES)
def test_row_starts_are_the_float64_count_of_rows_times_their_length(
    shape, dtype, how, monkeypatch
):
    x = mx.nd.array(np.random.rand(*shape), dtype=dtype)
    lead = shape[:-1]
    want = np.arange(np.prod(lead), dtype=np.float64).reshape(lead + (1,)) * shape[-1]
    for _ in range(2):  # the second call on arrays is the cached one
        got = _run(monkeypatch, how, _rows.row_starts, x)
        assert got.dtype == np.int64 and got.shape == lead + (1,)
        np.testing.assert_array_equal(got.asnumpy(), want)


@pytest.mark.parametrize("how", ["eager", "traced"])
@pytest.mark.parametrize("shape, dtype", SHAPES)
def test_index_along_counts_every_axis_in_float64(shape, dtype, how, monkeypatch):
    x = mx.nd.array(np.random.rand(*shape), dtype=dtype)
    for axis in [*range(len(shape)), -1]:
        got = _run(monkeypatch, how, _rows.index_along, x, axis)
        assert got.dtype == np.float64
        np.testing.assert_array_equal(got.asnumpy(), np.arange(shape[axis], dtype=np.float64))


def _top2(x):
    """float64: the two largest of each row along the last axis, largest first."""
    return -np.sort(-np.asarray(x, np.float64), axis=-1)[..., :2]


def _marked(x, cols):
    return np.asarray(x, np.float64)[:, :, cols]


def _topk_inputs(batch, r):
    return [(r.rand(batch, 3000, 5) * 100).astype(np.float16)]  # 6000+ rows, offsets > 65504


def _arr_pick_inputs(batch, r):
    mark = np.zeros((batch, 1, 4), np.float16)
    mark[:, :, [1, 3]] = 1
    return [(r.rand(batch, 1500, 4) * 100).astype(np.float16), mark]  # 3000+ rows


CASES = {  # name -> (op, params, inputs at a batch, the reference of the inputs)
    "topk": (ops.topk, dict(k=2), _topk_inputs, lambda x: _top2(x)),
    "arr_pick": (ops.arr_pick, dict(num=2), _arr_pick_inputs, lambda x, mark: _marked(x, [1, 3])),
}


@pytest.mark.parametrize("case", list(CASES))
def test_one_hybridized_block_picks_exactly_at_batch_2_then_7_in_float16(case):
    op, params, inputs, reference = CASES[case]
    r = np.random.RandomState(11)
    assert customop.explain(op, *inputs(2, r), **params).inlines  # the graph, not Custom
    net = OpBlock(op, params)
    net.hybridize()
    for batch in (2, 7):
        xs = inputs(batch, r)
        got = net(*[mx.nd.array(a, dtype=a.dtype) for a in xs]).asnumpy()
        np.testing.assert_array_equal(got, reference(*xs).astype(np.float16), err_msg=batch)


def test_a_graph_exported_at_batch_2_picks_exactly_at_batch_7(tmp_path):
    # The deployed graph, exported at batch 2, still counts 7 * 3000 float16 rows exactly.
    r = np.random.RandomState(12)
    net = OpBlock(ops.topk, dict(k=2))
    net.hybridize()
    done = customop.export(
        net, str(tmp_path / "topk"), mx.nd.array(*_topk_inputs(2, r), dtype=np.float16)
    )
    assert done.fixed == [] and done.kept == []
    loaded = customop.imports(done.symbol_file, list(done.inputs), done.params_file)
    (x,) = _topk_inputs(7, r)
    np.testing.assert_array_equal(
        loaded(mx.nd.array(x, dtype=x.dtype)).asnumpy(), _top2(x).astype(np.float16)
    )
