"""Issue 53: loading a model never runs code the user did not choose.

The attack: a downloaded model folder holds ``model-symbol.json``, whose ``Custom`` node
says ``op_type: "evil_helpers.sq"``, beside ``evil_helpers.py``, which writes a marker file
when imported; the folder is on ``sys.path`` (a notebook or ``python -c`` opened there).
Each loader must refuse it with :class:`customop.UntrustedModuleError` before anything is
imported, and load it when the caller chose the module (imported it, ``modules=``, or
``trust_op_modules=True``).
"""

import json
import os
import sys
import uuid
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest

import customop
from customop import ops
from tests import fresh
from tests.customop import twinops

ROOT = Path(__file__).resolve().parents[2]

HELPER = """
from pathlib import Path
Path(__file__).with_name("ran").write_text("imported")  # the code a model file smuggles in
from customop import customop


@customop("numpy")
def sq(x):
    return x * x
"""


def _graph(op_type: str) -> str:
    """A symbol file's JSON: data -> Custom(op_type), as MXNet 1.9.1 writes it."""
    return json.dumps(
        {
            "nodes": [
                {"op": "null", "name": "data", "inputs": []},
                {
                    "op": "Custom",
                    "name": "sq0",
                    "attrs": {"op_type": op_type},
                    "inputs": [[0, 0, 0]],
                },
            ],
            "arg_nodes": [0],
            "node_row_ptr": [0, 1, 2],
            "heads": [[1, 0, 0]],
            "attrs": {"mxnet_version": ["int", 10901]},
        }
    )


def _folder(folder: Path, module: str) -> Path:
    """A model folder: model-symbol.json naming '<module>.sq', its params, and <module>.py."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model-symbol.json").write_text(_graph(f"{module}.sq"))
    # load_checkpoint's params (MXNet's loader needs a dict: one array nothing reads)
    mx.nd.save(str(folder / "model-0000.params"), {"arg:unused": mx.nd.zeros(1)})
    (folder / f"{module}.py").write_text(HELPER)
    return folder


def _load(loader: str, folder: Path, **options):
    if loader == "imports":
        return customop.imports(str(folder / "model-symbol.json"), ["data"], **options)
    sym, args, _ = customop.load_checkpoint(str(folder / "model"), 0, **options)
    return sym


def _squares(loaded) -> np.ndarray:
    x = np.array([[1.0, -2.0, 3.0]], dtype=np.float32)
    if isinstance(loaded, mx.sym.Symbol):
        exe = loaded.bind(mx.cpu(), {"data": mx.nd.array(x)})
        got = exe.forward()[0].asnumpy()
    else:
        got = loaded(mx.nd.array(x)).asnumpy()
    np.testing.assert_array_equal(got, x.astype(np.float64) ** 2)
    return got


@pytest.fixture
def on_path(tmp_path, monkeypatch):
    """tmp_path is the current directory and on sys.path, as a notebook opened there has it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:  # only what a failing test let in
        if name.startswith(("evil_helpers", "chosen_")):
            del sys.modules[name]


LOADERS = ["imports", "load_checkpoint"]


@pytest.mark.parametrize("loader", LOADERS)
def test_a_model_file_does_not_choose_a_module_to_import(loader, on_path):
    folder = _folder(on_path, "evil_helpers")
    with pytest.raises(customop.UntrustedModuleError) as caught:
        _load(loader, folder)
    assert not (folder / "ran").exists(), "evil_helpers.py ran"
    assert "evil_helpers" not in sys.modules
    message = str(caught.value)
    assert f"customop.{loader}: " in message
    assert "op type 'evil_helpers.sq': module 'evil_helpers' " in message
    assert str(folder / "evil_helpers.py") in message  # found without running it
    assert "was NOT imported" in message
    assert f"pass modules=['evil_helpers'] to customop.{loader}" in message
    assert "trust_op_modules=True" in message
    assert caught.value.name == "evil_helpers"
    assert isinstance(caught.value, ImportError)


@pytest.mark.parametrize("loader", LOADERS)
def test_a_module_the_caller_names_is_imported(loader, on_path):
    name = f"chosen_by_name_{uuid.uuid4().hex[:8]}"  # a module and op type new to the process
    folder = _folder(on_path, name)
    _squares(_load(loader, folder, modules=[name]))
    assert (folder / "ran").exists() and name in sys.modules


def test_one_name_or_a_module_object_may_be_passed(on_path):
    folder = _folder(on_path, "chosen_one_name")
    _squares(_load("imports", folder, modules="chosen_one_name"))
    folder = _folder(on_path, "chosen_object")
    import chosen_object  # the caller imports it: then the model names an imported module

    _squares(_load("imports", folder, modules=[chosen_object]))
    _squares(_load("imports", folder))


@pytest.mark.parametrize("loader", LOADERS)
def test_trust_op_modules_imports_what_the_file_names(loader, on_path):
    name = f"chosen_by_trust_{uuid.uuid4().hex[:8]}"
    folder = _folder(on_path, name)
    _squares(_load(loader, folder, trust_op_modules=True))
    assert (folder / "ran").exists() and name in sys.modules


def test_an_imported_module_and_the_operator_library_need_nothing(tmp_path):
    class Net(mx.gluon.HybridBlock):
        def hybrid_forward(self, F, x):
            return ops.tile(twinops.scaled_square(x, scale=2.0), reps=(1, 2))

    net = Net()
    net.hybridize()
    x = mx.nd.array([[1.0, 2.0]])
    net(x)
    net.export(str(tmp_path / "m"))
    types = {
        n["attrs"]["op_type"]
        for n in json.loads((tmp_path / "m-symbol.json").read_text())["nodes"]
        if n["op"] == "Custom"
    }
    assert types == {"ops.tile", "tests.customop.twinops.scaled_square"}
    want = np.tile(2 * np.array([[1.0, 2.0]]) ** 2, (1, 2))
    got = customop.imports(str(tmp_path / "m-symbol.json"), ["data"])(x).asnumpy()
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("trust", [False, True])
def test_an_op_type_that_names_no_module_imports_nothing(trust, on_path):
    folder = _folder(on_path, "evil_helpers")
    for op_type in ("..evil_helpers.sq", f"{folder}/evil_helpers.sq", "/evil_helpers.sq"):
        (folder / "model-symbol.json").write_text(_graph(op_type))
        with pytest.raises(RuntimeError, match="no (importable|imported or found) module"):
            _load("imports", folder, trust_op_modules=trust)
    assert not (folder / "ran").exists()


def test_modules_must_be_names_or_modules(tmp_path):
    folder = _folder(tmp_path, "evil_helpers")
    for bad in (3, [None], [""], [b"evil_helpers"]):
        with pytest.raises(TypeError, match="customop.imports: modules must"):
            _load("imports", folder, modules=bad)
    assert not (folder / "ran").exists()


# The issue's steps as a user takes them: `python -c` in the unpacked folder (its directory
# first on sys.path), customop and its library not imported yet.  Beside the model: an
# ops.py, which a library op type ('ops.<name>') must not reach either.
ATTACK = """
import sys, json
import mxnet as mx, numpy as np
import customop
assert "customop.ops" not in sys.modules and "evil_helpers" not in sys.modules
seen = {}
for name, call in [
        ("imports", lambda: customop.imports("model-symbol.json", "data")),
        ("load_checkpoint", lambda: customop.load_checkpoint("model", 0)),
        ("retired", lambda: customop.imports("retired-symbol.json", ["data"])),
        ("package", lambda: customop.imports("opdefs-symbol.json", ["data"])),
        ("package chosen", lambda: customop.imports("opdefs-symbol.json", ["data"],
                                                  modules=["tests.customop.opdefs"]))]:
    try:
        loaded = call()
        seen[name] = loaded(mx.nd.array([[3.0]])).asnumpy().tolist()
    except Exception as exc:
        seen[name] = [type(exc).__name__, str(exc)]
net = customop.imports("tile-symbol.json", ["data"])  # the library's ops.tile
seen["tile"] = net(mx.nd.array([[1.0, 2.0]])).asnumpy().tolist()
library = sys.modules["customop.ops"]
seen["modules"] = sorted(m for m in ("evil_helpers", "customop.ops") if m in sys.modules)
seen["ops"] = sys.modules.get("ops", library) is library
print(json.dumps(seen))
"""

LOCAL_OPS = """
from pathlib import Path
Path(__file__).with_name("ops_ran").write_text("imported")
"""


def test_the_issues_steps_in_a_fresh_process_run_no_code_from_the_folder(tmp_path):
    folder = _folder(tmp_path, "evil_helpers")
    (folder / "ops.py").write_text(LOCAL_OPS)
    (folder / "retired-symbol.json").write_text(_graph("ops.topk.both"))
    (folder / "opdefs-symbol.json").write_text(_graph("tests.customop.opdefs.square_np"))
    x = mx.sym.var("data")
    ops.tile(x, reps=(1, 2)).save(str(folder / "tile-symbol.json"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # the checkout, for tests.customop.opdefs
    run = fresh.run(
        [sys.executable, "-c", ATTACK],
        cwd=str(folder),
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert not (folder / "ran").exists() and not (folder / "ops_ran").exists()
    for loader in ("imports", "load_checkpoint"):
        kind, message = seen[loader]
        assert kind == "UntrustedModuleError"
        assert f"customop.{loader}: " in message and "'evil_helpers.sq'" in message
    kind, message = seen["retired"]  # the library's own message; the local ops.py unread
    assert kind == "RuntimeError" and "'ops.topk.both', which the operator library" in message
    kind, message = seen["package"]  # found inside the package 'tests', without importing it
    assert kind == "UntrustedModuleError"
    assert "module 'tests.customop.opdefs' (" in message, message
    assert seen["package chosen"] == [[9.0]]
    np.testing.assert_array_equal(seen["tile"], [[1.0, 2.0, 1.0, 2.0]])
    assert seen["modules"] == ["customop.ops"] and seen["ops"]
