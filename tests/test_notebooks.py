"""Every tour notebook executes top to bottom in a fresh kernel, and keeps its plots.

The kernels of the selected notebooks run once, up front, one after another (tests/concurrently.py).
"""

import sys
from pathlib import Path

import nbformat
import pytest

from tests import concurrently

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "notebooks"))
import run_notebooks  # noqa: E402

NOTEBOOKS = run_notebooks.notebooks()


def test_the_tours_are_there():
    names = {p.name for p in NOTEBOOKS}
    assert {
        "01_quickstart.ipynb",
        "02_gradient_check.ipynb",
        "03_losses.ipynb",
        "04_detection.ipynb",
        "05_write_your_own.ipynb",
    } <= names


@pytest.fixture(scope="module")
def executed(request):
    # 03_losses trains five models: it starts first, the others run beside it
    paths = sorted(concurrently.selected(request, "path"), key=lambda p: "_losses" not in p.name)
    runs = concurrently.run_selected(
        {p: lambda p=p: run_notebooks.execute(p, save=False) for p in paths}
    )
    yield runs
    runs.wait()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes_cleanly(path, executed):
    nb = executed[path]
    errors = [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.get("output_type") == "error"
    ]
    assert not errors


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_notebook_keeps_its_outputs_and_plots(path):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.get("execution_count") for c in code), "run `make notebooks` before committing"
    plots = sum("image/png" in o.get("data", {}) for c in code for o in c.get("outputs", []))
    figures = sum(c.source.count("plt.subplots(") + c.source.count("plt.figure(") for c in code)
    assert plots >= figures > 0 or figures == 0
    for c in code:
        if "plt.subplots(" in c.source or "plt.figure(" in c.source:
            assert "set_title" in c.source or "title(" in c.source, c.source[:80]
            assert "set_xlabel" in c.source or "xlabel(" in c.source, c.source[:80]


def test_the_site_renders_every_notebook_from_notebooks():
    # docs/tutorials/ holds links to the committed notebooks, not copies: the site shows
    # exactly what the tests execute.
    listing = (ROOT / "docs" / "tutorials.md").read_text()
    for path in NOTEBOOKS:
        page = ROOT / "docs" / "tutorials" / path.name
        assert page.is_symlink() and page.resolve() == path.resolve(), path.name
        assert f"{{doc}}`tutorials/{path.stem}`" in listing, path.name
