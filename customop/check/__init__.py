"""Gradient checking through MXNet itself: :func:`check_grad` and ``python -m customop.check``.

``report`` holds what a check found, ``numeric`` the three gradients it
compares, ``grad`` the check itself and ``cli`` the command line.
"""

from .gradcheck import check_grad
from .report import (
    ARGNUM_SKIP,
    COMPARISONS,
    GRAPH_COMPARISON,
    INTEGER_SKIP,
    NO_GRAD_SKIP,
    TOLERANCES,
    GradReport,
    GradRow,
    Tolerance,
)

__all__ = [
    "check_grad",
    "GradReport",
    "GradRow",
    "Tolerance",
    "TOLERANCES",
    "COMPARISONS",
    "GRAPH_COMPARISON",
    "INTEGER_SKIP",
    "ARGNUM_SKIP",
    "NO_GRAD_SKIP",
    "main",
]


def main(argv=None) -> int:
    """The command line (``python -m customop.check``); see :mod:`customop.check.cli`."""
    from .cli import main as cli_main

    return cli_main(argv)
