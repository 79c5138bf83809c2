"""customop.save_port / load_port: one JSON file, loaded where MXNet is not installed."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="the port tests need torch (pip install 'customop[port]')"
)
jax = pytest.importorskip("jax", reason="the port tests need jax (pip install 'customop[port]')")

import customop  # noqa: E402
from customop import ops  # noqa: E402

from .cases import R, mxnet_reference  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def _focal(r, n, a, c=5):
    return [r.randn(n, a, c).astype("f"), r.randint(-1, c + 1, (n, a)).astype("f")]


@pytest.fixture(scope="module")
def focal_port(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("port") / "focal.port.json")
    customop.save_port(ops.focal_loss, path, *_focal(R(0), 2, 100), gamma=1.5)
    return path


def test_port_file_is_json_data(focal_port):
    with open(focal_port) as f:
        data = json.load(f)
    assert data["format"] == "customop-port" and data["op_type"] == "ops.focal_loss"
    assert data["params"]["gamma"] == 1.5 and data["inputs"] == ["pred", "label"]


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_loaded_port_serves_another_batch_and_box_count(focal_port, framework):
    inputs = _focal(R(1), 3, 40)  # saved at (2, 100, 5)
    outs, heads, want = mxnet_reference(ops.focal_loss, inputs, {"gamma": 1.5}, [0])
    port = customop.load_port(focal_port, framework)
    if framework == "torch":
        x = torch.tensor(inputs[0], requires_grad=True)
        out = port(x, torch.tensor(inputs[1]))
        (out * torch.tensor(heads[0])).sum().backward()
        got, grad = out.detach().numpy(), x.grad.numpy()
    else:
        jnp = jax.numpy
        got = np.asarray(port(*[jnp.asarray(a) for a in inputs]))
        grad = np.asarray(
            jax.grad(lambda p: (port(p, jnp.asarray(inputs[1])) * heads[0]).sum())(
                jnp.asarray(inputs[0])
            )
        )
    np.testing.assert_allclose(got, outs[0], rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(grad, want[0], rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_shapes_outside_the_family_name_the_op_and_the_saved_shapes(focal_port, framework):
    port = customop.load_port(focal_port, framework)
    pred, label = _focal(R(2), 2, 100, c=4)  # another class count: not of the family
    lib = torch.tensor if framework == "torch" else jax.numpy.asarray
    with pytest.raises(ValueError, match=r"'ops.focal_loss'.*pred \(2, 100, 5\) float32"):
        port(lib(pred), lib(label))


def test_saving_a_numpy_mode_op_says_why(tmp_path):
    with pytest.raises(customop.PortError, match="ops.focal_loss.numpy.*'numpy'-mode"):
        customop.save_port(ops.focal_loss.numpy, str(tmp_path / "p.json"), *_focal(R(0), 2, 4))


def test_saving_an_op_that_does_not_trace_says_why(tmp_path):
    @customop.customop("mxnet", name="port_tests.reads_back")
    def reads_back(x):
        return x * float(x.sum().asscalar())  # a value read back: no graph

    with pytest.raises(customop.PortError, match="port_tests.reads_back.*does not trace"):
        customop.save_port(reads_back, str(tmp_path / "p.json"), np.ones((2, 3), "f"))


def test_a_file_that_is_not_a_port_is_refused_before_anything_runs(tmp_path, focal_port):
    bad = tmp_path / "bad.json"
    bad.write_bytes(b"\x80\x04\x95 pickle data")
    with pytest.raises(customop.PortError, match="not JSON"):
        customop.load_port(str(bad), "torch")
    with open(focal_port) as f:
        data = json.load(f)
    data["forward"]["nodes"][0]["op"] = "__import__"
    bad.write_text(json.dumps(data))
    port = customop.load_port(str(bad), "jax")
    with pytest.raises(customop.PortError, match="'__import__'.*no translation"):
        port(*[jax.numpy.asarray(a) for a in _focal(R(0), 2, 100)])
    data["inputs"] = ["pred); import os; (x"]
    bad.write_text(json.dumps(data))
    with pytest.raises(customop.PortError, match="not an identifier"):
        customop.load_port(str(bad), "torch")


def test_loads_in_a_process_that_cannot_import_mxnet(focal_port, tmp_path):
    inputs = _focal(R(3), 4, 30)
    outs, heads, want = mxnet_reference(ops.focal_loss, inputs, {"gamma": 1.5}, [0])
    np.savez(tmp_path / "in.npz", x0=inputs[0], x1=inputs[1], head=heads[0], grad=np.array([0]))
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(HERE, "load_without_mxnet.py"),
            focal_port,
            str(tmp_path / "in.npz"),
            str(tmp_path / "out.npz"),
            "--block-mxnet",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = np.load(tmp_path / "out.npz", allow_pickle=False)
    for fw in ("torch", "jax"):
        np.testing.assert_allclose(found[f"{fw}_out"], outs[0], rtol=2e-5, atol=2e-6)
        np.testing.assert_allclose(found[f"{fw}_grad0"], want[0], rtol=2e-5, atol=2e-6)
