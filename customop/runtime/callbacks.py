"""MXNet's C callback tables for our ops: their types, their slots, the entries we put there.

MXNet calls a Python operator through tables of C function pointers: one per
prop (``CustomOpPropCallbacks``), one per operator (``CustomOpCallbacks``),
each built by MXNet's ``creator`` / ``create_operator`` callbacks in
``mxnet.operator``, and one per recorded function node
(``MXCustomFunctionRecord``: backward and delete).  The ``release`` and
``deps`` patches point slots of the first two at entries of ours (``shapes`` one slot
of a prop's, ``names`` three); the
``function`` path of :mod:`customop.dispatch` builds the third with
:func:`record_function`.  All the C types and slot numbers are here (see
``include/mxnet/c_api.h``), once.
"""
from __future__ import annotations

import ctypes
import itertools
import threading
from collections.abc import Callable
from typing import Any

from mxnet.base import _LIB, MXCallbackList, c_handle_array, check_call

# What MXNet's ``req`` codes mean (OpReqType).
REQ = ("null", "write", "inplace", "add")
FB_TYPE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p),
                           ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int),
                           ctypes.c_int, ctypes.c_void_p)  # MXNet's CustomOpFBFunc
DELETE_TYPE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)  # CustomOpDelFunc (and functions')
DEPS_TYPE = ctypes.CFUNCTYPE(ctypes.c_int, *[ctypes.POINTER(ctypes.c_int)] * 4,
                             ctypes.POINTER(ctypes.POINTER(ctypes.c_int)),
                             ctypes.c_void_p)  # MXNet's CustomOpBwdDepFunc
LIST_TYPE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p),
                             ctypes.c_void_p)  # MXNet's CustomOpListFunc (char***)
INFER_SHAPE_TYPE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int),
                                    ctypes.POINTER(ctypes.POINTER(ctypes.c_int)),
                                    ctypes.c_void_p)  # MXNet's CustomOpInferShapeFunc
FUNCTION_BACKWARD_TYPE = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p),
    ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_void_p)  # CustomFunctionBwdFunc
# MXNet's slots (include/mxnet/c_api.h): CustomOpCallbacks, CustomOpPropCallbacks
OP_DELETE, OP_BACKWARD = 0, 2
PROP_LIST_ARGUMENTS, PROP_LIST_OUTPUTS, PROP_LIST_AUX = 1, 2, 3
PROP_INFER_SHAPE, PROP_DECLARE_DEPS = 4, 5

watched: dict[int, tuple[Any, int, int | None]] = {}  # key -> (op, MXNet's deleter, context)
keys = itertools.count(1)
# name -> (our C callback, its address, the function it calls), kept for good
_entries: dict[str, tuple[Any, int, Callable]] = {}
_entries_lock = threading.Lock()


def entry(name: str, ctype: Any, fn: Callable) -> int:
    """The address of a C callback of type ``ctype`` calling ``fn``, made once per name."""
    found = _entries.get(name)
    if found is None:
        # under a lock: two threads making the first of a name would otherwise each hand
        # out their callback's address, and the one replaced in the table would be freed
        with _entries_lock:
            found = _entries.get(name)
            if found is None:
                callback = ctype(fn)
                found = _entries[name] = (callback,
                                          ctypes.cast(callback, ctypes.c_void_p).value, fn)
    return found[1]


def entries() -> dict[str, Callable]:
    """The Python function behind each C callback :func:`entry` made so far, by name."""
    return {name: found[2] for name, found in list(_entries.items())}


def adopting(patch: str, refs: Any, n: int) -> tuple[Any, Any] | None:
    """Install ``patch`` (a prop or operator of ours was created); then :func:`slots` of
    ``refs``, or None when ``patch`` is switched off or MXNet's table differs."""
    from .. import runtime  # (the package imports this module's users, not this module)

    runtime.install(patch)
    return slots(refs, n) if runtime.is_installed(patch) else None


def slots(refs: Any, n: int) -> tuple[Any, Any] | None:
    """The callback and context arrays of the table MXNet keeps in ``refs``.

    ``refs`` is what MXNet's ``creator`` / ``create_operator`` callback stores as
    ``obj._ref_holder`` (``[POINTER(MXCallbackList)]``); the arrays are of plain
    addresses (no ctypes cycles).  None for another MXNet, or fewer than ``n`` slots.
    """
    if not (isinstance(refs, list) and len(refs) == 1
            and isinstance(refs[0], ctypes.POINTER(MXCallbackList)) and refs[0]):
        return None  # pragma: no cover - another MXNet
    table = refs[0][0]
    if table.num_callbacks < n or not table.callbacks or not table.contexts:
        return None  # pragma: no cover - another MXNet
    found = (ctypes.c_void_p * table.num_callbacks).from_address(
        ctypes.addressof(table.callbacks.contents))
    contexts = (ctypes.c_void_p * table.num_callbacks).from_address(
        ctypes.addressof(table.contexts.contents))
    return found, contexts


def record_function(inputs: list, outputs: list, key: int, backward: Callable,
                    delete: Callable) -> Any:
    """Record one autograd node from ``inputs`` to ``outputs`` (``MXCustomFunctionRecord``).

    ``backward(num_ograds, num_igrads, ptrs, reqs, is_train, key)`` and
    ``delete(key)`` serve every node: one pair of C callbacks is made for the
    process, and MXNet hands them the node's ``key`` (an int > 0) as their
    context pointer.  (A pair made per node cost ~25 us and left ctypes objects
    in reference cycles for the collector: ``cast()`` makes them refer to
    themselves.)  Returns what must be kept alive until MXNet calls delete.
    """
    table = _function_tables.get((backward, delete))
    if table is None:
        table = _function_tables[(backward, delete)] = ctypes.cast(
            (ctypes.c_void_p * 2)(entry(f"function-backward {id(backward)}",
                                        FUNCTION_BACKWARD_TYPE, backward),
                                  entry(f"function-delete {id(delete)}", DELETE_TYPE, delete)),
            ctypes.POINTER(ctypes.CFUNCTYPE(ctypes.c_int)))
    contexts = (ctypes.c_void_p * 2)(key, key)
    record = MXCallbackList(2, table, ctypes.cast(contexts, ctypes.POINTER(ctypes.c_void_p)))
    check_call(_LIB.MXCustomFunctionRecord(
        ctypes.c_int(len(inputs)), c_handle_array(inputs),
        ctypes.c_int(len(outputs)), c_handle_array(outputs), ctypes.byref(record)))
    return record, contexts


_function_tables: dict[tuple[Callable, Callable], Any] = {}  # (backward, delete) -> C table
