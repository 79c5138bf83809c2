"""``numpy.tile`` as an operator: repeat an array along each axis, gradients summed back."""

import mxnet as mx
import numpy as np

from customop import customop

from . import _checks

__all__ = ["tile"]


def _layout(shape, reps):
    """(reps, data shape), both padded with leading ones to one length, as numpy.tile does."""
    if isinstance(reps, int):
        reps = (reps,)
    if not isinstance(reps, (tuple, list)) or not all(
        isinstance(r, int) and not isinstance(r, bool) and r >= 1 for r in reps
    ):
        raise _checks.fail(
            "tile",
            "reps",
            f"must be an int or a tuple of ints >= 1, got {reps!r}",
            TypeError if not _ints(reps) else ValueError,
        )
    n = max(len(reps), len(shape))
    reps, shape = (1,) * (n - len(reps)) + tuple(reps), (1,) * (n - len(shape)) + tuple(shape)
    size = int(np.prod([r * s for r, s in zip(reps, shape)], dtype=object))
    if size > _MAX_SIZE:
        raise _checks.fail(
            "tile",
            "reps",
            f"{reps!r} would make an output of {size:,} "
            f"elements from data of shape {tuple(shape)}; MXNet 1.9.1's arrays "
            f"hold at most {_MAX_SIZE:,} (2**31 - 1)",
        )
    return reps, shape


_MAX_SIZE = 2**31 - 1  # elements in one array of MXNet 1.9.1's pip builds (int32 indexing)


def _ints(reps):
    return isinstance(reps, (tuple, list)) and all(
        isinstance(r, int) and not isinstance(r, bool) for r in reps
    )


def _interleaved(shape, reps):
    # The tiled array viewed as (r0, s0, r1, s1, ...): summing the r axes undoes the tiling.
    return tuple(d for pair in zip(reps, shape) for d in pair), tuple(range(0, 2 * len(shape), 2))


@customop("mxnet", name="ops.tile")
def tile(data, *, reps):
    r"""Repeat ``data`` ``reps[k]`` times along axis ``k`` (``numpy.tile`` semantics).

    .. math:: \mathrm{out}[i_0 + s_0 j_0, \ldots] = \mathrm{data}[i_0, \ldots]

    When ``reps`` is shorter than ``data.ndim`` it is padded with leading ones; when it
    is longer, ``data`` is promoted with leading axes of length 1.  The gradient sums the
    head gradient over every copy.  Equal to ``mx.nd.tile(data, reps=reps)``.

    Parameters
    ----------
    data : array, any shape
    reps : int or tuple of ints >= 1
        Keyword.

    Notes
    -----
    Output shape: ``tuple(r * s for r, s in zip(reps, data.shape))`` after the padding.

    Example:
        >>> import mxnet as mx
        >>> from customop import ops
        >>> ops.tile(mx.nd.array([[1, 2]]), reps=(2, 2)).asnumpy()
        array([[1., 2., 1., 2.],
               [1., 2., 1., 2.]], dtype=float32)
    """
    reps, _ = _layout(data.shape, reps)
    return mx.nd.tile(data, reps=reps)


@tile.twin("numpy")
def _tile_numpy(data, *, reps):
    reps, _ = _layout(data.shape, reps)
    return np.tile(data, reps)


def _grad(ans, data, *, reps):  # the tiled array viewed interleaved, the copies summed
    reps, shape = _layout(data.shape, reps)
    view, axes = _interleaved(shape, reps)
    return lambda g: g.reshape(view).sum(axis=axes).reshape(data.shape)


# The 'mxnet' op's gradient is MXNet's own (tile's backward sums the copies the same way):
# training graphs then run mx.nd.tile forward and backward, at any input shape.
tile.numpy.def_grad(_grad)
