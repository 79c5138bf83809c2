"""Issue 34: exported models load as a deployer loads them, with the names and shapes expected.

Every model of tests/deploy/models.py (the exportable rows of docs/deploying.md's table,
the three example heads' inference graphs, the post-processing block at batch sizes 2, 1
and 5) runs in SymbolBlock, Module and MXNet's C predict API in test_export.py's
subprocess (tests/deploy/run_plain_mxnet.py) and in ONNX Runtime in the deploy nox
session.  Here: what makes that work, each part on its own, so that a failure names it.
"""

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest

import customop
from customop import ops
from tests import fresh
from tests.deploy import c_predict, models

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "deploying.md"


def _one(op, params):
    return models.OneOp(op, params)


def _outputs(got):
    return [got.asnumpy()] if isinstance(got, mx.nd.NDArray) else [g.asnumpy() for g in got]


def test_constants_carry_their_shapes_so_shape_inference_needs_the_data_only(tmp_path):
    # MXPredCreate, Module.bind and sym.infer_shape know the data shapes only: without
    # __shape__ on the saved constants, topk's graph fails inside its Reshape (issue 34)
    x = mx.nd.array(np.random.RandomState(0).rand(3, 8))
    done = customop.export(_one(ops.topk, dict(k=3)), str(tmp_path / "t"), x)
    graph = json.loads(Path(done.symbol_file).read_text())
    saved = mx.nd.load(done.params_file)
    constants = [n for n in graph["nodes"] if n["op"] == "null" and f"arg:{n['name']}" in saved]
    assert constants
    for node in constants:
        value = saved[f"arg:{node['name']}"]
        assert node["attrs"]["__shape__"] == str(value.shape)
        assert node["attrs"]["__dtype__"] == str(
            {np.float32: 0, np.float64: 1, np.int32: 4, np.int64: 6}[value.dtype]
        )
        assert "topk_constant" in node["name"] or "topk_constant" in node["name"][:-5]
    sym = mx.sym.load(done.symbol_file)
    _, out_shapes, _ = sym.infer_shape(data=(3, 8))
    assert out_shapes == [(3, 3)]


def test_inputs_are_the_blocks_in_its_order_and_outputs_are_named(tmp_path):
    name, block, inputs, options, _ = next(models.models())
    assert name == "postprocess"
    done = customop.export(block, str(tmp_path / "p"), *inputs, **options)
    assert list(done.inputs) == ["offsets", "scores", "anchors"]
    assert [s for s, _ in done.inputs.values()] == [tuple(a.shape) for a in inputs]
    assert done.outputs == ["best_output", "kept_output"]
    sym = mx.sym.load(done.symbol_file)
    assert sym.list_outputs() == done.outputs
    assert set(sym.list_inputs()) - set(done.inputs) == set(sym.list_arguments()) - set(
        done.inputs
    )  # the rest are parameters, saved in the params file
    saved = {k.split(":", 1)[1] for k in mx.nd.load(done.params_file)}
    assert set(sym.list_arguments()) - set(done.inputs) == saved
    loaded = mx.gluon.SymbolBlock.imports(done.symbol_file, list(done.inputs), done.params_file)
    for got, want in zip(_outputs(loaded(*inputs)), _outputs(block(*inputs))):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_the_onnx_model_uses_the_same_names(tmp_path):
    onnx = pytest.importorskip("onnx")  # requirements-dev pins it; the import is slow only
    name, block, inputs, options, _ = next(models.models())
    done = customop.export(block, str(tmp_path / "p"), *inputs, **options)
    converted = customop.to_onnx(done, str(tmp_path / "p.onnx"))
    assert converted.inputs == list(done.inputs) and converted.outputs == done.outputs
    model = onnx.load(str(tmp_path / "p.onnx"))
    assert [i.name for i in model.graph.input] == list(done.inputs)  # constants left out
    assert [o.name for o in model.graph.output] == done.outputs
    batch = [d.dim_param or d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert batch[0] != inputs[0].shape[0] and batch[1:] == list(inputs[0].shape[1:])


FIRST_EXPORT = """
import sys, customop
from tests.deploy import models
name, block, inputs, options, _ = next(models.models())
done = customop.export(block, sys.argv[1], *inputs, **options)
print(customop.to_onnx(done, sys.argv[1] + '.onnx').inputs)
"""


def test_a_fresh_process_first_export_converts_to_onnx(tmp_path):
    # In a new process the inlined nodes are numbered from 0: postprocess's multi-output
    # node_1 had its outputs named node_10, node_11 by the converter, beside node_10 itself
    # ("Graph must be in single static assignment (SSA) form"); later in a process it passed.
    pytest.importorskip("onnx")
    run = fresh.run(
        [sys.executable, "-c", FIRST_EXPORT, str(tmp_path / "p")],
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-1] == "['offsets', 'scores', 'anchors']"


def test_to_onnx_without_onnx_says_which_extra_to_install(tmp_path, monkeypatch):
    name, block, inputs, options, _ = next(models.models())
    done = customop.export(block, str(tmp_path / "p"), *inputs, **options)
    monkeypatch.setitem(sys.modules, "onnx", None)  # what `import onnx` meets when absent
    with pytest.raises(
        ImportError,
        match=r"customop.to_onnx needs the 'onnx' package: "
        r"pip install 'customop\[onnx\]'",
    ):
        customop.to_onnx(done, str(tmp_path / "p.onnx"))
    assert not (tmp_path / "p.onnx").exists()


def test_a_label_the_graph_does_not_read_is_not_an_input(tmp_path):
    # softmax_ce's label only shapes its gradient: the exported graph does not take it
    x, y = mx.nd.array([[1.0, 2.0, 0.5]]), mx.nd.array([2])
    done = customop.export(
        _one(ops.softmax_ce, {}),
        str(tmp_path / "s"),
        x,
        y,
        input_names=["logits", "label"],
        output_names="probabilities",
    )
    assert list(done.inputs) == ["logits"]
    assert mx.sym.load(done.symbol_file).list_inputs() == ["logits"]
    loaded = mx.gluon.SymbolBlock.imports(done.symbol_file, list(done.inputs), done.params_file)
    e = np.exp([1.0, 2.0, 0.5])
    np.testing.assert_allclose(loaded(x).asnumpy(), [e / e.sum()], rtol=1e-6)


def test_bad_names_are_refused_naming_the_argument(tmp_path):
    x = mx.nd.ones((2, 3))
    net = _one(ops.tile, dict(reps=(1, 2)))
    with pytest.raises(ValueError, match="input_names must name each of the 1 input"):
        customop.export(net, str(tmp_path / "t"), x, input_names=["a", "b"])
    with pytest.raises(ValueError, match="output_names must name each of the 1 output"):
        customop.export(net, str(tmp_path / "t"), x, output_names=["a", "b"])
    with pytest.raises(ValueError, match="output_names must differ"):
        customop.export(net, str(tmp_path / "t"), x, input_names=["x"], output_names=["x"])
    assert not (tmp_path / "t-symbol.json").exists()


@pytest.mark.parametrize("exported_at", [1, 5])
def test_the_post_processing_export_runs_at_other_batch_sizes(exported_at, tmp_path):
    name, block, _, options, _ = next(models.models())
    inputs = [mx.nd.array(a) for a in models.post_inputs(exported_at)]
    done = customop.export(block, str(tmp_path / "p"), *inputs, **options)
    assert done.fixed == []
    graph = Path(done.symbol_file).read_text()
    assert "_contrib_arange_like" in graph  # topk's and box_nms's row offsets, per batch
    loaded = mx.gluon.SymbolBlock.imports(done.symbol_file, list(done.inputs), done.params_file)
    for batch in (1, 2, 5):
        arrays = [mx.nd.array(a) for a in models.post_inputs(batch)]
        for got, want in zip(_outputs(loaded(*arrays)), _outputs(block(*arrays))):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=str(batch))


def test_an_op_that_fixes_the_shape_is_named_and_other_shapes_are_refused(tmp_path):
    net = _one(models.centered, {})
    x = mx.nd.array(np.random.RandomState(0).rand(2, 12, 6))
    done = customop.export(net, str(tmp_path / "n"), x)
    assert len(done.fixed) == 1 and "centered'" in done.fixed[0], done.fixed
    assert "broadcast_to" in done.fixed[0], done.fixed
    loaded = mx.gluon.SymbolBlock.imports(done.symbol_file, list(done.inputs), done.params_file)
    want = x.asnumpy() - x.asnumpy().mean(axis=(1, 2), keepdims=True)
    np.testing.assert_allclose(loaded(x).asnumpy(), want, rtol=1e-5, atol=1e-6)
    # batch 1 would broadcast against the frozen batch-2 arrays without the check
    for other in (x[:1], mx.nd.concat(x, x, dim=0), x[:, :6]):
        with pytest.raises(mx.base.MXNetError, match="data_fixed_at_2x12x6_by_centered"):
            mx.gluon.SymbolBlock.imports(done.symbol_file, list(done.inputs), done.params_file)(
                other
            )


def test_an_export_that_depends_on_the_batch_size_otherwise_is_fixed_too(tmp_path):
    # a constant that is neither shared nor per-row affine: the batch size itself
    @customop.customop("mxnet")
    def over_batch(x):
        return x / mx.nd.full((1, 1), float(x.shape[0]), dtype=x.dtype)

    x = mx.nd.ones((3, 2))
    done = customop.export(_one(over_batch, {}), str(tmp_path / "o"), x)
    assert done.fixed and "over_batch" in done.fixed[0]
    loaded = mx.gluon.SymbolBlock.imports(done.symbol_file, list(done.inputs), done.params_file)
    np.testing.assert_allclose(loaded(x).asnumpy(), np.full((3, 2), 1 / 3), rtol=1e-6)
    with pytest.raises(mx.base.MXNetError, match="_fixed_at_3x2_by_"):
        loaded(mx.nd.ones((4, 2)))


@pytest.fixture(scope="module")
def c_program(tmp_path_factory):
    return c_predict.build(tmp_path_factory.mktemp("c"))


def test_the_c_program_fails_with_mxnets_message(c_program, tmp_path):
    done = customop.export(
        _one(ops.tile, dict(reps=(1, 2))), str(tmp_path / "t"), mx.nd.ones((2, 3))
    )
    got = c_predict.run(
        c_program,
        done.symbol_file,
        done.params_file,
        {"data": np.arange(6, dtype=np.float32).reshape(2, 3)},
    )
    np.testing.assert_array_equal(got[0], np.tile(np.arange(6).reshape(2, 3), (1, 2)))
    with pytest.raises(c_predict.PredictError, match="cannot find input key label"):
        c_predict.run(
            c_program,
            done.symbol_file,
            done.params_file,
            {"data": np.ones((2, 3)), "label": np.ones(2)},
        )


def _page_c_snippet() -> str:
    text = PAGE.read_text()
    found = re.findall(r"```c\n(.*?)```", text, re.S)
    assert len(found) == 1, "docs/deploying.md shows one C program"
    return found[0]


def test_the_pages_c_program_compiles_and_runs_the_pages_export(tmp_path):
    source = tmp_path / "predict.c"
    source.write_text(_page_c_snippet())
    assert "#include <stdbool.h>" in source.read_text().split("c_predict_api.h")[0]
    program = c_predict.build(tmp_path, source)
    # the page's export: PostProcess at its shapes, names as the page gives them
    name, block, _, options, _ = next(models.models())
    rng = np.random.RandomState(0)
    xy = rng.rand(1, 6, 2) * 20
    arrays = [rng.randn(2, 6, 4) * 0.1, rng.rand(2, 6, 1), np.concatenate([xy, xy + 10], -1)]
    arrays = [a.astype(np.float32) for a in arrays]
    net = DocsPostProcess()
    done = customop.export(
        net,
        str(tmp_path / "post"),
        *[mx.nd.array(a) for a in arrays],
        input_names=["offsets", "scores", "anchors"],
        output_names=["best"],
    )
    for key, value in zip(done.inputs, arrays):
        value.tofile(tmp_path / f"{key}.bin")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    run = subprocess.run(
        [str(program)], cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env
    )
    assert run.returncode == 0, run.stderr
    printed = np.array([float(v) for v in run.stdout.split()])
    want = net(*[mx.nd.array(a) for a in arrays]).asnumpy()
    np.testing.assert_allclose(printed, want.ravel(), rtol=1e-5)


class DocsPostProcess(mx.gluon.HybridBlock):
    """docs/deploying.md's example block."""

    def hybrid_forward(self, F, offsets, scores, anchors):
        boxes = ops.box_decode(offsets, anchors, format="corner")
        dets = F.concat(F.zeros_like(scores), scores, boxes, dim=-1)
        kept = ops.box_nms(dets, overlap_thresh=0.5, force_suppress=True)
        return ops.topk(kept.slice_axis(axis=-1, begin=1, end=2).reshape((0, -1)), k=2)


def test_the_page_lists_the_loaders_that_are_tested():
    text = PAGE.read_text()
    section = text[text.index("## Tested loaders") :]
    section = section[: section.index("\n## ", 1)]
    listed = re.findall(r"^- \*\*(.+?)\*\*", section, re.M)
    runner = (ROOT / "tests" / "deploy" / "run_plain_mxnet.py").read_text()
    loaders = re.findall(r'"([^"]+)": (?:symbol_block|module|c_api)', runner)
    assert listed == [*loaders, "ONNX Runtime"]


def test_an_export_that_keeps_a_custom_node_still_runs_at_other_batch_sizes(tmp_path):
    from tests.customop.test_export import Mixed  # ops.tile, then a 'numpy'-mode op

    with pytest.warns(UserWarning, match="numpy_double"):
        done = customop.export(Mixed(), str(tmp_path / "m"), mx.nd.ones((2, 3)), not_inlined="warn")
    assert done.fixed == [] and done.batch_inputs == ["data"]
    loaded = customop.imports(done.symbol_file, list(done.inputs), done.params_file)
    np.testing.assert_array_equal(loaded(mx.nd.ones((5, 3))).asnumpy(), np.full((5, 6), 2.0))


DATA_ONLY = """
import json, sys
import mxnet as mx
import customop
from customop.deploy import trusted_imports  # noqa: F401  (customop's own modules, imported first)
from tests.deploy import models
name, block, inputs, options, _ = next(models.models())
prefix = sys.argv[1]
done = customop.export(block, prefix, *inputs, **options)
onnx = None
if sys.argv[2] == "onnx":
    import onnx
    customop.to_onnx(done, prefix + ".onnx")
events = []
WATCHED = ("import", "exec", "compile", "pickle.find_class", "marshal.loads", "os.system",
           "subprocess.Popen", "ctypes.dlopen")
sys.addaudithook(lambda event, args: events.append([event, repr(args)[:200]])
                 if event in WATCHED else None)
names = list(done.inputs)
net = mx.gluon.SymbolBlock.imports(done.symbol_file, names, done.params_file)
outs = net(*inputs)
again = customop.imports(done.symbol_file, names, done.params_file)
sym, args, auxs = mx.model.load_checkpoint(prefix, 0)
sym, args, auxs = customop.load_checkpoint(prefix, 0)
if onnx is not None:
    onnx.checker.check_model(onnx.load(prefix + ".onnx"))
print(json.dumps(events))
"""


def test_exported_files_load_as_data(tmp_path):
    # An export's symbol JSON, params and ONNX file load without pickle, without eval, exec
    # or compile, and without importing anything (Python's audit events, in a child: an
    # audit hook cannot be removed)
    have_onnx = "onnx" if importlib.util.find_spec("onnx") else "-"
    run = fresh.run(
        [sys.executable, "-c", DATA_ONLY, str(tmp_path / "p"), have_onnx],
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == []
