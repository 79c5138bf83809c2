"""A thread of customop's own, one per process, that runs a function and waits for it.

Shape inference runs a forward on placeholders (:mod:`customop.inference`) and native graphs
trace forwards (:mod:`customop.graphs.trace`) on such a thread, so that the caller's thread
state (its autograd recording, MXNet's per-thread random generators) stays as it was.
Threads do not survive ``fork()``: a child made after the parent used its thread would wait
forever on it, so each process makes its own on first use.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any


class SideThread:
    """A named thread, made on first use in each process; :meth:`run` calls a function on it.

    Example:
        >>> from customop.side_thread import SideThread
        >>> import threading
        >>> SideThread("customop-example").run(lambda: threading.current_thread().name)[:16]
        'customop-example'
    """

    def __init__(self, name: str):
        self.name = name
        self._lock = threading.Lock()
        self._pool: Any = None  # a ThreadPoolExecutor of one thread
        self._pid = 0

    def is_current(self) -> bool:
        """Whether the calling thread is this one (or a thread named as it)."""
        return threading.current_thread().name.startswith(self.name)

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on this thread, waited for; called directly when already on it."""
        if self.is_current():
            return fn(*args)
        with self._lock:
            if self._pool is None or self._pid != os.getpid():
                # imported here: on Python 3.8 importing concurrent.futures registers an
                # atexit hook
                from concurrent.futures import ThreadPoolExecutor

                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.name)
                self._pid = os.getpid()
        return self._pool.submit(fn, *args).result()
