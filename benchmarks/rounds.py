"""Rounds of fresh processes: the one loop that measures a benchmark's rows (shared by the scripts).

Each row is a setup measured in a fresh Python process, so that what one row imports or
patches cannot reach another; the rows alternate within each round, so a drift of the
machine's load acts on every row alike, and the scripts take medians over the rounds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]


def fresh_rounds(
    setups: list[tuple[str, str, dict]], rounds: int, program: Callable[[str], str]
) -> dict[str, list[Any]]:
    """``{name: [one result per round]}`` for rows ``(name, setup, env)``: each round runs
    ``program(setup)`` of every row in a fresh ``python -c`` at the repository root, with
    ``env`` added to the environment; a result is the process's last line of output, as JSON.
    """
    results: dict[str, list[Any]] = {name: [] for name, _, _ in setups}
    for _ in range(rounds):
        for name, setup, env in setups:
            results[name].append(_fresh(program(setup), env))
    return results


def _fresh(code: str, env: dict) -> Any:
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
    )
    if done.returncode:  # the child's own traceback, not CalledProcessError's code
        raise SystemExit(f"a fresh process failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
