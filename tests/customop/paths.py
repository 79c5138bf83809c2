"""Run one operator call through each way MXNet can drive it, for side-by-side tests."""

import mxnet as mx
import numpy as np

from customop.dispatch import forced_path

IMPERATIVE = ("function", "custom", "graph")  # recording paths
ALL = (*IMPERATIVE, "symbol")


def _nd(a):
    a = np.asarray(a)
    return mx.nd.array(a, dtype=a.dtype)


def run(op, inputs, params=None, how="function", heads=None, grad_req="write", repeat=1):
    """Forward+backward of ``op`` through ``how``; returns (outputs, input grads) as NumPy.

    ``heads``: one array per output, or None for ones.  Integer inputs get no gradient.
    """
    params = params or {}
    if how == "symbol":
        return _run_symbol(op, inputs, params, heads, grad_req, repeat)
    xs = [_nd(a) for a in inputs]
    for x in xs:
        if np.issubdtype(x.dtype, np.floating):
            x.attach_grad(grad_req=grad_req)
    with forced_path(how):
        for _ in range(repeat):
            with mx.autograd.record():
                outs = op(*xs, **params)
            outs = list(outs) if isinstance(outs, tuple) else [outs]
            hs = None if heads is None else [_nd(h) for h in heads]
            mx.autograd.backward(outs, head_grads=hs)
    grads = [x.grad.asnumpy() if x.grad is not None else None for x in xs]
    return [o.asnumpy() for o in outs], grads


def _run_symbol(op, inputs, params, heads, grad_req, repeat):
    names = op.signature.inputs
    syms = [mx.sym.var(n) for n in names]
    out = op(*syms, **params)
    out = mx.sym.Group(list(out)) if isinstance(out, tuple) else out
    arrays = [np.asarray(a) for a in inputs]
    reqs = {
        n: (grad_req if np.issubdtype(a.dtype, np.floating) else "null")
        for n, a in zip(names, arrays)
    }
    ex = out.simple_bind(
        mx.cpu(),
        grad_req=reqs,
        type_dict={n: a.dtype for n, a in zip(names, arrays)},
        **{n: a.shape for n, a in zip(names, arrays)},
    )
    for n, a in zip(names, arrays):
        ex.arg_dict[n][:] = a
    for _ in range(repeat):
        ex.forward(is_train=True)
        hs = (
            [mx.nd.ones(o.shape, dtype=o.dtype) for o in ex.outputs]
            if heads is None
            else [_nd(h).reshape(o.shape) for h, o in zip(heads, ex.outputs)]
        )
        ex.backward(out_grads=hs)
    grads = [ex.grad_dict[n].asnumpy() if reqs[n] != "null" else None for n in names]
    return [o.asnumpy() for o in ex.outputs], grads
