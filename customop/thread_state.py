"""Per-thread settings set for the length of a block, and put back after it.

The one way customop keeps a setting for the calls a thread makes inside a block: the path
:func:`customop.dispatch.forced_path` pins, the op a value check names and the conditions
it collects (:mod:`customop.value_checks`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def swapped(state: threading.local, **values: Any) -> Iterator[None]:
    """Within the block, ``state``'s attributes are ``values`` on this thread; the values
    they had (None where unset) come back after it, however it ends.

    Example:
        >>> import threading
        >>> from customop.thread_state import swapped
        >>> settings = threading.local()
        >>> with swapped(settings, path="custom"):
        ...     settings.path
        'custom'
        >>> print(settings.path)
        None
    """
    outer = {name: getattr(state, name, None) for name in values}
    for name, value in values.items():
        setattr(state, name, value)
    try:
        yield
    finally:
        for name, value in outer.items():
            setattr(state, name, value)
