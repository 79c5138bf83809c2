"""Operators without inputs, twins, optional inputs, native recording, reloading, npx."""

import sys
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest

import customop
from customop import check_grad
from customop.dispatch import forced_path
from tests import fresh
from tests.customop import paths, twinops

ROOT = Path(__file__).resolve().parents[2]


# ---- operators without array inputs ------------------------------------------------------
@pytest.mark.parametrize("op", [twinops.grid, twinops.grid.mxnet], ids=lambda o: o.mode)
@pytest.mark.parametrize("path", [None, "custom"])
def test_an_op_without_inputs_returns_ndarrays_on_ctx(op, path):
    want = np.arange(12, dtype=np.float32).reshape(3, 4)
    with forced_path(path):
        out = op(length=3, depth=4)
        assert isinstance(out, mx.nd.NDArray) and out.context == mx.current_context()
        np.testing.assert_array_equal(out.asnumpy(), want)
        out = op(length=3, depth=4, ctx=mx.cpu(1))
        assert out.context == mx.cpu(1)
        with mx.autograd.record():
            out = op(length=3, depth=4)
        np.testing.assert_array_equal(out.asnumpy(), want)


@pytest.mark.parametrize("op", [twinops.grid, twinops.grid.mxnet], ids=lambda o: o.mode)
def test_an_op_without_inputs_through_custom_and_symbols(op):
    want = np.arange(6, dtype=np.float32).reshape(3, 2)
    out = mx.nd.Custom(length=3, depth=2, op_type=op.op_type)
    np.testing.assert_array_equal(out.asnumpy(), want)
    s = mx.sym.Custom(length=3, depth=2, op_type=op.op_type, name="g") + mx.sym.var("x")
    ex = s.simple_bind(mx.cpu(), x=(3, 2))
    ex.arg_dict["x"][:] = 1
    np.testing.assert_array_equal(ex.forward()[0].asnumpy(), want + 1)


def test_an_op_without_inputs_refuses_symbol_keywords():
    with pytest.raises(
        TypeError,
        match=r"customop '.*grid'.*name= names a Symbol node.*"
        r"mx\.sym\.Custom\(op_type=",
    ):
        twinops.grid(length=2, name="g")
    np.testing.assert_array_equal(twinops.grid(length=1, depth=2).asnumpy(), [[0, 1]])


# ---- twins -------------------------------------------------------------------------------
def test_twins_reach_each_other_and_share_one_docstring():
    op = twinops.scaled_square
    assert op.mxnet is op and op.numpy.mxnet is op and op.numpy.numpy is op.numpy
    assert op.numpy.mode == "numpy" and op.mode == "mxnet"
    assert op.numpy.op_type == op.op_type + ".numpy" != op.op_type
    assert op.numpy.__doc__ == op.__doc__ and "scale * x**2" in op.__doc__
    assert 0 in op.numpy.grads and not op.grads  # each twin has its own gradients


@pytest.mark.parametrize("how", paths.ALL)
def test_twins_compute_the_same_values_and_gradients(how):
    x = np.random.normal(size=(3, 4)).astype(np.float32)
    heads = [np.random.normal(size=(3, 4)).astype(np.float32)]
    results = [
        paths.run(op, [x], {"scale": 1.5}, how, heads)
        for op in (twinops.scaled_square, twinops.scaled_square.numpy)
    ]
    for (outs_a, grads_a), (outs_b, grads_b) in [results]:
        np.testing.assert_allclose(outs_a[0], 1.5 * x * x, rtol=1e-6)
        np.testing.assert_allclose(outs_b[0], outs_a[0], rtol=1e-6)
        np.testing.assert_allclose(grads_a[0], 3 * x * heads[0], rtol=1e-5)
        np.testing.assert_allclose(grads_b[0], grads_a[0], rtol=1e-5)


def test_bad_twins_are_refused():
    op = twinops.scaled_square
    with pytest.raises(ValueError, match="already has a 'numpy' implementation"):
        op.twin("numpy")
    with pytest.raises(TypeError, match="twin '.*' must take the same arrays and parameters"):

        @customop.customop("numpy")
        def base(x, k=1.0):
            return x * k

        @base.twin("mxnet")
        def other(x, k=2.0):
            return x * k

    with pytest.raises(AttributeError, match="has no 'numpy'-mode twin"):
        _ = customop.customop("mxnet")(lambda x: x).numpy


def test_a_twins_keyword_only_parameters_take_the_ops_defaults():
    @customop.customop("mxnet")
    def shifted(x, *, shift=2.0, power=3):
        return (x + shift) ** power

    @shifted.twin("numpy")
    def _shifted_numpy(x, *, shift, power=3):  # shift's default is the op's
        return (x + shift) ** power

    x = mx.nd.array([0.5, 1.0])
    want = (x.asnumpy() + 2.0) ** 3
    np.testing.assert_allclose(shifted.numpy(x).asnumpy(), want, rtol=1e-6)
    np.testing.assert_allclose(shifted.numpy(x, shift=1.0).asnumpy(), [3.375, 8.0], rtol=1e-6)
    assert shifted.numpy.signature.defaults == {"shift": 2.0, "power": 3}
    with pytest.raises(TypeError, match="twin '.*' must take the same arrays and parameters"):

        @customop.customop("mxnet")
        def powered(x, *, power=3):
            return x**power

        @powered.twin("numpy")
        def _powered_numpy(x, *, power=4):  # a default it gives must still be the op's
            return x**power

    with pytest.raises(TypeError, match="twin '.*' must take the same arrays and parameters"):

        @customop.customop("mxnet")
        def scaled(x, scale=2.0):  # a positional parameter keeps its default written out
            return x * scale

        @scaled.twin("numpy")
        def _scaled_numpy(x, scale):
            return x * scale


# ---- optional inputs ---------------------------------------------------------------------
@pytest.mark.parametrize("how", paths.ALL)
def test_optional_inputs_may_be_left_out_on_every_path(how):
    op = twinops.weighted_square
    x = np.random.normal(size=(4,)).astype(np.float32)
    w = np.random.uniform(size=(4,)).astype(np.float32)
    heads = [np.ones(4, np.float32)]
    (out,), (gx,) = paths.run(
        op.variant(["x"]) if how == "symbol" else op, [x], {"scale": 2.0}, how, heads
    )
    np.testing.assert_allclose(out, 2 * x * x, rtol=1e-6)
    np.testing.assert_allclose(gx, 4 * x, rtol=1e-6)
    (out,), (gx, gw) = paths.run(op, [x, w], {"scale": 2.0}, how, heads)
    np.testing.assert_allclose(out, 2 * x * x * w, rtol=1e-6)
    np.testing.assert_allclose(gx, 4 * x * w, rtol=1e-6)
    np.testing.assert_allclose(gw, 2 * x * x, rtol=1e-6)


def test_optional_inputs_with_symbols_and_check_grad():
    op = twinops.weighted_square
    assert op(mx.sym.var("x"), scale=2.0).list_arguments() == ["x"]
    assert op(mx.sym.var("x"), mx.sym.var("w")).list_arguments() == ["x", "w"]
    assert op(mx.sym.var("x"), weight=mx.sym.var("w")).list_arguments() == ["x", "w"]
    x = np.random.normal(size=(3,)).astype(np.float64)
    assert check_grad(op, x, scale=2.0).passed
    assert check_grad(op, x, np.random.uniform(size=3)).passed


def test_bad_optional_declarations():
    with pytest.raises(TypeError, match="optional input 'w' must default to None"):
        customop.customop("numpy", optional=("w",))(lambda x, w=1.0: x)
    with pytest.raises(TypeError, match="optional= names 'v'"):
        customop.customop("numpy", optional=("v",))(lambda x, w=None: x)


# ---- native recording --------------------------------------------------------------------
def test_mxnet_ops_without_def_grad_record_natively():
    op = twinops.scaled_square
    assert op.records_natively and not op.numpy.records_natively
    x = mx.nd.array([1.0, -2.0, 3.0])
    x.attach_grad()
    seen = []
    original = mx.base._LIB.MXCustomFunctionRecord

    class Spy:
        def __call__(self, *a):
            seen.append(a)
            return original(*a)

    mx.base._LIB.MXCustomFunctionRecord = Spy()
    try:
        with mx.autograd.record():
            y = op(x, scale=2.0)
    finally:
        mx.base._LIB.MXCustomFunctionRecord = original
    y.backward()
    assert not seen  # no callback node was recorded
    np.testing.assert_allclose(x.grad.asnumpy(), [4.0, -8.0, 12.0])


@pytest.mark.parametrize("grad_req", ["write", "add"])
def test_native_function_and_custom_paths_agree(grad_req):
    x = np.random.normal(size=(5, 2)).astype(np.float32)
    heads = [np.random.normal(size=(5, 2)).astype(np.float32)]
    ref = paths.run(
        twinops.scaled_square, [x], {"scale": 0.5}, "native", heads, grad_req=grad_req, repeat=2
    )
    for how in ("function", "custom", "symbol"):
        outs, grads = paths.run(
            twinops.scaled_square, [x], {"scale": 0.5}, how, heads, grad_req=grad_req, repeat=2
        )
        np.testing.assert_allclose(outs[0], ref[0][0], rtol=1e-6)
        np.testing.assert_allclose(grads[0], ref[1][0], rtol=1e-6)


# ---- reloading exported models -----------------------------------------------------------
def _export(tmp_path):
    class Net(mx.gluon.HybridBlock):
        def hybrid_forward(self, F, x):
            return twinops.scaled_square.numpy(twinops.weighted_square(x), scale=3.0)

    net = Net()
    net.hybridize()
    x = mx.nd.array([[1.0, 2.0]])
    want = net(x).asnumpy()
    net.export(str(tmp_path / "m"))
    return want


def _run(code):
    return fresh.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )


def test_imports_and_load_checkpoint_import_the_modules_the_caller_names(tmp_path):
    want = _export(tmp_path)
    code = (
        "import sys, mxnet as mx, customop\n"
        f"net = customop.imports({str(tmp_path / 'm-symbol.json')!r}, ['data'],\n"
        "                       modules=['tests.customop.twinops'])\n"
        "print(net(mx.nd.array([[1.0, 2.0]])).asnumpy().tolist())\n"
        "assert 'tests.customop.twinops' in sys.modules\n"
        f"sym, args, aux = customop.load_checkpoint({str(tmp_path / 'm')!r}, 0)\n"
        "print(sym.list_arguments())\n"
    )
    out = _run(code)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    np.testing.assert_allclose(np.array(eval(lines[0])), want, rtol=1e-6)
    assert lines[1] == "['data']"


def test_a_missing_operator_is_named_before_mxnet_fails(tmp_path):
    _export(tmp_path)
    text = (tmp_path / "m-symbol.json").read_text()
    (tmp_path / "m-symbol.json").write_text(
        text.replace("tests.customop.twinops.scaled_square.numpy", "gone_module.sq")
    )
    code = (
        "import mxnet as mx, customop\n"
        f"customop.imports({str(tmp_path / 'm-symbol.json')!r}, ['data'],\n"
        "                 modules=['tests.customop.twinops'])\n"
    )  # weighted_square's
    out = _run(code)
    assert out.returncode != 0
    assert "'gone_module.sq': no imported or found module among 'gone_module'" in out.stderr
    assert "Cannot find custom operator" not in out.stderr


# ---- MXNet's NumPy interface -------------------------------------------------------------
NPX_CODE = """
import os, sys, tempfile
import mxnet as mx, numpy as np
from mxnet import npx
import customop
from tests.customop import twinops
npx.set_np()
for op in (twinops.scaled_square, twinops.scaled_square.numpy):
    class Net(mx.gluon.HybridBlock):
        def __init__(self):
            super().__init__()
            self.dense = mx.gluon.nn.Dense(2, in_units=3)
        def hybrid_forward(self, F, x):
            return op(self.dense(x), scale=2.0)
    x = mx.np.array(np.random.normal(size=(4, 3)), dtype="float32")
    with mx.autograd.record():
        y = op(x, scale=2.0)
    assert isinstance(y, mx.np.ndarray), type(y)
    outs, grads = [], []
    net = Net()
    net.initialize()
    for hybrid in (False, True):
        if hybrid:
            net.hybridize()
        xg = x.copy()
        xg.attach_grad()
        with mx.autograd.record():
            y = net(xg)
        y.backward()
        assert isinstance(y, mx.np.ndarray), type(y)
        outs.append(y.asnumpy())
        grads.append(xg.grad.asnumpy())
    w = net.dense.weight.data().asnumpy()
    h = x.asnumpy() @ w.T + net.dense.bias.data().asnumpy()
    for out, grad in zip(outs, grads):
        np.testing.assert_allclose(out, 2 * h * h, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(grad, (4 * h) @ w, rtol=1e-5, atol=1e-6)
    d = tempfile.mkdtemp()
    net.export(os.path.join(d, 'n'))
    back = customop.imports(os.path.join(d, 'n-symbol.json'), ['data'],
                            os.path.join(d, 'n-0000.params'))
    np.testing.assert_allclose(back(x).asnumpy(), outs[1], rtol=1e-5, atol=1e-6)
print('ok')
"""


def test_numpy_interface_imperative_hybridized_and_exported():
    out = _run(NPX_CODE)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("ok")
