"""Which signatures a graph checked at one signature serves: its shape family.

A graph is verified at its own input shapes and again with each of its sizes ``generic``
grown (:func:`customop.graphs.verify.generality`), so it holds wherever the shapes differ
from its own in those sizes alone, each size taking one other value (not 0 or 1) on every
axis that had it: a rebind at another batch size or box count, a bucket.  Native graphs
(:mod:`customop.graphs.graph_verdicts`) and saved ports (:mod:`customop.port.portfile`)
apply the same rule.  Imports nothing: a saved port loads where MXNet is not installed.
"""

from __future__ import annotations

from collections.abc import Sequence


def serves(saved: Sequence[Sequence[int]], generic: Sequence[int], shapes: Sequence) -> bool:
    """Whether a graph checked at the shapes ``saved``, with the sizes ``generic`` grown,
    holds at ``shapes``.

    Example:
        >>> serves([(2, 7, 4)], (2, 7), [(3, 9, 4)])
        True
        >>> serves([(2, 7, 4)], (2, 7), [(3, 9, 5)])  # 4 is not a size that may change
        False
    """
    if len(saved) != len(shapes):
        return False
    allowed = set(generic)
    new: dict[int, int] = {}
    for s, t in zip(saved, shapes):
        if len(s) != len(t):
            return False
        for d, e in zip(s, t):
            if d not in allowed or d < 2:
                if e != d:
                    return False
            elif new.setdefault(d, e) != e or e < 2:
                return False
    return True
