"""glibc's heap statistics (``mallinfo2()``, glibc 2.33+) for the memory benchmarks: the
heap in use (``uordblks``), live mmapped allocations (``hblkhd``) and the free heap glibc
keeps (``fordblks``), next to ``VmRSS``."""

from __future__ import annotations

import ctypes
from typing import Any


class MallInfo2(ctypes.Structure):
    _fields_ = [
        (n, ctypes.c_size_t)
        for n in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def glibc() -> Any:
    """glibc with ``mallinfo2`` returning :class:`MallInfo2` (raises OSError or
    AttributeError where it is not glibc 2.33+)."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    return libc
