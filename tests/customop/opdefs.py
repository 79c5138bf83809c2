"""Operators shared by the core tests (importable by subprocesses: export/import).

Each reference gradient here is written from the formula, independently of the op.
"""

import autograd.numpy as anp
import mxnet as mx
import numpy

from customop import customop


@customop("numpy")
def softmax_ce(x, y):
    probs = numpy.exp(x - numpy.max(x, axis=1, keepdims=True))
    probs /= numpy.sum(probs, axis=1, keepdims=True)
    n = x.shape[0]
    return -numpy.sum(numpy.log(probs[numpy.arange(n), y])) / n


def softmax_ce_grad(ans, x, y):
    def grad(g):
        n = x.shape[0]
        probs = numpy.exp(x - numpy.max(x, axis=1, keepdims=True))
        probs /= numpy.sum(probs, axis=1, keepdims=True)
        probs[numpy.arange(n), y] -= 1
        return g * probs / n

    return grad


softmax_ce.def_grad(softmax_ce_grad)


@customop("mxnet")
def softmax_ce_nd(x, y):
    logp = mx.nd.log_softmax(x, axis=1)
    return -mx.nd.sum(mx.nd.pick(logp, y, axis=1)) / x.shape[0]


def softmax_ce_nd_grad(ans, x, y):
    def grad(g):
        probs = mx.nd.softmax(x, axis=1) - mx.nd.one_hot(y, x.shape[1], dtype=x.dtype)
        return g * probs / x.shape[0]

    return grad


softmax_ce_nd.def_grad(softmax_ce_nd_grad)


@customop("numpy")
def affine_pair(x, b, alpha=0.25, mode="valid", axes=(1, 2), flag=True, extra=None):
    """Two outputs; parameters of every literal type reach the forward intact."""
    assert isinstance(alpha, float), alpha
    assert (mode, axes, flag, extra) == ("valid", (1, 2), True, None), (mode, axes, flag, extra)
    return x * alpha + b, x - b


def _affine_pair_dx(ans, x, b, alpha=0.25, mode="valid", axes=(1, 2), flag=True, extra=None):
    assert (isinstance(ans, tuple), mode, axes, flag, extra) == (True, "valid", (1, 2), True, None)
    return lambda g: g[0] * alpha + g[1]


def _affine_pair_db(ans, x, b, **params):
    return lambda g: g[0] - g[1]


affine_pair.def_grad(_affine_pair_dx, 0).def_grad(_affine_pair_db, argnum=1)


@customop("mxnet")
def square_nd(x):
    return x * x


square_nd.def_grad(lambda ans, x: lambda g: 2 * x * g)


@customop("numpy")
def square_np(x):
    return x * x


square_np.def_grad(lambda ans, x: lambda g: 2 * x * g)


@customop("numpy", need_top_grad=False)
def l2_loss(pred, target):
    # autograd.numpy: the target's automatic gradient traces on every autograd version
    # (plain numpy.sum needs autograd 1.9.1, Python >= 3.10: tests/customop/test_autograd_versions)
    return 0.5 * anp.sum((pred - target) ** 2, axis=1)


def _l2_loss_grad(ans, pred, target):
    def grad(g):
        assert g is None
        return pred - target

    return grad


l2_loss.def_grad(_l2_loss_grad)


class TwoOpNet(mx.gluon.HybridBlock):
    """Dense -> affine_pair (parameters) -> square_nd, used by the Gluon tests."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = mx.gluon.nn.Dense(3)

    def hybrid_forward(self, F, x, b):
        u, v = affine_pair(
            self.dense(x), b, alpha=0.5, mode="valid", axes=(1, 2), flag=True, extra=None
        )
        return square_nd(u) + v


# An output count that follows a parameter: ``parts`` row blocks of ``scale * x``.
@customop("numpy", num_outputs=lambda parts=1, **_: parts)
def split_rows(x, parts=1, scale=1.0):
    out = numpy.split(x * scale, parts, axis=0)
    return tuple(out) if parts > 1 else out[0]


def _split_rows_grad(ans, x, parts=1, scale=1.0):
    # One output: ans and g are arrays; several: tuples of them, one per output.
    assert isinstance(ans, tuple) == (parts > 1), (type(ans), parts)

    def grad(g):
        assert isinstance(g, tuple) == (parts > 1) and (parts == 1 or len(g) == parts)
        return scale * (numpy.concatenate(g, axis=0) if parts > 1 else g)

    return grad


split_rows.def_grad(_split_rows_grad)


@split_rows.twin("mxnet")
def _split_rows_nd(x, parts=1, scale=1.0):
    # No def_grad: recorded natively; its graph nodes differentiate with mx.autograd.
    out = mx.nd.split(x * scale, num_outputs=parts, axis=0)
    return tuple(out) if parts > 1 else out


class SplitNet(mx.gluon.HybridBlock):
    """Two nodes of one op type with different output counts (3 and 1) in one graph."""

    def __init__(self, op, **kwargs):
        super().__init__(**kwargs)
        self.op = op

    def hybrid_forward(self, F, x):
        a, b, c = self.op(x, parts=3, scale=2.0)
        whole = self.op(x, scale=0.5)
        return F.concat(c, a, b, dim=0) * whole
