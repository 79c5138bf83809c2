"""graphs/saved_splices: a model's spliced training graph read back by a later process."""

import json
import sys
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest

from customop import customop, ops
from customop.graphs import binding, saved_splices, splice

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import retinanet_head as R  # noqa: E402

NAMES = ("feat", "gt_boxes", "gt_labels")


def _head_symbol():
    head = R.make_block()  # (a new block: its Constants' initializers name another id)
    head.initialize(mx.init.Xavier())
    sym = head(*[mx.sym.var(n) for n in NAMES])
    fixed = {"feat": (R.BATCH, R.CHANNELS, R.HEIGHT, R.WIDTH)}
    fixed.update(
        (n, tuple(p.shape))
        for n, p in head.collect_params().items()
        if n in sym.list_arguments() and p.shape and all(p.shape)
    )
    return sym, fixed


def _step(sym, fixed, num_gt=3):
    exe = sym.simple_bind(
        mx.cpu(), gt_boxes=(R.BATCH, num_gt, 4), gt_labels=(R.BATCH, num_gt), **fixed
    )
    rng = np.random.RandomState(5)
    for arr in exe.arg_dict.values():
        arr[:] = rng.uniform(1, 6, arr.shape)
    exe.arg_dict["gt_labels"][:] = rng.randint(1, 4, (R.BATCH, num_gt))
    exe.forward(is_train=True)
    exe.backward()
    return exe, [exe.outputs[0].asnumpy()] + [g.asnumpy() for g in exe.grad_arrays]


def _as_new_process():
    saved_splices.forget_seen()
    binding.clear_cache()


@pytest.fixture
def folder(monkeypatch, tmp_path):
    monkeypatch.setenv("CUSTOMOP_VERDICT_CACHE", str(tmp_path))
    _as_new_process()
    yield tmp_path
    _as_new_process()


def test_a_later_first_bind_reads_the_splice_with_the_same_bits(folder, monkeypatch):
    # Issue 55: the head's first bind in a process splices and saves; a later process's
    # first bind of the same model at the same signature reads it (no shape pass, no
    # splice) and computes the same forward and gradients, bit for bit.  The variables
    # keep the graph's own attributes (Gluon names a Constant's initializer by its id).
    sym, fixed = _head_symbol()
    exe, first = _step(sym, fixed)
    _as_new_process()
    sym, fixed = _head_symbol()
    inlines = []
    inline = splice.inline
    monkeypatch.setattr(splice, "inline", lambda *a, **k: inlines.append(a) or inline(*a, **k))
    again_exe, again = _step(sym, fixed)
    assert inlines == []
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    graph = json.loads(again_exe.customop_inlined.tojson())
    own = json.loads(sym.tojson())
    inits = {n["name"]: n.get("attrs") for n in own["nodes"] if n["op"] == "null"}
    assert any("Constant" in (a or {}).get("__init__", "") for a in inits.values())
    for node in graph["nodes"]:
        if node["op"] == "null":
            assert node.get("attrs") == inits[node["name"]]
    # a second signature of the process splices in memory, after the ops' graphs are asked
    # for at the first one's saved signatures (which fills the tables: the new box count is
    # its family's, as it would have been), and nothing is traced or saved (a verdict
    # checked anew would be a new file)
    before = sorted(p.name for p in folder.glob("*.json"))
    _step(sym, fixed, num_gt=4)
    assert len(inlines) == 1 and sorted(p.name for p in folder.glob("*.json")) == before


def test_a_new_box_count_after_a_read_takes_the_graph_read_and_computes_the_same_bits(
    folder, monkeypatch, tidy_rules_ran
):
    # Issue 55: after a first bind that read its splice, a new box count of the same family
    # asks the ops' graphs at the saved signatures (their verdicts saved with the splice, one
    # file; no splice of the first one), reads the
    # tidied graph (customop.graphs.saved_tidy: no rule but the settled one runs) and takes
    # the Symbol read at the first bind (the same graph: not loaded again).  Its forward and
    # gradients are those of a process that spliced both signatures.
    from customop.graphs import graph_verdicts, tidy

    def as_fresh_process():
        _as_new_process()
        graph_verdicts.clear_cache()  # (every table a splice fills)
        tidy.clear_cache()
        splice._symbols.clear()
        splice._splices.clear()

    as_fresh_process()
    sym, fixed = _head_symbol()
    _step(sym, fixed)
    _, expected = _step(sym, fixed, num_gt=4)
    as_fresh_process()
    sym, fixed = _head_symbol()
    first_exe, _ = _step(sym, fixed)
    ran = tidy_rules_ran()
    before = sorted(p.name for p in folder.glob("*.json"))
    from customop.graphs import verdict_files

    read = []
    load = verdict_files.load
    monkeypatch.setattr(verdict_files, "load", lambda key: read.append(key) or load(key))
    exe, found = _step(sym, fixed, num_gt=4)
    # (the ops' verdicts saved with the splice, in one file: no file of each op's is read)
    assert [json.loads(k)[0] for k in read] == ["spliced graph's verdicts", "tidied graph"]
    assert ran == [r.name for r in tidy.RULES if r.settled]
    assert exe.customop_inlined is first_exe.customop_inlined
    assert sorted(p.name for p in folder.glob("*.json")) == before
    for a, b in zip(expected, found):
        np.testing.assert_array_equal(a, b)


def test_a_bad_signature_still_raises_the_ops_error_and_corrupt_entries_miss(folder):
    sym = ops.smooth_l1(mx.sym.var("x") * 2, mx.sym.var("s"))
    sym.simple_bind(mx.cpu(), x=(2, 3), s=(1,))
    _as_new_process()
    with pytest.raises(ValueError, match=r"ops\.smooth_l1': sigma has shape \(2,\)"):
        sym.simple_bind(mx.cpu(), x=(2, 3), s=(2,))
    for entry in folder.glob("*.json"):  # the splice's entry: a graph that is not one
        data = json.loads(entry.read_text())
        if "inlined" in data["outcome"]:
            data["outcome"]["graph"] = {"nodes": 3}
            entry.write_text(json.dumps(data))
    _as_new_process()
    exe = sym.simple_bind(mx.cpu(), x=(2, 3), s=(1,))
    assert exe.customop_inlined is not None  # spliced again


@pytest.mark.parametrize("source_read", [True, False])
def test_an_entry_another_customop_source_saved_is_a_miss(folder, monkeypatch, source_read):
    # Issue 55: customop's source is checked in the entry (the key leaves it out, so that a
    # process's first look at its source runs while MXNet reads the saved graph on another
    # thread): an entry saved under another source is never taken, whether the source was
    # read before the bind or is read during it.
    from customop.graphs import code_hash

    sym = ops.smooth_l1(mx.sym.var("x") * 2, mx.sym.var("s"))
    first = sym.simple_bind(mx.cpu(), x=(2, 3), s=(1,)).customop_inlined.tojson()
    ours = code_hash.customop_source()
    inlines = []
    inline = splice.inline
    monkeypatch.setattr(splice, "inline", lambda *a, **k: inlines.append(a) or inline(*a, **k))
    # (each miss splices and saves anew: the entry then holds that process's source)
    for source, taken in ((ours, True), ("another source", False), (ours, False)):
        _as_new_process()
        inlines.clear()
        monkeypatch.setattr(code_hash, "_source", [source] if source_read else [])
        monkeypatch.setattr(code_hash, "_source_digest", lambda s=source: s)
        exe = sym.simple_bind(mx.cpu(), x=(2, 3), s=(1,))
        assert (inlines == []) is taken and exe.customop_inlined.tojson() == first


def test_a_graph_with_an_op_outside_the_library_is_not_saved(folder):
    @customop("mxnet")
    def twice(x):
        return x * 2

    sym = ops.smooth_l1(twice(mx.sym.var("x")), mx.sym.var("s"))
    sym.simple_bind(mx.cpu(), x=(2, 3), s=(1,))
    saved = [json.loads(p.read_text()) for p in folder.glob("*.json")]
    assert not any("inlined" in e["outcome"] for e in saved)


def test_a_hybridized_block_splices_in_memory_and_saves_no_splice(folder):
    # (it meets many signatures: its first one fills this process's tables instead)
    class Loss(mx.gluon.HybridBlock):
        def hybrid_forward(self, F, x, s):
            return ops.smooth_l1(x * 2, s)

    net = Loss()
    net.hybridize()
    x = mx.nd.ones((2, 3))
    x.attach_grad()
    with mx.autograd.record():
        y = net(x, mx.nd.array([2.0]))
    y.backward()
    np.testing.assert_array_equal(x.grad.asnumpy(), np.full((2, 3), 2.0, "float32"))
    saved = [json.loads(p.read_text()) for p in folder.glob("*.json")]
    assert not any("inlined" in e["outcome"] for e in saved)


def test_a_symbol_read_back_is_taken_only_by_a_graph_with_its_variables_attributes():
    # splice.adopt: the digest leaves initializers out (Gluon names a Constant's by its id),
    # so a graph of the same nodes whose variables have other attributes loads its own
    def graph(init):
        return {
            "nodes": [
                {"op": "null", "name": "c", "inputs": [], "attrs": {"__init__": init}},
                {"op": "_mul_scalar", "name": "y", "inputs": [[0, 0, 0]], "attrs": {"scalar": "2"}},
            ],
            "heads": [[1, 0, 0]],
        }

    read = mx.sym.var("c") * 3  # (stands for the Symbol a saved splice read back)
    same, other = graph('["zero", {}]'), graph('["one", {}]')
    assert splice.digest(same) == splice.digest(other)
    splice.adopt(splice.digest(same), read, {"c": {"__init__": '["zero", {}]'}})
    assert splice._loaded(other) is not read
    splice.adopt(splice.digest(same), read, {"c": {"__init__": '["zero", {}]'}})
    assert splice._loaded(same) is read
    binding.clear_cache()


def test_the_ops_verdicts_saved_with_a_splice_are_taken_only_under_the_same_source(
    folder, monkeypatch
):
    # Issue 55: the inlined ops' verdicts kept beside a splice (one file for the first new box
    # count after a read) hold customop's source: another source's are never taken.
    from customop.graphs import code_hash, verdict_files

    key = saved_splices._verdicts_key("a splice's key")
    held = {"node": {"graph": None, "reason": "r", "rule": ""}}
    verdict_files.save(key, {"source": code_hash.customop_source(), "verdicts": held})
    assert saved_splices.verdicts(key) == held
    monkeypatch.setattr(code_hash, "_source", ["another source"])
    assert saved_splices.verdicts(key) is None
    assert saved_splices.verdicts(saved_splices._verdicts_key("another key")) is None
