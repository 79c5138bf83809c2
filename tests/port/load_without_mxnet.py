"""Loads a saved port in a process without MXNet and writes what it computes.

``python load_without_mxnet.py PORT INPUTS OUT [EXPECTED] [--block-mxnet] [--numpy2]``:
``INPUTS`` an ``.npz`` (``x0``, ``x1``, ... the op's inputs, ``head`` the head gradient,
``grad`` the indices of the inputs to differentiate); ``OUT`` an ``.npz`` with each
framework's output and gradients; ``EXPECTED`` (from ``save_example.py``: MXNet's ``out``
and ``grad<i>``) is compared with both.  ``--block-mxnet`` makes ``import mxnet`` fail (a
venv that has it); ``--numpy2`` requires NumPy 2.  The nox session ``port`` runs it in a
venv without MXNet and with NumPy 2.  Arrays are read with ``allow_pickle=False``.
"""

import sys

if "--block-mxnet" in sys.argv:

    class _NoMXNet:
        def find_spec(self, name, path=None, target=None):
            if name == "mxnet" or name.startswith("mxnet."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    sys.meta_path.insert(0, _NoMXNet())

import numpy as np  # noqa: E402

from customop.port import load_port  # noqa: E402


def main(port_path, inputs_path, out_path, expected_path=None):
    if "--numpy2" in sys.argv:
        assert int(np.__version__.split(".")[0]) >= 2, f"numpy {np.__version__}, not 2"
    data = np.load(inputs_path, allow_pickle=False)
    xs = [data[f"x{i}"] for i in range(sum(k.startswith("x") for k in data.files))]
    head, grads = data["head"], [int(i) for i in data["grad"]]
    found = {}

    import torch

    port = load_port(port_path, "torch")
    ts = [torch.tensor(x, requires_grad=i in grads) for i, x in enumerate(xs)]
    out = port(*ts)
    (out * torch.tensor(head)).sum().backward()
    found["torch_out"] = out.detach().numpy()
    for i in grads:
        found[f"torch_grad{i}"] = ts[i].grad.numpy()

    import jax
    import jax.numpy as jnp

    port = load_port(port_path, "jax")
    js = [jnp.asarray(x) for x in xs]
    found["jax_out"] = np.asarray(jax.jit(port)(*js))
    g = jax.grad(lambda *a: (port(*a) * head).sum(), argnums=tuple(grads))(*js)
    for i, gi in zip(grads, g):
        found[f"jax_grad{i}"] = np.asarray(gi)
    assert "mxnet" not in sys.modules, "the port loader imported mxnet"
    np.savez(out_path, numpy_version=np.array(np.__version__), **found)
    if expected_path:
        want = np.load(expected_path, allow_pickle=False)
        for fw in ("torch", "jax"):
            np.testing.assert_allclose(found[f"{fw}_out"], want["out"], rtol=2e-5, atol=2e-6)
            for i in grads:
                np.testing.assert_allclose(
                    found[f"{fw}_grad{i}"], want[f"grad{i}"], rtol=2e-5, atol=2e-6
                )
        print("torch and jax agree with MXNet's output and gradient")
    print("loaded without mxnet, numpy", np.__version__)


if __name__ == "__main__":
    main(*[a for a in sys.argv[1:] if not a.startswith("--")])
