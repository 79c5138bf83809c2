"""Every change customop makes to MXNet or Python: what, why, when, and how to switch it off.

Importing ``customop`` or ``ops`` changes nothing: registering an operator uses
MXNet's own extension point (``mx.operator.register``).  The fixes below are
installed lazily, by the feature that needs them, the first time it is used in
a process, and each acts only on calls, graphs or tapes that hold our ops.
Set ``CUSTOMOP_RUNTIME_OFF`` to a comma-separated list of patch names (or
``all``) to keep a patch out; the feature then behaves as MXNet does.

``errors`` (installed by the first call of a decorated op or the first graph
that holds one)
    Wraps ``mxnet.base.get_last_ffi_error`` (and its copy in the ctypes FFI
    module), the one function through which MXNet's C errors reach Python.  A
    callback of ours that fails on MXNet's worker thread makes the arrays it
    should have written fail (``errors.poison``) and returns success, so the
    failure reaches whoever reads those arrays and nobody else (MXNet's own
    CustomOp error slot is one per process: measured, it handed our failure to a
    hand-written op's caller, or lost it, in interleaved runs).  The wrapper
    raises our exception, with its own type and message, for that read in place
    of MXNet's text for the poisoned array; only failures queued for the reading
    thread are handed out.  When nothing could be poisoned (0-size outputs,
    NaiveEngine), the callback raises as before and the wrapper replaces MXNet's
    bare ``MXNetError: Check failed: ...callbacks[kCustomOpForward]``; for that
    case it also replaces ``print`` inside ``mxnet.operator`` and
    ``mxnet.autograd`` so that MXNet does not also dump the traceback of *our*
    failures to stdout (everyone else's callback failures still print, and keep
    MXNet's error).  Measured: without it every forward error in a graph reads
    as one ``MXNetError`` whose text names no operator.

``fork`` (installed by the first call of a decorated op)
    ``os.register_at_fork(before=...)`` and ``atexit`` run MXNet's own fork
    "prepare" and "parent" steps (``mxnet::pthread_atfork_prepare`` /
    ``pthread_atfork_parent``, exported by ``libmxnet.so``) once more, through
    ctypes, so with the GIL released.  MXNet's prepare step, which also runs
    inside every ``fork()``, joins its engine and CustomOp worker threads while
    the forking thread holds the GIL; a Python callback still pending there (a
    forward, or the deleter of a finished op, which MXNet's engine runs *after*
    ``waitall()`` returns) waits for the GIL forever (measured: DataLoader
    workers, ``os.fork`` and ``subprocess`` hung after training calls; bounded
    waits for the deleters lost the race under load: 3 of 3 soaks beside 4 CPU
    hogs hung).  Run first with the GIL released, the same step drains the
    queues and *joins* those threads, so every pending callback has finished
    when it returns, by construction rather than by timing; the parent step
    starts fresh, idle threads, and the prepare step inside ``fork()`` then has
    nothing left that needs Python.  Costs one engine stop/start per fork (and
    at exit) in processes that ran a decorated op.  On Python < 3.10,
    ``subprocess`` forks without running ``os.register_at_fork`` handlers, so
    ``subprocess.Popen._execute_child`` runs the same step first.

``aux`` (installed by the first use of an operator with auxiliary states)
    A Python CustomOp updates its aux arrays through copies whose engine
    variables MXNet does not order with later reads of the real arrays
    (measured: ``exe.aux_dict`` read right after ``exe.forward()`` or
    ``exe.backward()`` returned the old value 20 times in 20).  Wraps
    ``Executor.__init__`` and ``CachedOp.__init__``: an executor or CachedOp
    whose graph holds such an op (found once, at creation) becomes an instance
    of a subclass whose ``forward``/``backward``/``__call__`` wait for that op's
    aux arrays (``MXNDArrayWaitToWrite``: every pending read and write of those
    arrays) before returning; every other executor and CachedOp keeps MXNet's
    class and its asynchronous calls.  Wraps ``autograd.backward`` and
    ``NDArray.backward``: after a backward, the aux arrays of our ops recorded
    on this thread in this step (since the first backward after the last
    recording) are waited for; a tape without such an op waits for nothing.

``release`` (installed by the first operator MXNet creates for one of our ops: a graph
node, a hybridized call or an ``mx.nd.Custom`` call)
    MXNet's Python ``CustomOp`` sits in a reference cycle with the ctypes
    callbacks MXNet builds around it (``cast()`` makes every callback refer to
    itself), so when MXNet deletes the operator (its delete callback drops the
    registry's reference) only Python's cycle collector frees it, with
    everything it holds.  For our operator that is the forward's residuals and
    host copies, kept from a training forward for its backward (measured: with
    the collector off, 50 recorded ``mx.nd.Custom`` / hybridized calls never
    differentiated, or 50 dropped executors, kept 50 residuals of 1 MB).  For
    each operator instance of *ours* only, the delete slot of the callback table
    MXNet made for it is pointed at one deleter of ours, which drops what the
    instance holds and then calls MXNet's own deleter; nothing else of MXNet
    changes (the same deleter serves ``deps`` below, which needs to know when an
    operator is gone).  Switched off, those values wait for the cycle collector.

``deps`` (installed by the first graph node or ``mx.nd.Custom`` call of one of our ops)
    MXNet's Python CustomOp layer keeps the backward dependencies that custom
    nodes declare in one process-wide set, ``mxnet.operator._registry.result_deps``:
    every node created anywhere (a Symbol built, a graph loaded, an ``mx.nd.Custom``
    call) overwrites it, and every custom node's backward reads it to decide
    which of its arrays exist.  A node whose backward does not read its output
    gradient (``need_top_grad=False``: an output layer) then meets another node's
    set, asks for the storage type of a gradient array that does not exist, and
    fails (measured: ``ops.softmax_ce`` + ``ops.smooth_l1`` in one hybridized block
    or bound Group, ``softmax_ce`` created first: ``Exception: unknown storage
    type: -1``, then ``MXNetError: Check failed: ...callbacks[kCustomOpBackward]``).
    For each prop of *ours* only, the declare-dependencies slot of the callback
    table MXNet made for it is pointed at a function that declares the same
    dependencies without writing that set; for each operator of ours, the
    backward slot is pointed at a copy of MXNet's backward entry that reads the
    operator's own dependencies.  Hand-written ops keep MXNet's entries, and
    the set stays what their own declarations made it.  Switched off, our
    nodes share MXNet's set again.

``auxsync`` (installed with ``aux``, by the first use of an operator with aux states)
    MXNet keeps one copy of an aux state per device and never reconciles them:
    Gluon's ``Trainer`` broadcasts the first device's copy once, inside the first
    ``step()`` (after backward already moved each copy), and never again;
    Module's kvstore skips aux states (measured: ``ops.CenterLoss`` on two devices
    with the standard loop, copies 1.49 apart after 5 steps).  Wraps
    ``gluon.Trainer.step``, ``.allreduce_grads``, ``.update`` and
    ``mod.Module.update`` (so ``fit``): a Trainer whose parameters, or a Module
    whose graph, hold aux states of our ops ends each step with every copy
    equal to the devices' (and ``dist_sync`` workers') deltas merged by each
    state's rule: summed by default, or their mean, or the first device's, or
    none for ``'local'`` states, whose copies the first step's broadcast leaves
    as they were (:mod:`customop.distributed.agree`); under ``dist_*`` with
    ``update_on_kvstore=False`` such a Trainer's first step also finishes its
    broadcast of initial values before any push (MXNet's does not order the two:
    measured, a worker then starts from the summed gradient).  Any other Trainer or
    Module runs MXNet's method unchanged.  The training passes of our ops (the ``aux``
    classes above, recorded ``mx.nd.Custom`` calls) note the value of each aux
    array the first time a step uses it.  No public hook exists: Gluon's
    Trainer has no step callback, Module has one only in ``fit``.

``trace`` (in place only while a forward is traced into a native graph, for that thread)
    Recording an op's forward as MXNet operators (:mod:`customop.native`) needs what
    MXNet has no hook for: the arrays each operator reads (``mx.autograd.get_symbol``
    names the forward's free variables ``nullN`` but gives no way to read their
    values: the constants it built), every read of a value back to Python
    (``asnumpy``; ``asscalar`` and ``bool()`` go through it), and what the forward
    computes inside ``mx.autograd.pause()`` (recorded anyway and marked, so the graph
    is whole and its training form stops gradients where the pause did).  For the
    length of one trace, under a lock, ``mxnet.ndarray.register._imperative_invoke``
    (every generated ``mx.nd`` operator runs through it), ``NDArray.asnumpy`` and
    ``autograd._RecordingStateScope.__enter__``/``__exit__`` are wrappers that report
    to the tracing thread's log and pass every other thread through; the originals
    are back when the trace ends.  Switched off, nothing is traced: every op keeps
    its ``Custom`` node.

``inline`` (installed by the first Symbol call, or graph load, of an ``'mxnet'``-mode op
that may inline in training: ``'mxnet'`` mode, no aux, ``inline=True``; ``def_grad`` ops
too, their closures transposed by :mod:`customop.custom_grad`)
    Wraps ``Symbol.simple_bind``, ``Symbol.bind`` and ``CachedOp.__init__``.  A graph
    without a ``Custom`` node of such an op is bound or cached as before, after one
    ``debug_str`` per bind or CachedOp, never per call (measured: 0.04 ms on a
    60-node graph; unrelated models' steps unchanged, ``benchmarks/isolation.py``).
    In a graph with one, each such node whose forward traces faithfully is replaced
    by its operators
    (:mod:`customop.inlining`): an executor binds the inlined graph and is shown with
    the original argument order, names and ``reshape``; a CachedOp settles at its
    first call (when the input shapes are known) and from then on is MXNet's
    CachedOp of the inlined graph (its handle moved into the one Gluon holds), or,
    when that graph lists its inputs in another order or depends on the input
    dtype, reorders its inputs per call.  Measured (``benchmarks/native_graphs.py``):
    hybridized forward+backward of one decorated ``x * x`` cost 5.6x / 5.5x / 2.2x the
    same ``broadcast_mul`` written natively at 10 / 1e3 / 1e6 elements as a ``Custom``
    node, and 0.95-1.00x inlined.  Switched off, every op keeps its ``Custom`` node.

``excepthook`` (installed at start-up in the workers of ``python -m
customop.distributed.launch`` only, by ``customop/distributed/worker_site``)
    ``sys.excepthook`` prints the traceback and exits 1: a ``dist_*`` worker
    that raises otherwise dies with SIGABRT or hangs while MXNet's kvstore
    threads shut down, and the job never ends.

``isAlive`` (installed by ``python -m customop.distributed.launch --launcher ssh|mpi|...``)
    ``threading.Thread.isAlive = is_alive`` for MXNet's ``tools/launch.py``,
    which calls the method removed in Python 3.9.
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import itertools
import json
import os
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import mxnet as mx
from mxnet.base import _LIB, MXCallbackList, NDArrayHandle, check_call
from mxnet.ndarray import _ndarray_cls
from mxnet.ndarray.ndarray import _STORAGE_TYPE_DEFAULT, _STORAGE_TYPE_UNDEFINED

from . import errors
from .distributed import agree

_installed: set = set()
_lock = threading.Lock()


def disabled(name: str) -> bool:
    """Whether ``CUSTOMOP_RUNTIME_OFF`` keeps patch ``name`` out."""
    off = {p.strip() for p in os.environ.get("CUSTOMOP_RUNTIME_OFF", "").split(",")}
    return name in off or "all" in off


def is_installed(name: str) -> bool:
    return name in _installed


def installed() -> list[str]:
    """The names of the patches installed in this process so far."""
    return sorted(_installed)


def _once(name: str, install: Callable[[], None]) -> None:
    if name in _installed or disabled(name):
        return
    with _lock:
        if name not in _installed:
            install()
            _installed.add(name)


def use() -> None:
    """A decorated op is being called or bound: install what every op needs (idempotent)."""
    if "fork" in _installed and "errors" in _installed:  # the common case
        return
    _once("errors", _install_errors)
    _once("fork", _install_fork)


# ---- errors ---------------------------------------------------------------------------------
_original_ffi_error = None


def _get_last_ffi_error():
    return errors.swap_in(_original_ffi_error())


def _print(*args, **kwargs):
    # Stands in for print() inside mxnet.operator / mxnet.autograd, whose callbacks print
    # "Error in ...: <traceback>" from within their except blocks.
    exc = sys.exc_info()[1]
    if exc is not None and args and str(args[0]).startswith("Error in "):
        if errors.is_ours(exc):
            return  # ours: the caller gets it, named, once
        named = errors.foreign_failure(str(args[0]), exc, sys._getframe(1).f_locals)
        errors.report_foreign(named)
        if named is not None:
            return  # its reader gets one exception naming the op, this one as its cause
    print(*args, **kwargs)


def _install_errors() -> None:
    global _original_ffi_error
    _original_ffi_error = mx.base.get_last_ffi_error
    mx.base.get_last_ffi_error = _get_last_ffi_error
    mx.operator.print = _print
    mx.autograd.print = _print
    try:
        from mxnet._ffi._ctypes import function as ffi_function
    except ImportError:  # pragma: no cover - built without the ctypes FFI
        return
    ffi_function.get_last_ffi_error = _get_last_ffi_error


# ---- fork ----------------------------------------------------------------------------------
# MXNet's own pthread_atfork handlers (src/initialize.cc); internal, C++-mangled names:
# tests/customop/test_runtime.py fails loudly if a build of MXNet lacks them.
MXNET_FORK_STEPS = ("_ZN5mxnet22pthread_atfork_prepareEv", "_ZN5mxnet21pthread_atfork_parentEv")


@functools.lru_cache(maxsize=None)
def _fork_steps():
    try:
        steps = [getattr(_LIB, name) for name in MXNET_FORK_STEPS]
    except AttributeError:  # pragma: no cover - another build of MXNet
        return None
    for step in steps:
        step.restype = None
    return steps


def settle() -> None:
    """Finish every pending MXNet callback and join MXNet's worker threads, GIL released."""
    try:
        mx.nd.waitall()  # nothing may reach the CustomOp queue once its thread has stopped
    except Exception:  # noqa: BLE001 - the failure stays with MXNet's arrays; fork must go on
        pass
    steps = _fork_steps()
    if steps is None:  # pragma: no cover
        return
    prepare, parent = steps
    prepare()  # a ctypes call: the GIL is released while MXNet joins its threads
    parent()


def _install_fork() -> None:
    os.register_at_fork(before=settle)
    atexit.register(settle)
    if sys.version_info < (3, 10):  # noqa: UP036 - Python 3.8 and 3.9 are supported
        execute_child = subprocess.Popen._execute_child

        def _execute_child(self, *args, **kwargs):
            settle()
            return execute_child(self, *args, **kwargs)
        subprocess.Popen._execute_child = _execute_child


# ---- isAlive -------------------------------------------------------------------------------
def use_thread_isalive() -> None:
    """For MXNet's ``tools/launch.py`` (dmlc_tracker) on Python >= 3.9."""
    def install():
        if not hasattr(threading.Thread, "isAlive"):
            threading.Thread.isAlive = threading.Thread.is_alive
    _once("isAlive", install)


# ---- aux ----------------------------------------------------------------------------------
_aux_ops: dict[str, tuple[str, ...]] = {}  # op_type -> names of its aux states


def use_aux(op_type: str, aux: tuple[str, ...] | list[str]) -> None:
    """An operator with aux states is in use: install ``aux`` and ``auxsync`` (idempotent)."""
    _aux_ops[op_type] = tuple(aux)
    use()
    _once("aux", _install_aux)
    if "aux" in _installed:  # auxsync reads what the aux patch's classes see
        _once("auxsync", _install_auxsync)


def touch_aux(arrays, op_type: str) -> None:
    """A recorded training call of ``op_type`` is about to update its aux arrays."""
    if "auxsync" in _installed and mx.autograd.is_training():
        agree.touch(arrays, [(op_type, s) for s in _aux_ops.get(op_type, ())])


def _wait_to_write(arrays) -> None:
    # Waits for every pending read and write of each array: MXNet's graph nodes read the real
    # aux arrays while our callback writes them through copies (see the module doc).
    if isinstance(threading.current_thread(), threading._DummyThread):
        return  # one of MXNet's own threads, inside an engine operation: never wait there
    for a in arrays:
        check_call(_LIB.MXNDArrayWaitToWrite(a.handle))


def note_recorded_aux(arrays) -> None:
    """Aux arrays of an op recorded on this thread: the next backward passes wait for them."""
    if not mx.autograd.is_recording():
        return
    if getattr(_tape, "settled", True):  # a new step: what the last one recorded is done
        _tape.arrays, _tape.settled = {}, False
    for a in arrays:
        _tape.arrays[a.handle.value] = a


_tape = threading.local()  # .arrays {handle: NDArray}, .settled: a backward has run since


def _settle_tape() -> None:
    # Every backward waits for all the aux arrays recorded since the last step began: a step
    # may record on several devices and call backward once per device's loss.
    held = getattr(_tape, "arrays", None)
    if held:
        _tape.settled = True
        _wait_to_write(held.values())


def aux_variables(sym: Any) -> list[tuple[str, tuple[str, str]]]:
    """(variable name, (op_type, state)) of the graph's variables that are our ops' aux states."""
    if not _aux_ops:
        return []
    text = sym.tojson()
    if '"Custom"' not in text:
        return []
    nodes = json.loads(text)["nodes"]
    found = []
    for node in nodes:
        if node.get("op") != "Custom":
            continue
        attrs = node.get("attrs") or node.get("attr") or node.get("param") or {}
        op_type = attrs.get("op_type")
        states = _aux_ops.get(op_type, ())
        if states:
            found += [(nodes[entry[0]]["name"], (op_type, state))
                      for entry, state in zip(node["inputs"][-len(states):], states)]
    return found


class _AuxExecutor(mx.executor.Executor):
    """An executor whose graph holds an op with aux states (see ``aux`` above)."""

    _customop_aux: list[str]
    _customop_aux_ops: list[tuple[str, str]]

    def forward(self, is_train=False, **kwargs):
        if is_train and "auxsync" in _installed:
            agree.touch([self.aux_dict[n] for n in self._customop_aux], self._customop_aux_ops)
        out = super().forward(is_train, **kwargs)
        _wait_to_write([self.aux_dict[n] for n in self._customop_aux])
        return out

    def backward(self, out_grads=None, is_train=True):
        out = super().backward(out_grads, is_train)
        _wait_to_write([self.aux_dict[n] for n in self._customop_aux])
        return out


_cached_aux: dict[int, tuple[list[int], list]] = {}  # id(CachedOp) -> aux positions, labels


class _AuxCachedOp(mx.nd.CachedOp):
    """A CachedOp whose graph holds an op with aux states (see ``aux`` above)."""

    __slots__ = ()

    def __call__(self, *args, **kwargs):
        positions, labels = _cached_aux.get(id(self), ((), ()))
        arrays = [args[i] for i in positions]
        if "auxsync" in _installed and mx.autograd.is_training():
            agree.touch(arrays, labels)
        out = super().__call__(*args, **kwargs)
        _wait_to_write(arrays)
        note_recorded_aux(arrays)
        return out

    def __del__(self):
        _cached_aux.pop(id(self), None)
        super().__del__()


def _install_aux() -> None:
    executor_init = mx.executor.Executor.__init__
    cached_init = mx.nd.CachedOp.__init__
    autograd_backward = mx.autograd.backward
    ndarray_backward = mx.nd.NDArray.backward

    def executor_init_(self, handle, symbol, *args, **kwargs):
        executor_init(self, handle, symbol, *args, **kwargs)
        found = aux_variables(symbol)
        if found and type(self) is mx.executor.Executor:
            self.__class__ = _AuxExecutor
            self._customop_aux = [n for n, _ in found]
            self._customop_aux_ops = [label for _, label in found]

    def cached_init_(self, sym, *args, **kwargs):
        cached_init(self, sym, *args, **kwargs)
        found = aux_variables(sym)
        if found and type(self) is mx.nd.CachedOp:
            inputs = sym.list_inputs()
            found = [(inputs.index(n), t) for n, t in found if n in inputs]
            _cached_aux[id(self)] = ([i for i, _ in found], [t for _, t in found])
            self.__class__ = _AuxCachedOp

    def autograd_backward_(*args, **kwargs):
        out = autograd_backward(*args, **kwargs)
        _settle_tape()
        return out

    def ndarray_backward_(self, *args, **kwargs):
        out = ndarray_backward(self, *args, **kwargs)
        _settle_tape()
        return out

    mx.executor.Executor.__init__ = executor_init_
    mx.nd.CachedOp.__init__ = cached_init_
    mx.autograd.backward = autograd_backward_
    mx.nd.NDArray.backward = ndarray_backward_


# ---- release, deps: the callback tables of our operators --------------------------------------
_fb_type = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p),
                            ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int),
                            ctypes.c_int, ctypes.c_void_p)  # MXNet's CustomOpFBFunc
_delete_type = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)  # MXNet's CustomOpDelFunc
_deps_type = ctypes.CFUNCTYPE(ctypes.c_int, *[ctypes.POINTER(ctypes.c_int)] * 4,
                              ctypes.POINTER(ctypes.POINTER(ctypes.c_int)),
                              ctypes.c_void_p)  # MXNet's CustomOpBwdDepFunc
# MXNet's slots (include/mxnet/c_api.h): CustomOpCallbacks, CustomOpPropCallbacks
_OP_DELETE, _OP_BACKWARD = 0, 2
_PROP_DECLARE_DEPS = 5
_watched: dict[int, tuple[Any, int, int | None]] = {}  # key -> (op, MXNet's deleter, context)
_keys = itertools.count(1)
_entries: dict[str, tuple[Any, int]] = {}  # name -> (our C callback, its address), kept for good
_dep_kinds: list[tuple[int, int, bool]] = []  # context value - 1 -> (outputs, inputs, top grad)
_dep_lists: dict[tuple[int, int, bool], Any] = {}  # those deps: (C int array, length), kept


def _delete(key, watched=_watched, delete_type=_delete_type, installed=_installed):
    # MXNet deletes one of our operators. The tables are bound as defaults: MXNet may delete
    # operators while the interpreter shuts down, after this module's globals are gone.
    entry = watched.pop(key, None)
    if entry is None:  # pragma: no cover - every key we hand out is watched
        return True
    op, mxnet_delete, context = entry
    if "release" in installed:
        op.release()
    return delete_type(mxnet_delete)(context)


def backward_dependencies(n_out: int, n_in: int, need_top_grad: bool) -> list[int]:
    """The arrays a backward reads, in MXNet's numbering: output gradients ``0..n_out-1``
    (only with ``need_top_grad``), then inputs, then outputs (MXNet's default rule)."""
    return [*(range(n_out) if need_top_grad else ()), *range(n_out, 2 * n_out + n_in)]


@functools.lru_cache(maxsize=None)
def dependency_set(n_out: int, n_in: int, need_top_grad: bool) -> tuple[frozenset, int]:
    """:func:`backward_dependencies` as a set, and how many arrays MXNet numbers."""
    return frozenset(backward_dependencies(n_out, n_in, need_top_grad)), 2 * n_out + n_in


def _declare(out_grad, in_data, out_data, num_dep, deps, context):
    # Our prop's dependencies, without writing MXNet's process-wide _registry.result_deps.
    try:
        kind = _dep_kinds[(context or 0) - 1]
        found = _dep_lists.get(kind)
        if found is None:
            values = backward_dependencies(*kind)
            found = _dep_lists.setdefault(kind, (
                (ctypes.c_int * max(len(values), 1))(*values), len(values)))
        num_dep[0] = found[1]
        deps[0] = ctypes.cast(found[0], ctypes.POINTER(ctypes.c_int))
    except Exception:  # noqa: BLE001 - a C callback must not raise
        traceback.print_exc()
        return False
    return True


def _backward(num, arrays, tags, reqs, is_train, key, watched=_watched):
    # MXNet's backward_entry, reading this operator's own dependencies (see ``deps``).
    entry = watched.get(key)
    if entry is None:  # pragma: no cover - every key we hand out is watched
        return False
    op = entry[0]
    try:
        deps, n_arrays = op.dependencies
        tensors: list[list[Any]] = [[] for _ in range(5)]
        for i in range(num):
            stype = (_STORAGE_TYPE_UNDEFINED if i in deps or i >= n_arrays
                     else _STORAGE_TYPE_DEFAULT)
            tensors[tags[i]].append(_ndarray_cls(ctypes.cast(arrays[i], NDArrayHandle),
                                                 writable=tags[i] in (2, 4), stype=stype))
        req = [_REQ[reqs[i]] for i in range(len(tensors[2]))]
        with op.ctx:
            op.backward(req=req, in_data=tensors[0], out_data=tensors[1],
                        in_grad=tensors[2], out_grad=tensors[3], aux=tensors[4])
    except Exception:  # noqa: BLE001 - a C callback must not raise; the op reported its own
        if not errors.is_ours(sys.exc_info()[1]):
            traceback.print_exc()
        return False
    return True


_REQ = ("null", "write", "inplace", "add")


def _entry(name: str, ctype: Any, fn: Callable) -> int:
    if name not in _entries:
        callback = ctype(fn)
        _entries[name] = (callback, ctypes.cast(callback, ctypes.c_void_p).value)
    return _entries[name][1]


def _slots(refs: Any, n: int) -> tuple[Any, Any] | None:
    # The callback and context arrays of the table MXNet keeps in ``refs`` (what its
    # ``creator`` / ``create_operator`` callback stores as ``obj._ref_holder``:
    # ``[POINTER(MXCallbackList)]``), as arrays of plain addresses (no ctypes cycles).
    if not (isinstance(refs, list) and len(refs) == 1
            and isinstance(refs[0], ctypes.POINTER(MXCallbackList)) and refs[0]):
        return None  # pragma: no cover - another MXNet
    table = refs[0][0]
    if table.num_callbacks < n or not table.callbacks or not table.contexts:
        return None  # pragma: no cover - another MXNet
    slots = (ctypes.c_void_p * table.num_callbacks).from_address(
        ctypes.addressof(table.callbacks.contents))
    contexts = (ctypes.c_void_p * table.num_callbacks).from_address(
        ctypes.addressof(table.contexts.contents))
    return slots, contexts


def adopt_operator(op: Any, refs: Any) -> None:
    """MXNet created ``op``, an operator of ours: install ``release`` and ``deps`` for it.

    ``refs``: what MXNet's ``create_operator`` callback stores as ``op._ref_holder``.
    ``release`` calls ``op.release()`` when MXNet deletes it; ``deps`` runs its backward
    with ``op.dependencies`` (a set of MXNet's array numbers, and how many arrays are
    numbered) and ``op.ctx``.  Anything else (another MXNet) is left alone.
    """
    _once("release", _no_install)
    _once("deps", _no_install)
    own_backward = "deps" in _installed
    if "release" not in _installed and not own_backward:
        return
    found = _slots(refs, _OP_BACKWARD + 1)
    if found is None:
        return  # pragma: no cover - another MXNet
    slots, contexts = found
    key = next(_keys)
    _watched[key] = (op, slots[_OP_DELETE], contexts[_OP_DELETE])
    contexts[_OP_DELETE] = key
    slots[_OP_DELETE] = _entry("delete", _delete_type, _delete)
    if own_backward:
        contexts[_OP_BACKWARD] = key
        slots[_OP_BACKWARD] = _entry("backward", _fb_type, _backward)


def adopt_prop(refs: Any, n_out: int, n_in: int, need_top_grad: bool) -> None:
    """MXNet created a prop of ours (one graph node or ``mx.nd.Custom`` call): install ``deps``.

    ``refs``: what MXNet's ``creator`` callback stores as the prop's ``_ref_holder``.  Its
    dependencies are declared without touching MXNet's ``_registry.result_deps``.
    """
    _once("deps", _no_install)
    if "deps" not in _installed:
        return
    found = _slots(refs, _PROP_DECLARE_DEPS + 1)
    if found is None:
        return  # pragma: no cover - another MXNet
    slots, contexts = found
    kind = (n_out, n_in, bool(need_top_grad))
    with _lock:
        if kind not in _dep_kinds:
            _dep_kinds.append(kind)
    contexts[_PROP_DECLARE_DEPS] = _dep_kinds.index(kind) + 1
    slots[_PROP_DECLARE_DEPS] = _entry("declare", _deps_type, _declare)


def _no_install() -> None:
    pass  # these patches act per object (adopt_*), nothing global to install


# ---- auxsync --------------------------------------------------------------------------------
def _install_auxsync() -> None:
    trainer, module = mx.gluon.Trainer, mx.mod.Module
    step, allreduce_grads, update = trainer.step, trainer.allreduce_grads, trainer.update
    module_update = module.update

    def _run(method, begin, finish, self, args, kwargs):
        agree.note_step()
        plan = begin(self)
        if plan is None:
            return method(self, *args, **kwargs)
        try:
            out = method(self, *args, **kwargs)
        except BaseException:
            plan.pending = None
            raise
        if finish is not None:
            finish(plan, self)
        return out

    def step_(self, *args, **kwargs):
        return _run(step, agree.trainer_begin, agree.trainer_finish, self, args, kwargs)

    def allreduce_grads_(self, *args, **kwargs):
        # reads the deltas before the first call's broadcast; update() then finishes
        return _run(allreduce_grads, agree.trainer_begin, None, self, args, kwargs)

    def update_(self, *args, **kwargs):
        return _run(update, agree.trainer_begin, agree.trainer_finish, self, args, kwargs)

    def module_update_(self, *args, **kwargs):
        return _run(module_update, agree.module_begin, agree.module_finish, self, args,
                    kwargs)

    functools.update_wrapper(step_, step)
    functools.update_wrapper(allreduce_grads_, allreduce_grads)
    functools.update_wrapper(update_, update)
    functools.update_wrapper(module_update_, module_update)
    trainer.step, trainer.allreduce_grads, trainer.update = step_, allreduce_grads_, update_
    module.update = module_update_
    agree.start_tracking()


# ---- trace ----------------------------------------------------------------------------------
_trace_lock = threading.RLock()  # one trace at a time: the swap below is process-wide
_trace_logs: dict[int, Any] = {}  # thread id -> the log of the forward that thread traces
_trace_saved: dict[str, Any] = {}


def _traced_invoke(handle, ndargs, *args):
    result = _trace_saved["invoke"](handle, ndargs, *args)
    log = _trace_logs.get(threading.get_ident())
    if log is not None:
        log.invoked(handle, ndargs, result)
    return result


def _traced_asnumpy(self):
    log = _trace_logs.get(threading.get_ident())
    if log is not None:
        log.read(self)
    return _trace_saved["asnumpy"](self)


def _traced_scope_enter(self):
    log = _trace_logs.get(threading.get_ident())
    if log is not None and self._enter_is_record is False:
        self._enter_is_record = None  # keep recording: the paused values join the graph
        self._customop_paused = True
        log.pause_enter()
    return _trace_saved["enter"](self)


def _traced_scope_exit(self, *exc):
    if getattr(self, "_customop_paused", False):
        log = _trace_logs.get(threading.get_ident())
        if log is not None:
            log.pause_exit()
    return _trace_saved["exit"](self, *exc)


@contextlib.contextmanager
def tracing(log: Any) -> Iterator[None]:
    """Within the block, this thread's forward is being traced into ``log`` (see ``trace``).

    ``log.invoked(handle, inputs, result)`` sees every MXNet operator call,
    ``log.read(array)`` every ``asnumpy`` (so also ``asscalar``, ``bool()``);
    ``mx.autograd.pause()`` keeps recording, between ``log.pause_enter()`` and
    ``log.pause_exit()``.  Other threads run through unchanged.
    """
    from mxnet.ndarray import register

    with _trace_lock:
        me = threading.get_ident()
        if me in _trace_logs:
            raise RuntimeError("customop: a forward traced inside a traced forward")
        outermost = not _trace_logs
        if outermost:
            scope = mx.autograd._RecordingStateScope
            _trace_saved.update(invoke=register._imperative_invoke,
                                asnumpy=mx.nd.NDArray.asnumpy, enter=scope.__enter__,
                                exit=scope.__exit__)
            register._imperative_invoke = _traced_invoke
            mx.nd.NDArray.asnumpy = _traced_asnumpy
            scope.__enter__, scope.__exit__ = _traced_scope_enter, _traced_scope_exit
        _trace_logs[me] = log
        try:
            yield
        finally:
            del _trace_logs[me]
            if not _trace_logs:
                register._imperative_invoke = _trace_saved["invoke"]
                mx.nd.NDArray.asnumpy = _trace_saved["asnumpy"]
                scope = mx.autograd._RecordingStateScope
                scope.__enter__, scope.__exit__ = _trace_saved["enter"], _trace_saved["exit"]


def tracing_now() -> Any:
    """The trace log of this thread's forward, or None when it is not being traced."""
    return _trace_logs.get(threading.get_ident()) if _trace_logs else None


# ---- inline ---------------------------------------------------------------------------------
_plans: dict[int, Any] = {}  # id(CachedOp) -> its inlining.CachedPlan, until the first call
_inner = threading.local()  # .building: a CachedOp made for a plan (never planned itself)


_inline_hooks: Any = None  # customop.inlining, which hands itself over when imported


def set_inline_hooks(hooks: Any) -> None:
    """Where the ``inline`` patch sends graphs (``customop.inlining``; set at its import)."""
    global _inline_hooks
    _inline_hooks = hooks


def note_graph_op(op: Any) -> None:
    """``op`` is going into a graph: install ``inline`` if it may inline in training."""
    if "inline" in _installed or _inline_hooks is None or not _inline_hooks.may_inline(op):
        return
    use()
    _once("inline", _install_inline)


class _PlannedCachedOp(mx.nd.CachedOp):
    """A CachedOp whose graph holds ops that inline: settled at its first call."""

    __slots__ = ()

    def __call__(self, *args, **kwargs):
        return _plans[id(self)].call(self, args, kwargs)

    def __del__(self):
        _plans.pop(id(self), None)
        super().__del__()


def inner_cached_op(sym, flags) -> mx.nd.CachedOp:
    """The CachedOp a plan runs (the ``aux`` patch applies to it; ``inline`` does not)."""
    _inner.building = True
    try:
        return mx.nd.CachedOp(sym, flags)
    finally:
        _inner.building = False


def adopt(outer: mx.nd.CachedOp, inner: mx.nd.CachedOp) -> None:
    """``outer`` runs ``inner``'s graph from now on, as a CachedOp of MXNet's own class."""
    outer.handle, inner.handle = inner.handle, outer.handle  # each frees the one it holds
    outer.is_np_sym = inner.is_np_sym
    _plans.pop(id(outer), None)
    if id(inner) in _cached_aux:
        _cached_aux[id(outer)] = _cached_aux.pop(id(inner))
    outer.__class__ = type(inner)


def _install_inline() -> None:
    inlining = _inline_hooks
    simple_bind, bind = mx.sym.Symbol.simple_bind, mx.sym.Symbol.bind
    cached_init = mx.nd.CachedOp.__init__

    def simple_bind_(self, ctx, grad_req="write", type_dict=None, stype_dict=None,
                     group2ctx=None, shared_arg_names=None, shared_exec=None,
                     shared_buffer=None, **kwargs):
        return inlining.simple_bind(simple_bind, self, ctx, grad_req, type_dict, stype_dict,
                                    group2ctx, shared_arg_names, shared_exec, shared_buffer,
                                    **kwargs)

    def bind_(self, ctx, args, args_grad=None, grad_req="write", aux_states=None,
              group2ctx=None, shared_exec=None):
        return inlining.bind(bind, self, ctx, args, args_grad, grad_req, aux_states,
                             group2ctx, shared_exec)

    def cached_init_(self, sym, flags=()):
        cached_init(self, sym, flags)
        if getattr(_inner, "building", False):
            return
        plan = inlining.cached_plan(sym, flags)
        if plan is not None:
            _cached_aux.pop(id(self), None)  # the graph it runs is the plan's
            _plans[id(self)] = plan
            self.__class__ = _PlannedCachedOp

    functools.update_wrapper(simple_bind_, simple_bind)
    functools.update_wrapper(bind_, bind)
    mx.sym.Symbol.simple_bind, mx.sym.Symbol.bind = simple_bind_, bind_
    mx.nd.CachedOp.__init__ = cached_init_
