"""The one place that bounds what customop keeps per input signature, by memory.

Every new input signature of an op leaves entries behind: a plan of the imperative path
and the ``CachedOp`` objects of its graph (:mod:`customop.graphs.imperative`), a verdict of
:func:`customop.graphs.graph_verdicts.native_graph` (its graph, or why there is none) and its shape
family's graphs, a spliced model graph per bind (:mod:`customop.graphs.binding`), and the
output shapes and dtypes found by running the forward on placeholders
(:mod:`customop.inference`).
Shapes of one family share one graph, so most entries are small, but a verdict that ran a
trace keeps what the trace left in MXNet: measured 59 KiB of resident memory a signature
for an op whose graph is refused (``BENCHMARKS.md``, *Resident memory of training loops*),
against 1.3 KiB of Python for a plan and a verdict a family graph answered.  Every such
table is a :class:`Table`; they share one budget, least recently used out first: the
default :data:`DEFAULT_MB` MiB, ``CUSTOMOP_CACHE_MB`` in the environment, or
:func:`cache_budget` at run time.  An evicted signature is planned (or traced) again when
it comes back, with the same result.  What stays bounded by count is keyed by operator or
closure, not by signature (:mod:`customop.gradients`' 1,024 keyword lookups, a few hundred
bytes each; the C callback tables of :mod:`customop.runtime.callbacks`, one per closure).

Example:
    >>> import os
    >>> from customop import budget
    >>> budget.limit() == int(float(os.environ.get("CUSTOMOP_CACHE_MB", budget.DEFAULT_MB))
    ...                       * 2 ** 20)
    True
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from .setting import Setting

ENV = "CUSTOMOP_CACHE_MB"
DEFAULT_MB = 256
TRACED = 64 * 1024  # an entry whose making ran a trace (59 KiB resident measured)
RECALLED = 2 * 1024  # a plan, or a verdict a family's graph answered (1.3 KiB measured)

_lock = threading.RLock()
_total = [0]  # the estimated bytes every Table holds together
_set: list[float | None] = [None]  # MiB given to cache_budget (None: the environment's)
# every live Table, for cache_budget's evictions: each leaves as it dies (its weak
# reference's callback), so an op defined again and again leaves nothing behind here
_tables: dict[int, weakref.ref] = {}


def _budget_bytes(text: str | None) -> int:
    try:
        mb = float(text) if text else DEFAULT_MB
    except ValueError:
        raise ValueError(
            f"customop: {ENV}={text!r} is not a number of MiB (default {DEFAULT_MB})"
        ) from None
    return max(int(mb * 2**20), 0)


_setting = Setting(ENV, _budget_bytes)  # read at each new entry (a dozen a new signature)


def limit() -> int:
    """The budget in bytes: what :func:`cache_budget` set, else ``CUSTOMOP_CACHE_MB`` (read
    at each new entry), else :data:`DEFAULT_MB`."""
    if _set[0] is not None:
        return int(_set[0] * 2**20)
    return _setting.value()


def total() -> int:
    """The estimated bytes the tables hold now."""
    return _total[0]


def cache_budget(mb: float | None = None, *, reset: bool = False) -> float:
    """Set the memory customop may keep per input signature, in MiB; return the budget.

    Every table of per-signature state (plans, graph verdicts, shape families' graphs and
    their ``CachedOp`` objects, spliced model graphs, inferred output shapes) shares this
    budget, least recently used
    out first.  Without arguments, returns the budget in force: the last one set here, else
    ``CUSTOMOP_CACHE_MB``, else 256 MiB.  A lower budget lets the oldest entries go at once
    (what they held is freed once nothing else uses it; a signature that comes back is
    planned again, with the same result); ``0`` keeps only each table's newest entry.
    ``reset=True`` goes back to ``CUSTOMOP_CACHE_MB`` or the default.

    Example:
        >>> import customop
        >>> before = customop.cache_budget()
        >>> customop.cache_budget(64)
        64.0
        >>> customop.cache_budget(reset=True) == before
        True
    """
    if reset:
        _set[0] = None
    if mb is not None:
        try:
            value = float(mb)
        except (TypeError, ValueError):
            value = float("nan")
        if not value >= 0 or value == float("inf"):
            raise ValueError(
                f"customop.cache_budget: mb must be a finite number of MiB >= 0, got {mb!r}"
            )
        _set[0] = value
    budget = limit()
    with _lock:
        for ref in list(_tables.values()):  # (a copy: a table may die meanwhile)
            table = ref()
            if table is not None:
                table._shrink(budget)
    return budget / 2**20


def _release(costs: dict) -> None:
    with _lock:
        _total[0] -= sum(costs.values())
        costs.clear()


class Table(OrderedDict):
    """A least-recently-used table whose entries count against the shared budget.

    ``released``: called with each value the table lets go (evicted or cleared), to free
    what the value holds that the table does not (it runs under the budget's lock: it
    takes no other lock)."""

    def __init__(self, released: Callable[[Any], None] | None = None) -> None:
        super().__init__()
        self.costs: dict[Any, int] = {}
        self.released = released
        key = id(self)  # (not reused before the callback: it runs before the table is freed)
        _tables[key] = weakref.ref(self, lambda _, key=key, tables=_tables: tables.pop(key, None))

    def __del__(self) -> None:  # a table dropped gives its share back (weakref.finalize
        try:  # would register an atexit hook: importing changes nothing)
            _release(self.costs)
        except (AttributeError, TypeError):  # pragma: no cover - interpreter shutdown
            pass

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
            self._shrink(budget)

    def _shrink(self, budget: int) -> None:
        # (under _lock) the oldest entries out while the tables exceed the budget
        while _total[0] > budget and len(self) > 1:
            old, value = self.popitem(last=False)
            _total[0] -= self.costs.pop(old, 0)
            if self.released is not None:
                self.released(value)

    def recall(self, key: Any) -> Any:
        """The value of ``key`` made the most recent, or None when the table has none."""
        found = self.get(key)
        if found is not None:
            try:
                self.move_to_end(key)
            except KeyError:  # another thread let it go meanwhile
                pass
        return found

    def clear(self) -> None:
        with _lock:
            _total[0] -= sum(self.costs.values())
            self.costs.clear()
            values = list(self.values()) if self.released is not None else ()
            super().clear()
            for value in values:
                self.released(value)
