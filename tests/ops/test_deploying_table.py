"""docs/deploying.md tells the truth: its per-op table (its examples run in test_docs_site).

Each row's "training graphs" and "deploy export" columns are what ``customop.explain``
finds for that op (inputs and parameters in tests/deploy/models.py), and its ONNX column
is whether MXNet 1.9.1's converter (``customop.to_onnx``) takes the exported graph.  The
deploy nox session runs the "yes" rows in ONNX Runtime.
"""

import re
import warnings
from pathlib import Path

import mxnet as mx
import pytest

import customop
from tests.deploy import models

PAGE = Path(__file__).resolve().parents[2] / "docs" / "deploying.md"


def table():
    text = PAGE.read_text()
    section = text[text.index("## The library's operators") :]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0].startswith("`ops."):
            rows[cells[0].strip("`")] = cells[1:4]
    return rows


def test_the_table_lists_every_operator_of_the_library():
    listed = {re.match(r"ops\.(\w+)", row).group(1) for row in table()}
    assert listed == {n for n in customop.ops.__all__ if n[0].islower()}
    assert set(table()) == set(models.op_cases())
    assert set(models.ONNX_ROWS) == {row for row, cols in table().items() if cols[2] == "yes"}


@pytest.mark.parametrize("row", sorted(models.op_cases()))
def test_each_row_is_what_explain_and_the_converter_find(row, tmp_path):
    op, xs, params = models.op_cases()[row]
    training, export, onnx = table()[row]
    report = customop.explain(op, *xs, **params)
    assert ("yes" if report.inlines else "no") == training, report.train.reason
    assert ("yes" if report.exports else "no") == export, report.export.reason
    if not report.exports:
        assert onnx == "no"
        return
    done = customop.export(
        models.OneOp(op, params), str(tmp_path / "op"), *[mx.nd.array(x) for x in xs]
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the converter's notes on box_nms
        try:
            customop.to_onnx(done, str(tmp_path / "op.onnx"))
            converted = "yes"
        except AttributeError as exc:  # "No conversion function registered for op type ..."
            assert "No conversion function registered" in str(exc)
            converted = "no"
    assert converted == onnx
