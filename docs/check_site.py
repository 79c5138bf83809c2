"""What a built site must hold that Sphinx's -W does not check: ``python docs/check_site.py DIR``.

- every public name of ``customop``, ``customop.check``, ``customop.distributed`` and
  ``customop.ops`` has an entry in the API reference (``objects.inv``, the inventory that
  Sphinx writes from the autodoc entries);
- the site works from disk: the search index, ``searchindex.js`` (loaded by a ``<script>``
  tag, no server needed), knows ``focal_loss``, and no page loads a script from the network
  (MathJax comes with the site, from sphinx-mathjax-offline);
- every tutorial notebook is a page with its plots.

Exits 1 naming what is missing.  ``PUBLIC`` is also what tests/test_docs_site.py reads.
"""
from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

# The public API: the names each module lists in __all__ (customop.distributed exposes its
# two modules' names: AuxSync for hand-written loops, the job launcher).
PUBLIC = ["customop", "customop.check", "customop.distributed.auxsync",
          "customop.distributed.launch", "customop.ops"]


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
    return {name for kind, entries in inventory.items() if kind.startswith("py:")
            for name in entries}


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
        remote = [src for src in re.findall(r'<script[^>]*src="([^"]+)"', text)
                  if src.startswith(("http:", "https:", "//"))]
        if remote:
            problems.append(f"{page.relative_to(html)} loads {remote} from the network")
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
        print(f"check_site: {len(names)} API entries, every public name among them; search "
              f"index knows focal_loss; {len(notebooks)} tutorial pages with plots")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
