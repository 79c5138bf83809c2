"""Helpers shared by the operator tests: call paths, the no-host-copy guard, Gluon runs."""

import contextlib

import mxnet as mx
import numpy as np

from customop.dispatch import forced_path
from tests.customop import paths

PATHS = paths.ALL  # function, custom, symbol


def nd(a, dtype=None):
    a = np.asarray(a)
    return mx.nd.array(a, dtype=dtype or a.dtype)


def run(op, inputs, params=None, how="function", heads=None):
    """(outputs, grads) as float64 NumPy through one path (tests/customop/paths.py); fewer
    inputs than the op has leave its last optional inputs out."""
    if op.signature.optional and len(inputs) < len(op.signature.inputs):
        op = op.variant(len(inputs))
    outs, grads = paths.run(op, inputs, params, how=how, heads=heads)
    return (
        [o.astype(np.float64) for o in outs],
        [None if g is None else g.astype(np.float64) for g in grads],
    )


def assert_paths_agree(op, inputs, params=None, heads=None, rtol=1e-5, atol=1e-6):
    """Every path gives the function path's outputs and gradients; returns those."""
    want = run(op, inputs, params, "function", heads)
    for how in PATHS[1:]:
        got = run(op, inputs, params, how, heads)
        for a, b in zip(got[0] + got[1], want[0] + want[1]):
            if a is None or b is None:
                assert a is None and b is None
            else:
                np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=how)
    return want


class HostCopy(AssertionError):
    pass


@contextlib.contextmanager
def no_host_copies():
    """Make any device-to-host copy of more than one element raise; yields the list of
    one-element reads (the value checks' single flag)."""
    original = mx.nd.NDArray.asnumpy
    reads = []

    def guarded(self):
        if self.size > 1:
            raise HostCopy(f"asnumpy() of an array of shape {self.shape} on the hot path")
        reads.append(self.shape)
        return original(self)

    mx.nd.NDArray.asnumpy = guarded
    try:
        yield reads
    finally:
        mx.nd.NDArray.asnumpy = original


def hot_path_reads(op, inputs, params, how):
    """Forward+backward of op under record() through ``how`` with host copies forbidden;
    returns (forward reads, backward reads) of one-element flags.  A first call, unguarded,
    lets the op infer its output shapes (done once per input signature, cached)."""
    xs = [nd(a) for a in inputs]
    for x in xs:
        if np.issubdtype(x.dtype, np.floating):
            x.attach_grad()
    with forced_path(how):
        with mx.autograd.record():
            out = op(*xs, **params)
        out.backward()
    mx.nd.waitall()
    with forced_path(how), no_host_copies() as reads:
        with mx.autograd.record():
            out = op(*xs, **params)
        mx.nd.waitall()
        n_forward = len(reads)
        out.backward()
        mx.nd.waitall()
    return n_forward, len(reads) - n_forward


def block_run(block, inputs, hybridize, grad_of=(0,)):
    """Output and the gradients of inputs ``grad_of`` of a Gluon block (float32 inputs, as
    Gluon's parameters), as float64."""
    if hybridize:
        block.hybridize()
    xs = [nd(a, np.float32) for a in inputs]
    for i in grad_of:
        xs[i].attach_grad()
    with mx.autograd.record():
        out = block(*xs)
    out.backward()
    return out.asnumpy().astype(np.float64), [
        xs[i].grad.asnumpy().astype(np.float64) for i in grad_of
    ]
