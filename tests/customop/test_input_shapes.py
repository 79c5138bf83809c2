"""Input shapes the op infers (infer_input_shape=), as MXNet's layers infer a weight's; and the
input nothing gives, named: on the symbol, Module, Gluon (deferred init, hybridized) and
exported paths."""

import warnings

import mxnet as mx
import numpy as np
import pytest

import customop as co
from customop import customop
from customop.input_shapes import InputShapeWarning
from tests import fresh


def _weight_shape(data, label, weight, *, num_hidden):
    return (num_hidden, data[1])


@customop("mxnet", infer_input_shape={"weight": _weight_shape}, no_grad=("label",))
def scored(data, label, weight, *, num_hidden):
    """``data @ weight.T`` plus 1 at each row's label: a FullyConnected-like weight input."""
    onehot = mx.nd.one_hot(label, num_hidden, dtype=data.dtype)
    return mx.nd.dot(data, weight, transpose_b=True) + onehot


@scored.twin("numpy")
def _scored_numpy(data, label, weight, *, num_hidden):
    return data @ weight.T + np.eye(num_hidden, dtype=data.dtype)[label.astype(np.int64)]


@customop("numpy", name="tests.input_shapes.unknown")
def no_inference(data, weight):
    return data @ weight.T


TWINS = [scored, scored.numpy]


def _arrays(n=4, d=5, c=3, seed=0):
    rng = np.random.RandomState(seed)
    return (
        rng.normal(size=(n, d)).astype(np.float32),
        rng.randint(0, c, size=n).astype(np.float32),
        rng.normal(size=(c, d)).astype(np.float32),
    )


def _reference(x, y, w):
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    return x64 @ w64.T + np.eye(w.shape[0])[y.astype(np.int64)]


@pytest.mark.parametrize("op", TWINS, ids=["mxnet", "numpy"])
def test_symbol_infer_shape_fills_the_weight(op):
    s = op(mx.sym.var("data"), mx.sym.var("label"), mx.sym.var("w"), num_hidden=3)
    args, outs, _ = s.infer_shape(data=(4, 5), label=(4,))
    assert args == [(4, 5), (4,), (3, 5)] and outs == [(4, 3)]
    types, _, _ = s.infer_type(data=np.float64, label=np.int32)
    assert types == [np.float64, np.int32, np.float64]  # the weight takes the data's dtype
    # a weight given with the wrong shape is named, as FullyConnected names it
    with pytest.raises(
        ValueError,
        match=r"customop 'tests.customop.test_input_shapes.scored"
        r"[^']*' \(input 'weight'\): given shape \(3, 4\), but infer_input_shape "
        r"says \(3, 5\) for the inputs data=\(4, 5\), label=\(4,\)",
    ):
        s.infer_shape(data=(4, 5), label=(4,), w=(3, 4))


@pytest.mark.parametrize("op", TWINS, ids=["mxnet", "numpy"])
def test_module_binds_and_trains_without_the_weights_shape(op):
    x, y, _ = _arrays()
    data, label = mx.sym.var("data"), mx.sym.var("label")
    out = op(data, label, mx.sym.var("fc_weight"), num_hidden=3, name="fc")
    mod = mx.mod.Module(
        mx.sym.MakeLoss(mx.sym.sum(out * out)), data_names=["data"], label_names=["label"]
    )
    mod.bind(data_shapes=[("data", x.shape)], label_shapes=[("label", y.shape)])
    mod.init_params(mx.init.Xavier())
    w = mod.get_params()[0]["fc_weight"].asnumpy()
    assert w.shape == (3, 5)
    mod.init_optimizer(optimizer_params={"learning_rate": 0.1})
    mod.forward_backward(mx.io.DataBatch([mx.nd.array(x)], [mx.nd.array(y)]))
    got = mod.get_outputs()[0].asscalar()
    np.testing.assert_allclose(got, (_reference(x, y, w) ** 2).sum(), rtol=1e-5)
    mod.update()
    # d sum(out^2) / dW = 2 out^T x; Module's SGD rescales by 1 / batch size
    want = w - 0.1 / 4 * 2 * _reference(x, y, w).T @ x.astype(np.float64)
    np.testing.assert_allclose(
        mod.get_params()[0]["fc_weight"].asnumpy(), want, rtol=1e-4, atol=1e-5
    )


class Scorer(mx.gluon.HybridBlock):
    """Owns the weight with an unknown input dimension, like Dense(3) without in_units."""

    def __init__(self, op, num_hidden, **kwargs):
        super().__init__(**kwargs)
        self.op, self.num_hidden = op, num_hidden
        with self.name_scope():
            self.weight = self.params.get("weight", shape=(num_hidden, 0), allow_deferred_init=True)

    def hybrid_forward(self, F, x, label, weight):
        return self.op(x, label, weight, num_hidden=self.num_hidden)


@pytest.mark.parametrize("op", TWINS, ids=["mxnet", "numpy"])
@pytest.mark.parametrize("hybridize", [False, True], ids=["nd", "hybridized"])
def test_gluon_deferred_initialisation_completes_and_exports(op, hybridize, tmp_path):
    x, y, _ = _arrays()
    net = Scorer(op, 3, prefix="scorer_")
    net.initialize(mx.init.Xavier())
    if hybridize:
        net.hybridize()
    xs = mx.nd.array(x)
    xs.attach_grad()
    with mx.autograd.record():
        out = net(xs, mx.nd.array(y))
    out.backward()
    w = net.weight.data().asnumpy()
    assert net.weight.shape == (3, 5)
    np.testing.assert_allclose(out.asnumpy(), _reference(x, y, w), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(xs.grad.asnumpy(), np.ones((4, 3)) @ w, rtol=1e-5)
    np.testing.assert_allclose(net.weight.grad().asnumpy(), np.ones((3, 4)) @ x, rtol=1e-5)
    if hybridize:
        net.export(str(tmp_path / "scorer"))
        back = co.imports(
            str(tmp_path / "scorer-symbol.json"),
            ["data0", "data1"],
            str(tmp_path / "scorer-0000.params"),
        )
        np.testing.assert_allclose(
            back(mx.nd.array(x), mx.nd.array(y)).asnumpy(), out.asnumpy(), rtol=1e-6
        )


@pytest.mark.parametrize("op", TWINS, ids=["mxnet", "numpy"])
def test_array_calls_pass_the_weight_as_before(op):
    x, y, w = _arrays()
    for record in (False, True):
        with mx.autograd.record() if record else mx.autograd.pause():
            out = op(mx.nd.array(x), mx.nd.array(y), mx.nd.array(w), num_hidden=3)
        np.testing.assert_allclose(out.asnumpy(), _reference(x, y, w), rtol=1e-5, atol=1e-6)


def test_an_input_nothing_gives_is_named_with_what_to_do():
    s = no_inference(mx.sym.var("data"), mx.sym.var("fc_weight"), name="fc")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        s.infer_shape(data=(4, 5))
    texts = [str(w.message) for w in caught if issubclass(w.category, InputShapeWarning)]
    assert len(texts) == 1
    assert texts[0].startswith(
        "customop 'tests.input_shapes.unknown' (input 'weight'): its shape is unknown"
    )
    assert "pass weight=<shape> to simple_bind" in texts[0]
    assert "infer_input_shape={'weight': lambda data, weight, **params: <shape>}" in texts[0]
    with warnings.catch_warnings(record=True) as caught:  # nothing given: nothing to name
        warnings.simplefilter("always")
        s.infer_shape_partial()
    assert not [w for w in caught if issubclass(w.category, InputShapeWarning)]
    mod = mx.mod.Module(mx.sym.MakeLoss(mx.sym.sum(s)), data_names=["data"], label_names=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InputShapeWarning)
        with pytest.raises(
            ValueError,
            match=r"^customop 'tests.input_shapes.unknown' \(input "
            r"'weight'\): its shape is unknown: nothing in the graph gives it and "
            r"the op does not infer it\. Give it: pass weight=<shape>",
        ):
            mod.bind(data_shapes=[("data", (4, 5))])
    # given, it binds
    ex = s.simple_bind(mx.cpu(), data=(4, 5), fc_weight=(3, 5))
    assert ex.forward()[0].shape == (4, 3)


def test_declarations_are_checked_and_twins_and_variants_keep_them():
    with pytest.raises(
        TypeError,
        match=r"infer_input_shape names 'nope', which is not an input; "
        r"the inputs are x, w",
    ):
        customop("numpy", name="tests.bad_infer_a", infer_input_shape={"nope": len})(lambda x, w: x)
    with pytest.raises(
        TypeError,
        match=r"infer_input_shape names 's', which is an auxiliary "
        r"state",
    ):
        customop(
            "numpy",
            name="tests.bad_infer_b",
            infer_input_shape={"s": len},
            aux={"s": lambda x: (1,)},
        )(lambda x, s: x)
    with pytest.raises(TypeError, match=r"infer_input_shape=\{'w': \.\.\.\} must map"):
        customop("numpy", name="tests.bad_infer_c", infer_input_shape={"w": 3})(lambda x, w: x)
    bad = customop(
        "numpy", name="tests.bad_infer_d", infer_input_shape={"w": lambda x, w: (0, x[1])}
    )(lambda x, w: x)
    with pytest.raises(
        TypeError,
        match=r"customop 'tests.bad_infer_d' \(infer_input_shape for "
        r"input 'w'\): must return a shape of positive ints .*got \(0, 3\)",
    ):
        bad(mx.sym.var("x"), mx.sym.var("w")).infer_shape(x=(2, 3))
    assert "infer_input_shape=[weight]" in repr(scored) and scored.numpy.input_shapes.fns == {
        "weight": _weight_shape
    }


@customop(
    "numpy",
    optional=("bias",),
    infer_input_shape={
        "weight": lambda x, weight, bias, *, units: (units, x[1]),
        "bias": lambda x, weight, bias, *, units: (units,),
    },
)
def affine(x, weight, bias=None, *, units):
    out = x @ weight.T
    return out if bias is None else out + bias


def test_optional_inputs_keep_the_inference_of_the_present_ones():
    with_bias = affine(mx.sym.var("x"), mx.sym.var("w"), mx.sym.var("b"), units=2)
    assert with_bias.infer_shape(x=(4, 3))[0] == [(4, 3), (2, 3), (2,)]
    without = affine(mx.sym.var("x"), mx.sym.var("w"), units=2)
    assert without.infer_shape(x=(4, 3)) == ([(4, 3), (2, 3)], [(4, 2)], [])


@customop("numpy", name="tests.input_shapes.twice")
def twice(x):
    return 2 * x


def test_a_0d_input_under_numpy_shapes_is_not_taken_for_an_unknown_one():
    # Under mx.npx.set_np() semantics, () is a 0-d array, which binds as before.
    class Twice(mx.gluon.HybridBlock):
        def hybrid_forward(self, F, x):
            return twice(x)

    with mx.util.np_shape(True), mx.util.np_array(True), warnings.catch_warnings():
        warnings.simplefilter("error", InputShapeWarning)
        net = Twice()
        net.hybridize()
        assert float(net(mx.np.array(3.0))) == 6.0


class _Deferred(mx.gluon.HybridBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.weight = self.params.get("weight", shape=(3, 0), allow_deferred_init=True)

    def hybrid_forward(self, F, x, weight):
        return no_inference(x, weight)


@pytest.mark.parametrize("hybridize", [False, True], ids=["nd", "hybridized"])
@pytest.mark.parametrize("filters", ["ignore", "always", "default"])
def test_gluon_deferred_initialisation_names_the_op_the_input_and_the_fix(hybridize, filters):
    # MXNet's own text: "list index out of range" under -W ignore (Gluon reads the first
    # warning it recorded, and none was), the Parameter alone with warnings on.
    net = _Deferred()
    net.initialize()
    if hybridize:
        net.hybridize()
    with warnings.catch_warnings():
        warnings.simplefilter(filters)
        with pytest.raises(ValueError) as info:
            net(mx.nd.ones((4, 5)))
    msg = str(info.value)
    assert msg.startswith(
        "Deferred initialization failed because shape cannot be inferred. "
        "customop 'tests.input_shapes.unknown' (input 'weight'): its shape is "
        "unknown (given (3, ?))"
    ), msg
    assert "give its Gluon Parameter a full shape" in msg
    assert "infer_input_shape={'weight': lambda data, weight, **params: <shape>}" in msg
    # the process goes on: with the full shape it runs
    net.weight.shape = (3, 5)
    net.initialize(force_reinit=True)
    assert net(mx.nd.ones((4, 5))).shape == (4, 3)


@pytest.mark.parametrize("off", ["", "gluonshape"])
def test_gluon_deferred_initialisation_under_w_ignore_in_a_fresh_process(off):
    import os
    import sys
    import textwrap
    from pathlib import Path

    code = textwrap.dedent("""
        import mxnet as mx
        from customop import customop
        @customop('mxnet')
        def linear(data, weight):
            return mx.nd.dot(data, weight, transpose_b=True)
        class Net(mx.gluon.HybridBlock):
            def __init__(self, **kw):
                super().__init__(**kw)
                with self.name_scope():
                    self.weight = self.params.get('weight', shape=(10, 0),
                                                  allow_deferred_init=True)
            def hybrid_forward(self, F, x, weight):
                return linear(x, weight)
        net = Net()
        net.initialize()
        try:
            net(mx.nd.ones((4, 5)))
        except ValueError as e:
            print(e)
    """)
    out = fresh.run(
        [sys.executable, "-W", "ignore", "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "CUSTOMOP_RUNTIME_OFF": off},
    )
    if off:  # MXNet's own message: Gluon reads the first recorded warning, and none was
        assert out.stdout.strip() == (
            "Deferred initialization failed because shape cannot be "
            "inferred. list index out of range"
        ), out.stderr[-2000:]
    else:
        assert (
            "customop '__main__.linear' (input 'weight'): its shape is unknown (given "
            "(10, ?))" in out.stdout
        ), out.stdout + out.stderr[-2000:]
