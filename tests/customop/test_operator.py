"""Items 1, 2, 4, 5, 6, 7 of the core contract, through every way MXNet drives an op."""
import mxnet as mx
import numpy as np
import pytest

from customop import CustomOperator, customop
from tests.customop import opdefs, paths


def ref_softmax_ce(x, y):
    """Float64 reference from the formula: mean(logsumexp(x) - x[y]) and its gradient."""
    x = x.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(x - m).sum(axis=1))
    n = x.shape[0]
    p = np.exp(x - lse[:, None])
    onehot = np.zeros_like(x)
    onehot[np.arange(n), y] = 1
    return np.mean(lse - x[np.arange(n), y]), (p - onehot) / n


def data(n=8, c=5):
    x = np.random.normal(size=(n, c)).astype(np.float32)
    y = np.random.randint(0, c, size=n).astype(np.int32)
    return x, y


# ---- 1. decorator and registry ---------------------------------------------------------------
def test_decorator_returns_a_callable_operator_with_metadata():
    op = opdefs.softmax_ce
    assert isinstance(op, CustomOperator)
    assert op.op_type == "tests.customop.opdefs.softmax_ce"
    assert op.__name__ == "softmax_ce" and op.__wrapped__ is op.fn
    assert op.signature.inputs == ["x", "y"]


def test_def_grad_is_chainable_and_defaults_to_argnum_0():
    @customop("numpy")
    def mul(a, b):
        return a * b

    da = lambda ans, a, b: lambda g: g * b  # noqa: E731
    db = lambda ans, a, b: lambda g: g * a  # noqa: E731
    assert mul.def_grad(da) is mul
    assert mul.def_grad(db, argnum=1) is mul
    assert mul.grads == {0: da, 1: db}
    a, b = np.random.rand(3).astype(np.float32), np.random.rand(3).astype(np.float32)
    _, (ga, gb) = paths.run(mul, [a, b])
    np.testing.assert_allclose(ga, b, rtol=1e-6)
    np.testing.assert_allclose(gb, a, rtol=1e-6)


def test_def_grad_rejects_bad_argnum_naming_the_inputs():
    with pytest.raises(IndexError, match=r"argnum=2.*0=x, 1=y"):
        opdefs.softmax_ce.def_grad(opdefs.softmax_ce_grad, argnum=2)


def test_name_override_and_clash():
    @customop("numpy", name="tests.custom_name_a")
    def first(x):
        return x

    assert first.op_type == "tests.custom_name_a"
    with pytest.raises(ValueError, match="already used by"):
        @customop("numpy", name="tests.custom_name_a")
        def second(x):
            return x


def test_redefining_the_same_function_replaces_it():
    def make(k):
        @customop("numpy", name="tests.redefined")
        def scale(x):
            return x * k
        return scale

    make(2.0)
    op = make(3.0)
    x = mx.nd.ones((2,))
    assert mx.nd.Custom(x, op_type="tests.redefined").asnumpy().tolist() == [3.0, 3.0]
    assert op(x).asnumpy().tolist() == [3.0, 3.0]


def test_mx_nd_custom_and_mx_sym_custom_reach_the_same_operator():
    x, y = data()
    want, want_grad = ref_softmax_ce(x, y)
    xs, ys = mx.nd.array(x), mx.nd.array(y, dtype="int32")
    xs.attach_grad()
    with mx.autograd.record():
        out = mx.nd.Custom(xs, ys, op_type=opdefs.softmax_ce.op_type)
    out.backward()
    np.testing.assert_allclose(out.asnumpy()[0], want, rtol=1e-5)
    np.testing.assert_allclose(xs.grad.asnumpy(), want_grad, rtol=1e-4, atol=1e-7)

    sym = mx.sym.Custom(mx.sym.var("x"), mx.sym.var("y"), op_type=opdefs.softmax_ce.op_type)
    ex = sym.bind(mx.cpu(), {"x": mx.nd.array(x), "y": mx.nd.array(y, dtype="int32")})
    np.testing.assert_allclose(ex.forward()[0].asnumpy()[0], want, rtol=1e-5)


def test_repr_names_operator_mode_and_gradients():
    text = repr(opdefs.affine_pair)
    assert "tests.customop.opdefs.affine_pair" in text and "mode='numpy'" in text
    assert "def_grad=[x, b]" in text and "outputs=2" in text
    assert "def_grad=[x]" in repr(opdefs.softmax_ce)
    assert "need_top_grad=False" in repr(opdefs.l2_loss)


# ---- 2. both modes ---------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["direct", *paths.ALL])
@pytest.mark.parametrize("op", [opdefs.softmax_ce, opdefs.softmax_ce_nd], ids=["numpy", "mxnet"])
def test_softmax_ce_matches_float64_reference_everywhere(op, how):
    x, y = data()
    want, want_grad = ref_softmax_ce(x, y)
    if how == "direct":
        out = op(mx.nd.array(x), mx.nd.array(y, dtype="int32"))
        np.testing.assert_allclose(out.asnumpy()[0], want, rtol=1e-5)
        return
    (out,), (gx, gy) = paths.run(op, [x, y], how=how)
    np.testing.assert_allclose(out[0], want, rtol=1e-5)
    np.testing.assert_allclose(gx, want_grad, rtol=1e-4, atol=1e-7)
    assert gy is None


def test_modes_see_their_own_array_types_on_the_ops_context():
    seen = {}

    @customop("numpy")
    def np_probe(x):
        seen["numpy"] = type(x)
        return x + 1

    @customop("mxnet")
    def nd_probe(x):
        seen["mxnet"] = (type(x), x.context)
        return x + 1

    ctx = mx.cpu(1)  # a second context on CPU stands in for a GPU
    x = mx.nd.ones((2, 3), ctx=ctx)
    for how in ("direct", *paths.IMPERATIVE):
        with paths.forced_path(how):
            for op in (np_probe, nd_probe):
                out = op(x)
                assert out.context == ctx
        assert seen["numpy"] is np.ndarray
        assert seen["mxnet"][0] is mx.nd.NDArray
        if how != "custom":  # MXNet's CustomOp hands CPU arrays over as cpu(0) (dev_id of the run)
            assert seen["mxnet"][1] == ctx


def test_plain_numpy_call_runs_the_forward_and_returns_numpy():
    x, y = data()
    want, _ = ref_softmax_ce(x, y)
    out = opdefs.softmax_ce(x, y)
    assert isinstance(out, (np.ndarray, np.floating)) and np.ndim(out) == 0
    np.testing.assert_allclose(out, want, rtol=1e-5)
    out_nd_mode = opdefs.square_nd(np.arange(3.0))
    assert isinstance(out_nd_mode, np.ndarray)
    np.testing.assert_array_equal(out_nd_mode, [0.0, 1.0, 4.0])


# ---- 4. dtypes and shape/type inference --------------------------------------------------------
@pytest.mark.parametrize("how", ["direct", *paths.ALL])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_dtypes_are_kept(dtype, how):
    seen = []

    @customop("numpy", name=f"tests.dtype_probe_{np.dtype(dtype).name}_{how}")
    def probe(x, label):
        seen.append((x.dtype, label.dtype))
        return x * 2, (label + 1).astype(np.int64)

    probe.def_grad(lambda ans, x, label: lambda g: 2 * g[0])
    x = np.random.rand(4, 3).astype(dtype)
    label = np.arange(4, dtype=np.int32)
    if how == "direct":
        a, b = probe(mx.nd.array(x, dtype=dtype), mx.nd.array(label, dtype="int32"))
        outs, grads = [a.asnumpy(), b.asnumpy()], [None, None]
    else:
        outs, grads = paths.run(probe, [x, label], how=how)
    # seen[:-1] may hold placeholder runs of shape inference; the last call is the real one
    assert seen[-1] == (np.dtype(dtype), np.dtype(np.int32)), seen
    assert outs[0].dtype == dtype and outs[1].dtype == np.int64
    np.testing.assert_array_equal(outs[1], label + 1)
    if grads[0] is not None:
        assert grads[0].dtype == dtype
        np.testing.assert_allclose(grads[0], 2 * np.ones_like(x))


def test_shape_and_type_are_inferred_for_symbols():
    sym = opdefs.affine_pair(mx.sym.var("x"), mx.sym.var("b"), alpha=0.5)
    group = mx.sym.Group(list(sym))
    _, out_shapes, _ = group.infer_shape(x=(4, 3), b=(4, 3))
    assert out_shapes == [(4, 3), (4, 3)]
    loss = opdefs.softmax_ce(mx.sym.var("x"), mx.sym.var("y"))
    assert loss.infer_shape(x=(8, 5), y=(8,))[1] == [(1,)]  # a scalar is (1,) in legacy shapes
    _, out_types, _ = loss.infer_type(x=np.float64, y=np.int32)
    assert out_types == [np.float64]


def test_inference_runs_the_forward_once_per_signature():
    calls = []

    @customop("numpy")
    def counted(x):
        calls.append(x.shape)
        return x.sum(axis=0)

    sym = counted(mx.sym.var("x"))
    for _ in range(3):
        assert sym.infer_shape(x=(5, 2))[1] == [(2,)]
    assert len(calls) == 1
    sym.infer_shape(x=(7, 3))
    assert len(calls) == 2


def test_explicit_infer_shape_and_infer_type_for_forwards_that_cannot_run_on_placeholders():
    def needs_real_labels(x, y, k=2):
        if (y < 2).any():
            raise ValueError("labels start at 2")
        return np.repeat(x, k, axis=0).astype(np.float64)

    op = customop("numpy", name="tests.needs_real_labels",
                  infer_shape=lambda xs, ys, k=2: (xs[0] * k, *xs[1:]),
                  infer_type=lambda xt, yt, k=2: np.float64)(needs_real_labels)
    sym = op(mx.sym.var("x"), mx.sym.var("y"), k=3)
    assert sym.infer_shape(x=(2, 4), y=(2,))[1] == [(6, 4)]
    assert sym.infer_type(x=np.float32, y=np.int32)[1] == [np.float64]
    (out,), _ = paths.run(op, [np.ones((2, 4), np.float32), np.array([2, 3], np.int32)],
                          params={"k": 3}, how="symbol")
    assert out.shape == (6, 4)
    bad = customop("numpy", name="tests.needs_real_labels_no_hint")(needs_real_labels)
    with pytest.raises(ValueError, match="labels start at 2") as err:
        bad(mx.sym.var("x"), mx.sym.var("y")).infer_shape(x=(2, 4), y=(2,))
    assert "infer_shape=" in "".join(getattr(err.value, "__notes__", [])) + str(err.value)


# ---- 5. keyword parameters -------------------------------------------------------------------
PARAMS = dict(alpha=0.5, mode="valid", axes=(1, 2), flag=True, extra=None)


@pytest.mark.parametrize("how", ["direct", *paths.ALL])
def test_keyword_parameters_keep_their_python_types(how):
    x = np.random.rand(4, 3).astype(np.float32)
    b = np.random.rand(4, 3).astype(np.float32)
    if how == "direct":
        outs = [o.asnumpy() for o in opdefs.affine_pair(mx.nd.array(x), mx.nd.array(b), **PARAMS)]
        grads = None
    else:
        outs, grads = paths.run(opdefs.affine_pair, [x, b], params=PARAMS, how=how)
    np.testing.assert_allclose(outs[0], x * 0.5 + b, rtol=1e-6)
    np.testing.assert_allclose(outs[1], x - b, rtol=1e-6)
    if grads is not None:  # heads are ones: dx = alpha + 1, db = 1 - 1
        np.testing.assert_allclose(grads[0], np.full_like(x, 1.5))
        np.testing.assert_allclose(grads[1], np.zeros_like(b))


def test_parameters_survive_a_direct_mx_nd_custom_call_with_string_kwargs():
    x = mx.nd.ones((2, 3))
    a, _ = mx.nd.Custom(x, x, op_type=opdefs.affine_pair.op_type, alpha=0.5, mode="valid",
                        axes=(1, 2), flag=True, extra=None)
    np.testing.assert_allclose(a.asnumpy(), np.full((2, 3), 1.5))


# ---- 6. multiple inputs and outputs, req -----------------------------------------------------
@pytest.mark.parametrize("how", paths.ALL)
def test_multiple_outputs_get_a_tuple_of_head_gradients(how):
    x = np.random.rand(4, 3).astype(np.float32)
    b = np.random.rand(4, 3).astype(np.float32)
    h0, h1 = np.random.rand(4, 3).astype(np.float32), np.random.rand(4, 3).astype(np.float32)
    _, (gx, gb) = paths.run(opdefs.affine_pair, [x, b], params=PARAMS, how=how, heads=[h0, h1])
    np.testing.assert_allclose(gx, 0.5 * h0 + h1, rtol=1e-6)
    np.testing.assert_allclose(gb, h0 - h1, rtol=1e-6)


@pytest.mark.parametrize("how", paths.ALL)
def test_input_without_gradient_gets_zero(how):
    @customop("numpy", name=f"tests.partial_grad_{how}", auto_grad=False)
    def mul(a, b):
        return a * b

    mul.def_grad(lambda ans, a, b: lambda g: g * b)
    a, b = np.random.rand(3).astype(np.float32), np.random.rand(3).astype(np.float32)
    _, (ga, gb) = paths.run(mul, [a, b], how=how)
    np.testing.assert_allclose(ga, b, rtol=1e-6)
    np.testing.assert_array_equal(gb, np.zeros(3))


@pytest.mark.parametrize("how", paths.ALL)
@pytest.mark.parametrize("op", [opdefs.square_np, opdefs.square_nd], ids=["numpy", "mxnet"])
def test_grad_req_add_accumulates(op, how):
    x = np.array([1.0, -2.0, 3.0], np.float32)
    _, (g,) = paths.run(op, [x], how=how, grad_req="add", repeat=3)
    np.testing.assert_allclose(g, 3 * 2 * x)


@pytest.mark.parametrize("how", paths.IMPERATIVE)
def test_grad_req_null_skips_the_closure(how):
    calls = []

    @customop("numpy", name=f"tests.null_req_{how}")
    def mul(a, b):
        return a * b

    mul.def_grad(lambda ans, a, b: calls.append("a") or (lambda g: g * b))
    mul.def_grad(lambda ans, a, b: calls.append("b") or (lambda g: g * a), argnum=1)
    a, b = mx.nd.array([1.0, 2.0]), mx.nd.array([3.0, 4.0])
    a.attach_grad(grad_req="null")
    b.attach_grad()
    with paths.forced_path(how):
        with mx.autograd.record():
            out = mul(a, b)
        out.backward()
    np.testing.assert_array_equal(b.grad.asnumpy(), [1.0, 2.0])
    assert calls == ["b"]


def test_mixed_reqs_write_and_add_in_one_backward():
    a, b = mx.nd.array([1.0, 2.0]), mx.nd.array([3.0, 4.0])
    a.attach_grad(grad_req="add")
    b.attach_grad(grad_req="write")
    for _ in range(2):
        with mx.autograd.record():
            out, _ = opdefs.affine_pair(a, b, **PARAMS)
        out.backward()
    np.testing.assert_allclose(a.grad.asnumpy(), [1.0, 1.0])  # 2 x 0.5
    np.testing.assert_allclose(b.grad.asnumpy(), [1.0, 1.0])


# ---- 7. loss layers --------------------------------------------------------------------------
@pytest.mark.parametrize("how", paths.ALL)
def test_need_top_grad_false_ignores_the_head_gradient(how):
    pred = np.random.rand(4, 3).astype(np.float32)
    target = np.random.rand(4, 3).astype(np.float32)
    outs, (gp, gt) = paths.run(opdefs.l2_loss, [pred, target], how=how,
                               heads=[np.full((4,), 7.0, np.float32)])
    np.testing.assert_allclose(outs[0], 0.5 * ((pred - target) ** 2).sum(axis=1), rtol=1e-6)
    np.testing.assert_allclose(gp, pred - target, rtol=1e-6)
    assert opdefs.l2_loss.need_top_grad is False
