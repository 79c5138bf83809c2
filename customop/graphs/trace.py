"""Recording an ``'mxnet'``-mode forward as a graph of MXNet's own operators.

The forward runs under ``mx.autograd.record()`` on concrete arrays, and
``mx.autograd.get_symbol`` reads back the operators it recorded.  This module only
records what happened: the graph, the values of the free variables (arrays the forward used without
receiving them: constants it built, cached arrays, or values it computed while
recording was paused), what it read back to Python, which random operators it
called.  Whether the graph may stand in for the operator is decided in
:mod:`customop.graphs.graph_verdicts`.  Traces run on customop's own trace thread (:func:`aside`).
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import mxnet as mx
import numpy as np
from mxnet.base import _LIB, check_call, py_str

from .. import kernel, value_checks
from ..nd_copies import ndarray
from ..runtime import hooks
from ..side_thread import SideThread
from . import recorded_closures as gradient_closures
from .rules import INDEX_GUARDS, RANDOM

if TYPE_CHECKING:
    from ..opinfo import Differentiable

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the customop package
_MXNET = os.path.dirname(os.path.abspath(mx.__file__))
_op_names: dict[int, list[str]] = {}
_op_kinds: dict[int, tuple] = {}  # handle -> what Log.invoked asks of its names


def is_tracing() -> bool:
    """Whether customop is recording this thread's forward into a native graph right now.

    Not a way to skip checks: write value checks with :func:`customop.require`,
    which raises where the forward runs in Python and makes the outputs NaN in
    a native graph.  A forward that asks ``is_tracing()`` while it is traced
    keeps its ``Custom`` node (it may skip a check there; :func:`customop.explain`
    says so), so code written to the old advice keeps its checks.

    Example:
        >>> import customop
        >>> customop.is_tracing()
        False
    """
    log = hooks.tracing_now()
    if log is not None:
        log.asked.append(_caller())
    return log is not None


def op_names(handle: int) -> list[str]:
    """The names (with aliases) of the MXNet operator behind an ``_imperative_invoke`` handle."""
    if not _op_names:
        size = ctypes.c_uint()
        names = ctypes.POINTER(ctypes.c_char_p)()
        check_call(_LIB.MXListAllOpNames(ctypes.byref(size), ctypes.byref(names)))
        for i in range(size.value):
            name = py_str(names[i])
            h = ctypes.c_void_p()
            check_call(_LIB.NNGetOpHandle(ctypes.c_char_p(name.encode()), ctypes.byref(h)))
            _op_names.setdefault(h.value, []).append(name)
    return _op_names.get(handle, [])


def op_kinds(handle: int) -> tuple[bool, bool, str | None]:
    """What a recording asks of an operator's names, by its handle: whether one is an
    index guard's (rules.INDEX_GUARDS), whether one is ``_copyto``, and its first name
    (:func:`op_names`) where one is random (rules.RANDOM), else None.

    Told without :func:`op_names`' table of every operator (1,167 names looked up, about
    1.5 ms at a process's first trace): the guards' and ``_copyto``'s handles are looked up
    by name, and an operator is random where its own name is (in MXNet 1.9.1 an operator
    has a random alias exactly where its own name is random: tested over every operator);
    only a random operator's first name reads the table."""
    found = _op_kinds.get(handle)
    if found is not None:
        return found
    if not _named:
        for name in (*INDEX_GUARDS, "_copyto"):
            _named[name] = _handle(name)
    random = RANDOM.search(_own_name(handle)) is not None
    names = op_names(handle) if random else ()
    found = _op_kinds[handle] = (
        any(_named[n] == handle for n in INDEX_GUARDS),
        _named["_copyto"] == handle,
        names[0] if names else None,
    )
    return found


_named: dict[str, int | None] = {}  # operator name -> its handle (None: not an operator)


def _handle(name: str) -> int | None:
    h = ctypes.c_void_p()
    try:
        check_call(_LIB.NNGetOpHandle(ctypes.c_char_p(name.encode()), ctypes.byref(h)))
    except mx.base.MXNetError:
        return None
    return h.value


def _own_name(handle: int) -> str:
    """The name an operator was registered with (not an alias)."""
    name, text = ctypes.c_char_p(), ctypes.c_char_p()
    count = ctypes.c_uint()
    names, types, texts = (ctypes.POINTER(ctypes.c_char_p)() for _ in range(3))
    check_call(
        _LIB.NNGetOpInfo(
            ctypes.c_void_p(handle),
            ctypes.byref(name),
            ctypes.byref(text),
            ctypes.byref(count),
            ctypes.byref(names),
            ctypes.byref(types),
            ctypes.byref(texts),
            ctypes.byref(text),
        )
    )
    return py_str(name.value)


@dataclass
class Recording:
    """One run of a forward under ``record()``, read back as a graph.

    ``nodes`` are symbol-JSON nodes in topological order (``op``, ``name``,
    ``attrs``, ``inputs`` as ``[node, output]`` pairs); ``inputs[i]`` is the
    node of array input ``i`` (None when the forward does not use it);
    ``free`` maps the other variable nodes to their values; ``heads`` are the
    outputs' entries; ``outputs`` their values.
    """

    nodes: list[dict[str, Any]]
    inputs: list[int | None]
    free: dict[int, np.ndarray]
    heads: list[tuple[int, int]]
    outputs: list[np.ndarray]
    reads: list[str] = field(default_factory=list)
    randoms: list[str] = field(default_factory=list)
    paused: set[int] = field(default_factory=set)  # nodes computed inside mx.autograd.pause()
    inner: list[Any] = field(default_factory=list)  # decorated ops the forward called
    unknown_free: list[str] = field(default_factory=list)  # free variables without a value
    asked: list[str] = field(default_factory=list)  # where the forward called is_tracing()
    checks: int = 0  # customop.require conditions the graph carries (as NaN poisoning)
    guarded: dict[str, list] = field(default_factory=dict)  # node -> dtypes (rules.INDEX_GUARDS)
    forward_reads: int = 0  # reads[:forward_reads] happened in the forward (then: closures)
    closures: gradient_closures.Recorded | None = None  # what record(closures=) added
    held: bool = True  # whether every require check held on these values (with closures)


class Log:
    """What the trace hooks report while one forward runs (:mod:`customop.runtime.hooks`).

    ``recorded=False``: the forward runs eagerly as traced (``is_tracing()`` true, checks
    that read values back skipped) outside ``record()``: pauses are not numbered.
    """

    def __init__(self, recorded: bool = True):
        self.recorded = recorded
        self.inputs: set[str] = set()  # the graph's names of the forward's inputs
        self.arrays: list[mx.nd.NDArray] = []  # every array an operator read
        # (and every array one wrote, kept alive so that no array handle is reused meanwhile)
        self.written: list[mx.nd.NDArray] = []
        self.copies: list[mx.nd.NDArray] = []  # outputs of _copyto: astype() or a device copy
        self.randoms: list[str] = []
        self.reads: list[str] = []
        self.asked: list[str] = []  # where the forward called is_tracing() (while traced)
        self.guarded: list[tuple[mx.nd.NDArray, list[np.dtype]]] = []  # see rules.INDEX_GUARDS
        self.regions: list[tuple[int, int]] = []  # node numbers recorded inside pause()
        self.inner: list[Any] = []  # decorated ops the forward called (dispatch reports them)
        self.poison: Any = None  # value_checks.factor of the forward's require() conditions
        self._depth = 0
        self._start = 0
        self._probe = mx.nd.zeros((1,))
        self._probe.attach_grad()

    def pause_enter(self) -> None:
        if not self.recorded:
            return
        if not self._depth:
            self._start = self._counter()
        self._depth += 1

    def pause_exit(self) -> None:
        if not self.recorded:
            return
        self._depth -= 1
        if not self._depth:
            self.regions.append((self._start, self._counter()))

    def _counter(self) -> int:
        # MXNet names each recorded operator "node_<n>" from one counter: a probe
        # recorded now tells where the counter stands.
        probe = self._probe * 1
        return node_number(mx.autograd.get_symbol(probe).name)

    def invoked(self, handle: int, ndargs: Any, result: Any) -> None:
        outs = result if isinstance(result, (list, tuple)) else [result]
        self.arrays.extend(ndargs)
        self.written.extend(o for o in outs if isinstance(o, mx.nd.NDArray))
        guarded, copy, random_name = op_kinds(handle)
        if guarded and outs and len(ndargs) > 1:
            # the dtypes its index guard needs: each output's, then the index input's
            self.guarded.append(
                (outs[0], [np.dtype(o.dtype) for o in outs] + [np.dtype(ndargs[1].dtype)])
            )
        if copy and outs:
            self.copies.append(outs[0])
        elif random_name is not None:
            self.randoms.append(random_name)

    def read(self, array: mx.nd.NDArray) -> None:
        if self.inputs & set(_graph_inputs(array)):
            self.reads.append(_caller())


def _graph_inputs(array: mx.nd.NDArray) -> list[str]:
    try:
        return mx.autograd.get_symbol(array).list_inputs()
    except mx.base.MXNetError:  # not recorded: built without the inputs
        return []


def _caller() -> str:
    # The innermost frame outside MXNet and customop: the line of the forward that read.
    for frame in reversed(traceback.extract_stack()):
        path = os.path.abspath(frame.filename)
        if not (path.startswith(_HERE) or path.startswith(_MXNET)):
            return f"{frame.filename}:{frame.lineno} ({frame.line})"
    return "?"


def record(
    op: Differentiable,
    values: list[np.ndarray],
    params: dict[str, Any],
    ctx: mx.Context | None = None,
    closures: list[gradient_closures.Closure] | None = None,
    seed: int = 5,
) -> Recording:
    """Run ``op``'s forward on ``values`` under ``record()`` and read its graph back.

    What the forward computes inside ``mx.autograd.pause()`` is recorded too
    (those nodes are listed in ``paused``): the graph is the whole computation.
    ``closures`` (a training graph's, possibly none): recorded in the same run after
    the forward, with head gradients drawn from ``seed`` as variables (appended to the
    inputs) and the closures' gradients appended to the outputs
    (:mod:`customop.graphs.recorded_closures`; :mod:`customop.graphs.backward` transposes them).
    """
    ctx = ctx or mx.cpu()
    xs = [ndarray(v, ctx) for v in values]
    for x in xs:
        x.attach_grad()
    log = Log()
    log.inputs = {mx.autograd.get_symbol(x).name for x in xs}
    forward_reads = 0
    with hooks.tracing(log), mx.autograd.record(
        train_mode=False
    ), value_checks.collecting() as conditions:
        outs, saved = kernel.run_forward_saving(op, list(xs), dict(params), where="trace")
        # its require() checks become part of the graph: NaN outputs where they fail; a check
        # of an input the outputs do not read is left out (a graph that does not read it
        # cannot be fed a wrong one: softmax_ce's label, which only shapes the gradient)
        # (with closures, a training graph: they may read what the outputs do not, as
        # softmax_ce's gradient reads its label, so every check is kept)
        read = set().union(*(_graph_inputs(o) for o in outs)) & log.inputs
        if closures is None:
            conditions[:] = [c for c in conditions if set(_graph_inputs(c.ok)) & log.inputs <= read]
        log.poison = value_checks.factor(conditions)
        outs = value_checks.poisoned(outs, conditions, log.poison)
        n_conditions = len(conditions)
        forward_reads = len(log.reads)
        added = None
        if closures is not None:
            # the closures see the poisoned outputs, and multiply what they give by
            # log.poison: a failed check makes the gradients NaN too
            added = gradient_closures.record(
                op, closures, xs, outs, saved, params, log, np.random.RandomState(seed)
            )
            xs, outs = [*xs, *added.heads], [*outs, *added.grads]
        inline = value_checks.applied()
    names = [mx.autograd.get_symbol(x).name for x in xs]
    symbols: list[Any] = []
    for o in outs:
        try:
            symbols.append(mx.autograd.get_symbol(o))
        except mx.base.MXNetError:
            symbols.append(None)  # not recorded: a constant output
    recorded = [s for s in symbols if s is not None]
    graph = json.loads(mx.sym.Group(recorded).tojson()) if recorded else {"nodes": [], "heads": []}
    nodes = [
        {
            "op": n["op"],
            "name": n["name"],
            "attrs": dict(n.get("attrs") or {}),
            "inputs": [[int(e[0]), int(e[1])] for e in n["inputs"]],
        }
        for n in graph["nodes"]
    ]
    by_name = {n["name"]: i for i, n in enumerate(nodes)}
    heads_iter = iter([(int(h[0]), int(h[1])) for h in graph["heads"]])
    free_values = _free_values(
        [*log.arrays, *log.written],
        {n["name"] for n in nodes if n["op"] == "null"}.difference(names),
    )
    heads: list[tuple[int, int]] = []
    free: dict[int, np.ndarray] = {}
    for sym, out in zip(symbols, outs):
        if sym is None:
            nodes.append({"op": "null", "name": f"output{len(heads)}", "attrs": {}, "inputs": []})
            free[len(nodes) - 1] = out.asnumpy()
            heads.append((len(nodes) - 1, 0))
        else:
            heads.append(next(heads_iter))
    unknown = []
    for i, n in enumerate(nodes):
        if n["op"] == "null" and i not in free and n["name"] not in names:
            if n["name"] in free_values:
                free[i] = free_values[n["name"]]
            else:
                unknown.append(n["name"])
    for copy in log.copies:  # astype() records _copyto, whose output dtype the graph lacks
        found = _graph_name(copy)
        if found in by_name:
            nodes[by_name[found]]["attrs"]["__dtype__"] = np.dtype(copy.dtype).name
    inputs = [by_name.get(name) for name in names]
    # (read after the recording: its reads are not the forward's)
    held = closures is None or value_checks.all_hold([*conditions, *inline])
    return Recording(
        nodes=nodes,
        inputs=inputs,
        free=free,
        heads=heads,
        outputs=[o.asnumpy() for o in outs],
        reads=log.reads,
        randoms=sorted(set(log.randoms)),
        unknown_free=unknown,
        asked=list(log.asked),
        checks=n_conditions,
        guarded={_graph_name(o): d for o, d in log.guarded},
        forward_reads=forward_reads,
        closures=added,
        held=held,
        inner=list(dict.fromkeys(log.inner)),
        paused={
            i
            for i, n in enumerate(nodes)
            if any(lo < node_number(n["name"]) < hi for lo, hi in log.regions)
        },
    )


def node_number(name: str) -> int:
    """The ``n`` of a recorded operator's graph name ``node_<n>`` (-1 for other names)."""
    head, _, tail = name.rpartition("_")
    return int(tail) if head == "node" and tail.isdigit() else -1


def _graph_name(array: mx.nd.NDArray) -> str | None:
    try:
        return mx.autograd.get_symbol(array).name
    except mx.base.MXNetError:
        return None


def _free_values(arrays: list[mx.nd.NDArray], wanted: set[str]) -> dict[str, np.ndarray]:
    # A free array that a recorded operator read is given a variable node of its own
    # ('nullN') as its graph entry, so get_symbol on it names that node.
    # (the arrays read come first: a free value is one; an array written is one only where
    # the forward attached a gradient to it, as a head of its own)
    found: dict[str, np.ndarray] = {}
    seen: set[int] = set()
    for a in arrays:
        if len(found) == len(wanted):
            break
        key = a.handle.value
        if key in seen:
            continue
        seen.add(key)
        name = _graph_name(a)
        if name in wanted and name not in found:
            sym = mx.autograd.get_symbol(a)
            if sym.get_children() is None:
                found[name] = a.asnumpy()
    return found


# ---- the trace thread ---------------------------------------------------------------------
_trace_thread = SideThread("customop-trace")


def aside(fn, *args):
    """``fn(*args)`` on customop's trace thread, the caller's random streams kept.

    Traces run forwards that may draw random numbers: MXNet's generators are per
    thread (so the caller's stream is untouched there) and NumPy's and Python's
    global ones are put back.  The caller's autograd state is untouched too.
    """
    if _trace_thread.is_current():
        return fn(*args)
    np_state, py_state = np.random.get_state(), random.getstate()
    try:
        return _trace_thread.run(fn, *args)
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)
