"""One ``exp`` for a value's whole logistic family: the port's rewrite of graphs that a
compiler fuses (JAX under ``jit``, torch under ``torch.compile``) and nobody differentiates.

A focal loss written in MXNet's operators, as :func:`ops.focal_loss` is, computes
``softrelu(x)``, ``softrelu(-x)``, ``exp(-2 softrelu(x))``, ``exp(-2 softrelu(-x))`` and its
closure ``sigmoid(x)``, ``sigmoid(-x)``: eight transcendental functions per element where
a fused kernel needs two.  :func:`rewrite` computes every such value of one ``x`` from
``e = exp(-|x|)``, ``log1p(e)`` and ``r = 1 / (1 + e)``:

==========================  =====================================
``softrelu(x)``             ``relu(x) + log1p(e)``
``softrelu(-x)``            ``relu(-x) + log1p(e)``
``sigmoid(x)``              ``r`` where ``x >= 0``, else ``e * r``
``sigmoid(-x)``             ``e * r`` where ``x >= 0``, else ``r``
``exp(-k softrelu(x))``     ``sigmoid(-x) ** k`` (``k`` = 1, 2, 3 or 4, as products)
==========================  =====================================

These are identities of real numbers, not of float32: each side is within a few ulp of
the exact value (every form is the stable one: no cancellation, tiny values kept), NaN
stays NaN and +-inf give the limits, but the bits differ.  The rewritten graph is a graph
of MXNet operators as before.  It is used only where its values are not differentiated by
the framework (the forward, and a split graph's primal part: the outputs and the closures'
coefficients), so a gradient is still the op's own closure's, evaluated in this form: the
rewrite changes how ``sigmoid(x)`` is computed, never which gradient is taken.  Eager
torch runs the graphs as they are (there each node is a pass of its own and the rewritten
graph has as many).
"""

from __future__ import annotations

from typing import Any

from .runner import simplify

_MAX_POWER = 4  # exp(-k softrelu(x)) with a larger integer k stays as it is


def _kind(node: dict[str, Any]) -> str | None:
    op, attrs = node["op"], node.get("attrs") or {}
    if op == "Activation":
        kind = str(attrs.get("act_type", ""))
        return kind if kind in ("softrelu", "sigmoid") else None
    return "sigmoid" if op == "sigmoid" else None


def _is_negation(node: dict[str, Any]) -> bool:
    if node["op"] == "negative":
        return True
    if node["op"] != "_mul_scalar":
        return False
    try:
        return float((node.get("attrs") or {}).get("scalar", "nan")) == -1.0
    except ValueError:
        return False


def _power(node: dict[str, Any]) -> int | None:
    """``k`` of a ``_mul_scalar(scalar=-k)`` node, ``k`` a small positive integer."""
    if node["op"] != "_mul_scalar":
        return None
    try:
        k = -float((node.get("attrs") or {}).get("scalar", "nan"))
    except ValueError:
        return None
    return int(k) if k in range(1, _MAX_POWER + 1) else None


def rewrite(graph: dict[str, Any]) -> dict[str, Any]:
    """``graph`` with each value's ``softrelu``, ``sigmoid`` and ``exp(-k softrelu)`` of
    itself and of its negation computed from one ``exp(-|x|)``; ``graph`` itself where it
    has none.  Only for graphs that are evaluated, never differentiated (see the module).

    Example:
        >>> g = {"nodes": [{"op": "Activation", "attrs": {"act_type": "softrelu"},
        ...                 "inputs": [["in", 0]]},
        ...                {"op": "sigmoid", "attrs": {}, "inputs": [["in", 0]]}],
        ...      "heads": [["node", 0, 0], ["node", 1, 0]]}
        >>> [n["op"] for n in rewrite(g)["nodes"]].count("exp")
        1
    """
    g = simplify(graph)
    nodes = g["nodes"]
    found: dict[int, tuple] = {}  # node -> (base ref, kind, sign, power)
    for k, nd in enumerate(nodes):
        kind = _kind(nd)
        if kind is not None and len(nd["inputs"]) == 1:
            u = tuple(nd["inputs"][0])
            if u[0] == "node" and _is_negation(nodes[u[1]]) and len(nodes[u[1]]["inputs"]) == 1:
                found[k] = (tuple(nodes[u[1]]["inputs"][0]), kind, -1, 1)
            else:
                found[k] = (u, kind, 1, 1)
        elif nd["op"] == "exp" and nd["inputs"][0][0] == "node":
            m = nd["inputs"][0][1]
            power = _power(nodes[m])
            s = nodes[m]["inputs"][0] if power else None
            if s is not None and s[0] == "node" and s[2] == 0 and s[1] in found:
                base, kind, sign, _ = found[s[1]]
                if kind == "softrelu":  # exp(-k softrelu(sign x)) = sigmoid(-sign x) ** k
                    found[k] = (base, "sigmoid", -sign, power)
    if not found:
        return graph

    out: list[dict[str, Any]] = []
    remap: dict[int, int] = {}  # old node -> its new node (a replaced one: output 0)
    shared: dict[tuple, dict[str, list]] = {}

    def ref(r) -> list:
        if r[0] == "in":
            return list(r)
        return ["node", remap[r[1]], 0 if r[1] in found else r[2]]

    def emit(op: str, inputs: list, attrs: Any = None) -> list:
        out.append({"op": op, "attrs": dict(attrs or {}), "inputs": inputs})
        return ["node", len(out) - 1, 0]

    def part(base: tuple, name: str) -> list:
        have = shared.setdefault(base, {})
        if name not in have:
            x = ref(base)
            if name == "e":  # exp(-|x|), in (0, 1]: no overflow anywhere
                made = emit("exp", [emit("_mul_scalar", [emit("abs", [x])], {"scalar": "-1.0"})])
            elif name == "log1p":
                made = emit("log1p", [part(base, "e")])
            elif name == "r":  # 1 / (1 + e), in [1/2, 1]
                made = emit(
                    "reciprocal", [emit("_plus_scalar", [part(base, "e")], {"scalar": "1.0"})]
                )
            elif name == "er":
                made = emit("elemwise_mul", [part(base, "e"), part(base, "r")])
            elif name == "up":  # x >= 0 (NaN: false, and both branches are NaN)
                made = emit("_greater_equal_scalar", [x], {"scalar": "0.0"})
            else:  # "neg": -x
                made = emit("_mul_scalar", [x], {"scalar": "-1.0"})
            have[name] = made
        return have[name]

    def value(base: tuple, kind: str, sign: int, power: int) -> list:
        if kind == "softrelu":
            side = ref(base) if sign > 0 else part(base, "neg")
            return emit("elemwise_add", [emit("relu", [side]), part(base, "log1p")])
        big, small = part(base, "r"), part(base, "er")
        s = emit("where", [part(base, "up")] + ([big, small] if sign > 0 else [small, big]))
        made = s
        for _ in range(power - 1):
            made = emit("elemwise_mul", [made, s])
        return made

    for k, nd in enumerate(nodes):
        if k in found:
            remap[k] = value(*found[k])[1]
        else:
            attrs = nd.get("attrs") or {}
            remap[k] = emit(nd["op"], [ref(r) for r in nd["inputs"]], attrs)[1]
    return simplify({"nodes": out, "heads": [ref(h) for h in g["heads"]]})
