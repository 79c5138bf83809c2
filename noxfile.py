"""The test matrix: the full suite on Python 3.8-3.11, one venv per Python from the same pins;
a pip install used as a user would, per Python; the documentation site (3.11).

``deploy-3.11`` exports the deployed models (tests/deploy/models.py) and checks them in two
fresh venvs: plain MXNet without customop (``SymbolBlock.imports``, ``Module``, and MXNet's
C predict API from a C program compiled there with gcc), and ONNX Runtime with a current
NumPy (no MXNet).

``bash .ci/run`` (CI) runs every session; ``.venv/bin/nox -s tests-3.9`` one of them; words
after ``--`` replace the pytest arguments (``nox -s tests-3.10 -- -q tests/ops``).  Each
interpreter is the newest ``$PYENV_ROOT/versions/3.X.*/bin/python3.X`` (``~/.pyenv`` when
PYENV_ROOT is unset), else ``python3.X`` on PATH.
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import tempfile
from pathlib import Path

import nox

PYTHONS = ["3.8", "3.9", "3.10", "3.11"]
DOCS_PYTHON = "3.11"
ROOT = Path(__file__).resolve().parent
# One suite run took 11-13 minutes per Python in CI (2 cores), 15-19 on a loaded machine (a
# run killed at 15 minutes had reached 94%).  `make test`'s pytest run on 2 cores, 2026-11-26:
# 426 s at load 1.5 before docs/development.md's "The suite's time", 408-452 s at load 1-2.5
# after; beside other suites 843 s before (load 0.3 rising to 4.3), 704 s with most of the
# changes (load 5-6).  A hung run (a fork deadlock) is killed well before CI's limit.
SUITE_TIMEOUT_S = 22 * 60

nox.options.sessions = ["tests", "install", "docs", "deploy"]
nox.options.default_venv_backend = "venv"
nox.options.download_python = "never"
nox.options.error_on_missing_interpreters = True


def _pyenv_bin_dirs() -> list[str]:
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    dirs = []
    for minor in PYTHONS:
        found = {}
        for exe in glob.glob(os.path.join(root, "versions", f"{minor}.*", "bin", f"python{minor}")):
            version = Path(exe).parents[1].name
            if re.fullmatch(r"\d+\.\d+\.\d+", version):
                found[tuple(int(p) for p in version.split("."))] = os.path.dirname(exe)
        if found:
            dirs.append(found[max(found)])
    return dirs


# nox looks for "python3.X" on PATH; pyenv's real interpreters come first (not its shims).
os.environ["PATH"] = os.pathsep.join([*_pyenv_bin_dirs(), os.environ.get("PATH", "")])


def _run_pytest(session: nox.Session, args: list[str], selection: bool) -> None:
    # pytest exits 5 when it collected no test: fine for a selection (`-- -k name`) that
    # matches nothing on this Python, an error for the full suite.
    codes = [0, 5] if selection else [0]
    try:
        session.run("timeout", "--kill-after=30", str(SUITE_TIMEOUT_S),
                    "python", "-m", "pytest", *args, external=True, success_codes=codes)
    except nox.command.CommandFailed as exc:
        reason = str(exc.reason or "")
        if reason.endswith("code 5"):
            session.error("pytest collected no tests (exit code 5) from the full suite")
        if reason.endswith(("code 124", "code 137")):
            session.error(f"the suite ran past {SUITE_TIMEOUT_S} s and was killed (a hang?)")
        raise


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """The suite as `make test` runs it (soak deselected; ruff runs once, in .ci/run)."""
    session.install("-r", "requirements-dev.txt")
    session.install("--no-deps", "-e", ".")
    args = session.posargs or ["-q", "-m", "not soak", "tests"]
    _run_pytest(session, args, selection=bool(session.posargs))


@nox.session(python=PYTHONS)
def install(session: nox.Session) -> None:
    """A user's `pip install '.[cpu,notebooks,onnx]'` (and `docs` on 3.11), unpinned, used
    outside the checkout: README blocks, docstring examples, the example script; the notebooks
    on 3.11 (the suite executes them from the checkout on every Python)."""
    docs = session.python == DOCS_PYTHON  # Sphinx 9.0, the site's, needs 3.11
    session.install(f".[cpu,notebooks,onnx{',docs' if docs else ''}]")
    session.run("python", "-m", "pip", "check")
    with tempfile.TemporaryDirectory(prefix="customop-install-") as work:
        shutil.copy(ROOT / ".ci" / "install_check.py", work)
        with session.chdir(work):
            session.run("python", "install_check.py", str(ROOT),
                        *(["--notebooks", "--docs"] if docs else []), env={"PYTHONPATH": ""})


@nox.session(python=DOCS_PYTHON)
def docs(session: nox.Session) -> None:
    """`make docs` from a fresh venv: the pinned tools, the package installed as a wheel."""
    session.install("-r", "docs/requirements.txt")
    session.install("--no-deps", ".")
    out = Path(session.create_tmp()) / "site"
    shutil.rmtree(out, ignore_errors=True)
    sphinx = ["sphinx-build", "-W", "--keep-going", "-q", "-d", str(out / "doctrees")]
    env = {"PYTHONPATH": ""}
    session.run(*sphinx, "-b", "html", "docs", str(out / "html"), env=env)
    session.run(*sphinx, "-b", "doctest", "docs", str(out / "doctest"), env=env)
    session.run("python", "docs/check_site.py", str(out / "html"), env=env)


@nox.session(python=["3.11"])
def deploy(session: nox.Session) -> None:
    """Exported models run without customop: plain MXNet (SymbolBlock, Module, the C predict
    API from C), and ONNX Runtime (no MXNet)."""
    session.install("-r", "requirements-dev.txt")
    session.install("--no-deps", "-e", ".")
    here = ROOT / "tests" / "deploy"
    with tempfile.TemporaryDirectory(prefix="customop-deploy-") as work:
        out = os.path.join(work, "models")
        session.run("python", str(here / "models.py"), out)
        for name, pins, check in (("plain-mxnet", "requirements-mxnet.txt", "run_plain_mxnet.py"),
                                  ("onnxruntime", "requirements-onnxruntime.txt",
                                   "run_onnxruntime.py")):
            venv = os.path.join(work, name)
            session.run("python", "-m", "venv", venv)
            python = os.path.join(venv, "bin", "python")
            session.run(python, "-m", "pip", "install", "--quiet", "-r", str(here / pins),
                        external=True)
            with session.chdir(work):  # nothing of the checkout on sys.path
                session.run(python, str(here / check), out, external=True,
                            env={"PYTHONPATH": ""})
