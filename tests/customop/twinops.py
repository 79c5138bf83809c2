"""Twins, generators and optional inputs shared by tests (importable by subprocesses)."""

import mxnet as mx
import numpy as np

from customop import customop


@customop("mxnet")
def scaled_square(x, scale=1.0):
    """scale * x**2, elementwise.

    Example:
        >>> scaled_square(mx.nd.array([1, 2]), scale=2.0).asnumpy()
        array([2., 8.], dtype=float32)
    """
    return scale * x * x


@scaled_square.twin("numpy")
def _scaled_square_numpy(x, scale=1.0):
    return scale * x * x


_scaled_square_numpy.def_grad(lambda ans, x, scale=1.0: lambda g: 2 * scale * x * g)


@customop("numpy")
def grid(length=2, depth=3):
    """An arange of length*depth values shaped (length, depth): an op without inputs."""
    return np.arange(length * depth, dtype=np.float32).reshape(length, depth)


@grid.twin("mxnet")
def _grid_nd(length=2, depth=3):
    return mx.nd.arange(length * depth).reshape((length, depth))


@customop("numpy", optional=("weight",))
def weighted_square(x, weight=None, *, scale=1.0):
    """scale * weight * x**2; weight defaults to ones."""
    return scale * x * x * (1.0 if weight is None else weight)


def _weighted_square_dx(ans, x, weight=None, *, scale=1.0):
    return lambda g: 2 * scale * x * g * (1.0 if weight is None else weight)


def _weighted_square_dw(ans, x, weight, *, scale=1.0):
    return lambda g: scale * x * x * g


weighted_square.def_grad(_weighted_square_dx, 0).def_grad(_weighted_square_dw, 1)
