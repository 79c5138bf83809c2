"""The runnable examples (```{doctest} fences) of the how-to pages, the porting guide and the
changelog run as written, with the flags of Sphinx's doctest builder, against the installed
package (``from customop import ...``), one namespace per page."""
import doctest
import re
from pathlib import Path

import mxnet as mx
import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["porting.md", "changelog.md", "howto/input_shapes.md", "howto/joint_gradients.md",
         "howto/aux_states.md", "howto/several_outputs.md"]
FENCE = re.compile(r"^```\{doctest\}[^\n]*\n(.*?)^```", re.S | re.M)
FLAGS = doctest.ELLIPSIS | doctest.IGNORE_EXCEPTION_DETAIL | doctest.DONT_ACCEPT_TRUE_FOR_1


def _blocks(page):
    return FENCE.findall((ROOT / "docs" / page).read_text(encoding="utf-8"))


@pytest.mark.parametrize("page", PAGES)
def test_page_examples_run_as_written(page):
    text = "\n".join(_blocks(page))
    assert "import ops" not in text.replace("from customop import ops", "")
    globs = {"__name__": "docs_" + re.sub(r"\W", "_", page[:-3])}
    test = doctest.DocTestParser().get_doctest(text, globs, page, page, 0)
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    runner.run(test, clear_globs=False)
    mx.nd.waitall()  # what a page started finishes while its names still exist
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} example(s) of docs/{page} failed (output above)"
    assert result.attempted >= len(_blocks(page))


def test_every_page_with_code_has_runnable_examples():
    for page in PAGES:
        if page != "changelog.md":
            assert _blocks(page), page
