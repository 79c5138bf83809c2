"""The ``@customop`` decorator and the operator object it returns."""
from __future__ import annotations

import ast
import functools
import inspect
import itertools
import textwrap
import typing
from collections.abc import Callable
from typing import Any

import mxnet as mx

from . import dispatch, errors, gradients, registry
from .inference import Inference
from .modes import MODES
from .outputs import OutputCount
from .signature import Signature

Mode = str  # 'numpy' or 'mxnet'
GradMaker = typing.Callable[..., typing.Callable[[Any], Any]]  # run-time alias (Python 3.8)
CountSpec = typing.Union[int, typing.Callable[..., int]]  # run-time alias (Python 3.8)


class CustomOperator:
    """A forward function compiled into a registered MXNet ``CustomOp``.

    Created by :func:`customop`; call it like the function.  With ``mx.nd``
    arrays it returns NDArrays (and records for ``mx.autograd``), with
    ``mx.sym`` symbols a Symbol, with NumPy arrays it just runs the forward.
    """

    def __init__(self, fn: Callable, mode: Mode, *, name: str | None = None,
                 need_top_grad: bool = True, infer_shape: Callable | None = None,
                 infer_type: Callable | None = None, num_outputs: CountSpec | None = None,
                 auto_grad: bool = True, aux: dict[str, Callable] | None = None,
                 optional: tuple[str, ...] | list[str] = (),
                 no_grad: tuple[str, ...] | list[str] = ()):
        if mode not in MODES:
            raise ValueError(f"customop mode must be 'numpy' or 'mxnet', got {mode!r}")
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.mode = mode
        self.mode_impl = MODES[mode]
        self.op_type: str = name or f"{registry.module_of(fn)}.{fn.__qualname__}"
        aux = dict(aux or {})
        for key, shape_fn in aux.items():
            if not callable(shape_fn):
                raise TypeError(f"customop {self.op_type!r}: aux={{{key!r}: ...}} must map the "
                                "state's name to a function of the input shapes returning its "
                                f"shape, got {type(shape_fn).__name__}")
        self.aux_shape_fns: dict[str, Callable] = aux
        self.signature = Signature(fn, errors.shown(self.op_type), tuple(aux), tuple(optional))
        self.twins: dict[str, CustomOperator] = {mode: self}
        self.need_top_grad = bool(need_top_grad)
        self.user_infer_shape = infer_shape
        self.user_infer_type = infer_type
        # As declared (an int, or a function of the parameters); op.outputs.of(params) counts.
        self.outputs = OutputCount(num_outputs if num_outputs is not None else
                                   _count_returns(fn), self.signature, self.op_type)
        self.num_outputs: CountSpec = self.outputs.declared
        self.auto_grad = bool(auto_grad)
        if isinstance(no_grad, str):
            no_grad = (no_grad,)
        unknown = [n for n in no_grad if n not in self.signature.inputs]
        if unknown:
            raise TypeError(f"customop {self.op_type!r}: no_grad names {', '.join(unknown)}, "
                            f"which is not an input; the inputs are "
                            f"{', '.join(self.signature.inputs) or 'none'}")
        self.no_grad: frozenset[str] = frozenset(no_grad)
        self.grads: dict[int, GradMaker] = {}
        self._update_native()
        self.inference = Inference(self)
        self._pkeys: dict[tuple, str] = {}
        registry.register(self, named=name is not None)
        # One registered operator per set of absent optional inputs (MXNet's argument list
        # is fixed per op_type); this op is the one with every input present.
        self.variants: dict[frozenset[str], CustomOperator] = {}
        opt = self.signature.optional
        for k in range(1, len(opt) + 1):
            for absent in itertools.combinations(opt, k):
                self.variants[frozenset(absent)] = _Variant(self, absent)

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
            raise self.error(IndexError, (
                f"def_grad argnum={argnum!r} is out of range; the inputs are "
                f"{', '.join(f'{i}={n}' for i, n in enumerate(names))}"))
        if not callable(fn):
            raise self.error(TypeError, f"def_grad needs a callable, got {type(fn).__name__}")
        if names[argnum] in self.no_grad:
            raise self.error(ValueError, f"input {names[argnum]!r} is declared no_grad (it "
                             "gets no gradient); drop it from no_grad to give it one")
        self.grads[argnum] = fn
        self._update_native()
        for variant in self.variants.values():
            variant.adopt_grads()
        return self

    def _update_native(self) -> None:
        # An 'mxnet'-mode op with only automatic gradients records its own mx.nd ops.
        self.records_natively = (self.mode == "mxnet" and not self.grads and self.auto_grad
                                 and self.need_top_grad)

    def twin(self, mode: Mode, **options: Any) -> Callable[[Callable], CustomOperator]:
        """Decorate the same operator's implementation in the other mode.

        The twin computes the same math (e.g. the readable ``'numpy'`` reference
        of a fast ``'mxnet'`` op); it must take the same inputs, auxiliary states
        and parameters.  It is a full operator with its own ``op_type``
        (``"<op_type>.<mode>"``) and gradients, shares this op's docstring, and is
        reached as ``op.numpy`` / ``op.mxnet`` from either twin.  ``options``
        override the decorator arguments copied from this op.

        Example:
            >>> import mxnet as mx, numpy
            >>> from customop import customop
            >>> @customop('mxnet')
            ... def double(x):
            ...     \"\"\"Twice the input.\"\"\"
            ...     return 2 * x
            >>> @double.twin('numpy')
            ... def _double_reference(x):
            ...     return 2 * numpy.asarray(x)
            >>> double.numpy(mx.nd.ones((2,))).asnumpy(), double.mxnet is double
            (array([2., 2.], dtype=float32), True)
        """
        if mode not in MODES:
            raise self.error(ValueError, f"twin mode must be 'numpy' or 'mxnet', got {mode!r}")
        if mode in self.twins:
            raise self.error(ValueError, f"already has a {mode!r} implementation "
                             f"({self.twins[mode].op_type!r}); a twin is in the other mode")
        settings = dict(name=f"{self.op_type}.{mode}", need_top_grad=self.need_top_grad,
                        infer_shape=self.user_infer_shape, infer_type=self.user_infer_type,
                        num_outputs=self.num_outputs, auto_grad=self.auto_grad,
                        aux=self.aux_shape_fns, optional=tuple(self.signature.optional),
                        no_grad=tuple(self.no_grad))
        settings.update(options)

        def wrap(fn: Callable) -> CustomOperator:
            other = CustomOperator(fn, mode, **settings)
            mine, theirs = self.signature, other.signature
            if (mine.inputs, mine.aux, mine.required, mine.defaults) != (
                    theirs.inputs, theirs.aux, theirs.required, theirs.defaults):
                raise self.error(TypeError, f"twin {fn.__qualname__!r} must take the same "
                                 f"arrays and parameters: {mine.describe()}, parameters "
                                 f"{_params_text(mine)}; got {theirs.describe()}, parameters "
                                 f"{_params_text(theirs)}")
            other.__doc__ = self.__doc__
            self.twins[mode] = other
            other.twins = self.twins
            return other
        return wrap

    @property
    def numpy(self) -> CustomOperator:
        """The ``'numpy'``-mode implementation of this operator (see :meth:`twin`)."""
        return self._twin("numpy")

    @property
    def mxnet(self) -> CustomOperator:
        """The ``'mxnet'``-mode implementation of this operator (see :meth:`twin`)."""
        return self._twin("mxnet")

    def _twin(self, mode: str) -> CustomOperator:
        try:
            return self.twins[mode]
        except KeyError:
            raise self.error(AttributeError, f"has no {mode!r}-mode twin; add one with "
                             f"@{self.__name__}.twin({mode!r})") from None

    def variant(self, present: int | list[str]) -> CustomOperator:
        """The operator registered for a call with only these inputs (names, or the first n).

        Optional inputs left out of a call are run by a registered variant whose
        ``op_type`` is ``"<op_type>~without_<name>"``; calls pick it themselves.
        """
        names = self.signature.inputs
        given = names[:present] if isinstance(present, int) else list(present)
        absent = frozenset(n for n in names if n not in given)
        if not absent:
            return self
        if absent not in self.variants:
            raise self.error(TypeError, f"input(s) {', '.join(sorted(absent))} cannot be left "
                             f"out (optional inputs: {', '.join(self.signature.optional)})")
        return self.variants[absent]

    def __repr__(self) -> str:
        ins = ", ".join(f"{n}{'*' if i in self.grads else ''}"
                        for i, n in enumerate(self.signature.inputs))
        grads = ", ".join(self.signature.inputs[i] for i in sorted(self.grads)) or "none"
        extra = "" if self.need_top_grad else ", need_top_grad=False"
        if self.no_grad:
            extra += f", no_grad=[{', '.join(sorted(self.no_grad))}]"
        return (f"<customop {self.op_type!r} mode={self.mode!r} inputs=({ins}) "
                f"outputs={self.outputs!r} def_grad=[{grads}]"
                f"{', auto_grad' if self.auto_grad else ''}{extra}>")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the operator: NDArrays give NDArrays (recorded under ``mx.autograd.record()``),
        Symbols a Symbol node (``name=`` names it), NumPy arrays the forward's result."""
        node_name = kwargs.pop("name", None)
        ctx = kwargs.pop("ctx", None)
        arrays, params = self.signature.bind(args, kwargs)
        if self.variants and any(a is None for a in arrays):
            absent = frozenset(n for n, a in zip(self.signature.inputs, arrays) if a is None)
            return self.variants[absent](*[a for a in arrays if a is not None], name=node_name,
                                          ctx=ctx, **params)
        if any(_is_np_interface(a) for a in arrays):
            return _as_np_interface(self(*[_as_legacy(a) for a in arrays], name=node_name,
                                         ctx=ctx, **params))
        if any(isinstance(a, mx.sym.Symbol) for a in arrays):
            return dispatch.call_symbol(self, arrays, params, node_name)
        if not self.signature.inputs:
            if node_name is not None:
                raise self.error(TypeError, "name= names a Symbol node, but an operator "
                                 "without inputs called directly returns NDArrays; build "
                                 f"its Symbol with mx.sym.Custom(op_type={self.op_type!r}, "
                                 "name=..., **params)")
            return dispatch.call_without_inputs(self, params, ctx or mx.current_context())
        if any(isinstance(a, mx.nd.NDArray) for a in arrays):
            return dispatch.call_ndarray(self, arrays, params)
        return dispatch.call_numpy(self, arrays, params)

    def __get__(self, instance: Any, owner: type | None = None) -> CustomOperator:
        # Stored on a class, an op stays the op (as a staticmethod would), never a bound
        # method.  Being a non-data descriptor also makes it a routine to `inspect`, so
        # help(op), pydoc, doctest and Sphinx's autodoc document it as the function it
        # wraps (its forward's signature and docstring) instead of printing its repr.
        return self

    def __reduce__(self) -> tuple:
        # By reference: the receiving process imports the defining module (which registers
        # the op) and finds the op by op_type, so pickle/multiprocessing hand over the op itself.
        return registry.by_reference, (self.op_type, registry.module_of(self.fn))

    # ---- pieces shared by every dispatch path -----------------------------------------

    def error(self, cls: type, msg: str) -> BaseException:
        """An exception of type ``cls`` whose message names this operator (not raised here).

        Example:
            >>> from customop import ops
            >>> ops.tile.error(ValueError, "reps must be positive")
            ValueError("customop 'ops.tile': reps must be positive")
        """
        return errors.op_error(self.op_type, cls, msg)


class _Variant(CustomOperator):
    """The operator for calls that leave some optional inputs out (they reach it as None)."""

    def __init__(self, full: CustomOperator, absent: tuple[str, ...]):
        names = full.signature.inputs
        self.full = full
        self.positions = [i for i, n in enumerate(names) if n not in absent]
        sig = inspect.signature(full.fn)
        params = [p for p in sig.parameters.values() if p.name not in absent]
        present = [p.replace(default=inspect.Parameter.empty) if p.name in names else p
                   for p in params]

        def forward(*arrays, **kw):
            return full.fn(*self._full_args(arrays), **kw)

        forward.__signature__ = sig.replace(parameters=present)
        forward.__module__ = full.fn.__module__
        forward.__qualname__ = f"{full.fn.__qualname__}~without_{'_'.join(absent)}"
        forward.__doc__ = full.fn.__doc__
        super().__init__(forward, full.mode, name=f"{full.op_type}~without_{'_'.join(absent)}",
                         need_top_grad=full.need_top_grad, infer_shape=_dropping(
                             full.user_infer_shape, self), infer_type=_dropping(
                             full.user_infer_type, self), num_outputs=full.num_outputs,
                         auto_grad=full.auto_grad,
                         no_grad=tuple(n for n in full.no_grad if n not in absent))
        self.adopt_grads()

    def _full_args(self, arrays):
        full = [None] * len(self.full.signature.inputs)
        for i, a in zip(self.positions, arrays):
            full[i] = a
        return [*full, *arrays[len(self.positions):]]

    def adopt_grads(self) -> None:
        self.grads = {}
        for j, i in enumerate(self.positions):
            if i in self.full.grads:
                self.grads[j] = self._grad_for(self.full.grads[i])
        self._update_native()

    def _grad_for(self, maker):
        def grad(ans, *arrays, **params):
            return maker(ans, *self._full_args(arrays), **params)
        # Seen from outside, it takes by keyword what the full op's closure takes (the
        # residuals and defaults it names reach it through **params).
        found, var_kw = gradients.keywords(maker, 1 + len(self.full.signature.arrays))
        P = inspect.Parameter
        grad.__signature__ = inspect.Signature([
            P("ans", P.POSITIONAL_ONLY), P("arrays", P.VAR_POSITIONAL),
            *[p.replace(kind=P.KEYWORD_ONLY) for p in found],
            *([P("params", P.VAR_KEYWORD)] if var_kw else [])])
        return grad


def _dropping(fn: Callable | None, variant: _Variant) -> Callable | None:
    # infer_shape/infer_type of the full op, called with None for the absent inputs.
    if fn is None:
        return None
    return lambda *values, **params: fn(*variant._full_args(values), **params)


def _params_text(sig: Signature) -> str:
    return ", ".join([*sig.required, *(f"{k}={v!r}" for k, v in sig.defaults.items())]) or "none"


def _is_np_interface(a: Any) -> bool:
    return isinstance(a, mx.np.ndarray) or (isinstance(a, mx.sym.Symbol) and isinstance(
        a, mx.sym.np._Symbol))


def _as_legacy(a: Any) -> Any:
    return a.as_nd_ndarray() if _is_np_interface(a) else a


def _as_np_interface(out: Any) -> Any:
    if isinstance(out, tuple):
        return tuple(_as_np_interface(o) for o in out)
    return out.as_np_ndarray() if isinstance(out, (mx.nd.NDArray, mx.sym.Symbol)) else out


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
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue  # returns of nested functions are not ours
        if isinstance(node, ast.Return) and node.value is not None:
            value = node.value
            if isinstance(value, ast.Call) and _called_name(value) == "residuals":
                # return residuals(a, b, saved=s): the outputs are the positional arguments
                value = value.args[0] if len(value.args) == 1 else ast.Tuple(value.args)
            sizes.add(len(value.elts) if isinstance(value, ast.Tuple) else 1)
        stack.extend(ast.iter_child_nodes(node))
    return sizes.pop() if len(sizes) == 1 else 1


def _called_name(call: ast.Call) -> str | None:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def customop(mode: Mode, *, name: str | None = None, need_top_grad: bool = True,
             infer_shape: Callable | None = None, infer_type: Callable | None = None,
             num_outputs: CountSpec | None = None, auto_grad: bool = True,
             aux: dict[str, Callable] | None = None,
             optional: tuple[str, ...] | list[str] = (),
             no_grad: tuple[str, ...] | list[str] = ()) -> Callable[[Callable], CustomOperator]:
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
            its ``return a, b`` statements.  When the count depends on a
            parameter (``ret_typ='both'``), a function of the op's parameters:
            it is called with the parameters it names (or all, through
            ``**params``), defaults filled in, and returns an int.  Every call
            and every graph node then has the count of its own parameters
            (example below).
        auto_grad: give inputs without ``def_grad`` an automatic gradient.
        no_grad: names of inputs that get no gradient (zero), such as labels,
            class ids or a loss's weights: declared here once, for both twins,
            instead of closures that return zeros.  Integer inputs never get
            one anyway.
        aux: ``{name: shape_fn}`` declares the forward's last positional array
            parameters as auxiliary states (MXNet's ``list_auxiliary_states``):
            state the op owns and updates in place, never differentiated.
            ``shape_fn(*input_shapes, **params)`` gives its shape; its dtype is
            the first floating input's (float32 without one).  Symbol calls may
            leave them out (MXNet creates ``<node>_<name>`` variables,
            zero-initialised); array calls pass them.
        optional: names of positional parameters defaulting to ``None`` that are
            optional array inputs (``def f(pred, label, weight=None)``): a call
            may leave them out, on every call style, and the forward and the
            gradient closures then see ``None``.

    Positional parameters without defaults are array inputs; parameters with
    defaults are operator parameters (Python literals, kept exactly).  A
    forward without array inputs (a generator) is called with parameters only
    and returns NDArrays on ``ctx=`` (default ``mx.current_context()``).

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

        An output count that follows a parameter: ``split=True`` returns two arrays.

        >>> @customop('numpy', num_outputs=lambda split: 2 if split else 1)
        ... def halves(x, split=False):
        ...     h = x.shape[0] // 2
        ...     return (x[:h], x[h:]) if split else x
        >>> a, b = halves(mx.nd.arange(4), split=True)
        >>> a.asnumpy(), b.asnumpy()
        (array([0., 1.], dtype=float32), array([2., 3.], dtype=float32))
        >>> halves(mx.nd.arange(4)).shape
        (4,)
        >>> len(halves(mx.sym.var('x'), split=True))  # a Symbol per output
        2
    """
    def wrap(fn: Callable) -> CustomOperator:
        return CustomOperator(fn, mode, name=name, need_top_grad=need_top_grad,
                              infer_shape=infer_shape, infer_type=infer_type,
                              num_outputs=num_outputs, auto_grad=auto_grad, aux=aux,
                              optional=optional, no_grad=no_grad)
    return wrap
