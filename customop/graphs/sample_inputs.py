"""The input values an operator is traced and its graph checked on, made from a signature."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


def placeholders(shapes, dtypes, seed: int) -> list[np.ndarray]:
    """Input values to trace on: uniform in [0.1, 1) for floats, 0 or 1 for integers."""
    rng = np.random.RandomState(seed)
    out = []
    for shape, dtype in zip(shapes, dtypes):
        if np.issubdtype(dtype, np.floating):
            out.append(rng.uniform(0.1, 1.0, size=shape).astype(dtype))
        else:
            out.append(rng.randint(0, 2, size=shape).astype(dtype))
    return out


def perturbed(values: list[np.ndarray]) -> list[np.ndarray]:
    """Other values of the same signature: negative, zero and positive numbers."""
    out = placeholders([v.shape for v in values], [v.dtype for v in values], 2)
    for v in out:
        if np.issubdtype(v.dtype, np.floating):
            flat = v.reshape(-1)
            flat[:] = flat * 2 - 1.1
            flat[::4] = 0
    return out


GROWN_SIZES = 6  # a box count is often the fourth distinct size: (B, A, 4) and (B, G, 4)


def other_shapes(shapes) -> Iterable[tuple]:
    """Other input signatures to trace at: one size of the given shapes grown by one (up to
    :data:`GROWN_SIZES` distinct sizes, the batch first)."""
    sizes: list[int] = []
    for s in shapes:
        for axis, d in enumerate(s):
            if (d > 1 or axis == 0) and d not in sizes:
                sizes.append(d)
    batch = shapes[0][0] if shapes and shapes[0] else None
    if batch in sizes:  # the batch axis first
        sizes.remove(batch)
        sizes.insert(0, batch)
    for size in sizes[:GROWN_SIZES]:
        yield tuple(
            tuple(d + 1 if d == size and (d > 1 or axis == 0) else d for axis, d in enumerate(s))
            for s in shapes
        )


def resized(values: list[np.ndarray], shapes) -> list[np.ndarray]:
    """New placeholders at ``shapes``, of ``values``' dtypes."""
    return placeholders(shapes, [v.dtype for v in values], 3)


def grown(values, shapes) -> list[np.ndarray]:
    """``values`` resized to ``shapes`` by repeating their entries (labels stay labels)."""
    out = []
    for v, shape in zip(values, shapes):
        for axis, d in enumerate(shape):
            if v.shape[axis] != d:
                v = np.take(v, np.arange(d) % v.shape[axis], axis=axis)
        out.append(np.ascontiguousarray(v))
    return out


def shapes_text(shapes) -> str:
    return ", ".join(str(tuple(s)) for s in shapes)
