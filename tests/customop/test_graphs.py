"""Item 3: the same op object in symbol graphs, Module, Gluon (hybridized or not), export."""

import json
import sys
from pathlib import Path

import mxnet as mx
import numpy as np

from tests import fresh
from tests.customop import opdefs

ROOT = Path(__file__).resolve().parents[2]


def test_symbol_call_returns_symbols():
    s = opdefs.softmax_ce(mx.sym.var("x"), mx.sym.var("y"))
    assert isinstance(s, mx.sym.Symbol)
    assert s.list_arguments() == ["x", "y"]
    pair = opdefs.affine_pair(mx.sym.var("x"), mx.sym.var("b"), name="pair")
    assert isinstance(pair, mx.sym.Symbol) and len(pair) == 2  # one node, two outputs
    assert pair.list_outputs() == ["pair_output0", "pair_output1"]
    assert pair[0].list_outputs() == ["pair_output0"]


def test_module_trains_a_softmax_classifier_with_a_decorated_loss():
    """A linear classifier on separable data, fit by Module through the custom loss."""
    rng = np.random.RandomState(0)
    centers = rng.normal(scale=4, size=(3, 2))
    y = rng.randint(0, 3, size=300)
    x = (centers[y] + rng.normal(size=(300, 2))).astype(np.float32)
    data, label = mx.sym.var("data"), mx.sym.var("softmax_label")
    fc = mx.sym.FullyConnected(data, num_hidden=3, name="fc")
    loss = mx.sym.MakeLoss(opdefs.softmax_ce(fc, label))
    it = mx.io.NDArrayIter(x, y.astype(np.int32), batch_size=30, label_name="softmax_label")
    mod = mx.mod.Module(loss, data_names=["data"], label_names=["softmax_label"])
    mod.bind(
        data_shapes=it.provide_data, label_shapes=[mx.io.DataDesc("softmax_label", (30,), np.int32)]
    )
    mod.init_params(mx.init.Xavier())
    mod.init_optimizer(optimizer="sgd", optimizer_params={"learning_rate": 0.5})
    losses = []
    for _ in range(5):
        it.reset()
        for batch in it:
            mod.forward_backward(batch)
            mod.update()
            losses.append(float(mod.get_outputs()[0].asnumpy()[0]))
    assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:10])
    w = mod.get_params()[0]["fc_weight"].asnumpy()
    b = mod.get_params()[0]["fc_bias"].asnumpy()
    assert np.mean((x @ w.T + b).argmax(axis=1) == y) > 0.9


def test_gluon_block_before_and_after_hybridize_and_with_autograd():
    x = mx.nd.random.normal(shape=(4, 5))
    b = mx.nd.random.normal(shape=(4, 3))
    net = opdefs.TwoOpNet()
    net.initialize(mx.init.Xavier())
    grads = []
    outs = []
    for hybrid in (False, True):
        if hybrid:
            net.hybridize()
        xg = x.copy()
        xg.attach_grad()
        with mx.autograd.record():
            out = net(xg, b)
        out.backward()
        outs.append(out.asnumpy())
        grads.append(xg.grad.asnumpy())
    w = net.dense.weight.data().asnumpy()
    h = x.asnumpy() @ w.T + net.dense.bias.data().asnumpy()
    u = 0.5 * h + b.asnumpy()
    want = u**2 + h - b.asnumpy()
    dh = 2 * u * 0.5 + 1  # d/dh of u^2 + h - b
    for out, grad in zip(outs, grads):
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(grad, dh @ w, rtol=1e-5, atol=1e-6)


def test_export_and_symbolblock_imports_in_a_fresh_process(tmp_path):
    x = mx.nd.random.normal(shape=(4, 5))
    b = mx.nd.random.normal(shape=(4, 3))
    net = opdefs.TwoOpNet()
    net.initialize(mx.init.Xavier())
    net.hybridize()
    want = net(x, b).asnumpy()
    prefix = str(tmp_path / "net")
    net.export(prefix)
    graph = json.loads(Path(prefix + "-symbol.json").read_text())
    customs = [n for n in graph["nodes"] if n["op"] == "Custom"]
    assert {n["attrs"]["op_type"] for n in customs} == {
        opdefs.affine_pair.op_type,
        opdefs.square_nd.op_type,
    }
    np.save(tmp_path / "x.npy", x.asnumpy())
    np.save(tmp_path / "b.npy", b.asnumpy())
    script = f"""
import mxnet as mx, numpy as np
import tests.customop.opdefs  # registers the ops, as a user's own module would
net = mx.gluon.SymbolBlock.imports({prefix + "-symbol.json"!r}, ['data0', 'data1'],
                                   {prefix + "-0000.params"!r})
x = mx.nd.array(np.load({str(tmp_path / "x.npy")!r}))
b = mx.nd.array(np.load({str(tmp_path / "b.npy")!r}))
np.save({str(tmp_path / "out.npy")!r}, net(x, b).asnumpy())
"""
    fresh.run([sys.executable, "-c", script], cwd=ROOT, check=True, timeout=120)
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), want, rtol=1e-6)


def test_loading_a_graph_without_importing_the_op_module_fails_loudly(tmp_path):
    sym = opdefs.square_nd(mx.sym.var("x"))
    path = tmp_path / "g.json"
    sym.save(str(path))
    script = f"""
import mxnet as mx
sym = mx.sym.load({str(path)!r})
try:
    sym.bind(mx.cpu(), {{'x': mx.nd.ones((2,))}}).forward()
except mx.base.MXNetError:
    print('refused')
"""
    out = fresh.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert "refused" in out.stdout or out.returncode != 0
