"""Shared checks for the detection operators (issue 11): call paths, no host copies, errors."""

import contextlib

import mxnet as mx
import numpy as np

from customop.dispatch import forced_path
from tests.customop import paths


@contextlib.contextmanager
def no_host_copy():
    """Within the block, ``asnumpy``/``asscalar`` raise (the 'mxnet'-mode hot path)."""

    def banned(self, *a, **k):
        raise AssertionError("asnumpy/asscalar called on the hot path")

    saved = mx.nd.NDArray.asnumpy, mx.nd.NDArray.asscalar
    mx.nd.NDArray.asnumpy = mx.nd.NDArray.asscalar = banned
    try:
        yield
    finally:
        mx.nd.NDArray.asnumpy, mx.nd.NDArray.asscalar = saved


def _nd(a):
    a = np.asarray(a)
    return mx.nd.array(a, dtype=a.dtype)


def forward_backward_without_host_copy(op, inputs, params, path):
    """Forward+backward through ``path`` with host copies banned; results read afterwards."""
    xs = [_nd(a) for a in inputs]
    for x in xs:
        x.attach_grad()
    with no_host_copy(), forced_path(path):
        with mx.autograd.record():
            outs = op(*xs, **params)
        outs = list(outs) if isinstance(outs, tuple) else [outs]
        mx.autograd.backward(outs, head_grads=[mx.nd.ones_like(o) for o in outs])
        mx.nd.waitall()
    return [o.asnumpy() for o in outs], [x.grad.asnumpy() for x in xs]


class OpBlock(mx.gluon.HybridBlock):
    """``op(*xs, **params)`` as a Gluon block (hybridizable, exportable)."""

    def __init__(self, op, params):
        super().__init__()
        self.op, self.op_params = op, params

    def hybrid_forward(self, F, *xs):
        return self.op(*xs, **self.op_params)


def every_path(op, inputs, params, float_inputs=None):
    """Outputs and input gradients (ones heads) on every call style; asserts they agree.

    Styles: direct, recorded ('function'/'native' and 'custom'), a bound symbol
    (``simple_bind``) and a hybridized Gluon block. Returns the direct outputs.
    """
    direct = op(*[_nd(a) for a in inputs], **params)
    direct = [o.asnumpy() for o in (direct if isinstance(direct, tuple) else [direct])]
    results = {how: paths.run(op, inputs, params, how=how) for how in paths.ALL}
    net = OpBlock(op, params)
    net.hybridize()
    xs = [_nd(a) for a in inputs]
    for x in xs:
        x.attach_grad()
    with mx.autograd.record():
        outs = net(*xs)
    outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
    mx.autograd.backward(outs)
    results["hybridized"] = ([o.asnumpy() for o in outs], [x.grad.asnumpy() for x in xs])
    floats = (
        float_inputs
        if float_inputs is not None
        else [i for i, a in enumerate(inputs) if np.issubdtype(np.asarray(a).dtype, np.floating)]
    )
    for how, (outs, grads) in results.items():
        assert len(outs) == len(direct), f"{op.op_type}: {len(outs)} output(s) via {how}"
        for want, got in zip(direct, outs):
            np.testing.assert_array_equal(got, want, err_msg=f"{op.op_type} output via {how}")
        ref_grads = results["function"][1]
        for i in floats:
            np.testing.assert_allclose(
                grads[i],
                ref_grads[i],
                rtol=1e-5,
                atol=1e-6,
                err_msg=f"{op.op_type} gradient {i} via {how}",
            )
    return direct
