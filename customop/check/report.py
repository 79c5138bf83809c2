"""What a gradient check found: tolerances, one row per input and comparison, the report table."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# what customop.check re-exports (its names, written once here)
__all__ = [
    "GradReport",
    "GradRow",
    "Tolerance",
    "TOLERANCES",
    "COMPARISONS",
    "GRAPH_COMPARISON",
    "INTEGER_SKIP",
    "ARGNUM_SKIP",
    "NO_GRAD_SKIP",
]


@dataclass(frozen=True)
class Tolerance:
    """Finite-difference step and the allowed error ``atol + rtol * |reference|``."""

    eps: float
    rtol: float
    atol: float


# The forward of the numeric side always runs in float64; these follow the
# precision in which MXNet computes the gradients being checked.
TOLERANCES: dict[np.dtype, Tolerance] = {
    np.dtype(np.float16): Tolerance(eps=1e-3, rtol=1e-2, atol=1e-2),
    np.dtype(np.float32): Tolerance(eps=1e-4, rtol=1e-3, atol=1e-5),
    np.dtype(np.float64): Tolerance(eps=1e-6, rtol=1e-5, atol=1e-8),
}

COMPARISONS = ("imperative vs numeric", "symbolic vs numeric", "imperative vs symbolic")
# an 'mxnet'-mode op whose imperative calls run its native graph: that graph against the
# closures (a row only for such ops)
GRAPH_COMPARISON = "graph vs imperative"
INTEGER_SKIP = "skipped: integer input, not differentiable"
ARGNUM_SKIP = "skipped: not in argnums"
NO_GRAD_SKIP = "skipped: declared no_grad (gets no gradient)"


@dataclass
class GradRow:
    """One input and one comparison (or why the input was skipped)."""

    input: str
    shape: tuple[int, ...]
    dtype: str
    comparison: str = ""
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    worst_index: tuple[int, ...] | None = None
    status: str = "ok"
    tolerance: Tolerance | None = None

    @property
    def passed(self) -> bool:
        """Whether this comparison is within tolerance (a skipped input passes)."""
        return self.status != "FAIL"

    @property
    def skipped(self) -> bool:
        """Whether the input was not checked (integer, declared no_grad, not in argnums)."""
        return self.status.startswith("skipped")


@dataclass
class GradReport:
    """What :func:`check_grad` compared; ``str(report)`` is an aligned table."""

    target: str
    heads: str
    rows: list[GradRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """Whether every comparison of every input passed."""
        return all(row.passed for row in self.rows)

    def row(self, input: str, comparison: str = "") -> GradRow:
        """The row for ``input`` (and ``comparison``; any row when empty)."""
        for r in self.rows:
            if r.input == input and (not comparison or r.comparison == comparison):
                return r
        raise KeyError((input, comparison))

    def __str__(self) -> str:
        verdict = "passed" if self.passed else "FAILED"
        lines = [f"check_grad {self.target}: {verdict} (heads: {self.heads})"]
        lines += _table(
            [
                "input",
                "shape",
                "dtype",
                "comparison",
                "max abs err",
                "max rel err",
                "worst index",
                "status",
            ],
            [_cells(r) for r in self.rows],
        )
        tols = sorted(
            {(r.dtype, r.tolerance) for r in self.rows if r.tolerance is not None},
            key=lambda dt: dt[0],
        )
        lines += [f"{dtype}: eps={t.eps:g} rtol={t.rtol:g} atol={t.atol:g}" for dtype, t in tols]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def compare(got: np.ndarray, want: np.ndarray, tol: Tolerance):
    """(max abs err, max rel err, worst index, ok); rel err is |got-want| / max(|want|, atol)."""
    if want.size == 0:
        return 0.0, 0.0, None, True
    err = np.abs(got - want)
    err = np.where(np.isnan(err), np.inf, err)
    allowed = tol.atol + tol.rtol * np.abs(want)
    rel = err / np.maximum(np.abs(want), tol.atol)
    ok = bool(np.all(err <= allowed))
    if not err.any():
        return 0.0, 0.0, None, ok
    worst = np.unravel_index(int(np.argmax(err / allowed)), want.shape)
    return float(err.max()), float(rel.max()), tuple(int(k) for k in worst), ok


def worse(a: GradRow | None, b: GradRow) -> GradRow:
    # Across head draws keep a failure over a pass, then the larger error.
    if a is None:
        return b
    return max(a, b, key=lambda r: (not r.passed, r.max_rel_err or 0.0, r.max_abs_err or 0.0))


def row(name, a, comparison, tol, got, want) -> GradRow:
    """The row comparing ``got`` with the reference ``want`` for input ``name``."""
    abs_err, rel_err, worst, ok = compare(got, want, tol)
    return GradRow(
        name,
        a.shape,
        str(a.dtype),
        comparison,
        abs_err,
        rel_err,
        worst,
        "ok" if ok else "FAIL",
        tol,
    )


def _cells(r: GradRow) -> list[str]:
    def num(v):
        return "" if v is None else f"{v:.3g}"

    return [
        r.input,
        str(r.shape),
        r.dtype,
        r.comparison,
        num(r.max_abs_err),
        num(r.max_rel_err),
        "" if r.worst_index is None else str(r.worst_index),
        r.status,
    ]


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(c) for c in col) for col in zip(header, *rows)]
    return [
        "  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in [header, *rows]
    ]
