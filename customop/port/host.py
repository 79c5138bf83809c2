"""Ports that run on the host: an op without graphs (a ``'numpy'``-mode op) called through
MXNet on NumPy copies of the framework's arrays, its gradient by MXNet's backward (which
runs the op's ``def_grad`` closures).  Needs MXNet in the process; a saved port cannot
hold such an op (:func:`customop.save_port` says so).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import mxnet as mx
import numpy as np


@dataclass
class HostRecord:
    op_type: str
    inputs: list
    grads: list
    n_out: int
    target: Any = None
    params: dict = field(default_factory=dict)
    host: bool = True

    def check(self, shapes, dtypes) -> None:
        return None


_records: dict = {}


def record(target: Any, op: Any, arrays: list, names: list, params: dict, n_out: int) -> HostRecord:
    dtypes = [np.dtype(str(getattr(a, "dtype", "float32")).replace("torch.", "")) for a in arrays]
    key = (target, tuple(names), repr(sorted(params.items())), tuple(dtypes))
    found = _records.get(key)
    if found is None:
        no_grad = set(op.no_grad)
        grads = [
            i
            for i, (n, d) in enumerate(zip(names, dtypes))
            if n not in no_grad and np.issubdtype(d, np.floating)
        ]
        found = HostRecord(op.op_type, list(names), grads, n_out, target, dict(params))
        _records[key] = found
    return found


def forward(rec: HostRecord, arrays: list) -> list:
    """The op's outputs, as NumPy arrays, for NumPy inputs."""
    out = rec.target(*[mx.nd.array(a, dtype=a.dtype) for a in arrays], **rec.params)
    out = out if isinstance(out, (list, tuple)) else [out]
    return [o.asnumpy() for o in out]


def backward(rec: HostRecord, arrays: list, grads: list) -> list:
    """The inputs ``rec.grads``' gradients for head gradients ``grads`` (None: zero)."""
    xs = [mx.nd.array(a, dtype=a.dtype) for a in arrays]
    for i in rec.grads:
        xs[i].attach_grad()
    with mx.autograd.record():
        out = rec.target(*xs, **rec.params)
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    heads = [
        mx.nd.array(g, dtype=o.dtype) if g is not None else mx.nd.zeros_like(o)
        for g, o in zip(grads, outs)
    ]
    mx.autograd.backward(outs, heads)
    return [xs[i].grad.asnumpy() for i in rec.grads]


def shapes(rec: HostRecord, arrays: list) -> list:
    """``(shape, dtype)`` of each output, from MXNet's shape and type inference."""
    names = list(rec.inputs)
    sym = rec.target(*[mx.sym.var(n) for n in names], **rec.params)
    _, out_shapes, _ = sym.infer_shape(**{n: tuple(a.shape) for n, a in zip(names, arrays)})
    _, out_types, _ = sym.infer_type(
        **{n: np.dtype(str(a.dtype).replace("torch.", "")) for n, a in zip(names, arrays)}
    )
    return list(zip(out_shapes, out_types))


# ---- torch ---------------------------------------------------------------------------------
def _np(t) -> np.ndarray:
    return t.detach().cpu().numpy()


def torch_forward(rec: HostRecord, tensors: list) -> list:
    import torch

    dev = tensors[0].device
    return [
        torch.from_numpy(np.ascontiguousarray(o)).to(dev)
        for o in forward(rec, [_np(t) for t in tensors])
    ]


def torch_fake(rec: HostRecord, tensors: list) -> list:
    import torch

    from .torch_rules import DTYPES

    return [
        torch.empty(s, dtype=DTYPES[np.dtype(d).name], device=tensors[0].device)
        for s, d in shapes(rec, tensors)
    ]


def torch_backward(rec: HostRecord, tensors: list, grads: list) -> list:
    import torch

    dev = tensors[0].device
    found = backward(rec, [_np(t) for t in tensors], [None if g is None else _np(g) for g in grads])
    return [torch.from_numpy(np.ascontiguousarray(g)).to(dev) for g in found]
