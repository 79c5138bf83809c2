"""Writes a saved port and what MXNet computes with it, for ``load_without_mxnet.py``.

``python tests/port/save_example.py DIR``: ``DIR/focal.port.json`` (``ops.focal_loss``
saved at (2, 100, 5), ``gamma=1.5``), ``DIR/inputs.npz`` (inputs at another batch size and
anchor count, a head gradient) and ``DIR/expected.npz`` (MXNet's output and gradient).
The nox session ``port`` runs it, then the loader in a venv without MXNet.
"""

import os
import sys

import numpy as np

import customop
from customop import ops

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
from tests.port.cases import mxnet_reference  # noqa: E402


def _focal(r, n, a, c=5):
    return [r.randn(n, a, c).astype("f"), r.randint(-1, c + 1, (n, a)).astype("f")]


def main(out):
    customop.save_port(
        ops.focal_loss,
        os.path.join(out, "focal.port.json"),
        *_focal(np.random.RandomState(0), 2, 100),
        gamma=1.5,
    )
    inputs = _focal(np.random.RandomState(1), 3, 64)
    outs, heads, grads = mxnet_reference(ops.focal_loss, inputs, {"gamma": 1.5}, [0])
    np.savez(
        os.path.join(out, "inputs.npz"),
        x0=inputs[0],
        x1=inputs[1],
        head=heads[0],
        grad=np.array([0]),
    )
    np.savez(os.path.join(out, "expected.npz"), out=outs[0], grad0=grads[0])
    print("saved", os.path.join(out, "focal.port.json"))


if __name__ == "__main__":
    main(sys.argv[1])
