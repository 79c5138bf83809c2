"""An operator's siblings: its twin in the other mode, and its variants for inputs left out.

A twin (``@op.twin('numpy')``) is a full operator of its own, ``"<op_type>.<mode>"``, with
the same inputs, aux states and parameters, reached as ``op.numpy`` / ``op.mxnet``.  A
variant is the operator registered for calls that leave some optional inputs out
(``"<op_type>~without_<names>"``): MXNet's argument list is fixed per op type, so an op
with ``k`` optional inputs registers ``2**k - 1`` variants, each running the full op's
forward, shape functions and gradient closures with None where an input is absent.  The
operator class builds them through this module (handing it the class it makes them of).
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable
from typing import Any

from . import gradients
from .arguments import Signature
from .modes import MODES


def output_spec(op: Any) -> dict[str, Any]:
    """What another operator of ``op``'s outputs (a twin, a variant) is declared with: the
    count as resolved for ``op`` (its own forward may be a wrapper), or the names given."""
    if op.user_outputs is None:
        return dict(num_outputs=op.num_outputs)
    return dict(num_outputs=op.user_num_outputs, outputs=op.user_outputs)


# ---- twins ------------------------------------------------------------------------------


def twin(op: Any, mode: str, options: dict[str, Any], make: Callable) -> Callable:
    """The decorator of ``op``'s twin in ``mode``: ``make(fn, mode, **settings)`` (the
    operator class), checked to take the same arrays and parameters.  Keyword-only
    parameters the twin leaves without a default take the op's."""
    if mode not in MODES:
        raise op.error(ValueError, f"twin mode must be 'numpy' or 'mxnet', got {mode!r}")
    if mode in op.twins:
        raise op.error(
            ValueError,
            f"already has a {mode!r} implementation "
            f"({op.twins[mode].op_type!r}); a twin is in the other mode",
        )
    settings = dict(
        name=f"{op.op_type}.{mode}",
        need_top_grad=op.need_top_grad,
        infer_shape=op.user_infer_shape,
        infer_type=op.user_infer_type,
        auto_grad=op.auto_grad,
        aux={k: (f, op.aux_rules[k]) for k, f in op.aux_shape_fns.items()},
        optional=tuple(op.signature.optional),
        no_grad=tuple(op.no_grad),
        inline=op.inline,
        infer_input_shape=dict(op.input_shapes.fns),
        **output_spec(op),
    )
    settings.update(options)

    def wrap(fn: Callable) -> Any:
        _take_defaults(fn, op.signature)
        other = make(fn, mode, **settings)
        mine, theirs = op.signature, other.signature
        if (mine.inputs, mine.aux, mine.required, mine.defaults) != (
            theirs.inputs,
            theirs.aux,
            theirs.required,
            theirs.defaults,
        ):
            raise op.error(
                TypeError,
                f"twin {fn.__qualname__!r} must take the same "
                f"arrays and parameters: {mine.describe()}, parameters "
                f"{_params_text(mine)}; got {theirs.describe()}, parameters "
                f"{_params_text(theirs)}",
            )
        other.__doc__ = op.__doc__
        op.twins[mode] = other
        other.twins = op.twins
        return other

    return wrap


def _take_defaults(fn: Callable, mine: Signature) -> None:
    # A twin's keyword-only parameters may leave their defaults out: they are the op's,
    # written once (a default the twin does give must still equal the op's).
    if not inspect.isfunction(fn):
        return
    taken = {
        p.name: mine.defaults[p.name]
        for p in inspect.signature(fn).parameters.values()
        if p.kind == p.KEYWORD_ONLY and p.default is p.empty and p.name in mine.defaults
    }
    if taken:
        fn.__kwdefaults__ = {**(fn.__kwdefaults__ or {}), **taken}


def twin_of(op: Any, mode: str) -> Any:
    """``op``'s implementation in ``mode`` (itself or its twin)."""
    try:
        return op.twins[mode]
    except KeyError:
        raise op.error(
            AttributeError,
            f"has no {mode!r}-mode twin; add one with @{op.__name__}.twin({mode!r})",
        ) from None


def _params_text(sig: Signature) -> str:
    return ", ".join([*sig.required, *(f"{k}={v!r}" for k, v in sig.defaults.items())]) or "none"


# ---- variants ---------------------------------------------------------------------------


def variants(full: Any, make: Callable) -> dict[frozenset, Any]:
    """One operator (``make``, the operator class) per set of ``full``'s optional inputs
    left out, by that set."""
    found = {}
    opt = full.signature.optional
    for k in range(1, len(opt) + 1):
        for absent in itertools.combinations(opt, k):
            found[frozenset(absent)] = _variant(full, absent, make)
    return found


def variant(op: Any, present: int | list[str]) -> Any:
    """The operator registered for a call of ``op`` with only these inputs (names, or the
    first n)."""
    names = op.signature.inputs
    given = names[:present] if isinstance(present, int) else list(present)
    absent = frozenset(n for n in names if n not in given)
    if not absent:
        return op
    if absent not in op.variants:
        raise op.error(
            TypeError,
            f"input(s) {', '.join(sorted(absent))} cannot be left "
            f"out (optional inputs: {', '.join(op.signature.optional)})",
        )
    return op.variants[absent]


def adopt_grads(full: Any) -> None:
    """``full``'s gradient closures changed: its variants take them over."""
    for op in full.variants.values():
        op.variant_of.adopt_grads(op)


class Variant:
    """What a variant keeps of its full operator: which of its inputs are present."""

    def __init__(self, full: Any, absent: tuple[str, ...]):
        self.full = full
        self.positions = [i for i, n in enumerate(full.signature.inputs) if n not in absent]
        self._joints: dict[int, tuple] = {}

    def full_args(self, arrays):
        """The full op's arrays for the variant's ``arrays`` (None where absent)."""
        full = [None] * len(self.full.signature.inputs)
        for i, a in zip(self.positions, arrays):
            full[i] = a
        return [*full, *arrays[len(self.positions) :]]

    def dropping(self, fn: Callable | None) -> Callable | None:
        """``fn`` of the full op (a shape or type function), called with None for the
        absent inputs."""
        if fn is None:
            return None
        return lambda *values, **params: fn(*self.full_args(values), **params)

    def adopt_grads(self, op: Any) -> None:
        """Give ``op`` (the variant) the full op's gradient closures of its inputs."""
        op.grads, op.grad_groups = {}, {}
        wrapped: dict[int, Any] = {}  # one wrapper (and one Joint) per full registration
        for j, i in enumerate(self.positions):
            if i not in self.full.grads:
                continue
            maker = self.full.grads[i]
            if id(maker) not in wrapped:
                wrapped[id(maker)] = self._grad_for(maker)
            op.grads[j] = wrapped[id(maker)]
            joint = self.full.grad_groups.get(i)
            if joint is not None:
                op.grad_groups[j] = self._joint_for(joint)
        op.update_native()

    def _joint_for(self, joint: gradients.Joint) -> gradients.Joint:
        # The full op's joint closure, seen from here: only the present inputs, picked out
        # of the full tuple.
        cached = self._joints.get(id(joint))
        if cached is None or cached[0] is not joint:
            present = [
                (self.positions.index(i), pick)
                for i, pick in zip(joint.argnums, joint.picks)
                if i in self.positions
            ]
            mine = gradients.Joint(
                tuple(j for j, _ in present), tuple(p for _, p in present), joint.declared
            )
            cached = self._joints[id(joint)] = (joint, mine)
        return cached[1]

    def _grad_for(self, maker):
        def grad(ans, *arrays, **params):
            return maker(ans, *self.full_args(arrays), **params)

        # Seen from outside, it takes by keyword what the full op's closure takes (the
        # residuals and defaults it names reach it through **params).
        found, var_kw = gradients.keywords(maker, 1 + len(self.full.signature.arrays))
        P = inspect.Parameter
        grad.__signature__ = inspect.Signature(
            [
                P("ans", P.POSITIONAL_ONLY),
                P("arrays", P.VAR_POSITIONAL),
                *[p.replace(kind=P.KEYWORD_ONLY) for p in found],
                *([P("params", P.VAR_KEYWORD)] if var_kw else []),
            ]
        )
        return grad


def _variant(full: Any, absent: tuple[str, ...], make: Callable) -> Any:
    names = full.signature.inputs
    kept = Variant(full, absent)
    sig = inspect.signature(full.fn)
    params = [p for p in sig.parameters.values() if p.name not in absent]
    present = [p.replace(default=inspect.Parameter.empty) if p.name in names else p for p in params]

    def forward(*arrays, **kw):
        return full.fn(*kept.full_args(arrays), **kw)

    forward.__signature__ = sig.replace(parameters=present)
    forward.__module__ = full.fn.__module__
    forward.__qualname__ = f"{full.fn.__qualname__}~without_{'_'.join(absent)}"
    forward.__doc__ = full.fn.__doc__
    op = make(
        forward,
        full.mode,
        name=f"{full.op_type}~without_{'_'.join(absent)}",
        need_top_grad=full.need_top_grad,
        infer_shape=kept.dropping(full.user_infer_shape),
        infer_type=kept.dropping(full.user_infer_type),
        auto_grad=full.auto_grad,
        no_grad=tuple(n for n in full.no_grad if n not in absent),
        inline=full.inline,
        **output_spec(full),
        infer_input_shape={
            n: kept.dropping(f) for n, f in full.input_shapes.fns.items() if n not in absent
        },
    )
    op.variant_of = kept
    kept.adopt_grads(op)
    return op
