"""The ``@customop`` decorator and the operator object it returns."""
from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from collections.abc import Callable
from typing import Any, Literal

import mxnet as mx
import numpy as np

from . import dispatch, errors, gradients, prop
from . import params as _params
from .inference import Inference
from .modes import MODES
from .signature import Signature

Mode = Literal["numpy", "mxnet"]
GradMaker = Callable[..., Callable[[Any], Any]]

_REGISTRY: dict[str, CustomOperator] = {}


class CustomOperator:
    """A forward function compiled into a registered MXNet ``CustomOp``.

    Created by :func:`customop`; call it like the function.  With ``mx.nd``
    arrays it returns NDArrays (and records for ``mx.autograd``), with
    ``mx.sym`` symbols a Symbol, with NumPy arrays it just runs the forward.
    """

    def __init__(self, fn: Callable, mode: Mode, *, name: str | None = None,
                 need_top_grad: bool = True, infer_shape: Callable | None = None,
                 infer_type: Callable | None = None, num_outputs: int | None = None,
                 auto_grad: bool = True):
        if mode not in MODES:
            raise ValueError(f"customop mode must be 'numpy' or 'mxnet', got {mode!r}")
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.mode = mode
        self.mode_impl = MODES[mode]
        self.op_type: str = name or f"{fn.__module__}.{fn.__qualname__}"
        self.signature = Signature(fn, self.op_type)
        self.need_top_grad = bool(need_top_grad)
        self.user_infer_shape = infer_shape
        self.user_infer_type = infer_type
        self.num_outputs: int = num_outputs if num_outputs is not None else _count_returns(fn)
        self.auto_grad = bool(auto_grad)
        self.grads: dict[int, GradMaker] = {}
        self.inference = Inference(self)
        self._pkeys: dict[tuple, str] = {}
        _register(self, named=name is not None)

    # ---- public API -----------------------------------------------------------------
    def def_grad(self, fn: GradMaker, argnum: int = 0) -> CustomOperator:
        """Register ``fn(ans, *inputs, **params) -> grad(g)`` for input ``argnum``.

        ``grad(g)`` maps the upstream gradient ``g`` (a tuple for several
        outputs; ``None`` when ``need_top_grad=False``) to the gradient of
        input ``argnum``, shaped like that input.  Returns the operator, so
        registrations chain.
        """
        names = self.signature.inputs
        if not isinstance(argnum, int) or not 0 <= argnum < len(names):
            raise errors.mark(IndexError(
                f"customop {self.op_type!r}: def_grad argnum={argnum!r} is out of range; the "
                f"inputs are {', '.join(f'{i}={n}' for i, n in enumerate(names))}"))
        if not callable(fn):
            raise errors.mark(TypeError(f"customop {self.op_type!r}: def_grad needs a callable, "
                                        f"got {type(fn).__name__}"))
        self.grads[argnum] = fn
        return self

    @property
    def output_names(self) -> list[str]:
        return ["output"] if self.num_outputs == 1 else [
            f"output{i}" for i in range(self.num_outputs)]

    def __repr__(self) -> str:
        ins = ", ".join(f"{n}{'*' if i in self.grads else ''}"
                        for i, n in enumerate(self.signature.inputs))
        grads = ", ".join(self.signature.inputs[i] for i in sorted(self.grads)) or "none"
        extra = "" if self.need_top_grad else ", need_top_grad=False"
        return (f"<customop {self.op_type!r} mode={self.mode!r} inputs=({ins}) "
                f"outputs={self.num_outputs} def_grad=[{grads}]"
                f"{', auto_grad' if self.auto_grad else ''}{extra}>")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        node_name = kwargs.pop("name", None)
        inputs, params = self.signature.bind(args, kwargs)
        if any(isinstance(a, mx.sym.Symbol) for a in inputs):
            return self._call_symbol(inputs, params, node_name)
        if any(isinstance(a, mx.nd.NDArray) for a in inputs):
            return dispatch.call_ndarray(self, inputs, params)
        return self._call_numpy(inputs, params)

    # ---- pieces shared by every dispatch path -----------------------------------------
    def error(self, cls: type[BaseException], msg: str) -> BaseException:
        return errors.mark(cls(f"customop {self.op_type!r}: {msg}"))

    def param_key(self, params: dict[str, Any]) -> str:
        key = tuple(sorted(params.items(), key=lambda kv: kv[0]))
        try:
            return self._pkeys[key]
        except (KeyError, TypeError):
            text = repr(key)
            try:
                self._pkeys[key] = text
            except TypeError:  # unhashable (list/dict) parameters: not cached
                pass
            return text

    def run_forward(self, args: list[Any], params: dict[str, Any],
                    where: str = "forward") -> list[Any]:
        """Call the forward on mode arrays; return its outputs as a validated list."""
        try:
            result = self.fn(*args, **params)
        except Exception as exc:
            raise errors.named(exc, self.op_type, where) from None
        return self._check_outputs(result)

    def run_backward(self, args: list[Any], outs: list[Any], out_grads: list[Any] | None,
                     params: dict[str, Any], wanted: list[bool]) -> list[Any | None]:
        """Gradients for each input (``None`` means zero); see :mod:`customop.gradients`."""
        ans = outs[0] if self.num_outputs == 1 else tuple(outs)
        g = None
        if self.need_top_grad and out_grads is not None:
            g = out_grads[0] if self.num_outputs == 1 else tuple(out_grads)
        grads = gradients.compute_all(self, ans, args, g, params, wanted)
        return [None if grad is None else self._check_grad(i, arg, grad)
                for i, (arg, grad) in enumerate(zip(args, grads))]

    # ---- validation ---------------------------------------------------------------------
    def _check_outputs(self, result: Any) -> list[Any]:
        n = self.num_outputs
        if isinstance(result, tuple | list):
            if n == 1:
                raise self.error(TypeError, f"forward returned a {type(result).__name__} of "
                                 f"{len(result)} values but the op declares 1 output; pass "
                                 f"num_outputs={len(result)} to @customop")
            outs = list(result)
        else:
            outs = [result]
        if len(outs) != n:
            raise self.error(TypeError, f"forward returned {len(outs)} output(s) but the op "
                             f"declares {n}; pass num_outputs={len(outs)} to @customop")
        return [self._check_array(o, f"output {i}") for i, o in enumerate(outs)]

    def _check_array(self, value: Any, what: str) -> Any:
        if self.mode == "mxnet":
            if not isinstance(value, mx.nd.NDArray):
                raise self.error(TypeError, f"{what} is a {type(value).__name__}; in 'mxnet' "
                                 "mode return mx.nd.NDArray (or decorate with 'numpy')")
            return value
        if isinstance(value, mx.nd.NDArray):
            raise self.error(TypeError, f"{what} is an mx.nd.NDArray; in 'numpy' mode return "
                             "numpy arrays (or decorate with 'mxnet')")
        arr = np.asarray(value)
        if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number)
                                       or arr.dtype == np.bool_):
            raise self.error(TypeError, f"{what} is a {type(value).__name__} "
                             f"(dtype {arr.dtype}); return numeric numpy arrays")
        return arr

    def _check_grad(self, i: int, arg: Any, grad: Any) -> Any:
        name = self.signature.inputs[i]
        grad = self._check_array(grad, f"the gradient for input {name!r} (argnum {i})")
        want, got = self.mode_impl.shape(arg), self.mode_impl.shape(grad)
        if tuple(want) != tuple(got) and not (np.prod(want) == 1 == np.prod(got)):
            raise self.error(ValueError, f"the gradient for input {name!r} (argnum {i}) has "
                             f"shape {tuple(got)} but the input has shape {tuple(want)}")
        return grad

    # ---- call styles other than mx.nd ---------------------------------------------------
    def _call_symbol(self, inputs: list[Any], params: dict[str, Any], node_name: str | None):
        for name, a in zip(self.signature.inputs, inputs):
            if not isinstance(a, mx.sym.Symbol):
                raise self.error(TypeError, f"input {name!r} is a {type(a).__name__}, but other "
                                 "inputs are mx.sym.Symbol; make every input a Symbol "
                                 "(e.g. mx.sym.Variable)")
        attrs = {k: _params.encode(v) for k, v in params.items()}
        if node_name is not None:
            attrs["name"] = node_name
        sym = mx.sym.Custom(*inputs, op_type=self.op_type, **attrs)
        return sym if self.num_outputs == 1 else tuple(sym[i] for i in range(self.num_outputs))

    def _call_numpy(self, inputs: list[Any], params: dict[str, Any]):
        for name, a in zip(self.signature.inputs, inputs):
            if not isinstance(a, np.ndarray | np.generic | bool | int | float):
                raise self.error(TypeError, f"input {name!r} is a {type(a).__name__}; pass "
                                 "numpy arrays, mx.nd.NDArray or mx.sym.Symbol")
        args = [self.mode_impl.from_numpy(np.asarray(a)) for a in inputs]
        outs = [self.mode_impl.to_numpy(o) for o in self.run_forward(args, params)]
        return outs[0] if self.num_outputs == 1 else tuple(outs)


def _count_returns(fn: Callable) -> int:
    """Outputs a forward returns: the length of its ``return a, b`` tuples, else 1."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return 1
    body = tree.body[0]
    sizes = set()
    stack = list(ast.iter_child_nodes(body))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            continue  # returns of nested functions are not ours
        if isinstance(node, ast.Return) and node.value is not None:
            sizes.add(len(node.value.elts) if isinstance(node.value, ast.Tuple) else 1)
        stack.extend(ast.iter_child_nodes(node))
    return sizes.pop() if len(sizes) == 1 else 1


def _register(op: CustomOperator, named: bool) -> None:
    old = _REGISTRY.get(op.op_type)
    same = old is not None and (old.fn.__module__, old.fn.__qualname__) == (
        op.fn.__module__, op.fn.__qualname__)
    if old is not None and not same:
        raise ValueError(
            f"customop name {op.op_type!r} is already used by "
            f"{old.fn.__module__}.{old.fn.__qualname__}; pass a different name= to @customop")
    if old is not None and not named and _distinct(old.fn, op.fn):
        raise errors.mark(ValueError(
            f"customop {op.op_type!r}: another function of the same name is already registered "
            f"({_made_by(old.fn)}; this one is {_made_by(op.fn)}); graphs, hybridized blocks "
            "and mx.nd.Custom find an op by its name and would run only the last one: pass "
            "name= to @customop to give each its own"))
    if old is None:
        prop.register(op.op_type, _REGISTRY)
    _REGISTRY[op.op_type] = op  # a redefinition (notebook re-run, reload) replaces the old one


def _distinct(old: Callable, new: Callable) -> bool:
    """Whether two same-named functions are different operators rather than a redefinition.

    A re-run notebook cell or a reloaded module compiles new code (or the same code in a new
    file): that replaces.  One factory called twice shares its code object, so only its
    closure and defaults can differ; two lambdas of one file differ by their line.
    """
    if old is new:
        return False
    a, b = old.__code__, new.__code__
    if a is b:
        return not (_same_values(old.__defaults__, new.__defaults__)
                    and _same_values(old.__kwdefaults__, new.__kwdefaults__)
                    and _same_values([c.cell_contents for c in old.__closure__ or ()],
                                     [c.cell_contents for c in new.__closure__ or ()]))
    return a.co_filename == b.co_filename and a.co_firstlineno != b.co_firstlineno


def _same_values(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_values(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same_values(x, y) for x, y in zip(a, b))
    literal = (bool, int, float, complex, str, bytes, type(None))
    return type(a) is type(b) and isinstance(a, literal) and a == b


def _made_by(fn: Callable) -> str:
    code = fn.__code__
    return f"{fn.__qualname__} at {code.co_filename}:{code.co_firstlineno}"


def customop(mode: Mode, *, name: str | None = None, need_top_grad: bool = True,
             infer_shape: Callable | None = None, infer_type: Callable | None = None,
             num_outputs: int | None = None,
             auto_grad: bool = True) -> Callable[[Callable], CustomOperator]:
    """Turn a forward function into a registered MXNet custom operator.

    Args:
        mode: ``'numpy'`` (forward and gradients see NumPy arrays) or ``'mxnet'``
            (they see ``mx.nd.NDArray`` on the operator's context).
        name: the registered ``op_type``; default ``"<module>.<qualname>"``.
        need_top_grad: ``False`` declares an output (loss) layer whose gradient
            ignores the head gradient; its closures receive ``g=None``.
        infer_shape: ``f(*input_shapes, **params) -> shape or [shapes]`` for a
            forward that cannot run on placeholder inputs.
        infer_type: ``f(*input_dtypes, **params) -> dtype or [dtypes]``.
        num_outputs: how many outputs the forward returns; default read from
            its ``return a, b`` statements.
        auto_grad: give inputs without ``def_grad`` an automatic gradient.

    Positional parameters without defaults are array inputs; parameters with
    defaults are operator parameters (Python literals, kept exactly).

    Example:
        >>> import mxnet as mx, numpy
        >>> from customop import customop
        >>> @customop('numpy')
        ... def scale(x, factor=2.0):
        ...     return x * factor
        >>> scale.def_grad(lambda ans, x, factor=2.0: lambda g: g * factor)
        <customop ...>
        >>> scale(mx.nd.ones((2,)), factor=3.0).asnumpy()
        array([3., 3.], dtype=float32)
    """
    def wrap(fn: Callable) -> CustomOperator:
        return CustomOperator(fn, mode, name=name, need_top_grad=need_top_grad,
                              infer_shape=infer_shape, infer_type=infer_type,
                              num_outputs=num_outputs, auto_grad=auto_grad)
    return wrap
