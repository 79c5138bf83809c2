"""Printing a benchmark table, as plain aligned text or as Markdown (shared by the scripts)."""

from __future__ import annotations


def print_table(
    header: list[str], rows: list[list[str]], markdown: bool, align: str | None = None
) -> None:
    """``align``: one Markdown alignment cell per column (e.g. ``'---:'``); default left."""
    if markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "|".join(align.split("|")) + "|" if align else "|" + "---|" * len(header))
        for r in rows:
            print("| " + " | ".join(str(x) for x in r) + " |")
        return
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    for r in [header, *rows]:
        print("  ".join(str(x).ljust(w) for x, w in zip(r, widths)))
