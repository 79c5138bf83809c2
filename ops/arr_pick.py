"""``ops.arr_pick``: dynamic indexing by a 0/1 mask, built on ``topk(do_sort=False)``."""

from __future__ import annotations

import mxnet as mx
import numpy as np

from customop import customop

from . import _checks, _rows
from .topk import _topk_nd


def _check(arr, indicate, num):
    _checks.integer("arr_pick", "num", num)
    _checks.shape_is("arr_pick", "arr", arr.shape, len(arr.shape) == 3, "(B, M, L)")
    b, _, length = arr.shape
    _checks.same_shape(
        "arr_pick",
        "indicate",
        indicate.shape,
        (b, 1, length),
        f"(B, 1, L) for arr of shape {tuple(arr.shape)}",
    )
    _checks.integer("arr_pick", "num", num, 1, length)
    return length


@customop("mxnet", name="ops.arr_pick", no_grad=("indicate",))
def arr_pick(arr, indicate, *, num):
    r"""Pick, per row, the ``num`` entries that ``indicate`` marks, in their original order.

    .. math::

        \mathrm{out}_{b,m,j} = \mathrm{arr}_{b,m,s_{b,j}},\qquad
        s_{b,1} < \dots < s_{b,\mathrm{num}} \text{ the positions where }
        \mathrm{indicate}_{b,0,s} \neq 0

    The positions come from ``ops.topk(..., do_sort=False)`` on a key that ranks
    marked positions first and, among equals, lower positions first; so a row
    with more than ``num`` marks gives its first ``num``, and a row with fewer
    is filled up with its first unmarked positions (never from another row).
    The values are gathered exactly (no arithmetic on them, unlike the
    add-a-large-offset trick). Differentiable w.r.t. ``arr`` (the head gradient
    scatters back to the picked positions); ``indicate`` gets zero gradient.

    Parameters
    ----------
    num : int
        How many entries to pick per row, ``1 <= num <= L`` (keyword).

    Notes
    -----
    Shapes: ``arr`` (B, M, L); ``indicate`` (B, 1, L), nonzero = picked;
    output (B, M, num), ``arr``'s dtype.

    Example:
        >>> import mxnet as mx
        >>> from customop import ops
        >>> a = mx.nd.arange(60).reshape((1, 6, 10))
        >>> b = mx.nd.array([[[0, 1, 0, 1, 0, 1, 0, 1, 0, 1]]])
        >>> ops.arr_pick(a, b, num=5)[0, :2].asnumpy().tolist()
        [[1.0, 3.0, 5.0, 7.0, 9.0], [11.0, 13.0, 15.0, 17.0, 19.0]]
    """
    length = _check(arr, indicate, num)
    ctx = arr.context
    with mx.autograd.pause():
        rank = mx.nd.arange(length - 1, -1, -1, ctx=ctx, dtype="int32").reshape((1, 1, -1))
        key = mx.nd.broadcast_add((indicate != 0).astype("int32") * length, rank)
        pos = _topk_nd(key, num, -1, "indices", False, "int64", False)  # (B, 1, num)
        flat = mx.nd.broadcast_add(_rows.row_starts(arr), pos)  # b M L + m L + pos
    return mx.nd.take(mx.nd.reshape(arr, shape=(-1,)), flat)


@arr_pick.twin("numpy")
def _arr_pick_numpy(arr, indicate, *, num):
    length = _check(arr, indicate, num)
    key = (indicate != 0) * length + np.arange(length - 1, -1, -1)  # unique: no ties
    pos = np.sort(np.argsort(-key, axis=-1)[..., :num], axis=-1)
    return np.take_along_axis(arr, np.broadcast_to(pos, arr.shape[:2] + (num,)), axis=-1)


def _arr_pick_grad_np(ans, arr, indicate, *, num):
    def grad(g):
        length = arr.shape[-1]
        key = (indicate != 0) * length + np.arange(length - 1, -1, -1)
        pos = np.sort(np.argsort(-key, axis=-1)[..., :num], axis=-1)
        out = np.zeros_like(arr)
        np.put_along_axis(out, np.broadcast_to(pos, g.shape), g, axis=-1)
        return out

    return grad


arr_pick.numpy.def_grad(_arr_pick_grad_np)
