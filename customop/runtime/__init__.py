"""Every change customop makes to MXNet or Python: the index of patches, and installing them.

Importing ``customop`` or ``ops`` changes nothing: registering an operator uses
MXNet's own extension point (``mx.operator.register``).  Each fix below is a
module of this package holding the patch, its measured reason and its
off-switch name; it is installed lazily, by the feature that needs it, the
first time it is used in a process (:func:`install`), and acts only on calls,
graphs or tapes that hold our ops.  Set ``CUSTOMOP_RUNTIME_OFF`` to a
comma-separated list of patch names (or ``all``) to keep a patch out; the
feature then behaves as MXNet does.

The index (:data:`PATCHES`: off-switch name -> module, and when it is installed):

``errors`` (:mod:`.ffi_errors`)
    our C callbacks' failures reach the caller that reads their arrays, named;
    installed by the first call of a decorated op or the first graph that holds one.
``fork`` (:mod:`.fork`)
    ``fork()`` and exit never hang on a pending callback, and on Python < 3.10 ``subprocess``
    starts its children without ``fork()`` (glibc's ``posix_spawn``), so a thread that shells
    out never stops MXNet's engine under a training thread; the first call of a decorated op.
``aux`` (:mod:`.aux_wait`)
    reads of our ops' aux arrays wait for their writes; the first op with aux states.
``auxsync`` (:mod:`.trainer_sync`)
    every device's copy of an aux state agrees after a step; installed with ``aux``.
``release`` (:mod:`.release`)
    an operator MXNet deletes frees what it holds at once; the first operator MXNet creates.
``deps`` (:mod:`.deps`)
    each custom node reads its own backward dependencies; the first graph node or
    ``mx.nd.Custom`` call.
``shapes`` (:mod:`.shapes`)
    concurrent binds of one Symbol read the shapes our props answered, not freed memory;
    the first graph node or ``mx.nd.Custom`` call.
``names`` (:mod:`.names`)
    concurrent users of one Symbol read the names our props answered, not freed memory;
    the first graph node or ``mx.nd.Custom`` call.
``binds`` (:mod:`.bind_lock`)
    binds of graphs holding our ops run one at a time (MXNet's subgraph pass races);
    the first graph node or ``mx.nd.Custom`` call.
``trace`` (:mod:`.hooks`)
    a forward recorded as MXNet operators; in place only while one is traced.
``randomness`` (:mod:`.randomness`)
    a ``'numpy'``-mode forward run on placeholders (shape inference) draws from generators
    of its own, and no other thread's random stream moves or rolls back; in place only
    while one runs.
``inline`` (:mod:`customop.graphs.inline`)
    bound and hybridized graphs run inlinable ops as MXNet's operators; the first
    Symbol call, or graph load, of an op that may inline in training.
``gluonshape`` (:mod:`.gluonshape`)
    Gluon's deferred initialization names the op and input whose shape stays unknown;
    the first Symbol call of one of our ops.
``backlog`` (:mod:`.backlog`)
    a thread that calls our ops without reading their results waits for MXNet's engine
    once every few nodes, so the Python callbacks queued on MXNet's custom-op workers
    never pile up (each pile-up starts threads that stay); the first call of a decorated op.
``runahead`` (:mod:`.runahead`)
    a thread that calls our ops without reading their results stays within a few calls of
    MXNet's engine (a marker in the engine every few calls, waited for without touching any
    array's failure), so the queued steps' arrays never pile up in memory; the first
    call of a decorated op.
``isAlive`` (:mod:`.isalive`)
    ``Thread.isAlive`` for MXNet's ``tools/launch.py``; ``launch --launcher ssh|mpi|...``.
``onnxops`` (:mod:`customop.deploy.onnxops`)
    MXNet's ONNX converter translates the operators our exports hold that it lacks
    (:data:`customop.deploy.onnx_rules.RULES`); the first :func:`customop.to_onnx`.
``excepthook`` (:func:`customop.distributed.launch.exit_on_error`)
    an uncaught exception ends a ``dist_*`` worker with exit code 1; at start-up in
    the workers of ``python -m customop.distributed.launch`` only (its public function,
    not installed through :func:`install`).

Every patch is installed the same way, :func:`install` with its name: the index names
its module by its full path, imported then if need be, whose ``install()`` runs once
(``trace`` and ``randomness``, :data:`SCOPED`, install nothing: in place only while
their block runs).
This package imports no wing (``graphs/``, ``deploy/``, ``distributed/``, ``port/``): a
patch that only a wing's feature needs lives in that wing (``inline`` in
:mod:`customop.graphs.inline`, ``onnxops`` in :mod:`customop.deploy.onnxops`), imports what
it uses there, and is reached from here only through its name in the index
(``tests/customop/test_layout.py`` checks).  MXNet's C callback ABI is in
:mod:`.callbacks`: the tables MXNet builds for our ops, which ``release``, ``deps``,
``shapes``, ``names`` and the recorded function path of :mod:`customop.dispatch` write,
the callbacks' arguments and answers, and the guard every C entry of ours runs under.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from typing import Any

from ..setting import Setting

# off-switch name -> the module that holds the patch (its reason, install()): this package's,
# or a wing's for a patch only that wing's feature needs (imported by this name, never above)
PATCHES = {
    "errors": "customop.runtime.ffi_errors",
    "fork": "customop.runtime.fork",
    "aux": "customop.runtime.aux_wait",
    "auxsync": "customop.runtime.trainer_sync",
    "release": "customop.runtime.release",
    "deps": "customop.runtime.deps",
    "shapes": "customop.runtime.shapes",
    "names": "customop.runtime.names",
    "binds": "customop.runtime.bind_lock",
    "trace": "customop.runtime.hooks",
    "randomness": "customop.runtime.randomness",
    "inline": "customop.graphs.inline",
    "gluonshape": "customop.runtime.gluonshape",
    "isAlive": "customop.runtime.isalive",
    "onnxops": "customop.deploy.onnxops",
    "backlog": "customop.runtime.backlog",
    "runahead": "customop.runtime.runahead",
}

# Patches in place only while their block runs, for that thread (hooks.tracing,
# randomness.placeholder_draws): nothing is installed for them, so they have no install();
# their switch keeps the block from changing anything.
SCOPED = ("trace", "randomness")

# MXNet's own pthread_atfork handlers (src/initialize.cc), which the ``fork`` patch runs;
# internal, C++-mangled names:
# tests/customop/test_runtime.py fails loudly if a build of MXNet lacks them.
MXNET_FORK_STEPS = ("_ZN5mxnet22pthread_atfork_prepareEv", "_ZN5mxnet21pthread_atfork_parentEv")

_installed: set = set()
_lock = threading.Lock()


def disabled(name: str) -> bool:
    """Whether ``CUSTOMOP_RUNTIME_OFF`` keeps patch ``name`` out."""
    off = SWITCH.value()
    return name in off or "all" in off


def _names(text: str | None) -> frozenset:
    return frozenset(p.strip() for p in (text or "").split(","))


# read at each ask (binds, new signatures: nine asks a new box count of the RetinaNet-style head)
SWITCH = Setting("CUSTOMOP_RUNTIME_OFF", _names)


def is_installed(name: str, installed: set = _installed) -> bool:
    """Whether patch ``name`` is installed (the set bound: callbacks run at shutdown too)."""
    return name in installed


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


def patch(name: str) -> Any:
    """The module of patch ``name`` (see :data:`PATCHES`), imported on first use."""
    return importlib.import_module(PATCHES[name])


def install(name: str) -> None:
    """Install patch ``name`` unless it is installed or switched off (idempotent); a
    :data:`SCOPED` patch is never installed."""
    if name not in _installed and name not in SCOPED:
        _once(name, patch(name).install)


def use() -> None:
    """A decorated op is being called or bound: install what every op needs (idempotent)."""
    if (
        "runahead" in _installed
        and "backlog" in _installed
        and "fork" in _installed
        and "errors" in _installed
    ):
        return  # the common case
    install("errors")
    install("fork")
    install("backlog")
    install("runahead")


def note_graph_op(op: Any) -> None:
    """``op`` is going into a graph: install ``gluonshape``, and ``inline`` if it may inline
    in training."""
    if "gluonshape" not in _installed:
        install("gluonshape")
    if "inline" in _installed or not patch("inline").wanted(op):
        return
    use()
    install("binds")  # first: its lock then wraps MXNet's own bind, inside inline's wrapper
    install("inline")
