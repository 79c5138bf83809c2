"""Issue 33 item 1: def_grad closures are traced with g as a variable and transposed into graphs.

References are written from the formula in float64 NumPy (never from our output);
the training graph is run by MXNet (``closure_check.run_graph``: a CachedOp under
``autograd.record``) and its gradients compared with them.
"""

import mxnet as mx
import numpy as np
import pytest

import customop
from customop import customop as decorate
from customop import residuals, symbol_json
from customop.graphs import backward, closure_check, graph_verdicts, transpose, verify

TRAIN = graph_verdicts.TRAIN
rng = np.random.RandomState(0)


@decorate("mxnet")
def square(x):
    return x * x


square.def_grad(lambda ans, x: lambda g: 2 * x * g)  # MXNet's own, transposed all the same


# Closures below differ from MXNet's gradient of their forward on purpose (a surrogate
# gradient), so their training graphs carry the transposed closure.
@decorate("mxnet")
def surrogate(x):
    return x * x


surrogate.def_grad(lambda ans, x: lambda g: 3 * x * g)


@decorate("mxnet")
def mixed(a, b, c):
    return a * b + mx.nd.broadcast_mul(c, a)


# one closure for a and c; b keeps MXNet's gradient of the forward
mixed.def_grad(
    lambda ans, a, b, c: lambda g: (g * (b - c), mx.nd.sum(g * a, axis=0, keepdims=True)),
    argnum=(0, 2),
)


@decorate("mxnet")
def expo(x):
    e = mx.nd.exp(x)
    return residuals(e * 3, e=e)


expo.def_grad(lambda ans, x, e: lambda g: g * e * 2)  # a residual of the forward


@decorate("mxnet", need_top_grad=False, no_grad=("label",))
def xent(data, label):
    onehot = mx.nd.one_hot(label, data.shape[1])
    return residuals(mx.nd.softmax(data, axis=1), onehot=onehot)


xent.def_grad(lambda ans, data, label, onehot: lambda _: ans - onehot)


@decorate("mxnet")
def shaped(x):  # reshape, transpose, sum, slice, where, Cast, dot on the way to g
    # (mx.nd.reshape records its -1: NDArray.reshape records the shape it computed)
    return mx.nd.dot(mx.nd.reshape(x.T, shape=(-1, 2)), mx.nd.ones((2, 3)))


def _shaped_grad(ans, x):
    def grad(g):  # g: (rows, 3)
        back = mx.nd.dot(g, mx.nd.ones((3, 2)))  # (rows, 2)
        picked = mx.nd.where(mx.nd.reshape(x.T, shape=(-1, 2)) > 10, mx.nd.zeros_like(back), back)
        wide = mx.nd.concat(
            picked.slice_axis(axis=1, begin=0, end=1),
            picked.slice_axis(axis=1, begin=1, end=2),
            dim=1,
        )
        return mx.nd.reshape_like(wide.astype("float64").astype("float32"), x.T).T

    return grad


shaped.def_grad(_shaped_grad)


def graph(op, *shapes, **params):
    verdict = graph_verdicts.native_graph(op, params, shapes, ["float32"] * len(shapes), TRAIN)
    assert verdict.inlines, verdict.reason
    return verdict.graph


def graph_at(op, shape, dtype):
    verdict = graph_verdicts.native_graph(op, {}, [shape], [dtype], TRAIN)
    assert verdict.inlines, verdict.reason
    return verdict.graph


def mx_grads(op, inputs, heads, **params):
    return closure_check.run_graph(graph(op, *[x.shape for x in inputs], **params), inputs, heads)


def test_a_single_closure_is_transposed():
    x = rng.randn(3, 4).astype("f")
    g = rng.randn(3, 4).astype("f")
    outs, grads = mx_grads(surrogate, [x], [g])
    np.testing.assert_allclose(outs[0], x.astype("f8") ** 2, rtol=1e-6)
    np.testing.assert_allclose(grads[0], 3 * x.astype("f8") * g, rtol=1e-5, atol=1e-6)
    assert "elemwise_sub" in graph(surrogate, (3, 4)).operators()  # x - stop_gradient(x)


def _bits(a):
    return np.where(np.isnan(a), 0, a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.itemsize]))


def _special(dtype):
    # a zero, -0, a subnormal product x * g and 2 * x overflowing (at both, MXNet's own
    # gradient of x * x, g * x + g * x, is not the closure's (2 * x) * g), inf, NaN; head
    # gradients far outside [-1, 1]
    big, tiny = np.finfo(dtype).max / 1.5, np.finfo(dtype).tiny
    x = np.array([0, -0.0, 4.17022e-20, big, np.inf, np.nan, -3, 0.5, tiny / 3, 7], dtype)
    g = np.array([5, -4, 3.184612e-20, 0.5, 1, 3, 40, -25, 9, 0], dtype)
    if dtype == "float16":
        x[2], g[2] = 2.4e-4, 3.7e-4
    return x, g


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_a_closure_that_is_a_native_operators_backward_is_that_operator(dtype):
    # Issue 51: never MXNet's gradient of the forward because the two agreed on samples.
    # x * x with the closure 2 * x * g is MXNet's square: its backward is g * (2 * x), the
    # closure's own operations, so the graph is square(x), bit for bit the closure's numbers.
    found = graph_at(square, (10,), dtype)
    assert found.operators() == ["square"] and "transposed" in found.note
    assert "MXNet's square" in repr(customop.explain(square, mx.nd.ones(10, dtype=dtype)))
    x, g = _special(dtype)
    outs, grads = closure_check.run_graph(found, [x], [g])
    with np.errstate(over="ignore", invalid="ignore"):
        want_y, want_g = x * x, (x * np.array(2, dtype)) * g
    assert (_bits(outs[0]) == _bits(want_y)).all() and (_bits(grads[0]) == _bits(want_g)).all()
    # the numbers MXNet's own gradient of x * x gives are not all the closure's
    own = mx.nd.array(x, dtype=dtype)
    own.attach_grad()
    with mx.autograd.record():
        y = mx.nd.broadcast_mul(own, own)
    y.backward(mx.nd.array(g, dtype=dtype))
    assert (_bits(own.grad.asnumpy()) != _bits(want_g)).any()


@decorate("mxnet")
def square_g_first(x):
    return x * x


square_g_first.def_grad(lambda ans, x: lambda g: g * 2 * x)  # (2 g) x: not square's order


def test_a_closure_in_another_order_than_the_operators_backward_stays_transposed():
    for op in (square_g_first, surrogate):
        ops = graph_at(op, (10,), "float32").operators()
        assert "square" not in ops and "elemwise_sub" in ops
    x, g = _special("float32")
    _, grads = closure_check.run_graph(graph_at(square_g_first, (10,), "float32"), [x], [g])
    with np.errstate(over="ignore", invalid="ignore"):
        want = (g * np.float32(2)) * x
    assert (_bits(grads[0]) == _bits(want)).all()


def _written(scalar="2.0", order=(3, 2)):
    # x * x + (2 * x) * (x - x), stopped as the transposition writes it
    return symbol_json.NativeGraph(
        [
            {"op": "BlockGrad", "name": "s", "attrs": {}, "inputs": [("in", 0)]},
            {"op": "broadcast_mul", "name": "f", "attrs": {}, "inputs": [("node", 0, 0)] * 2},
            {
                "op": "_mul_scalar",
                "name": "c",
                "attrs": {"scalar": scalar},
                "inputs": [("node", 0, 0)],
            },
            {"op": "elemwise_sub", "name": "d", "attrs": {}, "inputs": [("in", 0), ("node", 0, 0)]},
            {
                "op": "elemwise_mul",
                "name": "h",
                "attrs": {},
                "inputs": [("node", k, 0) for k in order],
            },
            {
                "op": "elemwise_add",
                "name": "y",
                "attrs": {},
                "inputs": [("node", 1, 0), ("node", 4, 0)],
            },
        ],
        [("node", 5, 0)],
    )


def test_square_is_written_for_float_inputs_and_twice_x_only():
    assert backward._own_operators(_written(), ["float32"]).operators() == ["square"]
    assert backward._own_operators(_written(order=(2, 3)), ["float16"]).operators() == ["square"]
    for graph, dtype in ((_written(), "int32"), (_written(scalar="3.0"), "float32")):
        assert len(backward._own_operators(graph, [dtype]).operators()) == 6
    # MXNet's square computes 2 * x in float32 for integer inputs (2**24 + 1 loses its 1)
    x = mx.nd.array([2**24 + 1], dtype="int32")
    x.attach_grad()
    with mx.autograd.record():
        y = mx.nd.square(x)
    y.backward(mx.nd.array([1], dtype="int32"))
    assert int(x.grad.asnumpy()[0]) != 2 * (2**24 + 1)


@decorate("mxnet")
def clipped(x):
    return x * x


clipped.def_grad(lambda ans, x: lambda g: mx.nd.clip(2 * x, -5, 5) * g)


def test_a_closure_that_differs_only_on_large_values_is_transposed():
    found = graph(clipped, (3, 4))
    assert "transposed" in found.note
    x = np.array([[-9, -3, -1, 0], [0.5, 2, 2.6, 4], [10, 20, -30, 1]], "f")
    g = rng.randn(3, 4).astype("f")
    _, grads = closure_check.run_graph(found, [x], [g])
    np.testing.assert_allclose(grads[0], np.clip(2 * x.astype("f8"), -5, 5) * g, rtol=1e-5)


def test_a_joint_closure_and_an_input_without_one():
    a, b, c = rng.randn(3, 4).astype("f"), rng.randn(3, 4).astype("f"), rng.randn(1, 4).astype("f")
    g = rng.randn(3, 4).astype("f")
    outs, grads = mx_grads(mixed, [a, b, c], [g])
    a, b, c, g = (v.astype("f8") for v in (a, b, c, g))
    np.testing.assert_allclose(outs[0], a * b + c * a, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grads[0], g * (b - c), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grads[1], g * a, rtol=1e-5, atol=1e-6)  # MXNet's own
    np.testing.assert_allclose(grads[2], (g * a).sum(0, keepdims=True), rtol=1e-5, atol=1e-5)


def test_a_closure_using_a_residual():
    x = rng.randn(2, 5).astype("f")
    g = rng.randn(2, 5).astype("f")
    _, grads = mx_grads(expo, [x], [g])
    np.testing.assert_allclose(grads[0], 2 * np.exp(x.astype("f8")) * g, rtol=1e-5)


def test_an_output_layer_ignores_the_head_gradient():
    data = rng.randn(4, 3).astype("f")
    label = np.array([0, 2, 1, 1], "f")
    p = np.exp(data.astype("f8"))
    p /= p.sum(1, keepdims=True)
    want = p - np.eye(3)[label.astype(int)]
    ops = graph(xent, (4, 3), (4,)).operators()
    assert "make_loss" in ops  # MakeLoss ignores its head gradient (measured on MXNet 1.9.1)
    for heads in ([np.ones((4, 3), "f")], [rng.randn(4, 3).astype("f") * 7]):
        outs, grads = closure_check.run_graph(graph(xent, (4, 3), (4,)), [data, label], heads)
        np.testing.assert_allclose(outs[0], p, rtol=1e-5)
        np.testing.assert_allclose(grads[0], want, rtol=1e-5, atol=1e-6)


def test_shape_rules_reshape_transpose_slice_where_cast_dot():
    x = rng.rand(4, 6).astype("f") * 20
    g = rng.randn(12, 3).astype("f")
    _, grads = mx_grads(shaped, [x], [g])
    back = g.astype("f8") @ np.ones((3, 2))
    back[x.T.reshape(-1, 2) > 10] = 0
    np.testing.assert_allclose(grads[0], back.reshape(6, 4).T, rtol=1e-5, atol=1e-5)
    assert {"transpose", "dot", "where", "Cast", "Concat"} <= set(graph(shaped, (4, 6)).operators())


def test_every_rule_is_one_table_entry_per_operator():
    for name in (
        "elemwise_mul",
        "broadcast_mul",
        "broadcast_div",
        "negative",
        "elemwise_add",
        "Reshape",
        "transpose",
        "sum",
        "broadcast_to",
        "where",
        "Cast",
        "slice_axis",
        "dot",
        "batch_dot",
        "scatter_nd",
        "_mul_scalar",
    ):
        assert callable(transpose.TRANSPOSE[name]), name


@decorate("mxnet")
def squared_g(x):
    return x * 2


squared_g.def_grad(lambda ans, x: lambda g: g * g)


@decorate("mxnet")
def shifted_g(x):
    return x * 2


shifted_g.def_grad(lambda ans, x: lambda g: g + 1)


@decorate("mxnet")
def sqrt_g(x):
    return x * 2


sqrt_g.def_grad(lambda ans, x: lambda g: mx.nd.sqrt(g))


@decorate("mxnet")
def constant_g(x):
    return x * 2


constant_g.def_grad(lambda ans, x: lambda g: x * 2)


@decorate("mxnet")
def reads_g(x):
    return x * 2


reads_g.def_grad(lambda ans, x: lambda g: g * float(g.sum().asscalar()))


def _rerecording(ans, x):
    def grad(g):
        y = x.copy()
        y.attach_grad()
        with mx.autograd.record():
            out = y * 2
        out.backward(g)
        return y.grad

    return grad


@decorate("mxnet")
def rerecords(x):
    return x * 2


rerecords.def_grad(_rerecording)


@decorate("mxnet")
def checked(x):
    if not customop.is_tracing() and (x < 0).sum().asscalar():  # a check, skipped when traced
        raise ValueError("x must be >= 0")
    return x * 2


checked.def_grad(lambda ans, x: lambda g: g * 3)


@pytest.mark.parametrize(
    "op, words",
    [
        (checked, ["is_tracing", "customop.require"]),
        (squared_g, ["multiplies two values that both depend on the head gradient"]),
        (shifted_g, ["'_plus_scalar'", "affine"]),
        (sqrt_g, ["not linear in the head gradient (sqrt)", "'sqrt'"]),
        (constant_g, ["does not depend on the head gradient", "need_top_grad=False"]),
        (reads_g, ["reads values back to Python", "asscalar"]),
        (rerecords, ["gradient"]),
    ],
)
def test_what_cannot_be_transposed_keeps_its_node_and_says_why(op, words):
    report = customop.explain(op, (3,))
    # a forward that asks is_tracing() may skip a check: it keeps its node in exports too
    assert not report.inlines and report.exports == (op is not checked)
    reason = report.train.reason
    if op not in (rerecords, checked):
        assert "gradient closure <lambda>" in reason and __file__ in reason, reason
    for w in words:
        assert w in reason, reason


def test_hybridized_training_runs_neither_forward_nor_closure_in_python(monkeypatch):
    calls = []

    @decorate("mxnet")
    def counted(x):
        calls.append("forward")
        return x * x

    counted.def_grad(lambda ans, x: lambda g: calls.append("closure") or 3 * x * g)

    class Net(mx.gluon.HybridBlock):
        def hybrid_forward(self, F, x):
            return counted(x) * 3

    results = []
    data = rng.randn(4, 5)
    for off in (False, True):
        if off:
            monkeypatch.setenv("CUSTOMOP_RUNTIME_OFF", "inline")
        net = Net()
        net.hybridize()
        x = mx.nd.array(data)
        x.attach_grad()
        for _ in range(2):
            with mx.autograd.record():
                y = net(x)
            y.backward()
        results.append((y.asnumpy(), x.grad.asnumpy()))
        if not off:
            calls.clear()
            with mx.autograd.record():
                net(x).backward()
            assert calls == []
    np.testing.assert_allclose(results[0][0], results[1][0], rtol=1e-6)
    np.testing.assert_allclose(results[0][1], results[1][1], rtol=1e-6)


def test_the_graph_is_traced_once_per_shape_family(monkeypatch):
    graph_verdicts.clear_cache()
    seen = []
    original = verify.verified
    monkeypatch.setattr(
        verify,
        "verified",
        lambda *a, **k: (
            (isinstance(a[0], backward.TransposedGraph) and seen.append(a[1])) or original(*a, **k)
        ),
    )
    for _ in range(3):
        graph_verdicts.native_graph(surrogate, {}, [(2, 3)], ["float32"], TRAIN)
    graph_verdicts.native_graph(surrogate, {}, [(4, 3)], ["float32"], TRAIN)  # the same family
    graph_verdicts.native_graph(surrogate, {}, [(1, 3)], ["float32"], TRAIN)  # an axis of size 1
    assert seen == [((2, 3),), ((1, 3),)]


def test_check_grad_compares_the_inlined_graph_with_the_custom_node():
    from customop import check_grad

    x = rng.rand(3, 4).astype("f")
    report = check_grad(surrogate, x, eps=1e-3, rtol=10, atol=10)  # 3x: not the derivative
    assert any("inlined" in n for n in report.notes), report.notes
    rows = {r.comparison: r for r in report.rows}
    both = rows["imperative vs symbolic"]  # the Custom node and the inlined graph
    assert both.passed and both.max_abs_err < 1e-5
    with pytest.raises(AssertionError, match="symbolic vs numeric"):
        check_grad(surrogate, x)  # the closure is wrong: one call says so


@decorate("mxnet", no_grad=("label",))
def labelled(data, label):
    customop.require(
        (label >= 0) * (label < data.shape[1]) * (label == mx.nd.round(label)),
        "label",
        "must be a class index",
    )
    return mx.nd.broadcast_add(data * 2, mx.nd.expand_dims(label, 1) * 0)


labelled.def_grad(lambda ans, data, label: lambda g: g * 3)  # a surrogate: MXNet's is 2 g


def test_the_verdict_depends_on_the_signature_only():
    # Placeholder labels (uniform in [0.1, 1)) fail the check: the closure is compared on
    # labels that pass it, so a graph inlines whether or not explain (with the user's
    # values) ran first, and a verdict traced on given values is never the cached one.
    graph_verdicts.clear_cache()
    shapes, dtypes = [(4, 3), (4,)], ["float32"] * 2
    given = [rng.randn(4, 3).astype("f"), np.array([0, 2, 1, 1], "f")]
    on_values = graph_verdicts.native_graph(labelled, {}, shapes, dtypes, TRAIN, given)
    cached = graph_verdicts.native_graph(labelled, {}, shapes, dtypes, TRAIN)
    assert cached is not on_values and cached.inlines and on_values.inlines, cached.reason
    assert customop.explain(labelled, *given).train is cached
    g = rng.randn(4, 3).astype("f")
    outs, grads = closure_check.run_graph(cached.graph, given, [g])
    np.testing.assert_allclose(outs[0], 2 * given[0].astype("f8"), rtol=1e-6)
    np.testing.assert_allclose(grads[0], 3 * g.astype("f8"), rtol=1e-6)
    outs, grads = closure_check.run_graph(
        cached.graph, [given[0], np.array([0, 3, 1, 1], "f")], [g]
    )
    assert np.isnan(outs[0]).all() and np.isnan(grads[0]).all()
