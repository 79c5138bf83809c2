"""Issue 51: a ``def_grad`` closure is the gradient on every path and every call.

Never MXNet's gradient of the forward because the two agreed on sampled values: kinks
(a subgradient), ties, and closures not linear in the head gradient ``g`` (clipping,
``sign(g)``, normalising by ``|g|``), with head gradients outside [-1, 1]. References are
the closure's formula in float64 NumPy.
"""

import itertools

import mxnet as mx
import numpy as np
import pytest

import customop
from customop import customop as decorate
from customop.dispatch import forced_path
from customop.graphs import transpose

from . import paths

_names = itertools.count()


def _fresh(forward, closure, argnum=0):
    """A new op (its own name: its first imperative call is the first of the process)."""
    op = decorate("mxnet", name=f"own_gradient_{next(_names)}")(forward)
    op.def_grad(closure, argnum)
    return op


def relu_subgradient():
    # subgradient 1 at 0, where MXNet's relu gives 0
    return _fresh(lambda x: mx.nd.relu(x), lambda ans, x: lambda g: g * (x >= 0))


def clipped_head():
    return _fresh(lambda x: x * x, lambda ans, x: lambda g: mx.nd.clip(g, -1, 1) * 2 * x)


def tie_to_second():
    # maximum(a, b): a tie's gradient goes to b alone (MXNet's maximum gives it to a)
    op = _fresh(lambda a, b: mx.nd.maximum(a, b), lambda ans, a, b: lambda g: g * (a > b))
    op.def_grad(lambda ans, a, b: lambda g: g * (b >= a), 1)
    return op


X = np.array([[0.0, -1.5, 2.0], [0.0, 3.0, -0.0]], "f")
HEAD = np.array([[5.0, -4.0, 0.5], [-3.0, 2.5, 7.0]], "f")
A = np.array([[1.0, 2.0, -1.0], [0.5, 0.5, 3.0]], "f")
B = np.array([[1.0, 1.0, -1.0], [2.0, 0.5, 3.0]], "f")  # ties at 4 places

CASES = {
    "relu_subgradient": (relu_subgradient, [X], lambda x, g: [g.astype("f8") * (x >= 0)]),
    "clipped_head": (
        clipped_head,
        [np.array([[0.5, -2.0, 3.0], [1.0, -1.0, 0.25]], "f")],
        lambda x, g: [np.clip(g.astype("f8"), -1, 1) * 2 * x],
    ),
    "tie_to_second": (
        tie_to_second,
        [A, B],
        lambda a, b, g: [g.astype("f8") * (a > b), g.astype("f8") * (b >= a)],
    ),
}


def _check(got, want):
    for gg, w in zip(got, want):
        np.testing.assert_allclose(gg, w, rtol=1e-6, atol=1e-6)


def _imperative(op, inputs, repeat):
    xs = [mx.nd.array(a) for a in inputs]
    found = []
    for _ in range(repeat):
        for x in xs:
            x.attach_grad()
        with mx.autograd.record():
            out = op(*xs)
        out.backward(mx.nd.array(HEAD))
        found.append([x.grad.asnumpy() for x in xs])
    return found


@pytest.mark.parametrize("case", sorted(CASES))
def test_imperative_calls_one_two_three_give_the_closures_numbers(case):
    make, inputs, ref = CASES[case]
    want = ref(*inputs, HEAD)
    for got in _imperative(make(), inputs, 3):
        _check(got, want)


@pytest.mark.parametrize("how", paths.IMPERATIVE)
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_forced_path_gives_the_closures_numbers(case, how):
    make, inputs, ref = CASES[case]
    _, grads = paths.run(make(), inputs, how=how, heads=[HEAD], repeat=2)
    _check(grads, ref(*inputs, HEAD))


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bound_graph_gives_the_closures_numbers(case):
    make, inputs, ref = CASES[case]
    _, grads = paths.run(make(), inputs, how="symbol", heads=[HEAD], repeat=2)
    _check(grads, ref(*inputs, HEAD))


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_hybridized_block_gives_the_closures_numbers_every_call(case):
    make, inputs, ref = CASES[case]
    op = make()

    class Net(mx.gluon.HybridBlock):
        def hybrid_forward(self, F, *xs):
            return op(*xs)

    net = Net()
    net.hybridize()
    xs = [mx.nd.array(a) for a in inputs]
    for _ in range(3):
        for x in xs:
            x.attach_grad()
        with mx.autograd.record():
            out = net(*xs)
        out.backward(mx.nd.array(HEAD))
        _check([x.grad.asnumpy() for x in xs], ref(*inputs, HEAD))


def test_module_trains_with_the_closures_subgradient():
    op = relu_subgradient()
    data = mx.sym.var("data")
    out = mx.sym.MakeLoss(op(data) * mx.sym.var("w"))
    mod = mx.mod.Module(out, data_names=["data"], label_names=None, fixed_param_names=[])
    mod.bind(data_shapes=[("data", X.shape)], inputs_need_grad=True)
    mod.init_params(arg_params={"w": mx.nd.array(HEAD)}, allow_missing=False)
    mod.forward(mx.io.DataBatch([mx.nd.array(X)]), is_train=True)
    mod.backward()
    got = mod.get_input_grads()[0].asnumpy()
    np.testing.assert_allclose(got, HEAD.astype("f8") * (X >= 0), rtol=1e-6)


NONLINEAR = {
    "clip": lambda ans, x: lambda g: mx.nd.clip(g, -1, 1) * 2 * x,
    "sign": lambda ans, x: lambda g: mx.nd.sign(g) * x,
    "norm": lambda ans, x: lambda g: g / mx.nd.norm(g) * x,
    "abs": lambda ans, x: lambda g: mx.nd.abs(g) * x,
    "_greater_scalar": lambda ans, x: lambda g: (g > 0) * x,
    "broadcast_mul": lambda ans, x: lambda g: g * g * x,
}


@pytest.mark.parametrize("name", sorted(NONLINEAR))
def test_a_closure_not_linear_in_g_keeps_its_node_and_explain_names_the_operator(name):
    op = _fresh(lambda x: x * x, NONLINEAR[name])
    report = customop.explain(op, (2, 3))
    assert not report.inlines
    assert f"not linear in the head gradient ({name})" in report.train.reason, report.train.reason
    assert report.exports  # inference needs no closure


def test_sign_of_g_runs_with_the_real_head_gradient_on_every_path():
    x = np.array([[0.5, -2.0, 3.0], [1.0, -1.0, 0.25]], "f")
    want = np.sign(HEAD.astype("f8")) * x
    op = _fresh(lambda x: x * x, NONLINEAR["sign"])
    for got in _imperative(op, [x], 3):
        _check(got, [want])
    for how in (*paths.IMPERATIVE, "symbol"):
        _check(paths.run(op, [x], how=how, heads=[HEAD], repeat=2)[1], [want])


def test_every_transposition_rule_says_what_its_operator_is_linear_in():
    assert set(transpose.TRANSPOSE) == set(transpose.LINEAR_IN)


def test_forced_graph_path_on_a_nonlinear_closure_still_calls_the_closure():
    op = clipped_head()
    x = np.array([[0.5, -2.0, 3.0], [1.0, -1.0, 0.25]], "f")
    xs = mx.nd.array(x)
    xs.attach_grad()
    with forced_path("graph"), mx.autograd.record():
        out = op(xs)
    out.backward(mx.nd.array(HEAD))
    _check([xs.grad.asnumpy()], [np.clip(HEAD.astype("f8"), -1, 1) * 2 * x])


def test_explain_of_a_block_lists_each_ops_operators_and_reason():
    relu1, clipped = relu_subgradient(), clipped_head()

    class Net(mx.gluon.HybridBlock):
        def hybrid_forward(self, F, x):
            return relu1(x) + clipped(x)

    report = customop.explain(Net(), mx.nd.ones((2, 3)))
    text = repr(report)
    (_, _, train1, _), (_, _, train2, export2) = report.nodes
    assert train1.startswith("inlines as ") and "elemwise_sub" in train1
    assert "def_grad closures' own graph, transposed" in train1
    assert "not linear in the head gradient (clip)" in train2
    assert export2.startswith("inlines as 1 MXNet operator")
    assert len(report.kept["train"]) == 1 and not report.kept["export"], text


def test_an_exported_graph_reloaded_for_training_gives_the_closures_subgradient(tmp_path):
    op = relu_subgradient()

    class Net(mx.gluon.HybridBlock):
        def hybrid_forward(self, F, x):
            return op(x)

    net = Net()
    net.hybridize()
    net(mx.nd.array(X))
    net.export(str(tmp_path / "net"))
    again = customop.imports(str(tmp_path / "net-symbol.json"), ["data"])
    x = mx.nd.array(X)
    x.attach_grad()
    for _ in range(2):
        with mx.autograd.record():
            y = again(x)
        y.backward(mx.nd.array(HEAD))
        _check([x.grad.asnumpy()], [HEAD.astype("f8") * (X >= 0)])


def test_a_closure_rounding_g_to_integers_keeps_its_node():
    op = _fresh(lambda x: x * x, lambda ans, x: lambda g: g.astype("int32").astype("f") * x)
    reason = customop.explain(op, (2, 3)).train.reason
    assert "not linear in the head gradient (Cast)" in reason and "rounds" in reason, reason
