"""The docstring examples of the loss operators run as written; twins share the docstring."""

import doctest
import importlib

import pytest

import ops

MODULES = ["smooth_l1", "wing_loss", "tile", "softmax_ce", "focal_loss", "center_loss"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    module = importlib.import_module(f"ops.{name}")
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    result = doctest.testmod(module, optionflags=flags, report=True)
    assert result.failed == 0
    op = getattr(ops, name)
    assert result.attempted > 0 and ".. math::" in op.__doc__
    assert op.numpy.__doc__ == op.__doc__ and op.mode == "mxnet" and op.numpy.mode == "numpy"


def test_the_operators_page_lists_every_operator_and_block():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "operators.md").read_text()
    section = page.split("## Losses", 1)[1].split("\n## ", 1)[0]
    for name in [*MODULES, "FocalLoss", "SmoothL1Loss", "WingLoss", "CenterLoss", "SoftmaxCE"]:
        assert f"ops.{name}(" in section, name


def test_the_operators_table_names_every_op():
    # the table at the top of docs/operators.md: a row per op, by hand, kept complete here
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "operators.md").read_text()
    rows = {
        line.split("|")[1].strip().strip("`")
        for line in page.split("\n## ", 1)[0].splitlines()
        if line.startswith("| `ops.")
    }
    blocks = {n for n in ops.__all__ if n[0].isupper()}
    assert rows == {f"ops.{n}" for n in ops.__all__ if n not in blocks}
    for name in blocks:
        assert f"`ops.{name}`" in page.split("\n## ", 1)[0], name
