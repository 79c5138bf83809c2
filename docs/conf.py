"""Sphinx configuration of customop's documentation site (``make docs``; ``nox -s docs`` in CI).

Pages are MyST markdown.  Runnable examples in pages are ```` ```{doctest} ```` fences
(``sphinx.ext.doctest``): ``make docs`` runs them against the installed package, so they
import it as a user does (``from customop import customop``, ``from customop import ops``,
never a bare ``import ops``), and each page's blocks share one namespace, top to bottom.
The ``>>>`` examples of the docstrings shown by autodoc run in the same pass.  A block that
must not run (a shell command, a fragment) is a plain ```` ```python ```` or
```` ```sh ```` fence instead.  More: docs/development.md, *Writing documentation*.
"""

from __future__ import annotations

import doctest
import os
import re

project = "customop"
author = "the customop developers"
copyright = "customop developers"  # noqa: A001 (Sphinx's name)

extensions = [
    "myst_nb",  # MyST markdown pages and the executed notebooks (it loads myst_parser)
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.doctest",
    "sphinx.ext.mathjax",
    # MathJax from the site's own _static folder instead of a CDN: formulas render offline.
    "sphinx-mathjax-offline",
]

root_doc = "index"
exclude_patterns = ["_build", "_generated", "requirements.txt", "**.ipynb_checkpoints"]
# Pages that other work adds (the changelog, the porting and deployment guides) are listed
# in index.md's toctrees; until a page exists its entry is dropped from the source read
# (Sphinx 9.0 cannot silence an empty toctree glob).  How-to guides come in by `howto/*`.
OPTIONAL_PAGES = ("porting", "deploying", "changelog")

# ---- MyST and the notebooks --------------------------------------------------------------
myst_enable_extensions = ["dollarmath", "colon_fence", "deflist"]
myst_heading_anchors = 3
# The tours in notebooks/ are committed executed, outputs and plots included (the test suite
# re-executes them); the site shows those outputs and never runs a kernel.
nb_execution_mode = "off"
nb_merge_streams = True

# ---- API reference -----------------------------------------------------------------------
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"show-inheritance": False}
autosummary_generate = False  # one hand-written page per module, tables link into it
napoleon_google_docstring = True
napoleon_numpy_docstring = True
napoleon_use_rtype = False

# ---- doctest -----------------------------------------------------------------------------
doctest_default_flags = (
    doctest.ELLIPSIS
    | doctest.NORMALIZE_WHITESPACE
    | doctest.IGNORE_EXCEPTION_DETAIL
    | doctest.DONT_ACCEPT_TRUE_FOR_1
)
doctest_global_setup = """
import warnings
warnings.filterwarnings("ignore", message="Cannot decide type for the following arguments")
"""

# ---- HTML --------------------------------------------------------------------------------
html_theme = "furo"
html_title = "customop"
html_static_path: list[str] = []
html_show_sourcelink = False
html_copy_source = False


def _write_cli_help(app) -> None:
    """docs/_generated/check_help.txt: ``python -m customop.check --help``, as the CLI prints it."""
    from customop.check.cli import _parser

    out = os.path.join(app.srcdir, "_generated")
    os.makedirs(out, exist_ok=True)
    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps at the terminal's width: fix it
    try:
        text = _parser().format_help()
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns
    path = os.path.join(out, "check_help.txt")
    old = open(path, encoding="utf-8").read() if os.path.exists(path) else None
    if old != text:  # rewritten only when it changed: Sphinx rebuilds pages that include it
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)


def _drop_absent_pages(app, docname, source) -> None:
    if docname != root_doc:
        return
    for name in OPTIONAL_PAGES:
        if not os.path.exists(os.path.join(app.srcdir, name + ".md")):
            source[0] = re.sub(rf"^{name}\n", "", source[0], flags=re.M)


def _retarget_notebook_links(app, docname, source) -> None:
    # The tutorials are the files in notebooks/, linked into docs/tutorials/: a link written
    # for notebooks/ (``../docs/porting.md``) is read from docs/tutorials/ here (``../``).
    if docname.startswith("tutorials/"):
        source[0] = source[0].replace("](../docs/", "](../")


def setup(app):
    app.connect("builder-inited", _write_cli_help)
    app.connect("source-read", _drop_absent_pages)
    app.connect("source-read", _retarget_notebook_links)
    return {"parallel_read_safe": True}
