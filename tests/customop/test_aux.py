"""Auxiliary states: declared with aux=, updated in place, exact on every call style."""

import sys
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest

from customop import customop
from customop.dispatch import forced_path
from tests import fresh
from tests.customop import auxops

ROOT = Path(__file__).resolve().parents[2]
STEPS = 5
OPS = [auxops.counted, auxops.counted_nd]


@pytest.mark.parametrize("op", OPS, ids=lambda o: o.mode)
@pytest.mark.parametrize("path", ["function", "custom"])
def test_backward_updates_are_exact_imperatively(op, path):
    for trial in range(3):  # the race MXNet has here shows up within a few runs
        count = mx.nd.zeros((1,))
        x = mx.nd.ones((4,))
        x.attach_grad()
        with forced_path(path):
            for step in range(STEPS):
                with mx.autograd.record():
                    y = op(x, count)
                y.backward()
                assert count.asscalar() == step + 1, (trial, step)
        np.testing.assert_array_equal(x.grad.asnumpy(), 2)


@pytest.mark.parametrize("op", OPS, ids=lambda o: o.mode)
def test_symbol_creates_the_aux_variable_and_the_executor_counts(op):
    s = op(mx.sym.var("x"), name="cnt")
    assert s.list_arguments() == ["x"]
    assert s.list_auxiliary_states() == ["cnt_count"]
    ex = s.simple_bind(mx.cpu(), x=(4,))
    assert ex.aux_dict["cnt_count"].shape == (1,)
    for step in range(STEPS):
        ex.forward(is_train=True)
        ex.backward(mx.nd.ones((4,)))
        assert ex.aux_dict["cnt_count"].asscalar() == step + 1
    ex.forward(is_train=False)  # inference runs no backward: no update
    assert ex.aux_dict["cnt_count"].asscalar() == STEPS


def test_unnamed_symbol_nodes_get_distinct_aux_names():
    a = auxops.counted(mx.sym.var("x"))
    b = auxops.counted(a)
    aux = b.list_auxiliary_states()
    assert len(aux) == 2 and len(set(aux)) == 2 and all(n.endswith("_count") for n in aux)


def _module(op, tmp_path=None):
    data = mx.sym.var("data")
    out = op(mx.sym.FullyConnected(data, num_hidden=3, name="fc"), name="cnt")
    mod = mx.mod.Module(mx.sym.MakeLoss(mx.sym.sum(out)), data_names=["data"], label_names=None)
    mod.bind(data_shapes=[("data", (2, 4))])
    mod.init_params(mx.init.Xavier())  # must accept cnt_count (zeros initializer)
    mod.init_optimizer(optimizer_params={"learning_rate": 0.01})
    return mod


@pytest.mark.parametrize("op", OPS, ids=lambda o: o.mode)
def test_module_aux_params_and_checkpoint(op, tmp_path):
    mod = _module(op)
    assert mod.get_params()[1]["cnt_count"].asscalar() == 0
    batch = mx.io.DataBatch([mx.nd.ones((2, 4))])
    for _ in range(STEPS):
        mod.forward_backward(batch)
        mod.update()
    assert mod.get_params()[1]["cnt_count"].asscalar() == STEPS
    prefix = str(tmp_path / "counted")
    mod.save_checkpoint(prefix, 1)
    _, args, auxs = mx.model.load_checkpoint(prefix, 1)
    assert auxs["cnt_count"].asscalar() == STEPS and "fc_weight" in args


@pytest.mark.parametrize("op", OPS, ids=lambda o: o.mode)
@pytest.mark.parametrize("hybrid", [False, True])
def test_gluon_block_owns_the_state_as_a_parameter(op, hybrid):
    net = auxops.CountedBlock(op)
    net.initialize()
    if hybrid:
        net.hybridize()
    assert net.count.grad_req == "null"
    x = mx.nd.ones((2, 4))
    for step in range(STEPS):
        with mx.autograd.record():
            y = net(x)
        y.backward()
        assert net.count.data().asscalar() == step + 1


def test_export_keeps_the_state_and_reloads(tmp_path):
    net = auxops.CountedBlock()
    net.initialize()
    net.hybridize()
    x = mx.nd.ones((2, 4))
    for _ in range(3):
        with mx.autograd.record():
            y = net(x)
        y.backward()
    net.export(str(tmp_path / "net"))
    want = net(x).asnumpy()
    code = (
        "import mxnet as mx, numpy as np, customop\n"
        f"net = customop.imports({str(tmp_path / 'net-symbol.json')!r}, ['data'], "
        f"{str(tmp_path / 'net-0000.params')!r}, modules=['tests.customop.auxops'])\n"
        "aux = [p for n, p in net.collect_params().items() if n.endswith('count')]\n"
        "print(aux[0].data().asscalar())\n"
        "print(net(mx.nd.ones((2, 4))).asnumpy().tolist())\n"
    )
    out = fresh.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    count, got = out.stdout.strip().splitlines()
    assert float(count) == 3
    np.testing.assert_allclose(np.array(eval(got)), want, rtol=1e-6)


@pytest.mark.parametrize("path", ["direct", "function", "custom", "symbol"])
def test_forward_sees_training_mode(path):
    seen = mx.nd.zeros((1,))
    x = mx.nd.ones((3,))
    if path == "symbol":
        ex = auxops.training_forwards(mx.sym.var("x"), name="t").simple_bind(mx.cpu(), x=(3,))
        ex.forward(is_train=True)
        ex.forward(is_train=False)
        assert ex.aux_dict["t_seen"].asscalar() == 1
        return
    with forced_path(path):
        if path == "direct":
            auxops.training_forwards(x, seen)  # not recording: inference
            with mx.autograd.train_mode():
                auxops.training_forwards(x, seen)
        else:
            with mx.autograd.record():
                auxops.training_forwards(x, seen)
            with mx.autograd.record(train_mode=False):
                auxops.training_forwards(x, seen)
    mx.nd.waitall()
    assert seen.asscalar() == 1


@pytest.mark.parametrize("how", ["function", "custom", "symbol"])
def test_several_samples_of_one_class_all_reach_the_state(how):
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    label = np.array([1, 1, 1, 0], dtype=np.float32)
    want = np.zeros((3, 3))
    np.add.at(want, label.astype(int), x)  # the reference: every sample counted
    if how == "symbol":
        s = auxops.class_sums(mx.sym.var("x"), mx.sym.var("label"), name="cs")
        ex = s.simple_bind(mx.cpu(), grad_req={"x": "write", "label": "null"}, x=(4, 3), label=(4,))
        ex.arg_dict["x"][:] = x
        ex.arg_dict["label"][:] = label
        ex.forward(is_train=True)
        ex.backward(mx.nd.ones((4,)))
        got = ex.aux_dict["cs_sums"].asnumpy()
    else:
        sums = mx.nd.zeros((3, 3))
        xs = mx.nd.array(x)
        xs.attach_grad()
        with forced_path(how), mx.autograd.record():
            y = auxops.class_sums(xs, mx.nd.array(label), sums)
        y.backward()
        got = sums.asnumpy()
    np.testing.assert_array_equal(got, want)


def test_numpy_call_updates_numpy_state():
    count = np.zeros(1, np.float32)
    seen = np.zeros(1, np.float32)
    auxops.counted(np.ones(3, np.float32), count)
    assert count[0] == 0  # the forward does not count
    auxops.training_forwards(np.ones(3, np.float32), seen)
    assert seen[0] == 0  # a plain NumPy call is inference


def test_bad_aux_use_names_the_op_and_the_state():
    x = mx.nd.ones((4,))
    with pytest.raises(TypeError, match=r"customop '.*counted'.*auxiliary state.*count.*missing"):
        auxops.counted(x)
    with pytest.raises(
        ValueError,
        match=r"customop '.*counted'.*auxiliary state 'count' has "
        r"shape \(2,\), but for these inputs it must be \(1,\)",
    ):
        auxops.counted(x, mx.nd.zeros((2,)))
    with pytest.raises(TypeError, match=r"aux=\{'c': \.\.\.\} must map"):
        customop("numpy", aux={"c": (1,)})(lambda x, c: x)
    with pytest.raises(TypeError, match=r"auxiliary states 'a' must be the last"):

        @customop("numpy", aux={"a": lambda x, b: (1,)})
        def misplaced(x, a, b):
            return x

    count = mx.nd.zeros((1,))
    y = auxops.counted(x, count)  # still usable
    np.testing.assert_array_equal(y.asnumpy(), 2)


def test_a_handwritten_op_may_still_run_autograd_inside_its_backward():
    """Once aux settling is on, a backward() issued on MXNet's worker thread must not wait."""
    code = NESTED
    out = fresh.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [
        "[2.",
        "4.]",
        "<NDArray",
        "2",
        "@cpu(0)>",
        "[1.]",
        "<NDArray",
        "1",
        "@cpu(0)>",
    ]


NESTED = """
import mxnet as mx
from tests.customop import auxops
c = mx.nd.zeros((1,)); x = mx.nd.ones((2,)); x.attach_grad()
with mx.autograd.record():
    y = auxops.counted(x, c)
y.backward()

class Inner(mx.operator.CustomOp):
    def forward(self, is_train, req, in_data, out_data, aux):
        self.assign(out_data[0], req[0], in_data[0] * 2)

    def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
        a = in_data[0].copy(); a.attach_grad()
        with mx.autograd.record():
            b = a * a
        b.backward()
        self.assign(in_grad[0], req[0], a.grad * out_grad[0])

@mx.operator.register("inner_nested")
class InnerProp(mx.operator.CustomOpProp):
    def list_arguments(self): return ['x']
    def list_outputs(self): return ['y']
    def infer_shape(self, s): return s, s, []
    def create_operator(self, ctx, shapes, dtypes): return Inner()

x2 = mx.nd.array([1., 2.]); x2.attach_grad()
with mx.autograd.record():
    z = mx.nd.Custom(x2, op_type='inner_nested')
z.backward()
print(x2.grad, c)
"""


@pytest.mark.parametrize("given", [False, True])
def test_check_grad_takes_an_op_with_aux_states(given):
    from customop import check_grad

    x = np.random.normal(size=(4, 3))
    label = np.array([0, 1, 1, 2], dtype=np.int32)
    extra = [np.random.normal(size=(3, 3))] if given else []
    report = check_grad(auxops.class_sums, x, label, *extra)
    assert report.passed and report.row("x").comparison


def test_check_grad_fails_for_a_gradient_that_reads_a_moving_state():
    from customop import check_grad

    @customop("numpy", aux={"c": lambda x: x})
    def pulled(x, c):
        return (x - c) ** 2

    def grad(ans, x, c):
        def g_(g):
            c[...] += 1.0  # updated first, then (wrongly) used for the gradient
            return 2 * (x - c) * g

        return g_

    pulled.def_grad(grad)
    with pytest.raises(AssertionError, match="FAIL"):
        check_grad(pulled, np.random.normal(size=(3,)))
