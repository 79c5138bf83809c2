"""What the modules below ``operator.py`` read from an operator, as protocols (types only).

The operator (:class:`customop.operator.CustomOperator`) is defined above the modules that
run it: they name what they read with these small protocols, as PyTorch's
``torch/_library/autograd.py`` does with its ``InfoProtocol``, so that reading one of them
needs neither the class nor an import back up. A new attribute read below ``operator.py``
is added here first.
"""
from __future__ import annotations

from typing import Any, Callable, Protocol


class Named(Protocol):
    """An operator as errors and registries name it."""

    op_type: str
    fn: Callable[..., Any]  # the decorated forward


class Forward(Named, Protocol):
    """An operator as its forward runs: inputs, outputs and the array world it runs in."""

    mode: str  # 'numpy' or 'mxnet'
    mode_impl: Any  # customop.modes.NumpyMode or MxnetMode
    signature: Any  # customop.signature.Signature
    outputs: Any  # customop.outputs.OutputCount
    need_top_grad: bool
    aux_shape_fns: dict[str, Callable[..., Any]]


class Differentiable(Forward, Protocol):
    """An operator as its gradients are taken: closures, joint closures, automatic ones."""

    grads: dict[int, Callable[..., Any]]  # def_grad closure makers, by input index
    grad_groups: dict[int, Any]  # customop.gradients.Joint, by input index
    no_grad: frozenset[str]
    auto_grad: bool
