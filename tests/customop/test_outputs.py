"""Several outputs: one Symbol per node (as MXNet's own multi-output ops), named outputs,
tuples of arrays imperatively; on the nd, symbol/Module, hybridized and exported paths."""

import mxnet as mx
import numpy as np
import pytest

import customop as co
from customop import customop
from customop.check import check_grad
from customop.dispatch import forced_path
from tests.customop import paths


@customop("numpy", outputs=("low", "high"))
def split_at(x, *, at=1):
    """The columns before ``at`` and from ``at`` on, each scaled: (2 x[:, :at], 3 x[:, at:])."""
    return 2 * x[:, :at], 3 * x[:, at:]


split_at.def_grad(lambda ans, x, *, at=1: lambda g: np.concatenate([2 * g[0], 3 * g[1]], axis=1))


@split_at.twin("mxnet")
def _split_at_nd(x, *, at=1):
    return 2 * x[:, :at], 3 * x[:, at:]


@customop(
    "mxnet",
    outputs=lambda ret_typ="both": ("value", "indices") if ret_typ == "both" else (ret_typ,),
)
def top1(x, *, ret_typ="both"):
    """The largest element of each row and its index (named after what is returned)."""
    value = x.max(axis=1)
    indices = x.argmax(axis=1)
    if ret_typ == "both":
        return value, indices
    return value if ret_typ == "value" else indices


def _x():
    return np.random.RandomState(0).normal(size=(3, 4)).astype(np.float32)


def _want(x, at=1):
    return 2 * x[:, :at], 3 * x[:, at:]


@pytest.mark.parametrize("op", [split_at, split_at.mxnet], ids=["numpy", "mxnet"])
def test_a_symbol_call_returns_one_node_with_every_output(op):
    s = op(mx.sym.var("x"), at=1, name="cut")
    native = mx.sym.topk(mx.sym.var("x"), ret_typ="both", name="top")
    # a Symbol as MXNet's are (its subclass only indexes s[-1] as Python does)
    assert isinstance(s, mx.sym.Symbol) and type(native) is mx.sym.Symbol
    assert len(s) == 2 and s.list_outputs() == ["cut_low", "cut_high"]
    assert s[1].list_outputs() == ["cut_high"] and s["cut_low"].list_outputs() == ["cut_low"]
    assert [o.list_outputs() for o in s] == [["cut_low"], ["cut_high"]]
    low, high = s  # unpacks like the tuple it was before
    assert (low.list_outputs(), high.list_outputs()) == (["cut_low"], ["cut_high"])
    assert s.infer_shape(x=(3, 4))[1] == [(3, 1), (3, 3)]
    x = _x()
    ex = s.simple_bind(mx.cpu(), x=x.shape)  # binds as it is, no mx.sym.Group
    ex.arg_dict["x"][:] = x
    outs = ex.forward(is_train=True)
    for got, want in zip(outs, _want(x)):
        np.testing.assert_allclose(got.asnumpy(), want, rtol=1e-6)
    ex.backward([mx.nd.ones((3, 1)), mx.nd.full((3, 3), 2.0)])
    np.testing.assert_allclose(
        ex.grad_dict["x"].asnumpy(), np.concatenate([np.full((3, 1), 2.0), np.full((3, 3), 6.0)], 1)
    )


@pytest.mark.parametrize("op", [split_at, split_at.mxnet], ids=["numpy", "mxnet"])
def test_array_calls_still_return_a_tuple_of_arrays(op):
    x = _x()
    for how in ("direct", *paths.IMPERATIVE):
        with forced_path(how), mx.autograd.record() if how != "direct" else mx.autograd.pause():
            out = op(mx.nd.array(x), at=2)
        assert isinstance(out, tuple) and len(out) == 2
        for got, want in zip(out, _want(x, 2)):
            np.testing.assert_allclose(got.asnumpy(), want, rtol=1e-6)
    out = op(x, at=2)  # NumPy in, NumPy out
    assert isinstance(out, tuple) and all(isinstance(o, np.ndarray) for o in out)


def test_names_and_counts_follow_a_parameter():
    both = top1(mx.sym.var("x"), name="t")
    assert both.list_outputs() == ["t_value", "t_indices"]
    one = top1(mx.sym.var("x"), ret_typ="indices", name="u")
    assert one.list_outputs() == ["u_indices"] and len(one) == 1
    x = _x()
    value, indices = top1(mx.nd.array(x))
    np.testing.assert_array_equal(indices.asnumpy(), x.argmax(axis=1))
    np.testing.assert_allclose(value.asnumpy(), x.max(axis=1))
    assert top1(mx.nd.array(x), ret_typ="value").shape == (3,)
    assert "outputs=by parameters" in repr(top1)
    assert "outputs=(low, high)" in repr(split_at)


def test_check_grad_and_the_module_path_take_the_node_as_it_is():
    x = _x().astype(np.float64)
    assert check_grad(split_at, x, at=1).passed
    assert check_grad(split_at(mx.sym.var("x"), at=3), x).passed  # the Symbol itself
    data = mx.sym.var("data")
    low, high = split_at(data, at=1, name="cut")
    mod = mx.mod.Module(
        mx.sym.MakeLoss(mx.sym.sum(low) + 2 * mx.sym.sum(high)),
        data_names=["data"],
        label_names=None,
    )
    mod.bind(data_shapes=[("data", (3, 4))], inputs_need_grad=True)
    mod.init_params()
    mod.forward_backward(mx.io.DataBatch([mx.nd.array(x)]))
    np.testing.assert_allclose(
        mod.get_input_grads()[0].asnumpy(),
        np.concatenate([np.full((3, 1), 2.0), np.full((3, 3), 6.0)], 1),
    )


class Halves(mx.gluon.HybridBlock):
    """Returns both outputs of the op, and a sum built from its unpacked outputs."""

    def __init__(self, op, **kwargs):
        super().__init__(**kwargs)
        self.op = op

    def hybrid_forward(self, F, x):
        low, high = self.op(x, at=1)
        return self.op(x, at=3), F.sum(low) + F.sum(high)


@pytest.mark.parametrize("op", [split_at, split_at.mxnet], ids=["numpy", "mxnet"])
def test_a_hybridized_block_returning_the_outputs_works_and_exports(op, tmp_path):
    x = _x()
    net = Halves(op)
    got = {}
    for hybrid in (False, True):
        if hybrid:
            net.hybridize()
        xs = mx.nd.array(x)
        xs.attach_grad()
        with mx.autograd.record():
            (a, b), total = net(xs)
        mx.autograd.backward([a, b, total])
        got[hybrid] = [a.asnumpy(), b.asnumpy(), total.asnumpy(), xs.grad.asnumpy()]
    want_a, want_b = _want(x, 3)
    for hybrid in (False, True):
        np.testing.assert_allclose(got[hybrid][0], want_a, rtol=1e-6)
        np.testing.assert_allclose(got[hybrid][1], want_b, rtol=1e-6)
        np.testing.assert_allclose(
            got[hybrid][2], [2 * x[:, :1].sum() + 3 * x[:, 1:].sum()], rtol=1e-5
        )
        # d/dx of sum(a) + sum(b) + total: 2 + 2 on column 0, 2 + 3 on 1, 2, then 3 + 3
        np.testing.assert_allclose(got[hybrid][3], np.tile([4, 5, 5, 6], (3, 1)), rtol=1e-6)
    net.export(str(tmp_path / "halves"))
    back = co.imports(str(tmp_path / "halves-symbol.json"), ["data"])
    outs = back(mx.nd.array(x))
    assert len(outs) == 3
    np.testing.assert_allclose(outs[1].asnumpy(), want_b, rtol=1e-6)
    sym = mx.sym.load(str(tmp_path / "halves-symbol.json"))
    assert any(name.endswith("_high") for name in sym.list_outputs())


def test_the_numpy_interface_gets_one_symbol_too():
    s = split_at(mx.sym.var("x").as_np_ndarray(), at=1, name="npcut")
    assert isinstance(s, mx.sym.np._Symbol) and len(s) == 2


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(outputs=("a", "a")), "a name repeats"),
        (dict(outputs=("a", "")), "is not a non-empty string"),
        (dict(outputs=()), "none given"),
        (dict(outputs=("a", "b"), num_outputs=3), r"num_outputs=3 but outputs= names 2"),
        (dict(outputs=lambda nope: ("a",)), "outputs= takes 'nope', which is not a parameter"),
    ],
)
def test_bad_output_names_are_refused_naming_the_op(bad, match):
    with pytest.raises(TypeError, match=rf"customop 'tests.bad_names': .*{match}"):
        customop("numpy", name="tests.bad_names", **bad)(lambda x, k=1: (x, x))


def test_a_forward_returning_another_count_names_the_outputs():
    op = customop("numpy", name="tests.three_named", outputs=("a", "b", "c"))(lambda x: (x, x))
    with pytest.raises(
        TypeError,
        match=r"returned 2 output\(s\) but the op declares 3 \('a', "
        r"'b', 'c', outputs=\)",
    ):
        op(np.ones(2))


@customop("numpy", optional=("b",))
def pair_maybe_shifted(x, b=None):
    """Two outputs, counted from the return statement; the variant without ``b`` keeps both."""
    return 2 * x, (x if b is None else x + b)


@customop("mxnet", optional=("b",), outputs=("p", "q"))
def named_pair(x, b=None):
    return 2 * x, (x if b is None else x + b)


def test_variants_and_twins_keep_the_count_and_the_names():
    assert pair_maybe_shifted.variant(["x"]).num_outputs == pair_maybe_shifted.num_outputs == 2
    assert len(pair_maybe_shifted(mx.sym.var("x"))) == 2
    a, b = pair_maybe_shifted(np.ones(2))
    np.testing.assert_array_equal(a, [2, 2])
    assert named_pair(mx.sym.var("x"), name="n").list_outputs() == ["n_p", "n_q"]
    assert named_pair(mx.sym.var("x"), mx.sym.var("b"), name="m").list_outputs() == ["m_p", "m_q"]
    assert split_at.mxnet.outputs.names({}) == ("low", "high")


def test_a_negative_index_on_a_several_output_symbol_indexes_as_python_does():
    # MXNet's Symbol.__getitem__ passes -1 to C as 4294967295 ("Check failed: index <
    # nreturn"), for its own multi-output operators too; our nodes index as Python does.
    @customop("numpy", name="tests.outputs.negative_index", outputs=("low", "high"))
    def split_sign(x):
        return np.minimum(x, 0), np.maximum(x, 0)

    s = split_sign(mx.sym.var("x"), name="sp")
    assert s[-1].list_outputs() == ["sp_high"] == s[1].list_outputs()
    assert s[-2].list_outputs() == ["sp_low"]
    for bad in (2, -3):
        with pytest.raises(
            IndexError, match=f"output index {bad} is out of range for a node with 2 outputs"
        ):
            s[bad]
    low, high = s
    assert [o.list_outputs() for o in (low, high)] == [["sp_low"], ["sp_high"]]
    out = (
        mx.sym.Group([s[-1] * 2, s[0]])
        .simple_bind(mx.cpu(), x=(3,))
        .forward(x=mx.nd.array([-1.0, 0.5, 2.0]))
    )
    np.testing.assert_allclose(out[0].asnumpy(), [0.0, 1.0, 4.0])
    np.testing.assert_allclose(out[1].asnumpy(), [-1.0, 0.0, 0.0])
    # MXNet's own Symbols keep MXNet's class and behaviour
    assert type(mx.sym.topk(mx.sym.var("x"), ret_typ="both")) is mx.sym.Symbol
    assert type(split_sign(mx.sym.var("y"))[0]) is mx.sym.Symbol

    class Block(mx.gluon.HybridBlock):
        def hybrid_forward(self, F, x):
            return split_sign(x)[-1]

    net = Block()
    net.hybridize()
    np.testing.assert_allclose(net(mx.nd.array([-1.0, 3.0])).asnumpy(), [0.0, 3.0])
