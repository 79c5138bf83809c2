"""MXNet's C callback ABI for our ops: the tables' types and slots, the arguments, the entries.

MXNet calls a Python operator through tables of C function pointers: one per
prop (``CustomOpPropCallbacks``), one per operator (``CustomOpCallbacks``),
each built by MXNet's ``creator`` / ``create_operator`` callbacks in
``mxnet.operator``, and one per recorded function node
(``MXCustomFunctionRecord``: backward and delete).  The ``release`` and
``deps`` patches point slots of the first two at entries of ours (``shapes`` one slot
of a prop's, ``names`` three); the
``function`` path of :mod:`customop.dispatch` builds the third with
:func:`record_function`.  All the C types and slot numbers are here (see
``include/mxnet/c_api.h``), once; so is reading a callback's arguments (the arrays
grouped by tag, the ``req`` codes, the shapes) and writing its answers, and the one
rule for every entry of ours: it must not raise (:func:`guarded`).
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import sys
import threading
import traceback
import weakref
from collections.abc import Callable
from typing import Any

from mxnet.base import _LIB, MXCallbackList, NDArrayHandle, c_handle_array, check_call
from mxnet.ndarray import NDArray, _ndarray_cls

from .. import errors

# What MXNet's ``req`` codes mean (OpReqType).
REQ = ("null", "write", "inplace", "add")
FB_TYPE = ctypes.CFUNCTYPE(
    ctypes.c_int,
    ctypes.c_int,
    ctypes.POINTER(ctypes.c_void_p),
    ctypes.POINTER(ctypes.c_int),
    ctypes.POINTER(ctypes.c_int),
    ctypes.c_int,
    ctypes.c_void_p,
)  # MXNet's CustomOpFBFunc
DELETE_TYPE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)  # CustomOpDelFunc (and functions')
DEPS_TYPE = ctypes.CFUNCTYPE(
    ctypes.c_int,
    *[ctypes.POINTER(ctypes.c_int)] * 4,
    ctypes.POINTER(ctypes.POINTER(ctypes.c_int)),
    ctypes.c_void_p,
)  # MXNet's CustomOpBwdDepFunc
LIST_TYPE = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p
)  # MXNet's CustomOpListFunc (char***)
INFER_SHAPE_TYPE = ctypes.CFUNCTYPE(
    ctypes.c_int,
    ctypes.c_int,
    ctypes.POINTER(ctypes.c_int),
    ctypes.POINTER(ctypes.POINTER(ctypes.c_int)),
    ctypes.c_void_p,
)  # MXNet's CustomOpInferShapeFunc
FUNCTION_BACKWARD_TYPE = ctypes.CFUNCTYPE(
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.POINTER(ctypes.c_void_p),
    ctypes.POINTER(ctypes.c_int),
    ctypes.c_int,
    ctypes.c_void_p,
)  # CustomFunctionBwdFunc
# MXNet's slots (include/mxnet/c_api.h): CustomOpCallbacks, CustomOpPropCallbacks
OP_DELETE, OP_BACKWARD = 0, 2
PROP_LIST_ARGUMENTS, PROP_LIST_OUTPUTS, PROP_LIST_AUX = 1, 2, 3
PROP_INFER_SHAPE, PROP_DECLARE_DEPS = 4, 5
# MXNet's tags of an operator callback's arrays (CustomOpFBFunc): the list each goes to
IN_DATA, OUT_DATA, IN_GRAD, OUT_GRAD, AUX = range(5)
BACKWARD_WRITES = (IN_GRAD, AUX)  # the tags of the arrays a backward writes

watched: dict[int, tuple[Any, int, int | None]] = {}  # key -> (op, MXNet's deleter, context)
keys = itertools.count(1)
# name -> (our C callback, its address, the function it calls), kept for good
_entries: dict[str, tuple[Any, int, Callable]] = {}
_entries_lock = threading.Lock()


def guarded(fn: Callable[..., bool]) -> Callable[..., bool]:
    """``fn``, a C callback of ours, returning False (failure) to MXNet where it raises.

    A C callback must not raise: ctypes only prints an exception from a callback, and
    C++ then reads a return value nobody set.  The traceback is printed here unless the
    failure is one of ours, which the prop or operator that raised it reported already
    (:func:`customop.errors.is_ours`).
    """

    @functools.wraps(fn)
    def callback(*args: Any) -> bool:
        try:
            return fn(*args)
        except Exception:  # noqa: BLE001 - a C callback must not raise
            if not errors.is_ours(sys.exc_info()[1]):
                traceback.print_exc()
            return False

    return callback


def poisoned(arrays: list[Any]) -> bool:
    """:func:`customop.errors.poison` for a callback that failed, never raising: False when
    nothing could be poisoned (under NaiveEngine the poison runs, and fails, at once)."""
    try:
        return errors.poison(arrays)
    except Exception:  # noqa: BLE001 - the callback's own failure is reported instead
        return False


def op_arrays(
    num: int, handles: Any, tags: Any, writes: tuple[int, ...], stype: Callable[[int], int]
) -> list[list[NDArray]]:
    """The ``num`` arrays of an operator callback (``CustomOpFBFunc``), grouped by their
    tags: in_data, out_data, in_grad, out_grad, aux (see :data:`IN_DATA`...).

    ``writes``: the tags of the arrays the callback writes; ``stype(i)``: the storage
    type of array ``i``.
    """
    arrays: list[list[NDArray]] = [[] for _ in range(5)]
    for i in range(num):
        arrays[tags[i]].append(
            _ndarray_cls(
                ctypes.cast(handles[i], NDArrayHandle), writable=tags[i] in writes, stype=stype(i)
            )
        )
    return arrays


def req_names(codes: Any, n: int) -> list[str]:
    """The first ``n`` of MXNet's ``req`` codes, by name (:data:`REQ`)."""
    return [REQ[codes[i]] for i in range(n)]


def function_arrays(
    num_ograds: int, num_igrads: int, handles: Any, read_ograds: bool
) -> tuple[list[NDArray] | None, list[NDArray]]:
    """The arrays of a recorded function's backward (``CustomFunctionBwdFunc``): the output
    gradients it reads (None unless ``read_ograds``) and the input gradients it writes."""
    igrads = [
        NDArray(ctypes.cast(handles[num_ograds + i], NDArrayHandle), writable=True)
        for i in range(num_igrads)
    ]
    if not read_ograds:
        return None, igrads
    return [
        NDArray(ctypes.cast(handles[i], NDArrayHandle), writable=False) for i in range(num_ograds)
    ], igrads


def given_shapes(n: int, dims: Any, shapes: Any) -> list[list[int]]:
    """The first ``n`` shapes an infer-shape callback (``CustomOpInferShapeFunc``) got."""
    # (a pointer's slice: a list of ints; an unknown ndim is -1)
    return [shapes[i][: max(dims[i], 0)] for i in range(n)]


def answer_shapes(
    num: int, answer: list[Any], dims: Any, shapes: Any, given: list[list[int]] = ()
) -> list[Any]:
    """Write ``answer`` (the shapes of the ``num`` arrays) into an infer-shape callback's
    ``dims`` and ``shapes``; returns the buffers, which must live until C++ copied them.
    An input shape equal to the one ``given`` stays in MXNet's own buffer (C++ reads it
    back as it is)."""
    held = []
    for i in range(num):
        values = list(map(int, answer[i]))
        if i < len(given) and values == given[i] and dims[i] == len(values):
            continue
        buf = (ctypes.c_int * (len(values) or 1))(*values)
        held.append(buf)
        shapes[i] = buf  # (an int array stands for its int*: no ctypes.cast, 1 us each)
        dims[i] = len(values)
    return held


def int_array(values: list[int]) -> tuple[Any, int]:
    """A C ``int`` array of ``values`` (one element at least), and how many they are."""
    return (ctypes.c_int * max(len(values), 1))(*values), len(values)


def answer_ints(found: tuple[Any, int], num: Any, out: Any) -> None:
    """Hand C++ an :func:`int_array` through a callback's ``int*`` and ``int**``."""
    num[0] = found[1]
    out[0] = ctypes.cast(found[0], ctypes.POINTER(ctypes.c_int))


def string_array(strings: list[str]) -> Any:
    """A C ``char*`` array of ``strings``, NULL-terminated (a list callback's answer)."""
    return (ctypes.c_char_p * (len(strings) + 1))(*[str(s).encode() for s in strings])


def answer_strings(found: Any, out: Any) -> None:
    """Hand C++ a :func:`string_array` through a list callback's ``char***``."""
    out[0] = ctypes.addressof(found)


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
                found = _entries[name] = (
                    callback,
                    ctypes.cast(callback, ctypes.c_void_p).value,
                    fn,
                )
    return found[1]


def entries() -> dict[str, Callable]:
    """The Python function behind each C callback :func:`entry` made so far, by name."""
    return {name: found[2] for name, found in list(_entries.items())}


def adopt(patch: str, refs: Any, entries: dict, context: Callable[[], int]) -> None:
    """A prop or operator of ours was created: install ``patch``, then point slots of the
    table MXNet keeps for it in ``refs`` at our C callbacks, ``entries`` (slot -> the
    :func:`entry` arguments ``(name, ctype, fn)``), each handed ``context()`` (made once,
    only when the slots are taken).  Nothing when ``patch`` is switched off or MXNet's
    table differs."""
    from .. import runtime  # (the package imports this module's users, not this module)

    runtime.install(patch)
    found = slots(refs, max(entries) + 1) if runtime.is_installed(patch) else None
    if found is None:
        return  # switched off, or another MXNet
    slots_, contexts = found
    key = context()
    for slot, (name, ctype, fn) in entries.items():
        contexts[slot] = key
        slots_[slot] = entry(name, ctype, fn)


def weak_key(table: dict, obj: Any) -> int:
    """A new context key for ``obj``, held in ``table`` by a weak reference that drops the
    key with ``obj``."""
    key = next(keys)
    table[key] = weakref.ref(obj, lambda _, key=key: table.pop(key, None))
    return key


def slots(refs: Any, n: int) -> tuple[Any, Any] | None:
    """The callback and context arrays of the table MXNet keeps in ``refs``.

    ``refs`` is what MXNet's ``creator`` / ``create_operator`` callback stores as
    ``obj._ref_holder`` (``[POINTER(MXCallbackList)]``); the arrays are of plain
    addresses (no ctypes cycles).  None for another MXNet, or fewer than ``n`` slots.
    """
    if not (
        isinstance(refs, list)
        and len(refs) == 1
        and isinstance(refs[0], ctypes.POINTER(MXCallbackList))
        and refs[0]
    ):
        return None  # pragma: no cover - another MXNet
    table = refs[0][0]
    if table.num_callbacks < n or not table.callbacks or not table.contexts:
        return None  # pragma: no cover - another MXNet
    found = (ctypes.c_void_p * table.num_callbacks).from_address(
        ctypes.addressof(table.callbacks.contents)
    )
    contexts = (ctypes.c_void_p * table.num_callbacks).from_address(
        ctypes.addressof(table.contexts.contents)
    )
    return found, contexts


def record_function(
    inputs: list, outputs: list, key: int, backward: Callable, delete: Callable
) -> Any:
    """Record one autograd node from ``inputs`` to ``outputs`` (``MXCustomFunctionRecord``).

    ``backward(num_ograds, num_igrads, ptrs, reqs, is_train, key)`` and
    ``delete(key)`` serve every node: one pair of C callbacks is made for the
    process, and MXNet hands them the node's ``key`` (an int > 0) as their
    context pointer.  (A pair made per node cost time on every call, docs/design.md, and
    left ctypes objects in reference cycles for the collector: ``cast()`` makes them refer
    to themselves.)  Returns what must be kept alive until MXNet calls delete.
    """
    table = _function_tables.get((backward, delete))
    if table is None:
        table = _function_tables[(backward, delete)] = ctypes.cast(
            (ctypes.c_void_p * 2)(
                entry(f"function-backward {id(backward)}", FUNCTION_BACKWARD_TYPE, backward),
                entry(f"function-delete {id(delete)}", DELETE_TYPE, delete),
            ),
            ctypes.POINTER(ctypes.CFUNCTYPE(ctypes.c_int)),
        )
    contexts = (ctypes.c_void_p * 2)(key, key)
    record = MXCallbackList(2, table, ctypes.cast(contexts, ctypes.POINTER(ctypes.c_void_p)))
    check_call(
        _LIB.MXCustomFunctionRecord(
            ctypes.c_int(len(inputs)),
            c_handle_array(inputs),
            ctypes.c_int(len(outputs)),
            c_handle_array(outputs),
            ctypes.byref(record),
        )
    )
    return record, contexts


_function_tables: dict[tuple[Callable, Callable], Any] = {}  # (backward, delete) -> C table
