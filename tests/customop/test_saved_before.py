"""Files written before the wings (customop of commit d2cc5fc, tests/data/before_wings/make.py)
load after customop's modules moved into customop/graphs/ and customop/deploy/: pickled ops,
a pickled Symbol, an exported model with a Custom node and a Module checkpoint."""

import pickle
from pathlib import Path

import mxnet as mx
import numpy as np

import customop
from customop import ops
from tests.customop import auxops, opdefs

DATA = Path(__file__).resolve().parents[1] / "data" / "before_wings"


def _smooth_l1(x, sigma, w=1.0):  # the paper's formula, float64
    x, s2 = x.astype(np.float64), sigma.astype(np.float64) ** 2
    return w * np.where(np.abs(x) < 1 / s2, 0.5 * s2 * x * x, np.abs(x) - 0.5 / s2)


def _inputs(shape, seed):
    rng = np.random.RandomState(seed)
    return rng.randn(*shape), rng.uniform(0.5, 2.0, shape)


def test_pickled_ops_are_todays_ops():
    saved = pickle.loads((DATA / "ops.pkl").read_bytes())
    expected = [
        ops.topk,
        ops.focal_loss,
        auxops.counted,
        auxops.counted_nd,
        opdefs.square_np,
        opdefs.square_nd,
    ]
    assert saved["types"] == [o.op_type for o in expected]
    for key in ("protocol2", "highest"):
        got = pickle.loads(saved[key])
        assert all(a is b for a, b in zip(got, expected)) and len(got) == len(expected)


def test_pickled_symbol_binds_and_computes():
    sym = pickle.loads((DATA / "symbol.pkl").read_bytes())
    x, t = _inputs((2, 3), 0)
    auxs = {name: mx.nd.zeros((1,)) for name in sym.list_auxiliary_states()}
    ex = sym.bind(mx.cpu(), {"x": mx.nd.array(x), "t": mx.nd.array(t)}, aux_states=auxs)
    first, second = (o.asnumpy() for o in ex.forward())
    np.testing.assert_allclose(first, x * x + _smooth_l1(x, t), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(second, 2 * x, rtol=1e-6)


def test_exported_model_imports_and_computes():
    net = customop.imports(
        str(DATA / "head-symbol.json"), ["pred", "target"], str(DATA / "head-0000.params")
    )
    pred, target = _inputs((2, 4), 1)
    got = net(mx.nd.array(pred), mx.nd.array(target)).asnumpy()
    np.testing.assert_allclose(
        got, _smooth_l1(pred, target) ** 2 + pred * pred, rtol=1e-5, atol=1e-6
    )


def test_module_checkpoint_loads_and_computes():
    sym, args, auxs = customop.load_checkpoint(str(DATA / "module"), 3)
    mod = mx.mod.Module(sym, data_names=["x", "t"], label_names=None)
    mod.bind(data_shapes=[("x", (2, 3)), ("t", (2, 3))], for_training=False)
    mod.set_params(args, auxs, allow_missing=True)
    x, t = _inputs((2, 3), 2)
    mod.forward(mx.io.DataBatch([mx.nd.array(x), mx.nd.array(t)]), is_train=False)
    first, second = (o.asnumpy() for o in mod.get_outputs())
    np.testing.assert_allclose(first, x * x + _smooth_l1(x, t), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(second, 2 * x, rtol=1e-6)
