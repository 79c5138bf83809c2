"""A model's spliced training graph kept on disk: a later process's first bind splices nothing.

When every ``Custom`` node of a graph is one of customop's own library operators
(:func:`customop.graphs.saved_graphs.library`), the graph :func:`customop.graphs.splice.inline`
makes of it, tidied, is decided by the graph's text, the signature it is bound at, the
inputs that need gradients, customop's source and MXNet's, NumPy's and Python's versions.
So the first splice of a graph in a process is kept in
:mod:`customop.graphs.verdict_files` under that key (customop's source is held in the entry
and checked at a read: a process's first look at its source then runs on another thread
while MXNet reads the saved graph; the inlined ops' verdicts are kept in a file beside it),
and a later process's first bind of the same graph at the same signature reads it instead
of running the ``Custom`` nodes' shape pass, recalling the ops' graphs and tidying (half
of such a bind: ``BENCHMARKS.md``).  The signature read back passed every op's checks in
the process that saved it, with the same code: they pass again.

Only an executor's bind reads or writes these files (``Symbol.simple_bind``/``bind``: a
process often binds a model once), and only at a process's first look at a graph's text; its
later signatures (a new box count) splice in memory.  After a read, the first of them asks
the ops' graphs at the signatures saved with the splice (their shape families serve the new
one), reads the tidied graph (:mod:`customop.graphs.saved_tidy`) and takes the Symbol read
when it makes the same graph (:func:`customop.graphs.splice.adopt`).  A hybridized block
meets many signatures and splices in memory from its first one.

Example:
    >>> import os, tempfile
    >>> import mxnet as mx
    >>> from customop import ops
    >>> from customop.graphs import binding, saved_splices
    >>> before = os.environ.get("CUSTOMOP_VERDICT_CACHE")
    >>> os.environ["CUSTOMOP_VERDICT_CACHE"] = tempfile.mkdtemp()
    >>> sym = ops.smooth_l1(mx.sym.var("x") * 2, mx.sym.var("s"))
    >>> shapes, dtypes = {"x": (2, 3), "s": (1,)}, {"x": "float32", "s": "float32"}
    >>> first = binding.spliced(sym, shapes, dtypes, saved=True)  # saved
    >>> saved_splices.forget_seen()  # as a new process
    >>> binding.clear_cache()
    >>> again = binding.spliced(sym, shapes, dtypes, saved=True)  # read back
    >>> again.symbol.tojson() == first.symbol.tojson(), again.verdicts
    (True, {})
    >>> _ = os.environ.pop("CUSTOMOP_VERDICT_CACHE")
    >>> os.environ.update({} if before is None else {"CUSTOMOP_VERDICT_CACHE": before})
"""

from __future__ import annotations

import _thread
import json
import os
import threading
from typing import Any

import mxnet as mx
import numpy as np

from .. import symbol_json
from . import code_hash, registration, saved_graphs, splice, verdict_files

# graph texts this process looked up: only the first look reads or writes a file
_seen: set[str] = set()
_seen_lock = threading.Lock()


def key_of(text: str, ops: list, signature: tuple) -> str | None:
    """The file key of ``text``'s splice at ``signature`` (``binding.spliced``'s shapes,
    dtypes and gradient inputs), or None: not this process's first look at ``text``, the
    files are off, or an op is not the library's.  Variables' initializers are not in the
    key: they compute nothing in the graph, and Gluon names a ``Constant``'s by its ``id``.
    customop's source is not in the key but in the entry (:func:`recalled` checks it while
    MXNet reads the graph); its folder is (two checkouts keep an entry each)."""
    with _seen_lock:
        if text in _seen:
            return None
        _seen.add(text)
    if verdict_files.folder() is None or not all(saved_graphs.library(op) for op in ops):
        return None
    shapes, dtypes, grads = signature
    return json.dumps(
        [
            "spliced graph",
            symbol_json.without_initializers(text),
            [registration.fields(op) for op in ops],
            [[n, list(s)] for n, s in shapes],
            [[n, str(d)] for n, d in dtypes],
            None if grads is None else sorted(grads),
            os.environ.get("CUSTOMOP_RUNTIME_OFF", ""),
            code_hash.source_folders()[0],
            verdict_files.VERSIONS,
        ]
    )


def recalled(key: str, graph: dict[str, Any]) -> splice.Spliced | None:
    """The splice saved under ``key``, or None (no entry, one that does not read back, or one
    another customop source saved); its variables take their attributes from ``graph``'s
    (the graph being bound)."""
    saved = verdict_files.load(key)
    if saved is None:
        return None
    try:
        attrs = {n["name"]: n.get("attrs") for n in graph["nodes"] if n["op"] == "null"}
        text = _joined(saved["graph"], attrs)
        inlined, switches = list(saved["inlined"]), set(saved["switches"])
        shapes = {str(n): tuple(int(d) for d in s) for n, s in saved["input_shapes"].items()}
        made, source = saved["digest"], saved["source"]
        signatures = {
            str(n): ([tuple(int(d) for d in s) for s in sig[0]], [np.dtype(t) for t in sig[1]])
            for n, sig in saved["signatures"].items()
        }
        if (
            not isinstance(made, str)
            or not isinstance(source, str)
            or not all(isinstance(n, str) for n in inlined)
        ):
            return None
    except Exception:  # noqa: BLE001 - an entry that does not read back is a miss
        return None
    sym = _loaded_checking(text, source)
    if sym is None:
        return None
    splice.adopt(made, sym, attrs)  # (the next signature of its family makes that graph again)
    return splice.Spliced(
        sym,
        inlined=inlined,
        switches=switches,
        input_shapes=shapes,
        signatures=signatures,
        verdicts_key=_verdicts_key(key),
    )


def _loaded_checking(text: str, source: str) -> mx.sym.Symbol | None:
    """The Symbol of ``text`` when customop's source is ``source`` (else None).  At a
    process's first look at its source (90 files' sizes and times, 0.4-0.7 ms) another
    thread reads it while MXNet reads the graph here (1 ms for the RetinaNet-style head's
    165 nodes; ctypes lets go of the GIL meanwhile).  (A bare thread: ``threading``'s
    start waits until the thread runs, 0.15-0.2 ms, the time this saves.)"""
    if code_hash.source_known():
        return _symbol(text) if code_hash.customop_source() == source else None
    found: list = []
    done = _thread.allocate_lock()
    done.acquire()

    def read() -> None:
        try:
            found.append(code_hash.customop_source())
        finally:
            done.release()

    try:
        _thread.start_new_thread(read, ())
    except RuntimeError:  # (no thread to be had: read here)
        read()
    try:
        sym = _symbol(text)
    finally:
        done.acquire()
    return sym if found and found[0] == source else None


def _symbol(text: str) -> mx.sym.Symbol | None:
    try:
        return mx.sym.load_json(text)
    except Exception:  # noqa: BLE001 - an entry MXNet does not read is a miss
        return None


def keep(key: str, found: splice.Spliced) -> None:
    """Save ``found`` under ``key`` when every node inlined (nothing kept, no new inputs)."""
    if found.kept or found.constants or found.input_shapes is None or found.graph is None:
        return
    source = code_hash.customop_source()
    if source is None:  # (changed since the import, or unreadable)
        return
    outcome: dict[str, Any] = {
        "graph": _pieces(json.loads(found.symbol.tojson())),
        "inlined": list(found.inlined),
        "switches": sorted(found.switches),
        "source": source,
        "input_shapes": {n: list(s) for n, s in found.input_shapes.items()},
        "signatures": {
            n: [[list(s) for s in shapes], [np.dtype(t).name for t in dtypes]]
            for n, (shapes, dtypes) in found.signatures.items()
        },
        "digest": splice.digest(found.graph),
    }
    verdict_files.save(key, outcome)
    # (the ops' verdicts, as saved_graphs saves them, in a file of their own: the first new box
    # count after a read reads one file for them, and the first bind does not read them)
    verdict_files.save(_verdicts_key(key), {"source": source, "verdicts": _verdicts(found)})


def verdicts(key: str) -> dict[str, Any] | None:
    """The inlined ops' verdicts saved with a splice (``key``: its
    :attr:`~customop.graphs.splice.Spliced.verdicts_key`), by node, as
    :func:`customop.graphs.saved_graphs.recalled` takes them; None: no entry, or one another
    customop source saved."""
    saved = verdict_files.load(key)
    if saved is None or saved.get("source") != code_hash.customop_source():
        return None
    found = saved.get("verdicts")
    return found if isinstance(found, dict) else None


def _verdicts_key(key: str) -> str:
    return json.dumps(["spliced graph's verdicts", key])


def _verdicts(found: splice.Spliced) -> dict[str, Any]:
    out = {}
    for name, verdict in found.verdicts.items():
        data = saved_graphs.data_of(verdict.graph) if verdict.graph is not None else None
        if data is not None:
            out[name] = {"graph": data, "reason": verdict.reason, "rule": verdict.rule}
    return out


# A saved graph is MXNet's JSON text cut where each variable's attributes go: the text
# before it, the variable's name, the text after, ... (a few dozen strings where the parsed
# graph was a few thousand objects to read back, and to write again for MXNet's loader).
# A read fills in the attributes of the graph being bound.


def _pieces(graph: dict[str, Any]) -> list[str]:
    """``graph`` (MXNet's JSON, parsed) as text pieces around its variables' attributes."""
    pieces, text = [], '{"nodes": ['
    for k, node in enumerate(graph["nodes"]):
        text += ", " if k else ""
        if node["op"] == "null":
            body = json.dumps({a: v for a, v in node.items() if a != "attrs"})
            pieces += [text + body[:-1], node["name"]]
            text = "}"
        else:
            text += json.dumps(node)
    rest = {a: v for a, v in graph.items() if a != "nodes"}
    return [*pieces, text + "], " + json.dumps(rest)[1:]]


def _joined(pieces: list[str], attrs: dict[str, Any]) -> str:
    """The text of :func:`_pieces`, each variable with the attributes ``attrs`` names
    (by name; a variable ``attrs`` lacks raises ``KeyError``)."""
    out = []
    for k, piece in enumerate(pieces):
        if k % 2 == 0:
            out.append(piece)
        elif attrs[piece]:
            out.append(', "attrs": ' + json.dumps(attrs[piece]))
    return "".join(out)


def forget_seen() -> None:
    """Forget which graphs this process looked up (tests: as a new process would)."""
    with _seen_lock:
        _seen.clear()
