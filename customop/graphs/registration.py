"""How an operator was registered, as data: what every saved verdict's key holds of it.

Two operators with one forward (a user op wrapping a library function) differ in how
:func:`customop.customop` registered them: the inputs without a gradient (``no_grad``),
``need_top_grad``, ``auto_grad``, their gradient closures, the signature, ``inline``.  Each
decides the graph or the refusal, so every key of :mod:`customop.graphs.verdict_files`
(:func:`customop.graphs.verify.saved_key`, :mod:`customop.graphs.saved_graphs`,
:mod:`customop.graphs.saved_splices`) holds :func:`fields` of its operators.

Example:
    >>> from customop import customop
    >>> def f(x, s):
    ...     return x * s
    >>> a = customop("mxnet", name="doc.reg_a")(f)
    >>> b = customop("mxnet", name="doc.reg_b", no_grad=("s",))(f)
    >>> from customop.graphs import registration
    >>> registration.fields(a)[3], registration.fields(b)[3]  # no_grad
    ([], ['s'])
"""

from __future__ import annotations

from typing import Any


def fields(op: Any) -> list:
    """The registration of ``op`` (JSON data): what its graph, gradient or refusal depends
    on beside its code, parameters and signature."""
    sig = getattr(op, "signature", None)
    declared = getattr(op, "user_num_outputs", None)
    return [
        getattr(op, "op_type", None),
        getattr(op, "mode", None),
        bool(getattr(op, "need_top_grad", True)),
        sorted(getattr(op, "no_grad", ()) or ()),
        bool(getattr(op, "auto_grad", False)),
        sorted(getattr(op, "grads", {}) or {}),
        sorted(getattr(op, "grad_groups", {}) or {}),
        bool(getattr(op, "inline", True)),
        list(getattr(sig, "inputs", ()) or ()),
        list(getattr(sig, "aux", ()) or ()),
        list(getattr(sig, "optional", ()) or ()),
        sorted(getattr(sig, "required", ()) or ()),
        repr(sorted((getattr(sig, "defaults", {}) or {}).items())),
        _named(declared),
        _named(getattr(op, "user_outputs", None)),
    ]


def _named(value: Any) -> Any:
    # a function by its name (its repr holds an address, another in each process)
    if callable(value):
        return f"{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', '')}"
    return value if value is None or isinstance(value, (int, str)) else repr(value)
