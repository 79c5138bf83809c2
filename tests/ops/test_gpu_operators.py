"""Issue 33 item 3: every MXNet operator of the library's training and export graphs runs on a GPU.

The list of operators with a GPU implementation in MXNet 1.9.1 is read out of MXNet's source
(``tests/ops/data/make_gpu_ops.py``: ``FCompute<gpu>`` and friends registered in ``.cu``
files at tag 1.9.1) and kept as test data; this machine has no GPU, so this is as far as the
design card's CUDA-accelerated topk and box paths can be checked here.
"""

import ctypes
from pathlib import Path

import pytest
from mxnet.base import _LIB, check_call

import customop
from customop.graphs import graph_verdicts, trace
from tests.deploy import models

DATA = Path(__file__).parent / "data" / "mxnet_1.9.1_gpu_ops.txt"
GPU_OPS = {
    line.strip()
    for line in DATA.read_text().splitlines()
    if line.strip() and not line.startswith("#")
}


def names(op_name):
    """The operator's name and its aliases (one NNVM operator, several names)."""
    handle = ctypes.c_void_p()
    check_call(_LIB.NNGetOpHandle(ctypes.c_char_p(op_name.encode()), ctypes.byref(handle)))
    return set(trace.op_names(handle.value)) | {op_name}


def test_the_list_was_read_out_of_mxnets_source():
    assert len(GPU_OPS) > 500
    assert {
        "topk",
        "sort",
        "take",
        "_contrib_box_encode",
        "_contrib_box_nms",
        "broadcast_mul",
    } <= GPU_OPS
    assert "Custom" not in GPU_OPS  # a Custom node runs Python on the CPU


@pytest.mark.parametrize("row", sorted(models.op_cases()))
def test_every_operator_of_the_inlined_graphs_has_a_gpu_implementation(row):
    op, xs, params = models.op_cases()[row]
    report = customop.explain(op, *xs, **params)
    for verdict in (report.train, report.export):
        if verdict.graph is None:
            continue
        missing = sorted({o for o in verdict.graph.operators() if not names(o) & GPU_OPS})
        assert not missing, f"{row} ({verdict.purpose}): no GPU implementation: {missing}"
    assert graph_verdicts.PURPOSES == ("train", "export")
