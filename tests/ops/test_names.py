"""Op types are part of the saved-model format: the list is pinned, and saved graphs reload."""
import json
import subprocess
import sys
from pathlib import Path

import mxnet as mx
import numpy as np

import ops
from customop import CustomOperator

ROOT = Path(__file__).resolve().parents[2]

# Changing this list breaks every model saved with the old names: do it deliberately.
OP_TYPES = sorted([
    "ops.arr_pick", "ops.arr_pick.numpy",
    "ops.box_decode", "ops.box_decode.numpy",
    "ops.box_encode", "ops.box_encode.numpy",
    "ops.box_iou", "ops.box_iou.numpy",
    "ops.box_nms", "ops.box_nms.numpy",
    "ops.center_loss", "ops.center_loss.numpy",
    "ops.focal_loss", "ops.focal_loss.numpy",
    "ops.focal_loss~without_normalizer", "ops.focal_loss.numpy~without_normalizer",
    "ops.ohem_sampler", "ops.ohem_sampler.numpy",
    "ops.smooth_l1", "ops.smooth_l1.numpy",
    "ops.smooth_l1~without_weight", "ops.smooth_l1.numpy~without_weight",
    "ops.softmax_ce", "ops.softmax_ce.numpy",
    "ops.tile", "ops.tile.numpy",
    "ops.topk", "ops.topk.numpy", "ops.topk.both", "ops.topk.both.numpy",
    "ops.wing_loss", "ops.wing_loss.numpy",
    "ops.wing_loss~without_weight", "ops.wing_loss.numpy~without_weight",
])


def _registered_op_types():
    found = []
    for name in ops.__all__:
        obj = getattr(ops, name)
        roots = [obj.single, obj.both] if isinstance(obj, ops.topk.__class__) else [obj]
        for root in roots:
            if not isinstance(root, CustomOperator):
                continue
            for op in (root, root.numpy):
                found.append(op.op_type)
                found += [v.op_type for v in op.variants.values()]  # optional inputs left out
    return sorted(found)


def test_the_registered_op_types_are_pinned():
    assert _registered_op_types() == OP_TYPES


def test_a_fresh_import_of_ops_registers_exactly_the_pinned_op_types():
    # Also catches an op registered in ops/ but not exported.
    script = ("import ops\n"
              "from customop import registry\n"
              "print(sorted(t for t in registry.op_types() if t.split('.')[0] == 'ops'))\n")
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, check=True).stdout.strip()
    assert out == repr(OP_TYPES)


def test_every_op_type_names_its_operator_under_ops():
    for op_type in OP_TYPES:
        name = op_type.split(".")[1].split("~")[0]
        assert callable(getattr(ops, name)), op_type


class _Net(mx.gluon.HybridBlock):
    def hybrid_forward(self, F, x, boxes):
        loss = ops.smooth_l1(x, F.ones((1,)) * 2.0)             # 'ops.smooth_l1~without_weight'
        iou = ops.box_iou.numpy(boxes, boxes, legacy_box=True)  # 'ops.box_iou.numpy'
        value, index = ops.topk(x, k=2, ret_typ="both")         # 'ops.topk.both'
        return loss.sum() + iou.sum() + value.sum() + index.sum()


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
    assert types == {"ops.smooth_l1~without_weight", "ops.box_iou.numpy", "ops.topk.both"}
    np.save(tmp_path / "x.npy", x.asnumpy())
    np.save(tmp_path / "boxes.npy", boxes.asnumpy())
    script = f"""
import sys
import mxnet as mx, numpy as np
import customop
assert "ops" not in sys.modules
net = customop.imports({prefix + '-symbol.json'!r}, ['data0', 'data1'])
assert "ops" in sys.modules  # imported from the op types' dotted prefix
x, boxes = (mx.nd.array(np.load({str(tmp_path)!r} + f'/{{n}}.npy')) for n in ('x', 'boxes'))
np.save({str(tmp_path / 'out.npy')!r}, net(x, boxes).asnumpy())
"""
    subprocess.run([sys.executable, "-c", script], cwd=ROOT, check=True, timeout=120)
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), want, rtol=1e-6)
