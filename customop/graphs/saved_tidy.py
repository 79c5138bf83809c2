"""Spliced graphs tidied by the rules that read the graph alone, kept on disk.

The rules of :mod:`customop.graphs.tidy` before its first settled one read nothing but the
graph (the constants they evaluate are made inside it, and their values are decided by
MXNet's, NumPy's and Python's versions: :mod:`customop.graphs.saved_constants`).  So what
they make of a spliced graph is decided by the graph's text, the rules' names, customop's
source and those versions, and it is kept in :mod:`customop.graphs.verdict_files` under
that key: a later process splicing the same graph (a bind after one that read its splice
from :mod:`customop.graphs.saved_splices`, a hybridized block's first signature) reads it
instead of running the rules again (most of what the first new box count after such a read
paid: ``benchmarks/bind_cost.py``).

Example:
    >>> import os, tempfile
    >>> from customop.graphs import saved_tidy
    >>> before = os.environ.get("CUSTOMOP_VERDICT_CACHE")
    >>> os.environ["CUSTOMOP_VERDICT_CACHE"] = tempfile.mkdtemp()
    >>> graph = {"nodes": [{"op": "null", "name": "x", "inputs": []}], "heads": [[0, 0, 0]]}
    >>> saved_tidy.keep("the graph's text", ("a rule",), graph)
    >>> saved_tidy.recalled(graph, "the graph's text", ("a rule",)) == graph
    True
    >>> saved_tidy.recalled(graph, "another text", ("a rule",)) is None
    True
    >>> _ = os.environ.pop("CUSTOMOP_VERDICT_CACHE")
    >>> os.environ.update({} if before is None else {"CUSTOMOP_VERDICT_CACHE": before})
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from .. import symbol_json
from . import code_hash, verdict_files


def recalled(graph: dict[str, Any], text: str, rules: Sequence[str]) -> dict[str, Any] | None:
    """What the rules named ``rules`` made of ``graph`` (written ``text`` by
    ``json.dumps(graph, sort_keys=True)``) in an earlier process, or None (off, no entry, or
    one that does not read back as a graph)."""
    attrs = {n["name"]: n.get("attrs") for n in graph["nodes"] if n["op"] == "null"}
    key = _key(text, rules)
    saved = verdict_files.load(key) if key is not None else None
    if saved is None:
        return None
    graph = saved.get("graph")
    try:
        nodes, heads = graph["nodes"], graph["heads"]  # type: ignore[index]
        ok = (
            isinstance(nodes, list)
            and all(isinstance(n, dict) and isinstance(n.get("inputs"), list) for n in nodes)
            and isinstance(heads, list)
            and all(isinstance(h, list) and 0 <= h[0] < len(nodes) for h in heads)
        )
        if ok:  # its variables take their attributes from the graph being tidied
            for node in nodes:
                if node["op"] == "null":
                    node.pop("attrs", None)
                    if attrs[node["name"]]:
                        node["attrs"] = attrs[node["name"]]
    except Exception:  # noqa: BLE001 - an entry that does not read back is a miss
        return None
    return graph if ok else None


def keep(text: str, rules: Sequence[str], graph: dict[str, Any]) -> None:
    """Save ``graph``, what the rules named ``rules`` made of the graph written ``text``."""
    key = _key(text, rules)
    if key is not None:
        verdict_files.save(key, {"graph": graph})


def _key(text: str, rules: Sequence[str]) -> str | None:
    if verdict_files.folder() is None:
        return None
    source = code_hash.customop_source()  # (the rules are customop's code)
    if source is None:
        return None
    # (variables' initializers compute nothing in the graph: Gluon names a Constant's by its
    # id, another in each process; a graph read back takes the variables' attributes anew)
    text = symbol_json.without_initializers(text)
    return json.dumps(["tidied graph", text, list(rules), source, verdict_files.VERSIONS])
