"""customop.port.logistic: one exp(-|x|) for a value's softrelu, sigmoid and
exp(-k softrelu), in both frameworks, against the formulas in float64 NumPy."""

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="the port tests need torch (pip install 'customop[port]')"
)
jax = pytest.importorskip("jax", reason="the port tests need jax (pip install 'customop[port]')")
jnp = jax.numpy

from customop.port import jax_rules, torch_rules  # noqa: E402
from customop.port.logistic import rewrite  # noqa: E402
from customop.port.runner import compile_graph  # noqa: E402


def _node(op, inputs, **attrs):
    return {"op": op, "attrs": {k: str(v) for k, v in attrs.items()}, "inputs": inputs}


X, NEG = ["in", 0], ["node", 0, 0]
# every form the rewrite knows, on x and on -x (the two spellings of -x), and two it leaves
GRAPH = {
    "nodes": [
        _node("_mul_scalar", [X], scalar=-1.0),  # 0: -x
        _node("Activation", [X], act_type="softrelu"),  # 1
        _node("Activation", [NEG], act_type="softrelu"),  # 2
        _node("sigmoid", [X]),  # 3
        _node("Activation", [NEG], act_type="sigmoid"),  # 4
        _node("_mul_scalar", [["node", 1, 0]], scalar=-2.0),  # 5
        _node("exp", [["node", 5, 0]]),  # 6: exp(-2 softrelu(x))
        _node("_mul_scalar", [["node", 2, 0]], scalar=-3.0),  # 7
        _node("exp", [["node", 7, 0]]),  # 8: exp(-3 softrelu(-x))
        _node("_mul_scalar", [["node", 1, 0]], scalar=-1.5),  # 9
        _node("exp", [["node", 9, 0]]),  # 10: exp(-1.5 softrelu(x)): not a power, kept
        _node("negative", [X]),  # 11: -x again
        _node("sigmoid", [["node", 11, 0]]),  # 12
    ],
    "heads": [["node", k, 0] for k in (1, 2, 3, 4, 6, 8, 10, 12)],
}


def _want(x):
    x = x.astype(np.float64)
    with np.errstate(all="ignore"):
        return _formulas(x)


def _formulas(x):
    sp, sn = np.logaddexp(0, x), np.logaddexp(0, -x)
    sig, sig_neg = 1 / (1 + np.exp(-x)), 1 / (1 + np.exp(x))
    return [sp, sn, sig, sig_neg, np.exp(-2 * sp), np.exp(-3 * sn), np.exp(-1.5 * sp), sig_neg]


def _inputs():
    r = np.random.RandomState(0)
    edges = [0.0, -0.0, 1e-30, -1e-30, 1e-7, -1e-7, 15.0, -15.0, 20.5, -20.5, 88.0, -88.0]
    edges += [104.0, -104.0, np.inf, -np.inf, np.nan, 3.4e38, -3.4e38]
    return np.concatenate([np.array(edges), r.randn(200) * 6]).astype(np.float32)


def test_rewrite_leaves_one_exp_per_value_and_no_logistic_operator():
    ops = [n["op"] for n in rewrite(GRAPH)["nodes"]]
    assert ops.count("exp") == 2  # exp(-|x|), and exp(-1.5 softrelu(x)) as it was
    assert ops.count("log1p") == 1 and ops.count("reciprocal") == 1
    assert "sigmoid" not in ops and "Activation" not in ops


def test_a_graph_without_logistic_functions_is_returned_as_it_is():
    g = {"nodes": [_node("exp", [X]), _node("sigmoid", [X, X])], "heads": [["node", 1, 0]]}
    assert rewrite(g) is g


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_rewritten_values_equal_float64_numpy_within_the_port_tolerance(framework):
    x = _inputs()
    if framework == "torch":
        run = compile_graph(rewrite(GRAPH), torch_rules.RULES, "tests.logistic")
        heads, _ = run([torch.tensor(x)])
    else:
        run = compile_graph(rewrite(GRAPH), jax_rules.RULES, "tests.logistic")
        heads, _ = run([jnp.asarray(x)])
    for k, (got, want) in enumerate(zip(heads, _want(x))):
        got = np.asarray(got)
        assert got.dtype == np.float32, k
        # float32's range: what the exact value rounds to (subnormals flush to 0 in XLA)
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-38, err_msg=f"head {k}")
        assert (np.isnan(got) == np.isnan(want)).all(), k


def test_the_forward_graph_of_focal_loss_is_rewritten_in_jax_but_its_gradient_is_the_closure():
    """The rewrite is applied to graphs no one differentiates; an op whose gradient is the
    forward's own (no closure) keeps MXNet's softrelu derivative, sigmoid(0) = 0.5, where
    ``relu(x) + log1p(exp(-|x|))`` differentiated by JAX would give 0 + (-0.5)."""
    import mxnet as mx

    from customop import customop
    from customop.port import to_jax

    @customop("mxnet", name="tests.port.softrelu_plain")
    def softrelu_plain(x):
        return mx.nd.Activation(x, act_type="softrelu") + mx.nd.sigmoid(x)

    f = to_jax(softrelu_plain)
    x = jnp.asarray(np.array([0.0, 1.0, -2.0], np.float32))
    g = jax.grad(lambda v: f(v).sum())(x)
    s = 1 / (1 + np.exp(-np.array([0.0, 1.0, -2.0])))
    np.testing.assert_allclose(np.asarray(g), s + s * (1 - s), rtol=2e-6)
    np.testing.assert_allclose(np.asarray(f(x)), np.logaddexp(0, [0.0, 1.0, -2.0]) + s, rtol=2e-6)
