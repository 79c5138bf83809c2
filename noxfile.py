"""The test matrix (docs/development.md, "Tests on every Python" says what runs where, and why).

- ``tests-3.8`` and ``tests-3.11``: the full suite (``-m "not soak"``), on the oldest and
  newest Python, two pytest-xdist workers;
- ``tests-3.9`` and ``tests-3.10``: what differs by Python version (:data:`VERSION_SUITE`);
- ``install-3.X``: a user's ``pip install '.[cpu,notebooks,onnx]'`` (by uv on 3.8-3.10),
  used outside the checkout (``.ci/install_check.py``), on every Python;
  ``install_minimal``: ``.[cpu]`` alone, as the README's first install line gives it;
- ``docs`` (3.11): the site built with -W and doctested;
- ``port`` (3.11): the port tests (``tests/port``) with the ``port`` extra (torch,
  torchvision, jax), then a saved port loaded in a venv without MXNet and with NumPy 2;
- ``deploy-3.11``: the exported models (tests/deploy/models.py) checked in two fresh venvs:
  plain MXNet without customop (``SymbolBlock.imports``, ``Module``, and MXNet's C predict
  API from a C program compiled there with gcc), and ONNX Runtime with a current NumPy;
- ``horovod-3.11``: Horovod built against the pinned MXNet (Gloo, no MPI; the wheel cached
  outside the checkout, :func:`_horovod_wheel`), then tests/test_horovod.py's 2-rank jobs.

Every command runs under a time limit (:data:`LIMIT_MIN`): a hang fails its session, named,
and nox goes on with the others.  The venvs the suite runs in are filled by uv (pinned in
requirements-dev.txt; pip took 60-100 s a venv, two thirds of a short session), and so are
the install sessions' venvs on 3.8-3.10; install-3.11 and install_minimal use pip, as the
README tells users.

``bash .ci/run`` (CI) runs every session; ``.venv/bin/nox -s tests-3.9`` one of them; words
after ``--`` replace the pytest arguments (``nox -s tests-3.10 -- -q tests/ops``).  Each
interpreter is the newest ``$PYENV_ROOT/versions/3.X.*/bin/python3.X`` (``~/.pyenv`` when
PYENV_ROOT is unset), else ``python3.X`` on PATH.
"""

from __future__ import annotations

import fcntl
import glob
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import nox

PYTHONS = ["3.8", "3.9", "3.10", "3.11"]
FULL_SUITE_PYTHONS = ["3.8", "3.11"]
DOCS_PYTHON = "3.11"
ROOT = Path(__file__).resolve().parent
BUILD_LOCK = ROOT / ".nox" / "checkout-build.lock"  # one build of the checkout at a time
WORKERS = ["-n", "2", "--dist", "loadfile"]  # tests/conftest.py orders the modules for it

# On 3.9 and 3.10, what differs by version: the import (install-3.X builds and installs the
# wheel on every Python; the wheel's own tests run with the full suites), the core (decorator,
# dispatch, gradients through the autograd each Python pins, shapes, errors), pickling and
# multiprocessing children, the runtime patches (fork, subprocess, isalive differ by
# version), the launcher's processes, the tests' fork server, and the README's and pages'
# examples (docstring examples run in install-3.X).  Operators' math, graphs and exports
# run the same code on every Python: tests-3.8 and tests-3.11 run them.
VERSION_SUITE = [
    "tests/test_packaging.py::test_customop_without_mxnet_names_the_extras_and_loads_ports",
    "tests/test_packaging.py::test_checkout_gives_one_module_object_for_ops_and_customop_ops",
    "tests/test_fresh.py",
    "tests/test_docs_site.py",
    "tests/test_project.py::test_every_readme_block_runs_and_prints_what_the_readme_shows",
    "tests/test_project.py::test_readme_fragment_marker_is_read",
    "tests/customop/test_operator.py",
    "tests/customop/test_core2.py",
    "tests/customop/test_dispatch.py",
    "tests/customop/test_gradients.py",
    "tests/customop/test_autograd_versions.py",
    "tests/customop/test_joint_gradients.py",
    "tests/customop/test_inference.py",
    "tests/customop/test_outputs.py",
    "tests/customop/test_params.py",
    "tests/customop/test_errors.py",
    "tests/customop/test_pickle.py",
    "tests/customop/test_subprocess.py",
    "tests/customop/test_reliability.py",
    "tests/customop/test_runtime.py",
    "tests/customop/test_launch.py",
]

# Minutes each command may take before it is killed.  Measured on 2 cores beside the other
# stream (2026-11-28): the full suite 10-11 min (6 alone), the version suite 3-4, a venv
# filled by uv well under 1, an install check 1-5 (notebooks included on 3.11).  CI's own
# limit is 90 minutes.
LIMIT_MIN = {"suite": 20, "version suite": 10, "install": 10, "check": 10, "build": 20, "port": 10}

# Horovod for the `horovod` session: built from source against the pinned MXNet (PyPI has no
# wheel), Gloo as the controller, no MPI, no other framework; 161 s with two make jobs on 2
# cores (2026-11-28).  HOROVOD_BUILD_TOOLS: what `pip wheel --no-build-isolation` needs in the
# venv (setuptools as Python 3.11's venv has it; wheel for bdist_wheel); cmake and a C++ compiler
# come from the machine (apt).
HOROVOD = "0.28.1"
HOROVOD_PYTHON = "3.11"
HOROVOD_BUILD_TOOLS = ["setuptools==65.5.0", "wheel==0.48.0"]
HOROVOD_BUILD_ENV = {
    "HOROVOD_WITH_MXNET": "1",
    "HOROVOD_WITH_GLOO": "1",
    "HOROVOD_WITHOUT_MPI": "1",
    "HOROVOD_WITHOUT_TENSORFLOW": "1",
    "HOROVOD_WITHOUT_PYTORCH": "1",
    "MAKEFLAGS": "-j2",
}
HOROVOD_WHEELS = (
    Path(os.environ.get("CUSTOMOP_CACHE") or "~/.cache/customop").expanduser() / "horovod-wheels"
)

nox.options.sessions = ["tests", "install", "install_minimal", "docs", "deploy", "horovod", "port"]
# `.ci/run` runs these two streams at once, each a nox run of its sessions in this order.  One
# after another the sessions kept 77% of two cores busy (2,469 s of CPU in 1,599 s,
# 2026-11-28); the streams fill the rest, balanced by their times side by side (the full
# suites 10-11 minutes each, the version suites 4, the installs 2, install-3.11 6; port 2
# and horovod 1 with their caches warm, horovod 8 when it builds Horovod).
# Together they are nox.options.sessions, each once (tests/test_ci.py).
STREAMS = {
    "suites": ["tests-3.11", "tests-3.8", "docs", "port"],
    "rest": ["tests-3.9", "tests-3.10", "install", "install_minimal", "deploy", "horovod"],
}
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


def _run(session: nox.Session, limit: str, *cmd: str, codes: tuple = (0,), **kwargs) -> None:
    """``cmd`` under ``timeout``: past LIMIT_MIN[limit] minutes it is killed and the session
    fails, naming the command."""
    seconds = LIMIT_MIN[limit] * 60
    if any(arg == "." or arg.startswith(".[") for arg in cmd):
        # a build of the checkout: setuptools writes build/ and customop.egg-info in the tree,
        # and two at once (CI's streams) broke each other's wheel (measured, 2026-11-28)
        BUILD_LOCK.parent.mkdir(exist_ok=True)
        cmd = ("flock", str(BUILD_LOCK), *cmd)
    try:
        session.run(
            "timeout",
            "--kill-after=30",
            str(seconds),
            *cmd,
            external=True,
            success_codes=list(codes),
            **kwargs,
        )
    except nox.command.CommandFailed as exc:
        if str(exc.reason or "").endswith(("code 124", "code 137")):
            session.error(f"{' '.join(cmd[:4])} ... ran past {seconds} s and was killed (a hang?)")
        raise


def _uv() -> str:
    # requirements-dev.txt installs uv beside nox (the .venv that runs this file)
    found = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if not found:
        raise RuntimeError("uv is not installed: run `make venv` (requirements-dev.txt)")
    return found


def _fill(session: nox.Session, *args: str, python: str | None = None) -> None:
    """uv installs ``args`` into the session's venv (or the venv of ``python``)."""
    target = python or os.path.join(session.bin, "python")
    # --compile-bytecode: as pip does; uv leaves modules uncompiled by default, and with
    # PYTHONDONTWRITEBYTECODE set every process would compile MXNet's anew.
    _run(
        session,
        "install",
        _uv(),
        "pip",
        "install",
        "--quiet",
        "--compile-bytecode",
        "--python",
        target,
        *args,
    )


def _pytest(session: nox.Session, args: list[str], limit: str, selection: bool) -> None:
    # pytest exits 5 when it collected no test: fine for a selection (`-- -k name`) that
    # matches nothing on this Python, an error for the suite.
    try:
        _run(session, limit, "python", "-m", "pytest", *args, codes=(0, 5) if selection else (0,))
    except nox.command.CommandFailed as exc:
        if str(exc.reason or "").endswith("code 5"):
            session.error("pytest collected no tests (exit code 5)")
        raise


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """The full suite on 3.8 and 3.11 (as `make test` runs it; ruff runs once, in .ci/run);
    on 3.9 and 3.10 what differs by version (VERSION_SUITE)."""
    _fill(session, "-r", "requirements-dev.txt")
    _fill(session, "--no-deps", "-e", ".")
    if session.posargs:
        _pytest(session, list(session.posargs), "suite", selection=True)
    elif session.python in FULL_SUITE_PYTHONS:
        # -rs: the reasons of skipped tests (tests/test_horovod.py's: the horovod session's)
        _pytest(
            session, ["-q", "-rs", "-m", "not soak", *WORKERS, "tests"], "suite", selection=False
        )
    else:
        _pytest(
            session,
            ["-q", "-m", "not soak", *WORKERS, *VERSION_SUITE],
            "version suite",
            selection=False,
        )


def _outside_checkout(session: nox.Session, *args: str) -> None:
    with tempfile.TemporaryDirectory(prefix="customop-install-") as work:
        shutil.copy(ROOT / ".ci" / "install_check.py", work)
        with session.chdir(work):
            _run(
                session,
                "check",
                "python",
                "install_check.py",
                str(ROOT),
                *args,
                env={"PYTHONPATH": ""},
            )


@nox.session(python=PYTHONS)
def install(session: nox.Session) -> None:
    """A user's `pip install '.[cpu,notebooks,onnx]'` (and `docs` on 3.11), unpinned, used
    outside the checkout: README blocks, docstring examples, the example script; the notebooks
    on 3.11 (the suite executes them from the checkout on 3.8 and 3.11)."""
    docs = session.python == DOCS_PYTHON  # Sphinx 9.0, the site's, needs 3.11
    extras = f".[cpu,notebooks,onnx{',docs' if docs else ''}]"
    if docs:  # the default Python: pip, as the README tells users
        _run(session, "install", "python", "-m", "pip", "install", "--quiet", extras)
    else:  # the same resolution (unpinned, newest that fits), by uv: 40 s less a session
        _fill(session, extras)
    _run(session, "install", "python", "-m", "pip", "check")
    _outside_checkout(session, *(["--notebooks", "--docs"] if docs else []))


@nox.session(python=DOCS_PYTHON)
def install_minimal(session: nox.Session) -> None:
    """`pip install '.[cpu]'` alone (no onnx, no notebook tools) and pytest: every module of
    customop and customop.ops imports, `pytest --doctest-modules --pyargs customop` passes
    outside the checkout, and `customop.to_onnx` names the missing extra."""
    pytest_pin = next(
        line
        for line in (ROOT / "requirements-dev.txt").read_text().splitlines()
        if line.startswith("pytest==") and '>= "3.10"' in line
    ).split(";")[0]
    _run(session, "install", "python", "-m", "pip", "install", "--quiet", ".[cpu]", pytest_pin)
    _run(session, "install", "python", "-m", "pip", "check")
    _outside_checkout(session, "--minimal")


@nox.session(python=DOCS_PYTHON)
def docs(session: nox.Session) -> None:
    """`make docs` from a fresh venv: the pinned tools, the package installed as a wheel."""
    _fill(session, "-r", "docs/requirements.txt")
    _fill(session, "--no-deps", ".")
    out = Path(session.create_tmp()) / "site"
    shutil.rmtree(out, ignore_errors=True)
    sphinx = ["sphinx-build", "-W", "--keep-going", "-q", "-d", str(out / "doctrees")]
    env = {"PYTHONPATH": ""}
    _run(session, "check", *sphinx, "-b", "html", "docs", str(out / "html"), env=env)
    _run(session, "check", *sphinx, "-b", "doctest", "docs", str(out / "doctest"), env=env)
    _run(session, "check", "python", "docs/check_site.py", str(out / "html"), env=env)


@nox.session(python=["3.11"])
def deploy(session: nox.Session) -> None:
    """Exported models run without customop: plain MXNet (SymbolBlock, Module, the C predict
    API from C), and ONNX Runtime (no MXNet)."""
    _fill(session, "-r", "requirements-dev.txt")
    _fill(session, "--no-deps", "-e", ".")
    here = ROOT / "tests" / "deploy"
    with tempfile.TemporaryDirectory(prefix="customop-deploy-") as work:
        out = os.path.join(work, "models")
        _run(session, "check", "python", str(here / "models.py"), out)
        for name, pins, check in (
            ("plain-mxnet", "requirements-mxnet.txt", "run_plain_mxnet.py"),
            ("onnxruntime", "requirements-onnxruntime.txt", "run_onnxruntime.py"),
        ):
            venv = os.path.join(work, name)
            _run(session, "install", "python", "-m", "venv", venv)
            python = os.path.join(venv, "bin", "python")
            _fill(session, "-r", str(here / pins), python=python)
            with session.chdir(work):  # nothing of the checkout on sys.path
                _run(session, "check", python, str(here / check), out, env={"PYTHONPATH": ""})


def _pinned(name: str) -> str:
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        if line.startswith(f"{name}=="):
            return line.split("==", 1)[1].split(";")[0].strip()
    raise RuntimeError(f"requirements.txt pins no {name}")


def _horovod_wheel(session: nox.Session) -> Path:
    """The Horovod wheel for this Python and the pinned MXNet, built into the cache outside
    the checkout (``$CUSTOMOP_CACHE``, else ``~/.cache/customop``) when it is not there yet:
    CI's machine builds it once.  One build at a time (a lock in the cache)."""
    key = f"horovod-{HOROVOD}-mxnet-{_pinned('mxnet')}-py{session.python}"
    cache = HOROVOD_WHEELS / key
    cache.mkdir(parents=True, exist_ok=True)
    with open(HOROVOD_WHEELS / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second run waits, then finds the wheel
        found = sorted(cache.glob("horovod-*.whl"))
        if found:
            session.log(f"Horovod {HOROVOD}: the cached wheel {found[-1]}")
            return found[-1]
        _fill(session, *HOROVOD_BUILD_TOOLS)
        with tempfile.TemporaryDirectory(prefix="customop-horovod-") as out:
            _run(
                session,
                "build",
                "python",
                "-m",
                "pip",
                "wheel",
                "--quiet",
                "--no-build-isolation",
                "--no-deps",
                "--no-binary",
                "horovod",
                "-w",
                out,
                f"horovod=={HOROVOD}",
                env=HOROVOD_BUILD_ENV,
            )
            (built,) = Path(out).glob("horovod-*.whl")
            shutil.copy(built, cache / (built.name + ".part"))
            (cache / (built.name + ".part")).rename(cache / built.name)  # whole, or absent
        return cache / built.name


@nox.session(python=HOROVOD_PYTHON)
def horovod(session: nox.Session) -> None:
    """2-rank Horovod jobs on 127.0.0.1 (tests/test_horovod.py; the full suites skip it):
    Horovod built against the pinned MXNet once per machine (cached), installed, checked to
    hold MXNet and Gloo.  Words after ``--`` replace the pytest arguments (``make soak``:
    ``-m soak``)."""
    _fill(session, "-r", "requirements-dev.txt")
    _fill(session, "--no-deps", "-e", ".")
    _fill(session, str(_horovod_wheel(session)))
    # what `horovodrun --check-build` lists, as a check: the MXNet extension loads, Gloo is in
    _run(
        session,
        "check",
        "python",
        "-c",
        "import horovod.mxnet as hvd; "
        "assert hvd.gloo_built() and not hvd.mpi_built(), 'Horovod without Gloo or with MPI'",
    )
    args = list(session.posargs) or ["-q", "-m", "not soak", "tests/test_horovod.py"]
    _pytest(session, args, "suite", selection=bool(session.posargs))


# What the port tests run beside MXNet (numpy 1.23.5 keeps jax at 0.4.30), and what the
# MXNet-free venv gets: NumPy 2, the same torch, the newest jax.
PORT_PINS = [
    "torch==2.14.1",
    "torchvision==0.29.1",
    "jax==0.4.30",
    "jaxlib==0.4.30",
    "numpy==1.23.5",
]
PORT_FREE = ["numpy>=2", "torch==2.14.1", "jax", "jaxlib"]


@nox.session(python=DOCS_PYTHON)
def port(session: nox.Session) -> None:
    """customop.to_torch / to_jax / save_port against MXNet (tests/port, the `port` extra),
    then the saved port loaded in a second venv without MXNet and with NumPy 2."""
    _fill(session, "-r", "requirements-dev.txt", *PORT_PINS)
    _fill(session, "--no-deps", "-e", ".")
    _pytest(
        session,
        list(session.posargs) or ["-q", *WORKERS, "tests/port"],
        "port",
        selection=bool(session.posargs),
    )
    here = ROOT / "tests" / "port"
    with tempfile.TemporaryDirectory(prefix="customop-port-") as work:
        _run(session, "check", "python", str(here / "save_example.py"), work)
        venv = os.path.join(work, "no-mxnet")
        _run(session, "install", _uv(), "venv", "--quiet", "--python", "python3.11", venv)
        python = os.path.join(venv, "bin", "python")
        # customop without its dependencies: its `numpy<1.24` is MXNet's, not the loader's
        _fill(session, *PORT_FREE, python=python)
        _fill(session, "--no-deps", ".", python=python)
        with session.chdir(work):
            _run(
                session,
                "check",
                python,
                str(here / "load_without_mxnet.py"),
                os.path.join(work, "focal.port.json"),
                os.path.join(work, "inputs.npz"),
                os.path.join(work, "found.npz"),
                os.path.join(work, "expected.npz"),
                "--numpy2",
                env={"PYTHONPATH": ""},
            )
