"""Running a port's graph: MXNet operator nodes evaluated through one framework's rule table.

A graph here is the JSON form of :class:`customop.symbol_json.NativeGraph`: ``nodes``
in topological order (``{"op", "attrs", "inputs"}``, each input ``["in", i]`` or
``["node", k, output]``) and ``heads``.  :func:`compile_graph` turns it into a Python
function of the framework's arrays: one call of a rule per node, looked up once.  The
rules are the only framework code; this module imports neither MXNet nor torch nor jax.

Two MXNet operators carry the training graph's meaning and are the runner's own:
``BlockGrad`` (the framework's stop-gradient, a rule like the others) and ``make_loss``,
whose value passes through and whose gradient ignores the head gradient: the runner
hands its values back as losses, which the caller differentiates with a cotangent of ones
(MXNet's ``make_loss`` backward, ``grad_scale`` 1).
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Sequence
from typing import Any, Callable  # noqa: UP035 - Callable[...] evaluated at run time (3.8)


class PortError(Exception):
    """A port that cannot be built or called: the message names the op and why."""


def port_error(op_type: str, msg: str, cls: type = PortError) -> Exception:
    """An error in the house's shape: ``customop 'ops.x' (port): ...``."""
    return cls(f"customop {op_type!r} (port): {msg}")


FRAMEWORKS = ("torch", "torchvision", "jax", "jaxlib")  # what the `port` extra installs


def framework_module(name: str, caller: str) -> Any:
    """``customop.port.<name>`` (a module importing torch or jax), or an ImportError that
    names ``caller`` and the extra to install, where the framework is missing."""
    try:
        return importlib.import_module(f"{__package__}.{name}")
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in FRAMEWORKS:
            raise
        raise ImportError(
            f"{caller} needs {exc.name}, which is not installed: pip install "
            "'customop[port]' (torch, torchvision and jax)",
            name=exc.name,
        ) from None


class Attrs:
    """An MXNet node's attributes (strings, as graph JSON keeps them), read by type."""

    __slots__ = ("raw", "_parsed")

    def __init__(self, raw: dict[str, str]):
        self.raw = raw
        self._parsed: dict[str, Any] = {}  # parsed once: rules read them on every call

    def __contains__(self, name: str) -> bool:
        return name in self.raw

    def value(self, name: str, default: Any = None) -> Any:
        if name not in self.raw:
            return default
        if name in self._parsed:
            return self._parsed[name]
        text = str(self.raw[name])
        if text in ("None", "none"):
            found = None
        else:
            try:  # literals only (numbers, tuples, booleans): never code
                found = ast.literal_eval(text) if len(text) < 4096 else text
            except (ValueError, SyntaxError):
                found = text
        self._parsed[name] = found
        return found

    def int(self, name: str, default: Any = None) -> Any:
        v = self.value(name, default)
        return None if v is None else int(v)

    def float(self, name: str, default: Any = None) -> Any:
        v = self.value(name, default)
        return None if v is None else float(v)

    def bool(self, name: str, default: bool = False) -> bool:
        v = self.value(name, default)
        return v.lower() in ("true", "1") if isinstance(v, str) else bool(v)

    def str(self, name: str, default: Any = None) -> Any:
        return str(self.raw[name]) if name in self.raw else default

    def shape(self, name: str, default: Any = ()) -> tuple:
        v = self.value(name, default)
        if v is None:
            return ()
        return tuple(v) if isinstance(v, (tuple, list)) else (v,)

    def axes(self, name: str = "axis") -> Any:
        """``axis`` as None (all axes), an int or a tuple of ints."""
        v = self.value(name, None)
        if v is None or v == ():
            return None
        return tuple(v) if isinstance(v, (tuple, list)) else int(v)


Rule = Callable[..., Any]


# MXNet's scalar arithmetic: the same Python operators on torch tensors and jax arrays
# (each table wraps them with its own way of making the scalar)
SCALAR_ARITHMETIC: dict[str, Callable[[Any, Any], Any]] = {
    "_plus_scalar": lambda x, s: x + s,
    "_minus_scalar": lambda x, s: x - s,
    "_rminus_scalar": lambda x, s: s - x,
    "_mul_scalar": lambda x, s: x * s,
    "_div_scalar": lambda x, s: x / s,
    "_rdiv_scalar": lambda x, s: s / x,
    "_power_scalar": lambda x, s: x**s,
    "_rpower_scalar": lambda x, s: s**x,
}


def reduce_axes(a: Attrs, ndim: int, exclude: bool = False) -> tuple | None:
    """A reduction's ``axis`` attribute as non-negative axes (None: all of them);
    ``exclude``: the axes not named, as MXNet's ``exclude=True``."""
    axes = a.axes("axis")
    if axes is None:
        return None
    axes = (axes,) if isinstance(axes, int) else axes
    axes = tuple(x % ndim for x in axes)
    if exclude:
        axes = tuple(i for i in range(ndim) if i not in axes)
    return axes


def mx_reshape(shape: Sequence[int], spec: Sequence[int], reverse: bool = False) -> tuple:
    """The target shape of MXNet's ``Reshape`` with its special codes 0, -1, -2, -3, -4."""
    src, spec = list(shape), list(spec)
    if reverse:
        src, spec = src[::-1], spec[::-1]
    out: list[int] = []
    i = j = 0
    infer = -1
    while j < len(spec):
        s = spec[j]
        if s == 0:
            out.append(src[i])
            i += 1
        elif s == -1:
            infer = len(out)
            out.append(-1)
            i += 1
        elif s == -2:
            out.extend(src[i:])
            i = len(src)
        elif s == -3:
            out.append(src[i] * src[i + 1])
            i += 2
        elif s == -4:
            a, b = spec[j + 1], spec[j + 2]
            d = src[i]
            if a == -1:
                a = d // b
            if b == -1:
                b = d // a
            out.extend([a, b])
            i += 1
            j += 2
        else:
            out.append(s)
            i += 1
        j += 1
    if reverse:
        out = out[::-1]
        if infer >= 0:
            infer = len(out) - 1 - infer
    if infer >= 0:
        total = 1
        for d in shape:
            total *= d
        known = 1
        for k, d in enumerate(out):
            if k != infer:
                known *= d
        out[infer] = total // known if known else 0
    return tuple(out)


# operators whose two calls with equal inputs may differ: never merged by :func:`simplify`
_IMPURE = ("random", "sample", "shuffle", "dropout")


def simplify(graph: dict[str, Any]) -> dict[str, Any]:
    """``graph`` with common subexpressions merged and dead nodes dropped.

    Two nodes with the same operator, attributes and inputs become one (a closure often
    recomputes what the forward has, e.g. ``_mul_scalar(x, -1)``); a node that neither a
    head nor a ``make_loss`` reaches is dropped.  Random operators are never merged.  The
    values of the heads and losses are unchanged: only repeated work goes.
    """
    nodes, remap, seen, kept = graph["nodes"], {}, {}, []

    def ref(r: Sequence[Any]) -> tuple:
        return ("in", r[1]) if r[0] == "in" else ("node", remap[r[1]], r[2])

    for k, node in enumerate(nodes):
        inputs = [ref(r) for r in node["inputs"]]
        attrs = dict(node.get("attrs") or {})
        key = (node["op"], tuple(sorted(attrs.items())), tuple(inputs))
        pure = node["op"] != "make_loss" and not any(w in node["op"].lower() for w in _IMPURE)
        if pure and key in seen:
            remap[k] = seen[key]
            continue
        remap[k] = seen[key] = len(kept)
        kept.append({"op": node["op"], "attrs": attrs, "inputs": inputs})
    heads = [ref(h) for h in graph["heads"]]
    live = {h[1] for h in heads if h[0] == "node"}
    live.update(k for k, node in enumerate(kept) if node["op"] == "make_loss")
    for k in range(len(kept) - 1, -1, -1):
        if k in live:
            live.update(r[1] for r in kept[k]["inputs"] if r[0] == "node")
    order = {k: n for n, k in enumerate(sorted(live))}

    def renumber(r: tuple) -> list:
        return ["in", r[1]] if r[0] == "in" else ["node", order[r[1]], r[2]]

    return {
        "nodes": [
            {
                "op": kept[k]["op"],
                "attrs": kept[k]["attrs"],
                "inputs": [renumber(r) for r in kept[k]["inputs"]],
            }
            for k in sorted(live)
        ],
        "heads": [renumber(h) for h in heads],
    }


def compile_graph(
    graph: dict[str, Any], rules: dict[str, Rule], op_type: str
) -> Callable[[Sequence[Any]], tuple[list[Any], list[Any]]]:
    """``run(inputs) -> (heads, losses)`` for ``graph`` with ``rules`` (MXNet op -> rule).

    The graph is :func:`simplify`-ed first.  An operator without a rule is a
    :class:`PortError` naming it and the op, raised here, before anything runs.  Each
    node's arguments are resolved to slots here, once, and the nodes become one
    straight-line function, so a call costs one rule call per node and no lookups.
    """
    for k, node in enumerate(graph["nodes"]):  # named against the graph as extracted
        if node["op"] != "make_loss" and node["op"] not in rules:
            raise port_error(
                op_type,
                (
                    f"MXNet operator {node['op']!r} (node {k} of its graph) has no translation "
                    f"in this framework's rule table; the op cannot be ported there"
                ),
            )
    graph = simplify(graph)
    nodes = graph["nodes"]
    n_in = 1 + max(
        [r[1] for nd in nodes for r in nd["inputs"] if r[0] == "in"]
        + [h[1] for h in graph["heads"] if h[0] == "in"]
        + [-1]
    )
    # slot of node k's output 0: n_in + k; outputs j > 0 that are read get slots after those
    extra: dict[tuple[int, int], int] = {}
    for r in [r for nd in nodes for r in nd["inputs"]] + list(graph["heads"]):
        if r[0] == "node" and r[2] != 0 and (r[1], r[2]) not in extra:
            extra[(r[1], r[2])] = n_in + len(nodes) + len(extra)

    def slot(r: Sequence[Any]) -> int:
        if r[0] == "in":
            return r[1]
        return n_in + r[1] if r[2] == 0 else extra[(r[1], r[2])]

    steps = []
    for k, node in enumerate(nodes):
        rule = None if node["op"] == "make_loss" else rules[node["op"]]
        more = tuple((j, s) for (i, j), s in extra.items() if i == k)
        steps.append(
            (
                rule,
                Attrs(dict(node["attrs"])),
                tuple(slot(r) for r in node["inputs"]),
                n_in + k,
                more,
            )
        )
    heads = [slot(h) for h in graph["heads"]]
    return _straight_line(steps, heads, n_in)


def _straight_line(steps: list, heads: list, n_in: int) -> Callable:
    """The steps as one Python function, a local per value: no per-node loop, list or
    unpacking (the runner's own share of a small eager call, about 1 us a node).  Its text
    holds only slot numbers this module made; the rules and attributes are bound as its
    globals, never read from a graph as code.  A rule with a ``bind(attrs)`` is bound to
    its node's attributes here and called with the arrays alone."""
    numbers = [n_in, *heads] + [
        i
        for _, _, args, at, more in steps
        for i in (*args, at, *(x for pair in more for x in pair))
    ]
    if not all(type(i) is int for i in numbers):  # (portfile checks the file's references)
        raise ValueError("a port graph's references must be integers")
    env: dict[str, Any] = {"_SEQ": (tuple, list)}
    used = sorted(
        {i for _, _, args, _, _ in steps for i in args if i < n_in} | {h for h in heads if h < n_in}
    )
    lines = ["def run(inputs):", "    losses = []"]
    lines += [f"    s{i} = inputs[{i}]" for i in used]
    for k, (rule, attrs, args, at, more) in enumerate(steps):
        if rule is None:  # make_loss: its value passes through and is a loss
            lines += [f"    s{at} = s{args[0]}", f"    losses.append(s{at})"]
            continue
        bind = getattr(rule, "bind", None)
        if bind is not None:  # the attributes read once, here
            env[f"r{k}"] = bind(attrs)
            call = ", ".join(f"s{i}" for i in args)
        else:
            env[f"r{k}"], env[f"a{k}"] = rule, attrs
            call = ", ".join([f"a{k}"] + [f"s{i}" for i in args])
        lines += [f"    s{at} = r{k}({call})", f"    if isinstance(s{at}, _SEQ):"]
        lines += [f"        s{slot} = s{at}[{j}]" for j, slot in more]
        lines += [f"        s{at} = s{at}[0]"]
    lines.append(f"    return [{', '.join(f's{h}' for h in heads)}], losses")
    exec(compile("\n".join(lines), "<customop port graph>", "exec"), env)  # noqa: S102
    return env["run"]


class Split:
    """A training graph cut in two at build time (:func:`split_linear`).

    ``primal``: a graph of the inputs whose heads are the op's outputs ``F_k`` followed by
    the coefficients (the closures' ``g``-free values, saved as residuals).  ``linear``: a
    graph of the seeds (one per differentiated input, ``record.grads`` order) and then the
    coefficients, whose heads are the outputs' terms linear in the seeds; ``terms[k]`` is
    the index of output ``k``'s term among them, or None (no gradient).  ``mul[k]``, where
    every term is one ``elemwise_mul(seed, coefficient)``: ``(seed, coefficient)`` of
    output ``k``, whose gradient is then ``g_k * coefficient`` with no graph to run.
    """

    __slots__ = ("primal", "n_out", "coefficients", "linear", "terms", "mul", "runs")

    def __init__(self, primal, n_out, coefficients, linear, terms, mul):
        self.primal, self.n_out, self.coefficients = primal, n_out, coefficients
        self.linear, self.terms, self.mul = linear, terms, mul
        self.runs: Any = None  # what a framework compiled of it


# operators that read these arguments for their shape only: no gradient flows there
_SHAPE_ONLY = {
    "zeros_like": (0,),
    "ones_like": (0,),
    "shape_array": (0,),
    "size_array": (0,),
    "reshape_like": (1,),
    "broadcast_like": (1,),
}


def _is_seed(nodes: list, nd: dict, grads: Sequence[int]) -> bool:
    ins = nd["inputs"]
    return (
        nd["op"] == "elemwise_sub"
        and len(ins) == 2
        and ins[0][0] == "in"
        and ins[0][1] in grads
        and ins[1][0] == "node"
        and nodes[ins[1][1]]["op"] == "BlockGrad"
        and list(nodes[ins[1][1]]["inputs"]) == [["in", ins[0][1]]]
    )


def split_linear(graph: dict[str, Any], grads: Sequence[int]) -> Split | None:
    """``graph`` (a training graph as :mod:`customop.graphs.backward` builds it: each
    output ``F_k(stop(x)) + h_k(x - stop(x))``, ``h_k`` linear) as a :class:`Split`, or
    None where it is not of that form (a ``make_loss``, an input whose gradient flows
    through the forward itself, an output not written ``F + h``).

    The gradient is unchanged: the same operators on the same coefficient values, only
    computed in the forward and kept instead of run again; the outputs' values are
    ``F_k`` (``h_k`` of the zero seed, the value ``x - stop(x)``, adds nothing but
    ``0 * coefficient``).
    """
    g = simplify(graph)
    nodes, grads = g["nodes"], list(grads)
    seeds: dict[int, int] = {}
    for k, nd in enumerate(nodes):
        if nd["op"] == "make_loss":
            return None
        if _is_seed(nodes, nd, grads):
            seeds[k] = grads.index(nd["inputs"][0][1])
        elif nd["op"] != "BlockGrad" and any(
            r[0] == "in" and r[1] in grads and j not in _SHAPE_ONLY.get(nd["op"], ())
            for j, r in enumerate(nd["inputs"])
        ):
            return None  # that input's gradient is the forward's own
    tainted = set(seeds)
    for k, nd in enumerate(nodes):
        if k not in seeds and any(r[0] == "node" and r[1] in tainted for r in nd["inputs"]):
            if nd["op"] == "BlockGrad":
                return None
            tainted.add(k)
    if not seeds:
        return None
    values, parts = [], []  # per output: F's ref, h's ref (or None)
    for h in g["heads"]:
        if h[0] == "in":
            if h[1] in grads:
                return None
            values.append(h)
            parts.append(None)
        elif h[1] not in tainted:
            values.append(h)
            parts.append(None)
        else:
            nd = nodes[h[1]]
            hit = [r[0] == "node" and r[1] in tainted for r in nd["inputs"]]
            if nd["op"] != "elemwise_add" or sum(hit) != 1 or h[2] != 0:
                return None
            values.append(nd["inputs"][hit.index(False)])
            parts.append(nd["inputs"][hit.index(True)])
    coefficients: list[tuple] = []
    where: dict[tuple, int] = {}
    m = len(grads)

    def outside(r) -> list:  # an untainted value the linear part reads: a coefficient
        key = tuple(r)
        if key not in where:
            where[key] = len(coefficients)
            coefficients.append(key)
        return ["in", m + where[key]]

    lin_nodes, moved = [], {}

    def ref(r) -> list:
        if r[0] == "node" and r[1] in seeds:
            return ["in", seeds[r[1]]]
        if r[0] == "node" and r[1] in tainted:
            return ["node", moved[r[1]], r[2]]
        return outside(r)

    needed = {p[1] for p in parts if p is not None}
    for k in range(len(nodes) - 1, -1, -1):  # only what the terms read
        if k in needed and k not in seeds:
            needed.update(r[1] for r in nodes[k]["inputs"] if r[0] == "node")
    for k, nd in enumerate(nodes):
        if k in tainted and k not in seeds and k in needed:
            moved[k] = len(lin_nodes)
            lin_nodes.append(
                {
                    "op": nd["op"],
                    "attrs": dict(nd.get("attrs") or {}),
                    "inputs": [ref(r) for r in nd["inputs"]],
                }
            )
    lin_heads, terms = [], []
    for p in parts:
        if p is None:
            terms.append(None)
        else:
            terms.append(len(lin_heads))
            lin_heads.append(ref(p))
    mul: list | None = []
    for p in parts:
        if p is None:
            mul.append(None)
            continue
        nd = nodes[p[1]] if p[0] == "node" and p[1] not in seeds else None
        ins = nd["inputs"] if nd is not None and nd["op"] == "elemwise_mul" else []
        kinds = [r[0] == "node" and r[1] in seeds for r in ins]
        if (
            len(ins) != 2
            or sum(kinds) != 1
            or any(r[0] == "node" and r[1] in tainted and r[1] not in seeds for r in ins)
        ):
            mul = None
            break
        s, c = (ins[0], ins[1]) if kinds[0] else (ins[1], ins[0])
        mul.append((seeds[s[1]], where[tuple(c)]))

    def through(r) -> list:  # the primal is never differentiated: BlockGrad passes
        while r[0] == "node" and nodes[r[1]]["op"] == "BlockGrad":
            r = nodes[r[1]]["inputs"][0]
        return list(r)

    primal = {
        "nodes": [
            {"op": nd["op"], "attrs": nd["attrs"], "inputs": [through(r) for r in nd["inputs"]]}
            for nd in nodes
        ],
        "heads": [through(v) for v in values] + [through(c) for c in coefficients],
    }
    linear = {"nodes": lin_nodes, "heads": lin_heads}
    return Split(primal, len(values), len(coefficients), linear, terms, mul)
