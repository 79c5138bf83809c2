"""customop.graphs.graph_verdicts and trace: when a recorded forward may stand in for the op, and
why not.

Each faithfulness rule of issue 28 item 1 has an op that breaks it and a test that
reads the reason; the graphs that pass are evaluated against the forward itself
and against float64 NumPy.
"""

import mxnet as mx
import numpy as np
import pytest

import customop
from customop import customop as decorate
from customop import symbol_json
from customop.graphs import graph_verdicts
from customop.graphs.graph_verdicts import EXPORT, TRAIN

calls = {"square": 0}


@decorate("mxnet")
def square(x):
    calls["square"] += 1
    return x * x


@decorate("mxnet")
def scaled_sum(x, w, *, scale=2.0):
    return mx.nd.broadcast_mul(x, w) * scale + 1


@decorate("mxnet")
def reads_a_value(x):
    return x * 2 if x.sum().asscalar() > 0 else x  # control flow on a value


@decorate("mxnet")
def reads_with_bool(x):
    if (x > 100).sum():
        return x
    return x + 1


@decorate("mxnet")
def detached(x):
    return x + x.detach() * 2  # an input-derived array outside the graph


@decorate("mxnet")
def noisy(x):
    return x + mx.nd.random.uniform(shape=x.shape)


@decorate("mxnet")
def flattened(x):
    return x.reshape((x.shape[0], -1)) * 2  # MXNet records the resolved shape


@decorate("mxnet")
def with_constants(x):
    return x + mx.nd.ones(x.shape) * 3 + mx.nd.array([1.0, 2.0, 3.0, 4.0])


@decorate("mxnet")
def huge_constant(x):
    big = mx.nd.array([np.finfo(np.float64).max], dtype="float64")
    return mx.nd.broadcast_minimum(x.astype("float64"), big)


@decorate("mxnet")
def paused_mask(x):
    with mx.autograd.pause():
        mask = x > 0.5
    return x * mask


@decorate("mxnet")
def normalized(x):
    c = x.shape[1]
    return mx.nd.BatchNorm(x, mx.nd.ones(c), mx.nd.zeros(c), mx.nd.zeros(c), mx.nd.ones(c))


@decorate("mxnet")
def looped(x):
    # imperatively, foreach is a Python loop over the rows: the recording unrolls it
    out, _ = mx.nd.contrib.foreach(lambda row, state: (row * 2, state), x, [x[0]])
    return out


@decorate("mxnet", inline=False)
def opted_out(x):
    return x * 3


@decorate("numpy")
def numpy_square(x):
    return x * x


@decorate("mxnet", aux={"count": lambda x: (1,)})
def counting(x, count):
    count[:] = count + 1
    return x * 1


@decorate("mxnet")
def cubed(x):
    return x * x * x


cubed.def_grad(lambda ans, x: lambda g: 3 * x * x * g)


@decorate("mxnet", need_top_grad=False)
def as_loss(x):
    return x * 1


@decorate("mxnet")
def calls_numpy_op(x):
    return numpy_square(x) + 1


@decorate("mxnet")
def calls_cubed(x):
    return cubed(x) + square(x)


def verdicts(op, shapes, dtypes=None, **params):
    dtypes = dtypes or ["float32"] * len(shapes)
    return [graph_verdicts.native_graph(op, params, shapes, dtypes, p) for p in (TRAIN, EXPORT)]


def test_box_decode_traces_to_its_operators_in_both_purposes():
    from customop import ops

    for v in verdicts(ops.box_decode, [(2, 6, 4), (1, 6, 4)], format="corner", clip=1.0):
        assert v.inlines, v.reason
        ops_used = set(v.graph.operators())
        assert {"SliceChannel", "exp", "Concat", "broadcast_mul"} <= ops_used
        assert "Custom" not in ops_used and not v.graph.constants
        rng = np.random.RandomState(5)
        d, a = rng.randn(2, 6, 4).astype("f"), rng.rand(1, 6, 4).astype("f") * 9
        got = symbol_json.evaluate(v.graph, [d, a])[0]
        want = ops.box_decode(mx.nd.array(d), mx.nd.array(a), format="corner", clip=1.0)
        np.testing.assert_array_equal(got, want.asnumpy())


def test_the_graph_computes_the_formula_at_other_values_and_shapes():
    v = graph_verdicts.native_graph(
        scaled_sum, {"scale": 3.0}, [(4, 5), (1, 5)], ["float32"] * 2, TRAIN
    )
    assert v.inlines and v.graph.specialized == ""
    rng = np.random.RandomState(1)
    for rows in (4, 7):  # a graph traced at 4 rows holds at 7
        x, w = rng.randn(rows, 5).astype("f"), rng.randn(1, 5).astype("f")
        got = symbol_json.evaluate(v.graph, [x, w])[0]
        np.testing.assert_allclose(got, x.astype(np.float64) * w * 3 + 1, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "op, words",
    [
        (reads_a_value, "reads values back to Python"),
        (reads_with_bool, "reads values back to Python"),
        (detached, "outside the recorded graph"),
        (noisy, "random operators (_random_uniform)"),
        (flattened, "holds only at the traced input shapes (Reshape shape="),
        (huge_constant, "cannot write exactly"),
        (normalized, "update auxiliary states (BatchNorm)"),
        (looped, "holds only at the traced input shapes (10 operators, 13"),
        (
            calls_numpy_op,
            "calls customop 'tests.customop.test_graph_verdicts.numpy_square', which "
            "cannot be inlined: a 'numpy'-mode operator",
        ),
    ],
)
def test_an_unfaithful_trace_keeps_the_custom_node_with_its_reason(op, words):
    train = verdicts(op, [(3, 4)])[0]
    assert not train.inlines
    assert words in train.reason


def test_a_read_names_the_line_of_the_forward():
    reason = verdicts(reads_a_value, [(3,)])[0].reason
    assert "test_graph_verdicts.py" in reason and "asscalar() > 0" in reason


@pytest.mark.parametrize(
    "op, words",
    [
        (opted_out, "inline=False"),
        (numpy_square, "'numpy'-mode operator"),
        (counting, "auxiliary states"),
    ],
)
def test_ops_that_never_inline_say_why(op, words):
    for v in verdicts(op, [(3,)]):
        assert not v.inlines and words in v.reason


def test_def_grad_and_output_layers_inline_for_training_and_export():
    # Issue 33: training graphs transpose the closure (customop.graphs.backward).
    for op in (cubed, as_loss):
        train, export = verdicts(op, [(3,)])
        assert train.inlines, train.reason
        assert export.inlines, export.reason
        np.testing.assert_array_equal(
            symbol_json.evaluate(export.graph, [np.full(3, 2, "f")])[0],
            op(mx.nd.full(3, 2)).asnumpy(),
        )
        np.testing.assert_array_equal(
            symbol_json.evaluate(train.graph, [np.full(3, 2, "f")])[0],
            op(mx.nd.full(3, 2)).asnumpy(),
        )


@decorate("mxnet")
def int_square(x):
    return x * x


int_square.def_grad(lambda ans, x: lambda g: 2 * x * g)


def test_a_def_grad_op_at_an_integer_signature_runs_on_every_call_and_path():
    # its training graph has no floating input to differentiate: the check of its closures
    # asked MXNet for a backward anyway ("Cannot differentiate node") on the second call
    x = mx.nd.array([1, 2, -3], dtype="int32")
    for _ in range(3):
        with mx.autograd.record():
            y = int_square(x)
        assert y.dtype == np.int32
        np.testing.assert_array_equal(y.asnumpy(), [1, 4, 9])

    class Block(mx.gluon.HybridBlock):
        def hybrid_forward(self, F, x):
            return int_square(x)

    block = Block()
    block.hybridize()
    for _ in range(2):
        with mx.autograd.record():
            np.testing.assert_array_equal(block(x).asnumpy(), [1, 4, 9])


def test_an_op_calling_ops_inlines_them_as_the_purpose_allows():
    train, export = verdicts(calls_cubed, [(3,)])
    assert not train.inlines and "calls customop" in train.reason and "def_grad" in train.reason
    assert export.inlines, export.reason
    x = np.array([1.0, 2.0, -3.0], "f")
    np.testing.assert_array_equal(symbol_json.evaluate(export.graph, [x])[0], x**3 + x**2)


def test_shape_specialized_graphs_still_export_at_their_shapes():
    assert verdicts(flattened, [(3, 2, 2)])[1].inlines


def test_constants_are_captured_in_the_graph_not_left_as_inputs():
    train, export = verdicts(with_constants, [(3, 4)])
    assert train.inlines, train.reason
    assert not train.graph.constants  # written as operators: the graph has one input
    assert {"_full", "broadcast_like"} <= set(train.graph.operators())
    x = np.random.RandomState(2).randn(5, 4).astype("f")  # another batch size than traced
    np.testing.assert_array_equal(
        symbol_json.evaluate(train.graph, [x])[0], x + 3 + np.array([1, 2, 3, 4], "f")
    )
    assert export.inlines and export.graph.constants  # an export saves them as parameters
    np.testing.assert_array_equal(
        symbol_json.evaluate(export.graph, [x[:3]])[0], x[:3] + 3 + np.array([1, 2, 3, 4], "f")
    )


def test_values_computed_under_pause_carry_no_gradient_in_the_graph():
    train = verdicts(paused_mask, [(6,)])[0]
    assert train.inlines, train.reason
    assert "BlockGrad" in train.graph.operators()


def test_traces_are_cached_per_op_params_and_signature():
    graph_verdicts.clear_cache()
    calls["square"] = 0
    first = graph_verdicts.native_graph(square, {}, [(2, 3)], ["float32"], TRAIN)
    traced = calls["square"]
    assert traced >= 2  # two values, then other shapes
    assert graph_verdicts.native_graph(square, {}, [(2, 3)], ["float32"], TRAIN) is first
    assert calls["square"] == traced
    graph_verdicts.native_graph(square, {}, [(5, 7)], ["float32"], TRAIN)  # other sizes
    assert calls["square"] == traced  # (checked at other values of both: it serves these)
    graph_verdicts.native_graph(square, {}, [(2, 1)], ["float32"], TRAIN)  # an axis of size 1
    assert calls["square"] > traced


def test_another_dtype_is_its_own_signature_checked_when_called():
    graph_verdicts.clear_cache()
    calls["square"] = 0
    first = graph_verdicts.native_graph(square, {}, [(2, 3)], ["float32"], TRAIN)
    traced = calls["square"]
    wide = graph_verdicts.native_graph(square, {}, [(2, 3)], ["float64"], TRAIN)
    assert calls["square"] > traced  # recorded and checked at float64, not taken from float32
    assert wide is not first and wide.inlines, wide.reason
    x = np.random.RandomState(4).randn(4, 5)  # (its family: other sizes of float64)
    np.testing.assert_array_equal(symbol_json.evaluate(wide.graph, [x])[0], x * x)
    assert symbol_json.evaluate(wide.graph, [x])[0].dtype == np.float64


def test_is_tracing_is_true_inside_a_traced_forward_only():
    seen = []

    @decorate("mxnet")
    def spy(x):
        seen.append(customop.is_tracing())
        return x + 1

    graph_verdicts.native_graph(spy, {}, [(2,)], ["float32"], EXPORT)
    spy(mx.nd.ones(2))
    assert seen[0] is True and seen[-1] is False


def test_a_failing_forward_is_the_reason():
    @decorate("mxnet")
    def picky(x):
        if x.shape[0] != 3:
            raise ValueError("three rows, please")
        return x

    v = graph_verdicts.native_graph(picky, {}, [(4,)], ["float32"], EXPORT)
    assert not v.inlines and "three rows, please" in v.reason


def test_the_trace_leaves_mxnet_as_it_was():
    before = (
        mx.nd.NDArray.asnumpy,
        mx.autograd._RecordingStateScope.__enter__,
        mx.ndarray.register._imperative_invoke,
    )
    graph_verdicts.native_graph(paused_mask, {}, [(3,)], ["float32"], EXPORT)
    assert (
        mx.nd.NDArray.asnumpy,
        mx.autograd._RecordingStateScope.__enter__,
        mx.ndarray.register._imperative_invoke,
    ) == before
    assert not mx.autograd.is_recording()


def test_explain_reports_both_purposes():
    report = customop.explain(scaled_sum, (2, 3), (1, 3), scale=1.5)
    assert report.inlines and report.exports
    text = repr(report)
    assert "scaled_sum" in text and "training" in text and "deploy export" in text
    report = customop.explain(reads_a_value, np.ones((3,), "f"))
    assert not report.inlines and "reads values back" in repr(report)
