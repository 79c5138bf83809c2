"""ops.arr_pick (issue 11): dynamic indexing with a 0/1 mask."""

import mxnet as mx
import numpy as np
import pytest

import ops
from customop import check_grad
from tests.ops.detection import every_path, forward_backward_without_host_copy

TWINS = [ops.arr_pick, ops.arr_pick.numpy]


def reference(arr, indicate, num):
    """float64: the marked columns in order; short rows filled with their first unmarked."""
    arr = np.asarray(arr, np.float64)
    out = np.empty(arr.shape[:2] + (num,))
    for b in range(arr.shape[0]):
        marked = [j for j in range(arr.shape[2]) if indicate[b, 0, j] != 0]
        unmarked = [j for j in range(arr.shape[2]) if indicate[b, 0, j] == 0]
        cols = sorted((marked + unmarked)[:num]) if len(marked) < num else marked[:num]
        out[b] = arr[b][:, cols]
    return out


@pytest.mark.parametrize("op", TWINS, ids=["mxnet", "numpy"])
def test_issue_example(op):
    a = mx.nd.arange(60).reshape((1, 6, 10))
    b = mx.nd.array([[[0, 1, 0, 1, 0, 1, 0, 1, 0, 1]]])
    want = np.arange(60).reshape(6, 10)[:, 1::2][None]
    np.testing.assert_array_equal(op(a, b, num=5).asnumpy(), want)


@pytest.mark.parametrize("op", TWINS, ids=["mxnet", "numpy"])
def test_equals_reference(op):
    arr = np.random.normal(size=(3, 4, 9)).astype(np.float32)
    arr[0, :, :3] = 1.5  # ties in the values do not matter
    for num in (1, 4, 9):
        ind = np.zeros((3, 1, 9), np.float32)
        for b in range(3):
            ind[b, 0, np.random.choice(9, num, replace=False)] = 1
        got = op(mx.nd.array(arr), mx.nd.array(ind), num=num).asnumpy()
        np.testing.assert_array_equal(got, reference(arr, ind, num))
    # rows with more or fewer marks than num follow the documented rule
    ind = np.array(
        [[[1, 1, 1, 1, 0, 0, 0, 0, 1]], [[0] * 9], [[0, 0, 0, 0, 0, 0, 0, 1, 0]]], np.float32
    )
    got = op(mx.nd.array(arr), mx.nd.array(ind), num=3).asnumpy()
    np.testing.assert_array_equal(got, reference(arr, ind, 3))


@pytest.mark.parametrize("op", TWINS, ids=["mxnet", "numpy"])
def test_gradient(op):
    arr = np.random.normal(size=(2, 3, 6)).astype(np.float32)
    ind = np.array([[[0, 1, 1, 0, 0, 1]], [[1, 0, 0, 1, 1, 0]]], np.float32)
    check_grad(op, arr, ind, num=3, argnums=[0])


def test_every_path_and_no_host_copy():
    arr = np.random.normal(size=(2, 3, 6)).astype(np.float32)
    ind = np.array([[[0, 1, 1, 0, 0, 1]], [[1, 0, 0, 1, 1, 0]]], np.float32)
    outs = every_path(ops.arr_pick, [arr, ind], dict(num=3), float_inputs=[0])
    np.testing.assert_array_equal(outs[0], reference(arr, ind, 3))
    for path in ("function", "custom"):
        got, grads = forward_backward_without_host_copy(ops.arr_pick, [arr, ind], dict(num=3), path)
        np.testing.assert_array_equal(got[0], outs[0])
        np.testing.assert_array_equal(grads[0], np.broadcast_to(ind, arr.shape))


@pytest.mark.parametrize("op", TWINS, ids=["mxnet", "numpy"])
def test_bad_input_raises_and_the_next_call_works(op):
    arr, ind = mx.nd.ones((2, 3, 5)), mx.nd.ones((2, 1, 5))
    with pytest.raises(ValueError, match=r"ops.arr_pick': indicate has shape .*\(B, 1, L\)"):
        op(arr, mx.nd.ones((2, 3, 5)), num=2)
    with pytest.raises(ValueError, match=r"ops.arr_pick': num must be an int in \[1, 5\], got 6"):
        op(arr, ind, num=6)
    with pytest.raises(ValueError, match=r"ops.arr_pick': arr must have shape \(B, M, L\)"):
        op(mx.nd.ones((2, 5)), ind, num=2)
    assert op(arr, ind, num=2).shape == (2, 3, 2)
