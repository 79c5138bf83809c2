"""The registered ``CustomOpProp``/``CustomOp`` pair behind every operator.

This is the path MXNet itself drives: ``mx.sym`` graphs, Module,
``simple_bind``, hybridized blocks, exported models and ``mx.nd.Custom``.
One prop class is registered per ``op_type``; it looks the operator up at
creation time, so redefining a function (a notebook cell re-run) takes effect.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import Any

import mxnet as mx
import numpy as np
from mxnet.base import _LIB, check_call
from mxnet.ndarray.ndarray import _DTYPE_MX_TO_NP

from . import errors, kernel, opinfo, runtime
from . import params as _params
from .inference import known
from .input_shapes import unknown_ndim
from .modes import BFLOAT16
from .runtime import aux_wait as aux_patch
from .runtime import backlog, bind_lock, callbacks, deps, names, release, shapes

_decoded: dict[tuple, dict[str, Any]] = {}
_UNKNOWN = 2**31 - 1  # dimensions from here up are MXNet's -1 (unknown) read as unsigned


def decode_cached(kwargs: dict[str, str]) -> tuple[dict[str, Any], str]:
    """A node's decoded parameters and their key in its op's shape inference tables, per
    attribute set (the node's attributes but ``op_type`` and :data:`errors.CALL_KEY`)."""
    key = tuple(sorted(kwargs.items()))
    found = _decoded.get(key)
    if found is None:
        params = _params.decode_attrs(kwargs)
        found = _decoded[key] = (params, repr(tuple(sorted(params.items()))))
    return dict(found[0]), found[1]


def _use_runtime(op: opinfo.Forward) -> None:
    # MXNet creates a prop for a graph node, a loaded graph or an mx.nd.Custom call
    if op.signature.aux:
        aux_patch.use_aux(op.op_type, op.signature.aux)
    else:
        runtime.use()
        runtime.note_graph_op(op)  # a loaded graph: bound or hybridized next


def _adopt_prop(prop: Any, refs: Any) -> None:
    deps.adopt_prop(refs, prop.n_out, len(prop.op.signature.inputs), prop.op.need_top_grad)
    shapes.adopt_prop(refs, prop)
    names.adopt_prop(refs, prop)
    bind_lock.adopt_prop(prop.op.op_type)


def _adopting(adopt: Callable[[Any, Any], None]) -> property:
    """``_ref_holder``, where MXNet keeps the callback table it built for a prop or operator,
    right after creating it: ``adopt(obj, refs)`` then points slots of that table at ours."""

    def get(self: Any) -> Any:
        return self._mxnet_refs

    def put(self: Any, refs: Any) -> None:
        self._mxnet_refs = refs
        adopt(self, refs)

    return property(get, put)


class _Prop(mx.operator.CustomOpProp):
    """What MXNet asks of one graph node or ``mx.nd.Custom`` call of an operator: names,
    shapes, dtypes, and the operator instance (:class:`_Op`).

    :func:`register` makes one subclass per ``op_type``; MXNet creates an instance per
    node or call, with the call's parameters as strings.
    """

    op_type: str  # the operator's, on its subclass
    lookup: Callable[[str], opinfo.Registered]  # op_type -> the operator as defined now

    def __init__(self, **kwargs: str):
        self.op = op = self.lookup(self.op_type)
        super().__init__(need_top_grad=op.need_top_grad)
        self.call = errors.take_call(kwargs.pop(errors.CALL_KEY, None))
        self.params, self.pkey = decode_cached(kwargs)
        _use_runtime(op)
        # MXNet does not guard the prop's constructor (an exception there crashes the
        # process), so a bad parameter is reported from list_arguments, which it guards.
        self.bad_params: BaseException | None = None
        self.n_out = 1  # this node's output count (num_outputs= may depend on parameters)
        self.out_names: tuple[str, ...] = ("output",)
        try:
            op.signature.check_params(self.params)
            self.n_out = op.outputs.of(self.params)
            self.out_names = op.outputs.names(self.params)
        except Exception as exc:
            self.bad_params = exc
        # thread -> the input shapes its last shape inference settled, read by its type
        # inference: threads binding one Symbol at other shapes share this prop
        self.shapes: dict[int, tuple] = {}

    # before MXNet asks for the node's names, backward dependencies or shapes
    # (customop.runtime.names, .deps, .shapes)
    _ref_holder = _adopting(_adopt_prop)

    def list_arguments(self) -> list[str]:
        if self.bad_params is not None:
            errors.report(self.bad_params)
            raise self.bad_params
        return list(self.op.signature.inputs)

    def list_outputs(self) -> list[str]:
        return list(self.out_names)

    def list_auxiliary_states(self) -> list[str]:
        return list(self.op.signature.aux)

    def infer_shape(self, in_shape):
        given = [tuple(map(int, s)) for s in in_shape]
        # inputs the op infers from the others (infer_input_shape=), like a layer's weight
        shapes = tuple(self._reporting(self.op.input_shapes.complete, given, self.params))
        n_aux = len(self.op.signature.aux)
        if not all(known(s) for s in shapes):
            self.op.input_shapes.warn_unknown(list(shapes))
            self.op.input_shapes.note_unknown(list(shapes))
            return [list(s) for s in shapes], [()] * self.n_out, self._aux_if_known(shapes)
        self.shapes[threading.get_ident()] = shapes
        metas = self._reporting(self.op.inference.outputs, self.pkey, self.params, shapes, None)
        aux = (
            self._reporting(kernel.aux_shapes, self.op, list(shapes), self.params) if n_aux else []
        )
        return [list(s) for s in shapes], [m.shape for m in metas], aux

    def _aux_if_known(self, shapes):
        # An aux state's shape often needs only the known dims (centers: num_class x D);
        # an unknown one would contradict the aux array an mx.nd.Custom caller holds.
        try:
            aux = kernel.aux_shapes(self.op, list(shapes), self.params)
        except Exception:
            return [()] * len(self.op.signature.aux)
        return [a if known(a) else () for a in aux]

    def infer_type(self, in_type):
        # An input the op infers the shape of (a weight) takes the data's dtype, as
        # FullyConnected's weight does; any other unknown one float32.
        inferred = self.op.input_shapes.fns
        like = kernel.aux_dtype_for([t for t in in_type if t is not None])
        dtypes = tuple(
            np.dtype(t if t is not None else like if name in inferred else np.float32)
            for name, t in zip(self.op.signature.inputs, in_type)
        )
        shapes = self.shapes.get(threading.get_ident())
        if shapes is None:
            out = self._reporting(self.op.inference.dtypes_only, self.params, dtypes)
        else:
            metas = self._reporting(
                self.op.inference.outputs, self.pkey, self.params, shapes, dtypes
            )
            out = [m.dtype for m in metas]
        aux = [_mx_type(kernel.aux_dtype_for(dtypes))] * len(self.op.signature.aux)
        return [_mx_type(d) for d in dtypes], [_mx_type(d) for d in out], aux

    def create_operator(self, ctx, shapes, dtypes):
        n = len(self.op.signature.inputs)  # MXNet also passes the output shapes
        shapes = tuple(tuple(int(d) for d in s) for s in shapes[:n])
        self._reporting(self._check_known, shapes)
        dtypes = tuple(np.dtype(_DTYPE_MX_TO_NP[t]) for t in dtypes[:n])
        metas = self._reporting(self.op.inference.outputs, self.pkey, self.params, shapes, dtypes)
        if runtime.is_installed("backlog"):  # a node of ours per call: imperative, hybridized
            backlog.throttle()
        # The thread that binds (or calls) it reads its errors.
        return _Op(
            self.op, self.params, [m.scalar for m in metas], self.call, threading.get_ident(), ctx
        )

    def _check_known(self, shapes):
        # Legacy shapes read 0 as "unknown": a 0-size input reaches us as -1 seen unsigned
        # (4294967295). Never allocate placeholders from that.
        for name, shape in zip(self.op.signature.inputs, shapes):
            if unknown_ndim(shape):  # MXNet bound it although nothing gave its shape
                raise ValueError(self.op.input_shapes.unknown_message(name))
            if not all(0 < d < _UNKNOWN for d in shape):
                dims = tuple("?" if d >= _UNKNOWN else d for d in shape)
                raise ValueError(
                    f"customop {errors.shown(self.op.op_type)!r} (input {name!r}): MXNet "
                    f"passed shape {dims} with an unknown ('?') or zero dimension; an "
                    "empty (0-size) batch cannot go through mx.nd.Custom, symbols or "
                    "hybridized blocks under MXNet's legacy shapes: skip empty batches "
                    "there, or call a 'numpy'-mode op on NDArrays outside a graph, where "
                    "0-size inputs work"
                )

    def _reporting(self, fn, *args):
        try:
            return fn(*args)
        except Exception as exc:
            new = errors.ours(exc, self.op.op_type, "shape/type inference")
            errors.report(new)
            errors.raise_as(new, exc)


def register(op_type: str, lookup: Callable[[str], opinfo.Registered]) -> None:
    """Register the CustomOpProp for ``op_type`` with MXNet (once per process).

    ``lookup(op_type)`` gives the operator at each creation, so a redefinition
    (a re-run notebook cell) takes effect.
    """
    prop = type("Prop", (_Prop,), {"op_type": op_type, "lookup": staticmethod(lookup)})
    mx.operator.register(op_type)(prop)


def _data_ptr(arr: mx.nd.NDArray) -> int:
    ptr = ctypes.c_void_p()
    check_call(_LIB.MXNDArrayGetData(arr.handle, ctypes.byref(ptr)))
    return ptr.value or 0


class _Op(mx.operator.CustomOp):
    """One operator instance MXNet created: runs the kernel, and owns where its failures go.

    ``call``: the ``mx.nd.Custom`` call that created it, which raises its failure
    itself; else ``reader``, the thread that bound it, gets the failure at its next read.
    """

    def __init__(
        self,
        op: opinfo.Differentiable,
        params: dict[str, Any],
        scalar: list[bool],
        call: errors.Call | None,
        reader: int,
        ctx: mx.Context,
    ):
        super().__init__()
        self.op, self.params, self.scalar = op, params, scalar
        self.call, self.reader, self.ctx = call, reader, ctx
        # MXNet's numbers of the arrays its backward reads, and how many arrays are numbered
        self.dependencies = deps.dependency_set(
            len(scalar), len(op.signature.inputs), op.need_top_grad
        )
        self.saved: tuple | None = None
        # The last training forward's residuals, until its backward: MXNet runs the two as
        # separate callbacks of this one object (one per bound node, or per mx.nd.Custom call).
        self.residuals: dict[str, Any] | None = None

    # what it holds is freed when MXNet deletes it (customop.runtime.release; else it
    # waits for gc), and its backward reads this node's own dependencies (``deps``)
    _ref_holder = _adopting(release.adopt_operator)

    def release(self) -> None:
        """MXNet deleted this operator: drop the residuals and host copies it kept."""
        self.residuals = self.saved = None

    def _fail(self, exc: BaseException, where: str, written: list[Any]) -> None:
        new = errors.ours(exc, self.op.op_type, where)
        poisoned = callbacks.poisoned(written)  # these arrays carry the failure to readers
        if self.call is not None and where == "forward":
            errors.record(self.call, new)  # raised by that call itself, never by another
        else:
            errors.report(new, self.reader, poisoned)
        if not poisoned:
            errors.raise_as(new, exc)

    def forward(self, is_train, req, in_data, out_data, aux):
        op, mode = self.op, self.op.mode_impl
        try:
            self.residuals = None
            args, outs, saved = kernel.forward_nd(op, [*in_data, *aux], self.params, wait=True)
            args = args[: len(in_data)]
            if is_train:
                self.residuals = saved
            for dst, r, value in zip(out_data, req, outs):
                mode.assign(dst, r, value)
            if is_train and op.mode == "numpy":
                # backward gets the same buffers again; keep the host copies instead of
                # copying every input and output a second time
                self.saved = ([_data_ptr(a) for a in (*in_data, *out_data)], args, outs)
        except Exception as exc:
            self._fail(exc, "forward", out_data)

    def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
        op, mode = self.op, self.op.mode_impl
        try:
            saved, self.saved = self.saved, None
            residuals, self.residuals = self.residuals, None
            if saved is not None and saved[0] == [_data_ptr(a) for a in (*in_data, *out_data)]:
                args, outs = saved[1], saved[2]
            else:
                args = [mode.from_nd(a) for a in in_data]
                outs = [mode.from_nd(o) for o in out_data]
            outs = [mode.as_scalar_view(v) if s else v for v, s in zip(outs, self.scalar)]
            grads_in = None
            if op.need_top_grad:
                grads_in = [
                    mode.as_scalar_view(v) if s else v
                    for v, s in zip((mode.from_nd(o) for o in out_grad), self.scalar)
                ]
            kernel.backward_nd(op, args, aux, outs, grads_in, self.params, req, in_grad, residuals)
        except Exception as exc:
            self._fail(exc, "backward", [g for g, r in zip(in_grad, req) if r != "null"])


def _mx_type(dtype) -> Any:
    # MXNet's table keys type classes (np.float32), and bfloat16 by its structured dtype
    dtype = np.dtype(dtype)
    return dtype if dtype == BFLOAT16 else dtype.type
