"""Issue 27: the documentation site's sources, checked on every Python without Sphinx.

``make docs`` (and CI's ``nox -s docs``) builds the site with -W and runs its examples
through Sphinx's doctest builder on Python 3.11; these tests run the same page examples with
the standard library's doctest on every Python, and check what the site must cover.
"""

import importlib.util
import re

import pytest

from tests.docs_pages import DOCS, ROOT, blocks, pages_with_examples, run_page

PAGES = pages_with_examples()


def _check_site():
    spec = importlib.util.spec_from_file_location("check_site", DOCS / "check_site.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(DOCS)))
def test_page_examples_run(page):
    attempted, failures = run_page(page)
    assert not failures, "\n".join(failures)
    assert attempted > 0


def test_every_public_name_has_an_api_entry():
    # Sphinx turns each of these directives into the name's entry (docs/check_site.py then
    # finds every public name in the built site's objects.inv).
    sources = "\n".join(p.read_text() for p in (DOCS / "api").glob("*.md"))
    entries = set(
        re.findall(r"^\.\. (?:auto)?(?:function|class|exception|data)::\s+(\S+)", sources, re.M)
    )
    current = None
    for line in sources.splitlines():  # py:data without a module, under an automodule
        m = re.match(r"^\.\. automodule:: (\S+)", line)
        current = m.group(1) if m else current
        m = re.match(r"^\.\. py:data:: (\w+)$", line)
        if m:
            entries.add(f"{current}.{m.group(1)}")
    names = _check_site().public_names()
    assert len(names) > 30
    missing = [n for n in names if n not in entries]
    assert not missing, f"no API entry for {missing}"


def test_every_how_to_guide_has_a_runnable_example():
    guides = sorted((DOCS / "howto").glob("*.md"))
    assert len(guides) >= 7
    for page in guides:
        assert any(kind in ("doctest", "testcode") for kind, _, _ in blocks(page)), page.name


def test_user_facing_text_imports_the_installed_package():
    # A pip install has customop.ops, not a top-level ops: `import ops` is for the test suite.
    bare = re.compile(r"^\s*(>>>\s*)?(import ops\b|import .*, ops\b|from ops\b)", re.M)
    texts = [
        ROOT / "README.md",
        *DOCS.rglob("*.md"),
        *(ROOT / "ops").glob("*.py"),
        *(ROOT / "customop").rglob("*.py"),
        *(ROOT / "examples").glob("*.py"),
        *(ROOT / "notebooks").glob("*.ipynb"),
    ]
    offenders = [
        str(p.relative_to(ROOT))
        for p in texts
        if "_build" not in p.parts and p.name != "_checkout.py" and bare.search(p.read_text())
    ]
    assert not offenders, offenders


def test_readme_is_a_short_front_page_linking_the_site():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    for heading in (
        "## Install",
        "## Quick start",
        "## Several ops in one hybridized graph",
        "## Documentation",
        "## Changes",
    ):
        assert heading in text, heading
    assert "make demo" in text and "make test" in text
    optional = {f"docs/{name}.md" for name in _conf_optional_pages()}
    for target in re.findall(r"\]\(([^)#]+)\)", text):
        if target.startswith("http"):
            continue
        assert (ROOT / target).exists() or target in optional, target


def _conf_optional_pages():
    source = (DOCS / "conf.py").read_text()
    return re.search(r"OPTIONAL_PAGES = \(([^)]*)\)", source).group(1).replace('"', "").split(", ")


def test_the_cli_help_the_site_shows_is_the_clis():
    # docs/conf.py writes `python -m customop.check --help` at build time; the page includes it
    page = (DOCS / "api" / "check.md").read_text()
    assert "_generated/check_help.txt" in page
    assert "_write_cli_help" in (DOCS / "conf.py").read_text()


def test_no_page_cites_internal_issue_numbers():
    # The changelog keeps its history; every other page, BENCHMARKS.md (included by the
    # Benchmarks page) and the docstrings the API pages show are read by users who cannot
    # look our issue numbers up.
    check = _check_site()
    sources = [
        ROOT / "BENCHMARKS.md",
        ROOT / "README.md",
        *(p for p in DOCS.rglob("*.md") if p.name != "changelog.md" and "_build" not in p.parts),
        *(ROOT / "customop").rglob("*.py"),
        *(ROOT / "ops").glob("*.py"),
    ]
    # (sources are no HTML: a "<" would make the tag stripper drop all text up to a ">")
    cited = {
        str(p.relative_to(ROOT)): check.issue_mentions(p.read_text().replace("<", " "))
        for p in sources
    }
    assert not {k: v for k, v in cited.items() if v}


def test_check_site_fails_on_issue_numbers_and_repeated_toc_entries(tmp_path):
    check = _check_site()
    assert check.issue_mentions("<h2>Losses (issue 10)</h2><p>Before issue-19 was closed</p>")
    assert check.issue_mentions("<h2>Targets (issue #4)</h2>")
    assert check.issue_mentions("<p>as in (#12)</p>")
    assert not check.issue_mentions(
        "<p>MXNet issue #8801; color: &#123; <a href='#12'>x</a>"
        "</p><script>var issue = 10;</script>"
    )
    index = (
        '<div class="toctree-wrapper compound"><ul><li><a href="api/index.html">API '
        'reference</a><ul><li><a href="api/check.html">customop.check</a></li><li><a '
        'href="api/index.html#customop-check"><code>customop.check</code></a></li></ul>'
        "</li></ul></div>"
    )
    assert check.repeated_toc_entries(index) == ["customop.check"]
    assert check.repeated_toc_entries(index.replace("customop.check</code>", "x</code>")) == []
    # the site's check reports both (main() exits 1 with them)
    site = tmp_path / "html"
    site.mkdir()
    (site / "index.html").write_text(index)
    (site / "operators.html").write_text("<h2>Losses (issue 10)</h2>")
    (site / "changelog.html").write_text("<p>issue 10 closed</p>")
    problems = check.page_problems(site)
    assert len(problems) == 2, problems
    assert "operators.html cites internal issue numbers: Losses (issue 10)" in problems[0]
    assert "lists customop.check more than once" in problems[1]
    (site / "operators.html").write_text("<h2>Losses</h2>")
    (site / "index.html").write_text(index.replace("customop.check</code>", "x</code>"))
    assert check.page_problems(site) == []
