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
    signature: Any  # customop.arguments.Signature
    outputs: Any  # customop.outputs.OutputCount
    need_top_grad: bool
    aux_shape_fns: dict[str, Callable[..., Any]]


class Differentiable(Forward, Protocol):
    """An operator as its gradients are taken: closures, joint closures, automatic ones."""

    grads: dict[int, Callable[..., Any]]  # def_grad closure makers, by input index
    grad_groups: dict[int, Any]  # customop.gradients.Joint, by input index
    no_grad: frozenset[str]
    auto_grad: bool


class Inferred(Forward, Protocol):
    """An operator whose output shapes and dtypes are inferred (:mod:`customop.inference`)."""

    user_infer_shape: Callable[..., Any] | None  # infer_shape=
    user_infer_type: Callable[..., Any] | None  # infer_type=

    def error(self, cls: type, msg: str) -> BaseException:
        """An exception of type ``cls`` naming the operator."""


class Dispatched(Differentiable, Protocol):
    """An operator as a call is sent to its forward (:mod:`customop.dispatch`)."""

    records_natively: bool  # an 'mxnet'-mode forward recorded as MXNet's own operators
    arity: int  # how many inputs
    plain_calls: bool  # inputs only (no aux state, no required parameter): calls skip bind()
    variants: dict[frozenset[str], Any]  # by the optional inputs left out: another operator


class Registered(Differentiable, Protocol):
    """An operator as MXNet's graph machinery runs it (:mod:`customop.registry`,
    :mod:`customop.prop`): its nodes' shapes, dtypes and operator instances."""

    input_shapes: Any  # customop.input_shapes.InputShapes
    inference: Any  # customop.inference.Inference
