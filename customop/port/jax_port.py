"""Ports as JAX functions: ``jax.custom_vjp`` over the forward graph, its backward the VJP of
the training graph.

Where the training graph splits (:func:`customop.port.runner.split_linear`), the forward
rule of the ``custom_vjp`` runs the split's primal graph (the outputs and the closures'
coefficients, kept as residuals) and the backward rule only the linear part on them.
Elsewhere the forward rule runs the training graph under ``jax.vjp`` (its value is the
forward's) and keeps the VJP function as the residual: ``BlockGrad`` is
``lax.stop_gradient``, ``make_loss`` values get a cotangent of ones.  Everything is jax
code, so the port works under ``jit``, ``grad``, ``vjp`` and ``vmap``.  Ops without graphs
(``'numpy'`` mode) run on the host through ``jax.pure_callback`` inside the same
``custom_vjp``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import jax_rules, logistic
from .portfile import Record
from .runner import compile_graph, port_error, split_linear

_lock = threading.Lock()


def _dtype_name(x: Any) -> str:
    return np.dtype(x.dtype).name


def _vjp_fn(record: Record) -> Callable:
    """The ``custom_vjp`` function of the record's present inputs (one per record)."""
    found = record.__dict__.get("_jax_fn")  # kept by the record it runs
    if found is None:
        with _lock:
            found = record.__dict__.get("_jax_fn")
            if found is None:
                found = _host_fn(record) if getattr(record, "host", False) else _graph_fn(record)
                record.__dict__["_jax_fn"] = found
    return found


def _graph_fn(record: Record) -> Callable:
    # XLA fuses: the graphs no one differentiates share one exp per logistic family
    forward = compile_graph(logistic.rewrite(record.forward), jax_rules.RULES, record.op_type)
    train = compile_graph(record.train, jax_rules.RULES, record.op_type)
    diff = list(record.grads)
    single = record.n_out == 1

    def shaped(heads):
        return heads[0] if single else tuple(heads)

    @jax.custom_vjp
    def f(*xs):
        return shaped(forward(list(xs))[0])

    def f_fwd(*xs):
        def g(*dx):
            full = list(xs)
            for i, d in zip(diff, dx):
                full[i] = d
            heads, losses = train(full)
            return list(heads), list(losses)

        (heads, losses), vjp = jax.vjp(g, *[xs[i] for i in diff])
        ones = [jnp.ones_like(v) for v in losses]
        return shaped(heads), (vjp, ones)

    def f_bwd(res, cts):
        vjp, ones = res
        cts = [cts] if single else list(cts)
        found = vjp((cts, ones))
        out: list[Any] = [None] * len(record.inputs)
        for i, g in zip(diff, found):
            out[i] = g
        return tuple(out)

    split = split_linear(record.train, diff)
    if split is not None:
        f_fwd, f_bwd = _split_rules(record, split, forward, shaped)
    f.defvjp(f_fwd, f_bwd)
    return f


def _split_rules(record: Record, split: Any, forward: Callable, shaped: Callable) -> tuple:
    """``custom_vjp`` rules from a split training graph: the forward computes the outputs
    and the coefficients (the residuals), the backward only the linear part on them."""
    primal = compile_graph(logistic.rewrite(split.primal), jax_rules.RULES, record.op_type)
    linear = (
        None
        if split.mul is not None
        else compile_graph(split.linear, jax_rules.RULES, record.op_type)
    )
    diff = list(record.grads)

    def f_fwd(*xs):
        heads, _ = primal(list(xs))
        return shaped(heads[: split.n_out]), (tuple(heads[split.n_out :]), xs)

    def f_bwd(res, cts):
        coefficients, xs = res
        cts = [cts] if split.n_out == 1 else list(cts)
        wrt = [xs[i] for i in diff]
        found: list[Any] = [None] * len(diff)
        if split.mul is not None:
            for term, g in zip(split.mul, cts):
                if term is not None:
                    pos, j = term
                    c = coefficients[j]
                    part = g.astype(c.dtype) * c
                    found[pos] = part if found[pos] is None else found[pos] + part
        else:

            def lin(*seeds):
                heads, _ = linear(list(seeds) + list(coefficients))
                return [heads[t] for t in split.terms if t is not None]

            outs, vjp = jax.vjp(lin, *[jnp.zeros_like(w) for w in wrt])
            found = list(
                vjp(
                    [
                        g.astype(o.dtype)
                        for g, o in zip(
                            [g for g, t in zip(cts, split.terms) if t is not None], outs
                        )
                    ]
                )
            )
        out: list[Any] = [None] * len(record.inputs)
        for i, g, w in zip(diff, found, wrt):
            out[i] = jnp.zeros_like(w) if g is None else g
        return tuple(out)

    return f_fwd, f_bwd


def _host_fn(record: Any) -> Callable:
    from . import host

    diff = list(record.grads)
    single = record.n_out == 1

    def structs(xs):  # in JAX's default 32-bit mode a float64 output comes back float32
        return [
            jax.ShapeDtypeStruct(tuple(s), jax.dtypes.canonicalize_dtype(np.dtype(d)))
            for s, d in host.shapes(record, xs)
        ]

    @jax.custom_vjp
    def f(*xs):
        want = structs(xs)

        def run_forward(*xs):
            return tuple(
                o.astype(w.dtype, copy=False)
                for o, w in zip(host.forward(record, [np.asarray(x) for x in xs]), want)
            )

        out = jax.pure_callback(run_forward, want, *xs, vectorized=False)
        return out[0] if single else tuple(out)

    def f_fwd(*xs):
        return f(*xs), xs

    def f_bwd(xs, cts):
        cts = [cts] if single else list(cts)

        def run_backward(*args):
            arrays, grads = args[: len(xs)], args[len(xs) :]
            found = host.backward(
                record, [np.asarray(a) for a in arrays], [np.asarray(g) for g in grads]
            )
            return tuple(g.astype(w.dtype, copy=False) for g, w in zip(found, want))

        want = [jax.ShapeDtypeStruct(xs[i].shape, xs[i].dtype) for i in diff]
        found = jax.pure_callback(run_backward, want, *xs, *cts, vectorized=False)
        out: list[Any] = [None] * len(xs)
        for i, g in zip(diff, found):
            out[i] = g
        return tuple(out)

    f.defvjp(f_fwd, f_bwd)
    return f


def _check(record: Record, arrays) -> None:
    for name, x in zip(record.inputs, arrays):
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):
            raise port_error(
                record.op_type,
                (f"input {name!r} must be a jax array, got {type(x).__name__}"),
                TypeError,
            )
    record.check([tuple(x.shape) for x in arrays], [_dtype_name(x) for x in arrays])


def from_record(record: Record) -> Callable:
    """A loaded port: a function of the saved inputs (jax arrays), parameters fixed."""

    def port(*arrays):
        arrays = [jnp.asarray(x) if isinstance(x, np.ndarray) else x for x in arrays]
        _check(record, arrays)
        return _vjp_fn(record)(*arrays)

    port.__name__ = record.op_type.replace(".", "_")
    port.__doc__ = f"customop port of {record.op_type!r}: inputs {record.describe()}"
    port.record = record  # type: ignore[attr-defined]
    return port


def to_jax(op: Any) -> Callable:
    """``op`` as a function of jax arrays; see :func:`customop.to_jax`."""
    from . import extract, host

    op = extract.live_op(op)
    if op.signature.aux:
        raise port_error(op.op_type, f"cannot be ported: {extract.why_not_native(op)}")

    def port(*arrays, **params):
        target, present, names, params = extract.split_call(op, list(arrays), params)
        xs = [
            jnp.asarray(arrays[i]) if isinstance(arrays[i], np.ndarray) else arrays[i]
            for i in present
        ]
        for nm, x in zip(names, xs):
            if not hasattr(x, "shape") or not hasattr(x, "dtype"):
                raise port_error(
                    op.op_type,
                    (f"input {nm!r} must be a jax array, got {type(x).__name__}"),
                    TypeError,
                )
        if target.mode != "mxnet":
            n_out = op.outputs.of({**op.signature.defaults, **params})
            record = host.record(target, op, xs, names, params, n_out)
        else:
            record = extract.record_for(
                target, [tuple(x.shape) for x in xs], [_dtype_name(x) for x in xs], params, names
            )
        return _vjp_fn(record)(*xs)

    port.__name__ = op.op_type.replace(".", "_")
    port.__doc__ = f"customop port of {op.op_type!r} to JAX (parameters as keywords)"
    return port
