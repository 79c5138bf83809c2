"""Issue 33 item 5: a def_grad op runs its forward alone where no input can need a gradient.

Its transposed closure (the coefficients of ``J v``) would otherwise be computed in
every forward for nothing.  Which inputs can need one: at bind, those with a
``grad_req`` other than ``'null'`` (and a gradient array); in a hybridized block, per
call, those autograd records (an attached gradient, or an array recorded from one).
References are written from the formula (the surrogate gradient ``3 x g``).
"""

import mxnet as mx
import numpy as np
import pytest

from customop import customop as decorate
from customop.graphs import inline


@decorate("mxnet", name="test_forward_only.surrogate")
def surrogate(x, y):
    return x * x + y


# not MXNet's gradient of the forward: the training graph carries the transposed closure
surrogate.def_grad(lambda ans, x, y: lambda g: 3 * x * g)


class Block(mx.gluon.HybridBlock):
    def hybrid_forward(self, F, x, y, w):
        # y reaches the op only through a comparison and broadcast_like's shape input
        return surrogate(x, F.broadcast_like((y > 0) * 1.0, w) + w)


def _arrays():
    rng = np.random.RandomState(4)
    return [rng.uniform(-1, 1, (3, 4)).astype("f") for _ in range(3)]


def test_hybridized_forward_alone_then_gradients_where_an_input_needs_them():
    x, y, w = _arrays()
    net = Block()
    net.hybridize()
    xs = [mx.nd.array(a) for a in (x, y, w)]
    with mx.autograd.record():  # nothing needs a gradient: the forward alone
        out = net(*xs)
    np.testing.assert_allclose(out.asnumpy(), x * x + (y > 0) + w, rtol=1e-6)
    plan = inline._plans[id(net._cached_op)]
    (by_grads,) = plan.built.values()
    assert isinstance(by_grads, inline._ByGrads)
    assert [plan.names[i] for i in by_grads.inputs] == ["data0"]
    assert list(by_grads.built) == [(False,)]
    g = np.random.RandomState(5).uniform(-1, 1, x.shape).astype("f")
    for attach in (True, False):  # x with a gradient, or recorded from one
        leaf = mx.nd.array(x)
        leaf.attach_grad()
        with mx.autograd.record():
            given = leaf if attach else leaf * 1
            out = net(given, *xs[1:])
        out.backward(mx.nd.array(g))
        np.testing.assert_allclose(leaf.grad.asnumpy(), 3 * x * g, rtol=1e-5)
    assert sorted(by_grads.built) == [(False,), (True,)]
    (a, _), (b, _) = by_grads.built.values()
    assert a is not b
    with mx.autograd.pause():  # not recording: nothing can need a gradient
        net(*xs)
    assert len(by_grads.built) == 2


def _bound(grad_req):
    x, y, _ = _arrays()
    sym = surrogate(mx.sym.var("x"), mx.sym.var("y"))
    exe = sym.simple_bind(mx.cpu(), grad_req=grad_req, x=x.shape, y=y.shape)
    exe.arg_dict["x"][:] = x
    exe.arg_dict["y"][:] = y
    return exe, x, y


def test_bound_with_null_grad_req_runs_the_forward_alone():
    alone, x, y = _bound({"x": "null", "y": "write"})
    full, _, _ = _bound("write")
    n_alone = len(alone.customop_inlined.get_internals().list_outputs())
    n_full = len(full.customop_inlined.get_internals().list_outputs())
    assert n_alone < n_full
    for exe in (alone, full):
        out = exe.forward(is_train=True)[0]
        np.testing.assert_allclose(out.asnumpy(), x * x + y, rtol=1e-6)
    g = np.random.RandomState(6).uniform(-1, 1, x.shape).astype("f")
    full.backward(mx.nd.array(g))
    np.testing.assert_allclose(full.grad_dict["x"].asnumpy(), 3 * x * g, rtol=1e-5)


class ParamBlock(mx.gluon.HybridBlock):
    """The op's differentiated input is a parameter: asked whether it has a gradient attached
    (one cheap C call), not whether it was recorded."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.p = self.params.get("p", shape=(3, 4))

    def hybrid_forward(self, F, y, p):
        return surrogate(p, y)


def test_a_parameter_gets_the_full_graph_while_its_grad_req_is_not_null():
    x, y, _ = _arrays()
    net = ParamBlock()
    net.initialize()
    net.p.set_data(mx.nd.array(x))
    net.hybridize()
    g = np.random.RandomState(7).uniform(-1, 1, x.shape).astype("f")
    with mx.autograd.record():
        out = net(mx.nd.array(y))
    out.backward(mx.nd.array(g))
    np.testing.assert_allclose(out.asnumpy(), x * x + y, rtol=1e-6)
    np.testing.assert_allclose(net.p.grad().asnumpy(), 3 * x * g, rtol=1e-5)
    plan = inline._plans[id(net._cached_op)]
    (by_grads,) = plan.built.values()
    assert list(by_grads.built) == [(True,)]
    net.p.grad_req = "null"  # frozen (fine-tuning): the forward alone, the same values
    with mx.autograd.record():
        out = net(mx.nd.array(y))
    np.testing.assert_allclose(out.asnumpy(), x * x + y, rtol=1e-6)
    assert sorted(by_grads.built) == [(False,), (True,)]


@decorate("mxnet", name="test_forward_only.output_layer", need_top_grad=False)
def output_layer(x, y):
    return mx.nd.sigmoid(x + y)


# x: its own gradient (an output layer's: no head gradient); y: the automatic one, that of the
# sum of the outputs, sigmoid'(x + y)
output_layer.def_grad(lambda ans, x, y: lambda _: ans - 0.5, argnum=0)


class OutputBlock(mx.gluon.HybridBlock):
    def hybrid_forward(self, F, x, y):
        return output_layer(x, y)


@pytest.mark.parametrize("inline_on", [True, False])
def test_an_output_layer_with_an_automatic_input_trains_alone_and_in_full(inline_on, monkeypatch):
    if not inline_on:
        monkeypatch.setenv("CUSTOMOP_RUNTIME_OFF", "inline")
    x, y, _ = _arrays()
    s = 1 / (1 + np.exp(-(x.astype("f8") + y)))
    net = OutputBlock()
    net.hybridize()
    head = mx.nd.array(np.full(x.shape, 7.0))  # ignored: an output layer
    for needs in ("y", "x", "xy"):  # y alone: x's closure is not needed, the forward alone
        xs = [mx.nd.array(a) for a in (x, y)]
        for name, arr in zip("xy", xs):
            if name in needs:
                arr.attach_grad()
        with mx.autograd.record():
            out = net(*xs)
        out.backward(head)
        np.testing.assert_allclose(out.asnumpy(), s, rtol=1e-5)
        if "x" in needs:
            np.testing.assert_allclose(xs[0].grad.asnumpy(), s - 0.5, rtol=1e-5, atol=1e-6)
        if "y" in needs:
            np.testing.assert_allclose(xs[1].grad.asnumpy(), s * (1 - s), rtol=1e-5)
    planned = id(net._cached_op) in inline._plans
    assert planned == inline_on
    if inline_on:
        (by_grads,) = inline._plans[id(net._cached_op)].built.values()
        assert sorted(by_grads.built) == [(False,), (True,)]


def test_module_runs_the_forward_alone_where_the_parameter_is_fixed():
    # Module binds every parameter with grad_req='write' unless fixed_param_names names it
    x, y, _ = _arrays()
    sym = surrogate(mx.sym.var("w", shape=x.shape), mx.sym.var("data"))
    counts = {}
    for fixed in ([], ["w"]):
        mod = mx.mod.Module(sym, data_names=["data"], label_names=None, fixed_param_names=fixed)
        mod.bind(data_shapes=[("data", y.shape)])
        mod.init_params(arg_params={"w": mx.nd.array(x)})
        mod.forward(mx.io.DataBatch([mx.nd.array(y)]), is_train=True)
        np.testing.assert_allclose(mod.get_outputs()[0].asnumpy(), x * x + y, rtol=1e-6)
        exe = mod._exec_group.execs[0]
        counts[bool(fixed)] = len(exe.customop_inlined.get_internals().list_outputs())
        if not fixed:
            mod.backward([mx.nd.ones(y.shape)])
            np.testing.assert_allclose(exe.grad_dict["w"].asnumpy(), 3 * x, rtol=1e-5)
    assert counts[True] < counts[False]
