"""One gradient closure for several inputs (def_grad(fn, argnum=(0, 2))): called once per
backward on every path that runs a Custom node (graph paths that inline the op, issue 33, call it
only while tracing), mixed with single closures, checked by check_grad, kept by twins and
optional-input variants."""

import mxnet as mx
import numpy as np
import pytest

from customop import customop
from customop.check import check_grad
from customop.dispatch import forced_path
from tests.customop import paths

CALLS = []  # one entry per call of a joint closure's grad(g)


def _bilinear_numpy(ans, x, y, w, *, k=1.0):
    # d/dx (k sum_j x_ij w_j y_ij) = k w y; d/dw = k sum_i x y; the product is shared
    def grad(g):
        CALLS.append("numpy")
        shared = k * g[:, None]
        return shared * w * y, (shared * x * y).sum(axis=0)

    return grad


@customop("numpy")
def bilinear(x, y, w, *, k=1.0):
    """``k * sum_j x_ij y_ij w_j`` per row."""
    return k * (x * y * w).sum(axis=1)


bilinear.def_grad(_bilinear_numpy, argnum=(0, 2))
bilinear.def_grad(lambda ans, x, y, w, *, k=1.0: lambda g: k * g[:, None] * x * w, argnum=1)


@bilinear.twin("mxnet")
def _bilinear_nd(x, y, w, *, k=1.0):
    return k * mx.nd.broadcast_mul(x * y, w.reshape((1, -1))).sum(axis=1)


def _bilinear_nd_grad(ans, x, y, w, *, k=1.0):
    def grad(g):
        CALLS.append("mxnet")
        shared = k * g.reshape((-1, 1))
        return (mx.nd.broadcast_mul(shared * y, w.reshape((1, -1))), (shared * x * y).sum(axis=0))

    return grad


bilinear.mxnet.def_grad(_bilinear_nd_grad, argnum=(0, 2))  # y: automatic (mx.autograd)


def _arrays(seed=0):
    rng = np.random.RandomState(seed)
    return [rng.normal(size=(4, 3)), rng.normal(size=(4, 3)), rng.normal(size=(3,))]


def _inlined(op, how="hybridized"):
    """Whether a graph path runs ``op`` as MXNet operators (its closure traced, not called)."""
    if how not in ("symbol", "hybridized", "module", "exported", "graph"):
        return False
    import customop as co

    x, y, w = [a.astype(np.float32) for a in _arrays()]
    return co.explain(op, x, y, w, k=2.0).inlines


def _reference(x, y, w, k, head):
    g = head[:, None]
    return k * g * w * y, k * g * x * w, k * (g * x * y).sum(axis=0)


TWINS = [bilinear, bilinear.mxnet]


@pytest.mark.parametrize("op", TWINS, ids=["numpy", "mxnet"])
@pytest.mark.parametrize("how", paths.ALL)
def test_the_joint_closure_runs_once_per_backward_on_every_path(op, how):
    arrays = [a.astype(np.float32) for a in _arrays()]
    head = np.random.RandomState(1).normal(size=4).astype(np.float32)
    expected = [] if _inlined(op, how) else [op.mode] * 3
    paths.run(op, arrays, {"k": 0.5}, how=how, heads=[head])  # a graph is traced once
    del CALLS[:]
    _, grads = paths.run(op, arrays, {"k": 0.5}, how=how, heads=[head], repeat=3)
    # three backward passes, one call each (none when the graph runs it as MXNet operators)
    assert CALLS == expected
    for got, want in zip(grads, _reference(*arrays, 0.5, head)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


class Head(mx.gluon.HybridBlock):
    def __init__(self, op, **kwargs):
        super().__init__(**kwargs)
        self.op = op
        with self.name_scope():
            self.w = self.params.get("w", shape=(3,), init=mx.init.Constant(0.5))

    def hybrid_forward(self, F, x, y, w):
        return self.op(x, y, w, k=2.0)


@pytest.mark.parametrize("op", TWINS, ids=["numpy", "mxnet"])
def test_hybridized_and_module_training_call_it_once_per_step(op):
    x, y, _ = [a.astype(np.float32) for a in _arrays()]
    per_step = [] if _inlined(op) else [op.mode]
    net = Head(op)
    net.initialize()
    net.hybridize()
    for step in range(3):
        if step == 1:
            mx.nd.waitall()
            del CALLS[:]  # (the first call traces the op when it inlines)
        xs = mx.nd.array(x)
        xs.attach_grad()
        with mx.autograd.record():
            out = net(xs, mx.nd.array(y))
        out.backward()
    mx.nd.waitall()
    assert CALLS == per_step * 2
    _, want_y, want_w = _reference(x, y, np.full(3, 0.5), 2.0, np.ones(4))
    np.testing.assert_allclose(
        net.w.grad().asnumpy(), _reference(x, y, np.full(3, 0.5), 2.0, np.ones(4))[2], rtol=1e-5
    )
    data, label = mx.sym.var("data"), mx.sym.var("y")
    out = op(data, label, mx.sym.var("w", shape=(3,), init=mx.init.Constant(0.5)), k=2.0)
    mod = mx.mod.Module(
        mx.sym.MakeLoss(mx.sym.sum(out)), data_names=["data", "y"], label_names=None
    )
    mod.bind(data_shapes=[("data", x.shape), ("y", y.shape)], inputs_need_grad=True)
    mod.init_params()
    del CALLS[:]
    mod.forward_backward(mx.io.DataBatch([mx.nd.array(x), mx.nd.array(y)]))
    grads = [g.asnumpy() for g in mod.get_input_grads()]
    assert CALLS == per_step
    np.testing.assert_allclose(grads[1], want_y, rtol=1e-5)
    mod.init_optimizer(optimizer_params={"learning_rate": 1.0, "rescale_grad": 1.0})
    mod.update()
    np.testing.assert_allclose(mod.get_params()[0]["w"].asnumpy(), 0.5 - want_w, rtol=1e-5)


@pytest.mark.parametrize("op", TWINS, ids=["numpy", "mxnet"])
def test_check_grad_checks_joint_and_single_closures(op):
    x, y, w = _arrays()
    report = check_grad(op, x, y, w, k=1.5)
    checked = {r.input for r in report.rows if r.status == "ok" and r.comparison}
    assert report.passed and checked == {"x", "y", "w"}
    assert check_grad(op, x, y, w, argnums=["w"], k=1.5).passed  # only one of the joint pair


def test_a_wrong_joint_gradient_fails_check_grad():
    op = customop("numpy", name="tests.joint_wrong")(lambda x, w: (x * w).sum(axis=1))
    op.def_grad(
        lambda ans, x, w: lambda g: (g[:, None] * w, (g[:, None] * x).sum(0) * 2), argnum=(0, 1)
    )
    with pytest.raises(AssertionError, match=r"w .*FAIL"):
        check_grad(op, *_arrays()[::2])


def test_joint_registration_rules_and_messages():
    op = customop("numpy", name="tests.joint_rules")(lambda a, b, c: a * b * c)
    for bad, cls, match in [
        (
            (0, 3),
            IndexError,
            r"argnum=\(0, 3\) is out of range; the inputs "
            r"are 0=a, 1=b, 2=c",
        ),
        ((), ValueError, r"argnum=\(\) names no input"),
        ((1, 1), ValueError, r"argnum=\(1, 1\) names an input twice"),
    ]:
        with pytest.raises(cls, match=rf"customop 'tests.joint_rules': def_grad {match}"):
            op.def_grad(lambda ans, a, b, c: lambda g: (g, g), argnum=bad)
    op.def_grad(lambda ans, a, b, c: lambda g: g * b * c, argnum=0)
    op.def_grad(lambda ans, a, b, c: lambda g: (g * a * b, None), argnum=(2, 1))  # None: zero
    assert "def_grad=[a, (c, b)]" in repr(op)
    a, b, c = (np.full(3, v, np.float32) for v in (2.0, 3.0, 5.0))
    _, grads = paths.run(op, [a, b, c])
    np.testing.assert_allclose(grads[0], b * c)
    np.testing.assert_allclose(grads[1], 0)
    np.testing.assert_allclose(grads[2], a * b)
    op.def_grad(lambda ans, a, b, c: lambda g: g * a * b, argnum=2)  # replaces c's part only
    assert "def_grad=[a, (b), c]" in repr(op)
    _, grads = paths.run(op, [a, b, c])
    np.testing.assert_allclose(grads[1], 0)
    np.testing.assert_allclose(grads[2], a * b)
    wrong = customop("numpy", name="tests.joint_short")(lambda a, b: a * b)
    wrong.def_grad(lambda ans, a, b: lambda g: g * b, argnum=(0, 1))
    with pytest.raises(
        TypeError,
        match=r"customop 'tests.joint_short' \(gradient for inputs 'a', "
        r"'b'\): a closure registered with def_grad\(argnum=\(0, 1\)\) returns a "
        r"tuple of 2 gradients in that order \(None for zero\); it returned a "
        r"ndarray",
    ):
        paths.run(wrong, [a, b])


@customop("numpy", optional=("bias",))
def shifted(x, w, bias=None):
    out = x * w
    return out if bias is None else out + bias


def _shifted_grad(ans, x, w, bias=None):
    def grad(g):
        CALLS.append("shifted")
        return g * w, g * x, (None if bias is None else g)

    return grad


shifted.def_grad(_shifted_grad, argnum=(0, 1, 2))


def test_optional_input_variants_adopt_the_joint_closure():
    x, w, bias = (np.full(3, v, np.float32) for v in (2.0, 3.0, 5.0))
    for how in paths.ALL:
        del CALLS[:]
        out, grads = paths.run(shifted, [x, w, bias], how=how)
        np.testing.assert_allclose(out[0], x * w + bias)
        np.testing.assert_allclose(grads[0], w)
        np.testing.assert_allclose(grads[1], x)
        np.testing.assert_allclose(grads[2], 1)
        assert CALLS == ["shifted"]
    for how in paths.IMPERATIVE:  # the variant without bias
        del CALLS[:]
        xs, ws = mx.nd.array(x), mx.nd.array(w)
        xs.attach_grad()
        ws.attach_grad()
        with forced_path(how), mx.autograd.record():
            out = shifted(xs, ws)
        out.backward()
        np.testing.assert_allclose(xs.grad.asnumpy(), w)
        np.testing.assert_allclose(ws.grad.asnumpy(), x)
        assert CALLS == ["shifted"]
    del CALLS[:]
    ex = shifted(mx.sym.var("x"), mx.sym.var("w")).simple_bind(mx.cpu(), x=(3,), w=(3,))
    ex.arg_dict["x"][:] = x
    ex.arg_dict["w"][:] = w
    ex.forward(is_train=True)
    ex.backward(mx.nd.ones(3))
    np.testing.assert_allclose(ex.grad_dict["w"].asnumpy(), x)
    assert CALLS == ["shifted"]
    variant = shifted.variant(["x", "w"])
    assert variant.grad_groups[0] is variant.grad_groups[1]
    assert "def_grad=[(x, w)]" in repr(variant)
    assert check_grad(shifted, x.astype(np.float64), w.astype(np.float64)).passed


@pytest.mark.parametrize("op", TWINS, ids=["numpy", "mxnet"])
def test_an_exported_and_reloaded_block_trains_with_the_joint_closure(op, tmp_path):
    import customop as co

    x, y, _ = [a.astype(np.float32) for a in _arrays()]
    per_step = [] if _inlined(op) else [op.mode]
    net = Head(op, prefix="head_")
    net.initialize()
    net.hybridize()
    net(mx.nd.array(x), mx.nd.array(y))
    net.export(str(tmp_path / "head"))
    back = co.imports(
        str(tmp_path / "head-symbol.json"), ["data0", "data1"], str(tmp_path / "head-0000.params")
    )
    for step in range(2):
        if step == 1:
            mx.nd.waitall()
            del CALLS[:]  # (the first call traces the op when it inlines)
        with mx.autograd.record():
            out = back(mx.nd.array(x), mx.nd.array(y))
        out.backward()
    mx.nd.waitall()
    assert CALLS == per_step
    (w,) = [p for p in back.collect_params().values() if p.name.endswith("w")]
    np.testing.assert_allclose(
        w.grad().asnumpy(), _reference(x, y, np.full(3, 0.5), 2.0, np.ones(4))[2], rtol=1e-5
    )
