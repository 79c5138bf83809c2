"""The suite's own guards: time limits that turn a hang into a named failure, the selections
CI runs on each Python, and optional extras that never break an import."""

import ast
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests import conftest

ROOT = Path(__file__).resolve().parents[1]


def _noxfile() -> ast.Module:
    return ast.parse((ROOT / "noxfile.py").read_text(encoding="utf-8"))


def _constant(name: str):
    for node in _noxfile().body:
        if isinstance(node, ast.Assign) and any(
            getattr(t, "id", None) == name for t in node.targets
        ):
            return ast.literal_eval(node.value)
    raise AssertionError(f"noxfile.py has no {name}")


def test_a_hung_test_fails_by_name_and_the_others_still_run(tmp_path):
    # pytest.ini's time limit under two xdist workers, as make test and CI run: the hung
    # test fails by name, the others still run, and the run ends.
    ini = (ROOT / "pytest.ini").read_text(encoding="utf-8")
    ini = re.sub(r"^timeout = \d+$", "timeout = 3", ini, flags=re.M)
    (tmp_path / "pytest.ini").write_text(
        re.sub(r"^(testpaths|pythonpath) = .*$", "", ini, flags=re.M)
    )
    (tmp_path / "test_hang.py").write_text(
        textwrap.dedent("""
        import threading

        def test_hangs():
            threading.Event().wait()

        def test_passes():
            assert True
        """)
    )
    start = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-n",
            "2",
            "--dist",
            "loadfile",
            "test_hang.py",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "Timeout" in out and "test_hang.py::test_hangs" in out, out
    assert re.search(r"1 failed, 1 passed", out), out
    assert time.monotonic() - start < 60


def test_pytest_ini_gives_every_test_a_time_limit_well_inside_ci():
    ini = (ROOT / "pytest.ini").read_text(encoding="utf-8")
    limit = int(re.search(r"^timeout = (\d+)$", ini, re.M).group(1))
    assert 60 <= limit <= 15 * 60
    assert re.search(r"^timeout_method = signal$", ini, re.M)
    stacks = int(re.search(r"^faulthandler_timeout = (\d+)$", ini, re.M).group(1))
    assert limit < stacks < _constant("LIMIT_MIN")["suite"] * 60


def test_every_nox_command_runs_under_a_time_limit():
    # Sessions run commands only through _run (coreutils `timeout`), never session.run or
    # session.install directly; every limit is well inside CI's 90 minutes.
    calls = {}
    for node in ast.walk(_noxfile()):
        if isinstance(node, ast.FunctionDef):
            for inner in ast.walk(node):
                if (
                    isinstance(inner, ast.Call)
                    and isinstance(inner.func, ast.Attribute)
                    and getattr(inner.func.value, "id", None) == "session"
                    and inner.func.attr in ("run", "install", "run_install")
                ):
                    calls.setdefault(node.name, []).append(inner.func.attr)
    assert calls == {"_run": ["run"]}, calls
    source = (ROOT / "noxfile.py").read_text(encoding="utf-8")
    assert re.search(r'"timeout",\s*"--kill-after=30"', source)
    limits = _constant("LIMIT_MIN")
    assert all(0 < minutes <= 20 for minutes in limits.values()), limits


def test_the_selections_name_real_tests():
    for entry in _constant("VERSION_SUITE") + conftest.SLOWEST_FIRST:
        path, _, name = entry.partition("::")
        assert (ROOT / path).is_file(), entry
        if name:
            assert re.search(rf"^def {re.escape(name)}\(", (ROOT / path).read_text(), re.M), entry
    assert _constant("FULL_SUITE_PYTHONS") == ["3.8", "3.11"]


def test_cis_streams_run_every_session_once():
    # .ci/run runs noxfile.STREAMS at once: together they select the default sessions (a
    # function's name selects all its Pythons), none twice; the full suites share a stream.
    pythons = _constant("PYTHONS")

    def expand(name):
        function, _, python = name.partition("-")
        return {(function, p) for p in ([python] if python else pythons)}

    selected = [
        s for sessions in _constant("STREAMS").values() for n in sessions for s in expand(n)
    ]
    wanted = {s for n in ("tests", "install") for s in expand(n)}
    assert len(set(selected)) == len(selected), selected
    assert {s for s in selected if s[0] in ("tests", "install")} == wanted
    assert {f for f, _ in selected} == set(_nox_options_sessions())
    assert {("tests", "3.8"), ("tests", "3.11")} <= {
        s for n in _constant("STREAMS")["suites"] for s in expand(n)
    }
    script = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "noxfile.STREAMS" in script and 'failed+=("${names[$i]}")' in script
    # the sessions building the checkout (-e ., .[extras]) in both streams take turns
    assert '("flock", str(BUILD_LOCK), *cmd)' in (ROOT / "noxfile.py").read_text(encoding="utf-8")


def _nox_options_sessions() -> list:
    for node in _noxfile().body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "attr", None) == "sessions":
            return ast.literal_eval(node.value)
    raise AssertionError("noxfile.py sets no nox.options.sessions")


def test_every_module_imports_without_the_optional_extras(tmp_path):
    # As after `pip install '.[cpu]'`: onnx and the notebooks' tools missing (CI's
    # install_minimal session checks the same from a real minimal install).
    code = textwrap.dedent("""
        import importlib, pkgutil, sys

        OPTIONAL = ("onnx", "onnxruntime", "matplotlib", "sklearn", "nbclient", "nbformat")
        PORT = ("torch", "torchvision", "jax", "jaxlib")  # the `port` extra

        class Missing:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in OPTIONAL + PORT:
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)

        sys.meta_path.insert(0, Missing())
        import mxnet as mx
        import customop
        from customop import ops

        skip = {"customop.check.__main__", "customop.distributed.worker_site.sitecustomize"}
        names, frameworks = [], []
        for package in (customop, ops):
            for m in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
                if m.name in skip:
                    continue
                try:
                    importlib.import_module(m.name)
                except ModuleNotFoundError as exc:  # the port's torch and jax modules only
                    if not (m.name.startswith("customop.port.") and exc.name in PORT):
                        raise
                    frameworks.append(m.name)
                    continue
                names.append(m.name)
        assert sorted(frameworks) == ["customop.port.jax_port", "customop.port.jax_rules",
                                      "customop.port.torch_port", "customop.port.torch_rules"]
        for fn in (customop.to_torch, customop.to_jax):
            try:
                fn(ops.focal_loss)
            except ImportError as exc:
                print("ImportError:", exc)
        assert "customop.deploy.onnx_rules" in names and "customop.ops.focal_loss" in names, names
        net = mx.gluon.nn.Dense(2, in_units=3)
        net.initialize()
        net.hybridize()
        try:
            customop.to_onnx(customop.export(net, "model", mx.nd.ones((1, 3))), "m.onnx")
        except ImportError as exc:
            print("ImportError:", exc)
        print(len(names), "modules")
        """)
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ImportError: customop.to_onnx needs the 'onnx' package" in proc.stdout, proc.stdout
    assert "customop[onnx]" in proc.stdout
    for name in ("customop.to_torch needs torch", "customop.to_jax needs jax"):
        assert (
            f"ImportError: {name}, which is not installed: pip install 'customop[port]'"
            in proc.stdout
        ), proc.stdout
