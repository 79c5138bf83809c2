"""Issue 52: our ops train under MXNet's AMP on every path, imperatively and hybridized.

Each case of the table runs in a process of its own (``amp.init()`` patches MXNet
process-wide), forked from ``tests/fresh.py``'s server: ``amp_case.py`` trains a dense
layer feeding our op under ``amp.init()`` + ``amp.init_trainer`` + ``amp.scale_loss``, and
the same model with the op written in MXNet's own operators, and compares the dense
layer's gradient and its weights after 4 steps (relative error <= 0.05, the issue's
bound). A non-finite gradient where MXNet's operators give a finite one fails the case.

Without AMP, in this process: a ``bfloat16`` input (NumPy has none) computes in float32
and returns ``bfloat16``; ``float16`` runs as before; a closure's gradient in another dtype
than its input is cast to the input's.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest

from customop import customop
from customop.dispatch import forced_path
from tests import fresh

ROOT = Path(__file__).resolve().parents[2]
CASE = Path(__file__).with_name("amp_case.py")
BF16 = np.dtype([("bfloat16", np.uint16)])

# (op, path, hybridized, inlining, AMP's target dtype)
CASES = [
    ("dg", "default", 0, "on", "bfloat16"),  # crashed: 'not in a computational graph'
    ("dg", "function", 0, "on", "bfloat16"),  # gradient not finite
    ("dg", "custom", 0, "on", "bfloat16"),
    ("auto", "default", 0, "on", "bfloat16"),  # TypeError in graphs/compare.py
    ("auto", "native", 0, "on", "bfloat16"),
    ("res", "graph", 0, "on", "bfloat16"),
    ("numpy", "default", 0, "on", "bfloat16"),  # NumPy has no bfloat16
    ("numpy_auto", "function", 0, "on", "bfloat16"),
    ("losses", "default", 0, "on", "bfloat16"),  # ops.focal_loss + ops.smooth_l1
    ("dg", "default", 1, "on", "bfloat16"),
    ("dg", "default", 1, "off", "bfloat16"),
    ("numpy", "default", 1, "on", "bfloat16"),
    ("losses", "default", 1, "off", "bfloat16"),
    ("dg", "default", 0, "on", "float16"),
    ("numpy", "function", 0, "on", "float16"),
    ("auto", "default", 1, "on", "float16"),
    ("losses", "default", 0, "on", "float16"),
]


@pytest.mark.parametrize(
    "kind,path,hybridized,inlining,target", CASES, ids=["-".join(map(str, c)) for c in CASES]
)
def test_trains_under_amp_as_mxnets_own_operators(kind, path, hybridized, inlining, target):
    env = dict(os.environ)
    env.pop("CUSTOMOP_RUNTIME_OFF", None)
    if inlining == "off":
        env["CUSTOMOP_RUNTIME_OFF"] = "inline"
    got = fresh.run_json(
        [sys.executable, str(CASE), kind, path, str(hybridized), target], cwd=str(ROOT), env=env
    )
    # never silent: a step MXNet's operators keep finite is finite with ours too
    assert got["finite"] == got["ref_finite"], got
    assert got["weights_finite"] and got["grad"] is not None, got
    assert got["grad"] <= 0.05 and got["weight"] <= 0.05, got
    # the forward, where it ran in Python, computed in float32 (AMP's rule for Custom)
    assert all(
        d not in ("float16", "[('bfloat16', '<u2')]") for pair in got["seen"] for d in pair
    ), got


def _bf16(values) -> mx.nd.NDArray:
    return mx.nd.amp_cast(mx.nd.array(values), dtype=BF16)


def _f32(a: mx.nd.NDArray) -> np.ndarray:
    return mx.nd.amp_cast(a, dtype=np.float32).asnumpy().astype(np.float64)


@customop("numpy")
def _cube_np(x):
    return x * x * x


_cube_np.def_grad(lambda ans, x: lambda g: 3 * g * x * x)


@customop("mxnet")
def _cube_nd(x):
    return x * x * x


_cube_nd.def_grad(lambda ans, x: lambda g: 3 * g * x * x)


@pytest.mark.parametrize("op", [_cube_np, _cube_nd], ids=["numpy", "mxnet"])
@pytest.mark.parametrize("path", [None, "function", "custom"])
def test_bfloat16_without_amp_computes_in_float32_and_returns_bfloat16(op, path):
    values = np.array([[0.5, -1.25, 2.0], [3.0, -0.75, 1.5]])  # exact in bfloat16
    x = _bf16(values)
    x.attach_grad()
    with forced_path(path):
        for _ in range(2):  # the default path's second call runs the native graph
            with mx.autograd.record():
                y = op(x)
            y.backward(_bf16(np.ones_like(values)))
    assert y.dtype == BF16 and x.grad.dtype == BF16
    # float64 formulas, rounded to bfloat16 (8 bits of mantissa)
    np.testing.assert_allclose(_f32(y), values**3, rtol=2**-8)
    np.testing.assert_allclose(_f32(x.grad), 3 * values**2, rtol=2**-8)


@pytest.mark.parametrize("path", [None, "function", "custom"])
def test_float16_without_amp_runs_as_given(path):
    values = np.array([0.5, -1.25, 2.0])
    x = mx.nd.array(values, dtype=np.float16)
    x.attach_grad()
    with forced_path(path):
        with mx.autograd.record():
            y = _cube_nd(x)
        y.backward()
    assert y.dtype == np.float16 and x.grad.dtype == np.float16
    np.testing.assert_allclose(x.grad.asnumpy(), 3 * values**2, rtol=1e-3)


@customop("numpy")
def _twice_np(x):
    return 2 * x


_twice_np.def_grad(lambda ans, x: lambda g: (2 * g).astype(np.float64))


@customop("mxnet")
def _twice_nd(x):
    return 2 * x


_twice_nd.def_grad(lambda ans, x: lambda g: (2 * g).astype(np.float16))


@pytest.mark.parametrize("op", [_twice_np, _twice_nd], ids=["numpy-float64", "mxnet-float16"])
@pytest.mark.parametrize("path", [None, "function", "custom"])
def test_a_closures_gradient_in_another_dtype_is_cast_to_its_inputs(op, path):
    x = mx.nd.array([0.5, -1.25, 3.0])
    x.attach_grad()
    with forced_path(path):
        for _ in range(2):
            with mx.autograd.record():
                y = op(x)
            y.backward(mx.nd.array([1.0, 2.0, 4.0]))
    assert x.grad.dtype == np.float32
    np.testing.assert_array_equal(x.grad.asnumpy(), [2.0, 4.0, 8.0])


def test_graph_comparison_reads_bfloat16():
    # MXNet hands bfloat16 to NumPy as a two-byte structured dtype no ufunc takes: the
    # comparison raised TypeError ("ufunc 'isfinite' not supported") while verifying a graph
    from customop.graphs import compare

    values = np.array([1.5, -2.25, 3e-3, np.nan, np.inf])
    a = _bf16(values).asnumpy()
    assert a.dtype == BF16
    np.testing.assert_array_equal(compare.host(a), _f32(_bf16(values)).astype(np.float32))
    assert compare.close([a], [a]) and compare.close([a], [values.astype(np.float32)])
    assert not compare.close([a], [(values * 1.1).astype(np.float32)])


class _Cube(mx.gluon.HybridBlock):
    def __init__(self, op, **kwargs):
        super().__init__(**kwargs)
        self.op = op

    def hybrid_forward(self, F, x):
        return self.op(x)


@pytest.mark.parametrize("op", [_cube_np, _cube_nd], ids=["numpy", "mxnet"])
@pytest.mark.parametrize("inlining", ["on", "off"])
def test_bfloat16_without_amp_in_a_hybridized_block_computes_as_imperatively(
    op, inlining, monkeypatch
):
    # The Custom node does what an imperative call does: float32 inside, bfloat16 out
    # (a bfloat16 signature has no native graph: the rule 'bfloat16')
    if inlining == "off":
        monkeypatch.setenv("CUSTOMOP_RUNTIME_OFF", "inline")
    values = np.array([[0.5, -1.25, 2.0], [3.0, -0.75, 1.5]])
    block = _Cube(op)
    block.hybridize()
    x = _bf16(values)
    x.attach_grad()
    for _ in range(2):
        with mx.autograd.record():
            y = block(x)
        y.backward(_bf16(np.ones_like(values)))
    assert y.dtype == BF16 and x.grad.dtype == BF16
    np.testing.assert_allclose(_f32(y), values**3, rtol=2**-8)
    np.testing.assert_allclose(_f32(x.grad), 3 * values**2, rtol=2**-8)


def test_explain_names_the_bfloat16_rule():
    from customop import explain

    report = repr(explain(_cube_nd, _bf16(np.ones((2, 3)))))
    assert "an input is bfloat16" in report
    assert "bfloat16 inputs cast to float32, then its native graph" in report
