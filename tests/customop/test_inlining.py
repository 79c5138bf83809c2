"""Issue 28 item 2: hybridized blocks and bound graphs run inlinable ops as MXNet's operators.

The reference for every output and gradient is the same graph with its ``Custom``
nodes (``CUSTOMOP_RUNTIME_OFF=inline``), and the same math written natively.
"""

import mxnet as mx
import numpy as np
import pytest

import customop
from customop import customop as decorate
from customop import runtime

calls = {"affine": 0, "cubed": 0, "picked": 0}


@decorate("mxnet")
def affine(x, w, *, shift=0.5):
    calls["affine"] += 1
    return mx.nd.broadcast_mul(x, w) + shift


@decorate("mxnet")
def cubed(x):
    calls["cubed"] += 1
    return x * x * x


cubed.def_grad(lambda ans, x: lambda g: 3 * x * x * g)


@decorate("mxnet")
def squashed(x):
    return x * 2


squashed.def_grad(lambda ans, x: lambda g: g * g)  # not linear in g: keeps its Custom node


@decorate("mxnet")
def flipped(x, w):
    return mx.nd.broadcast_mul(w, x) + 0.5  # reads w first: the graph lists w first


@decorate("mxnet", no_grad=("mask",))
def masked(x, mask):
    return x * mask


@decorate("mxnet")
def gated(x):
    with mx.autograd.pause():
        gate = (x > 0).astype(x.dtype)
    return x * gate * 2


class Net(mx.gluon.HybridBlock):
    def __init__(self, fn, **kwargs):
        super().__init__(**kwargs)
        self.fn = fn
        with self.name_scope():
            self.dense = mx.gluon.nn.Dense(6, flatten=False, in_units=5)

    def hybrid_forward(self, F, *xs):
        return self.fn(F, self.dense(xs[0]), *xs[1:])


def step(net, *xs):
    xs = [mx.nd.array(x) for x in xs]
    for x in xs:
        x.attach_grad()
    with mx.autograd.record():
        y = net(*xs)
    y.backward()
    grads = [x.grad.asnumpy() for x in xs]
    grads += [p.grad().asnumpy() for p in net.collect_params().values()]
    return y.asnumpy(), grads


def trained(fn, inputs, monkeypatch, inline=True):
    with monkeypatch.context() as m:
        if not inline:
            m.setenv("CUSTOMOP_RUNTIME_OFF", "inline")
        net = Net(fn)
        net.initialize(mx.init.Xavier(), force_reinit=True)
        for p in net.collect_params().values():
            p.set_data(mx.nd.array(np.random.RandomState(3).randn(*p.shape)))
        net.hybridize()
        return [step(net, *xs) for xs in inputs], net


def assert_same(a, b):
    for (ya, ga), (yb, gb) in zip(a, b):
        np.testing.assert_allclose(ya, yb, rtol=1e-6, atol=1e-6)
        for x, y in zip(ga, gb):
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


ROWS = np.random.RandomState(0).randn(4, 5).astype("f")
MORE_ROWS = np.random.RandomState(1).randn(7, 5).astype("f")


def test_a_hybridized_block_runs_the_op_as_mxnet_operators(monkeypatch):
    fn = lambda F, h: affine(h, F.ones((1, 6)) * 2, shift=1.5)  # noqa: E731
    inlined, net = trained(fn, [[ROWS], [MORE_ROWS]], monkeypatch)
    assert runtime.is_installed("inline")
    calls["affine"] = 0
    for _ in range(3):
        step(net, ROWS)
    assert calls["affine"] == 0  # the forward is no longer called: the graph runs natively
    custom, _ = trained(fn, [[ROWS], [MORE_ROWS]], monkeypatch, inline=False)
    native, _ = trained(
        lambda F, h: F.broadcast_mul(h, F.ones((1, 6)) * 2) + 1.5,
        [[ROWS], [MORE_ROWS]],
        monkeypatch,
    )
    assert_same(inlined, custom)
    assert_same(inlined, native)


def test_the_custom_path_still_runs_with_inlining_switched_off(monkeypatch):
    fn = lambda F, h: affine(h, F.ones((1, 6)))  # noqa: E731
    _, net = trained(fn, [[ROWS]], monkeypatch, inline=False)
    calls["affine"] = 0
    monkeypatch.setenv("CUSTOMOP_RUNTIME_OFF", "inline")
    step(net, ROWS)
    assert calls["affine"] >= 1


def test_def_grad_ops_inline_with_their_own_gradient(monkeypatch):
    # Issue 33: the closure is transposed into the graph (customop.graphs.backward).
    inlined, net = trained(lambda F, h: cubed(h), [[ROWS]], monkeypatch)
    calls["cubed"] = 0
    step(net, ROWS)
    assert calls["cubed"] == 0  # neither the forward nor the closure runs in Python
    custom, _ = trained(lambda F, h: cubed(h), [[ROWS]], monkeypatch, inline=False)
    assert_same(inlined, custom)


def test_no_grad_inputs_and_paused_values_get_no_gradient(monkeypatch):
    mask = (np.random.RandomState(2).rand(4, 6) > 0.5).astype("f")
    for fn, xs in [(lambda F, h, m: masked(h, m), [ROWS, mask]), (lambda F, h: gated(h), [ROWS])]:
        inlined, _ = trained(fn, [xs], monkeypatch)
        custom, _ = trained(fn, [xs], monkeypatch, inline=False)
        assert_same(inlined, custom)
        if len(xs) == 2:
            assert not inlined[0][1][1].any()  # the mask's gradient


def test_graphs_of_several_ops_and_ops_that_stay_custom(monkeypatch):
    from customop import ops

    anchors = np.random.RandomState(4).rand(1, 4, 4).astype("f") * 10

    def fn(F, h, a):
        boxes = ops.box_decode(h.slice_axis(axis=-1, begin=0, end=4), a)
        return squashed(cubed(affine(boxes, F.ones((1, 1, 4))))) * 0.01

    xs = [np.random.RandomState(5).randn(2, 4, 5).astype("f"), anchors]
    inlined, net = trained(fn, [xs], monkeypatch)
    custom, _ = trained(fn, [xs], monkeypatch, inline=False)
    assert_same(inlined, custom)
    report = customop.explain(net, *[mx.nd.array(x) for x in xs])
    kept = report.kept["train"]
    assert len(kept) == 1 and len(report.nodes) == 4 and not report.kept["export"]


def test_bound_graphs_keep_names_order_and_reshape(monkeypatch):
    data, w = mx.sym.var("data"), mx.sym.var("w", shape=(1, 1), init=mx.init.One())
    loss = mx.sym.MakeLoss(
        mx.sym.sum(flipped(mx.sym.FullyConnected(data, num_hidden=3, name="fc"), w))
    )
    results = []
    for inline in (True, False):
        if not inline:
            monkeypatch.setenv("CUSTOMOP_RUNTIME_OFF", "inline")
        mod = mx.mod.Module(loss, data_names=["data"], label_names=None)
        mod.bind(data_shapes=[("data", (4, 5))])
        mx.random.seed(1)
        mod.init_params(mx.init.Uniform(0.5))
        mod.init_optimizer(optimizer_params={"learning_rate": 0.1})
        exe = mod._exec_group.execs[0]
        assert hasattr(exe, "customop_inlined") == inline
        if inline:  # the graph it runs lists its arguments in another order
            assert exe.customop_inlined.list_arguments() != loss.list_arguments()
        assert list(exe.arg_dict) == loss.list_arguments()
        for i in range(3):
            mod.forward_backward(mx.io.DataBatch([mx.nd.array(ROWS + i)]))
            mod.update()
        results.append({k: v.asnumpy() for k, v in mod.get_params()[0].items()})
    for k in results[0]:
        np.testing.assert_allclose(results[0][k], results[1][k], rtol=1e-5, atol=1e-6)
    monkeypatch.delenv("CUSTOMOP_RUNTIME_OFF")
    exe = loss.bind(
        mx.cpu(), [mx.nd.array(ROWS), mx.nd.ones((3, 5)), mx.nd.zeros((3,)), mx.nd.ones((1, 1))]
    )
    assert hasattr(exe, "customop_inlined")
    assert list(exe.arg_dict) == loss.list_arguments()
    assert list(exe.output_dict) == loss.list_outputs()
    out = exe.forward()[0].asnumpy()
    np.testing.assert_allclose(out, (ROWS.sum(1, keepdims=True) + 0.5).sum() * 3, rtol=1e-5)
    bigger = exe.reshape(data=(8, 5), allow_up_sizing=True)
    assert bigger.arg_dict["data"].shape == (8, 5) and hasattr(bigger, "customop_inlined")


def test_graphs_without_our_ops_are_left_alone():
    # (any earlier test has installed the patch)
    x = mx.sym.var("x")
    exe = (x * 2).simple_bind(mx.cpu(), x=(3,))
    assert not hasattr(exe, "customop_inlined")
    net = mx.gluon.nn.Dense(3)
    net.initialize()
    net.hybridize()
    net(mx.nd.ones((2, 4)))
    assert type(net._cached_op) is mx.nd.CachedOp


def test_a_different_dtype_later_gets_its_own_graph(monkeypatch):
    @decorate("mxnet")
    def plus_big(x):
        return x + mx.nd.full(x.shape, 3.0, dtype=x.dtype)  # a constant of the input dtype

    class Plain(mx.gluon.HybridBlock):
        def hybrid_forward(self, F, x):
            return plus_big(x)

    net = Plain()
    net.hybridize()
    for dtype in ("float32", "float64", "float32"):
        out = net(mx.nd.ones((2, 3), dtype=dtype))
        assert out.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(out.asnumpy(), np.full((2, 3), 4.0))


@pytest.mark.parametrize("n", [10, 1000])
def test_gradients_equal_the_native_composition(n, monkeypatch):
    x = np.random.RandomState(n).randn(n // 5, 5).astype("f")
    inlined, _ = trained(lambda F, h: affine(h, h), [[x]], monkeypatch)
    native, _ = trained(lambda F, h: F.broadcast_mul(h, h) + 0.5, [[x]], monkeypatch)
    assert_same(inlined, native)


class Weighted(mx.gluon.HybridBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.w = self.params.get("w", shape=(1, 5), init=mx.init.Constant(0.5))

    def hybrid_forward(self, F, x, w):
        return flipped(x, w)  # the inlined graph lists w before the data


def test_a_block_whose_inlined_graph_lists_its_inputs_in_another_order(monkeypatch):
    def run():
        net = Weighted()
        net.initialize()
        net.hybridize()
        x = mx.nd.array(ROWS)
        x.attach_grad()
        outs = []
        for _ in range(2):
            with mx.autograd.record():
                y = net(x)
            y.backward()
            outs.append((y.asnumpy(), x.grad.asnumpy(), net.w.grad().asnumpy()))
        return net, outs

    net, inlined = run()
    plan = runtime.patch("inline")._plans[id(net._cached_op)]
    assert [order is not None for _, order in plan.built.values()] == [True]  # reorders
    monkeypatch.setenv("CUSTOMOP_RUNTIME_OFF", "inline")
    _, custom = run()
    for a, b in zip(inlined, custom):
        for x, y in zip(a, b):
            np.testing.assert_allclose(x, y, rtol=1e-6)
    np.testing.assert_allclose(inlined[0][0], ROWS * 0.5 + 0.5, rtol=1e-6)


def test_an_aux_op_beside_an_inlined_one_keeps_its_aux_waits(monkeypatch):
    from customop import ops

    class Both(mx.gluon.HybridBlock):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            with self.name_scope():
                self.center = ops.CenterLoss(num_class=2, feature_dim=5)

        def hybrid_forward(self, F, x, label):
            return self.center(affine(x, F.ones((1, 5))), label)

    def run():
        net = Both()
        net.initialize()
        net.hybridize()
        x, label = mx.nd.array(ROWS), mx.nd.array([0, 1, 0, 1])
        x.attach_grad()
        for _ in range(3):
            with mx.autograd.record():
                loss = net(x, label)
            loss.backward()
        return net, net.center.centers.data().asnumpy(), x.grad.asnumpy()

    net, centers, grad = run()
    # the CachedOp it runs: inlined, aux waits kept
    plan = runtime.patch("inline")._plans[id(net._cached_op)]
    assert [type(inner).__name__ for inner, _ in plan.by_graph.values()] == ["_AuxCachedOp"]
    report = customop.explain(net, mx.nd.array(ROWS), mx.nd.array([0, 1, 0, 1]))
    assert len(report.nodes) == 2 and len(report.kept["train"]) == 1  # affine inlines
    monkeypatch.setenv("CUSTOMOP_RUNTIME_OFF", "inline")
    _, want_centers, want_grad = run()
    np.testing.assert_allclose(centers, want_centers, rtol=1e-6)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-6)
    assert np.abs(centers).sum() > 0


@decorate(
    "mxnet", infer_input_shape={"weight": lambda data, weight, *, num_hidden: (num_hidden, data[1])}
)
def linear(data, weight, *, num_hidden):
    return mx.nd.dot(data, weight, transpose_b=True)


def test_an_input_shape_only_the_op_could_infer_still_binds():
    out = linear(mx.sym.var("data"), mx.sym.var("weight"), num_hidden=3)
    exe = out.simple_bind(mx.cpu(), data=(4, 5))  # weight's shape: from the Custom node
    assert hasattr(exe, "customop_inlined")
    assert "dot" in exe.customop_inlined.tojson()
    exe.arg_dict["data"][:] = ROWS
    exe.arg_dict["weight"][:] = 1
    np.testing.assert_allclose(
        exe.forward()[0].asnumpy(), np.repeat(ROWS.sum(1, keepdims=True), 3, 1), rtol=1e-5
    )
