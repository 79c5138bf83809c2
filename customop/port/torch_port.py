"""Ports as ``torch.library`` custom ops: the forward graph as the op, the training graph's
gradient as its backward.

The op's kernel runs the forward graph, translated by
:data:`customop.port.torch_rules.RULES`, one torch call per node.  Where the training graph
splits (:func:`customop.port.runner.split_linear`: each output ``F + h(x - stop(x))``, ``h``
linear, as every op whose gradient is its closures'), an eager call whose inputs require
grad runs the split's primal graph instead: the outputs and the closures' coefficients,
which ``setup_context`` saves as residuals (under ``torch.compile`` it computes them
itself, traced); the ``register_autograd`` backward then evaluates only the linear part on
them (``g * c`` where each output's term is one product).  Elsewhere the backward
differentiates the training graph by torch's autograd (``BlockGrad`` detaches,
``make_loss`` values get a cotangent of ones): an eager call whose inputs require grad runs
it in the kernel, recorded, and hands it to ``setup_context``; under ``torch.compile``, or
in a second backward, the backward runs it again from the saved inputs.  Both give MXNet's
backward of that graph, which is the op's ``def_grad`` closures'.  A kernel's dispatch
excludes the autograd keys (gradients taken there came back wrong, torch 2.14): the
recording lifts that exclusion for the graph's own operators only.  The fake kernel runs the
forward graph on fake tensors, so ``torch.compile`` traces the op with its shapes; below
autograd, AOTAutograd then decomposes the op into the forward graph's torch operators
(:func:`_decompose`, in :func:`customop.port.logistic.rewrite`'s form), which inductor fuses.
A ``'numpy'``-mode op has no graphs: its kernel and its backward (a custom op of its own)
call the host code, and both stay opaque.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import logistic, torch_rules
from .portfile import Record
from .runner import compile_graph, port_error, split_linear

_made: dict[Any, Any] = {}
_count = itertools.count()


def _run(record: Record, which: str, fused: bool = False) -> Callable:
    """The record's graph ``which`` compiled; ``fused``: as :func:`logistic.rewrite` writes
    it, for inductor, which fuses it (eager torch runs the graph as extracted)."""
    runs = record.__dict__.setdefault("_torch_runs", {})  # kept by the record it runs
    found = runs.get((which, fused))
    if found is None:
        graph = getattr(record, which)
        found = runs[(which, fused)] = compile_graph(
            logistic.rewrite(graph) if fused else graph, torch_rules.RULES, record.op_type
        )
    return found


def _split(record: Record) -> Any:
    """The record's training graph split (:func:`customop.port.runner.split_linear`) and its
    compiled parts, or None where it does not split (the whole graph then runs under
    autograd)."""
    runs = record.__dict__.setdefault("_torch_runs", {})
    if "split" not in runs:
        split = None if getattr(record, "host", False) else split_linear(record.train, record.grads)
        if split is not None:
            coefficients = {
                "nodes": split.primal["nodes"],
                "heads": split.primal["heads"][split.n_out :],
            }
            split.runs = (
                compile_graph(split.primal, torch_rules.RULES, record.op_type),
                compile_graph(coefficients, torch_rules.RULES, record.op_type),
                None
                if split.mul is not None
                else compile_graph(split.linear, torch_rules.RULES, record.op_type),
                compile_graph(logistic.rewrite(coefficients), torch_rules.RULES, record.op_type),
            )
        runs["split"] = split
    return runs["split"]


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).replace("torch.", "")


# Eager calls that will be differentiated run the training graph under autograd in the
# kernel and hand it to setup_context here (by the first output's id), so the backward does
# not run the graph again: 2.9x -> see BENCHMARKS.md.  A kernel does not record autograd
# (its dispatch excludes the autograd keys: gradients taken there came back wrong, torch
# 2.14); the ForceDispatchKeyGuard below lifts that for the graph's own leaves only.
_pending: dict[int, tuple] = {}
# Graphs whose setup_context never came (a call under torch.no_grad() with inputs that
# require grad: the kernel cannot tell, grad mode is off inside it either way) are dropped,
# oldest first, past this many.
_PENDING_MAX = 4
# (private API: a torch without it runs the graph again in the backward instead)
_AUTOGRAD_KEY = (
    getattr(torch._C.DispatchKey, "AutogradFunctionality", None)
    if hasattr(torch._C, "_ForceDispatchKeyGuard")
    else None
)


def _recordable(record: Record, tensors: Sequence[torch.Tensor], key: bool = True) -> bool:
    if (key and _AUTOGRAD_KEY is None) or getattr(record, "host", False):
        return False
    if (
        torch.compiler.is_compiling()
        or torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None
    ):
        return False
    return any(tensors[i].requires_grad for i in record.grads) and all(
        type(t) is torch.Tensor or type(t) is torch.nn.Parameter for t in tensors
    )


def _own(h: torch.Tensor, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """``h`` as an output of a custom op: aliasing no input, contiguous."""
    if h._is_view() or any(torch._C._is_alias_of(h, t) for t in tensors):
        h = h.clone()
    return h.contiguous() if not h.is_contiguous() else h


def run_forward(
    record: Record, tensors: Sequence[torch.Tensor], found: Any = None
) -> list[torch.Tensor]:
    """The outputs; ``found``: what setup_context would look up again (kept with the graph)."""
    torch_rules.DEVICE.value = tensors[0].device if tensors else None
    split = _split(record)
    if split is not None:
        if not _recordable(record, tensors, key=False):
            run = _run(record, "forward")
            with torch.no_grad():
                heads, _ = run(list(tensors))
            return [_own(h, tensors) for h in heads]
        with torch.no_grad():  # the outputs and the coefficients the backward multiplies
            heads, _ = split.runs[0](list(tensors))
        out = [_own(h, tensors) for h in heads[: split.n_out]]
        _keep(out, heads[split.n_out :], found)
        return out
    if _recordable(record, tensors):
        graph = _graph(record, tensors, recorded=True)
        out = [_own(h.detach(), tensors) for h in graph[1]]
        _keep(out, graph, found)
        return out
    run = _run(record, "forward")
    with torch.no_grad():
        heads, _ = run(list(tensors))
    return [_own(h, tensors) for h in heads]


def _keep(out: list[torch.Tensor], graph: Any, found: Any) -> None:
    if out:
        if len(_pending) >= _PENDING_MAX:
            _pending.pop(next(iter(_pending)))
        _pending[id(out[0])] = (out[0], graph, found)


def coefficients(record: Record, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The split graph's coefficients at ``tensors`` (where the kernel kept none: under
    ``torch.compile`` this runs traced, beside the op, in the form inductor fuses)."""
    torch_rules.DEVICE.value = tensors[0].device if tensors else None
    run = _split(record).runs[3 if _traced(tensors) else 1]
    with torch.no_grad():
        found, _ = run(list(tensors))
    return found


def _traced(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether ``tensors`` are being traced (``torch.compile``), not computed."""
    return torch.compiler.is_compiling() or not all(
        type(t) is torch.Tensor or type(t) is torch.nn.Parameter for t in tensors
    )


def run_fused(record: Record, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The outputs by the forward graph in :func:`logistic.rewrite`'s form: the op's
    decomposition, which ``torch.compile`` traces (see :func:`_decompose`)."""
    torch_rules.DEVICE.value = tensors[0].device if tensors else None
    with torch.no_grad():
        heads, _ = _run(record, "forward", fused=True)(list(tensors))
    return [_own(h, tensors) for h in heads]


def _decompose(custom: Any, find: Callable, host: bool) -> None:
    """Under ``torch.compile`` the op is its forward graph's torch operators, which inductor
    fuses with the code around it, instead of one opaque call; its gradient stays the
    ``register_autograd`` one.  This is what ``torch.library.triton_op`` does (torch
    2.14): a rule for ``FunctionalTensorMode``, the mode AOTAutograd traces under, below
    autograd.  A ``'numpy'``-mode op (host code) stays one call."""
    try:
        from torch._subclasses.fake_tensor import FakeTensor
        from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode
    except ImportError:  # a torch without it: the op stays opaque, as it was
        return
    if host:
        return

    def rule(mode, op, types, args, kwargs):
        if any(
            not issubclass(t, (FakeTensor, FunctionalTensor)) and t is not torch.Tensor
            for t in types
        ):
            return NotImplemented
        with mode:
            record, tensors, _ = find(args, kwargs)
            out = run_fused(record, tensors)
        return out[0] if record.n_out == 1 else tuple(out)

    custom.register_torch_dispatch(FunctionalTensorMode, rule)


def linear_backward(
    record: Record,
    tensors: Sequence[torch.Tensor],
    coefficients: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor | None],
) -> list[torch.Tensor]:
    """The inputs' gradients from the split graph's saved coefficients: ``g * c`` where
    each output's term is one product, else torch's autograd of the linear part alone."""
    split = _split(record)
    wrt = [tensors[i] for i in record.grads]
    found: list[Any] = [None] * len(wrt)
    if split.mul is not None:
        for term, g in zip(split.mul, grads):
            if term is None or g is None:
                continue
            pos, j = term
            c = coefficients[j]
            part = g.to(c.dtype) * c
            found[pos] = part if found[pos] is None else found[pos] + part
    else:
        torch_rules.DEVICE.value = tensors[0].device if tensors else None
        seeds = [torch.zeros_like(w).requires_grad_(True) for w in wrt]
        with torch.enable_grad():
            heads, _ = split.runs[2](seeds + list(coefficients))
            outs, cots = [], []
            for t, g in zip(split.terms, grads):
                if t is not None and g is not None and heads[t].requires_grad:
                    outs.append(heads[t])
                    cots.append(g.to(heads[t].dtype))
            if outs:
                found = list(torch.autograd.grad(outs, seeds, cots, allow_unused=True))
    return [torch.zeros_like(w) if f is None else f for f, w in zip(found, wrt)]


def _graph(record: Record, tensors: Sequence[torch.Tensor], recorded: bool = False) -> tuple:
    """``(leaves, heads, losses)``: the training graph run under autograd."""
    run = _run(record, "train")
    with torch.enable_grad():
        if recorded:  # inside the kernel: let autograd record the graph's own operators
            with torch._C._ForceDispatchKeyGuard(
                torch._C._dispatch_tls_local_include_set(),
                torch._C._dispatch_tls_local_exclude_set().remove(_AUTOGRAD_KEY),
            ):
                leaves = [
                    t.detach().requires_grad_(i in record.grads) for i, t in enumerate(tensors)
                ]
                heads, losses = run(leaves)
        else:
            leaves = [t.detach().requires_grad_(i in record.grads) for i, t in enumerate(tensors)]
            heads, losses = run(leaves)
    return leaves, heads, losses


def recorded_graph(output: Any) -> tuple:
    """``(graph, found)`` the eager kernel kept for this output (once), or ``(None, None)``."""
    first = output[0] if isinstance(output, (tuple, list)) else output
    kept = _pending.pop(id(first), None)
    return kept[1:] if kept is not None and kept[0] is first else (None, None)


def run_backward(
    record: Record,
    tensors: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor | None],
    graph: tuple | None = None,
) -> list[torch.Tensor]:
    """The gradients of the inputs ``record.grads`` (in that order) for head gradients
    ``grads``: MXNet's backward of the training graph, by torch's autograd (``graph``: the
    one the forward kernel recorded, else it is run again here)."""
    if getattr(record, "host", False):
        from . import host

        return host.torch_backward(record, list(tensors), list(grads))
    torch_rules.DEVICE.value = tensors[0].device if tensors else None
    leaves, heads, losses = graph if graph is not None else _graph(record, tensors)
    with torch.enable_grad():
        outs, cots = [], []
        for h, g in zip(heads, grads):
            if g is not None and h.requires_grad:
                outs.append(h)
                cots.append(g.to(h.dtype))
        for loss in losses:
            if loss.requires_grad:
                outs.append(loss)
                cots.append(torch.ones_like(loss))
        wrt = [leaves[i] for i in record.grads]
        if not outs:
            return [torch.zeros_like(w) for w in wrt]
        found = torch.autograd.grad(outs, wrt, cots, allow_unused=True)
    return [torch.zeros_like(w) if f is None else f for f, w in zip(found, wrt)]


def _lib_name(op_type: str, extra: str = "") -> str:
    base = re.sub(r"[^0-9A-Za-z_]", "_", op_type)
    return f"customop::{base}{extra}"


def _check_inputs(record: Record, tensors: Sequence[torch.Tensor]) -> None:
    for name, t in zip(record.inputs, tensors):
        if not isinstance(t, torch.Tensor):
            raise port_error(
                record.op_type,
                (f"input {name!r} must be a torch.Tensor, got {type(t).__name__}"),
                TypeError,
            )
    record.check([tuple(t.shape) for t in tensors], [_dtype_name(t) for t in tensors])


def _attach_autograd(custom: Any, n_in: int, find: Callable, host_backward: Any = None) -> None:
    """``find(inputs, kwargs) -> (record, present tensors, their positions)``;
    ``host_backward``: a ``'numpy'``-mode op's backward as a custom op of its own (see
    :func:`_host_backward_op`)."""

    def setup_context(ctx, inputs, output, keyword_only_inputs=None):
        ctx.graph, found = recorded_graph(output)
        ctx.kwargs = dict(keyword_only_inputs or {})
        record, tensors, where = found or find(inputs, ctx.kwargs)
        ctx.record, ctx.where, ctx.n = record, where, len(tensors)
        ctx.split = _split(record) is not None
        if ctx.split:  # the coefficients are residuals: the backward only multiplies
            kept = ctx.graph if ctx.graph is not None else coefficients(record, tensors)
            ctx.graph = None
            ctx.save_for_backward(*tensors, *kept)
        else:
            ctx.save_for_backward(*tensors)

    def backward(ctx, *grads):
        saved = ctx.saved_tensors
        tensors = saved[: ctx.n]
        if host_backward is not None:
            full: list[Any] = [None] * n_in
            for t, pos in zip(tensors, ctx.where):
                full[pos] = t
            found = host_backward(full, list(grads), **ctx.kwargs)
        elif ctx.split:
            found = linear_backward(ctx.record, list(tensors), list(saved[ctx.n :]), list(grads))
        else:
            graph, ctx.graph = ctx.graph, None  # (used once: a second backward runs it again)
            found = run_backward(ctx.record, list(tensors), list(grads), graph)
        out: list[Any] = [None] * n_in
        for g, i in zip(found, ctx.record.grads):
            out[ctx.where[i]] = g
        return tuple(out)

    custom.register_autograd(backward, setup_context=setup_context)


def _host_backward_op(name: str, kw: list[str], find: Callable) -> Any:
    """A ``'numpy'``-mode op's backward as a custom op: ``(inputs, head gradients,
    parameters) -> the gradients of record.grads``.  One opaque call, so that
    ``torch.compile`` traces the backward with its shapes (the host code cannot read traced
    tensors)."""
    from . import host

    def impl(inputs, grads, **kwargs):
        record, tensors, _ = find(inputs, kwargs)
        return host.torch_backward(record, tensors, list(grads))

    def fake(inputs, grads, **kwargs):
        record, tensors, _ = find(inputs, kwargs)
        return [torch.empty_like(tensors[i]) for i in record.grads]

    args = ", ".join(["Tensor?[] inputs", "Tensor?[] grads"] + (["*"] + kw if kw else []))
    custom = torch.library.custom_op(
        f"{name}_host_backward", impl, mutates_args=(), schema=f"({args}) -> Tensor[]"
    )
    custom.register_fake(fake)
    return custom


def from_record(record: Record) -> Any:
    """A loaded port: a custom op of the saved inputs, parameters fixed."""
    name = _lib_name(record.op_type, f"_port{next(_count)}")
    n = len(record.inputs)
    args = ", ".join(f"Tensor {x}" for x in record.inputs)
    outs = "Tensor" if record.n_out == 1 else "(" + ", ".join(["Tensor"] * record.n_out) + ")"

    def impl(*tensors):
        _check_inputs(record, tensors)
        out = run_forward(record, tensors, (record, list(tensors), list(range(n))))
        return out[0] if record.n_out == 1 else tuple(out)

    custom = torch.library.custom_op(name, impl, mutates_args=(), schema=f"({args}) -> {outs}")
    custom.register_fake(impl)
    _attach_autograd(custom, n, lambda inputs, kw: (record, list(inputs), list(range(n))))
    _decompose(
        custom,
        lambda inputs, kw: (record, list(inputs), list(range(n))),
        getattr(record, "host", False),
    )
    custom.record = record
    return custom


_TYPES = ((bool, "bool"), (int, "int"), (float, "float"), (str, "str"))


def _schema_type(value: Any) -> str | None:
    for kind, name in _TYPES:
        if type(value) is kind:
            return name
    if isinstance(value, tuple) and all(type(v) is int for v in value):
        return "int[]"
    return None


def to_torch(op: Any, **fixed: Any) -> Any:
    """``op`` as a ``torch.library`` custom op; see :func:`customop.to_torch`."""
    from . import extract, host

    op = extract.live_op(op)
    sig = op.signature
    missing = [p for p in sig.required if p not in fixed]
    if missing:
        raise port_error(
            op.op_type,
            (
                f"parameter(s) {', '.join(map(repr, missing))} have no default: fix them in "
                f"customop.to_torch(op, {missing[0]}=...)"
            ),
            TypeError,
        )
    count = op.outputs.declared
    if callable(count):  # the output count depends on the parameters: fix them all
        fixed = {**sig.defaults, **fixed}
    key = (op, repr(sorted(fixed.items())))
    if key in _made:
        return _made[key]
    free = {k: v for k, v in sig.defaults.items() if k not in fixed}
    n_out = op.outputs.of({**sig.defaults, **fixed})
    names = list(sig.inputs)
    parts = [f"Tensor? {x}=None" if x in sig.optional else f"Tensor {x}" for x in names]
    kw = []
    for k, v in free.items():
        t = _schema_type(v)
        if t is None:
            fixed[k] = v
            continue
        default = str(v) if type(v) is bool else repr(list(v)) if isinstance(v, tuple) else repr(v)
        kw.append(f"{t} {k}={default}")
    free = {k: v for k, v in free.items() if k not in fixed}
    schema_args = ", ".join(parts + (["*"] + kw if kw else []))
    outs = "Tensor" if n_out == 1 else "(" + ", ".join(["Tensor"] * n_out) + ")"
    name = _lib_name(op.op_type)
    taken = {c._qualname for c in _made.values()}
    if name in taken:  # the same op again with other fixed parameters
        name = _lib_name(op.op_type, f"_{sum(n.startswith(name) for n in taken)}")
    numpy_mode = op.mode != "mxnet" or bool(sig.aux)
    if sig.aux:
        raise port_error(op.op_type, f"cannot be ported: {extract.why_not_native(op)}")

    seen: dict[Any, tuple] = {}  # (input shapes and dtypes, keywords) -> (record, positions)

    def find(inputs, kwargs):
        try:  # a call like an earlier one: no binding, no record lookup (eager overhead)
            key = (
                tuple(None if t is None else (t.shape, t.dtype) for t in inputs),
                tuple(
                    sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in kwargs.items())
                ),
            )
            hit = seen.get(key)
        except (AttributeError, TypeError):  # not tensors, or symbolic sizes (unhashable)
            key = hit = None
        if hit is not None:
            tensors = [inputs[i] for i in hit[1]]
            if all(isinstance(t, torch.Tensor) for t in tensors):
                return hit[0], tensors, hit[1]
        found = _find(inputs, kwargs)
        if key is not None:
            if len(seen) >= 64:
                seen.clear()
            seen[key] = (found[0], found[2])
        return found

    def _find(inputs, kwargs):
        params = {**fixed, **{k: kwargs.get(k, free[k]) for k in free}}
        params = {k: tuple(v) if isinstance(v, list) else v for k, v in params.items()}
        arrays = list(inputs)
        target, present, pnames, params = extract.split_call(op, arrays, params)
        tensors = [arrays[i] for i in present]
        for nm, t in zip(pnames, tensors):
            if not isinstance(t, torch.Tensor):
                raise port_error(
                    op.op_type,
                    f"input {nm!r} must be a torch.Tensor, got {type(t).__name__}",
                    TypeError,
                )
        if numpy_mode:
            record = host.record(target, op, tensors, pnames, params, n_out)
        else:
            record = extract.record_for(
                target,
                [tuple(t.shape) for t in tensors],
                [_dtype_name(t) for t in tensors],
                params,
                pnames,
            )
        return record, tensors, present

    def impl(*inputs, **kwargs):
        found = find(inputs, kwargs)
        record, tensors, _ = found
        if numpy_mode:
            out = host.torch_forward(record, tensors)
        else:
            out = run_forward(record, tensors, found)
        return out[0] if n_out == 1 else tuple(out)

    def fake(*inputs, **kwargs):
        record, tensors, _ = find(inputs, kwargs)
        if numpy_mode:
            out = host.torch_fake(record, tensors)
        else:
            out = run_forward(record, tensors)
        return out[0] if n_out == 1 else tuple(out)

    custom = torch.library.custom_op(
        name, impl, mutates_args=(), schema=f"({schema_args}) -> {outs}"
    )
    custom.register_fake(fake)
    _attach_autograd(
        custom, len(names), find, _host_backward_op(name, kw, find) if numpy_mode else None
    )
    _decompose(custom, find, numpy_mode)
    _made[key] = custom
    return custom
