"""An environment variable asked on the hot path (each call, bind or new signature).

``os.environ.get`` encodes the key and decodes the value at each call, which shows in a
training loop (BENCHMARKS.md).  :class:`Setting` reads the same mapping's own entry
instead, and parses the value again only when that entry is another object (the variable
was set).

Example:
    >>> import os
    >>> from customop.setting import Setting
    >>> workers = Setting("CUSTOMOP_EXAMPLE_WORKERS", lambda text: int(text or 1))
    >>> workers.value()
    1
    >>> os.environ["CUSTOMOP_EXAMPLE_WORKERS"] = "4"
    >>> workers.value()
    4
    >>> del os.environ["CUSTOMOP_EXAMPLE_WORKERS"]
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

# CPython's mapping of encoded entries: up to 6 us a read less than os.environ.get inside a
# training loop (measured)
_ENVIRON = getattr(os.environ, "_data", None)


class Setting:
    """The variable ``name``: :meth:`raw` its entry as it stands, :meth:`value` what
    ``parse(text or None)`` made of it (a parse that raises is asked again next time)."""

    __slots__ = ("name", "_key", "_parse", "_last")

    def __init__(self, name: str, parse: Callable[[str | None], Any]):
        self.name = name
        self._key = os.environ.encodekey(name) if _ENVIRON is not None else None
        self._parse = parse
        self._last: tuple[Any, Any] | None = None  # (the raw entry, what it parsed to)

    def raw(self) -> Any:
        """The entry itself (an encoded value, or None): the same object while unchanged."""
        if _ENVIRON is None:  # pragma: no cover - a Python whose os.environ has no _data
            return os.environ.get(self.name)
        return _ENVIRON.get(self._key)

    def value(self) -> Any:
        raw = self.raw()
        last = self._last
        if last is not None and last[0] is raw:
            return last[1]
        text = os.environ.decodevalue(raw) if _ENVIRON is not None and raw is not None else raw
        found = self._parse(text)
        self._last = (raw, found)
        return found
