"""customop.port.runner: the simplification pass and the runner, on NumPy rules (no torch/jax)."""

import numpy as np
import pytest

from customop.port.runner import PortError, compile_graph, simplify, split_linear

RULES = {
    "neg": lambda a, x: -x,
    "exp": lambda a, x: np.exp(x),
    "add": lambda a, x, y: x + y,
    "split2": lambda a, x: (x[:1], x[1:]),
    "random": lambda a, x: x + np.random.rand(*x.shape),
    "BlockGrad": lambda a, x: x.copy(),
    "elemwise_sub": lambda a, x, y: x - y,
    "elemwise_mul": lambda a, x, y: x * y,
    "elemwise_add": lambda a, x, y: x + y,
}


def _node(op, *inputs):
    return {"op": op, "attrs": {}, "inputs": [list(r) for r in inputs]}


GRAPH = {
    "nodes": [
        _node("neg", ("in", 0)),  # 0
        _node("exp", ("in", 1)),  # 1: dead
        _node("neg", ("in", 0)),  # 2: same as 0
        _node("add", ("node", 0, 0), ("node", 2, 0)),  # 3
        _node("split2", ("node", 3, 0)),  # 4: two outputs
        _node("make_loss", ("node", 4, 1)),
    ],  # 5: a loss, kept
    "heads": [["node", 4, 0], ["node", 3, 0]],
}


def test_simplify_merges_repeats_and_drops_dead_nodes():
    out = simplify(GRAPH)
    assert [n["op"] for n in out["nodes"]] == ["neg", "add", "split2", "make_loss"]
    assert out["nodes"][1]["inputs"] == [["node", 0, 0], ["node", 0, 0]]
    assert out["heads"] == [["node", 2, 0], ["node", 1, 0]]


def test_run_gives_the_graphs_values():
    x, y = np.array([1.0, -2.0, 3.0]), np.array([0.5])
    heads, losses = compile_graph(GRAPH, RULES, "t.op")([x, y])
    np.testing.assert_array_equal(heads[0], [-2.0])
    np.testing.assert_array_equal(heads[1], [-2.0, 4.0, -6.0])
    np.testing.assert_array_equal(losses[0], [4.0, -6.0])


def test_random_nodes_are_not_merged():
    graph = {
        "nodes": [
            _node("random", ("in", 0)),
            _node("random", ("in", 0)),
            _node("add", ("node", 0, 0), ("node", 1, 0)),
        ],
        "heads": [["node", 2, 0]],
    }
    assert len(simplify(graph)["nodes"]) == 3


def test_missing_rule_names_the_node_as_extracted():
    graph = {
        "nodes": [_node("neg", ("in", 0)), _node("neg", ("in", 0)), _node("nope", ("node", 1, 0))],
        "heads": [["node", 2, 0]],
    }
    with pytest.raises(PortError, match=r"'t.op' \(port\): MXNet operator 'nope' \(node 2"):
        compile_graph(graph, RULES, "t.op")


def _trained(term):
    """``exp(x) + term`` as the transposed builder writes a training graph: node 3 is the
    seed ``x - stop(x)``, node 2 a coefficient ``-x``."""
    return {
        "nodes": [
            _node("BlockGrad", ("in", 0)),  # 0
            _node("exp", ("node", 0, 0)),  # 1: F
            _node("neg", ("node", 0, 0)),  # 2: c
            _node("elemwise_sub", ("in", 0), ("node", 0, 0)),
        ]  # 3: seed
        + term,
        "heads": [["node", 3 + len(term), 0]],
    }


def test_split_keeps_the_outputs_and_coefficients_and_finds_one_product():
    graph = _trained(
        [
            _node("elemwise_mul", ("node", 3, 0), ("node", 2, 0)),
            _node("elemwise_add", ("node", 1, 0), ("node", 4, 0)),
        ]
    )
    split = split_linear(graph, [0])
    x = np.array([0.5, -1.0, 2.0])
    heads, _ = compile_graph(split.primal, RULES, "t.op")([x, np.zeros(1)])
    np.testing.assert_array_equal(heads[0], np.exp(x))  # the output, F
    np.testing.assert_array_equal(heads[1], -x)  # the coefficient
    assert split.n_out == 1 and split.coefficients == 1 and split.mul == [(0, 0)]
    assert not any(n["op"] == "BlockGrad" for n in simplify(split.primal)["nodes"])


def test_split_of_a_longer_linear_term_runs_it_on_seeds_and_coefficients():
    graph = _trained(
        [
            _node("neg", ("node", 3, 0)),
            _node("elemwise_mul", ("node", 4, 0), ("node", 2, 0)),
            _node("elemwise_add", ("node", 1, 0), ("node", 5, 0)),
        ]
    )
    split = split_linear(graph, [0])
    assert split.mul is None and split.terms == [0]
    v, c = np.array([1.0, 2.0]), np.array([3.0, -4.0])
    heads, _ = compile_graph(split.linear, RULES, "t.op")([v, c])
    np.testing.assert_array_equal(heads[0], -v * c)


@pytest.mark.parametrize("why", ["forward reads x", "make_loss", "no seed"])
def test_what_does_not_split(why):
    if why == "forward reads x":  # x's gradient would be the forward's own
        graph = _trained(
            [_node("exp", ("in", 0)), _node("elemwise_add", ("node", 4, 0), ("node", 3, 0))]
        )
    elif why == "make_loss":
        graph = _trained(
            [
                _node("make_loss", ("node", 3, 0)),
                _node("elemwise_add", ("node", 1, 0), ("node", 4, 0)),
            ]
        )
    else:
        graph = {"nodes": [_node("exp", ("in", 0))], "heads": [["node", 0, 0]]}
    assert split_linear(graph, [0]) is None


def test_the_runner_takes_only_integer_references():
    # compile_graph writes the graph as a Python function from its slot numbers: anything but
    # an int there (a file's text) is refused before it is compiled (portfile checks files too)
    bad = {
        "nodes": [
            _node("neg", ("in", 0)),
            _node("split2", ("node", 0, 0)),
            _node("neg", ("node", 1, "1]; import os; x = [0")),
        ],
        "heads": [["node", 2, 0]],
    }
    with pytest.raises(ValueError, match="must be integers"):
        compile_graph(bad, RULES, "t.op")
