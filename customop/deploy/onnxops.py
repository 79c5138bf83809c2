"""The ``onnxops`` patch: MXNet's ONNX converter translates the operators our exports hold.

Off-switch: ``CUSTOMOP_RUNTIME_OFF=onnxops``; installed by the first
:func:`customop.to_onnx` call.

Measured (MXNet 1.9.1, onnx 1.14.1): ``mx.onnx.export_model`` raises
``AttributeError: No conversion function registered for op type sort yet.`` for
exports of ``ops.topk(do_sort=False)``, and likewise for ``_not_equal_scalar``,
``_greater_equal_scalar``, ``pick``, ``_np_cumsum``, ``log1p``, ``smooth_l1``,
``_contrib_box_iou`` and ``_contrib_box_encode``: the deploying page's rows of
``arr_pick``, ``box_encode``, ``box_iou``, ``box_nms(legacy_box=True)``,
``focal_loss``, ``ohem_sampler``, ``smooth_l1``, ``topk(do_sort=False)`` and
``wing_loss`` did not convert.  The patch adds each translation of
:data:`customop.deploy.onnx_rules.RULES` that the converter's registry
(``MXNetGraph.registry_``, any opset) lacks, at opset 12, the lowest the
converter looks up from any opset it is asked for; MXNet's own translations are
never replaced.  The added entries serve any graph converted afterwards in the
process (the converter has one registry), and only for operators it could not
convert before.
"""

from __future__ import annotations

ADDED: list = []  # the MXNet operators this patch gave a translation


def install() -> None:
    """Register the translations of :mod:`customop.deploy.onnx_rules` MXNet's converter lacks."""
    from mxnet.onnx.mx2onnx import _op_translations  # noqa: F401 - fills the registry
    from mxnet.onnx.mx2onnx._export_onnx import MXNetGraph

    from . import onnx_rules

    known = set().union(*MXNetGraph.registry_.values())
    for op, rule in onnx_rules.RULES.items():
        if op not in known:
            MXNetGraph.register(op, 12)(rule)
            ADDED.append(op)
