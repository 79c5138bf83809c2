"""An op's port record, read from its native graphs (this module needs MXNet).

For one call signature (shapes, dtypes, parameters) :func:`record_for` asks
:func:`customop.graphs.graph_verdicts.native_graph` for the op's training graph, the one hybridized
blocks run: its value is the forward, its gradient by autograd the op's own (the
``def_grad`` closures transposed, or the forward's gradient for an op without them).  Its
``forward_only`` graph, when it has one, is the forward without the closures' terms.
What has no such graph is a :class:`~customop.port.runner.PortError` saying why.
"""

from __future__ import annotations

import dataclasses
import re
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..graphs import graph_verdicts
from . import portfile
from .portfile import Record
from .runner import PortError, port_error

_lock = threading.Lock()
# a verdict whose trace failed in the op's own checks (customop.errors' "customop 'op': ...")
_BAD_INPUT = re.compile(
    r"failed while being traced on placeholder inputs: "
    r"(TypeError|ValueError): (customop '[^']+'.*)",
    re.S,
)
_records: dict[tuple, Record] = {}


def live_op(op: Any) -> Any:
    if not (hasattr(op, "op_type") and hasattr(op, "signature") and hasattr(op, "variants")):
        raise TypeError(
            f"customop port: expected an operator made with @customop, got {type(op).__name__}"
        )
    return op


def why_not_native(op: Any) -> str:
    """Why ``op`` has no graphs to port ("" when it may have some); auxiliary states first,
    since they stop the host path of a ``'numpy'``-mode op too."""
    if op.signature.aux:
        return (
            f"it has auxiliary states ({', '.join(op.signature.aux)}) that its forward "
            f"updates in place; a port is a pure function (pass the state as an input "
            f"of an op of your own, or keep the op in MXNet)"
        )
    if op.mode != "mxnet":
        return (
            "it is a 'numpy'-mode op: its forward is NumPy code run by Python, not a "
            "graph of MXNet operators (to_torch/to_jax run it on the host through a "
            "callback where MXNet is installed; a saved port needs an 'mxnet'-mode op)"
        )
    return ""


def record_for(
    op: Any,
    shapes: Sequence[Sequence[int]],
    dtypes: Sequence[Any],
    params: dict[str, Any],
    names: Sequence[str] | None = None,
) -> Record:
    """The op's graphs at this signature (``op`` a variant when optional inputs are absent)."""
    shapes = [tuple(int(d) for d in s) for s in shapes]  # (int(): a SymInt is not hashable)
    key = (op, tuple(shapes), tuple(map(str, dtypes)), repr(sorted(params.items())))
    found = _records.get(key)
    if found is not None:
        return found
    dtypes = [np.dtype(d).name for d in dtypes]
    why = why_not_native(op)
    if why:
        raise port_error(op.op_type, f"cannot be ported as graphs: {why}")
    verdict = graph_verdicts.native_graph(op, params, shapes, dtypes, graph_verdicts.TRAIN)
    if verdict.graph is None:
        bad = _BAD_INPUT.search(verdict.reason)
        if bad:  # the op's own input check failed: a shape or dtype error, not a trace's
            raise port_error(
                op.op_type,
                f"at {_sig(shapes, dtypes)}: {bad.group(2)}",
                TypeError if bad.group(1) == "TypeError" else ValueError,
            )
        raise port_error(
            op.op_type,
            (
                f"its forward does not trace to MXNet operators at {_sig(shapes, dtypes)}, so "
                f"there is no graph to port: {verdict.reason}"
            ),
        )
    graph = verdict.graph
    if graph.constants:
        raise port_error(op.op_type, "its graph holds constants; no port for it yet")
    names = list(names or op.signature.inputs)
    no_grad = set(op.no_grad)
    grads = [
        i
        for i, (n, d) in enumerate(zip(names, dtypes))
        if n not in no_grad and np.issubdtype(np.dtype(d), np.floating)
    ]
    train = _graph_json(graph)
    forward = _graph_json(graph.forward_only) if graph.forward_only is not None else train
    record = Record(
        op_type=op.op_type,
        inputs=names,
        shapes=shapes,
        dtypes=dtypes,
        n_out=len(graph.heads),
        grads=grads,
        forward=forward,
        train=train,
        generic=tuple(int(d) for d in graph.generic),
        params=_jsonable(params),
    )
    with _lock:
        _records[key] = record
    return record


def _graph_json(graph: Any) -> dict[str, Any]:
    return {
        "nodes": [
            {
                "op": nd["op"],
                "attrs": {k: str(v) for k, v in (nd.get("attrs") or {}).items()},
                "inputs": [list(r) for r in nd["inputs"]],
            }
            for nd in graph.nodes
        ],
        "heads": [list(h) for h in graph.heads],
    }


def _jsonable(params: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in params.items():
        if isinstance(v, tuple):
            v = list(v)
        elif isinstance(v, np.generic):
            v = v.item()
        out[k] = v
    return out


def _sig(shapes, dtypes) -> str:
    return ", ".join(f"{tuple(s)} {d}" for s, d in zip(shapes, dtypes))


def split_call(
    op: Any, arrays: Sequence[Any], params: dict[str, Any]
) -> tuple[Any, list[int], list[str], dict[str, Any]]:
    """``(the op or its variant, positions of the present inputs, their names, params)``
    for a call whose ``arrays`` may hold ``None`` for absent optional inputs."""
    bound, params = op.signature.bind(tuple(arrays), params)
    names = list(op.signature.inputs)
    present = [i for i, a in enumerate(bound[: len(names)]) if a is not None]
    missing = [n for i, n in enumerate(names) if i not in present]
    bad = [n for n in missing if n not in op.signature.optional]
    if bad:
        raise port_error(
            op.op_type, f"input {bad[0]!r} is not optional and was not given", TypeError
        )
    if missing:
        op = op.variants[frozenset(missing)]
    return op, present, [names[i] for i in present], params


def save_port(op: Any, path: Any, *inputs: Any, **params: Any) -> None:
    """Writes ``op``'s port file; see :func:`customop.save_port`."""
    op = live_op(op)
    inputs = list(inputs)
    bound, _ = op.signature.bind(tuple(inputs), params)
    arrays = [a for a in bound[: len(op.signature.inputs)]]
    arrays = [None if a is None else _as_numpy(a) for a in arrays]
    target, present, names, params = split_call(op, arrays, params)
    if target.mode != "mxnet" or target.signature.aux:
        raise port_error(op.op_type, f"cannot be saved as a port: {why_not_native(target)}")
    shapes = [arrays[i].shape for i in present]
    dtypes = [arrays[i].dtype for i in present]
    record = dataclasses.replace(
        record_for(target, shapes, dtypes, params, names),
        absent=[n for n in op.signature.inputs if n not in names],
        op_type=op.op_type,
    )  # a copy: live ports share the record
    portfile.write(record, path)


def _as_numpy(a: Any) -> np.ndarray:
    if isinstance(a, np.ndarray):
        return a
    if hasattr(a, "asnumpy"):
        return a.asnumpy()
    if hasattr(a, "detach"):
        return a.detach().cpu().numpy()
    return np.asarray(a)


__all__ = ["record_for", "save_port", "split_call", "PortError"]
