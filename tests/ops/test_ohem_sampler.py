"""ops.ohem_sampler (issue 11): keep positives and the hardest ratio x num_pos negatives."""

import mxnet as mx
import numpy as np
import pytest

import ops
from tests.ops.detection import every_path, forward_backward_without_host_copy

TWINS = [ops.ohem_sampler, ops.ohem_sampler.numpy]


def reference(
    conf_data, conf_target, conf_weight, ratio=3.0, min_neg=0, ignore_label=-1, from_logits=True
):
    """float64 OHEM from the definition: rank negatives by -log p0 (p0 = softmax(x)[0], or x[0]
    when x holds probabilities), ties by index; floor(ratio * num_pos) negatives."""
    x = np.asarray(conf_data, np.float64)
    conf_weight = conf_weight.reshape(conf_target.shape)
    p0 = np.exp(x[..., 0]) / np.exp(x).sum(-1) if from_logits else x[..., 0]
    with np.errstate(divide="ignore"):
        loss = -np.log(p0)
    out = np.zeros(conf_target.shape)
    for b in range(len(x)):
        usable = [
            i
            for i in range(x.shape[1])
            if conf_weight[b, i] > 0 and conf_target[b, i] != ignore_label
        ]
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
        for kw in (
            dict(),
            dict(ratio=0.5),
            dict(ratio=1.0, min_neg=5),
            dict(ratio=0.0),
            dict(min_neg=100),
            dict(ignore_label=3),
        ):
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
    np.testing.assert_array_equal(
        op(*map(mx.nd.array, (x, t, w)), min_neg=3).asnumpy(), reference(x, t, w, min_neg=3)
    )
    t[:] = 1  # no negatives
    np.testing.assert_array_equal(op(*map(mx.nd.array, (x, t, w))).asnumpy(), w)
    t[:] = -1  # everything ignored
    np.testing.assert_array_equal(op(*map(mx.nd.array, (x, t, w)), min_neg=3).asnumpy(), 0)


def test_every_path_and_no_host_copy():
    inputs = random_inputs(2, 12)
    outs = every_path(ops.ohem_sampler, list(inputs), dict(ratio=1.0))
    np.testing.assert_array_equal(outs[0], reference(*inputs, ratio=1.0))
    for path in ("function", "custom"):
        got, grads = forward_backward_without_host_copy(
            ops.ohem_sampler, list(inputs), dict(ratio=1.0), path
        )
        np.testing.assert_array_equal(got[0], outs[0])
        assert not any(g.any() for g in grads)  # no gradient flows


@pytest.mark.parametrize("op", TWINS, ids=["mxnet", "numpy"])
def test_bad_input_raises_and_the_next_call_works(op):
    x, t, w = map(mx.nd.array, random_inputs(2, 5))
    with pytest.raises(
        ValueError,
        match=r"ops.ohem_sampler': conf_target has shape "
        r".* must have shape",
    ):
        op(x, t[:, :4], w)
    with pytest.raises(
        ValueError,
        match=r"ops.ohem_sampler': loss_type must be one of "
        r"\('softmax',\)",
    ):
        op(x, t, w, loss_type="sigmoid")
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(
            ValueError,
            match=r"ops.ohem_sampler': ratio must be a finite "
            r"number >= 0",
        ):
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


def softmax64(x):
    e = np.exp(np.asarray(x, np.float64))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("op", TWINS, ids=["mxnet", "numpy"])
def test_probabilities_and_weights_shaped_b_n_1_as_in_the_seed(op):
    for _ in range(5):
        x, t, w = random_inputs()
        probs = softmax64(x).astype(np.float32)
        probs[0, 0] = [1.0, 0.0, 0.0, 0.0]  # certain background: the easiest negative
        probs[1, 0] = [0.0, 0.5, 0.25, 0.25]  # p0 = 0: the hardest (loss inf)
        for kw in (dict(), dict(ratio=0.5), dict(ratio=1.0, min_neg=5)):
            want = reference(probs, t, w, from_logits=False, **kw)
            got = op(*map(mx.nd.array, (probs, t, w)), from_logits=False, **kw)
            np.testing.assert_array_equal(got.asnumpy(), want, err_msg=kw)
            got = op(*map(mx.nd.array, (probs, t, w[..., None])), from_logits=False, **kw)
            assert got.shape == w.shape + (1,)
            np.testing.assert_array_equal(got.asnumpy()[..., 0], want, err_msg=kw)
            got = op(*map(mx.nd.array, (x, t, w[..., None])), **kw)
            np.testing.assert_array_equal(got.asnumpy()[..., 0], reference(x, t, w, **kw))


def test_probabilities_rank_like_their_logits():
    # Softmax is monotone in the background loss: logits and their probabilities select alike
    # (away from float32 ties of p0).
    x = np.random.normal(0, 2, (2, 30, 4)).astype(np.float32)
    t = np.random.choice([0, 0, 0, 1, 2], (2, 30)).astype(np.float32)
    w = np.ones((2, 30), np.float32)
    probs = softmax64(x).astype(np.float32)
    for op in TWINS:
        np.testing.assert_array_equal(
            op(*map(mx.nd.array, (probs, t, w)), from_logits=False, ratio=1.0).asnumpy(),
            op(*map(mx.nd.array, (x, t, w)), ratio=1.0).asnumpy(),
        )


def test_rounding_is_floor_not_ssds_ceil():
    # ratio 2.5 with 3 positives: floor 7 negatives (GluonCV's OHEMSampler); SSD's ceil gives 8.
    x = np.zeros((1, 20, 2), np.float32)
    x[0, :, 1] = np.arange(20)  # distinct background losses
    t = np.zeros((1, 20), np.float32)
    t[0, :3] = 1
    for op in TWINS:
        got = op(*map(mx.nd.array, (x, t, np.ones((1, 20), np.float32))), ratio=2.5).asnumpy()
        assert got.sum() == 3 + 7
        np.testing.assert_array_equal(got[0, 3:], (np.arange(3, 20) >= 13).astype(np.float32))


def test_numpy_twin_refuses_probabilities_outside_0_1():
    x, t, w = random_inputs(2, 5)
    with pytest.raises(ValueError, match=r"'ops.ohem_sampler'.*: conf_data holds values outside"):
        ops.ohem_sampler.numpy(*map(mx.nd.array, (x, t, w)), from_logits=False)


def test_weights_shaped_b_n_1_on_every_path():
    x, t, w = random_inputs(2, 12)
    probs = softmax64(x).astype(np.float32)
    outs = every_path(ops.ohem_sampler, [probs, t, w[..., None]], dict(from_logits=False))
    assert outs[0].shape == (2, 12, 1)
    np.testing.assert_array_equal(outs[0][..., 0], reference(probs, t, w, from_logits=False))


@pytest.mark.parametrize("op", [ops.ohem_sampler, ops.ohem_sampler.numpy], ids=lambda op: op.mode)
def test_a_graph_infers_shape_and_dtype_as_the_forward_gives_them(monkeypatch, op):
    # Issue 55: binds ask for the output's shape and dtype at every new signature; they
    # come from infer_shape=/infer_type= with the forward's own checks.  The reference is
    # the forward itself, run directly on arrays of each signature (before the patch below).
    from customop import inference
    from customop.dispatch import forced_path

    cases = [  # shapes of conf_data, conf_target, conf_weight; their dtypes; parameters
        ((2, 5, 3), (2, 5), (2, 5), ("float32", "float32", "float32"), {}),
        ((2, 5, 3), (2, 5), (2, 5, 1), ("float16", "int32", "int32"), {"ratio": 2}),
        ((1, 4, 2), (1, 4), (1, 4), ("float64", "float16", "float16"), {"min_neg": 1}),
        ((2, 5, 3), (2, 5), (2, 5), ("float32", "int32", "float32"), {}),  # mixed
        ((2, 5, 3), (2, 4), (2, 5), ("float32", "float32", "float32"), {}),  # target shape
        ((2, 5, 3), (2, 5), (2, 5, 2), ("float32", "float32", "float32"), {}),  # weight
        ((2, 5), (2, 5), (2, 5), ("float32", "float32", "float32"), {}),  # data shape
        ((2, 5, 3), (2, 5), (2, 5), ("int32", "float32", "float32"), {}),  # integer data
        ((2, 5, 3), (2, 5), (2, 5), ("float32", "float32", "float32"), {"loss_type": "x"}),
    ]
    names = ("conf_data", "conf_target", "conf_weight")

    def outcome(run, *args):
        try:
            return run(*args)
        except Exception as exc:  # noqa: BLE001 - the message is compared
            return type(exc).__name__, str(exc).split(" (")[0].split(";")[0]

    def forward(shapes, dtypes, params):
        arrays = [mx.nd.ones(s, dtype=d) for s, d in zip(shapes, dtypes)]
        with forced_path("direct"):
            y = op(*arrays, **params)
        return y.shape, np.dtype(y.dtype)

    def inferred(sym, shapes, dtypes):
        _, out, _ = sym.infer_shape(**dict(zip(names, shapes)))
        _, out_types, _ = sym.infer_type(**dict(zip(names, dtypes)))
        return tuple(out[0]), np.dtype(out_types[0])

    want = [outcome(forward, case[:3], case[3], case[4]) for case in cases]
    assert [w[0] for w in want[3:4]] == (["TypeError"] if op.mode == "mxnet" else [(2, 5)])
    runs = []
    monkeypatch.setattr(inference.Inference, "_run", lambda *a, **k: runs.append(a))
    for (*shapes, dtypes, params), expected in zip(cases, want):
        sym = op(*[mx.sym.var(n) for n in names], **params)
        assert outcome(inferred, sym, shapes, dtypes) == expected, (shapes, dtypes, params)
        if not isinstance(expected[0], str):
            exe = sym.simple_bind(
                mx.cpu(),
                grad_req="null",
                type_dict=dict(zip(names, dtypes)),
                **dict(zip(names, shapes)),
            )
            assert exe.outputs[0].shape == expected[0] and exe.outputs[0].dtype == expected[1]
    assert runs == []
