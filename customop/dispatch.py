"""How a call with ``mx.nd`` arrays reaches the forward.

* ``direct``: not recording: run the forward on the caller's thread; no
  operator machinery at all.  From a signature's second call, an op with a native
  graph runs that graph instead (as on the ``graph`` path, not recorded): faster than the
  forward in Python for small ops, and more so for ops whose value checks read the host
  there (measured in ``benchmarks/imperative.py``, ``BENCHMARKS.md``).
* ``function``: recording: run the forward on the caller's thread, then
  record one autograd node whose backward calls the gradient closures (the
  mechanism of ``mx.autograd.Function``, with MXNet 1.9.1's ``req`` bug fixed:
  its callback compares the integer req code with ``'add'`` and returns early
  on ``null``, so ``grad_req='add'`` never accumulated).
* ``native``: recording, for an ``'mxnet'``-mode op without ``def_grad``:
  its forward is differentiable ``mx.nd`` code, so it simply runs recorded
  (no callback, no second forward in backward).
* ``graph``: recording, for an ``'mxnet'``-mode op whose forward and closures inline
  in training graphs: from a signature's second call, its native training graph runs
  as a ``CachedOp`` (:mod:`customop.graphs.imperative`), recorded by MXNet's autograd:
  no Python in its backward, and a failed value check gives NaN, as in a hybridized
  block.  The first call of a signature, and an op that does not inline, take
  ``function`` or ``native`` (``direct`` when not recording); ``forced_path('function')``
  keeps an op off this path, recorded or not (and brings back the named exceptions of
  value checks, for debugging).
* ``custom``: ``mx.nd.Custom`` through the registered CustomOpProp: what
  symbols and hybridized graphs use.  A recorded op with auxiliary states
  always takes this path: its aux arrays are then inputs of MXNet's graph
  node, so a backward can be waited for (see ``aux`` in :mod:`customop.runtime`).

Calls with Symbols build a ``Custom`` node; calls with NumPy arrays just run the
forward.

Half precision is decided here too, once for every path (:func:`half_inputs`): under
MXNet's AMP (``mxnet.contrib.amp.init()``) a ``float16`` or ``bfloat16`` input is cast to
``float32`` on entry and the outputs stay ``float32``, which is what AMP does to a
``Custom`` node (its lists put ``Custom`` in ``FP32_FUNCS``), so a hybridized block and an
imperative call compute alike.  Without AMP a ``bfloat16`` input (which NumPy cannot hold,
and few MXNet CPU kernels take) is cast to ``float32`` on entry and the floating outputs
back to ``bfloat16``; ``float16`` without AMP runs as given.  The casts are recorded, so the
gradients flow back in each input's dtype.

:func:`forced_path` pins one path (tests prove them equivalent; benchmarks
compare them).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib
import itertools
import sys
import threading
from collections.abc import Iterator
from typing import Any

import mxnet as mx
import numpy as np
from mxnet.base import _LIB
from mxnet.ndarray import NDArray

from . import errors, kernel, opinfo, runtime
from . import params as _params
from .modes import BFLOAT16, NumpyMode
from .outputs import OutputsSymbol
from .runtime import aux_wait as aux_patch
from .runtime import backlog, callbacks, runahead
from .runtime import hooks as trace_hooks
from .thread_state import swapped

PATHS = ("direct", "function", "native", "custom", "graph")
_forced = threading.local()


_NDARRAY = NDArray


def call(op: opinfo.Dispatched, args: tuple, kwargs: dict[str, Any]) -> Any:
    """``op(*args, **kwargs)``: which path the call takes, by what it is given.

    NDArrays go to :func:`call_ndarray`, Symbols to :func:`call_symbol`, NumPy arrays to
    :func:`call_numpy`, an op without inputs to :func:`call_without_inputs`; ``mx.np``
    arrays and symbols run as their legacy forms and come back in the ``mx.np`` interface;
    optional inputs left out (None) reach the op's variant for that call.
    """
    if (
        not kwargs
        and op.plain_calls
        and len(args) == op.arity
        and all(type(a) is _NDARRAY for a in args)
    ):
        # the training loop's call: every input an NDArray, no parameter (what bind() and
        # the checks below would find, without their cost on each step)
        return call_ndarray(op, list(args), {})
    node_name = kwargs.pop("name", None)
    ctx = kwargs.pop("ctx", None)
    arrays, params = op.signature.bind(args, kwargs)
    if op.variants and any(a is None for a in arrays):
        absent = frozenset(n for n, a in zip(op.signature.inputs, arrays) if a is None)
        present = tuple(a for a in arrays if a is not None)
        return call(op.variants[absent], present, dict(params, name=node_name, ctx=ctx))
    if any(_is_np_interface(a) for a in arrays):
        legacy = tuple(_as_legacy(a) for a in arrays)
        return _as_np_interface(call(op, legacy, dict(params, name=node_name, ctx=ctx)))
    if any(isinstance(a, mx.sym.Symbol) for a in arrays):
        return call_symbol(op, arrays, params, node_name)
    if not op.signature.inputs:
        if node_name is not None:
            raise errors.op_error(
                op.op_type,
                TypeError,
                "name= names a Symbol node, but an operator "
                "without inputs called directly returns NDArrays; build "
                f"its Symbol with mx.sym.Custom(op_type={op.op_type!r}, "
                "name=..., **params)",
            )
        return call_without_inputs(op, params, ctx or mx.current_context())
    if any(isinstance(a, mx.nd.NDArray) for a in arrays):
        return call_ndarray(op, arrays, params)
    return call_numpy(op, arrays, params)


def _is_np_interface(a: Any) -> bool:
    return isinstance(a, mx.np.ndarray) or (
        isinstance(a, mx.sym.Symbol) and isinstance(a, mx.sym.np._Symbol)
    )


def _as_legacy(a: Any) -> Any:
    return a.as_nd_ndarray() if _is_np_interface(a) else a


def _as_np_interface(out: Any) -> Any:
    if isinstance(out, tuple):
        return tuple(_as_np_interface(o) for o in out)
    return out.as_np_ndarray() if isinstance(out, (mx.nd.NDArray, mx.sym.Symbol)) else out


@contextlib.contextmanager
def forced_path(path: str | None) -> Iterator[None]:
    """Within the block, send NDArray calls through ``path`` (``None``: automatic).

    Example:
        >>> from customop.dispatch import forced_path
        >>> with forced_path('custom'):
        ...     pass  # every op(x_nd) here goes through mx.nd.Custom
    """
    if path is not None and path not in PATHS:
        raise ValueError(f"dispatch path must be one of {PATHS} or None, got {path!r}")
    with swapped(_forced, path=path):
        yield


def choose(recording: bool, native: bool = False) -> str:
    path = getattr(_forced, "path", None)
    if path in ("function", "native", "graph") and not recording:
        return "direct"  # unrecorded, the recording paths are the direct path
    if path == "native" and not native:
        return "function"  # only ops without def_grad can record natively
    if path is not None:
        return path
    if not recording:
        return "direct"
    return "native" if native else "function"


_PLAIN = (np.ndarray, np.generic, bool, int, float)


def to_ndarrays(op: opinfo.Forward, inputs: list[Any]) -> list[mx.nd.NDArray]:
    if all(isinstance(a, NDArray) for a in inputs):
        return list(inputs)
    ctx = next(a.context for a in inputs if isinstance(a, mx.nd.NDArray))
    out = []
    for name, a in zip(op.signature.arrays, inputs):
        if isinstance(a, mx.nd.NDArray):
            out.append(a)
        elif isinstance(a, mx.sym.Symbol) or not isinstance(a, _PLAIN):
            raise errors.op_error(
                op.op_type,
                TypeError,
                (
                    f"input {name!r} is a {type(a).__name__}; pass mx.nd.NDArray (or numpy arrays) "
                    "like the other inputs"
                ),
            )
        else:
            arr = np.asarray(a)
            if isinstance(a, float):
                arr = arr.astype(np.float32)  # MXNet's default dtype for Python floats
            out.append(NumpyMode.to_nd(arr, ctx))
    return out


_FLOAT16, _BFLOAT16 = 2, 12  # MXNet's dtype codes (ndarray._DTYPE_MX_TO_NP)
_codes = threading.local()  # .out: this thread's out-parameter (ctypes calls drop the GIL)
_get_dtype = _LIB.MXNDArrayGetDType


def amp_on() -> bool:
    """Whether ``mxnet.contrib.amp.init()`` has run in this process (read, never imported)."""
    amp = sys.modules.get("mxnet.contrib.amp.amp")
    return bool(getattr(amp, "_amp_initialized", False))


def half_inputs(nd_inputs: list[NDArray], n: int) -> tuple[bool, bool]:
    """``(cast in, cast back)`` for a call whose first ``n`` arrays are its inputs: cast
    the half-precision inputs to ``float32`` on entry, and the outputs back to ``bfloat16``
    (see the module doc)."""
    has_half = has_bf16 = False
    out = getattr(_codes, "out", None)
    if out is None:
        code = ctypes.c_int()
        out = _codes.out = (code, ctypes.byref(code))
    code, ref = out
    for a in nd_inputs[:n]:
        _get_dtype(a.handle, ref)  # (.dtype costs 3x this)
        if code.value == _BFLOAT16:
            has_half = has_bf16 = True
        elif code.value == _FLOAT16:
            has_half = True
    if not has_half:
        return False, False
    if amp_on():
        return True, False
    return has_bf16, has_bf16


def _cast_in(nd_inputs: list[NDArray], n: int, amp: bool) -> list[NDArray]:
    half = (np.float16, BFLOAT16) if amp else (BFLOAT16,)
    return [
        mx.nd.amp_cast(a, dtype=np.float32) if i < n and a.dtype in half else a
        for i, a in enumerate(nd_inputs)
    ]


def call_ndarray(op: opinfo.Dispatched, inputs: list[Any], params: dict[str, Any]) -> Any:
    nd_inputs = to_ndarrays(op, inputs)
    cast_in, cast_back = half_inputs(nd_inputs, len(op.signature.inputs))
    if not cast_in:
        return _returned(_call_ndarray(op, nd_inputs, params))
    outs = _call_ndarray(op, _cast_in(nd_inputs, len(op.signature.inputs), not cast_back), params)
    if cast_back:  # recorded: the gradient reaches the cast as bfloat16, and goes on float32
        outs = [mx.nd.amp_cast(o, dtype=BFLOAT16) if o.dtype == np.float32 else o for o in outs]
    return _returned(outs)


def _call_ndarray(
    op: opinfo.Dispatched, nd_inputs: list[NDArray], params: dict[str, Any]
) -> list[NDArray]:
    kernel.check_aux(op, nd_inputs, params)
    recording = mx.autograd.is_recording()
    path = choose(recording, op.records_natively)
    if path == "direct" and recording:
        raise errors.op_error(
            op.op_type,
            RuntimeError,
            (
                "forced_path('direct') inside mx.autograd.record() would leave the op out of the "
                "graph; use 'function' or 'custom' there"
            ),
        )
    if op.signature.aux and path != "direct":
        path = "custom"  # the aux arrays must be inputs of MXNet's node (see the module doc)
    tracing = trace_hooks.tracing_now()
    if tracing is not None:  # called by a forward being traced (customop.graphs.graph_verdicts)
        tracing.inner.append(op)
        if op.mode == "mxnet" and not op.signature.aux:
            path = "native"  # its forward's own operators join the graph
    if path != "direct":
        runtime.use()
    if (
        tracing is None
        and op.mode == "mxnet"
        and not op.signature.aux
        and getattr(_forced, "path", None) in (None, "graph")
    ):
        # recorded or not (measured faster either way: benchmarks/imperative.py)
        found = _imperative().call(
            op, nd_inputs, params, at_once=path == "graph", recording=recording
        )
        if isinstance(found, list):
            if runtime.is_installed("runahead"):
                runahead.step(found)
            return found
    else:
        found = None
    if path == "graph":
        path = "native" if op.records_natively else "function"
    if path == "direct":
        outs = call_direct(op, nd_inputs, params)
    elif path == "function":
        outs = call_function(op, nd_inputs, params)
    elif path == "native":
        outs = call_native(op, nd_inputs, params)
    else:
        outs = call_custom(op, nd_inputs, params)
    if found is not None:  # its forward ran here: the next call of this signature may not
        _imperative().seen(found)
    if path in ("direct", "native") and runtime.is_installed("runahead"):
        runahead.step(outs)  # (the function and custom paths wait in runtime.backlog)
    return outs


# The graph path's module: a wing (native graphs), which the core never imports; named here
# by its full path, as the runtime's index names a wing's patch, and imported by that name
# when the path first runs.
GRAPH_PATH = "customop.graphs.imperative"


@functools.lru_cache(maxsize=None)
def _imperative() -> Any:
    return importlib.import_module(GRAPH_PATH)


def call_without_inputs(op: opinfo.Forward, params: dict[str, Any], ctx: mx.Context) -> Any:
    """An operator with no array inputs (a generator): its outputs, on ``ctx``."""
    if getattr(_forced, "path", None) == "custom":
        runtime.use()
        attrs = {k: _params.encode(v) for k, v in params.items()}
        outs = mx.nd.Custom(op_type=op.op_type, **attrs)
        outs = [outs] if isinstance(outs, mx.nd.NDArray) else list(outs)
        outs = [o if o.context == ctx else o.as_in_context(ctx) for o in outs]
    else:
        mode = op.mode_impl
        with ctx, mx.autograd.pause(train_mode=mx.autograd.is_training()):
            outs = [mode.to_nd(o, ctx) for o in kernel.run_forward(op, [], params)]
    return _returned(outs)


def call_direct(
    op: opinfo.Forward, nd_inputs: list[mx.nd.NDArray], params: dict[str, Any]
) -> list[mx.nd.NDArray]:
    mode = op.mode_impl
    ctx = nd_inputs[0].context
    with mx.autograd.pause(train_mode=mx.autograd.is_training()):
        _, outs, _ = kernel.forward_nd(op, nd_inputs, params, wait=False)  # nothing to keep
        return [_fresh(mode.to_nd(o, ctx), nd_inputs) for o in outs]


def call_native(
    op: opinfo.Differentiable, nd_inputs: list[mx.nd.NDArray], params: dict[str, Any]
) -> list[mx.nd.NDArray]:
    # Recorded as MXNet's own ops: a no_grad input is cut off from the tape instead.
    args = [
        a.detach() if name in op.no_grad else a for name, a in zip(op.signature.arrays, nd_inputs)
    ]
    outs = kernel.run_forward(op, args, params)
    return [_fresh(o, [*nd_inputs, *args]) for o in outs]


_alive: dict[int, Any] = {}  # what MXNet's record of each node needs kept alive, by node
_states: dict[int, _Recorded] = {}  # what each node's backward needs, by node
_counter = itertools.count(1)  # a node's key, its callbacks' context pointer (never NULL)
backlog.TABLES.append(_states)  # counted where our callbacks may queue up (runtime.backlog)


class _Recorded:
    __slots__ = ("op", "args", "outs", "params", "aux", "saved", "reader")

    def __init__(self, op, args, outs, params, aux, saved):
        self.op, self.args, self.outs, self.params, self.aux = op, args, outs, params, aux
        self.saved = saved  # the forward's residuals: freed with the node, by _delete
        self.reader = threading.get_ident()  # records it, so runs (and reads) its backward


def _backward(num_ograds, num_igrads, ptrs, reqs, is_train, key):
    state = _states.get(key)
    if state is None:
        return False
    return _run_backward(state, num_ograds, num_igrads, ptrs, reqs)


def _run_backward(state, num_ograds, num_igrads, ptrs, reqs):
    op, mode, outs = state.op, state.op.mode_impl, state.outs
    names: list[str] = []
    igrads: list[NDArray] = []
    try:
        names = callbacks.req_names(reqs, num_igrads)
        ograds, igrads = callbacks.function_arrays(num_ograds, num_igrads, ptrs, op.need_top_grad)
        g = None
        if ograds is not None:
            g = [mode.from_nd(o) for o in ograds]
            g = [v.reshape(o.shape) if op.mode == "numpy" else v for v, o in zip(g, outs)]
        kernel.backward_nd(
            op, state.args, state.aux, outs, g, state.params, names, igrads, state.saved
        )
    except Exception as exc:
        # the gradients it should have written carry the failure to their readers
        poisoned = callbacks.poisoned([g for g, r in zip(igrads, names) if r != "null"])
        errors.report(errors.ours(exc, op.op_type, "backward"), state.reader, poisoned)
        return poisoned
    return True


def _delete(key, states=_states, alive=_alive):
    # The tables are bound as defaults: MXNet may free a node while the interpreter shuts
    # down, after this module's globals are gone.
    states.pop(key, None)
    alive.pop(key, None)
    return True


def call_function(
    op: opinfo.Differentiable, nd_inputs: list[mx.nd.NDArray], params: dict[str, Any]
) -> list[mx.nd.NDArray]:
    mode = op.mode_impl
    ctx = nd_inputs[0].context
    n = len(op.signature.inputs)
    aux_nd = nd_inputs[n:]
    nd_inputs = nd_inputs[:n]
    with mx.autograd.pause(train_mode=mx.autograd.is_training()):
        args, outs, saved = kernel.forward_nd(op, [*nd_inputs, *aux_nd], params, wait=False)
        nd_outs = [_fresh(mode.to_nd(o, ctx), nd_inputs) for o in outs]
    # The closure outlives this call inside MXNet's graph node; holding the recorded outputs
    # themselves (or a residual that is one of them) would tie the node to itself and it
    # would never be freed.
    args, outs, saved = _detached(args[:n]), _detached(outs), kernel.detached(saved)

    key = next(_counter)
    # MXNet keeps the node until it calls delete, which drops the one reference to the
    # recorded state; the callbacks (one pair for every node) reach it only through ``key``.
    _states[key] = _Recorded(op, args, outs, params, aux_nd, saved)
    _alive[key] = callbacks.record_function(nd_inputs, nd_outs, key, _backward, _delete)
    if runtime.is_installed("backlog"):
        backlog.throttle()
    return nd_outs


def call_custom(
    op: opinfo.Forward, nd_inputs: list[mx.nd.NDArray], params: dict[str, Any]
) -> list[mx.nd.NDArray]:
    attrs = {k: _params.encode(v) for k, v in params.items()}
    if op.signature.aux:
        # installs the aux patches before the first call, which touch_aux depends on
        aux_patch.use_aux(op.op_type, op.signature.aux)
        aux_patch.touch_aux(nd_inputs[len(op.signature.inputs) :], op.op_type)
    # The operator MXNet creates for this call finds its failure record by this key, so a
    # failure is ours to raise even when MXNet loses or mixes it up.
    key, call = errors.open_call()
    attrs[errors.CALL_KEY] = key
    try:
        outs = mx.nd.Custom(*nd_inputs, op_type=op.op_type, **attrs)
    finally:
        errors.close_call(key)
    outs = [outs] if isinstance(outs, mx.nd.NDArray) else list(outs)
    outs = outs[: op.outputs.of(params)]
    if op.signature.aux:
        aux_patch.note_recorded_aux(nd_inputs[len(op.signature.inputs) :])
    try:
        for o in outs:  # surface a forward error here, with its real type
            o.wait_to_read()
    except Exception:
        if call.failure is None:
            raise
    if call.failure is not None:
        raise call.failure
    return outs


def call_symbol(
    op: opinfo.Forward, arrays: list[Any], params: dict[str, Any], node_name: str | None
) -> mx.sym.Symbol:
    """A ``Custom`` node over Symbol inputs; aux states left out become zero-filled variables.

    The node itself is returned, with all its outputs, as MXNet's own multi-output
    operators return theirs (``mx.sym.topk(ret_typ='both')``): ``s[0]``, ``s['<node>_rois']``,
    ``a, b = s``, ``s.list_outputs()``, and it binds as it is.
    """
    for name, a in zip(op.signature.arrays, arrays):
        if not isinstance(a, mx.sym.Symbol):
            msg = (
                f"input {name!r} is a {type(a).__name__}, but other inputs are mx.sym.Symbol; "
                "make every input a Symbol (e.g. mx.sym.Variable)"
            )
            raise errors.op_error(op.op_type, TypeError, msg)
    attrs = {k: _params.encode(v) for k, v in params.items()}
    runtime.note_graph_op(op)
    if len(arrays) < len(op.signature.arrays):
        # MXNet takes Symbols passed after the arguments as the auxiliary states; ours
        # carry a zero initializer so that Module.init_params accepts their names.
        node_name = mx.name.NameManager.current.get(node_name, "custom")
        arrays = [
            *arrays,
            *[mx.sym.Variable(f"{node_name}_{a}", init=mx.init.Zero()) for a in op.signature.aux],
        ]
        with mx.name.NameManager():
            sym = mx.sym.Custom(*arrays, op_type=op.op_type, name=node_name, **attrs)
    else:
        if node_name is not None:
            attrs["name"] = node_name
        sym = mx.sym.Custom(*arrays, op_type=op.op_type, **attrs)
    if op.outputs.of(params) > 1:
        sym.__class__ = OutputsSymbol  # s[-1] indexes as Python does
    return sym


def call_numpy(op: opinfo.Forward, inputs: list[Any], params: dict[str, Any]) -> Any:
    """NumPy inputs: just the forward (aux states, given as NumPy arrays, updated in place)."""
    kernel.check_aux(op, inputs, params)
    for name, a in zip(op.signature.arrays, inputs):
        if not isinstance(a, _PLAIN):
            raise errors.op_error(
                op.op_type,
                TypeError,
                (
                    f"input {name!r} is a {type(a).__name__}; pass numpy arrays, mx.nd.NDArray or "
                    "mx.sym.Symbol"
                ),
            )
    mode = op.mode_impl
    args = [mode.from_numpy(np.asarray(a)) for a in inputs]
    outs = [mode.to_numpy(o) for o in kernel.run_forward(op, args, params)]
    n = len(op.signature.inputs)
    for a, new in zip(inputs[n:], args[n:]):
        if isinstance(a, np.ndarray):
            a[...] = mode.to_numpy(new).reshape(a.shape)
    return _returned(outs)


def _returned(outs: list[Any]) -> Any:
    # As many outputs as the op declares for the call's parameters (kernel.check_outputs):
    # one is returned as itself, several as a tuple.
    return outs[0] if len(outs) == 1 else tuple(outs)


def _detached(values: list[Any]) -> list[Any]:
    return [v.detach() if isinstance(v, NDArray) else v for v in values]


def _fresh(out: mx.nd.NDArray, inputs: list[mx.nd.NDArray]) -> mx.nd.NDArray:
    # A forward that returns an input unchanged must not hand back the input itself.
    handle = out.handle.value
    return out.copy() if any(a.handle.value == handle for a in inputs) else out
