"""A ``def_grad`` operator's gradient closures as a trace records them, ``g`` a variable.

:func:`closures_of` groups an operator's closures (one per input, or one per joint
closure) in input order; :func:`record` calls them inside the forward's recording
(:func:`customop.graphs.trace.record`) with a random head gradient ``g`` that is
itself recorded, so that the graph read back holds each closure as a function of ``g``
(:mod:`customop.graphs.backward` transposes it).
"""

from __future__ import annotations

from typing import Any

import mxnet as mx
import numpy as np

from .. import gradients
from ..nd_copies import ndarray
from ..opinfo import Differentiable
from .rules import NotNative


def describe(maker: Any) -> str:
    """A closure as explain names it: its name and where it is defined."""
    name = getattr(maker, "__qualname__", None) or repr(maker)
    code = getattr(maker, "__code__", None)
    if code is None:
        return name
    return f"{name} ({code.co_filename}:{code.co_firstlineno})"


class Closure:
    """One gradient closure: the inputs it gives gradients for, and how to call it."""

    def __init__(self, op: Differentiable, first: int, joint: gradients.Joint | None):
        self.first, self.joint = first, joint
        self.maker = op.grads[first]
        self.inputs = list(joint.argnums) if joint is not None else [first]
        names = [op.signature.inputs[i] for i in self.inputs]
        self.label = (
            f"gradient closure {describe(self.maker)} for input"
            f"{'s' if len(names) > 1 else ''} {', '.join(map(repr, names))}"
        )

    def gradients(self, op: Differentiable, ans, xs, g, params, saved) -> list:
        """The closure's gradients, one per input of :attr:`inputs`."""
        call = gradients.Backward(op, ans, list(xs), g, params, lambda: saved)
        if self.joint is None:
            return [gradients.from_closure(call, self.first)]
        got = gradients.from_joint(call, self.joint, self.first)
        return [got[self.joint.picks[k]] for k in range(len(self.inputs))]


def closures_of(op: Differentiable) -> tuple[list[Closure], list[int]]:
    """The op's closures in input order, and the inputs MXNet differentiates (auto_grad)."""
    closures, auto, seen = [], [], set()
    for i, name in enumerate(op.signature.inputs):
        if name in op.no_grad:
            continue
        if i in op.grads:
            joint = op.grad_groups.get(i)
            if joint is None or id(joint) not in seen:
                closures.append(Closure(op, i, joint))
                if joint is not None:
                    seen.add(id(joint))
        elif op.auto_grad:
            auto.append(i)
    return closures, auto


class Recorded:
    """What :func:`record` adds to a recording: head gradients in, closure gradients out."""

    def __init__(self):
        self.heads: list[mx.nd.NDArray] = []  # the variables g, one per output
        self.grads: list[mx.nd.NDArray] = []  # the closures' gradients, in order
        self.picks: list[tuple[int, Closure]] = []  # per gradient: (input, closure)
        self.spans: list[tuple[int, Closure]] = []  # (reads before it ran, closure)


def record(
    op: Differentiable,
    closures: list[Closure],
    xs,
    outs,
    saved,
    params,
    log: Any,
    rng: np.random.RandomState,
) -> Recorded:
    """Call every closure on a recorded random ``g`` (inside the forward's recording).

    ``log``: the trace log (its ``inputs`` get the ``g`` variables; ``poison``, the
    forward's failed ``require`` checks, multiplies the gradients: NaN gradients too).
    """
    done = Recorded()
    if op.need_top_grad:
        for o in outs:
            g = ndarray(rng.uniform(-1, 1, o.shape), dtype=o.dtype)
            g.attach_grad()
            done.heads.append(g)
        log.inputs |= {mx.autograd.get_symbol(g).name for g in done.heads}
    single = len(outs) == 1
    g = None if not done.heads else (done.heads[0] if single else tuple(done.heads))
    ans = outs[0] if single else tuple(outs)
    for c in closures:
        done.spans.append((len(log.reads), c))
        for i, grad in zip(c.inputs, c.gradients(op, ans, xs, g, params, saved)):
            if grad is None:
                continue
            if not isinstance(grad, mx.nd.NDArray):
                raise NotNative.of("closure-not-ndarray", c.label, type(grad).__name__)
            if log.poison is not None and np.issubdtype(grad.dtype, np.floating):
                grad = mx.nd.broadcast_mul(grad, log.poison.astype(grad.dtype, copy=False))
            done.grads.append(grad)
            done.picks.append((i, c))
    return done
