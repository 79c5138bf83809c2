"""The ``isAlive`` patch: ``Thread.isAlive`` for MXNet's ``tools/launch.py``.

Off-switch: ``CUSTOMOP_RUNTIME_OFF=isAlive``; installed by ``python -m
customop.distributed.launch --launcher ssh|mpi|...``.

``threading.Thread.isAlive = is_alive`` for MXNet's ``tools/launch.py``,
which calls the method removed in Python 3.9.
"""

from __future__ import annotations

import threading


def install() -> None:
    """For MXNet's ``tools/launch.py`` (dmlc_tracker) on Python >= 3.9."""
    if not hasattr(threading.Thread, "isAlive"):
        threading.Thread.isAlive = threading.Thread.is_alive
