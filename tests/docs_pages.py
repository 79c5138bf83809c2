"""The runnable examples of the documentation pages, run with the standard library's doctest.

``make docs`` runs them through Sphinx's doctest builder (Python 3.11 only: the site's tools
need it); this runs the same blocks on every Python of the test matrix.  A page's
```` ```{doctest} ````, ```` ```{testsetup} ````, ```` ```{testcleanup} ````,
```` ```{testcode} ```` and ```` ```{testoutput} ```` fences run in order in one namespace, as
Sphinx's default group does; the flags are docs/conf.py's ``doctest_default_flags``.
"""

from __future__ import annotations

import contextlib
import doctest
import io
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
FLAGS = (
    doctest.ELLIPSIS
    | doctest.NORMALIZE_WHITESPACE
    | doctest.IGNORE_EXCEPTION_DETAIL
    | doctest.DONT_ACCEPT_TRUE_FOR_1
)
KINDS = ("doctest", "testsetup", "testcleanup", "testcode", "testoutput")
# An opening fence of three or more backticks or colons with a directive name, e.g. ```{doctest}
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|:{3,})\{(?P<kind>[\w-]+)\}(?P<arg>.*)$")


def blocks(page: Path) -> list[tuple[str, str, int]]:
    """``(kind, text, line)`` of each example fence of a MyST page, in order."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, kind = m.group("indent"), m.group("fence"), m.group("kind")
        start = i + 1
        j = start
        while j < len(lines) and lines[j].strip() != fence:
            j += 1
        body = [
            line[len(indent) :] if line.startswith(indent) else line.lstrip()
            for line in lines[start:j]
        ]
        while body and body[0].startswith(":"):  # directive options (:options:, :hide:)
            body.pop(0)
        if kind in KINDS:
            found.append((kind, "\n".join(body) + "\n", start + 1))
        i = j + 1
    return found


def pages_with_examples() -> list[Path]:
    pages = sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts)
    return [p for p in pages if blocks(p)]


def run_page(page: Path) -> tuple[int, list[str]]:
    """Run a page's examples; ``(examples attempted, failure reports)``."""
    globs: dict = {"__name__": "__main__"}
    parser = doctest.DocTestParser()
    attempted, failures = 0, []
    code_output = None
    name = str(page.relative_to(ROOT))
    for kind, text, line in blocks(page):
        where = f"{name}:{line}"
        if kind == "doctest":
            test = parser.get_doctest(text, globs, where, str(page), line)
            out = io.StringIO()
            runner = doctest.DocTestRunner(optionflags=FLAGS)
            result = runner.run(test, out=out.write, clear_globs=False)
            globs = test.globs  # DocTest copied the namespace: carry its names on
            attempted += result.attempted
            if result.failed:
                failures.append(out.getvalue())
        elif kind in ("testsetup", "testcleanup", "testcode"):
            captured = io.StringIO()
            try:
                with contextlib.redirect_stdout(captured):
                    exec(compile(text, where, "exec"), globs)
            except Exception as exc:  # noqa: BLE001 - reported as the page's failure
                failures.append(f"{where}: {kind} raised {type(exc).__name__}: {exc}")
            attempted += kind == "testcode"
            code_output = captured.getvalue() if kind == "testcode" else code_output
        elif kind == "testoutput":
            checker = doctest.OutputChecker()
            if code_output is None or not checker.check_output(text, code_output, FLAGS):
                failures.append(
                    f"{where}: testoutput differs\nexpected:\n{text}got:\n{code_output}"
                )
    return attempted, failures
