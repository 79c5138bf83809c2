"""What HIPS autograd traces in a 'numpy'-mode forward, per autograd version (docs/guide.md,
"Gradients"): 1.9.1 (Python >= 3.10) also traces plain NumPy; 1.7.0 / 1.8.0 (3.8 / 3.9) only
``autograd.numpy``, and a plain ``numpy.sum`` is an error that says what to write instead."""

from importlib.metadata import version

import autograd.numpy as anp
import mxnet as mx
import numpy
import pytest

from customop import customop

AUTOGRAD = tuple(int(p) for p in version("autograd").split(".")[:2])
WANT = [[2.0, 4.0], [6.0, -2.0]]


@customop("numpy")
def anp_square_sum(x):
    return anp.sum(x * x, axis=1)


@customop("numpy")
def plain_square_sum(x):
    return numpy.sum(x * x, axis=1)


def gradient(op):
    x = mx.nd.array([[1.0, 2.0], [3.0, -1.0]])
    x.attach_grad()
    with mx.autograd.record():
        y = op(x)
    y.backward()
    return x.grad.asnumpy()


def test_autograd_numpy_traces_on_every_version():
    numpy.testing.assert_allclose(gradient(anp_square_sum), WANT)


def test_plain_numpy_traces_from_autograd_1_9_and_names_the_fix_before():
    if AUTOGRAD >= (1, 9):
        numpy.testing.assert_allclose(gradient(plain_square_sum), WANT)
    else:
        with pytest.raises(TypeError, match=r"grad_np_sum.*autograd\.numpy"):
            gradient(plain_square_sum)
        mx.nd.waitall()
