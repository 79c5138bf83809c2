"""customop.port.graph: the simplification pass and the runner, on NumPy rules (no torch/jax)."""
import numpy as np
import pytest

from customop.port.graph import PortError, compile_graph, simplify

RULES = {"neg": lambda a, x: -x, "exp": lambda a, x: np.exp(x),
         "add": lambda a, x, y: x + y, "split2": lambda a, x: (x[:1], x[1:]),
         "random": lambda a, x: x + np.random.rand(*x.shape)}


def _node(op, *inputs):
    return {"op": op, "attrs": {}, "inputs": [list(r) for r in inputs]}


GRAPH = {"nodes": [_node("neg", ("in", 0)),                     # 0
                   _node("exp", ("in", 1)),                     # 1: dead
                   _node("neg", ("in", 0)),                     # 2: same as 0
                   _node("add", ("node", 0, 0), ("node", 2, 0)),  # 3
                   _node("split2", ("node", 3, 0)),             # 4: two outputs
                   _node("make_loss", ("node", 4, 1))],         # 5: a loss, kept
         "heads": [["node", 4, 0], ["node", 3, 0]]}


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
    graph = {"nodes": [_node("random", ("in", 0)), _node("random", ("in", 0)),
                       _node("add", ("node", 0, 0), ("node", 1, 0))],
             "heads": [["node", 2, 0]]}
    assert len(simplify(graph)["nodes"]) == 3


def test_missing_rule_names_the_node_as_extracted():
    graph = {"nodes": [_node("neg", ("in", 0)), _node("neg", ("in", 0)),
                       _node("nope", ("node", 1, 0))], "heads": [["node", 2, 0]]}
    with pytest.raises(PortError, match=r"'t.op' \(port\): MXNet operator 'nope' \(node 2"):
        compile_graph(graph, RULES, "t.op")
