"""The ``@customop`` decorator and the operator object it returns."""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
import types
import typing
from collections.abc import Callable
from typing import Any

from . import aux_merge, dispatch, errors, gradients, registry, siblings
from .arguments import Signature
from .aux_merge import AUX_RULES
from .inference import Inference
from .input_shapes import InputShapes
from .modes import MODES
from .outputs import OutputCount

Mode = str  # 'numpy' or 'mxnet'
GradMaker = typing.Callable[..., typing.Callable[[Any], Any]]  # run-time alias (Python 3.8)
CountSpec = typing.Union[int, typing.Callable[..., int]]  # run-time alias (Python 3.8)


class CustomOperator:
    """A forward function compiled into a registered MXNet ``CustomOp``.

    Created by :func:`customop`; call it like the function.  With ``mx.nd``
    arrays it returns NDArrays (and records for ``mx.autograd``), with
    ``mx.sym`` symbols a Symbol, with NumPy arrays it just runs the forward.
    """

    def __init__(self, fn: Callable, mode: Mode, **options: Any):
        # ``options``: the keywords of :func:`customop`, whose signature owns their list and
        # defaults.
        if mode not in MODES:
            raise ValueError(f"customop mode must be 'numpy' or 'mxnet', got {mode!r}")
        o = _settings(options)
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.mode = mode
        self.mode_impl = MODES[mode]
        self.op_type: str = o.name or f"{registry.module_of(fn)}.{fn.__qualname__}"
        self.aux_shape_fns, self.aux_rules = _aux_spec(self.op_type, o.aux)
        aux_merge.declare_rules(self.op_type, self.aux_rules)
        self.signature = Signature(
            fn, errors.shown(self.op_type), tuple(self.aux_shape_fns), tuple(o.optional)
        )
        self.twins: dict[str, CustomOperator] = {mode: self}
        # a call with NDArrays alone skips bind(): no aux states, no required parameter
        self.arity = len(self.signature.inputs)
        self.plain_calls = self.arity > 0 and not self.signature.aux and not self.signature.required
        self.need_top_grad = bool(o.need_top_grad)
        self.user_infer_shape = o.infer_shape
        self.user_infer_type = o.infer_type
        self.input_shapes = InputShapes(
            o.infer_input_shape, self.signature.inputs, self.signature.aux, self.op_type
        )
        self._check_shape_functions()
        # As declared (an int, or a function of the parameters); op.outputs.of(params) counts.
        self.user_num_outputs, self.user_outputs = o.num_outputs, o.outputs
        counted = _count_returns(fn) if o.num_outputs is None and o.outputs is None else 1
        self.outputs = OutputCount(
            o.num_outputs, self.signature, self.op_type, names=o.outputs, counted=counted
        )
        self.num_outputs: CountSpec = self.outputs.declared
        self.auto_grad = bool(o.auto_grad)
        no_grad = (o.no_grad,) if isinstance(o.no_grad, str) else o.no_grad
        unknown = [n for n in no_grad if n not in self.signature.inputs]
        if unknown:
            raise TypeError(
                f"customop {self.op_type!r}: no_grad names {', '.join(unknown)}, "
                f"which is not an input; the inputs are "
                f"{', '.join(self.signature.inputs) or 'none'}"
            )
        self.no_grad: frozenset[str] = frozenset(no_grad)
        self.inline = bool(o.inline)
        self.grads: dict[int, GradMaker] = {}
        # Inputs whose closure returns several inputs' gradients at once (def_grad(argnum=(..)))
        self.grad_groups: dict[int, gradients.Joint] = {}
        self.update_native()
        self.inference = Inference(self)
        self._pkeys: dict[tuple, str] = {}
        registry.register(self, named=o.name is not None)
        # One registered operator per set of absent optional inputs (MXNet's argument list
        # is fixed per op_type); this op is the one with every input present.
        self.variant_of: siblings.Variant | None = None  # (set on a variant: its full op)
        self.variants: dict[frozenset[str], CustomOperator] = siblings.variants(
            self, CustomOperator
        )

    # ---- public API -----------------------------------------------------------------
    def def_grad(self, fn: GradMaker, argnum: int | tuple[int, ...] = 0) -> CustomOperator:
        """Register ``fn(ans, *inputs, **params) -> grad(g)`` for input ``argnum``.

        ``grad(g)`` maps the upstream gradient ``g`` (a tuple for several
        outputs; ``None`` when ``need_top_grad=False``) to the gradient of
        input ``argnum``, shaped like that input.  Returns the operator, so
        registrations chain.

        With a tuple ``argnum=(0, 2)``, ``grad(g)`` returns the gradients of
        those inputs at once, as a tuple in that order (``None`` for a zero one),
        computed from shared terms: it is called once per backward (so it may
        also update an aux state once).  A later registration for one of those
        inputs replaces the joint closure for that input only.

        Example:
            >>> import mxnet as mx, numpy as np
            >>> from customop import customop
            >>> @customop('numpy')
            ... def scaled_dot(x, w, *, k=1.0):
            ...     return k * (x * w).sum(axis=1)
            >>> def scaled_dot_grad(ans, x, w, *, k=1.0):
            ...     def grad(g):
            ...         shared = k * g[:, None]           # computed once for both inputs
            ...         return shared * w, shared * x     # (d/dx, d/dw), in argnum order
            ...     return grad
            >>> scaled_dot.def_grad(scaled_dot_grad, argnum=(0, 1))
            <customop ...>
            >>> x, w = mx.nd.ones((2, 3)), mx.nd.full((2, 3), 2.0)
            >>> x.attach_grad(); w.attach_grad()
            >>> with mx.autograd.record():
            ...     y = scaled_dot(x, w, k=0.5)
            >>> y.backward()
            >>> x.grad.asnumpy()[0], w.grad.asnumpy()[0]
            (array([1., 1., 1.], dtype=float32), array([0.5, 0.5, 0.5], dtype=float32))
        """
        names = self.signature.inputs
        joint = isinstance(argnum, (tuple, list))
        argnums = tuple(argnum) if joint else (argnum,)
        listed = ", ".join(f"{i}={n}" for i, n in enumerate(names))
        if joint and not argnums:
            raise self.error(
                ValueError, f"def_grad argnum=() names no input; the inputs are {listed}"
            )
        for a in argnums:
            if isinstance(a, bool) or not isinstance(a, int) or not 0 <= a < len(names):
                raise self.error(
                    IndexError,
                    (f"def_grad argnum={argnum!r} is out of range; the inputs are {listed}"),
                )
        if len(set(argnums)) != len(argnums):
            raise self.error(ValueError, f"def_grad argnum={argnum!r} names an input twice")
        if not callable(fn):
            raise self.error(TypeError, f"def_grad needs a callable, got {type(fn).__name__}")
        for a in argnums:
            if names[a] in self.no_grad:
                raise self.error(
                    ValueError,
                    f"input {names[a]!r} is declared no_grad (it "
                    "gets no gradient); drop it from no_grad to give it one",
                )
        self.signature.check_helper(
            fn, "gradient maker", ["ans", *self.signature.arrays], residuals=True
        )
        group = gradients.Joint.of(argnums) if joint else None
        for a in argnums:
            self.grads[a] = fn
            if group is None:
                self.grad_groups.pop(a, None)
            else:
                self.grad_groups[a] = group
        self.update_native()
        siblings.adopt_grads(self)
        return self

    def _check_shape_functions(self) -> None:
        # Each is called with the input shapes (never the aux states') and the parameters a
        # call sets, by keyword: a mismatch raises here, not at the first call that sets one.
        sig, inputs = self.signature, self.signature.inputs
        helpers = [
            ("infer_shape", self.user_infer_shape),
            ("infer_type", self.user_infer_type),
            *[(f"the shape function of aux state {n!r}", f) for n, f in self.aux_shape_fns.items()],
            *[(f"infer_input_shape for input {n!r}", f) for n, f in self.input_shapes.fns.items()],
        ]
        for what, fn in helpers:
            if fn is not None:
                sig.check_helper(fn, what, inputs)

    def update_native(self) -> None:
        """Whether this op records its own ``mx.nd`` operators (an ``'mxnet'``-mode op with
        only automatic gradients), read again after its gradients changed."""
        self.records_natively = (
            self.mode == "mxnet" and not self.grads and self.auto_grad and self.need_top_grad
        )

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
        return siblings.twin(self, mode, options, CustomOperator)

    @property
    def numpy(self) -> CustomOperator:
        """The ``'numpy'``-mode implementation of this operator (see :meth:`twin`)."""
        return siblings.twin_of(self, "numpy")

    @property
    def mxnet(self) -> CustomOperator:
        """The ``'mxnet'``-mode implementation of this operator (see :meth:`twin`)."""
        return siblings.twin_of(self, "mxnet")

    def variant(self, present: int | list[str]) -> CustomOperator:
        """The operator registered for a call with only these inputs (names, or the first n).

        Optional inputs left out of a call are run by a registered variant whose
        ``op_type`` is ``"<op_type>~without_<name>"``; calls pick it themselves.
        """
        return siblings.variant(self, present)

    def __repr__(self) -> str:
        names = self.signature.inputs
        ins = ", ".join(f"{n}{'*' if i in self.grads else ''}" for i, n in enumerate(names))
        shown, grads = set(), []
        for i in sorted(self.grads):
            joint = self.grad_groups.get(i)
            if joint is None:
                grads.append(names[i])
            elif id(joint) not in shown:
                shown.add(id(joint))
                # the inputs it still serves (a later def_grad may have taken one over)
                serves = [names[k] for k in joint.argnums if self.grad_groups.get(k) is joint]
                grads.append(f"({', '.join(serves)})")
        extra = "" if self.need_top_grad else ", need_top_grad=False"
        if self.no_grad:
            extra += f", no_grad=[{', '.join(sorted(self.no_grad))}]"
        if self.signature.aux:
            extra += f", aux=[{', '.join(f'{a}:{self.aux_rules[a]}' for a in self.signature.aux)}]"
        if self.input_shapes:
            extra += f", infer_input_shape=[{', '.join(self.input_shapes.fns)}]"
        return (
            f"<customop {self.op_type!r} mode={self.mode!r} inputs=({ins}) "
            f"outputs={self.outputs!r} def_grad=[{', '.join(grads) or 'none'}]"
            f"{', auto_grad' if self.auto_grad else ''}{extra}>"
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the operator: NDArrays give NDArrays (recorded under ``mx.autograd.record()``),
        Symbols a Symbol node (``name=`` names it), NumPy arrays the forward's result."""
        return dispatch.call(self, args, kwargs)

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


def _aux_spec(
    op_type: str, aux: dict[str, Any] | None
) -> tuple[dict[str, Callable], dict[str, str]]:
    """``aux=`` as (shape function, merge rule) per state; a bare function merges by 'sum'."""
    shape_fns, rules = {}, {}
    for key, spec in dict(aux or {}).items():
        shape_fn, rule = (
            (spec, "sum")
            if callable(spec)
            else (
                tuple(spec) if isinstance(spec, (tuple, list)) and len(spec) == 2 else (None, None)
            )
        )
        if not callable(shape_fn):
            raise TypeError(
                f"customop {op_type!r}: aux={{{key!r}: ...}} must map the state's "
                "name to a function of the input shapes returning its shape, or to "
                "(that function, merge rule) with a rule among "
                f"{', '.join(map(repr, AUX_RULES))}; got {spec!r}"
            )
        if rule not in AUX_RULES:
            raise ValueError(
                f"customop {op_type!r}: aux={{{key!r}: (..., {rule!r})}}: the merge "
                "rule (how the state's copies on several devices and workers "
                f"become one) must be one of {', '.join(map(repr, AUX_RULES))}"
            )
        shape_fns[key], rules[key] = shape_fn, rule
    return shape_fns, rules


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


def customop(
    mode: Mode,
    *,
    name: str | None = None,
    need_top_grad: bool = True,
    infer_shape: Callable | None = None,
    infer_type: Callable | None = None,
    num_outputs: CountSpec | None = None,
    auto_grad: bool = True,
    aux: dict[str, Any] | None = None,
    optional: tuple[str, ...] | list[str] = (),
    no_grad: tuple[str, ...] | list[str] = (),
    outputs: Any = None,
    infer_input_shape: dict[str, Callable] | None = None,
    inline: bool = True,
) -> Callable[[Callable], CustomOperator]:
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
        outputs: names of the outputs, e.g. ``('rois', 'label')`` (the count
            follows); a graph node lists them as ``<node>_rois``, ... in
            ``list_outputs()`` (MXNet's ``CustomOpProp.list_outputs``), and the
            node's Symbol is indexable by them.  Or a function of the parameters
            returning the names.  Default ``output`` / ``output0``, ``output1``, ...
        infer_input_shape: ``{input: shape_fn}`` for inputs whose shape the op
            can say from the others, as ``FullyConnected`` says its weight's:
            ``shape_fn(*input_shapes, **params)`` returns that input's shape; an
            input not known yet arrives as ``None``.  ``sym.infer_shape``,
            ``Module.bind`` and Gluon's deferred initialization then leave it out.
        auto_grad: give inputs without ``def_grad`` an automatic gradient.
        no_grad: names of inputs that get no gradient (zero), such as labels,
            class ids or a loss's weights: declared here once, for both twins,
            instead of closures that return zeros.  Integer inputs never get
            one anyway.
        aux: ``{name: shape_fn}`` or ``{name: (shape_fn, rule)}`` declares the
            forward's last positional array parameters as auxiliary states
            (MXNet's ``list_auxiliary_states``): state the op owns and updates
            in place, never differentiated.  ``shape_fn(*input_shapes, **params)``
            gives its shape; its dtype is the first floating input's (float32
            without one).  ``rule`` says how the state's copies on several
            devices and ``dist_sync`` workers become one after each training
            step: ``'sum'`` (default: every copy's change is added), ``'mean'``
            (their mean), ``'first'`` (the first device's copy wins) or
            ``'local'`` (each copy keeps its own).  Symbol calls may leave the
            states out (MXNet creates ``<node>_<name>`` variables,
            zero-initialised); array calls pass them.
        optional: names of positional parameters defaulting to ``None`` that are
            optional array inputs (``def f(pred, label, weight=None)``): a call
            may leave them out, on every call style, and the forward and the
            gradient closures then see ``None``.
        inline: let an ``'mxnet'``-mode forward stand in graphs as the MXNet
            operators it calls (hybridized blocks, bound graphs, deploy
            exports: see :func:`customop.explain`); ``False`` keeps its
            ``Custom`` node everywhere.

    Positional parameters without defaults are array inputs; parameters with
    defaults are operator parameters (Python literals, kept exactly), so a
    parameter without a sensible default is keyword-only (``def f(x, *, k)``).
    A forward without array inputs (a generator) is called with parameters only
    and returns NDArrays on ``ctx=`` (default ``mx.current_context()``).

    Called with ``mx.sym`` Symbols, an op with several outputs returns one
    Symbol with that many outputs (as ``mx.sym.topk(ret_typ='both')`` does):
    indexable, iterable, bindable; with arrays, a tuple of arrays.

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
        >>> len(halves(mx.sym.var('x'), split=True))  # one Symbol with two outputs
        2

        Named outputs, and a weight whose shape follows the data's:

        >>> @customop('mxnet', outputs=('low', 'high'))
        ... def split_at(x, *, at):
        ...     return x[:, :at], x[:, at:]
        >>> split_at(mx.sym.var('x'), at=1, name='cut').list_outputs()
        ['cut_low', 'cut_high']
        >>> @customop('mxnet', infer_input_shape={
        ...     'weight': lambda data, weight, *, num_hidden: (num_hidden, data[1])})
        ... def linear(data, weight, *, num_hidden):
        ...     return mx.nd.dot(data, weight, transpose_b=True)
        >>> out = linear(mx.sym.var('data'), mx.sym.var('weight'), num_hidden=3)
        >>> out.infer_shape(data=(4, 5))[0]
        [(4, 5), (3, 5)]
    """

    options = {k: v for k, v in locals().items() if k != "mode"}  # the keywords above

    def wrap(fn: Callable) -> CustomOperator:
        return CustomOperator(fn, mode, **options)

    return wrap


def _settings(options: dict[str, Any]) -> types.SimpleNamespace:
    # The operator's settings: ``options`` checked against the decorator's keywords, the
    # others at their defaults (a twin or a variant passes them all; a user the ones given).
    try:
        bound = inspect.signature(customop).bind_partial(**options)
    except TypeError as e:  # an unknown keyword, said as Python says it of a call
        raise TypeError(f"customop() {e}") from None
    bound.apply_defaults()
    return types.SimpleNamespace(**bound.arguments)
