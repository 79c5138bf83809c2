"""The registered ``CustomOpProp``/``CustomOp`` pair behind every operator.

This is the path MXNet itself drives: ``mx.sym`` graphs, Module,
``simple_bind``, hybridized blocks, exported models and ``mx.nd.Custom``.
One prop class is registered per ``op_type``; it looks the operator up at
creation time, so redefining a function (a notebook cell re-run) takes effect.
"""
from __future__ import annotations

import ctypes
import threading
from typing import TYPE_CHECKING, Any

import mxnet as mx
import numpy as np
from mxnet.base import _LIB, check_call
from mxnet.ndarray.ndarray import _DTYPE_MX_TO_NP

from . import auxstate, errors
from . import params as _params
from .inference import known

if TYPE_CHECKING:
    from .operator import CustomOperator

_decoded: dict[tuple, dict[str, Any]] = {}
_UNKNOWN = 2**31 - 1  # dimensions from here up are MXNet's -1 (unknown) read as unsigned


def _decode_cached(kwargs: dict[str, str]) -> dict[str, Any]:
    key = tuple(sorted(kwargs.items()))
    params = _decoded.get(key)
    if params is None:
        params = _decoded[key] = _params.decode_attrs(kwargs)
    return dict(params)


def register(op_type: str, registry: dict[str, CustomOperator]) -> None:
    """Register the CustomOpProp for ``op_type`` (once per process)."""

    class Prop(mx.operator.CustomOpProp):
        def __init__(self, **kwargs: str):
            self.op = op = registry[op_type]
            super().__init__(need_top_grad=op.need_top_grad)
            self.params = _decode_cached(kwargs)
            # MXNet does not guard the prop's constructor (an exception there crashes the
            # process), so a bad parameter is reported from list_arguments, which it guards.
            self.bad_params: BaseException | None = None
            try:
                op.signature.check_params(self.params)
            except Exception as exc:
                self.bad_params = errors.mark(exc)
            self.pkey = op.param_key(self.params)
            self.shapes: tuple | None = None

        def list_arguments(self) -> list[str]:
            if self.bad_params is not None:
                errors.stash(self.bad_params)
                raise self.bad_params
            return list(self.op.signature.inputs)

        def list_outputs(self) -> list[str]:
            return self.op.output_names

        def list_auxiliary_states(self) -> list[str]:
            return list(self.op.signature.aux)

        def infer_shape(self, in_shape):
            shapes = tuple(tuple(int(d) for d in s) for s in in_shape)
            n_aux = len(self.op.signature.aux)
            if not all(known(s) for s in shapes):
                return in_shape, [()] * self.op.num_outputs, [()] * n_aux
            self.shapes = shapes
            metas = self._guarded(self.op.inference.outputs, self.pkey, self.params, shapes, None)
            aux = self._guarded(self.op.aux_shapes, list(shapes), self.params) if n_aux else []
            return in_shape, [m.shape for m in metas], aux

        def infer_type(self, in_type):
            dtypes = tuple(np.dtype(t if t is not None else np.float32) for t in in_type)
            if self.shapes is None:
                out = self._guarded(self.op.inference.dtypes_only, self.params, dtypes)
            else:
                metas = self._guarded(self.op.inference.outputs, self.pkey, self.params,
                                      self.shapes, dtypes)
                out = [m.dtype for m in metas]
            aux = [dtypes[0].type if dtypes else np.float32] * len(self.op.signature.aux)
            return [d.type for d in dtypes], [np.dtype(d).type for d in out], aux

        def create_operator(self, ctx, shapes, dtypes):
            n = len(self.op.signature.inputs)  # MXNet also passes the output shapes
            shapes = tuple(tuple(int(d) for d in s) for s in shapes[:n])
            self._guarded(self._check_known, shapes)
            dtypes = tuple(np.dtype(_DTYPE_MX_TO_NP[t]) for t in dtypes[:n])
            metas = self._guarded(self.op.inference.outputs, self.pkey, self.params,
                                  shapes, dtypes)
            if self.op.signature.aux:
                auxstate.expect_update()
            made = _Op(self.op, self.params, [m.scalar for m in metas])
            made.call = getattr(errors.calls, "current", None)
            made.reader = threading.get_ident()  # binds (or calls) it, so reads its errors
            return made

        def _check_known(self, shapes):
            # Legacy shapes read 0 as "unknown": a 0-size input reaches us as -1 seen unsigned
            # (4294967295). Never allocate placeholders from that.
            for name, shape in zip(self.op.signature.inputs, shapes):
                if not all(0 < d < _UNKNOWN for d in shape):
                    shown = tuple("?" if d >= _UNKNOWN else d for d in shape)
                    raise errors.mark(ValueError(
                        f"customop {self.op.op_type!r} (input {name!r}): MXNet passed shape "
                        f"{shown} with an unknown ('?') or zero dimension; an empty (0-size) "
                        "batch cannot go through mx.nd.Custom, symbols or hybridized blocks "
                        "under MXNet's legacy shapes: skip empty batches there, or call the op "
                        "on NDArrays outside a graph, where 0-size inputs work"))

        def _guarded(self, fn, *args):
            try:
                return fn(*args)
            except Exception as exc:
                exc = errors.named(exc, self.op.op_type, "shape/type inference")
                errors.stash(exc)
                raise exc from None

    mx.operator.register(op_type)(Prop)


def _data_ptr(arr: mx.nd.NDArray) -> int:
    ptr = ctypes.c_void_p()
    check_call(_LIB.MXNDArrayGetData(arr.handle, ctypes.byref(ptr)))
    return ptr.value or 0


class _Op(mx.operator.CustomOp):
    def __init__(self, op: CustomOperator, params: dict[str, Any], scalar: list[bool]):
        super().__init__()
        self.op, self.params, self.scalar = op, params, scalar
        self.saved: tuple | None = None
        self.call: errors.Call | None = None
        self.reader: int | None = None

    def forward(self, is_train, req, in_data, out_data, aux):
        with auxstate.in_callback():
            self._forward(is_train, req, in_data, out_data, aux)

    def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
        with auxstate.in_callback():
            self._backward(req, out_grad, in_data, out_data, in_grad, aux)

    def _forward(self, is_train, req, in_data, out_data, aux):
        op, mode = self.op, self.op.mode_impl
        try:
            args, outs = op.forward_nd([*in_data, *aux], self.params, wait=True)
            args = args[:len(in_data)]
            for dst, r, value in zip(out_data, req, outs):
                mode.assign(dst, r, value)
            if is_train and op.mode == "numpy":
                # backward gets the same buffers again; keep the host copies instead of
                # copying every input and output a second time
                self.saved = ([_data_ptr(a) for a in (*in_data, *out_data)], args, outs)
        except Exception as exc:
            exc = errors.named(exc, op.op_type, "forward")
            if self.call is not None:
                self.call.failure = exc  # raised by that call itself, never by another
            else:
                errors.stash(exc, self.reader)
            raise exc from None

    def _backward(self, req, out_grad, in_data, out_data, in_grad, aux):
        op, mode = self.op, self.op.mode_impl
        try:
            saved, self.saved = self.saved, None
            if saved is not None and saved[0] == [_data_ptr(a) for a in (*in_data, *out_data)]:
                args, outs = saved[1], saved[2]
            else:
                args = [mode.from_nd(a) for a in in_data]
                outs = [mode.from_nd(o) for o in out_data]
            outs = [mode.as_scalar_view(v) if s else v for v, s in zip(outs, self.scalar)]
            grads_in = None
            if op.need_top_grad:
                grads_in = [mode.as_scalar_view(v) if s else v
                            for v, s in zip((mode.from_nd(o) for o in out_grad), self.scalar)]
            op.backward_nd(args, aux, outs, grads_in, self.params, req, in_grad)
        except Exception as exc:
            exc = errors.named(exc, op.op_type, "backward")
            errors.stash(exc, self.reader)
            raise exc from None
