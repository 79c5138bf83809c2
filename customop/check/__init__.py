"""Gradient checking through MXNet itself: :func:`check_grad` and ``python -m customop.check``.

``report`` holds what a check found, ``numeric`` the three gradients it
compares, ``gradcheck`` the check itself and ``cli`` the command line.
"""

from . import report
from .gradcheck import check_grad
from .report import *  # noqa: F403 (report.__all__: what a check found)

__all__ = ["check_grad", *report.__all__, "main"]


def main(argv=None) -> int:
    """The command line (``python -m customop.check``); see :mod:`customop.check.cli`."""
    from .cli import main as cli_main

    return cli_main(argv)
