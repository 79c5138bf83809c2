"""Verdicts kept on disk between processes: a graph checked once is not checked again.

A fresh process that traces an operator records it once; when a file here holds the
verdict of the same recording (the same graph, free values and inputs) of the same code
(:mod:`customop.graphs.code_hash`) under the same customop, MXNet, NumPy and Python,
:func:`customop.graphs.verify.verified` takes that verdict instead of running the checks
again.  As JAX's persistent compilation cache and inductor's FX graph cache do, the key is
what would run, so an entry is never stale: any change is another key, and the old file
ages out.

The folder: ``CUSTOMOP_VERDICT_CACHE`` (empty: no files are read or written), else
``$XDG_CACHE_HOME/customop/verdicts``, else ``~/.cache/customop/verdicts``.  It is made
``0700`` and used only when it belongs to the user and nobody else may write to it; each
entry is a JSON file of a few hundred bytes, written ``0600`` to a temporary name and
renamed (readers see a whole file or none, with writers in other processes, threads or
forked children).  An entry holds data only, never code.  One that cannot be read or
does not parse is a miss, never an error.  Past :data:`MAX_FILES` entries the least
recently used go.

Example:
    >>> import os, tempfile
    >>> from customop.graphs import verdict_files
    >>> before = os.environ.get("CUSTOMOP_VERDICT_CACHE")
    >>> os.environ["CUSTOMOP_VERDICT_CACHE"] = tempfile.mkdtemp()
    >>> verdict_files.save("some key", {"generic": [3]})
    >>> verdict_files.load("some key")
    {'generic': [3]}
    >>> verdict_files.load("another key") is None
    True
    >>> os.environ["CUSTOMOP_VERDICT_CACHE"] = ""  # off
    >>> verdict_files.load("some key") is None
    True
    >>> _ = os.environ.pop("CUSTOMOP_VERDICT_CACHE")
    >>> os.environ.update({} if before is None else {"CUSTOMOP_VERDICT_CACHE": before})
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import sys
import tempfile
import time
from typing import Any

import mxnet as mx
import numpy as np

ENV = "CUSTOMOP_VERDICT_CACHE"
FORMAT = 1  # of an entry's JSON; another format is another key
MAX_FILES = 2000
# what decides a verdict besides customop's code, in every key (a list in its JSON)
VERSIONS = (mx.__version__, np.__version__, sys.version)
_STALE_TEMP_S = 3600  # a temporary file older than this was left by a writer that died
_ENTRY = re.compile(r"[0-9a-f]{64}\.json\Z")
_TEMP = re.compile(r"\.tmp-[A-Za-z0-9_]+\.json\Z")  # tempfile.mkstemp's names


def folder() -> str | None:
    """The folder entries live in, made if missing; None when the cache is off or the folder
    is not the user's alone."""
    path = os.environ.get(ENV)
    if path is None:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        path = os.path.join(base, "customop", "verdicts")
    if not path:
        return None
    try:  # (a stat first: makedirs of a folder that exists raises inside, 10-90 us a call)
        info = os.stat(path)
    except OSError:
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
            info = os.stat(path)
        except OSError:
            return None
    mine = not hasattr(os, "getuid") or info.st_uid == os.getuid()
    if not stat.S_ISDIR(info.st_mode) or not mine or info.st_mode & 0o022:
        return None
    return path


def _file(where: str, key: str) -> tuple[str, str]:
    digest = hashlib.sha256(f"{FORMAT}\n{key}".encode("utf-8", "backslashreplace")).hexdigest()
    return os.path.join(where, digest + ".json"), digest


def load(key: str) -> dict[str, Any] | None:
    """The outcome saved under ``key``, or None (no entry, off, or unreadable)."""
    where = folder()
    if where is None:
        return None
    path, digest = _file(where, key)
    try:  # (non-blocking: a FIFO of that name opens at once, and is no entry)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        with os.fdopen(fd, encoding="utf-8") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return None
            entry = json.load(f)
    except Exception:  # noqa: BLE001 - any entry that does not read (deep nesting too) is a miss
        return None
    try:
        os.utime(path)  # recently used
    except OSError:  # (a read-only folder: still a hit)
        pass
    if not isinstance(entry, dict) or entry.get("key") != digest:
        return None
    outcome = entry.get("outcome")
    return outcome if isinstance(outcome, dict) else None


def save(key: str, outcome: dict[str, Any]) -> None:
    """Keep ``outcome`` (JSON data) under ``key``; a failure to write is ignored."""
    where = folder()
    if where is None:
        return
    path, digest = _file(where, key)
    try:
        text = json.dumps({"format": FORMAT, "key": digest, "outcome": outcome}, allow_nan=False)
    except (TypeError, ValueError):  # not JSON data: not saved
        return
    try:
        fd, temp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=where)  # 0600
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(temp, path)
        except BaseException:
            os.unlink(temp)
            raise
        _bound(where)
    except OSError:
        pass


# Per folder, the entries this process counted at its last listing plus the files it wrote
# there since.  The folder is listed at a process's first save in it and again once that
# count passes MAX_FILES (another process's new entries count at the next listing): a listing
# of a folder near the bound cost more than the write it follows (measured: docs/design.md).
_counted: dict[str, int] = {}


def _bound(where: str) -> None:
    """Keep at most :data:`MAX_FILES` entries: the least recently used go first."""
    counted = _counted.get(where)
    if counted is not None and counted < MAX_FILES:
        _counted[where] = counted + 1
        return
    with os.scandir(where) as found:  # (only names this module writes: the folder may hold others)
        entries = [e for e in found if _ENTRY.match(e.name) or _TEMP.match(e.name)]
    _counted[where] = sum(1 for e in entries if _ENTRY.match(e.name))
    if len(entries) <= MAX_FILES and not any(e.name.startswith(".tmp-") for e in entries):
        return
    now = time.time()
    kept = []
    for e in entries:
        try:
            when = e.stat().st_mtime
        except OSError:
            continue
        if _TEMP.match(e.name):
            if now - when > _STALE_TEMP_S:
                _remove(e.path)
        else:
            kept.append((when, e.path))
    kept.sort()
    gone = max(0, len(kept) - MAX_FILES * 3 // 4) if len(kept) > MAX_FILES else 0
    for _, path in kept[:gone]:
        _remove(path)
    _counted[where] = len(kept) - gone


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
