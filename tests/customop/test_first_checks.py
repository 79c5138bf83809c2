"""What a graph's first checks run on: NDArrays copied without a wait, and the grown-shape
check of a transposed graph compared with its own recording.

References: ``mx.nd.array`` (MXNet's own copy) for the arrays; for the replay,
``closure_check.mismatch``, which runs the op and its closures again.
"""

import mxnet as mx
import numpy as np
import pytest

import customop
from customop import customop as decorate
from customop import value_checks
from customop.graphs import backward, closure_check, graph_verdicts, trace
from customop.nd_copies import ndarray

rng = np.random.RandomState(0)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int32", "int64", "uint8"])
def test_an_ndarray_holds_the_bytes_mx_nd_array_holds(dtype):
    value = (rng.uniform(-300, 300, (3, 5)) * 1.37).astype(dtype)
    got, want = ndarray(value), mx.nd.array(value, dtype=value.dtype)
    assert got.dtype == want.dtype and got.shape == want.shape and got.context == mx.cpu()
    assert got.asnumpy().tobytes() == want.asnumpy().tobytes()
    value[...] = 0  # a copy: the NumPy value stays the caller's, writeable
    assert got.asnumpy().tobytes() == want.asnumpy().tobytes()


def test_an_ndarray_casts_as_mx_nd_array_casts():
    value = rng.uniform(-1, 1, (4, 3))  # float64, as a head gradient is drawn
    for dtype in ("float16", "float32", "int32"):
        got = ndarray(value, dtype=dtype).asnumpy()
        assert got.tobytes() == mx.nd.array(value, dtype=dtype).asnumpy().tobytes()


@pytest.mark.parametrize(
    "value, ctx",
    [
        (np.float32(2.5), None),  # no axes
        (np.zeros((0, 3), np.float32), None),  # no elements
        (np.arange(6, dtype=np.int8).reshape(2, 3), None),  # not in MXNet's DLPack table
        (np.arange(6, dtype=np.float32), mx.cpu(1)),  # another device
    ],
)
def test_what_mxnet_cannot_take_is_mx_nd_array(value, ctx):
    got = ndarray(value, ctx)
    want = mx.nd.array(value, ctx=ctx, dtype=value.dtype)
    assert got.context == want.context and got.shape == want.shape and got.dtype == want.dtype
    assert got.asnumpy().tobytes() == want.asnumpy().tobytes()


@decorate("mxnet")
def cube(x):
    return x * x * x


cube.def_grad(lambda ans, x: lambda g: 3 * x * x * g)


@decorate("mxnet")
def cube_wrong(x):
    return x * x * x


cube_wrong.def_grad(lambda ans, x: lambda g: 2 * x * x * g)  # not cube's gradient


@decorate("mxnet", no_grad=("label",))
def checked(x, label):
    customop.require(label >= 0, "label", "must be >= 0")
    return x * 2 + label


checked.def_grad(lambda ans, x, label: lambda g: g * 2)


@decorate("mxnet", no_grad=("scale",))
def scaled(x, scale):  # its check poisons the scale only (value_checks.nan_unless)
    scale = value_checks.nan_unless(scale, scale > 0, "scale", "must be positive")
    return mx.nd.broadcast_mul(x, scale)


scaled.def_grad(lambda ans, x, scale: lambda g: mx.nd.broadcast_mul(g, scale))


@decorate("mxnet")
def half_owned(a, b):
    return a * b


half_owned.def_grad(lambda ans, a, b: lambda g: g * b, argnum=0)  # b: MXNet's gradient


def _graph(op, shapes):
    verdict = graph_verdicts.native_graph(
        op, {}, shapes, ["float32"] * len(shapes), graph_verdicts.TRAIN
    )
    assert verdict.inlines, verdict.reason
    return verdict.graph


def _recorded(op, inputs):
    return trace.aside(backward.TransposedGraph(op, {}).recorded, inputs)


def _both(op, graph, inputs):
    rec = _recorded(op, inputs)
    return (
        trace.aside(closure_check.replayed, op, graph, inputs, rec),
        trace.aside(closure_check.mismatch, op, {}, graph, inputs),
    )


def test_the_replay_agrees_with_a_second_run_of_the_closures():
    inputs = [rng.uniform(0.1, 1, (3, 4)).astype(np.float32)]
    assert _both(cube, _graph(cube, [(2, 4)]), inputs) == ("", "")
    # another op's gradient: both name the input whose gradient differs
    replayed, run = _both(cube, _graph(cube_wrong, [(2, 4)]), inputs)
    assert replayed and run and "'x'" in replayed and "'x'" in run


def test_the_replay_runs_the_op_again_where_a_check_failed_or_mxnet_differentiates():
    x = rng.uniform(0.1, 1, (2, 3)).astype(np.float32)
    graph = _graph(checked, [(2, 3), (2, 3)])
    assert _both(checked, graph, [x, np.ones((2, 3), np.float32)]) == ("", "")
    replayed, run = _both(checked, graph, [x, -np.ones((2, 3), np.float32)])
    assert replayed is None and "must be >= 0" in run
    graph = _graph(scaled, [(2, 3), (1,)])
    assert _both(scaled, graph, [x, np.float32([2])]) == ("", "")
    replayed, run = _both(scaled, graph, [x, np.float32([-2])])
    assert replayed is None and "must be positive" in run
    graph = _graph(half_owned, [(2, 3), (2, 3)])
    replayed, run = _both(half_owned, graph, [x, x + 1])
    assert replayed is None and run == ""


@decorate("mxnet", no_grad=("weight",))
def weighted(x, weight):  # placeholders (0.1 to 1) fail its check; all 1 pass
    customop.require(weight >= 1, "weight", "must be >= 1")
    return x * weight


weighted.def_grad(lambda ans, x, weight: lambda g: g * weight)


def test_placeholders_that_fail_the_ops_checks_are_replaced_by_passing_values():
    shapes = [(2, 3), (2, 3)]
    graph = _graph(weighted, shapes)
    x = rng.uniform(-1, 1, (2, 3)).astype(np.float32)
    weight = rng.uniform(1, 3, (2, 3)).astype(np.float32)
    assert trace.aside(closure_check.mismatch, weighted, {}, graph, [x, weight]) == ""


def test_the_checks_put_the_trace_threads_engine_setting_back():
    # (they run with MXNet's engine bulking operators on that thread: graph_verdicts._BULK)
    _graph(cube, [(5, 2)])
    assert trace.aside(mx.engine.set_bulk_size, 0) == 0
