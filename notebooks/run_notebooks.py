"""Execute the tour notebooks top to bottom (what ``make notebooks`` and the tests run).

    .venv/bin/python notebooks/run_notebooks.py              # re-execute all, save outputs
    .venv/bin/python notebooks/run_notebooks.py 01_quickstart.ipynb --no-save

A cell that raises stops the run with the cell's traceback and exit status 1.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

HERE = Path(__file__).resolve().parent
CELL_TIMEOUT_S = 240


def notebooks() -> list[Path]:
    return sorted(HERE.glob("[0-9][0-9]_*.ipynb"))


def execute(path: Path, save: bool) -> nbformat.NotebookNode:
    """Run every cell of ``path`` in a fresh kernel; write the outputs back when ``save``."""
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(HERE)}},
    )
    client.execute()
    if save:
        nbformat.write(nb, path)
    return nb


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*", help="notebook file names (default: all)")
    p.add_argument("--no-save", action="store_true", help="do not write outputs back")
    args = p.parse_args(argv)
    paths = [HERE / n for n in args.names] or notebooks()
    for path in paths:
        print(f"executing {path.name} ...", flush=True)
        try:
            execute(path, save=not args.no_save)
        except CellExecutionError as exc:
            print(exc, file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
