"""The ``aux`` patch: reads of our ops' aux arrays wait for the writes of their callbacks.

Off-switch: ``CUSTOMOP_RUNTIME_OFF=aux``; installed by the first use of an operator with
auxiliary states.

A Python CustomOp updates its aux arrays through copies whose engine
variables MXNet does not order with later reads of the real arrays: ``exe.aux_dict``
read right after ``exe.forward()`` or ``exe.backward()`` returned the old value
(measured: docs/design.md, *What customop changes in MXNet*).  Wraps
``Executor.__init__`` and ``CachedOp.__init__``: an executor or CachedOp
whose graph holds such an op (found once, at creation) becomes an instance
of a subclass whose ``forward``/``backward``/``__call__`` wait for that op's
aux arrays (``MXNDArrayWaitToWrite``: every pending read and write of those
arrays) before returning; every other executor and CachedOp keeps MXNet's
class and its asynchronous calls.  Wraps ``autograd.backward`` and
``NDArray.backward``: after a backward, the aux arrays of our ops recorded
on this thread in this step (since the first backward after the last
recording) are waited for; a tape without such an op waits for nothing.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import mxnet as mx
from mxnet.base import _LIB, check_call

from .. import aux_merge, runtime, symbol_json

_aux_ops: dict[str, tuple[str, ...]] = {}  # op_type -> names of its aux states


def use_aux(op_type: str, aux: tuple[str, ...] | list[str]) -> None:
    """An operator with aux states is in use: install ``aux`` and ``auxsync`` (idempotent)."""
    _aux_ops[op_type] = tuple(aux)
    runtime.use()
    runtime.install("aux")
    if runtime.is_installed("aux"):  # auxsync reads what the aux patch's classes see
        runtime.install("auxsync")


def touch_aux(arrays, op_type: str) -> None:
    """A recorded training call of ``op_type`` is about to update its aux arrays."""
    if runtime.is_installed("auxsync") and mx.autograd.is_training():
        aux_merge.touch(arrays, [(op_type, s) for s in _aux_ops.get(op_type, ())])


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
    graph = json.loads(text)
    nodes = graph["nodes"]
    found = []
    for _, node, op_type in symbol_json.custom_nodes(graph):
        states = _aux_ops.get(op_type, ())
        if states:
            found += [
                (nodes[entry[0]]["name"], (op_type, state))
                for entry, state in zip(node["inputs"][-len(states) :], states)
            ]
    return found


class _AuxExecutor(mx.executor.Executor):
    """An executor whose graph holds an op with aux states (see ``aux`` above)."""

    _customop_aux: list[str]
    _customop_aux_ops: list[tuple[str, str]]

    def forward(self, is_train=False, **kwargs):
        if is_train and runtime.is_installed("auxsync"):
            aux_merge.touch([self.aux_dict[n] for n in self._customop_aux], self._customop_aux_ops)
        out = super().forward(is_train, **kwargs)
        _wait_to_write([self.aux_dict[n] for n in self._customop_aux])
        return out

    def backward(self, out_grads=None, is_train=True):
        out = super().backward(out_grads, is_train)
        _wait_to_write([self.aux_dict[n] for n in self._customop_aux])
        return out


_cached_aux: dict[int, tuple[list[int], list]] = {}  # id(CachedOp) -> aux positions, labels


def forget(cached: mx.nd.CachedOp) -> None:
    """``cached`` runs another graph (an ``inline`` plan's): nothing to wait for itself."""
    _cached_aux.pop(id(cached), None)


class _AuxCachedOp(mx.nd.CachedOp):
    """A CachedOp whose graph holds an op with aux states (see ``aux`` above)."""

    __slots__ = ()

    def __call__(self, *args, **kwargs):
        positions, labels = _cached_aux.get(id(self), ((), ()))
        arrays = [args[i] for i in positions]
        if runtime.is_installed("auxsync") and mx.autograd.is_training():
            aux_merge.touch(arrays, labels)
        out = super().__call__(*args, **kwargs)
        _wait_to_write(arrays)
        note_recorded_aux(arrays)
        return out

    def __del__(self):
        _cached_aux.pop(id(self), None)
        super().__del__()


def install() -> None:
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
            aux_merge.note_executor(self, self._customop_aux)

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
