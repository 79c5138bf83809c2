"""Issue 28 item 3: customop.export writes graphs without Custom nodes, loadable without customop.

The two deployed models (tests/deploy/models.py): detection post-processing
(``ops.box_decode`` -> ``ops.box_nms`` -> ``ops.topk``) and a classifier using
``ops.tile``.  Here: the files hold no ``Custom`` node, plain MXNet loads them
in a process where customop cannot be imported and gives the block's outputs,
and ``mx.onnx.export_model`` converts them (ONNX Runtime runs them in the
``deploy`` nox session, which also builds a fresh venv without customop).
"""

import json
import sys
import warnings
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest

import customop
from customop import customop as decorate
from tests import fresh
from tests.deploy import models

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
BLOCKED = """
import sys, runpy
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('customop', 'ops'):
            raise ImportError(f'{name} is not installed here')
sys.meta_path.insert(0, Block())
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name='__main__')
"""


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("deploy")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the converter's notes on box_nms
        return out, models.write(str(out))


def test_the_exported_graphs_hold_only_mxnet_operators(exported):
    out, listed = exported
    assert [e["name"] for e in listed][:2] == ["postprocess", "classifier"]  # then one per op
    for entry in listed:
        graph = json.loads((out / entry["symbol"]).read_text())
        ops_used = {n["op"] for n in graph["nodes"]}
        assert "Custom" not in ops_used
    post = json.loads((out / "postprocess-symbol.json").read_text())
    assert {"_contrib_box_nms", "topk", "SliceChannel", "exp"} <= {n["op"] for n in post["nodes"]}
    classifier = json.loads((out / "classifier-symbol.json").read_text())
    assert "tile" in {n["op"] for n in classifier["nodes"]}  # a def_grad op, inlined for export


def test_plain_mxnet_loads_them_without_customop(exported):
    out, _ = exported
    run = fresh.run(
        [sys.executable, "-c", BLOCKED, str(DEPLOY / "run_plain_mxnet.py"), str(out)],
        cwd=str(out),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    cases = [(e["name"], c) for e in exported[1] for c in e["cases"]]
    assert run.stdout.count("equals the original block") + run.stdout.count(" refused ") == len(
        cases
    )


def test_onnx_conversion_is_valid_and_the_models_run_in_onnx_reference(exported):
    import onnx
    from onnx.reference import ReferenceEvaluator

    out, listed = exported
    for entry in listed:
        if "onnx" not in entry:
            continue
        model = onnx.load(str(out / entry["onnx"]))
        onnx.checker.check_model(model)
        assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [13]
        assert (
            "NonMaxSuppression" in {n.op_type for n in model.graph.node}
            or entry["name"] != "postprocess"
        )
    # onnx's reference evaluator runs the models without NonMaxSuppression (its NMS raises
    # IndexError on these, onnx 1.14.1); ONNX Runtime runs them all in the deploy session
    ran = []
    for entry in listed:
        model = onnx.load(str(out / entry["onnx"])) if "onnx" in entry else None
        if model is None or "NonMaxSuppression" in {n.op_type for n in model.graph.node}:
            continue
        assert [i.name for i in model.graph.input] == entry["inputs"], entry["name"]
        assert [o.name for o in model.graph.output] == entry["outputs"], entry["name"]
        saved = np.load(out / f"{entry['name']}.npz")
        got = ReferenceEvaluator(model).run(
            entry["outputs"], {n: saved[f"exported/input_{n}"] for n in entry["inputs"]}
        )
        for k, g in enumerate(got):
            np.testing.assert_allclose(g, saved[f"exported/output_{k}"], rtol=1e-5, atol=1e-6)
        ran.append(entry["name"])
    assert {
        "classifier",
        "example_face",
        "op_topk",
        "op_tile",
        "op_arr_pick",
        "op_box_encode",
        "op_box_iou",
        "op_focal_loss",
        "op_ohem_sampler",
        "op_smooth_l1",
        "op_topk_do_sort_False",
        "op_wing_loss",
    } <= set(ran), ran


@decorate("numpy")
def numpy_double(x):
    return x * 2


class Mixed(mx.gluon.HybridBlock):
    def hybrid_forward(self, F, x):
        from customop import ops

        return numpy_double(ops.tile(x, reps=(1, 2)))


def test_ops_that_cannot_inline_are_named_and_refused_or_warned(tmp_path):
    net, x = Mixed(), mx.nd.ones((2, 3))
    with pytest.raises(customop.NotInlinedError) as err:
        customop.export(net, str(tmp_path / "mixed"), x)
    assert "numpy_double" in str(err.value) and "'numpy'-mode operator" in str(err.value)
    assert not (tmp_path / "mixed-symbol.json").exists()
    with pytest.warns(UserWarning, match="numpy_double"):
        done = customop.export(net, str(tmp_path / "mixed"), x, not_inlined="warn")
    graph = json.loads(Path(done.symbol_file).read_text())
    custom = [n for n in graph["nodes"] if n["op"] == "Custom"]
    assert len(custom) == 1 and "numpy_double" in custom[0]["attrs"]["op_type"]
    assert len(done.inlined) == 1 and len(done.kept) == 1
    loaded = customop.imports(done.symbol_file, ["data"], done.params_file)
    np.testing.assert_array_equal(loaded(x).asnumpy(), np.full((2, 6), 2.0))


def test_bad_arguments_are_named(tmp_path):
    net = Mixed()
    with pytest.raises(ValueError, match="not_inlined"):
        customop.export(net, str(tmp_path / "m"), mx.nd.ones((1, 1)), not_inlined="ignore")
    with pytest.raises(TypeError, match="example inputs"):
        customop.export(net, str(tmp_path / "m"))


@pytest.mark.parametrize(
    "module", ["customop.deploy.export", "customop.graphs.explain", "customop.graphs.trace"]
)
def test_the_docstring_examples_run(module):
    import doctest
    import importlib

    importlib.import_module(module)
    result = doctest.testmod(
        sys.modules[module], optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    )
    assert result.failed == 0 and result.attempted > 0
