"""The library's operators' verdicts kept on disk with their graphs: no trace in a later process.

An operator of customop's own library (``customop.ops``: its forward, gradient closures and
everything they hold are code of the files :func:`customop.graphs.code_hash.customop_source`
reads) has a verdict that only its parameters, the signature, the purpose and that source
(with MXNet's, NumPy's and Python's versions) decide.  So its verdict, with the graph
itself, is kept under that key in :mod:`customop.graphs.verdict_files`, and a later process
takes it without tracing.  Any other operator records once and keys its verdict by that
recording and the code it ran (:func:`customop.graphs.verify.verified`).

The graph is written as data (JSON: operators, attributes, references; an export's constant
arrays as bytes with their dtype and shape) and read back equal, tuples as tuples.

Example:
    >>> import numpy as np
    >>> from customop.graphs import saved_graphs
    >>> from customop.symbol_json import NativeGraph
    >>> g = NativeGraph([{"op": "relu", "name": "r", "attrs": {}, "inputs": [("in", 0)]}],
    ...                 [("node", 0, 0)], generic=(4,))
    >>> saved_graphs.graph_of(saved_graphs.data_of(g)) == g
    True
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import sys
import types
from typing import Any

import numpy as np

from ..symbol_json import NativeGraph
from . import code_hash, registration, verdict_files

_NUMERIC = "biufc"  # dtype kinds a constant is saved with (others: not saved)


def recalled(
    op: Any, params: dict, shapes: tuple, dtypes: tuple, purpose: str, given: Any = None
) -> dict | None:
    """``{"graph": NativeGraph | None, "reason": str, "rule": str}`` saved for this library
    op's verdict, or None (not a library op, no entry, or one that does not read back).
    ``given``: the entry's outcome, read by the caller from a file holding it under the
    same source (:mod:`customop.graphs.saved_splices`): no file of its own is read."""
    if given is not None:
        saved = given
    else:
        key = _key(op, params, shapes, dtypes, purpose)
        saved = verdict_files.load(key) if key is not None else None
    if not isinstance(saved, dict):
        return None
    try:
        reason, rule, data = saved["reason"], saved["rule"], saved["graph"]
        if not isinstance(reason, str) or not isinstance(rule, str):
            return None
        graph = graph_of(data) if data is not None else None
    except Exception:  # noqa: BLE001 - an entry that does not read back is a miss
        return None
    if graph is None and not reason:
        return None
    return {"graph": graph, "reason": reason, "rule": rule}


def keep(op: Any, params: dict, shapes: tuple, dtypes: tuple, purpose: str, verdict: Any) -> None:
    """Save a library op's verdict (``graph``, ``reason``, ``rule``) for later processes."""
    key = _key(op, params, shapes, dtypes, purpose)
    if key is None:
        return
    data = data_of(verdict.graph) if verdict.graph is not None else None
    if verdict.graph is not None and data is None:
        return
    verdict_files.save(key, {"graph": data, "reason": verdict.reason, "rule": verdict.rule})


def _key(op: Any, params: dict, shapes: tuple, dtypes: tuple, purpose: str) -> str | None:
    if verdict_files.folder() is None or not library(op):
        return None
    source = code_hash.customop_source()
    if source is None:  # (changed since the import, or unreadable)
        return None
    return json.dumps(
        [
            "library verdict",
            registration.fields(op),
            repr(sorted(params.items())),
            [list(s) for s in shapes],
            [str(d) for d in dtypes],
            purpose,
            os.environ.get("CUSTOMOP_RUNTIME_OFF", ""),
            source,
            verdict_files.VERSIONS,
        ]
    )


def library(op: Any) -> bool:
    """Whether everything ``op``'s forward and closures run or hold is customop's source (or
    plain values): then that source decides its graph."""
    folders = tuple(os.path.normcase(f) + os.sep for f in code_hash.source_folders())
    work: list[Any] = [op]
    seen: set[int] = set()
    while work:
        item = work.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if hasattr(item, "fn") and hasattr(item, "grads"):  # an operator (a variant's full op)
            work.extend([item.fn, *item.grads.values()])
            continue
        fn = getattr(item, "__func__", item)
        if isinstance(fn, types.FunctionType):
            if not os.path.normcase(fn.__code__.co_filename).startswith(folders):
                return False
            for cell in fn.__closure__ or ():
                try:
                    work.append(cell.cell_contents)
                except ValueError:  # an empty cell
                    continue
            work.extend(fn.__defaults__ or ())
        elif code_hash.simple(item) or item is None:
            continue
        else:  # an object: its class must be the library's
            module = sys.modules.get(type(item).__module__)
            path = os.path.normcase(getattr(module, "__file__", None) or "")
            if not path.startswith(folders):
                return False
    return True


# ---- a graph as data and back ----------------------------------------------------------------
def data_of(graph: NativeGraph) -> dict | None:
    """``graph`` as JSON data; None when a constant's dtype is not a plain number's."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(graph):
        value = getattr(graph, f.name)
        if f.name == "constants":
            arrays = {}
            for name, a in value.items():
                a = np.ascontiguousarray(a)
                if a.dtype.kind not in _NUMERIC or a.dtype.fields is not None:
                    return None
                data = base64.b64encode(a.tobytes()).decode("ascii")
                arrays[name] = [a.dtype.str, list(a.shape), data]
            value = arrays
        elif f.name == "forward_only":
            value = data_of(value) if value is not None else None
            if graph.forward_only is not None and value is None:
                return None
        elif isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out


def graph_of(data: dict) -> NativeGraph:
    """The graph ``data`` (from :func:`data_of`) stands for (raises on malformed data)."""
    fields = {f.name for f in dataclasses.fields(NativeGraph)}
    if set(data) != fields:
        raise ValueError("not a saved graph")
    kw = dict(data)
    kw["nodes"] = [
        dict(node, attrs=dict(node["attrs"]), inputs=[tuple(r) for r in node["inputs"]])
        for node in data["nodes"]
    ]
    kw["heads"] = [tuple(h) for h in data["heads"]]
    kw["constants"] = {
        name: np.frombuffer(base64.b64decode(text), dtype=np.dtype(dtype)).reshape(shape).copy()
        for name, (dtype, shape, text) in data["constants"].items()
    }
    _check(kw["nodes"], kw["heads"], kw["constants"])
    kw["generic"] = tuple(data["generic"])
    kw["differentiates"] = tuple(data["differentiates"])
    kw["guards"] = list(data["guards"])
    if data["forward_only"] is not None:
        kw["forward_only"] = graph_of(data["forward_only"])
    for name, kind in (("specialized", str), ("checks", int), ("dtype_generic", bool)):
        if not isinstance(kw[name], kind):
            raise ValueError(f"not a saved graph: {name}")
    return NativeGraph(**kw)


def _check(nodes: list, heads: list, constants: dict) -> None:
    """Raise ValueError unless every node is an operator with text attributes whose inputs
    are the op's inputs, constants or earlier nodes' outputs."""
    for k, node in enumerate(nodes):
        if not isinstance(node.get("op"), str) or not isinstance(node.get("name"), str):
            raise ValueError("not a saved graph: a node")
        if not all(isinstance(a, str) and isinstance(v, str) for a, v in node["attrs"].items()):
            raise ValueError("not a saved graph: attributes")
        for r in node["inputs"]:
            _check_ref(r, k, constants)
    for h in heads:
        _check_ref(h, len(nodes), constants)


def _check_ref(r: tuple, before: int, constants: dict) -> None:
    if r[:1] == ("in",) and len(r) == 2 and type(r[1]) is int and r[1] >= 0:
        return
    if r[:1] == ("const",) and len(r) == 2 and r[1] in constants:
        return
    if (
        r[:1] == ("node",)
        and len(r) == 3
        and all(type(i) is int for i in r[1:])
        and 0 <= r[1] < before
        and r[2] >= 0
    ):
        return
    raise ValueError("not a saved graph: a reference")
