"""ops.topk (issue 11): mx.nd.topk plus do_sort=False."""

import mxnet as mx
import numpy as np
import pytest

import ops
from customop import check_grad
from tests.ops.detection import every_path, forward_backward_without_host_copy

TWINS = [ops.topk, ops.topk.numpy]


def reference(x, k, axis, ret_typ, is_ascend, do_sort):
    """float64 top-k from the definition: rank by value (ties: lower index first)."""
    x = np.asarray(x, np.float64)
    moved = x.reshape(-1) if axis is None else np.moveaxis(x, axis, -1)
    length = moved.shape[-1]
    k = length if k < 1 else k
    value = np.empty(moved.shape[:-1] + (k,))
    index = np.empty(moved.shape[:-1] + (k,), np.int64)
    mask = np.zeros_like(moved)
    for row in np.ndindex(moved.shape[:-1]):
        items = sorted(
            range(length), key=lambda i: (moved[row][i] if is_ascend else -moved[row][i], i)
        )[:k]
        if not do_sort:
            items = sorted(items)
        index[row], value[row] = items, moved[row][items]
        mask[row][items] = 1
    back = (lambda a: a) if axis is None else (lambda a: np.moveaxis(a, -1, axis))
    mask = mask.reshape(x.shape) if axis is None else back(mask)
    return {"value": back(value), "indices": back(index), "mask": mask}[ret_typ]


def test_issue_example():
    a = mx.nd.array([[0.087, 0.648, 0.020, 0.368, 0.833]])
    for op in TWINS:
        np.testing.assert_allclose(
            op(a, k=3, do_sort=False).asnumpy(), [[0.648, 0.368, 0.833]], rtol=1e-6
        )
        np.testing.assert_allclose(
            op(a, k=3, do_sort=True).asnumpy(), [[0.833, 0.648, 0.368]], rtol=1e-6
        )


@pytest.mark.parametrize("op", TWINS, ids=["mxnet", "numpy"])
@pytest.mark.parametrize("axis", [0, 1, -1, None])
@pytest.mark.parametrize("do_sort", [True, False])
def test_equals_reference_and_native(op, axis, do_sort):
    x = np.random.normal(size=(3, 4, 6)).astype(np.float32)  # no ties
    length = x.size if axis is None else x.shape[axis]
    for k in (1, 3, length, 0):
        for is_ascend in (False, True):
            for ret_typ in ("value", "indices", "mask", "both"):
                kw = dict(k=k, axis=axis, ret_typ=ret_typ, is_ascend=is_ascend, do_sort=do_sort)
                got = op(mx.nd.array(x), **kw)
                got = got if isinstance(got, tuple) else (got,)
                kinds = ("value", "indices") if ret_typ == "both" else (ret_typ,)
                for kind, g in zip(kinds, got):
                    want = reference(x, k, axis, kind, is_ascend, do_sort)
                    assert g.shape == want.shape, (kw, kind)
                    np.testing.assert_allclose(g.asnumpy(), want, rtol=1e-6, err_msg=str(kw))
                if do_sort:  # identical to MXNet's own topk, dtypes included
                    native_kw = {key: v for key, v in kw.items() if key != "do_sort"}
                    native = mx.nd.topk(mx.nd.array(x), **native_kw)
                    native = native if isinstance(native, list) else [native]
                    for g, n in zip(got, native):
                        assert g.dtype == n.dtype
                        np.testing.assert_array_equal(g.asnumpy(), n.asnumpy())


@pytest.mark.parametrize("op", TWINS, ids=["mxnet", "numpy"])
def test_ties_select_tied_values_and_dtypes(op):
    x = np.array([[1, 1, 1, 1, 0.5, 1], [2, 0, 2, 0, 2, 0]], np.float32)
    for k in (2, 3, 6):
        value, index = op(mx.nd.array(x), k=k, ret_typ="both", do_sort=False, dtype="int32")
        assert index.dtype == np.int32
        np.testing.assert_array_equal(value.asnumpy(), reference(x, k, -1, "value", False, False))
        idx = index.asnumpy()
        assert (np.diff(idx, axis=-1) > 0).all()  # original order
        np.testing.assert_array_equal(np.take_along_axis(x, idx, -1), value.asnumpy())
    # the numpy twin documents its rule: lower index first
    np.testing.assert_array_equal(
        ops.topk.numpy(mx.nd.array(x), k=3, ret_typ="indices").asnumpy(), [[0, 1, 2], [0, 2, 4]]
    )


@pytest.mark.parametrize("op", TWINS, ids=["mxnet", "numpy"])
@pytest.mark.parametrize("do_sort", [True, False])
def test_value_gradient(op, do_sort):
    x = np.random.normal(size=(3, 5)).astype(np.float32)
    check_grad(op, x, k=3, axis=0, do_sort=do_sort)
    check_grad(op, x, k=5, axis=1, do_sort=do_sort)
    heads = np.random.normal(size=(3, 2)).astype(np.float32)
    xs = mx.nd.array(x)
    xs.attach_grad()
    with mx.autograd.record():
        y = op(xs, k=2, do_sort=do_sort)
    y.backward(mx.nd.array(heads))
    want = np.zeros_like(x)
    idx = reference(x, 2, -1, "indices", False, do_sort)
    np.put_along_axis(want, idx, heads, -1)  # scatter back to the selected positions
    np.testing.assert_allclose(xs.grad.asnumpy(), want)


@pytest.mark.parametrize("ret_typ", ["value", "both"])
def test_every_path_and_no_host_copy(ret_typ):
    x = np.random.normal(size=(2, 7)).astype(np.float32)
    for without_grad in ("indices", "mask"):  # outputs without gradient also pass through graphs
        for do_sort in (True, False):
            every_path(ops.topk, [x], dict(k=3, ret_typ=without_grad, do_sort=do_sort))
    params = dict(k=3, do_sort=False, ret_typ=ret_typ)
    outs = every_path(ops.topk, [x], params)
    assert len(outs) == (2 if ret_typ == "both" else 1)
    np.testing.assert_allclose(outs[0], reference(x, 3, -1, "value", False, False), rtol=1e-6)
    for path in ("function", "custom"):
        got, grads = forward_backward_without_host_copy(ops.topk, [x], params, path)
        np.testing.assert_array_equal(got[0], outs[0])
        np.testing.assert_array_equal(grads[0], reference(x, 3, -1, "mask", False, False))


def test_symbol_both_and_hybridized_wrapper():
    # one Symbol with two outputs, as mx.sym.topk(ret_typ='both') returns
    out = ops.topk(mx.sym.var("data"), k=2, ret_typ="both", do_sort=False, name="top")
    native = mx.sym.topk(mx.sym.var("data"), k=2, ret_typ="both", name="top")
    assert isinstance(out, mx.sym.Symbol) and len(out) == len(native) == 2
    assert out.list_outputs() == ["top_output0", "top_output1"]
    ex = out.bind(mx.cpu(), {"data": mx.nd.array([[3, 1, 2, 5]])})
    value, index = ex.forward()
    assert value.asnumpy().tolist() == [[3, 5]] and index.asnumpy().tolist() == [[0, 3]]
    value_sym, index_sym = out  # unpacks like the tuple it used to be
    ex = mx.sym.Group([index_sym, value_sym]).bind(mx.cpu(), {"data": mx.nd.array([[3, 1, 2, 5]])})
    index, value = ex.forward()
    assert value.asnumpy().tolist() == [[3, 5]] and index.asnumpy().tolist() == [[0, 3]]


@pytest.mark.parametrize("op", TWINS, ids=["mxnet", "numpy"])
def test_bad_parameters_raise_and_the_next_call_works(op):
    x = mx.nd.ones((2, 4))
    with pytest.raises(
        ValueError,
        match=r"ops.topk': k must be no larger than the "
        r"length 4 .* got 5",
    ):
        op(x, k=5)
    with pytest.raises(ValueError, match="ops.topk': ret_typ must be one of"):
        op(x, k=1, ret_typ="values")
    with pytest.raises(ValueError, match="ops.topk': axis must be an int in"):
        op(x, k=1, axis=2)
    assert op(x, k=2).shape == (2, 2)


def nan_reference(x, k, is_ascend, do_sort):
    """Top k of each row with NumPy's order: NaN above +inf above every number; ties (only NaNs
    here) by lower index."""
    sign = 1 if is_ascend else -1

    def key(v, i):
        return (sign, 0.0, i) if np.isnan(v) else (0, sign * float(v), i)

    out_v, out_i = [], []
    for row in np.asarray(x, np.float64):
        order = sorted(range(len(row)), key=lambda i: key(row[i], i))
        items = order[:k] if k >= 1 else order
        items = sorted(items) if not do_sort else items
        out_v.append(row[items])
        out_i.append(items)
    return np.array(out_v), np.array(out_i)


@pytest.mark.parametrize("op", TWINS, ids=["mxnet", "numpy"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_nan_ranks_as_the_largest_value_in_both_modes(op, dtype):
    # Three NaNs, +inf, -inf and a huge finite value (not the dtype's largest, which ties with
    # +inf in 'mxnet' mode, as documented) among ordinary numbers.
    big = np.nextafter(np.finfo(dtype).max, dtype(0), dtype=dtype)
    row = np.array([1.5, np.nan, -np.inf, 3.0, np.inf, np.nan, -2.0, big, 0.25, np.nan], dtype)
    x = np.stack([row, row[::-1], np.roll(row, 3)])
    for k in (1, 2, 3, 4, 5, 8, 0):
        for is_ascend in (False, True):
            for do_sort in (True, False):
                kw = dict(k=k, is_ascend=is_ascend, do_sort=do_sort)
                value, index = op(mx.nd.array(x, dtype=dtype), ret_typ="both", **kw)
                want_v, want_i = nan_reference(x, k, is_ascend, do_sort)
                np.testing.assert_array_equal(value.asnumpy(), want_v.astype(dtype), str(kw))
                picked = np.take_along_axis(x, index.asnumpy().astype(np.int64), axis=-1)
                np.testing.assert_array_equal(picked, value.asnumpy(), str(kw))
                if op is ops.topk.numpy or do_sort is False:
                    np.testing.assert_array_equal(index.asnumpy(), want_i, str(kw))
                mask = op(mx.nd.array(x, dtype=dtype), ret_typ="mask", **kw).asnumpy()
                assert (mask.sum(axis=-1) == (k if k >= 1 else x.shape[1])).all()
                np.testing.assert_array_equal(
                    np.sort(x[mask > 0].reshape(3, -1), axis=-1),
                    np.sort(want_v, axis=-1).astype(dtype),
                    str(kw),
                )


def test_nan_rule_without_the_constant_cache(monkeypatch):
    # Large inputs build their +inf / largest-finite constants per call instead of caching them.
    import sys

    monkeypatch.setattr(sys.modules["ops.topk"], "_CACHED_SIZE", 0)
    x = np.array([[0.5, np.nan, np.inf, -1.0, np.nan, 2.0]])
    for dtype in (np.float32, np.float64):
        value, index = ops.topk(mx.nd.array(x, dtype=dtype), k=4, ret_typ="both")
        np.testing.assert_array_equal(
            value.asnumpy(), np.array([[np.nan, np.nan, np.inf, 2.0]], dtype)
        )
        value = ops.topk(mx.nd.array(x, dtype=dtype), k=2, is_ascend=True, do_sort=False)
        np.testing.assert_array_equal(value.asnumpy(), np.array([[0.5, -1.0]], dtype))
