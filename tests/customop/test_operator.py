"""Items 1, 2, 4, 5, 6, 7 of the core contract, through every way MXNet drives an op."""

import mxnet as mx
import numpy as np
import pytest

from customop import CustomOperator, customop
from tests import fresh
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


def test_the_class_takes_the_decorators_keywords_and_defaults_and_refuses_others():
    # customop()'s signature owns the keyword list: the class reads its defaults from there.
    def double(x):
        return 2 * x

    op = CustomOperator(double, "numpy", name="tests.class_keywords", no_grad="x")
    assert (op.need_top_grad, op.auto_grad, op.inline) == (True, True, True)
    assert op.no_grad == {"x"} and op.user_infer_shape is None
    with pytest.raises(TypeError, match="unexpected keyword argument 'no_grads'"):
        CustomOperator(double, "numpy", name="tests.class_keywords_bad", no_grads="x")
    with pytest.raises(TypeError, match="unexpected keyword argument 'inlined'"):
        op.twin("mxnet", inlined=False)(double)


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

    op = customop(
        "numpy",
        name="tests.needs_real_labels",
        infer_shape=lambda xs, ys, k=2: (xs[0] * k, *xs[1:]),
        infer_type=lambda xt, yt, k=2: np.float64,
    )(needs_real_labels)
    sym = op(mx.sym.var("x"), mx.sym.var("y"), k=3)
    assert sym.infer_shape(x=(2, 4), y=(2,))[1] == [(6, 4)]
    assert sym.infer_type(x=np.float32, y=np.int32)[1] == [np.float64]
    (out,), _ = paths.run(
        op, [np.ones((2, 4), np.float32), np.array([2, 3], np.int32)], params={"k": 3}, how="symbol"
    )
    assert out.shape == (6, 4)
    bad = customop("numpy", name="tests.needs_real_labels_no_hint")(needs_real_labels)
    with pytest.raises(ValueError, match="labels start at 2") as err:
        bad(mx.sym.var("x"), mx.sym.var("y")).infer_shape(x=(2, 4), y=(2,))
    assert "infer_shape=" in "".join(getattr(err.value, "__notes__", [])) + str(err.value)


def test_infer_shape_runs_once_per_signature_and_the_type_pass_still_runs_infer_type():
    # the type pass asks again at the shapes the shape pass asked, with dtypes: infer_shape=
    # (which reads no dtype) answers from its first run there; infer_type= runs, checks and all
    shapes_asked, types_asked = [], []

    def infer_type(xt):
        types_asked.append(np.dtype(xt))
        if np.dtype(xt) == np.float16:
            raise TypeError("customop 'tests.doubled_rows': x must not be float16")
        return xt

    op = customop(
        "numpy",
        name="tests.doubled_rows",
        infer_shape=lambda xs: shapes_asked.append(xs) or (xs[0] * 2, *xs[1:]),
        infer_type=infer_type,
    )(lambda x: np.concatenate([x, x]))
    sym = op(mx.sym.var("x"))
    for n in (3, 4):
        args, outs, _ = sym.infer_shape(x=(n, 5))
        assert outs == [(2 * n, 5)]
        assert sym.infer_type(x=np.float64)[1] == [np.float64]
        exe = sym.simple_bind(mx.cpu(), x=(n, 5), type_dict={"x": np.float64}, grad_req="null")
        x = np.arange(n * 5, dtype=np.float64).reshape(n, 5)
        np.testing.assert_array_equal(exe.forward(x=x)[0].asnumpy(), np.concatenate([x, x]))
    assert shapes_asked == [(3, 5), (4, 5)]  # (its own answer at a signature it answered)
    assert np.dtype(np.float64) in types_asked
    with pytest.raises(TypeError, match="x must not be float16"):
        sym.simple_bind(mx.cpu(), x=(4, 5), type_dict={"x": np.float16}, grad_req="null")


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
    a, _ = mx.nd.Custom(
        x,
        x,
        op_type=opdefs.affine_pair.op_type,
        alpha=0.5,
        mode="valid",
        axes=(1, 2),
        flag=True,
        extra=None,
    )
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


# ---- 6b. an output count that follows a parameter (num_outputs= as a function) ---------------
SPLIT = [opdefs.split_rows, opdefs.split_rows.mxnet]  # def_grad closure / recorded natively


def _split_reference(x, parts, scale, heads):
    """float64: the outputs are ``parts`` row blocks of ``scale * x``; d/dx stacks the heads."""
    x = x.astype(np.float64)
    return np.split(scale * x, parts, axis=0), scale * np.concatenate(heads, axis=0)


@pytest.mark.parametrize("how", ["direct", "native", *paths.ALL])
@pytest.mark.parametrize("op", SPLIT, ids=["numpy", "mxnet"])
def test_the_output_count_follows_the_parameters_on_every_path(op, how):
    x = np.random.rand(6, 2).astype(np.float32)
    for parts in (1, 2, 3):
        heads = [np.random.rand(6 // parts, 2).astype(np.float32) for _ in range(parts)]
        want, want_grad = _split_reference(x, parts, 2.0, heads)
        params = dict(parts=parts, scale=2.0)
        if how == "direct":
            out = op(mx.nd.array(x), **params)
            assert isinstance(out, tuple) == (parts > 1)  # one output is not a 1-tuple
            outs = [o.asnumpy() for o in (out if parts > 1 else (out,))]
        else:
            outs, (grad,) = paths.run(op, [x], params, how=how, heads=heads)
            np.testing.assert_allclose(grad, want_grad, rtol=1e-6)
        assert len(outs) == parts, (how, parts)
        for got, w in zip(outs, want):
            np.testing.assert_allclose(got, w, rtol=1e-6)


@pytest.mark.parametrize("op", SPLIT, ids=["numpy", "mxnet"])
def test_an_output_count_by_parameters_in_symbols_custom_and_check_grad(op):
    x = np.random.rand(6, 2).astype(np.float32)
    three = op(mx.sym.var("x"), parts=3, name="s")  # one node, three outputs
    assert isinstance(three, mx.sym.Symbol) and len(three) == 3
    assert three.list_outputs() == ["s_output0", "s_output1", "s_output2"]
    assert three[2].list_outputs() == ["s_output2"]
    one = op(mx.sym.var("x"), name="w")
    assert isinstance(one, mx.sym.Symbol) and one.list_outputs() == ["w_output"]
    # shape inference per node: the same input shape, different parameters
    assert three.infer_shape(x=(6, 2))[1] == [(2, 2)] * 3
    assert mx.sym.Group(list(three)).infer_shape(x=(6, 2))[1] == [(2, 2)] * 3
    assert one.infer_shape(x=(6, 2))[1] == [(6, 2)]
    outs = mx.nd.Custom(mx.nd.array(x), op_type=op.op_type, parts=2)  # MXNet's own front door
    assert len(outs) == 2
    np.testing.assert_allclose(outs[1].asnumpy(), x[3:], rtol=1e-6)
    from customop.check import check_grad

    for parts in (1, 2):
        assert check_grad(op, x.astype(np.float64), parts=parts, scale=3.0).passed


@pytest.mark.parametrize("op", SPLIT, ids=["numpy", "mxnet"])
def test_an_output_count_by_parameters_in_a_hybridized_block(op):
    x = np.random.rand(6, 2).astype(np.float32)
    blocks = np.split(2.0 * x, 3)
    want = np.concatenate([blocks[2], blocks[0], blocks[1]]) * (0.5 * x)
    net = opdefs.SplitNet(op)
    for hybrid in (False, True):
        if hybrid:
            net.hybridize()
        xs = mx.nd.array(x)
        xs.attach_grad()
        with mx.autograd.record():
            out = net(xs)
        out.backward()
        np.testing.assert_allclose(out.asnumpy(), want, rtol=1e-6)
        # out[i] = x[(i + 4) % 6] * x[i] (rows): d sum(out) / dx[j] = x[j + 4] + x[j + 2]
        np.testing.assert_allclose(
            xs.grad.asnumpy(), np.roll(x, -4, 0) + np.roll(x, -2, 0), rtol=1e-6
        )


def test_an_output_count_by_parameters_survives_export_and_reload(tmp_path):
    import json
    import sys
    from pathlib import Path

    x = np.random.rand(6, 2).astype(np.float32)
    net = opdefs.SplitNet(opdefs.split_rows)
    net.hybridize()
    want = net(mx.nd.array(x)).asnumpy()
    prefix = str(tmp_path / "split")
    net.export(prefix)
    nodes = [
        n
        for n in json.loads(Path(prefix + "-symbol.json").read_text())["nodes"]
        if n["op"] == "Custom"
    ]
    assert [n["attrs"]["op_type"] for n in nodes] == [opdefs.split_rows.op_type] * 2
    np.save(tmp_path / "x.npy", x)
    script = f"""
import sys
import mxnet as mx, numpy as np
import customop
assert "tests.customop.opdefs" not in sys.modules
x = mx.nd.array(np.load({str(tmp_path / "x.npy")!r}))
a = customop.imports({prefix + "-symbol.json"!r}, ['data'],
                     modules=['tests.customop.opdefs'])  # imports the defining module
b = mx.gluon.SymbolBlock.imports({prefix + "-symbol.json"!r}, ['data'])
np.save({str(tmp_path / "out.npy")!r}, np.stack([a(x).asnumpy(), b(x).asnumpy()]))
"""
    root = Path(__file__).resolve().parents[2]
    fresh.run([sys.executable, "-c", script], cwd=root, check=True, timeout=120)
    for got in np.load(tmp_path / "out.npy"):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_num_outputs_by_parameters_is_documented_and_checked():
    import doctest

    from customop import operator as operator_module

    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in doctest.DocTestFinder().find(operator_module.customop, "customop", globs={}):
        runner.run(test)
    assert runner.summarize(verbose=False) == (0, runner.tries) and runner.tries > 0
    assert "outputs=by parameters" in repr(opdefs.split_rows)
    assert opdefs.split_rows.mxnet.num_outputs is opdefs.split_rows.num_outputs  # twins share it
    x = mx.nd.ones((4, 2))
    with pytest.raises(TypeError, match=r"num_outputs= takes 'part', which is not a parameter"):
        customop("numpy", name="tests.count_unknown", num_outputs=lambda part: part)(
            lambda x, parts=1: x
        )
    with pytest.raises(TypeError, match=r"num_outputs= must be an int >= 1"):
        customop("numpy", name="tests.count_zero", num_outputs=0)(lambda x: x)
    bad = customop("numpy", name="tests.count_bad", num_outputs=lambda parts: "two")(
        lambda x, parts=1: x
    )
    with pytest.raises(
        TypeError,
        match=r"customop 'tests.count_bad': num_outputs= returned "
        r"'two' for the parameters parts=1; it must return an int >= 1",
    ):
        bad(x)
    liar = customop("numpy", name="tests.count_liar", num_outputs=lambda parts: 2)(
        lambda x, parts=1: x
    )
    for how in ("direct", "symbol"):
        with pytest.raises(
            TypeError,
            match=r"forward returned 1 output\(s\) but the op declares "
            r"2 for the parameters parts=1 \(num_outputs=\); make num_outputs= "
            r"return 1 for them",
        ):
            if how == "direct":
                liar(x)
            else:
                mx.sym.Group(list(liar(mx.sym.var("x")))).infer_shape(x=(4, 2))


# ---- 7. loss layers --------------------------------------------------------------------------
@pytest.mark.parametrize("how", paths.ALL)
def test_need_top_grad_false_ignores_the_head_gradient(how):
    pred = np.random.rand(4, 3).astype(np.float32)
    target = np.random.rand(4, 3).astype(np.float32)
    outs, (gp, gt) = paths.run(
        opdefs.l2_loss, [pred, target], how=how, heads=[np.full((4,), 7.0, np.float32)]
    )
    np.testing.assert_allclose(outs[0], 0.5 * ((pred - target) ** 2).sum(axis=1), rtol=1e-6)
    np.testing.assert_allclose(gp, pred - target, rtol=1e-6)
    assert opdefs.l2_loss.need_top_grad is False


def test_help_shows_the_forwards_signature_and_docstring_not_a_repr():
    import inspect
    import pydoc

    from customop import ops

    text = pydoc.render_doc(ops.focal_loss, renderer=pydoc.plaintext)
    sig = "focal_loss(pred, label, normalizer=None, *, alpha=0.25, gamma=2.0"
    assert sig in text and "<customop" not in text
    assert "Sigmoid focal loss" in text
    assert inspect.isroutine(ops.focal_loss) and inspect.isroutine(ops.focal_loss.numpy)
    assert str(inspect.signature(ops.tile)) == "(data, *, reps)"

    class Holder:  # an op kept on a class stays the op, as a staticmethod would
        op = ops.tile

    assert Holder.op is ops.tile and Holder().op is ops.tile


def test_every_public_method_has_its_own_docstring():
    # pydoc falls back to the comment above a method without a docstring (it showed
    # "# ---- pieces shared by every dispatch path ----" for CustomOperator.error).

    from customop.ops import CenterLoss, FocalLoss, SmoothL1Loss, SoftmaxCE, WingLoss

    from customop.check import GradReport, GradRow, Tolerance
    from customop.distributed.auxsync import AuxSync

    for cls in (
        CustomOperator,
        GradReport,
        GradRow,
        Tolerance,
        AuxSync,
        CenterLoss,
        FocalLoss,
        SmoothL1Loss,
        SoftmaxCE,
        WingLoss,
    ):
        for name, member in vars(cls).items():
            if name.startswith("_") and name != "__call__":
                continue
            member = member.fget if isinstance(member, property) else member
            if callable(member):
                assert (member.__doc__ or "").strip(), f"{cls.__name__}.{name}"
