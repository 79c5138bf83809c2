"""How a failure inside an operator reaches the person who called it, naming the operator.

Three kinds of failure, one rule each:

* An exception raised by user code (a forward, a gradient closure, a shape
  function) stays the **same object**, with its type and attributes; the
  operator and the place are written into its message once (:func:`attach`),
  unless the message already names the operator.
* An ``MXNetError`` from an MXNet operator that a forward called is reported as
  a ``ValueError`` naming the operator, keeping MXNet's whole message (minus its
  C++ stack) and chaining the original (:func:`from_mxnet`).
* A failure on one of MXNet's worker threads (graph forward/backward) never goes
  through MXNet's CustomOp error slot: that slot is one per process, and the
  next CustomOp to finish takes whatever it holds, so a failure there can reach
  another op's caller, or vanish (measured).  Instead the callback succeeds and
  :func:`poison` makes the arrays it should have written fail (a ``take`` with
  ``mode='raise'`` into them), so MXNet's engine carries the failure along
  those arrays' own dependencies to whoever reads them, and to nobody else.
  The failure record travels with the call: an ``mx.nd.Custom`` call hands its
  :class:`Call` to the operator it creates (by a key in its attributes); a
  bound or recorded op carries the thread that bound or recorded it and queues
  its failure for that thread (:func:`report`).  :func:`swap_in` hands it back
  in place of MXNet's error for the poisoned arrays; :mod:`customop.runtime`
  installs that hook, lazily.
"""

from __future__ import annotations

import itertools
import re
import threading
from collections import deque
from typing import Any, NoReturn

import numpy as np

FOREIGN = object()  # a failure of a callback that is not ours: MXNet's error stands
# (or, for a hand-written CustomOp's forward/backward, a _Foreign: one error naming the op)
# (reader thread, failure, whether it poisoned arrays); FOREIGN entries have no reader
_pending: deque[tuple[int | None, BaseException | object, bool]] = deque(maxlen=32)
_lock = threading.Lock()
_raised: deque[BaseException] = deque(maxlen=64)  # what our callbacks raised, newest last
_CALLBACK_FAILURES = ("params.info->callbacks[", "callbacks[kCustom", "CustomFunctionBwdFunc")
# What MXNet says when a poisoned array (see poison) is read.
POISON_TEXT = "take operator contains indices out of bound"


def shown(op_type: str) -> str:
    """The operator as its user knows it: ``op_type`` without a ``~variant`` suffix.

    A call that leaves optional inputs out runs the variant registered as
    ``'<op_type>~without_<input>'``; the user called ``'<op_type>'``, so every
    message names that.  (``.numpy`` stays: the user called the twin.)
    """
    return op_type.split("~", 1)[0]


def op_error(op_type: str, cls: type, msg: str) -> BaseException:
    """A new exception of ``cls`` whose message starts by naming the operator."""
    return cls(f"customop {shown(op_type)!r}: {msg}")


def _base(op_type: str) -> str:
    # An op's own checks name it by its base op_type (without ~variant or .numpy/.mxnet).
    base = shown(op_type)
    for suffix in (".numpy", ".mxnet"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
    return base


def names_op(text: str, op_type: str) -> bool:
    return _base(op_type) in text


def is_own_check(exc: BaseException, op_type: str) -> bool:
    """Whether ``exc`` is a check the operator (or this package) failed on purpose, which
    says what is wrong (``customop '<op>': ...``), rather than a failure named by its place
    (``customop '<op>' (<where>): ...``)."""
    text = str(exc)
    return any(text.startswith(f"customop {name!r}: ") for name in (_base(op_type), shown(op_type)))


def attach(exc: BaseException, op_type: str, where: str) -> BaseException:
    """Write ``customop '<op_type>' (<where>)`` into ``exc``'s message, once; return ``exc``.

    The exception keeps its identity, type and attributes.  Its first argument
    is prefixed when it is the message (a ``KeyError``'s key only before Python
    3.11); otherwise the text is added as a note (Python 3.11+) or, for a plain
    exception, as the message.
    """
    if names_op(str(exc), op_type):
        return exc
    prefix = f"customop {shown(op_type)!r} ({where})"
    args = exc.args
    if isinstance(exc, KeyError) and hasattr(exc, "add_note"):
        exc.add_note(f"raised in {prefix}")  # a KeyError's argument is the key: keep it
    elif args and isinstance(args[0], str):
        exc.args = (f"{prefix}: {args[0]}", *args[1:])
    elif hasattr(exc, "add_note"):
        exc.add_note(f"raised in {prefix}")
    elif type(exc).__str__ is BaseException.__str__:
        exc.args = (f"{prefix}: {', '.join(map(repr, args))}",) if args else (prefix,)
    return exc


def add_context(exc: BaseException, text: str) -> None:
    """Add a line of context to ``exc``'s message (same object), or a note where it has none."""
    if exc.args and isinstance(exc.args[0], str) and not isinstance(exc, KeyError):
        exc.args = (f"{exc.args[0]}\n{text}", *exc.args[1:])
    elif hasattr(exc, "add_note"):
        exc.add_note(text)


def mxnet_text(exc: BaseException) -> str:
    """MXNet's message without its stack trace: every line that says what went wrong."""
    keep = []
    for line in str(exc).splitlines():
        stripped = line.strip()
        if (
            not stripped
            or stripped.startswith(("Traceback", 'File "', "[bt]", "Stack trace"))
            or re.match(r"^\d+: ", stripped)
        ):
            continue
        keep.append(re.sub(r"^(MXNetError: )+", "", stripped))
    return "\n".join(keep) or str(exc)


def from_mxnet(exc: BaseException, op_type: str, where: str) -> BaseException:
    """An MXNet operator refused what a forward gave it: a ValueError naming op and place.

    The caller raises it ``from exc``, so MXNet's own error stays attached.
    """
    new = ValueError(
        f"customop {shown(op_type)!r} ({where}): an MXNet operator failed: {mxnet_text(exc)}"
    )
    new.__cause__ = exc
    return new


def empty_batch(exc: BaseException, op_type: str, name: str) -> BaseException:
    """An MXNet operator in a forward refused the 0-size input ``name``: a ValueError saying so.

    Under MXNet's legacy shapes almost every operator, native ones too (``mx.nd.relu``,
    ``x * 2``), fails shape inference on a 0-size array.  Raised ``from exc``.
    """
    return ValueError(
        f"customop {shown(op_type)!r} (input {name!r}): an empty (0-size) batch: "
        "MXNet's own operators refuse 0-size arrays under its legacy shapes "
        "(native ones too); skip empty batches, or use the op's 'numpy' mode, "
        "which runs them. "
        f"MXNet said: {mxnet_text(exc)}"
    )


def ours(exc: BaseException, op_type: str, where: str) -> BaseException:
    """The exception to raise for ``exc`` raised while running ``op_type`` (see module doc)."""
    import mxnet as mx  # only this conversion needs MXNet's error type

    if isinstance(exc, mx.base.MXNetError):
        return from_mxnet(exc, op_type, where)
    return attach(exc, op_type, where)


def raise_as(new: BaseException, exc: BaseException) -> NoReturn:
    """Raise what :func:`ours` made of ``exc``: ``exc`` itself, or ``new`` chained to it."""
    if new is exc:
        raise exc
    raise new from exc


def reraise(exc: BaseException, op_type: str, where: str) -> NoReturn:
    """Raise ``exc`` (raised while running ``op_type``) as :func:`ours` says."""
    raise_as(ours(exc, op_type, where), exc)


class Call:
    """One ``mx.nd.Custom`` call: where the operator it creates leaves its forward's failure."""

    __slots__ = ("failure",)

    def __init__(self) -> None:
        self.failure: BaseException | None = None


CALL_KEY = "_customop_call"  # the attribute that carries a Call's key to the created operator
_calls: dict[str, Call] = {}
_call_ids = itertools.count()


def open_call() -> tuple[str, Call]:
    """A new :class:`Call` and the key that an ``mx.nd.Custom`` call passes as ``CALL_KEY``."""
    key = str(next(_call_ids))
    call = _calls[key] = Call()
    return key, call


def take_call(key: str | None) -> Call | None:
    """The :class:`Call` opened under ``key`` (once; None for an unknown key)."""
    return None if key is None else _calls.pop(key, None)


def close_call(key: str) -> None:
    _calls.pop(key, None)


def report(exc: BaseException, reader: int | None = None, poisoned: bool = False) -> None:
    """Queue a worker-thread failure for the thread that will read it (default: this one);
    ``poisoned``: it reaches that thread through arrays :func:`poison` made fail."""
    with _lock:
        _pending.append((threading.get_ident() if reader is None else reader, exc, poisoned))
        _raised.append(exc)


def record(call: Call, exc: BaseException) -> None:
    """Give a failure to the ``mx.nd.Custom`` call that made the operator."""
    call.failure = exc
    with _lock:
        _raised.append(exc)


def report_foreign(named: BaseException | None = None) -> None:
    """Someone else's callback failed: the next reader of a callback failure gets ``named``
    (see :func:`foreign_failure`), or MXNet's own error when it is ``None``."""
    with _lock:
        _pending.append((None, FOREIGN if named is None else _Foreign(named), False))


class _Foreign:
    __slots__ = ("exception",)

    def __init__(self, exception: BaseException):
        self.exception = exception


# MXNet's text when a backward reads a dependency set that another custom node declared
_OTHER_NODES_DEPS = "unknown storage type: -1"


def foreign_failure(
    printed: str, exc: BaseException, where: dict[str, Any]
) -> BaseException | None:
    """The one exception a hand-written op's failed CustomOp callback becomes, naming the op.

    ``printed``: MXNet's ``"Error in <what>.<method>: <traceback>"``; ``exc``: the
    exception the callback caught; ``where``: the callback's variables (MXNet's
    ``forward_entry`` / ``backward_entry`` hold the ``op`` and ``op_prop``).  ``None``
    for anything but a CustomOp's forward or backward (MXNet's error then stands).
    """
    import mxnet as mx

    found = re.match(r"Error in CustomOp\.(forward|backward): ", printed)
    if found is None:
        return None
    op_type = getattr(getattr(where.get("op"), "op", None), "op_type", None)
    if isinstance(op_type, str):  # one of ours, failing in MXNet's own entry (a patch is off)
        who = f"customop {shown(op_type)!r}"
    else:
        names = [type(where[k]).__name__ for k in ("op", "op_prop") if k in where]
        who = "hand-written custom operator " + (
            f"{names[0]} ({', '.join(names[1:])})" if len(names) > 1 else (names or ["?"])[0]
        )
    text = f"{type(exc).__name__}: {exc}"
    if _OTHER_NODES_DEPS in text and isinstance(op_type, str):
        text += (
            ". MXNet reads every custom node's backward dependencies from one process-wide "
            "set (mxnet.operator._registry.result_deps) that the custom node created last "
            "overwrites; customop's fix for its own nodes ('deps') is switched off by "
            "CUSTOMOP_RUNTIME_OFF"
        )
    elif _OTHER_NODES_DEPS in text:
        text += (
            ". MXNet reads every custom node's backward dependencies from one process-wide "
            "set (mxnet.operator._registry.result_deps) that the custom node created last "
            "overwrites; here it belongs to another hand-written op (ours never write it). "
            "Create a Symbol of the output layer (need_top_grad=False) after every other "
            "custom Symbol, right before backward (e.g. mx.sym.Custom(mx.sym.var('any'), "
            "op_type=...)), or port the ops to @customop"
        )
    new = mx.base.MXNetError(f"{who} failed in its {found.group(1)}: {text}")
    new.__cause__ = exc
    return new


def pending() -> int:
    with _lock:
        return len(_pending)


def clear() -> None:
    with _lock:
        _pending.clear()


def _take(poisoned: bool) -> BaseException | None:
    # This thread's newest entry of the kind read (an older one is an error nobody read):
    # a poisoned array's message is ours by construction, a bare callback failure is ours
    # only if a callback of ours raised (could poison nothing) and no foreign marker came
    # after it.  Another thread's exceptions are never handed out here.
    me = threading.get_ident()
    with _lock:
        for i in range(len(_pending) - 1, -1, -1):
            reader, entry, kind = _pending[i]
            if kind != poisoned:
                continue
            if entry is FOREIGN or isinstance(entry, _Foreign) or reader == me:
                del _pending[i]
                if isinstance(entry, _Foreign):
                    return entry.exception
                return None if entry is FOREIGN else entry  # type: ignore[return-value]
    return None


def poison(arrays: list[Any]) -> bool:
    """Make the first non-empty array of ``arrays`` fail when read (asynchronously, in
    MXNet's engine, like any failed operator); False where there was nothing to poison.
    Every floating array of ``arrays`` is filled with NaN first: MXNet raises an array's
    failure at its first read only, and later reads then find NaN.

    Called on MXNet's worker thread by a callback that failed, which then returns
    success: the failure travels with the arrays, never through MXNet's one
    CustomOp error slot (see the module doc).  One array is enough: MXNet's
    CustomOp wrapper throws the first failure among the arrays the callback got,
    and fails the whole node (every output) with it; a second poisoned array's
    failure would stay unread and surface at the next ``waitall()``.
    """
    import mxnet as mx

    for a in arrays:
        if a is not None and int(np.prod(a.shape)) and np.issubdtype(a.dtype, np.floating):
            # what every later read finds once the failure has been raised once: NaN, never
            # the zeros (or old values) the arrays held (MXNet raises a failure only once)
            mx.nd.full(a.shape, float("nan"), ctx=a.context, dtype=a.dtype, out=a)
    for a in arrays:
        size = int(np.prod(a.shape)) if a is not None else 0
        if size:
            # indices all out of range for a 1-element source: the kernel's own check fails
            mx.nd.take(
                mx.nd.zeros((1,), ctx=a.context, dtype=a.dtype),
                mx.nd.ones((size,), ctx=a.context, dtype="int32"),
                mode="raise",
                out=a.reshape((size,)),
            )
            return True
    return False


def swap_in(err: Any) -> Any:
    """Our queued failure in place of MXNet's error ``err`` for a poisoned array or a bare
    callback failure (else ``err``)."""
    text = str(err)
    if POISON_TEXT in text:
        real = _take(poisoned=True)
        if real is not None:
            real.__context__ = err
            return real
        return err
    if any(s in text for s in _CALLBACK_FAILURES):
        real = _take(poisoned=False)
        if real is not None:
            real.__context__ = err
            return real
    return err


def is_ours(exc: BaseException | None) -> bool:
    """Whether a callback's exception is one this package reported (by identity)."""
    with _lock:
        return exc is not None and any(e is exc for e in _raised)
