"""Transposing a traced linear map, one rule per MXNet operator (JAX's ``linear_transpose``).

A gradient closure ``grad(g)`` is linear in the head gradient ``g``.  Traced
with ``g`` as a variable it is a graph whose nodes either do not depend on ``g``
(coefficients: functions of the inputs, the forward's outputs and residuals) or
are linear in their ``g``-dependent inputs.  :func:`transpose` walks the
``g``-dependent nodes from the closure's outputs back to ``g`` and, per node,
asks :data:`TRANSPOSE` (keyed by MXNet operator) for the nodes that carry a
cotangent of the node's output back to its linear inputs.  The result maps each
``g`` to an expression linear in the cotangents fed at the closure's outputs.

Before any rule runs, :func:`nonlinear_use` reads the closure's graph statically: each
operator's entry in :data:`LINEAR_IN` says which of its operands it is linear in (JAX's
linear primitives); an operator applied to ``g`` without an entry (``clip``, ``sign``,
``abs``, ``norm``, comparisons), or applied to ``g`` in an operand it is not linear in
(``g * g``, ``x / g``), makes the closure not linear in ``g``: it keeps its ``Custom``
node and is called with the real head gradient.  No sampled values decide it.

A rule is ``rule(t, node, ct, linear) -> [(input position, cotangent ref)]``:
``node`` the traced node (``op``, ``attrs``, ``inputs`` as refs), ``ct`` the ref
of its output's cotangent, ``linear`` which inputs depend on ``g``; ``t`` (a
:class:`Transposer`) adds nodes and knows every entry's shape and dtype.  A rule
raises :class:`NotLinear` when the node is not linear in ``g`` (two factors that
both depend on ``g``, an added constant, ``sqrt(g)``).
"""

from __future__ import annotations

from typing import Any, Callable, Protocol  # noqa: UP035 - Callable[...] evaluated at run time (3.8)

import numpy as np


class NotLinear(Exception):
    """A node the transposition has no rule for, or one not linear in ``g``."""

    def __init__(self, op: str, why: str):
        super().__init__(f"MXNet operator {op!r} {why}")
        self.op, self.why = op, why


Ref = tuple
Rule = Callable[["Transposer", dict, Ref, list], list]
TRANSPOSE: dict[str, Rule] = {}
# Which operands each operator is linear in (one entry per operator, beside its transpose):
# SUM: in all of them jointly (a sum, a join); PRODUCT: in each alone, so at most one may
# depend on g (a product); a tuple: in those positions only, the others must be g-free.
SUM, PRODUCT = "sum", "product"
LINEAR_IN: dict[str, Any] = {}
# Operators whose output is zero whatever their inputs: a term built from them adds nothing.
ZEROS = frozenset({"zeros_like", "_zeros", "_npi_zeros", "_zeros_without_dtype"})


class Entries(Protocol):
    """What the rules ask about the traced graph's entries (the graph being transposed
    answers: :mod:`customop.graphs.backward`)."""

    def shape(self, ref: Ref) -> tuple: ...  # of any entry

    def dtype(self, ref: Ref) -> Any: ...

    def like(self, ref: Ref) -> Ref | None:
        """A ``g``-free entry of ``ref``'s shape (to broadcast or reshape to without
        writing shapes into the graph), or None."""

    def coefficient(self, ref: Ref) -> Ref: ...  # a g-free ref as a coefficient (stopped)

    def is_zero(self, ref: Ref) -> bool: ...  # whether a g-free ref is zero everywhere


class Transposer:
    """Builds the transposed nodes into ``nodes`` (NativeGraph node dicts, refs as inputs),
    asking ``entries`` about the traced graph's entries."""

    def __init__(self, nodes: list, entries: Entries):
        self.nodes = nodes
        self.shape, self.dtype, self.like = entries.shape, entries.dtype, entries.like
        self.coefficient, self.is_zero = entries.coefficient, entries.is_zero

    def add(self, op: str, inputs: list, **attrs: Any) -> Ref:
        self.nodes.append(
            {
                "op": op,
                "name": f"t{len(self.nodes)}_{op.strip('_').lower()}",
                "attrs": {k: str(v) for k, v in attrs.items()},
                "inputs": inputs,
            }
        )
        return ("node", len(self.nodes) - 1, 0)

    def to_shape_of(self, ct: Ref, ref: Ref) -> Ref:
        """``ct`` reshaped to ``ref``'s shape (``reshape_like`` when an entry has that shape)."""
        like = self.like(ref)
        if like is not None:
            return self.add("reshape_like", [ct, like])
        return self.add("Reshape", [ct], shape=tuple(self.shape(ref)))

    def broadcast_to_shape_of(self, ct: Ref, ref: Ref) -> Ref:
        like = self.like(ref)
        if like is not None:
            return self.add("broadcast_like", [ct, like])
        return self.add("broadcast_to", [ct], shape=tuple(self.shape(ref)))

    def unbroadcast(self, ct: Ref, out: Ref, ref: Ref) -> Ref:
        """``ct`` (shaped like ``out``) summed down to ``ref``'s shape (broadcast <-> sum)."""
        to, frm = tuple(self.shape(ref)), tuple(self.shape(out))
        if to == frm:
            return ct
        lead = len(frm) - len(to)
        axes = tuple(range(lead)) + tuple(
            lead + i for i, d in enumerate(to) if d == 1 and frm[lead + i] != 1
        )
        if axes:
            ct = self.add("sum", [ct], axis=axes, keepdims=True)
        return self.to_shape_of(ct, ref) if lead else ct


def _rule(*names: str, linear_in: Any = (0,)) -> Callable[[Rule], Rule]:
    def register(fn: Rule) -> Rule:
        for name in names:
            TRANSPOSE[name] = fn
            LINEAR_IN[name] = linear_in
        return fn

    return register


def _one_linear(node: dict, linear: list) -> int:
    if sum(linear) != 1:
        raise NotLinear(
            node["op"],
            "multiplies two values that both depend on the head "
            "gradient g: the closure is not linear in g",
        )
    return linear.index(True)


@_rule("elemwise_mul", "_mul", "_Mul", "broadcast_mul", linear_in=PRODUCT)
def _mul(t, node, ct, linear):
    i = _one_linear(node, linear)
    other = t.coefficient(node["inputs"][1 - i])
    op = (
        "elemwise_mul"
        if t.shape(node["inputs"][0]) == t.shape(node["inputs"][1])
        else "broadcast_mul"
    )
    return [(i, t.unbroadcast(t.add(op, [ct, other]), node["out"], node["inputs"][i]))]


@_rule("elemwise_div", "_div", "_Div", "broadcast_div")
def _div(t, node, ct, linear):
    if linear[1]:
        raise NotLinear(
            node["op"],
            "divides by a value that depends on the head gradient g: "
            "the closure is not linear in g",
        )
    other = t.coefficient(node["inputs"][1])
    op = (
        "elemwise_div"
        if t.shape(node["inputs"][0]) == t.shape(node["inputs"][1])
        else "broadcast_div"
    )
    return [(0, t.unbroadcast(t.add(op, [ct, other]), node["out"], node["inputs"][0]))]


def _g_terms(t, node: dict, linear: list, why: str, among: Any = None) -> list[int]:
    """The positions (``among`` them, default all) of the node's inputs that depend on ``g``.
    Any other must be zero: a value that does not depend on ``g`` makes the node affine in
    ``g``, and ``why`` says how."""
    among = range(len(node["inputs"])) if among is None else among
    for i in among:
        if not linear[i] and not t.is_zero(node["inputs"][i]):
            raise NotLinear(node["op"], why)
    return [i for i in among if linear[i]]


def _sum_of_terms(sign: int):
    def rule(t, node, ct, linear):
        out = []
        why = (
            "adds a term that does not depend on the head "
            "gradient g: the closure is affine, not linear, in g"
        )
        for i in _g_terms(t, node, linear, why):
            c = t.add("negative", [ct]) if (sign < 0 and i == 1) else ct
            out.append((i, t.unbroadcast(c, node["out"], node["inputs"][i])))
        return out

    return rule


_rule(
    "elemwise_add",
    "_plus",
    "_Plus",
    "_add",
    "broadcast_add",
    "broadcast_plus",
    "add_n",
    "ElementWiseSum",
    "_grad_add",
    linear_in=SUM,
)(_sum_of_terms(1))
_rule(
    "elemwise_sub", "_minus", "_Minus", "_sub", "broadcast_sub", "broadcast_minus", linear_in=SUM
)(_sum_of_terms(-1))


@_rule(
    "_mul_scalar",
    "_div_scalar",
    "negative",
    "_copy",
    "BlockGrad",
    "stop_gradient",
    "identity",
    "_identity_with_attr_like_rhs",
    "make_loss",
)
def _self_transpose(t, node, ct, linear):
    # Scaling by a number, negation and copies are their own transposes.
    if node["op"] in ("_copy", "BlockGrad", "stop_gradient", "identity", "make_loss"):
        return [(0, ct)]
    if node["op"] == "_identity_with_attr_like_rhs":
        if linear[1]:
            raise NotLinear(node["op"], "takes only its shape from its second input")
        return [(0, ct)]
    return [(0, t.add(node["op"], [ct], **node["attrs"]))]


@_rule("_rminus_scalar", "_plus_scalar", "_minus_scalar")
def _shifted(t, node, ct, linear):
    if float(node["attrs"].get("scalar", "0")) != 0:
        raise NotLinear(
            node["op"],
            "adds a number to a value that depends on the head gradient "
            "g: the closure is affine, not linear, in g",
        )
    return [(0, t.add("negative", [ct]) if node["op"] == "_rminus_scalar" else ct)]


@_rule("Reshape", "reshape", "expand_dims", "squeeze", "Flatten", "flatten", "reshape_like")
def _reshape(t, node, ct, linear):
    if node["op"] == "reshape_like" and linear[1]:
        raise NotLinear(node["op"], "takes only its shape from its second input")
    return [(0, t.to_shape_of(ct, node["inputs"][0]))]


@_rule("transpose")
def _transpose(t, node, ct, linear):
    axes = _ints(node["attrs"].get("axes", "()"))
    if not axes:
        return [(0, t.add("transpose", [ct]))]
    return [(0, t.add("transpose", [ct], axes=tuple(int(a) for a in np.argsort(axes))))]


@_rule("SwapAxis", "swapaxes")
def _swap(t, node, ct, linear):
    return [(0, t.add("SwapAxis", [ct], **node["attrs"]))]


@_rule("broadcast_to", "broadcast_like", "broadcast_axis", "broadcast_axes")
def _broadcast(t, node, ct, linear):
    if node["op"] == "broadcast_like" and linear[1]:
        raise NotLinear(node["op"], "takes only its shape from its second input")
    return [(0, t.unbroadcast(ct, node["out"], node["inputs"][0]))]


@_rule("sum", "sum_axis")
def _sum(t, node, ct, linear):
    src = node["inputs"][0]
    shape = tuple(t.shape(src))
    axis = node["attrs"].get("axis", "None")
    axes = (
        tuple(range(len(shape)))
        if axis in ("None", "()", "")
        else tuple(a % len(shape) for a in _ints(axis))
    )
    if node["attrs"].get("exclude", "False") in ("True", "1", "true"):
        axes = tuple(a for a in range(len(shape)) if a not in axes)
    if node["attrs"].get("keepdims", "False") not in ("True", "1", "true"):
        for a in sorted(axes):  # the summed axes back as length-1 axes
            ct = t.add("expand_dims", [ct], axis=a) if len(axes) < len(shape) else ct
        if len(axes) == len(shape):
            ct = t.add("Reshape", [ct], shape=(1,) * len(shape))
    return [(0, t.broadcast_to_shape_of(ct, src))]


@_rule("where", linear_in=(1, 2))
def _where(t, node, ct, linear):
    if linear[0]:
        raise NotLinear(node["op"], "chooses by a condition that depends on the head gradient g")
    cond = t.coefficient(node["inputs"][0])
    zeros = None
    out = []
    why = (
        "chooses between the head gradient g and a value "
        "that does not depend on it: the closure is affine in g"
    )
    for i in _g_terms(t, node, linear, why, among=(1, 2)):
        zeros = zeros or t.add("zeros_like", [ct])
        pick = [cond, ct, zeros] if i == 1 else [cond, zeros, ct]
        out.append((i, t.add("where", pick)))
    return out


@_rule("Cast", "cast", "amp_cast")
def _cast(t, node, ct, linear):
    if not np.issubdtype(np.dtype(t.dtype(node["out"])), np.floating):
        raise NotLinear(
            node["op"], "rounds the head gradient g to integers: the closure is not linear in g"
        )
    return [(0, t.add("Cast", [ct], dtype=np.dtype(t.dtype(node["inputs"][0])).name))]


@_rule("slice_axis")
def _slice_axis(t, node, ct, linear):
    # slice <-> pad with zeros: the zeros are cut from a like-shaped entry, then concatenated.
    src = node["inputs"][0]
    like = t.like(src)
    if like is None:
        raise NotLinear(node["op"], "has no rule at this shape (no entry shaped like its input)")
    shape = tuple(t.shape(src))
    axis = int(node["attrs"]["axis"]) % len(shape)
    begin = int(node["attrs"].get("begin", 0))
    end = node["attrs"].get("end", "None")
    end = shape[axis] if end in ("None", "") else int(end)
    begin, end = begin % shape[axis] if begin < 0 else begin, end % shape[axis] if end < 0 else end
    parts = []
    if begin > 0:
        parts.append(
            t.add("zeros_like", [t.add("slice_axis", [like], axis=axis, begin=0, end=begin)])
        )
    parts.append(ct)
    if end < shape[axis]:
        parts.append(
            t.add("zeros_like", [t.add("slice_axis", [like], axis=axis, begin=end, end="None")])
        )
    if len(parts) == 1:
        return [(0, ct)]
    return [(0, t.add("Concat", parts, dim=axis, num_args=len(parts)))]


@_rule(*ZEROS, linear_in=SUM)
def _zeros(t, node, ct, linear):
    return []  # zeros_like(g): the zero map, whose transpose gives nothing


@_rule("Concat", "concat", linear_in=SUM)
def _concat(t, node, ct, linear):
    # concatenate <-> slice the cotangent back into the parts
    ndim = len(t.shape(node["out"]))
    axis = int(node["attrs"].get("dim", 1)) % ndim
    sizes = [t.shape(r)[axis] for r in node["inputs"]]
    begins = [sum(sizes[:i]) for i in range(len(sizes))]
    why = (
        "joins the head gradient g with a value that does not "
        "depend on it: the closure is affine in g"
    )
    return [
        (i, t.add("slice_axis", [ct], axis=axis, begin=begins[i], end=begins[i] + sizes[i]))
        for i in _g_terms(t, node, linear, why)
    ]


def _flag(node: dict, name: str) -> bool:
    return node["attrs"].get(name, "False") in ("True", "1", "true")


@_rule("dot", "batch_dot", linear_in=PRODUCT)
def _dot(t, node, ct, linear):
    # y = a' b' (a' = a or a^T, b' = b or b^T): the linear factor's cotangent is the product
    # of ct with the other factor, transposed to match.
    i = _one_linear(node, linear)
    op, ta, tb = node["op"], _flag(node, "transpose_a"), _flag(node, "transpose_b")
    a, b = (t.coefficient(r) for r in node["inputs"])
    if i == 0:
        found = (
            t.add(op, [ct, b], transpose_b=not tb)
            if not ta
            else t.add(op, [b, ct], transpose_a=tb, transpose_b=True)
        )
    else:
        found = (
            t.add(op, [a, ct], transpose_a=not ta)
            if not tb
            else t.add(op, [ct, a], transpose_a=True, transpose_b=ta)
        )
    return [(i, found)]


@_rule("scatter_nd")
def _scatter(t, node, ct, linear):
    # Scattering to distinct positions <-> gathering from them.
    if linear[1]:
        raise NotLinear(node["op"], "scatters to positions that depend on the head gradient g")
    return [(0, t.add("gather_nd", [ct, t.coefficient(node["inputs"][1])]))]


def _ints(text: str) -> tuple[int, ...]:
    text = str(text).strip("()[] ")
    return tuple(int(p) for p in text.split(",") if p.strip()) if text else ()


def transpose(
    nodes: list[dict],
    linear: list[bool],
    seeds: list[tuple[Ref, Ref]],
    sources: list[Ref],
    t: Transposer,
) -> dict[Ref, Ref | None]:
    """Cotangents of ``sources`` (the ``g`` refs) given cotangents ``seeds`` at the outputs.

    ``nodes``: the traced graph (refs ``("node", k, j)`` into it, or source refs);
    ``linear[k]``: whether node ``k`` depends on ``g``; ``seeds``: (output ref, its
    cotangent) pairs.  Cotangents summed from
    several uses are added.  Raises :class:`NotLinear`.
    """
    pending: dict[Ref, list[Ref]] = {}
    for ref, ct in seeds:
        pending.setdefault(ref, []).append(ct)

    def total(ref):
        parts = pending.pop(ref, [])
        if len(parts) <= 1:
            return parts[0] if parts else None
        return t.add("add_n", parts, num_args=len(parts))

    for k in range(len(linear) - 1, -1, -1):
        if not linear[k]:
            continue
        node = nodes[k]
        if any(("node", k, j) in pending for j in range(1, 8)):
            raise NotLinear(node["op"], "has several outputs that the closure uses (no rule)")
        ct = total(("node", k, 0))
        if ct is None:
            continue
        rule = TRANSPOSE.get(node["op"])
        if rule is None:
            raise NotLinear(
                node["op"],
                "is applied to a value that depends on the head "
                "gradient g, and has no transposition rule (it may not be linear "
                "in g)",
            )
        lin = [_is_linear(r, linear, sources) for r in node["inputs"]]
        for i, c in rule(t, dict(node, out=("node", k, 0)), ct, lin):
            pending.setdefault(node["inputs"][i], []).append(c)
    return {s: total(s) for s in sources}


def _is_linear(ref: Ref, linear: list[bool], sources: list[Ref]) -> bool:
    return ref in sources or (ref[0] == "node" and linear[ref[1]])


def nonlinear_use(
    nodes: list[dict], linear: list[bool], heads: list[Ref], sources: list[Ref]
) -> NotLinear | None:
    """The first node on the way from ``g`` to ``heads`` that is not linear in ``g`` by its
    :data:`LINEAR_IN` entry (or has none), as the :class:`NotLinear` to raise; None when
    every one is.  Static: read from the graph, whatever values it was traced on."""
    seen: set[int] = set()
    stack = [h[1] for h in heads if h[0] == "node" and linear[h[1]]]
    while stack:
        k = stack.pop()
        if k in seen:
            continue
        seen.add(k)
        stack.extend(r[1] for r in nodes[k]["inputs"] if r[0] == "node" and linear[r[1]])
    for k in sorted(seen):
        node = nodes[k]
        lin = [i for i, r in enumerate(node["inputs"]) if _is_linear(r, linear, sources)]
        kind = LINEAR_IN.get(node["op"])
        if kind is None:
            return NotLinear(
                node["op"],
                "is applied to the head gradient g and is not linear "
                "in it (or has no linearity rule)",
            )
        if kind == PRODUCT and len(lin) > 1:
            return NotLinear(
                node["op"], "multiplies two values that both depend on the head gradient g"
            )
        if kind not in (SUM, PRODUCT) and any(i not in kind for i in lin):
            return NotLinear(
                node["op"],
                f"takes the head gradient g in operand {lin[0]}, in which it is not linear",
            )
    return None
