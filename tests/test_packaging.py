"""Issue 20: what `pip install 'customop[cpu]'` gives a user, checked on a built wheel."""

import base64
import hashlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from tests import fresh

ROOT = Path(__file__).resolve().parents[1]


def run(argv, **kwargs):
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, **kwargs)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """customop's wheel, built (isolated, like pip) from a copy of the sources."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for name in ("customop", "ops"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheels")
    proc = run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(src)]
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (path,) = out.glob("customop-*.whl")
    return path


def fake_ops_wheel(directory: Path) -> Path:
    """A distribution that owns a top-level ``ops`` package, as Canonical's Juju ``ops`` does."""
    files = {
        "ops/__init__.py": "CHARM = 'not customop'\n",
        "ops/charm.py": "",
        "ops-2.0.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: ops\nVersion: 2.0.0\n",
        "ops-2.0.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\n"
        "Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{name},sha256={digest.decode()},{len(text.encode())}")
    record.append("ops-2.0.0.dist-info/RECORD,,")
    path = directory / "ops-2.0.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
        zf.writestr("ops-2.0.0.dist-info/RECORD", "\n".join(record) + "\n")
    return path


def test_wheel_metadata_pythons_and_exclusive_mxnet_extras(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        (meta_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = Parser().parsestr(zf.read(meta_name).decode())
    assert meta["Requires-Python"].replace(" ", "") in (">=3.8,<3.12", "<3.12,>=3.8")
    classifiers = meta.get_all("Classifier")
    for minor in (8, 9, 10, 11):
        assert f"Programming Language :: Python :: 3.{minor}" in classifiers
    assert "Programming Language :: Python :: 3.12" not in classifiers
    requires = [r.replace(" ", "").replace("'", '"') for r in meta.get_all("Requires-Dist")]
    assert set(meta.get_all("Provides-Extra")) >= {"cpu", "cu112"}
    assert 'mxnet==1.9.1;extra=="cpu"' in requires
    assert 'mxnet-cu112==1.9.1;extra=="cu112"' in requires
    assert not any(r.startswith("mxnet") and "extra" not in r for r in requires)
    assert "numpy<1.24" in requires
    assert {r.split(";")[0] for r in requires if r.startswith("autograd")} == {
        "autograd>=1.7.0",
        "autograd>=1.8.0",
        "autograd>=1.9.1",
    }
    # The operators install inside customop: a top-level ops/ would be another package's.
    assert "customop/ops/focal_loss.py" in names and "customop/check/cli.py" in names
    assert "customop/distributed/worker_site/sitecustomize.py" in names
    assert not any(n.startswith("ops/") for n in names)


def test_customop_without_mxnet_names_the_extras_and_loads_ports():
    blocker = textwrap.dedent("""
        import sys

        class NoMXNet:
            def find_spec(self, name, path=None, target=None):
                if name == "mxnet" or name.startswith("mxnet."):
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)

        sys.meta_path.insert(0, NoMXNet())
        import customop  # imports: saved ports load without MXNet (customop.load_port)
        print(customop.load_port.__module__)
        try:
            customop.customop
        except ModuleNotFoundError as exc:
            print(type(exc).__name__, exc.name, exc)
        else:
            print("imported")
        """)
    proc = run([sys.executable, "-c", blocker], cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    first, _, rest = proc.stdout.partition("\n")
    assert first == "customop.port.loading", proc.stdout
    assert rest.startswith("ModuleNotFoundError mxnet "), proc.stdout
    assert "customop[cpu]" in proc.stdout and "customop[cu112]" in proc.stdout
    assert "never both" in proc.stdout


USER_SCRIPT = """
import sys
import mxnet as mx
import numpy as np
import customop
from customop import ops

assert ops.__name__ == "customop.ops", ops.__name__
assert "site-packages" in customop.__file__ and "site-packages" in ops.__file__
x = mx.nd.array([[0.5, -2.0, 3.0]]); x.attach_grad()
t = mx.nd.zeros((1, 3))
with mx.autograd.record():
    loss = ops.wing_loss(x, t, w=10.0, epsilon=2.0).sum()
loss.backward()
want = 10.0 / (2.0 + np.abs([0.5, -2.0, 3.0])) * np.sign([0.5, -2.0, 3.0])
np.testing.assert_allclose(x.grad.asnumpy()[0], want, rtol=1e-5)

net = mx.sym.MakeLoss(ops.wing_loss(mx.sym.var("data"), mx.sym.var("target"), name="wl"))
mx.model.save_checkpoint("model", 0, net, {}, {})
try:
    import ops as top
except ImportError:
    top = None
print("top-level ops:", getattr(top, "CHARM", None))
print("mine:", ops.wing_loss.op_type)
"""

LOAD_SCRIPT = """
import mxnet as mx
import customop

sym, args, auxs = customop.load_checkpoint("model", 0)
exe = sym.simple_bind(mx.cpu(), data=(1, 3), target=(1, 3))
exe.arg_dict["data"][:] = mx.nd.array([[0.5, -2.0, 3.0]])
print("loaded:", exe.forward()[0].asnumpy().tolist())
"""


def test_installed_wheel_coexists_with_a_top_level_ops_package(wheel, tmp_path):
    venv = tmp_path / "venv"
    proc = run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    assert proc.returncode == 0, proc.stderr
    python = str(venv / "bin" / "python")
    site = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    # MXNet, NumPy, autograd and pip itself (ensurepip took 4 of the test's 22 s) come from
    # this interpreter's environment (a plain path entry: its .pth files, such as an editable
    # install of this checkout, are not processed); pip run by the venv's Python installs there.
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (Path(site.stdout.strip()) / "test_deps.pth").write_text("\n".join(sorted(deps)) + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    work = tmp_path / "work"
    work.mkdir()

    def pip(*args):
        out = run(
            [python, "-m", "pip", *args, "--quiet", "--disable-pip-version-check"],
            env=env,
            cwd=work,
        )
        assert out.returncode == 0, out.stdout + out.stderr

    def python_run(script):
        out = run([python, "-c", script], env=env, cwd=work)
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout

    # Ours first, then the other package (installing Canonical's after us used to overwrite
    # our ops/__init__.py); then it goes away again (uninstalling it deleted our file).
    pip("install", "--no-deps", "--no-index", str(wheel))
    pip("install", "--no-deps", "--no-index", str(fake_ops_wheel(tmp_path)))
    out = python_run(USER_SCRIPT)
    assert "top-level ops: not customop" in out
    assert "loaded: [" in python_run(LOAD_SCRIPT)  # a saved graph reloads next to it
    pip("uninstall", "--yes", "ops")
    out = python_run(USER_SCRIPT)
    assert "top-level ops: None" in out
    assert "loaded: [" in python_run(LOAD_SCRIPT)


def test_checkout_gives_one_module_object_for_ops_and_customop_ops():
    # With an editable install the repository's ops/ folder is importable under both names.
    from importlib.util import find_spec

    if find_spec("customop.ops") is None:
        pytest.skip("customop.ops needs the editable install (make venv)")
    for first in ("ops", "customop.ops"):
        script = textwrap.dedent(f"""
            import importlib, sys
            importlib.import_module({first!r})
            import ops, customop.ops
            assert customop.ops is ops
            assert sys.modules["customop.ops.focal_loss"] is sys.modules["ops.focal_loss"]
            from customop import ops as again
            assert again is ops
            print(ops.focal_loss.op_type)
            """)
        # (a child of the tests' fork server: its site setup, the editable install's
        # finder included, is a new interpreter's)
        proc = fresh.run(
            [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, proc.stderr


def _pins(lines):
    """{(name, version, python marker)} of ``name==version[; marker]`` requirement lines."""
    out = set()
    for line in lines:
        m = re.match(r"^([A-Za-z0-9_.-]+)\s*==\s*([^;\s]+)\s*(?:;(.*))?$", line.strip())
        if m:
            marker = re.sub(r"\s*and\s*extra\s*==\s*\S+|extra\s*==\s*\S+", "", m.group(3) or "")
            marker = marker.replace(" ", "").replace("'", '"').strip("()")
            out.add((m.group(1).lower().replace("_", "-"), m.group(2), marker))
    return out


def test_notebooks_and_docs_extras_pin_what_the_project_runs(wheel):
    # The extras a user installs are the versions CI runs: the notebooks extra equals
    # requirements-dev.txt's pins for those packages (per Python), the docs extra equals
    # docs/requirements.txt's pins of the five tools.  NumPy stays <1.24 through the core
    # dependency; none of these pins pulls a newer one (pip check in nox's install session).
    with zipfile.ZipFile(wheel) as zf:
        (meta_name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        meta = Parser().parsestr(zf.read(meta_name).decode())
    assert {"notebooks", "docs"} <= set(meta.get_all("Provides-Extra"))
    requires = meta.get_all("Requires-Dist")
    notebooks = _pins(r for r in requires if re.search(r"extra\s*==\s*.notebooks", r))
    docs = _pins(r for r in requires if re.search(r"extra\s*==\s*.docs", r))
    dev = _pins((ROOT / "requirements-dev.txt").read_text().splitlines())
    docs_pins = _pins((ROOT / "docs" / "requirements.txt").read_text().splitlines())
    assert {n for n, _, _ in notebooks} == {
        "matplotlib",
        "scikit-learn",
        "scipy",
        "nbclient",
        "nbformat",
        "ipykernel",
    }
    assert notebooks <= dev, notebooks - dev
    assert {n for n, _, _ in docs} == {
        "sphinx",
        "myst-parser",
        "myst-nb",
        "furo",
        "sphinx-mathjax-offline",
    }
    assert docs <= docs_pins, docs - docs_pins
    shared = {n for n, _, _ in dev} & {n for n, _, _ in docs_pins}
    # make docs installs docs/requirements.txt into the .venv of requirements-dev.txt
    assert {(n, v) for n, v, _ in docs_pins if n in shared} <= {(n, v) for n, v, _ in dev}
