"""Checks on values inside a forward: an exception where it runs in Python, NaN in a native graph.

:func:`require` is the one way an operator checks its input *values* (labels in
range, a positive scale, indices inside an array).  Where the forward runs in
Python (imperative calls, ``Custom`` nodes, ``'numpy'`` mode) a failed check
raises a ``ValueError`` naming the operator and the argument.  While a forward is
recorded into a native graph (:mod:`customop.graphs.trace`), nothing can raise: the
condition is collected instead (:func:`collecting`) and :func:`poisoned` makes
the forward's floating outputs NaN when it fails, with MXNet operators that run
on the device (no read back to the host).  The model is JAX's ``checkify``: the
check becomes a value that flows through compiled code.

Any code that traces a function (a forward, a gradient closure) opens
:func:`collecting` around it and applies :func:`poisoned` to what it returns.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import shown
from .thread_state import swapped

_state = threading.local()  # .conditions: list | None (collecting); .op: the op running now


@dataclass
class Condition:
    """One collected check: ``ok`` (an NDArray, every element must be non-zero) and its text."""

    ok: Any
    arg: str
    message: str


def require(cond: Any, arg: str, message: str) -> None:
    """Check that every element of ``cond`` holds; name ``arg`` and say ``message`` if not.

    ``cond`` is what must hold: an ``mx.nd.NDArray`` of 0/1 values (a comparison
    such as ``label < num_class``), a NumPy array or a bool.  Where the forward
    runs in Python, a failure raises ``ValueError("customop '<op>': <arg>
    <message>")`` (an NDArray condition costs one 1-element read back).  Inside a
    native graph (a hybridized block, a bound graph, :func:`customop.export`, and
    an imperative call from its input signature's second call on) the forward is
    traced instead: ``require`` then reads nothing back, and the op's floating
    outputs come out NaN for inputs that fail the check (integer outputs cannot
    hold NaN and stay as computed); ``customop.dispatch.forced_path('function')``
    runs imperative calls in Python, for debugging.  Checks that read values
    back to Python (``asnumpy``, ``asscalar``, ``if x.max() > ...``) keep an op out of
    native graphs; checks skipped under :func:`customop.is_tracing` keep it out
    too.  Shape and dtype checks need nothing special: plain Python ``raise``.

    Example:
        >>> import mxnet as mx
        >>> import customop
        >>> @customop.customop('mxnet', name='doc.pick_class')
        ... def pick_class(scores, label):
        ...     num_class = scores.shape[1]
        ...     customop.require((label >= 0) * (label < num_class), 'label',
        ...                      f'must be in [0, {num_class})')
        ...     return mx.nd.pick(scores, label, axis=1)
        >>> scores = mx.nd.array([[0.1, 0.8, 0.1], [0.7, 0.2, 0.1]])
        >>> pick_class(scores, mx.nd.array([1, 3]))  # a signature's first call: Python
        Traceback (most recent call last):
        ...
        ValueError: customop 'doc.pick_class': label must be in [0, 3)
        >>> pick_class(scores, mx.nd.array([1, 0])).asnumpy()
        array([0.8, 0.7], dtype=float32)
        >>> pick_class(scores, mx.nd.array([1, 3])).asnumpy()  # then its native graph
        array([nan, nan], dtype=float32)
        >>> with customop.dispatch.forced_path('function'):  # debugging: Python again
        ...     pick_class(scores, mx.nd.array([1, 3]))
        Traceback (most recent call last):
        ...
        ValueError: customop 'doc.pick_class': label must be in [0, 3)
        >>> class Net(mx.gluon.HybridBlock):
        ...     def hybrid_forward(self, F, scores, label):
        ...         return pick_class(scores, label)
        >>> net = Net()
        >>> net.hybridize()
        >>> net(scores, mx.nd.array([1, 3])).asnumpy()  # a native graph: NaN, no exception
        array([nan, nan], dtype=float32)
    """
    conditions = getattr(_state, "conditions", None)
    if conditions is not None and (_is_nd(cond) or getattr(_state, "lenient", False)):
        conditions.append(Condition(cond, arg, message))
        return
    # a Python or NumPy condition does not depend on the traced values: raise even then
    if not _holds(cond):
        raise ValueError(_text(arg, message))


def nan_unless(x: Any, cond: Any, arg: str, message: str) -> Any:
    """``x``, checked: :func:`require` ``(cond, arg, message)``, whose failure inside a native
    graph makes all of ``x`` NaN instead of the op's outputs.

    For an op where a small array (a normalizer, a scale) reaches every element of every
    floating output and of every gradient: its check then costs one multiply of that array
    in each step instead of one per output (no ``broadcast_like`` to each).  Where the
    forward runs in Python it raises as :func:`require` does and returns ``x`` unchanged.
    """
    import mxnet as mx

    if not (is_collecting() and _is_nd(cond)):
        require(cond, arg, message)
        return x
    _state.applied.append(Condition(cond, arg, message))
    nan_or_one = factor([Condition(cond, arg, message)]).astype(x.dtype, copy=False)
    return mx.nd.broadcast_mul(x, nan_or_one)


def _is_nd(cond: Any) -> bool:
    import mxnet as mx

    return isinstance(cond, mx.nd.NDArray)


def _holds(cond: Any) -> bool:
    if _is_nd(cond):
        if cond.size == 0:
            return True
        # one element read back: the data itself stays on the device
        return bool(cond.reshape((-1,)).min().asnumpy()[0] != 0)
    value = np.asarray(cond)
    return bool(value.size == 0 or np.all(value))


def _text(arg: str, message: str) -> str:
    op = getattr(_state, "op", None)
    return f"customop {shown(op)!r}: {arg} {message}" if op else f"{arg} {message}"


@contextlib.contextmanager
def running(op_type: str) -> Iterator[None]:
    """Within the block, :func:`require` failures on this thread name ``op_type``."""
    with swapped(_state, op=op_type):
        yield


@contextlib.contextmanager
def collecting(lenient: bool = False) -> Iterator[list[Condition]]:
    """Within the block, :func:`require` on this thread collects its conditions (no raise).

    Yields the list they are appended to; nested blocks collect separately.  A Python
    or NumPy condition still raises (it does not depend on the traced values), unless
    ``lenient``: then every condition is collected, e.g. while a forward runs on
    placeholder values only to find its output shapes.
    """
    found: list[Condition] = []
    with swapped(_state, conditions=found, lenient=lenient, applied=[]):
        yield found


def applied() -> list[Condition]:
    """The conditions :func:`nan_unless` applied to its array itself within this thread's
    :func:`collecting` block (not among those it yields: they poison that array only)."""
    return list(getattr(_state, "applied", None) or ())


def all_hold(conditions: Sequence[Condition]) -> bool:
    """Whether every condition holds on its values, as where the forward runs in Python
    (one element of each read back)."""
    return all(_holds(c.ok) for c in conditions)


def is_collecting() -> bool:
    """Whether :func:`require` on this thread collects rather than raises."""
    return getattr(_state, "conditions", None) is not None


def flag(conditions: Sequence[Condition]) -> Any:
    """A 1-element float32 NDArray, non-zero when every condition holds and 0 when one fails
    (None without any).  Recorded with the forward, it is part of the graph; no gradient
    flows into it."""
    import mxnet as mx

    if not conditions:
        return None
    out = None
    for c in conditions:
        # a condition holds when its least element is non-zero, as where the forward runs in
        # Python (min: one operator, each one an operator call in every step of a graph; and
        # one the ONNX converter knows) (no reshape to (-1,): MXNet would record the traced
        # length, and the graph would hold at that shape only)
        least = mx.nd.min(c.ok)
        if least.shape != (1,):
            least = least.reshape((1,))
        least = least.astype("float32", copy=False)
        out = least if out is None else mx.nd.minimum(out, least)
    return mx.nd.BlockGrad(out)


def factor(conditions: Sequence[Condition]) -> Any:
    """``flag / flag``: a 1-element NDArray, 1 when the checks hold, ``0 / 0 = NaN`` when one
    fails (None without any).  No gradient flows into it."""
    ok = flag(conditions)
    return None if ok is None else ok / ok


def poisoned(
    outputs: Sequence[Any], conditions: Sequence[Condition], nan_or_one: Any = None
) -> list[Any]:
    """``outputs`` with every floating array NaN where ``conditions`` fail, as MXNet operators.

    Each floating output is multiplied by :func:`factor` (or by ``nan_or_one``, that
    factor made already), so its gradient too: a failed check poisons the gradient
    as well.  Integer outputs are returned as they are.
    """
    import mxnet as mx

    if nan_or_one is None:
        nan_or_one = factor(conditions)
    if nan_or_one is None:
        return list(outputs)
    out = []
    for o in outputs:
        if isinstance(o, mx.nd.NDArray) and np.issubdtype(o.dtype, np.floating):
            f = nan_or_one.astype(o.dtype, copy=False)
            # spread to o's shape first: the backward of a broadcast_mul by a (1,) array
            # reduces over o for the factor (measured: docs/design.md)
            if o.ndim != 1:
                f = mx.nd.reshape(f, shape=(1,) * o.ndim)
            f = mx.nd.broadcast_like(f, o)
            o = mx.nd.elemwise_mul(o, f)
        out.append(o)
    return out
