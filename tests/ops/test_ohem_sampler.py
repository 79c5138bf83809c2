"""ops.ohem_sampler (issue 11): keep positives and the hardest ratio x num_pos negatives."""
import mxnet as mx
import numpy as np
import pytest

import ops
from tests.ops.detection import every_path, forward_backward_without_host_copy

TWINS = [ops.ohem_sampler, ops.ohem_sampler.numpy]


def reference(conf_data, conf_target, conf_weight, ratio=3.0, min_neg=0, ignore_label=-1):
    """float64 OHEM from the definition: rank negatives by -log softmax(x)[0], ties by index."""
    x = np.asarray(conf_data, np.float64)
    p0 = np.exp(x[..., 0]) / np.exp(x).sum(-1)
    loss = -np.log(p0)
    out = np.zeros(conf_target.shape)
    for b in range(len(x)):
        usable = [i for i in range(x.shape[1])
                  if conf_weight[b, i] > 0 and conf_target[b, i] != ignore_label]
        pos = [i for i in usable if conf_target[b, i] > 0]
        neg = [i for i in usable if conf_target[b, i] == 0]
        count = min(max(int(np.floor(ratio * len(pos))), min_neg), len(neg))
        hardest = sorted(neg, key=lambda i: (-loss[b, i], i))[:count]
        out[b, pos + hardest] = 1
    return out


def random_inputs(b=3, n=40, c=4):
    pool = np.random.normal(0, 2, (6, c)).astype(np.float32)  # repeated rows: exact loss ties
    conf_data = pool[np.random.randint(0, 6, (b, n))]
    conf_target = np.random.choice([-1, 0, 0, 0, 0, 1, 2, 3], (b, n)).astype(np.float32)
    conf_weight = (np.random.rand(b, n) > 0.1).astype(np.float32)
    return conf_data, conf_target, conf_weight


@pytest.mark.parametrize("op", TWINS, ids=["mxnet", "numpy"])
def test_equals_reference(op):
    for _ in range(10):
        inputs = random_inputs()
        for kw in (dict(), dict(ratio=0.5), dict(ratio=1.0, min_neg=5), dict(ratio=0.0),
                   dict(min_neg=100), dict(ignore_label=3)):
            x, t, w = inputs
            if "ignore_label" in kw:
                t = np.where(t == -1, kw["ignore_label"], t)
            got = op(*map(mx.nd.array, (x, t, w)), **kw)
            assert got.shape == w.shape and got.dtype == np.float32
            np.testing.assert_array_equal(got.asnumpy(), reference(x, t, w, **kw), err_msg=kw)


@pytest.mark.parametrize("op", TWINS, ids=["mxnet", "numpy"])
def test_hard_negatives_are_selected_and_ties_go_to_the_lower_index(op):
    x = np.array([[[0, 0], [0, 3], [0, 1], [0, 2], [5, 0], [0, 3], [0, 3]]], np.float32)
    t = np.array([[1, 0, 0, 0, 0, 0, 0]], np.float32)
    got = op(mx.nd.array(x), mx.nd.array(t), mx.nd.ones((1, 7)), ratio=2).asnumpy()
    np.testing.assert_array_equal(got, [[1, 1, 0, 0, 0, 1, 0]])  # three tie at the top


@pytest.mark.parametrize("op", TWINS, ids=["mxnet", "numpy"])
def test_empty_selections(op):
    x, t, w = random_inputs(2, 10)
    t[:] = 0  # no positives: only min_neg negatives
    np.testing.assert_array_equal(op(*map(mx.nd.array, (x, t, w))).asnumpy(), 0)
    np.testing.assert_array_equal(op(*map(mx.nd.array, (x, t, w)), min_neg=3).asnumpy(),
                                  reference(x, t, w, min_neg=3))
    t[:] = 1  # no negatives
    np.testing.assert_array_equal(op(*map(mx.nd.array, (x, t, w))).asnumpy(), w)
    t[:] = -1  # everything ignored
    np.testing.assert_array_equal(op(*map(mx.nd.array, (x, t, w)), min_neg=3).asnumpy(), 0)


def test_every_path_and_no_host_copy():
    inputs = random_inputs(2, 12)
    outs = every_path(ops.ohem_sampler, list(inputs), dict(ratio=1.0))
    np.testing.assert_array_equal(outs[0], reference(*inputs, ratio=1.0))
    for path in ("function", "custom"):
        got, grads = forward_backward_without_host_copy(ops.ohem_sampler, list(inputs),
                                                        dict(ratio=1.0), path)
        np.testing.assert_array_equal(got[0], outs[0])
        assert not any(g.any() for g in grads)  # no gradient flows


@pytest.mark.parametrize("op", TWINS, ids=["mxnet", "numpy"])
def test_bad_input_raises_and_the_next_call_works(op):
    x, t, w = map(mx.nd.array, random_inputs(2, 5))
    with pytest.raises(ValueError, match=r"ops.ohem_sampler': conf_target has shape "
                       r".* must have shape"):
        op(x, t[:, :4], w)
    with pytest.raises(ValueError, match=r"ops.ohem_sampler': loss_type must be one of "
                       r"\('softmax',\)"):
        op(x, t, w, loss_type="sigmoid")
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=r"ops.ohem_sampler': ratio must be a finite "
                           r"number >= 0"):
            op(x, t, w, ratio=bad)
    with pytest.raises(TypeError, match=r"ops.ohem_sampler': min_neg must be an int"):
        op(x, t, w, min_neg=1.5)
    with pytest.raises(ValueError, match=r"ops.ohem_sampler': min_neg must be an int in \[0,"):
        op(x, t, w, min_neg=-1)
    with pytest.raises(TypeError, match=r"ops.ohem_sampler': from_logits must be a bool"):
        op(x, t, w, from_logits="False")
    with pytest.raises(TypeError, match=r"ops.ohem_sampler': conf_data must be a float array"):
        op(x.astype("int64"), t, w)
    assert op(x, t, w).shape == (2, 5)


def test_numpy_twin_checks_values():
    x, t, w = random_inputs(2, 5)
    bad = t.copy()
    bad[0, 0] = 7
    with pytest.raises(ValueError, match=r"ops.ohem_sampler': conf_target has values outside"):
        ops.ohem_sampler.numpy(*map(mx.nd.array, (x, bad, w)))
    nan = x.copy()
    nan[0, 0, 0] = np.nan
    with pytest.raises(ValueError, match=r"ops.ohem_sampler': conf_data contains NaN"):
        ops.ohem_sampler.numpy(*map(mx.nd.array, (nan, t, w)))
    assert ops.ohem_sampler.numpy(*map(mx.nd.array, (x, t, w))).shape == (2, 5)
