"""The ``randomness`` patch: a forward run on placeholders draws from generators of its own.

Off-switch: ``CUSTOMOP_RUNTIME_OFF=randomness``; in place only while a ``'numpy'``-mode
forward runs on placeholder inputs (shape inference, :mod:`customop.inference`), for that
thread.

Shape inference runs the forward once per signature.  A forward that draws random numbers
(a sampler, dropout by hand) would move the process's global NumPy and Python streams, and
a seeded run would then give other numbers than an imperative one.  Putting the streams
back afterwards (as customop did) rolled back every draw another thread made meanwhile: a
data-loading thread's augmentations repeated (measured: docs/design.md).  Instead, for the
length of the run, the module functions of ``numpy.random`` (``np.random.normal``, ...) and
of ``random`` (``random.random``, ...) that draw from the global generators are wrappers:
the thread running placeholders draws from a private ``RandomState(0)`` / ``Random(0)``,
every other thread from the global generators, as before.  The originals are back when the
last such run ends.  A name bound before (``from numpy.random import normal``) still reaches
the global generator.
"""

from __future__ import annotations

import contextlib
import functools
import random
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from .. import runtime

_lock = threading.Lock()
_private: dict[int, tuple[Any, Any]] = {}  # thread id -> (its RandomState, its Random)
_saved: dict[tuple[Any, str], Any] = {}  # (module, name) -> the original function


def _globals(module: Any, generator: Any) -> list[str]:
    """The names of ``module`` whose functions are methods of its global ``generator``."""
    return [
        name
        for name in dir(module)
        if not name.startswith("_")
        and getattr(getattr(module, name), "__self__", None) is generator
    ]


def _wrapper(original: Any, name: str, which: int) -> Any:
    @functools.wraps(original)  # (also sets __wrapped__, which _swap_out checks)
    def draw(*args: Any, **kwargs: Any) -> Any:
        private = _private.get(threading.get_ident()) if _private else None
        if private is None:
            return original(*args, **kwargs)
        return getattr(private[which], name)(*args, **kwargs)

    return draw


def _swap_in() -> None:
    for which, (module, generator) in enumerate(
        ((np.random, np.random.mtrand._rand), (random, random._inst))
    ):
        for name in _globals(module, generator):
            original = _saved[module, name] = getattr(module, name)
            setattr(module, name, _wrapper(original, name, which))


def _swap_out() -> None:
    for (module, name), original in _saved.items():
        if getattr(getattr(module, name), "__wrapped__", None) is original:
            setattr(module, name, original)  # (a function the user put there stays)
    _saved.clear()


@contextlib.contextmanager
def placeholder_draws() -> Iterator[None]:
    """Within the block, this thread's ``np.random.*`` and ``random.*`` calls draw from
    private generators; other threads draw from the global ones, untouched.  Switched off,
    the block changes nothing."""
    if runtime.disabled("randomness"):
        yield
        return
    me = threading.get_ident()
    with _lock:
        nested = me in _private
        if not nested:
            if not _private:
                _swap_in()
            _private[me] = (np.random.RandomState(0), random.Random(0))
    try:
        yield
    finally:
        if not nested:
            with _lock:
                del _private[me]
                if not _private:
                    _swap_out()
