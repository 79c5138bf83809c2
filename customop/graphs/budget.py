"""The one place that bounds what customop keeps per input signature, by memory.

Every new input signature of an op leaves entries behind: a plan of the imperative path
(:mod:`customop.graphs.imperative`) and a verdict of :func:`customop.graphs.native.native_graph`
(its graph, or why there is none).  Shapes of one family share one graph, so most entries
are small, but a verdict that ran a trace keeps what the trace left in MXNet: measured
59 KiB of resident memory a signature for an op whose graph is refused (``BENCHMARKS.md``,
*Resident memory of training loops*), against 1.3 KiB of Python for a plan and a verdict a
family graph answered.  The tables are :class:`Table`\\ s that share one budget,
``CUSTOMOP_CACHE_MB`` (default :data:`DEFAULT_MB`), least recently used out first.  An
evicted signature is planned (or traced) again when it comes back, with the same result.

Example:
    >>> import os
    >>> from customop.graphs import budget
    >>> budget.limit() == int(float(os.environ.get("CUSTOMOP_CACHE_MB", budget.DEFAULT_MB))
    ...                       * 2 ** 20)
    True
"""
from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import Any

ENV = "CUSTOMOP_CACHE_MB"
DEFAULT_MB = 256
TRACED = 64 * 1024  # an entry whose making ran a trace (59 KiB resident measured)
RECALLED = 2 * 1024  # a plan, or a verdict a family's graph answered (1.3 KiB measured)

_lock = threading.Lock()
_total = [0]  # the estimated bytes every Table holds together


def limit() -> int:
    """The budget in bytes: ``CUSTOMOP_CACHE_MB`` (read at each new entry), or
    :data:`DEFAULT_MB`."""
    text = os.environ.get(ENV)
    try:
        mb = float(text) if text else DEFAULT_MB
    except ValueError:
        raise ValueError(f"customop: {ENV}={text!r} is not a number of MiB (default "
                         f"{DEFAULT_MB})") from None
    return max(int(mb * 2 ** 20), 0)


def total() -> int:
    """The estimated bytes the tables hold now."""
    return _total[0]


class Table(OrderedDict):
    """A least-recently-used table whose entries count against the shared budget."""

    def __init__(self) -> None:
        super().__init__()
        self.costs: dict[Any, int] = {}

    def keep(self, key: Any, value: Any, cost: int) -> None:
        """Enter ``value`` (its estimated ``cost`` in bytes) as the most recent; then let
        this table's oldest entries go while the tables together exceed the budget (the
        newest entry stays)."""
        budget = limit()
        with _lock:
            _total[0] += cost - self.costs.get(key, 0)
            self.costs[key] = cost
            self[key] = value
            self.move_to_end(key)
            while _total[0] > budget and len(self) > 1:
                old, _ = self.popitem(last=False)
                _total[0] -= self.costs.pop(old, 0)

    def clear(self) -> None:
        with _lock:
            _total[0] -= sum(self.costs.values())
            self.costs.clear()
            super().clear()
