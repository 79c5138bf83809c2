"""graphs/saved_tidy: a spliced graph's tidying read back by a later process."""

import json
from pathlib import Path

import pytest

from customop.graphs import saved_tidy, verdict_files

RULES = ("constant-checks", "identities")


def _graph(init):
    return {
        "nodes": [
            {"op": "null", "name": "x", "inputs": []},
            {"op": "null", "name": "c", "inputs": [], "attrs": {"__init__": init}},
            {"op": "elemwise_mul", "name": "y", "inputs": [[0, 0, 0], [1, 0, 0]]},
        ],
        "heads": [[2, 0, 0]],
    }


def _text(graph):
    return json.dumps(graph, sort_keys=True)


@pytest.fixture
def folder(monkeypatch, tmp_path):
    monkeypatch.setenv(verdict_files.ENV, str(tmp_path))
    return tmp_path


def test_a_tidied_graph_reads_back_with_the_variables_of_the_graph_being_tidied(folder):
    # the key leaves initializers out (Gluon names a Constant's by its id, another in each
    # process): another process's graph takes the entry, and the variables read back carry
    # its own attributes
    first, later = _graph('["one_1", {}]'), _graph('["one_2", {}]')
    product = dict(first["nodes"][2], op="_mul")
    tidied = {"nodes": [*first["nodes"][:2], product], "heads": [[2, 0, 0]]}
    saved_tidy.keep(_text(first), RULES, tidied)
    found = saved_tidy.recalled(later, _text(later), RULES)
    assert found["nodes"][1]["attrs"] == {"__init__": '["one_2", {}]'}
    assert [n["op"] for n in found["nodes"]] == ["null", "null", "_mul"]
    assert saved_tidy.recalled(later, _text(later), RULES[:1]) is None  # other rules
    other = dict(later, nodes=[*later["nodes"][:2], dict(later["nodes"][2], op="elemwise_add")])
    assert saved_tidy.recalled(other, _text(other), RULES) is None  # another graph


@pytest.mark.parametrize(
    "saved",
    [
        '{"graph": {"nodes": {}, "heads": []}}',
        '{"graph": {"nodes": [{"op": "null", "name": "x", "inputs": []}], "heads": [[5, 0, 0]]}}',
        '{"graph": {"nodes": [{"op": "null", "name": "zz", "inputs": []}], "heads": [[0, 0, 0]]}}',
        '{"graph": [1, 2]}',
        '{"nothing": 1}',
    ],
)
def test_an_entry_that_does_not_read_back_as_a_graph_of_these_variables_is_a_miss(folder, saved):
    graph = _graph('["c", {}]')
    path, digest = verdict_files._file(str(folder), saved_tidy._key(_text(graph), RULES))
    Path(path).write_text(f'{{"format": 1, "key": "{digest}", "outcome": {saved}}}')
    assert saved_tidy.recalled(graph, _text(graph), RULES) is None


def test_nothing_is_read_or_written_when_the_files_are_off(monkeypatch, tmp_path):
    monkeypatch.setenv(verdict_files.ENV, "")
    graph = _graph('["c", {}]')
    saved_tidy.keep(_text(graph), RULES, graph)
    assert saved_tidy.recalled(graph, _text(graph), RULES) is None
    assert list(tmp_path.iterdir()) == []
