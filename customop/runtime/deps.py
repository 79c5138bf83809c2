"""The ``deps`` patch: each custom node of ours reads its own backward dependencies.

Off-switch: ``CUSTOMOP_RUNTIME_OFF=deps``; installed by the first graph node or
``mx.nd.Custom`` call of one of our ops.

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
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from mxnet.ndarray.ndarray import _STORAGE_TYPE_DEFAULT, _STORAGE_TYPE_UNDEFINED

from . import callbacks

_lock = threading.Lock()
_dep_kinds: list[tuple[int, int, bool]] = []  # context value - 1 -> (outputs, inputs, top grad)
_dep_lists: dict[tuple[int, int, bool], Any] = {}  # those deps: (C int array, length), kept


def backward_dependencies(n_out: int, n_in: int, need_top_grad: bool) -> list[int]:
    """The arrays a backward reads, in MXNet's numbering: output gradients ``0..n_out-1``
    (only with ``need_top_grad``), then inputs, then outputs (MXNet's default rule)."""
    return [*(range(n_out) if need_top_grad else ()), *range(n_out, 2 * n_out + n_in)]


@functools.lru_cache(maxsize=None)
def dependency_set(n_out: int, n_in: int, need_top_grad: bool) -> tuple[frozenset, int]:
    """:func:`backward_dependencies` as a set, and how many arrays MXNet numbers."""
    return frozenset(backward_dependencies(n_out, n_in, need_top_grad)), 2 * n_out + n_in


@callbacks.guarded
def _declare(out_grad, in_data, out_data, num_dep, deps, context):
    # Our prop's dependencies, without writing MXNet's process-wide _registry.result_deps.
    kind = _dep_kinds[(context or 0) - 1]
    found = _dep_lists.get(kind)
    if found is None:
        found = _dep_lists.setdefault(kind, callbacks.int_array(backward_dependencies(*kind)))
    callbacks.answer_ints(found, num_dep, deps)
    return True


@callbacks.guarded
def backward(num, arrays, tags, reqs, is_train, key, watched=callbacks.watched):
    """MXNet's ``backward_entry``, reading this operator's own dependencies (the C callback
    :func:`customop.runtime.release.adopt_operator` puts in an operator's backward slot)."""
    entry = watched.get(key)
    if entry is None:  # pragma: no cover - every key we hand out is watched
        return False
    op = entry[0]
    deps, n_arrays = op.dependencies

    def stype(i):
        return _STORAGE_TYPE_UNDEFINED if i in deps or i >= n_arrays else _STORAGE_TYPE_DEFAULT

    tensors = callbacks.op_arrays(num, arrays, tags, callbacks.BACKWARD_WRITES, stype)
    req = callbacks.req_names(reqs, len(tensors[callbacks.IN_GRAD]))
    with op.ctx:
        op.backward(
            req=req,
            in_data=tensors[callbacks.IN_DATA],
            out_data=tensors[callbacks.OUT_DATA],
            in_grad=tensors[callbacks.IN_GRAD],
            out_grad=tensors[callbacks.OUT_GRAD],
            aux=tensors[callbacks.AUX],
        )
    return True


def adopt_prop(refs: Any, n_out: int, n_in: int, need_top_grad: bool) -> None:
    """MXNet created a prop of ours (one graph node or ``mx.nd.Custom`` call): install ``deps``.

    ``refs``: what MXNet's ``creator`` callback stores as the prop's ``_ref_holder``.  Its
    dependencies are declared without touching MXNet's ``_registry.result_deps``.
    """
    kind = (n_out, n_in, bool(need_top_grad))

    def context() -> int:
        with _lock:
            if kind not in _dep_kinds:
                _dep_kinds.append(kind)
        return _dep_kinds.index(kind) + 1

    callbacks.adopt("deps", refs, _SLOTS, context)


_SLOTS = {callbacks.PROP_DECLARE_DEPS: ("declare", callbacks.DEPS_TYPE, _declare)}


def install() -> None:
    """Make the C callbacks (declare dependencies, backward) props and operators of ours get."""
    callbacks.entry(*_SLOTS[callbacks.PROP_DECLARE_DEPS])
    callbacks.entry("backward", callbacks.FB_TYPE, backward)
