"""Run by `nox -s install`: the installed customop, used as its documents say, outside the checkout.

usage: python install_check.py CHECKOUT [--notebooks] [--docs] [--minimal]
       (from a directory outside CHECKOUT, against a pip-installed wheel)

1. Every ```python block of CHECKOUT/README.md runs in a fresh interpreter, in the current
   directory; a block followed by "It prints:" and a ```text block must print exactly that.
   A block that is deliberately a fragment is preceded by ``<!-- fragment -->`` and skipped
   by name (at most two).
2. The docstring examples of every module of ``customop`` and ``customop.ops`` (doctest).
3. Every script of ``examples/`` (``dist_train.py`` as a 2-worker ``dist_sync`` job through
   the launcher); every module of its packages imports.
4. ``--notebooks`` (the ``notebooks`` extra): every tour notebook executes in a fresh kernel.
5. ``--docs`` (the ``docs`` extra): the site's tools import.

``--minimal`` (``pip install '.[cpu]'`` and pytest, no other extra) replaces 2 and 3 with
what a minimal install meets: ``python -m pytest --doctest-modules --pyargs customop``
(every module of ``customop`` and ``customop.ops`` imports, their docstring examples pass;
the port's torch and jax modules need the ``port`` extra),
and :func:`customop.to_onnx` raising the ``ImportError`` that names the ``onnx`` extra.

Each step prints what it ran; the first failure exits non-zero.  tests/test_project.py uses
``readme_blocks`` for the same README blocks inside the test suite.
"""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import pkgutil
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

FRAGMENT = "<!-- fragment -->"
MAX_FRAGMENTS = 2
# Importing these runs something: the check's command line, a worker's start-up hook.
NOT_IMPORTED = {"customop.check.__main__", "customop.distributed.worker_site.sitecustomize"}
# The port's torch and jax modules import their framework: the `port` extra, which the
# install sessions do not install (the `port` nox session runs them).
NEEDS_PORT_EXTRA = {
    "customop.port.torch_port": "torch",
    "customop.port.torch_rules": "torch",
    "customop.port.jax_port": "jax",
    "customop.port.jax_rules": "jax",
}
MIN_DOCTESTS = 100  # the docstring examples found on 3.11 number about 170


class Block(NamedTuple):
    name: str  # "<section> #<n>"
    code: str
    prints: str | None  # the output the README shows, or None
    fragment: bool


def readme_blocks(text: str) -> list[Block]:
    """The README's ```python blocks, named by their section, with the output shown after."""
    blocks = []
    section, count = "top", 0
    pattern = re.compile(r"^(#+ [^\n]*)$|^```python\n(.*?)^```\n", re.M | re.S)
    for m in pattern.finditer(text):
        if m.group(1):
            section, count = m.group(1).lstrip("# ").strip(), 0
            continue
        count += 1
        before = text[: m.start()].rstrip().splitlines()
        fragment = bool(before) and before[-1].strip() == FRAGMENT
        after = re.match(r"\s*It prints:\s*```text\n(.*?)^```", text[m.end() :], re.S | re.M)
        blocks.append(
            Block(f"{section} #{count}", m.group(2), after.group(1) if after else None, fragment)
        )
    return blocks


def run_readme(checkout: Path) -> None:
    blocks = readme_blocks((checkout / "README.md").read_text(encoding="utf-8"))
    fragments = [b.name for b in blocks if b.fragment]
    assert len(fragments) <= MAX_FRAGMENTS, f"more than {MAX_FRAGMENTS} fragments: {fragments}"
    assert len(blocks) - len(fragments) >= 2, "the README has fewer than two runnable blocks"
    for block in blocks:
        if block.fragment:
            print(f"README block {block.name!r}: a fragment, skipped", flush=True)
            continue
        script = Path("readme_" + re.sub(r"\W+", "_", block.name).strip("_").lower() + ".py")
        script.write_text(block.code, encoding="utf-8")
        proc = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, f"README block {block.name!r} failed:\n{proc.stderr}"
        if block.prints is not None:
            assert proc.stdout.strip() == block.prints.strip(), (
                f"README block {block.name!r} printed\n{proc.stdout}\nbut the README shows\n"
                f"{block.prints}"
            )
        print(
            f"README block {block.name!r} ran"
            + (", printing what the README shows" if block.prints is not None else ""),
            flush=True,
        )


def installed_modules() -> list[str]:
    import customop
    from customop import ops

    names = ["customop"]
    for package in (customop, ops):
        prefix = package.__name__ + "."
        names += [m.name for m in pkgutil.walk_packages(package.__path__, prefix)]
    if "customop.ops" not in names:
        names.append("customop.ops")
    return [
        n
        for n in dict.fromkeys(names)
        if n not in NOT_IMPORTED
        and (n not in NEEDS_PORT_EXTRA or importlib.util.find_spec(NEEDS_PORT_EXTRA[n]))
    ]


def run_doctests(checkout: Path) -> None:
    import customop
    from customop import ops

    for module in (customop, ops):  # the installed copy, not the checkout's folders
        path = Path(module.__file__).resolve()
        assert "site-packages" in path.parts, path  # (nox's venvs live in CHECKOUT/.nox)
        assert not {checkout / "customop", checkout / "ops"} & set(path.parents), path
    assert ops.__name__ == "customop.ops", ops.__name__
    attempted = 0
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    for name in installed_modules():
        result = doctest.testmod(importlib.import_module(name), optionflags=flags)
        assert result.failed == 0, f"{result.failed} docstring example(s) of {name} failed"
        attempted += result.attempted
    assert attempted >= MIN_DOCTESTS, f"only {attempted} docstring examples found"
    print(f"{attempted} docstring examples of customop and customop.ops passed", flush=True)


def run_examples(checkout: Path) -> None:
    # The whole folder: an example may import a sibling helper (four_paths.py).
    shutil.copytree(
        checkout / "examples",
        "examples",
        dirs_exist_ok=True,
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    scripts = sorted(
        p
        for p in Path("examples").glob("*.py")
        if '__name__ == "__main__"' in p.read_text(encoding="utf-8")
    )
    for script in scripts:
        if script.name == "dist_train.py":  # a dist_sync job of two workers, as documented
            command = [
                sys.executable,
                "-m",
                "customop.distributed.launch",
                "-n",
                "2",
                "-s",
                "1",
                "--timeout",
                "240",
                sys.executable,
                str(script),
                "--api",
                "gluon",
                "--kvstore",
                "dist_sync",
                "--center-loss",
                "0.1",
            ]
        else:
            command = [sys.executable, str(script)]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"examples/{script.name} failed:\n{proc.stderr[-3000:]}"
        if script.name == "dist_train.py":
            assert "rank 0: trained" in proc.stdout and "rank 1: trained" in proc.stdout
        print(
            f"examples/{script.name} ran"
            + (" as a 2-worker dist_sync job" if script.name == "dist_train.py" else ""),
            flush=True,
        )
    assert any(s.name == "dist_train.py" for s in scripts), scripts
    for package in sorted(p.parent for p in Path("examples").glob("*/__init__.py")):
        code = (
            f"import importlib, pkgutil, {package.name} as p; "
            f"[importlib.import_module(m.name) for m in "
            f"pkgutil.walk_packages(p.__path__, '{package.name}.')]"
        )
        proc = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=300,
            cwd="examples",
        )
        assert proc.returncode == 0, f"examples/{package.name} failed:\n{proc.stderr[-3000:]}"
        print(f"examples/{package.name}/ imports", flush=True)


def _port_modules_ignored() -> list[str]:
    # pytest's --ignore takes paths (its globs do not reach modules found by --pyargs)
    home = Path(importlib.util.find_spec("customop").submodule_search_locations[0])
    return [f"--ignore={home.joinpath(*m.split('.')[1:])}.py" for m in NEEDS_PORT_EXTRA]


def run_minimal() -> None:
    import importlib.util

    assert importlib.util.find_spec("onnx") is None, "onnx is installed: not a minimal install"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--doctest-modules",
            "--pyargs",
            "customop",
            *_port_modules_ignored(),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, (
        f"pytest --doctest-modules --pyargs customop failed:\n"
        f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
    )
    print(
        "pytest --doctest-modules --pyargs customop:",
        proc.stdout.strip().splitlines()[-1],
        flush=True,
    )
    code = (
        "import mxnet as mx, customop\n"
        "net = mx.gluon.nn.Dense(2, in_units=3); net.initialize(); net.hybridize()\n"
        "try:\n"
        "    customop.to_onnx(customop.export(net, 'model', mx.nd.ones((1, 3))), 'm.onnx')\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "customop[onnx]" in proc.stdout, f"to_onnx without onnx said: {proc.stdout!r}"
    print("customop.to_onnx without onnx:", proc.stdout.strip(), flush=True)


def run_notebooks(checkout: Path) -> None:
    import nbformat
    from nbclient import NotebookClient

    for source in sorted((checkout / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        start = time.perf_counter()
        path = Path(source.name)
        shutil.copy(source, path)
        nb = nbformat.read(path, as_version=4)
        NotebookClient(
            nb,
            timeout=240,
            kernel_name="python3",
            resources={"metadata": {"path": str(Path.cwd())}},
        ).execute()
        errors = [
            o
            for c in nb.cells
            if c.cell_type == "code"
            for o in c.get("outputs", [])
            if o.get("output_type") == "error"
        ]
        assert not errors, f"{source.name}: {errors[0].get('ename')}: {errors[0].get('evalue')}"
        print(f"notebooks/{source.name} executed ({time.perf_counter() - start:.0f} s)", flush=True)


def check_docs_tools() -> None:
    from importlib.metadata import version

    for module in ("sphinx", "myst_parser", "myst_nb", "furo", "sphinx-mathjax-offline"):
        importlib.import_module(module)
    tools = ("sphinx", "myst-parser", "myst-nb", "furo", "sphinx-mathjax-offline")
    print("docs extra:", ", ".join(f"{d} {version(d)}" for d in tools), flush=True)


def main(argv: list[str]) -> int:
    checkout = Path(argv[1]).resolve()
    assert checkout not in Path.cwd().resolve().parents and Path.cwd() != checkout, (
        "run install_check.py from a directory outside the checkout"
    )
    import numpy

    assert tuple(int(p) for p in numpy.__version__.split(".")[:2]) < (1, 24), numpy.__version__
    run_readme(checkout)
    if "--minimal" in argv:
        run_minimal()
    else:
        run_doctests(checkout)
        run_examples(checkout)
    if "--notebooks" in argv:
        run_notebooks(checkout)
    if "--docs" in argv:
        check_docs_tools()
    import customop

    print(
        "install check passed on Python",
        sys.version.split()[0],
        "with NumPy",
        numpy.__version__,
        "from",
        customop.__file__,
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
