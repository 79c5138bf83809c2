"""The one place that decides where each input's gradient comes from.

Order, per input: integer inputs and inputs declared ``no_grad`` get zero; a
``def_grad`` closure wins (called with the inputs, every parameter it names or
takes through ``**params``, defaults filled in, and the forward's residuals it
names; a closure registered for several inputs, ``def_grad(fn, argnum=(0, 2))``,
is called once per backward and returns their gradients as a tuple); else, when
the operator allows it (``auto_grad=True``), an automatic gradient: HIPS
``autograd`` (``make_vjp``) over the forward in ``'numpy'`` mode, ``mx.autograd``
recording the forward again in ``'mxnet'`` mode; else zero (``None``).
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Tuple  # noqa: UP035 - Tuple: run time on Python 3.8

import mxnet as mx
import numpy as np

from . import errors, opinfo
from .intermediates import residuals


@dataclass(frozen=True, eq=False)
class Joint:
    """One ``def_grad`` closure that returns the gradients of several inputs at once.

    ``argnums``: the op's inputs it was registered for, in the order its tuple
    gives them; ``picks``: where each one's gradient sits in that tuple (a variant
    without some optional inputs drops theirs); ``declared``: the ``argnum=`` the
    user wrote (its length is the tuple's).
    """

    argnums: Tuple[int, ...]  # noqa: UP006
    picks: Tuple[int, ...]  # noqa: UP006
    declared: Tuple[int, ...]  # noqa: UP006

    @classmethod
    def of(cls, argnums: tuple[int, ...]) -> Joint:
        return cls(tuple(argnums), tuple(range(len(argnums))), tuple(argnums))

    @property
    def size(self) -> int:
        return len(self.declared)


def compute_all(
    op: opinfo.Differentiable,
    ans: Any,
    args: list[Any],
    g: Any,
    params: dict[str, Any],
    wanted: list[bool],
    saved: Callable[[], dict[str, Any]] = dict,
) -> list[Any | None]:
    """Gradients for every input (``None`` means zero) given upstream gradient ``g``.

    ``saved()`` gives the forward's residuals; it is called only for a closure that
    names one.
    """
    grads: list[Any | None] = [None] * len(args)
    auto = []
    names = op.signature.inputs
    joint_found: dict[int, tuple] = {}  # id(Joint) -> its closure's tuple, once per backward
    call = Backward(op, ans, args, g, params, saved)
    for i, (arg, want) in enumerate(zip(args, wanted)):
        if (
            not want
            or (i < len(names) and names[i] in op.no_grad)
            or op.mode_impl.dtype(arg).kind != "f"
        ):  # floating (np.issubdtype, faster)
            continue
        joint = op.grad_groups.get(i)
        if joint is not None:
            if id(joint) not in joint_found:
                joint_found[id(joint)] = from_joint(call, joint, i)
            grads[i] = joint_found[id(joint)][joint.picks[joint.argnums.index(i)]]
        elif i in op.grads:
            grads[i] = from_closure(call, i)
        elif op.auto_grad:
            auto.append(i)
    if auto:
        n = len(names)
        if len(args) > n:  # the forward runs again: on copies of the aux states it may move
            args = [*args[:n], *[op.mode_impl.copy(s) for s in args[n:]]]
        found = (_numpy_vjp if op.mode == "numpy" else _mxnet_vjp)(op, auto, ans, args, g, params)
        for i, grad in zip(auto, found):
            grads[i] = grad
    return grads


def keywords(fn: Callable, head: int) -> tuple[tuple[inspect.Parameter, ...], bool]:
    """The parameters ``fn`` can take by keyword after ``head`` positional arguments, and
    whether it has ``**params``."""
    try:
        return _cached_keywords(fn, head)
    except TypeError:  # an unhashable callable
        return _keywords(fn, head)


def _keywords(fn, head):
    try:
        ps = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return (), False  # keep to what the call passed
    out = []
    for p in ps:
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and head > 0:
            head -= 1
        elif p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            out.append(p)
    return tuple(out), any(p.kind == p.VAR_KEYWORD for p in ps)


_cached_keywords = functools.lru_cache(maxsize=1024)(_keywords)  # asked at every backward


def closure_kwargs(
    op: opinfo.Forward,
    maker: Callable,
    n_args: int,
    params: dict[str, Any],
    saved: Callable[[], dict[str, Any]],
) -> dict[str, Any]:
    """The keywords a gradient closure (called with ``ans`` and ``n_args`` arrays) gets.

    The parameters the call passed (always); the defaults of the others, where the
    closure names them or takes ``**params``; the residuals it names.
    """
    found, var_kw = keywords(maker, 1 + n_args)
    names = {p.name for p in found}
    kw = dict(params)
    for key, value in op.signature.defaults.items():
        if key not in kw and (var_kw or key in names):
            kw[key] = value
    wants = names.difference(op.signature.param_names) if names else names
    if wants:
        residuals = saved()
        kw.update((k, v) for k, v in residuals.items() if k in wants)
    return kw


@dataclass(frozen=True)
class Backward:
    """What one backward pass calls an op's ``def_grad`` closures with: the outputs
    ``ans``, the input arrays ``args``, the upstream gradient ``g``, the call's
    parameters, and ``saved()``, the forward's residuals (called only for a closure
    that names one)."""

    op: opinfo.Differentiable
    ans: Any
    args: list
    g: Any
    params: dict
    saved: Callable[[], dict]

    def run(self, i: int, where: str) -> Any:
        """What the closure registered for input ``i`` returns; a failure names the op and
        ``where``."""
        op, args = self.op, self.args
        try:
            maker = op.grads[i]
            kw = closure_kwargs(op, maker, len(args), self.params, self.saved)
            return maker(self.ans, *args, **kw)(self.g)
        except Exception as exc:
            errors.reraise(exc, op.op_type, where)


def from_closure(call: Backward, i: int) -> Any:
    """Input ``i``'s gradient from its ``def_grad`` closure; a closure returning None is an
    error."""
    op = call.op
    name = op.signature.inputs[i]
    grad = call.run(i, f"gradient for input {name!r}")
    if grad is None:  # a forgotten `return`, not a zero gradient
        raise TypeError(
            f"customop {errors.shown(op.op_type)!r} (gradient for input {name!r}): the gradient "
            "closure returned None; return the gradient (zeros for none)"
        )
    return grad


def from_joint(call: Backward, joint: Joint, i: int) -> tuple:
    """The gradients of ``joint``'s inputs (``i`` among them) from their one ``def_grad``
    closure, as the tuple it returned (checked: as many as ``argnum=`` declared)."""
    op = call.op
    names = [op.signature.inputs[k] for k in joint.argnums]
    where = f"gradient for inputs {', '.join(map(repr, names))}"
    found = call.run(i, where)
    if not isinstance(found, (tuple, list)) or len(found) != joint.size:
        got = (
            f"a {type(found).__name__} of {len(found)}"
            if isinstance(found, (tuple, list))
            else f"a {type(found).__name__}"
        )
        raise TypeError(
            f"customop {errors.shown(op.op_type)!r} ({where}): a closure registered with "
            f"def_grad(argnum={joint.declared}) returns a tuple of "
            f"{joint.size} gradients in that order (None for zero); it returned {got}"
        )
    return tuple(found)


def _untraceable(op, argnums, how: str, cause: BaseException | str) -> BaseException:
    names = [op.signature.inputs[i] for i in argnums]
    one = len(names) == 1
    listed = ", ".join(map(repr, names))
    declared = ", ".join(repr(n) for n in (*sorted(op.no_grad), *names))
    return errors.op_error(
        op.op_type,
        TypeError,
        (
            f"cannot compute an automatic gradient for input{'' if one else 's'} {listed}: "
            f"{str(cause).rstrip('.')}. If {'it is' if one else 'they are'} not meant to be "
            "differentiated (a label, an index, a mask), declare it: "
            f"@customop({op.mode!r}, ..., no_grad=({declared},)), or stop the gradient for one "
            f"call: pass {' / '.join(f'mx.nd.stop_gradient({n})' for n in names)} to the op (or "
            f"do not attach_grad() {'it' if one else 'them'}). Otherwise {how[0].lower()}"
            f"{how[1:]}, or register the gradient with def_grad."
        ),
    )


def _narrowed(attempt, argnums):
    # The inputs whose gradient cannot be computed on their own (all, if none alone fails).
    if len(argnums) == 1:
        return argnums
    bad = []
    for i in argnums:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", UserWarning)
                attempt([i])
        except Exception:  # noqa: BLE001 - any failure marks the input
            bad.append(i)
    return bad or argnums


_NUMPY_HOW = (
    "Write the forward with `import autograd.numpy as np` "
    "(HIPS autograd traces only its wrapped functions)"
)


def _numpy_vjp(op, argnums, ans, args, g, params):
    import autograd  # imported here: only 'numpy'-mode ops without def_grad need it
    import autograd.builtins

    heads = _ones_like_outputs(ans) if g is None else g

    def attempt(nums):
        def traced(*xs):
            out = _outputs(op.fn(*_substituted(args, nums, xs), **params))
            # A plain tuple of boxes is invisible to the tracer; autograd's own tuple is not.
            return autograd.builtins.tuple(out) if isinstance(out, (tuple, list)) else out

        vjp, _ = autograd.make_vjp(traced, tuple(range(len(nums))))(*[args[i] for i in nums])
        return vjp(heads)

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)  # "Output seems independent of input"
            found = attempt(argnums)
    except UserWarning as w:
        raise _untraceable(
            op,
            _narrowed(attempt, argnums),
            _NUMPY_HOW,
            f"the output does not depend on it through autograd.numpy ({w})",
        ) from None
    except Exception as exc:
        if errors.names_op(str(exc), op.op_type):
            raise
        raise _untraceable(
            op, _narrowed(attempt, argnums), _NUMPY_HOW, f"{type(exc).__name__}: {exc}"
        ) from exc
    return [np.asarray(x) for x in found]


def _mxnet_vjp(op, argnums, ans, args, g, params):
    how = "Write the forward with differentiable mx.nd operators (no asnumpy)"

    def attempt(nums):
        xs = [args[i].copy() for i in nums]
        for x in xs:
            x.attach_grad()
        with mx.autograd.record():
            outs = _outputs(op.fn(*_substituted(args, nums, xs), **params))
        outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
        heads = (
            [mx.nd.ones_like(o) for o in outs]
            if g is None
            else (list(g) if isinstance(g, (tuple, list)) else [g])
        )
        mx.autograd.backward(outs, head_grads=heads)
        return [x.grad for x in xs]

    try:
        return attempt(argnums)
    except mx.base.MXNetError as exc:
        raise _untraceable(op, _narrowed(attempt, argnums), how, errors.mxnet_text(exc)) from exc
    except Exception as exc:
        errors.reraise(exc, op.op_type, "automatic gradient")


def _outputs(result):
    return result.outputs if isinstance(result, residuals) else result


def _substituted(args, argnums, xs):
    # The forward's inputs with those being differentiated replaced by traced copies.
    full = list(args)
    for i, x in zip(argnums, xs):
        full[i] = x
    return full


def _ones_like_outputs(ans):
    if isinstance(ans, tuple):
        return tuple(np.ones_like(a) for a in ans)
    return np.ones_like(ans)
