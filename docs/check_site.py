"""What a built site must hold that Sphinx's -W does not check: ``python docs/check_site.py DIR``.

- every public name of ``customop``, ``customop.check``, ``customop.distributed`` and
  ``customop.ops`` has an entry in the API reference (``objects.inv``, the inventory that
  Sphinx writes from the autodoc entries);
- the site works from disk: the search index, ``searchindex.js`` (loaded by a ``<script>``
  tag, no server needed), knows ``focal_loss``, and no page loads a script from the network
  (MathJax comes with the site, from sphinx-mathjax-offline);
- every tutorial notebook is a page with its plots;
- no page but the changelog cites the project's internal issue numbers ("issue 19",
  "(issue #4)"): a reader cannot look them up (``issue_mentions``);
- the front page's table of contents lists each entry once (``repeated_toc_entries``; a
  page's own section headings beside its toctree listed every API module twice).

Exits 1 naming what is missing.  ``PUBLIC`` is also what tests/test_docs_site.py reads.
"""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

# The public API: the names each module lists in __all__ (customop.distributed exposes its
# two modules' names: AuxSync for hand-written loops, the job launcher).
PUBLIC = [
    "customop",
    "customop.check",
    "customop.distributed.auxsync",
    "customop.distributed.launch",
    "customop.ops",
]


def public_names() -> list[str]:
    names = []
    for module_name in PUBLIC:
        module = importlib.import_module(module_name)
        names += [f"{module_name}.{name}" for name in module.__all__]
    return names


def documented(html: Path) -> set[str]:
    from sphinx.util.inventory import InventoryFile

    with open(html / "objects.inv", "rb") as f:
        inventory = InventoryFile.load(f, "", lambda base, uri: uri)
    return {
        name for kind, entries in inventory.items() if kind.startswith("py:") for name in entries
    }


# "issue 19", "issue #4", "issue-19", "issues 10 and 11", "(#12)": numbers of our tracker
# ("MXNet issue #8801" is public: it stays).
ISSUE = re.compile(r"\bissues?[\s-]*#?\d+|(?<![\w&/#])#\d+\b", re.I)
PUBLIC_ISSUE = re.compile(r"\bMXNet issues? #?\d+", re.I)


def issue_mentions(text: str) -> list[str]:
    """The internal issue numbers cited in a page's text (HTML tags, scripts and styles left
    out), each with a little context."""
    text = re.sub(r"<(script|style)\b.*?</\1>", " ", text, flags=re.S | re.I)
    text = re.sub(r"<[^>]+>", " ", text)
    text = PUBLIC_ISSUE.sub("MXNet's tracker", re.sub(r"\s+", " ", text))
    return [text[max(0, m.start() - 30) : m.end() + 10].strip() for m in ISSUE.finditer(text)]


def repeated_toc_entries(index_html: str) -> list[str]:
    """The entries the front page's tables of contents (its toctrees) list more than once."""
    seen: dict[str, int] = {}
    for wrapper in re.findall(r'<div class="toctree-wrapper[^"]*">(.*?)</div>', index_html, re.S):
        for label in re.findall(r"<a [^>]*>(.*?)</a>", wrapper, re.S):
            label = re.sub(r"<[^>]+>", "", label).strip()
            seen[label] = seen.get(label, 0) + 1
    return sorted(label for label, n in seen.items() if n > 1)


def page_problems(html: Path) -> list[str]:
    """Internal issue numbers on any page but the changelog; front-page entries listed twice."""
    problems = []
    for page in sorted(html.rglob("*.html")):
        if (
            page.name in ("changelog.html", "genindex.html", "search.html")
            or "_modules" in page.parts
        ):
            continue  # the changelog keeps its history
        cited = issue_mentions(page.read_text(encoding="utf-8"))
        if cited:
            problems.append(
                f"{page.relative_to(html)} cites internal issue numbers: {'; '.join(cited[:5])}"
            )
    repeated = repeated_toc_entries((html / "index.html").read_text(encoding="utf-8"))
    if repeated:
        problems.append(
            f"the front page's table of contents lists {', '.join(repeated)} more than once"
        )
    return problems


def main(argv: list[str]) -> int:
    html = Path(argv[1] if len(argv) > 1 else "docs/_build/html")
    problems = []
    names = documented(html)
    missing = [n for n in public_names() if n not in names]
    if missing:
        problems.append(f"no API entry for {', '.join(missing)}")
    index = (html / "searchindex.js").read_text(encoding="utf-8")
    if "focal_loss" not in index:
        problems.append("searchindex.js does not know focal_loss")
    for page in html.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        remote = [
            src
            for src in re.findall(r'<script[^>]*src="([^"]+)"', text)
            if src.startswith(("http:", "https:", "//"))
        ]
        if remote:
            problems.append(f"{page.relative_to(html)} loads {remote} from the network")
    problems += page_problems(html)
    notebooks = sorted(Path(__file__).resolve().parents[1].glob("notebooks/[0-9][0-9]_*.ipynb"))
    for nb in notebooks:
        page = html / "tutorials" / (nb.stem + ".html")
        if not page.exists():
            problems.append(f"no page for notebooks/{nb.name}")
        elif "<img" not in page.read_text(encoding="utf-8"):
            problems.append(f"{page.relative_to(html)} shows no plot")
    for problem in problems:
        print(f"check_site: {problem}", file=sys.stderr)
    if not problems:
        print(
            f"check_site: {len(names)} API entries, every public name among them; search "
            f"index knows focal_loss; {len(notebooks)} tutorial pages with plots; no "
            "internal issue numbers; each table-of-contents entry once"
        )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
