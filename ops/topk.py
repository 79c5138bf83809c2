"""``ops.topk``: ``mx.nd.topk`` plus ``do_sort=False`` (the top k in their original order)."""

from __future__ import annotations

import mxnet as mx
import numpy as np

from customop import customop, residuals

from . import _checks, _rows

RET_TYPS = ("value", "indices", "mask", "both")
DTYPES = ("float16", "float32", "float64", "uint8", "int32", "int64")


def _check(shape, k, axis, ret_typ, is_ascend, dtype, do_sort):
    """Cheap parameter checks (shapes and literals only): the length along ``axis``."""
    _checks.choice("topk", "ret_typ", ret_typ, RET_TYPS)
    _checks.boolean("topk", "is_ascend", is_ascend)
    _checks.boolean("topk", "do_sort", do_sort)
    _checks.choice("topk", "dtype", dtype, DTYPES)
    _checks.integer("topk", "k", k)
    if axis is None:
        length = int(np.prod(shape))
    else:
        _checks.integer("topk", "axis", axis, -len(shape), len(shape) - 1)
        length = shape[axis]
    if k > length:
        raise _checks.fail(
            "topk",
            "k",
            f"must be no larger than the length {length} of axis "
            f"{axis} (k < 1 selects all, sorted), got {k}",
        )
    return length


def _nan_largest(x):
    """A key that ranks as NumPy sorts: NaN above every number (``+inf`` included).

    NaN becomes ``+inf`` and ``+inf`` the dtype's largest finite value, in ``x``'s dtype (a
    float64 copy would double the cost of the sort): so ``+inf`` ties with that largest
    finite value, the one exception.  Integer data have no NaN and are their own key.
    """
    if not np.issubdtype(x.dtype, np.floating):
        return x
    # (arrays, not scalars: MXNet parses a scalar parameter inexactly, 1e308 -> 9.99...e307)
    finite = mx.nd.minimum(x, _const_like(x, np.finfo(x.dtype).max))
    return mx.nd.where(x == x, finite, _const_like(x, np.inf))


_CONSTANTS: dict = {}  # (what, shape, dtype, context) -> a constant array, never written
_CACHED_SIZE = 1 << 22  # elements; a larger constant is made per call, not held


def _cached(key, size, make):
    # Making these costs as much as another pass over the data: keep a few small ones.
    if size > _CACHED_SIZE:
        return make()
    const = _CONSTANTS.get(key)
    if const is None:
        if len(_CONSTANTS) >= 16:
            _CONSTANTS.clear()
        const = _CONSTANTS[key] = make()
    return const


def _const_like(x, value):
    if mx.autograd.is_recording():  # traced (a pause records then): a graph at any shape
        one = mx.nd.array([value], x.context, dtype=x.dtype).reshape((1,) * x.ndim)
        return mx.nd.broadcast_like(one, x)
    return _cached(
        (float(value), x.shape, np.dtype(x.dtype).name, str(x.context)),
        x.size,
        lambda: mx.nd.broadcast_to(
            mx.nd.array([value], x.context, dtype=x.dtype).reshape((1,) * x.ndim), x.shape
        ),
    )


def _to_last(x, axis):
    """``x`` with ``axis`` moved last (flattened for ``axis=None``), and the permutation."""
    if axis is None:
        return mx.nd.reshape(x, shape=(-1,)), None  # (the operator: graphs keep the -1)
    axis = axis % x.ndim
    perm = [*(i for i in range(x.ndim) if i != axis), axis]
    return (x if axis == x.ndim - 1 else x.transpose(perm)), perm


def _from_last(y, perm):
    if perm is None or perm[-1] == len(perm) - 1:
        return y
    return y.transpose([int(i) for i in np.argsort(perm)])


def _topk_nd(data, k, axis, ret_typ, is_ascend, dtype, do_sort):
    return _topk_parts(data, k, axis, ret_typ, is_ascend, dtype, do_sort)[0]


def _topk_parts(data, k, axis, ret_typ, is_ascend, dtype, do_sort):
    """The result, and where the values sit in the flattened (axis-last) data (or None)."""
    length = _check(data.shape, k, axis, ret_typ, is_ascend, dtype, do_sort)
    k = length if k < 1 else k
    x, perm = _to_last(data, axis)
    with mx.autograd.pause():  # positions are not differentiable (sort of int64 cannot record)
        key = _nan_largest(x)
        if ret_typ == "mask":
            mask = mx.nd.topk(key, axis=-1, k=k, ret_typ="mask", is_ascend=is_ascend)
            mask = _from_last(mask.astype(data.dtype, copy=False), perm)
            return mx.nd.reshape_like(mask, data), None
        pos = mx.nd.topk(key, axis=-1, k=k, ret_typ="indices", is_ascend=is_ascend, dtype="int64")
        if not do_sort:
            pos = mx.nd.sort(pos, axis=-1)
        flat = mx.nd.reshape(mx.nd.broadcast_add(pos, _rows.row_starts(key)), shape=(-1, k))
    if ret_typ == "indices":
        return _from_last(pos.astype(dtype), perm), None
    value = _from_last(
        mx.nd.reshape_like(mx.nd.take(mx.nd.reshape(x, shape=(-1,)), flat), pos), perm
    )
    return (value if ret_typ == "value" else (value, _from_last(pos.astype(dtype), perm))), flat


def _topk_np(data, k, axis, ret_typ, is_ascend, dtype, do_sort):
    length = _check(data.shape, k, axis, ret_typ, is_ascend, dtype, do_sort)
    k = length if k < 1 else k
    x = data.reshape(-1) if axis is None else np.moveaxis(data, axis, -1)
    if is_ascend:
        order = np.argsort(x, axis=-1, kind="stable")
    else:  # descending, ties by lower index: stable sort of the reversed row, read backwards
        order = length - 1 - np.argsort(x[..., ::-1], axis=-1, kind="stable")[..., ::-1]
    pos = order[..., :k]
    if not do_sort:
        pos = np.sort(pos, axis=-1)
    value = np.take_along_axis(x, pos, axis=-1)
    if ret_typ == "mask":
        mask = np.zeros_like(x)
        np.put_along_axis(mask, pos, 1, axis=-1)
        return mask.reshape(data.shape) if axis is None else np.moveaxis(mask, -1, axis)
    back = (lambda a: a) if axis is None else (lambda a: np.moveaxis(a, -1, axis))
    value, indices = back(value), back(pos.astype(dtype))
    return {"value": value, "indices": indices, "both": (value, indices)}[ret_typ]


def _num_outputs(ret_typ):
    return 2 if ret_typ == "both" else 1  # (value, indices); a bad ret_typ fails in _check


@customop("mxnet", name="ops.topk", num_outputs=_num_outputs)
def topk(data, *, k=1, axis=-1, ret_typ="value", is_ascend=False, dtype="float32", do_sort=True):
    r"""Top k elements along an axis; ``mx.nd.topk`` with an extra ``do_sort``.

    With ``do_sort=True`` this is ``mx.nd.topk`` (same outputs, dtypes and
    gradient). With ``do_sort=False`` the k selected elements come back in their
    **original order** along ``axis``:

    .. math::

        S = \operatorname{argtop}_k(x), \qquad
        \mathrm{value}_j = x_{s_j},\quad s_1 < s_2 < \dots < s_k,\ s_j \in S

    which turns ``topk`` into a dynamic-indexing tool (see :func:`ops.arr_pick`).
    The gradient of ``value`` scatters the head gradient back to the selected
    positions; ``indices`` and ``mask`` have zero gradient.

    ``ops.topk`` runs in ``'mxnet'`` mode (``mx.nd.topk``, ``sort``, ``take``:
    MXNet's CUDA kernels on a GPU, no host copy); ``ops.topk.numpy`` is the
    ``'numpy'``-mode twin. One registered op (op type ``'ops.topk'``) serves every
    ``ret_typ``: its output count follows the parameter (``num_outputs=``), two
    outputs for ``'both'``, one otherwise, on every call style and in saved graphs.

    Parameters
    ----------
    k : int, default 1
        How many elements; ``k < 1`` selects the whole axis (sorted when ``do_sort``).
    axis : int or None, default -1
        Axis to select along; ``None`` flattens ``data`` first.
    ret_typ : {'value', 'indices', 'mask', 'both'}, default 'value'
        ``'both'`` returns ``(value, indices)`` (with Symbols, one Symbol with those two
        outputs, as ``mx.sym.topk``); ``'mask'`` is 1 at the selected positions.
    is_ascend : bool, default False
        Select the k smallest instead of the k largest.
    dtype : {'float16', 'float32', 'float64', 'uint8', 'int32', 'int64'}, default 'float32'
        Dtype of ``indices``.
    do_sort : bool, default True
        Sort the selection by value (``mx.nd.topk``); ``False`` keeps the original order.

    Notes
    -----
    Ties: which of several equal elements is selected follows ``mx.nd.topk`` in
    ``'mxnet'`` mode (unspecified: MXNet's CPU sort is not stable, e.g. k=3 of
    ``[1,1,1,1,0.5,1]`` gives indices ``[0,1,2]`` but 5 of forty ones gives
    ``[3,4,1,0,2]``); the ``'numpy'`` twin takes the lower index first. Values never
    depend on the tie rule.

    NaN follows NumPy's rule in both modes: it sorts as the largest value (above
    ``+inf``), so the top k (descending) take NaNs first and ``is_ascend=True`` takes
    them last. One exception in ``'mxnet'`` mode: ``+inf`` ties with the dtype's
    largest finite value (``np.finfo(dtype).max``), so which of the two ranks first is
    unspecified, like other ties.

    Shapes: ``data`` any shape; ``value``/``indices`` have ``data``'s shape with
    ``k`` along ``axis`` (``(k,)`` for ``axis=None``); ``mask`` has ``data``'s shape.

    Example:
        >>> import mxnet as mx
        >>> from customop import ops
        >>> a = mx.nd.array([[0.087, 0.648, 0.020, 0.368, 0.833]], dtype='float64')
        >>> ops.topk(a, k=3, do_sort=False).asnumpy().round(3).tolist()
        [[0.648, 0.368, 0.833]]
        >>> ops.topk(a, k=3).asnumpy().round(3).tolist()
        [[0.833, 0.648, 0.368]]
        >>> v, i = ops.topk(a, k=3, ret_typ='both', do_sort=False); i.asnumpy().tolist()
        [[1.0, 3.0, 4.0]]
    """
    result, flat = _topk_parts(data, k, axis, ret_typ, is_ascend, dtype, do_sort)
    return result if flat is None else residuals(result, flat=flat)


@topk.twin("numpy")
def _topk_numpy(
    data, *, k=1, axis=-1, ret_typ="value", is_ascend=False, dtype="float32", do_sort=True
):
    return _topk_np(data, k, axis, ret_typ, is_ascend, dtype, do_sort)


def _topk_grad_nd(
    ans,
    data,
    k=1,
    axis=-1,
    ret_typ="value",
    is_ascend=False,
    dtype="float32",
    do_sort=True,
    flat=None,
):
    # The head gradient scattered back to the selected positions (``flat``, the forward's):
    # linear in g, so training graphs transpose it into a gather (customop.graphs.backward).
    def grad(g):
        if ret_typ not in ("value", "both"):
            return data.zeros_like()
        g = g[0] if ret_typ == "both" else g
        gl, perm = _to_last(g, axis)
        picked = mx.nd.scatter_nd(
            mx.nd.reshape(gl, shape=(-1,)), mx.nd.reshape(flat, shape=(1, -1)), shape=(data.size,)
        )
        return mx.nd.reshape_like(
            _from_last(mx.nd.reshape_like(picked, _to_last(data, axis)[0]), perm), data
        )

    return grad


def _topk_grad_np(
    ans, data, k=1, axis=-1, ret_typ="value", is_ascend=False, dtype="float32", do_sort=True
):
    # d value / d data scatters the head gradient back to the selected positions.
    def grad(g):
        if ret_typ not in ("value", "both"):
            return np.zeros_like(data)
        g = g[0] if ret_typ == "both" else g
        both = _topk_np(data, k, axis, "indices", is_ascend, "int64", do_sort)
        x = data.reshape(-1) if axis is None else np.moveaxis(data, axis, -1)
        pos = both if axis is None else np.moveaxis(both, axis, -1)
        gl = g.reshape(-1) if axis is None else np.moveaxis(g, axis, -1)
        out = np.zeros_like(x)
        np.put_along_axis(out, pos, gl, axis=-1)
        return out.reshape(data.shape) if axis is None else np.moveaxis(out, -1, axis)

    return grad


topk.def_grad(_topk_grad_nd)
topk.numpy.def_grad(_topk_grad_np)
