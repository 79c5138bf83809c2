"""Item 9: the skeleton a new user meets: README blocks, demo, packaging, commands."""

import doctest
import importlib
import importlib.util
import inspect
import os
import re
import sys
from pathlib import Path

import pytest

import customop
from customop import CustomOperator
from tests import concurrently, fresh

ROOT = Path(__file__).resolve().parents[1]


def _install_check():
    spec = importlib.util.spec_from_file_location(
        "install_check", ROOT / ".ci" / "install_check.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_readme_block_runs_and_prints_what_the_readme_shows(tmp_path):
    # The same check as CI's install sessions (.ci/install_check.py), here from the checkout.
    check = _install_check()
    blocks = check.readme_blocks((ROOT / "README.md").read_text())
    names = [b.name for b in blocks]
    assert names[:2] == ["Quick start #1", "Several ops in one hybridized graph #1"], names
    assert sum(b.fragment for b in blocks) <= check.MAX_FRAGMENTS
    quick = blocks[0]
    assert "@customop('numpy')" in quick.code and "loss.backward()" in quick.code
    assert "<customop '__main__.my_softmax' mode='numpy'" in quick.prints
    for block in blocks:
        if block.fragment:
            continue
        script = tmp_path / "block.py"
        script.write_text(block.code)
        out = fresh.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
        )
        assert out.returncode == 0, (block.name, out.stderr)
        assert block.prints is not None, f"{block.name}: show what it prints"
        assert out.stdout.strip() == block.prints.strip(), (block.name, out.stdout)


def test_every_docstring_example_runs():
    # What CI's install sessions run outside the checkout (.ci/install_check.py), here in the
    # test process from the checkout, so that `make test` meets a stale example first.
    check = _install_check()
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    failed, attempted = {}, 0
    for name in check.installed_modules():
        result = doctest.testmod(importlib.import_module(name), optionflags=flags)
        attempted += result.attempted
        if result.failed:
            failed[name] = result.failed
    assert not failed, f"docstring examples failed (the doctest output above): {failed}"
    assert attempted >= check.MIN_DOCTESTS


def test_readme_fragment_marker_is_read(tmp_path):
    check = _install_check()
    text = (
        "# t\n\n## A\n\n<!-- fragment -->\n\n```python\nundefined_name\n```\n\n"
        "## B\n\n```python\nprint(1)\n```\n\nIt prints:\n\n```text\n1\n```\n"
    )
    blocks = check.readme_blocks(text)
    assert [(b.name, b.fragment, b.prints) for b in blocks] == [
        ("A #1", True, None),
        ("B #1", False, "1\n"),
    ]


def test_check_command_of_the_docs_runs_as_written(tmp_path):
    # docs/howto/check_loss_gradient.md's command line, on the README's quick-start op.
    check = _install_check()
    quick = check.readme_blocks((ROOT / "README.md").read_text())[0].code
    (tmp_path / "my_module.py").write_text(quick)
    page = (ROOT / "docs" / "howto" / "check_loss_gradient.md").read_text()
    command = re.search(r"```sh\n(python -m customop\.check .*?)\n```", page, re.S).group(1)
    argv = re.sub(r"\[.*?\]", "", command.replace("\\\n", " ")).split()[1:]
    out = fresh.run(
        [sys.executable, *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "check_grad 'my_module.my_softmax': passed" in out.stdout
    assert "skipped: integer input, not differentiable" in out.stdout


def test_demo_loss_goes_down():
    sys.path.insert(0, str(ROOT / "notebooks"))
    try:
        import demo
    finally:
        sys.path.pop(0)
    first, last, accuracy = demo.main(steps=150)
    assert last < 0.5 * first
    assert accuracy > 0.8


def test_make_targets_set_up_the_venv_and_lint():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo: \$\(STAMP\)", makefile, re.M)
    assert re.search(r"^test: lint", makefile, re.M)
    assert "ruff check" in makefile and "-m venv" in makefile
    pins = (ROOT / "requirements.txt").read_text()
    assert "mxnet==1.9.1" in pins and "numpy==1.23.5" in pins
    ci = (ROOT / ".ci" / "run").read_text()
    assert "ruff check ." in ci and "exec .venv/bin/nox" in ci
    assert "grep -E '^(ruff|nox|uv)==' requirements-dev.txt" in ci  # the same pins as make
    noxfile = (ROOT / "noxfile.py").read_text()
    assert 'PYTHONS = ["3.8", "3.9", "3.10", "3.11"]' in noxfile
    assert "requirements-dev.txt" in noxfile and "PYENV_ROOT" in noxfile
    dev = (ROOT / "requirements-dev.txt").read_text()
    assert re.search(r"^nox==\S+", dev, re.M)


def test_public_api_is_type_hinted():
    from customop.check import check_grad

    for fn in (customop.customop, CustomOperator.def_grad, CustomOperator.__init__, check_grad):
        sig = inspect.signature(fn)
        params = [p for p in sig.parameters.values() if p.name != "self"]
        assert all(p.annotation is not inspect.Parameter.empty for p in params), fn
        assert sig.return_annotation is not inspect.Signature.empty or fn is CustomOperator.__init__


# Smoke runs of the benchmark scripts at their smallest sizes: the scripts stay runnable and
# check their variants; their numbers live in BENCHMARKS.md.  Each is a process (or several:
# fork_cost.py and bind_cost.py start one per row), two of them at a time.  Marked
# benchmarks: CI's full suites and `make soak` run them, `make test` does not (70 s of CPU,
# an eighth of it: docs/development.md, "The suite's time").
SMOKE = {
    "overhead.py": ["--sizes", "10", "--repeats", "4", "--quick"],
    "losses.py": ["--quick", "--turns", "1", "--ops", "smooth_l1,wing_loss"],
    "detection.py": ["--repeat", "1", "--images", "1", "--anchors", "2000"],
    "residuals.py": ["--quick"],
    "fork_cost.py": ["--forks", "3", "--rounds", "1"],
    "bind_cost.py": ["--binds", "1", "--rounds", "1"],
    "first_steps.py": ["--quick"],
    "op_counts.py": [],
    "aux_rules.py": ["--steps", "1", "--markdown"],
    "native_graphs.py": ["--repeat", "4", "--images", "1", "--anchors", "200", "--quick"],
    "imperative.py": ["--quick"],
    "transposed_forms.py": ["--turns", "2", "--sizes", "10", "--markdown"],
}


@pytest.fixture(scope="module")
def benchmark_runs(request):
    def run(script):
        return lambda: fresh.run(
            [sys.executable, f"benchmarks/{script}", *SMOKE[script]],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=240,
        )

    # the slowest first: they finish while the quick ones run on the other core
    scripts = sorted(
        concurrently.selected(request, "script"),
        key=lambda s: s not in ("native_graphs.py", "fork_cost.py", "bind_cost.py"),
    )
    runs = concurrently.run_selected({script: run(script) for script in scripts})
    yield runs
    runs.wait()


@pytest.mark.benchmarks
@pytest.mark.parametrize("script", ["overhead.py"])
def test_benchmark_runs_and_checks_its_variants(script, benchmark_runs):
    # `make bench`'s script: every variant is first checked against native, then timed
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^bench: \$\(STAMP\)\n\t.*benchmarks/overhead.py", makefile, re.M)
    proc = benchmark_runs[script]
    assert proc.returncode == 0, proc.stderr
    assert "every variant matches native" in proc.stderr
    variants = {line.split()[3] for line in proc.stdout.splitlines() if line.startswith("x*x ")}
    assert {
        "native",
        "handwritten",
        "ag.Function",
        "hips",
        "mx/default",
        "mx/direct",
        "mx/function",
        "mx/custom",
        "mx/nd.Custom",
        "np/default",
        "np/custom",
    } <= variants
    assert "allocator: MALLOC_MMAP_THRESHOLD_" in proc.stdout and "Targets:" in proc.stdout


@pytest.mark.benchmarks
@pytest.mark.parametrize(
    "script, expect",
    [
        ("losses.py", "wing_loss"),
        ("detection.py", "ohem_sampler"),
        ("residuals.py", "arc_margin"),
        ("fork_cost.py", "fork patch"),
        ("bind_cost.py", "binds patch"),
        ("bind_cost.py", "new box count"),
        ("first_steps.py", "epoch of new box counts"),
        ("op_counts.py", "face embedding, native"),
        ("imperative.py", "graph path (default)"),
        ("imperative.py", "not recorded: one forward per call"),
        ("aux_rules.py", "| 'local' |"),
        ("native_graphs.py", "exported (all inlined)"),
        ("transposed_forms.py", "| MXNet's square(x): backward g * (2 * x) | yes |"),
    ],
)
def test_operator_benchmarks_run(script, expect, benchmark_runs):
    proc = benchmark_runs[script]
    assert proc.returncode == 0, proc.stderr
    assert expect in proc.stdout
