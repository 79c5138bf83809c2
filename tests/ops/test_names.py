"""Op types are part of the saved-model format: the list is pinned, and saved graphs reload."""

import json
import sys
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest

import customop
import ops
from customop import CustomOperator
from tests import fresh

ROOT = Path(__file__).resolve().parents[2]

# Changing this list breaks every model saved with the old names: do it deliberately.
OP_TYPES = sorted(
    [
        "ops.arr_pick",
        "ops.arr_pick.numpy",
        "ops.box_decode",
        "ops.box_decode.numpy",
        "ops.box_encode",
        "ops.box_encode.numpy",
        "ops.box_iou",
        "ops.box_iou.numpy",
        "ops.box_nms",
        "ops.box_nms.numpy",
        "ops.center_loss",
        "ops.center_loss.numpy",
        "ops.focal_loss",
        "ops.focal_loss.numpy",
        "ops.focal_loss~without_normalizer",
        "ops.focal_loss.numpy~without_normalizer",
        "ops.ohem_sampler",
        "ops.ohem_sampler.numpy",
        "ops.smooth_l1",
        "ops.smooth_l1.numpy",
        "ops.smooth_l1~without_weight",
        "ops.smooth_l1.numpy~without_weight",
        "ops.softmax_ce",
        "ops.softmax_ce.numpy",
        "ops.tile",
        "ops.tile.numpy",
        "ops.topk",
        "ops.topk.numpy",
        "ops.wing_loss",
        "ops.wing_loss.numpy",
        "ops.wing_loss~without_weight",
        "ops.wing_loss.numpy~without_weight",
    ]
)


def _registered_op_types():
    found = []
    for name in ops.__all__:
        root = getattr(ops, name)
        if not isinstance(root, CustomOperator):
            continue  # a Gluon block
        for op in (root, root.numpy):
            found.append(op.op_type)
            found += [v.op_type for v in op.variants.values()]  # optional inputs left out
    return sorted(found)


def test_the_registered_op_types_are_pinned():
    assert _registered_op_types() == OP_TYPES


def test_a_fresh_import_of_ops_registers_exactly_the_pinned_op_types():
    # Also catches an op registered in ops/ but not exported.
    script = (
        "import ops\n"
        "from customop import registry\n"
        "print(sorted(t for t in registry.op_types() if t.split('.')[0] == 'ops'))\n"
    )
    out = fresh.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.strip()
    assert out == repr(OP_TYPES)


def test_every_op_type_names_its_operator_under_ops():
    for op_type in OP_TYPES:
        name = op_type.split(".")[1].split("~")[0]
        assert callable(getattr(ops, name)), op_type


class _Net(mx.gluon.HybridBlock):
    def hybrid_forward(self, F, x, boxes):
        loss = ops.smooth_l1(x, F.ones((1,)) * 2.0)  # 'ops.smooth_l1~without_weight'
        iou = ops.box_iou.numpy(boxes, boxes, legacy_box=True)  # 'ops.box_iou.numpy'
        value, index = ops.topk(x, k=2, ret_typ="both")  # 'ops.topk', two outputs
        top = ops.topk.numpy(x, k=1, axis=0)  # 'ops.topk.numpy', one
        return loss.sum() + iou.sum() + value.sum() + index.sum() + top.sum()


def test_an_exported_graph_reloads_in_a_fresh_process_that_never_imported_ops(tmp_path):
    x = mx.nd.array(np.random.randn(3, 5))
    boxes = mx.nd.array([[0, 0, 9, 9], [0, 9, 9, 18], [5, 5, 14, 14]])
    net = _Net()
    net.hybridize()
    want = net(x, boxes).asnumpy()
    prefix = str(tmp_path / "net")
    net.export(prefix)
    graph = json.loads(Path(prefix + "-symbol.json").read_text())
    types = {n["attrs"]["op_type"] for n in graph["nodes"] if n["op"] == "Custom"}
    assert types == {
        "ops.smooth_l1~without_weight",
        "ops.box_iou.numpy",
        "ops.topk",
        "ops.topk.numpy",
    }
    np.save(tmp_path / "x.npy", x.asnumpy())
    np.save(tmp_path / "boxes.npy", boxes.asnumpy())
    script = f"""
import sys
import mxnet as mx, numpy as np
import customop
assert "ops" not in sys.modules
net = customop.imports({prefix + "-symbol.json"!r}, ['data0', 'data1'])
assert "customop.ops" in sys.modules  # for the op types' 'ops.' prefix
assert sys.modules["ops"] is sys.modules["customop.ops"]  # a checkout's one library
x, boxes = (mx.nd.array(np.load({str(tmp_path)!r} + f'/{{n}}.npy')) for n in ('x', 'boxes'))
np.save({str(tmp_path / "out.npy")!r}, net(x, boxes).asnumpy())
"""
    fresh.run([sys.executable, "-c", script], cwd=ROOT, check=True, timeout=120)
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), want, rtol=1e-6)


def test_a_graph_saved_with_the_retired_topk_both_op_type_is_named_and_migrates(tmp_path):
    # Until issue 19 closed, ret_typ='both' was its own op type, 'ops.topk.both'. It is retired
    # (docs/operators.md, "Retired op types"): loading names it; renaming it (as it says) restores
    # the graph, because its nodes store ret_typ='both'.
    class Net(mx.gluon.HybridBlock):
        def hybrid_forward(self, F, x):
            value, index = ops.topk(x, k=2, ret_typ="both", do_sort=False)
            return value + index

    net = Net()
    net.hybridize()
    x = mx.nd.array(np.random.randn(3, 5))
    want = net(x).asnumpy()
    prefix = str(tmp_path / "net")
    net.export(prefix)
    current = Path(prefix + "-symbol.json").read_text()
    old = tmp_path / "old-symbol.json"
    old.write_text(current.replace('"ops.topk"', '"ops.topk.both"'))
    assert '"ops.topk.both"' in old.read_text()
    with pytest.raises(RuntimeError, match=r"'ops\.topk\.both', which the operator library"):
        customop.imports(str(old), ["data"])
    migrated = tmp_path / "migrated-symbol.json"
    migrated.write_text(old.read_text().replace('"ops.topk.both', '"ops.topk'))
    np.testing.assert_allclose(customop.imports(str(migrated), ["data"])(x).asnumpy(), want)
