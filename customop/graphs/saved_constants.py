"""Values of the constant parts of graphs kept on disk: a later process computes none again.

Tidying a spliced graph (:mod:`customop.graphs.tidy`) evaluates the parts of it that read
only constants the graph makes itself (a check of ``sigma`` written ``F.full((1,), 3.0)``),
each by running it once in MXNet (a ``CachedOp``, a few milliseconds).  Such a value is
decided by the part's text (its nodes' names aside) and the versions of MXNet, NumPy and
Python alone, so it is kept in :mod:`customop.graphs.verdict_files` under that key, as bytes
with its dtype and shape (read back bit for bit), and a later process reads it instead.

Example:
    >>> import os, tempfile
    >>> from customop.graphs import saved_constants
    >>> before = os.environ.get("CUSTOMOP_VERDICT_CACHE")
    >>> os.environ["CUSTOMOP_VERDICT_CACHE"] = tempfile.mkdtemp()
    >>> part = {"nodes": [{"op": "_full", "name": "c", "inputs": [],
    ...                    "attrs": {"shape": "(2,)", "value": "3.0"}}], "heads": [[0, 0, 0]]}
    >>> saved_constants.value_of(part), saved_constants.value_of(part)  # run, then read
    (array([3., 3.], dtype=float32), array([3., 3.], dtype=float32))
    >>> _ = os.environ.pop("CUSTOMOP_VERDICT_CACHE")
    >>> os.environ.update({} if before is None else {"CUSTOMOP_VERDICT_CACHE": before})
"""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np

from .. import symbol_json
from . import verdict_files


def value_of(part: dict[str, Any]) -> np.ndarray:
    """The value of ``part``'s one head, a graph without variables: read from the verdict
    files when an earlier process computed it, else run once on the CPU (and saved)."""
    key = _key(part)
    if key is not None:
        found = _array(verdict_files.load(key))
        if found is not None:
            return found
    value = symbol_json.run(part, {})[0]
    if key is not None and value.dtype.kind in "biuf" and value.dtype.fields is None:
        data = base64.b64encode(np.ascontiguousarray(value).tobytes()).decode("ascii")
        verdict_files.save(key, {"value": [value.dtype.str, list(value.shape), data]})
    return value


def _key(part: dict[str, Any]) -> str | None:
    if verdict_files.folder() is None:
        return None
    # (nodes' names change nothing computed: a block's prefix numbers its instances)
    nodes = [dict(node, name="") for node in part["nodes"]]
    return json.dumps(
        ["constant value", nodes, part["heads"], verdict_files.VERSIONS], sort_keys=True
    )


def _array(saved: dict[str, Any] | None) -> np.ndarray | None:
    # the saved value, or None (no entry, or one that does not read back)
    try:
        dtype, shape, data = saved["value"]  # type: ignore[index]
        dtype = np.dtype(dtype)
        if dtype.kind not in "biuf" or dtype.fields is not None:
            return None
        return np.frombuffer(base64.b64decode(data), dtype=dtype).reshape(shape).copy()
    except Exception:  # noqa: BLE001 - an entry that does not read back is a miss
        return None
