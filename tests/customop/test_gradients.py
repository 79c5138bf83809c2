"""Automatic gradients (HIPS autograd / mx.autograd) against hand-written def_grad closures."""

import autograd.numpy as anp
import mxnet as mx
import numpy as np
import pytest

from customop import customop
from tests.customop import paths

# name: (numpy forward, mxnet forward, {argnum: closure maker written from the formula}, inputs)
CASES = {
    "elementwise": (
        lambda x: anp.tanh(x) * x,
        lambda x: mx.nd.tanh(x) * x,
        {0: lambda ans, x: lambda g: g * (np.tanh(x) + x * (1 - np.tanh(x) ** 2))},
        lambda: [np.random.normal(size=(4, 3))],
    ),
    "reduction": (
        lambda x: anp.sum(x**2, axis=1),
        lambda x: mx.nd.sum(x**2, axis=1),
        {0: lambda ans, x: lambda g: g[:, None] * 2 * x},
        lambda: [np.random.normal(size=(4, 3))],
    ),
    "broadcasting": (
        lambda x, b: x * b + b,
        lambda x, b: mx.nd.broadcast_add(mx.nd.broadcast_mul(x, b), b),
        {
            0: lambda ans, x, b: lambda g: g * b,
            1: lambda ans, x, b: lambda g: np.sum(g * x + g, axis=0, keepdims=True),
        },
        lambda: [np.random.normal(size=(4, 3)), np.random.normal(size=(1, 3))],
    ),
    "indexing": (
        lambda x, idx: x[anp.arange(x.shape[0]), idx] * 3.0,
        lambda x, idx: mx.nd.pick(x, idx, axis=1) * 3.0,
        {0: lambda ans, x, idx: lambda g: _scatter(g * 3.0, idx, x.shape)},
        lambda: [np.random.normal(size=(4, 3)), np.array([2, 0, 1, 2], np.int32)],
    ),
    "two_outputs": (
        lambda x, y: (x * y, anp.exp(x) + y),
        lambda x, y: (x * y, mx.nd.exp(x) + y),
        {
            0: lambda ans, x, y: lambda g: g[0] * y + g[1] * np.exp(x),
            1: lambda ans, x, y: lambda g: g[0] * x + g[1],
        },
        lambda: [np.random.normal(size=(2, 3)), np.random.normal(size=(2, 3))],
    ),
    "scalar_loss": (
        lambda x: anp.mean(anp.log1p(anp.exp(x))),
        lambda x: mx.nd.mean(mx.nd.log1p(mx.nd.exp(x))),
        {0: lambda ans, x: lambda g: g / (1 + np.exp(-x)) / x.size},
        lambda: [np.random.normal(size=(5,))],
    ),
}


def _scatter(values, idx, shape):
    out = np.zeros(shape, values.dtype)
    out[np.arange(shape[0]), idx] = values
    return out


def _nd_closure(maker):
    """Run a NumPy closure maker on NDArrays (for the 'mxnet'-mode hand-written ops)."""

    def nd_maker(ans, *args):
        as_np = lambda a: a.asnumpy() if isinstance(a, mx.nd.NDArray) else a  # noqa: E731
        closure = maker(
            tuple(map(as_np, ans)) if isinstance(ans, tuple) else as_np(ans), *map(as_np, args)
        )
        ctx = args[0].context
        return lambda g: mx.nd.array(
            closure(tuple(map(as_np, g)) if isinstance(g, tuple) else as_np(g)), ctx=ctx
        )

    return nd_maker


def _ops(case, mode):
    np_fn, nd_fn, makers, _ = CASES[case]
    fn = np_fn if mode == "numpy" else nd_fn
    n_out = 2 if case == "two_outputs" else 1
    auto = customop(mode, name=f"tests.auto_{case}_{mode}", num_outputs=n_out)(fn)
    manual = customop(mode, name=f"tests.manual_{case}_{mode}", num_outputs=n_out, auto_grad=False)(
        fn
    )
    for argnum, maker in makers.items():
        manual.def_grad(maker if mode == "numpy" else _nd_closure(maker), argnum)
    return auto, manual


OPS = {(case, mode): _ops(case, mode) for case in CASES for mode in ("numpy", "mxnet")}


@pytest.mark.parametrize("how", paths.ALL)
@pytest.mark.parametrize("mode", ["numpy", "mxnet"])
@pytest.mark.parametrize("case", list(CASES))
def test_automatic_gradient_matches_hand_written(case, mode, how):
    auto, manual = OPS[(case, mode)]
    inputs = [a.astype(np.float32) if a.dtype == np.float64 else a for a in CASES[case][3]()]
    outs = auto(*inputs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    heads = [np.random.normal(size=np.shape(o) or (1,)).astype(np.float32) for o in outs]
    got_out, got = paths.run(auto, inputs, how=how, heads=heads)
    want_out, want = paths.run(manual, inputs, how=how, heads=heads)
    for a, b in zip(got_out, want_out):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    for arg, a, b in zip(inputs, got, want):
        if np.issubdtype(arg.dtype, np.integer):
            assert a is None and b is None  # integer inputs: no gradient buffer, zero gradient
            continue
        assert np.abs(b).max() > 0  # the reference is not trivially zero
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_integer_input_of_an_auto_op_gets_zero_in_a_float_graph():
    auto, _ = OPS[("indexing", "numpy")]
    x = mx.nd.random.normal(shape=(4, 3))
    idx = mx.nd.array([0, 1, 2, 0], dtype="int32")
    x.attach_grad()
    idx.attach_grad()
    with mx.autograd.record():
        out = auto(x, idx)
    out.backward()
    np.testing.assert_array_equal(idx.grad.asnumpy(), np.zeros(4))


@pytest.mark.parametrize("mode", ["numpy", "mxnet"])
def test_def_grad_wins_over_automatic(mode):
    op = customop(mode, name=f"tests.def_grad_wins_{mode}")(
        (lambda x: x * 2.0) if mode == "numpy" else (lambda x: x * 2.0)
    )
    op.def_grad(lambda ans, x: lambda g: g * 0 + 42)
    _, (g,) = paths.run(op, [np.ones(3, np.float32)])
    np.testing.assert_array_equal(g, [42, 42, 42])


@pytest.mark.parametrize("mode", ["numpy", "mxnet"])
def test_auto_grad_false_gives_zero(mode):
    op = customop(mode, name=f"tests.no_auto_{mode}", auto_grad=False)(lambda x: x * 2.0)
    _, (g,) = paths.run(op, [np.ones(3, np.float32)])
    np.testing.assert_array_equal(g, [0, 0, 0])


def test_loss_layer_auto_gradient_uses_ones():
    op = customop("numpy", name="tests.auto_loss", need_top_grad=False)(
        lambda x, t: 0.5 * anp.sum((x - t) ** 2)
    )
    x, t = np.random.rand(3).astype(np.float32), np.random.rand(3).astype(np.float32)
    _, (gx, gt) = paths.run(op, [x, t], heads=[np.full((1,), 9.0, np.float32)])
    np.testing.assert_allclose(gx, x - t, rtol=1e-6)
    np.testing.assert_allclose(gt, t - x, rtol=1e-6)


def test_untraceable_numpy_forward_says_what_to_do():
    @customop("numpy")
    def writes_into_a_buffer(x):
        out = np.empty(x.shape)
        out[:] = x * 2  # assigning a traced value into a plain array cannot be traced
        return out

    with pytest.raises(
        TypeError,
        match=r"writes_into_a_buffer': cannot compute an automatic "
        r"gradient for input 'x'.*autograd\.numpy.*def_grad",
    ):
        paths.run(writes_into_a_buffer, [np.ones(3, np.float32)])


def test_untraceable_mxnet_forward_says_what_to_do():
    @customop("mxnet")
    def through_numpy(x):
        return mx.nd.array(x.asnumpy() * 2)

    with pytest.raises(
        TypeError,
        match=r"through_numpy': cannot compute an automatic gradient "
        r"for input 'x'.*no asnumpy.*def_grad",
    ):
        paths.run(through_numpy, [np.ones(3, np.float32)])


# ---- no_grad: "this input gets no gradient", declared once (issue 19) -------------------------
def _scaled(mode, name, **options):
    # out = x * w: without no_grad, w's gradient is g * x (automatic or hand-written)
    return customop(mode, name=name, **options)(lambda x, w: x * w)


# 'native': an 'mxnet'-mode op without def_grad records MXNet's own ops.
@pytest.mark.parametrize(
    "mode, how",
    [("mxnet", "native")] + [(mode, how) for mode in ("numpy", "mxnet") for how in paths.ALL],
)
def test_a_no_grad_input_gets_zero_on_every_path(mode, how):
    x, w = np.random.rand(2, 3).astype(np.float32) + 1, np.random.rand(2, 3).astype(np.float32)
    heads = [np.random.rand(2, 3).astype(np.float32)]
    free = _scaled(mode, f"tests.no_grad_free_{mode}")
    _, (gx_free, gw_free) = paths.run(free, [x, w], how=how, heads=heads)
    declared = _scaled(mode, f"tests.no_grad_{mode}", no_grad=("w",))
    out, (gx, gw) = paths.run(declared, [x, w], how=how, heads=heads)
    np.testing.assert_allclose(gw_free, heads[0] * x, rtol=1e-6)  # w has a gradient...
    np.testing.assert_array_equal(gw, np.zeros_like(w))  # ...that no_grad takes away
    np.testing.assert_allclose(gx, heads[0] * w, rtol=1e-6)
    np.testing.assert_allclose(gx, gx_free, rtol=1e-6)
    np.testing.assert_allclose(out[0], x * w, rtol=1e-6)


def test_no_grad_holds_for_the_twin_and_the_variants():
    @customop("mxnet", name="tests.no_grad_twin", optional=("weight",), no_grad=("label",))
    def op(pred, label, weight=None):
        d = pred - label
        return d * d if weight is None else d * d * weight

    @op.twin("numpy")
    def _op_numpy(pred, label, weight=None):
        d = pred - label
        return d * d if weight is None else d * d * weight

    assert op.numpy.no_grad == frozenset({"label"})
    assert op.variant(["pred", "label"]).no_grad == frozenset({"label"})
    assert "no_grad=[label]" in repr(op)
    p, t = np.random.rand(3).astype(np.float32), np.random.rand(3).astype(np.float32)
    for each in (op, op.numpy):
        _, (gp, gt) = paths.run(each, [p, t])  # the variant without weight
        np.testing.assert_allclose(gp, 2 * (p - t), rtol=1e-5)
        np.testing.assert_array_equal(gt, np.zeros(3))


def test_no_grad_mistakes_are_refused_at_definition():
    with pytest.raises(
        TypeError,
        match=r"no_grad names lable, which is not an input; the "
        r"inputs are x, label",
    ):
        customop("numpy", name="tests.no_grad_typo", no_grad=("lable",))(lambda x, label: x)
    op = customop("numpy", name="tests.no_grad_conflict", no_grad="label")(lambda x, label: x)
    with pytest.raises(
        ValueError,
        match=r"tests.no_grad_conflict.*input 'label' is declared "
        r"no_grad",
    ):
        op.def_grad(lambda ans, x, label: lambda g: g, 1)
