"""What a spliced graph does without: ``BlockGrad`` nodes that stop nothing, checks of constants.

A graph with our ops inlined (:mod:`customop.graphs.splice`) carries each op's fragment as
traced: a ``BlockGrad`` on every value that must carry no gradient, and each
:func:`customop.require` check as a NaN-or-1 factor multiplied into the op's outputs.
In the whole graph some of these do nothing:

* a ``BlockGrad`` above values no variable's gradient can reach (a check's flag,
  an ``argmax``, a shape), or below which no gradient comes back (a label read only
  through comparisons);
* a check whose condition reads only constants the graph makes itself (``sigma``
  written ``F.full((1,), 3.0)``): it holds or fails the same on every call.  One that
  holds is evaluated once, here, and its factor (exactly 1) is dropped.
* a node that repeats an earlier one where no gradient passes through them, and an
  operator that returns its input bit for bit (:data:`IDENTITIES`).

The rewrites are one table, :data:`RULES`, run in order by :func:`tidied`.
Each dropped node is an operator call less in every step (what that saves is in
``docs/design.md``, "Tidying spliced graphs").  Nothing computed changes: the gradient
a dropped ``BlockGrad`` stopped was zero, a dropped factor was 1.  Which operators pass a
gradient where is read from :data:`customop.graphs.rules.NO_GRADIENT` and
:data:`customop.graphs.rules.PASS_GRADIENT`.
"""

from __future__ import annotations

import json
import math
import threading
from typing import Any, Callable, NamedTuple

import numpy as np

from .. import budget, symbol_json
from . import rules, saved_constants, saved_tidy

# MXNet operators without inputs whose output is a function of their attributes
_CONSTANT_SOURCES = frozenset({"_full", "_zeros", "_ones", "_arange"})
# MXNet operators whose gradients the two tables describe
_KNOWN = rules.PASS_GRADIENT | frozenset(rules.NO_GRADIENT)


def tidied(graph: dict[str, Any], shapes: dict[str, tuple] | None = None) -> dict[str, Any]:
    """``graph`` rewritten by each rule of :data:`RULES` in turn (``shapes``: by input name,
    the signature the graph is settled for; the rules that need one are skipped without).

    The rules before the first settled one read the graph alone, so their result is kept
    per graph (:func:`unsettled`): a new signature of a shape family, whose spliced graph
    is the same, runs only the settled rules.
    """
    first = next((k for k, rule in enumerate(RULES) if rule.settled), len(RULES))
    graph = unsettled(graph, first)
    for rule in RULES[first:]:
        if not rule.settled:
            graph = rule.rewrite(graph)
        elif shapes is not None:
            graph = rule.rewrite(graph, shapes)
    return graph


# Graphs rewritten by RULES[:count] (no settled rule among them), by the graph's text and
# count, under the memory budget of customop.budget: an entry costs its key's text
# and the rewritten graph (estimated at that text again).
_unsettled = budget.Table()
_unsettled_lock = threading.Lock()


def unsettled(graph: dict[str, Any], count: int) -> dict[str, Any]:
    """``graph`` rewritten by the first ``count`` rules of :data:`RULES` (none settled),
    computed once per graph: the rules read nothing but the graph (constants they evaluate
    are made inside it), and return new graphs without changing the ones they read."""
    rules_run = RULES[:count]
    with _unsettled_lock:  # the same graph object (customop.graphs.splice keeps one a family)
        same = _unsettled.recall((id(graph), rules_run))
    if same is not None and same[0] is graph:
        return same[1]
    text = json.dumps(graph, sort_keys=True)
    key = (text, rules_run)
    with _unsettled_lock:
        found = _unsettled.recall(key)
    if found is None:  # (an earlier process's: customop.graphs.saved_tidy)
        names = [rule.name for rule in rules_run]
        found = saved_tidy.recalled(graph, text, names)
        if found is None:
            found = graph
            for rule in rules_run:
                found = rule.rewrite(found)
            saved_tidy.keep(text, names, found)
        with _unsettled_lock:
            _unsettled.keep(key, found, budget.RECALLED + 2 * len(text))
    with _unsettled_lock:
        _unsettled.keep((id(graph), rules_run), (graph, found), budget.RECALLED + 2 * len(text))
    return found


def clear_cache() -> None:
    """Forget every tidied graph and plan (tests)."""
    with _unsettled_lock:
        _unsettled.clear()
    with _plans_lock:
        _plans.clear()


def idle_block_grads(graph: dict[str, Any]) -> dict[str, Any]:
    """``graph`` without the ``BlockGrad`` nodes that stop no gradient (heads stay).

    Two passes, the second on what the first leaves: first those above values no variable's
    gradient can reach (dropping them leaves every value as free as it was), then those no
    gradient comes back to (dropping them leaves every gradient where it was).  Judged at
    once, each kind can vouch for dropping the other: an output layer's stopped coefficient
    above its stopped label would then hand the label a gradient.
    """
    free = _free(graph["nodes"])
    graph = _replaced(graph, _block_grads(graph, lambda i, node: free[node["inputs"][0][0]]))
    # (make_loss, SoftmaxOutput, a Custom output layer: any unknown operator makes a gradient)
    back = _gradient_comes_back(graph)
    return _replaced(graph, _block_grads(graph, lambda i, node: not back[i]))


def _block_grads(graph: dict[str, Any], idle: Callable[[int, dict], bool]) -> dict[int, list]:
    # the BlockGrad nodes (not heads) that idle(i, node) names, each to the entry it passes on
    heads = {h[0] for h in graph["heads"]}
    return {
        i: node["inputs"][0]
        for i, node in enumerate(graph["nodes"])
        if node["op"] == "BlockGrad" and i not in heads and idle(i, node)
    }


def constant_checks(graph: dict[str, Any]) -> dict[str, Any]:
    """``graph`` without the NaN-or-1 factors (``flag / flag``) of checks of constants that hold.

    A factor's ``Cast``/``Reshape``/``expand_dims``/``broadcast_like`` copies are 1 too;
    ``elemwise_mul(x, one)``, and ``broadcast_mul(x, one)`` by a 1-element one, are ``x``.
    """
    nodes = graph["nodes"]
    constant = _constant(nodes)
    ones: dict[int, bool] = {}  # node -> it is exactly 1 (True: of shape (1,))
    for i, node in enumerate(nodes):
        op, ins = node["op"], node["inputs"]
        if op in ("broadcast_div", "elemwise_div") and constant[i] and ins[0][:2] == ins[1][:2]:
            if _holds(nodes, i):
                ones[i] = True
        elif op in ("Cast", "Reshape", "expand_dims", "broadcast_like") and ins[0][0] in ones:
            ones[i] = ones[ins[0][0]] and op == "Cast"
    if not ones:
        return graph
    gone: dict[int, list] = {}
    heads = {h[0] for h in graph["heads"]}  # (a head keeps its node: the output's name)
    for i, node in enumerate(nodes):
        ins = node["inputs"]
        if i not in heads and node["op"] in ("elemwise_mul", "broadcast_mul"):
            for k in (0, 1):
                one = ins[1 - k][0]
                if one in ones and (node["op"] == "elemwise_mul" or ones[one]):
                    gone[i] = ins[k]
                    break
    return symbol_json.reachable(_replaced(graph, gone)) if gone else graph


# broadcast operator -> (scalar operator with the constant on the right, on the left)
_SCALAR_FORMS = {
    "broadcast_mul": ("_mul_scalar", "_mul_scalar"),
    "broadcast_add": ("_plus_scalar", "_plus_scalar"),
    "broadcast_div": ("_div_scalar", "_rdiv_scalar"),
    "broadcast_sub": ("_minus_scalar", "_rminus_scalar"),
}


def constant_scalars(graph: dict[str, Any]) -> dict[str, Any]:
    """``graph`` where a broadcast operator meets a 1-element constant the graph makes itself
    (``smooth_l1``'s ``sigma * sigma`` of an ``F.full`` sigma) as that operator's scalar form:
    the same values (MXNet computes a scalar operator in the array's dtype), one operator
    instead of a broadcast and the constant's own."""
    nodes = graph["nodes"]
    constant = _constant(nodes)
    values: dict[tuple, Any] = {}
    changed = []
    for i, node in enumerate(nodes):
        forms = _SCALAR_FORMS.get(node["op"])
        ins = node["inputs"]
        if forms is None or constant[i] or len(ins) != 2:
            continue
        for k in (1, 0):
            if constant[ins[k][0]] and not constant[ins[1 - k][0]]:
                key = tuple(ins[k][:2])
                if key not in values:  # evaluated once, and only when it is one element
                    shape = _shapes(nodes, [key], {})
                    values[key] = (
                        None if shape is None or int(np.prod(shape[0])) != 1 else _value(nodes, key)
                    )
                if values[key] is not None:
                    scalar = repr(float(values[key].reshape(-1)[0]))
                    kept = {a: v for a, v in symbol_json.attrs(node).items() if a[:2] == "__"}
                    changed.append(
                        (
                            i,
                            {
                                "op": forms[1 - k],
                                "name": node["name"],
                                "attrs": dict(kept, scalar=scalar),
                                "inputs": [ins[1 - k]],
                            },
                        )
                    )
                break
    if not changed:
        return graph
    new = list(nodes)
    for i, node in changed:
        new[i] = node
    return symbol_json.reachable(dict(graph, nodes=new))


def argmax_indices(graph: dict[str, Any], shapes: dict[str, tuple]) -> dict[str, Any]:
    """``graph`` without the clipping and the check of indices that are ``argmax`` outputs over
    an axis as long as the one they index, at the signature ``shapes`` the graph is settled
    for (a hybridized block, a bind: each signature its own graph; not for exports, which
    serve other shapes).

    What each MXNet operator keeps of such an index is one entry of :data:`INDEX_FACTS`:
    ``broadcast_minimum(maximum(m, 0), max(arange_like(refs, axis=1)))`` is ``m``, an
    integer in ``[0, M)``; then ``floor(m)`` is ``m``, ``where(c, m, m)`` is ``m``, ``m ==
    m`` is 1 (never NaN), so is ``ok / ok`` and its copies, and a product by them is the
    other factor.  Up to 2048 (every float dtype counts that far exactly).  (A detection
    head's ``argmax`` of IoU as ``matches``, as in ``ops.box_encode``, is such an index.)
    """
    plan = _argmax_plan(graph)
    if not plan.asked:
        return plan.result
    known = _entry_shapes(plan, shapes)

    def holds(entries, test):
        found = [known[e] if e in known else _shape(graph["nodes"], e, shapes) for e in entries]
        return all(f is not None for f in found) and test(found)

    if all(holds(entries, test) for entries, test in plan.asked):
        return plan.result  # the scan takes the plan's path
    return _aliased(graph, _argmax_aliases(graph["nodes"], holds))


class _ArgmaxPlan(NamedTuple):
    graph: dict[str, Any]  # the graph planned for (kept: its id is the plan's key)
    asked: list  # (entries, test of their shapes) of each question the scan asked
    part: Any  # a Symbol whose outputs are the asked entries (None: none asked)
    result: dict[str, Any]  # the graph rewritten where every question holds
    wanted: list  # the asked entries, each once, in the order of part's outputs
    inputs: list  # part's inputs' names (read once: each signature's shape pass gives them)


# argmax_indices' plans by graph: the graph the unsettled rules leave is one object per spliced
# graph (unsettled's table), so a shape family's new signature finds its plan.  Under the
# memory budget of customop.budget.
_plans = budget.Table()
_plans_lock = threading.Lock()


def _argmax_plan(graph: dict[str, Any]) -> _ArgmaxPlan:
    # The scan with every question about shapes answered "it holds": the entries whose shapes
    # it asks about, and the graph it gives when they hold (at a signature where every one
    # does, the scan takes the same path).
    with _plans_lock:
        found = _plans.recall(id(graph))
    if found is not None and found.graph is graph:
        return found
    asked: list = []

    def assume(entries, test):
        asked.append((tuple(entries), test))
        return True

    result = _aliased(graph, _argmax_aliases(graph["nodes"], assume))
    wanted = list(dict.fromkeys(e for entries, _ in asked for e in entries))
    part = None
    if wanted:
        heads = [[e[0], e[1], 0] for e in wanted]
        part = symbol_json.load(symbol_json.reachable({"nodes": graph["nodes"], "heads": heads}))
    inputs = part.list_inputs() if part is not None else []
    plan = _ArgmaxPlan(graph, asked, part, result, wanted, inputs)
    with _plans_lock:
        _plans.keep(id(graph), plan, budget.RECALLED + 400 * len(graph["nodes"]))
    return plan


def _aliased(graph: dict[str, Any], alias: dict[int, list]) -> dict[str, Any]:
    heads = {h[0] for h in graph["heads"]}
    alias = {i: e for i, e in alias.items() if i not in heads}
    return symbol_json.reachable(_replaced(graph, alias)) if alias else graph


def _argmax_aliases(nodes, holds) -> dict[int, list]:
    # argmax_indices' scan: node -> the entry it equals.  ``holds(entries, test)``: whether
    # these entries' shapes are known and pass ``test`` (a list of shapes -> bool).
    facts = _IndexFacts(nodes, holds)
    for i, node in enumerate(nodes):
        rule = INDEX_FACTS.get(node["op"])
        if rule is not None:
            rule(facts, i, node, [facts.at(e) for e in node["inputs"]])
    return facts.alias


class _IndexFacts:
    # what argmax_indices knows of a graph's entries, node by node
    def __init__(self, nodes: list[dict[str, Any]], holds: Callable[..., bool]):
        # holds(entries, test): whether these entries' shapes are known and pass test
        self.nodes, self.holds = nodes, holds
        self.alias: dict[int, list] = {}  # node -> the entry it equals
        self.integral: set[tuple] = set()  # entries holding integers, never NaN (argmax's)
        self.ones: set[int] = set()  # nodes whose every element is 1

    def at(self, e):
        while e[0] in self.alias:
            e = self.alias[e[0]]
        return (e[0], e[1])


def _argmax(f: _IndexFacts, i: int, node: dict, ins: list) -> None:
    if symbol_json.attrs(node).get("keepdims", "False") in ("False", "0"):
        f.integral.add((i, 0))


def _clipped(f: _IndexFacts, i: int, node: dict, ins: list) -> None:
    if f.nodes[ins[0][0]]["op"] == "_maximum_scalar":
        m = f.at(f.nodes[ins[0][0]]["inputs"][0])
        if m in f.integral and _argmax_in_range(f.nodes, ins, m, f.holds):
            f.alias[i] = list(m)


def _floor(f: _IndexFacts, i: int, node: dict, ins: list) -> None:
    if ins[0] in f.integral:
        f.alias[i] = list(ins[0])


def _where(f: _IndexFacts, i: int, node: dict, ins: list) -> None:
    if ins[1] == ins[2]:
        f.alias[i] = list(ins[1])


def _equal(f: _IndexFacts, i: int, node: dict, ins: list) -> None:
    if ins[0] == ins[1] and ins[0] in f.integral:
        f.ones.add(i)


def _ratio(f: _IndexFacts, i: int, node: dict, ins: list) -> None:
    if ins[0] == ins[1] and ins[0][0] in f.ones:
        f.ones.add(i)


def _ones_kept(f: _IndexFacts, i: int, node: dict, ins: list) -> None:
    if ins[0][0] in f.ones:
        f.ones.add(i)


def _product(f: _IndexFacts, i: int, node: dict, ins: list) -> None:
    for k in (0, 1):
        if ins[1 - k][0] in f.ones and (
            node["op"] == "elemwise_mul" or f.holds([ins[1 - k], ins[k]], _broadcasts_to)
        ):
            f.alias[i] = list(ins[k])
            break


# MXNet operator -> what it keeps of an argmax index (argmax_indices), one entry an operator
INDEX_FACTS: dict[str, Callable[..., None]] = {
    "argmax": _argmax,
    "broadcast_minimum": _clipped,
    "floor": _floor,
    "where": _where,
    "broadcast_equal": _equal,
    "_equal": _equal,
    "broadcast_div": _ratio,
    "elemwise_div": _ratio,
    "expand_dims": _ones_kept,
    "Reshape": _ones_kept,
    "Cast": _ones_kept,
    "broadcast_mul": _product,
    "elemwise_mul": _product,
}


def _argmax_in_range(nodes, ins, m, holds) -> bool:
    # ins: broadcast_minimum(_maximum_scalar(m, 0), max(arange_like(refs, axis=1))), with m
    # an argmax over an axis of length M = refs.shape[1] <= 2048
    low, high = nodes[ins[0][0]], nodes[ins[1][0]]
    if high["op"] != "max" or symbol_json.attrs(high):
        return False
    if float(symbol_json.attrs(low).get("scalar", "nan")) != 0:
        return False
    count = nodes[high["inputs"][0][0]]
    if count["op"] != "_contrib_arange_like" or symbol_json.attrs(count) != {"axis": "1"}:
        return False
    argmax = nodes[m[0]]
    axis = symbol_json.attrs(argmax).get("axis", "None")
    if axis in ("None", ""):
        return False

    def in_range(found):
        scores, refs = found
        length = scores[int(axis)]
        return len(refs) > 1 and length == refs[1] and length <= 2048

    return holds([tuple(argmax["inputs"][0][:2]), tuple(count["inputs"][0][:2])], in_range)


def _broadcasts_to(found) -> bool:
    # whether broadcasting the first shape against the second gives the second
    a, b = found
    if len(a) > len(b):
        return False
    return all(x in (1, y) for x, y in zip(a[::-1], b[::-1]))


def _entry_shapes(plan: _ArgmaxPlan, shapes) -> dict[tuple, tuple | None]:
    # the shapes of the plan's entries at the settled signature (None where unknown), from one
    # shape pass of the part of the graph that computes them
    wanted = plan.wanted
    given = {n: tuple(shapes[n]) for n in plan.inputs if n in shapes}
    try:
        _, out, _ = plan.part.infer_shape_partial(**given)
    except Exception:  # noqa: BLE001 - unknown: each is asked alone (_shape)
        return {}
    if not out or len(out) != len(wanted):
        return {}
    return {e: tuple(s) if s and all(d > 0 for d in s) else None for e, s in zip(wanted, out)}


def _shape(nodes, entry, shapes) -> tuple | None:
    found = _shapes(nodes, [entry], shapes)
    return None if found is None else found[0]


def _shapes(nodes, entries, shapes) -> list[tuple] | None:
    # the shapes of these entries at the settled signature (None where unknown)
    part = symbol_json.reachable({"nodes": nodes, "heads": [[e[0], e[1], 0] for e in entries]})
    sym = symbol_json.load(part)
    given = {n: tuple(shapes[n]) for n in sym.list_inputs() if n in shapes}
    try:
        _, out, _ = sym.infer_shape_partial(**given)
    except Exception:  # noqa: BLE001 - unknown: nothing is simplified
        return None
    if not out or any(not s or not all(d > 0 for d in s) for s in out):
        return None
    return [tuple(s) for s in out]


def _free(nodes: list[dict[str, Any]]) -> list[bool]:
    # node i's outputs carry no gradient from any variable, through PASS_GRADIENT ops only
    free: list[bool] = []
    for node in nodes:
        op, ins = node["op"], node["inputs"]
        if op == "null":
            free.append(False)
        elif op in rules.NO_GRADIENT:
            stopped = rules.NO_GRADIENT[op]
            free.append(
                stopped is None or all(free[e[0]] for k, e in enumerate(ins) if k not in stopped)
            )
        else:
            free.append(op in rules.PASS_GRADIENT and all(free[e[0]] for e in ins))
    return free


def _constant(nodes: list[dict[str, Any]]) -> list[bool]:
    # node i's outputs are the same on every call: made from constant sources only
    out: list[bool] = []
    for node in nodes:
        op, ins = node["op"], node["inputs"]
        out.append(
            op in _CONSTANT_SOURCES if not ins else op in _KNOWN and all(out[e[0]] for e in ins)
        )
    return out


def _holds(nodes: list[dict[str, Any]], i: int) -> bool:
    # whether the factor computed by node i (from constants only) is exactly 1: its check holds
    value = _value(nodes, (i, 0))
    return bool(value.size and np.all(value == 1))


def _value(nodes: list[dict[str, Any]], entry: tuple) -> np.ndarray:
    # the value of an entry computed from constants only, run once on the CPU (or read from
    # an earlier process's run: customop.graphs.saved_constants)
    part = symbol_json.reachable({"nodes": nodes, "heads": [[entry[0], entry[1], 0]]})
    return saved_constants.value_of(part)


def _replaced(graph: dict[str, Any], by: dict[int, list]) -> dict[str, Any]:
    """``graph`` with each node ``i`` of ``by`` replaced by the entry ``by[i]`` (and dropped)."""
    if not by:
        return graph
    nodes = graph["nodes"]

    def entry(e):
        while e[0] in by:
            e = by[e[0]]
        return e

    keep = [i for i in range(len(nodes)) if i not in by]
    where = {old: new for new, old in enumerate(keep)}
    out = dict(
        graph,
        nodes=[
            dict(
                nodes[i], inputs=[[where[entry(e)[0]], entry(e)[1], 0] for e in nodes[i]["inputs"]]
            )
            for i in keep
        ],
    )
    out["heads"] = [[where[entry(h)[0]], entry(h)[1], 0] for h in graph["heads"]]
    return out


# ---- common subexpressions and identities ---------------------------------------------------
def common_subexpressions(graph: dict[str, Any]) -> dict[str, Any]:
    """``graph`` with each node that repeats an earlier one (the same operator, attributes and
    inputs) read from the earlier one, where no gradient passes through the two: outputs of
    values no variable's gradient reaches, of operators that pass none (a comparison, an
    ``argmax``), or below which no gradient comes back.

    The forward is the same computation, once.  Where a gradient does pass, merging is left
    out: the backward would add the two consumers' gradients before the operator's backward
    instead of after it, which rounds differently (``(g1 + g2) * w`` against
    ``g1 * w + g2 * w``).  Only the operators of the gradient tables merge (each a
    function of its inputs and attributes: no random, stateful or ``Custom`` operator);
    a head keeps its node (the output's name).
    """
    nodes = graph["nodes"]
    free = _free(nodes)
    back = _gradient_comes_back(graph)
    heads = {h[0] for h in graph["heads"]}
    seen: dict[tuple, int] = {}
    same: dict[int, int] = {}
    for i, node in enumerate(nodes):
        op = node["op"]
        if op not in _KNOWN or not node["inputs"] or rules.RANDOM.match(op):
            continue
        silent = free[i] or rules.NO_GRADIENT.get(op, ()) is None or not back[i]
        if not silent:
            continue
        key = (
            op,
            tuple(sorted(symbol_json.attrs(node).items())),
            tuple((same.get(e[0], e[0]), e[1]) for e in node["inputs"]),
        )
        if key in seen and i not in heads:
            same[i] = seen[key]
        else:
            seen.setdefault(key, i)
    return symbol_json.reachable(_merged(graph, same)) if same else graph


def _exactly(value: float) -> Callable[[dict[str, str]], bool]:
    # the operator's ``scalar`` is ``value``, sign included (``-0.0`` is not ``0.0``)
    def test(attrs: dict[str, str]) -> bool:
        try:
            scalar = float(attrs.get("scalar", "nan"))
        except ValueError:
            return False
        return scalar == value and math.copysign(1.0, scalar) == math.copysign(1.0, value)

    return test


# operator -> test of its attributes: where it returns its input bit for bit, in the forward
# and in the backward (the gradient passes unchanged).  ``x + 0.0`` and ``x - (-0.0)`` are
# not there: they turn -0.0 into 0.0 (then ``1 / x`` is +inf, not -inf); ``x + (-0.0)`` and
# ``x - 0.0`` are exact.
IDENTITIES: dict[str, Callable[[dict[str, str]], bool]] = {
    "_copy": lambda attrs: True,
    "_mul_scalar": _exactly(1.0),
    "_div_scalar": _exactly(1.0),
    "_minus_scalar": _exactly(0.0),
    "_plus_scalar": _exactly(-0.0),
}


def identities(graph: dict[str, Any]) -> dict[str, Any]:
    """``graph`` without the operators of :data:`IDENTITIES` that return their input as it is
    (``_copy``, ``x * 1``, ``x / 1``, ``x - 0``; a head keeps its node)."""
    nodes = graph["nodes"]
    heads = {h[0] for h in graph["heads"]}
    gone = {
        i: node["inputs"][0]
        for i, node in enumerate(nodes)
        if i not in heads
        and node["op"] in IDENTITIES
        and len(node["inputs"]) == 1
        and IDENTITIES[node["op"]](symbol_json.attrs(node))
    }
    return symbol_json.reachable(_replaced(graph, gone)) if gone else graph


def _gradient_comes_back(graph: dict[str, Any]) -> list[bool]:
    # node i may be handed a gradient: from a head, or through operators that pass one from
    # an operator that makes one without a head gradient (make_loss, an unknown operator)
    nodes = graph["nodes"]
    heads = {h[0] for h in graph["heads"]}
    back = [i in heads or node["op"] not in _KNOWN for i, node in enumerate(nodes)]
    for i in range(len(nodes) - 1, -1, -1):
        if back[i]:
            stopped = rules.NO_GRADIENT.get(nodes[i]["op"], ())
            for k, e in enumerate(nodes[i]["inputs"]):
                if stopped is not None and k not in stopped:
                    back[e[0]] = True
    return back


def _merged(graph: dict[str, Any], same: dict[int, int]) -> dict[str, Any]:
    """``graph`` with the outputs of each node ``i`` of ``same`` read from node ``same[i]``."""
    nodes = graph["nodes"]
    out = dict(
        graph,
        nodes=[
            dict(node, inputs=[[same.get(e[0], e[0]), e[1], 0] for e in node["inputs"]])
            for node in nodes
        ],
    )
    out["heads"] = [[same.get(h[0], h[0]), h[1], 0] for h in graph["heads"]]
    return out


class Rule(NamedTuple):
    """One rewrite of :func:`tidied`: ``rewrite(graph)``, or with ``settled``,
    ``rewrite(graph, shapes)`` at the signature the graph is bound for."""

    name: str
    rewrite: Callable[..., dict[str, Any]]
    settled: bool = False


# the rewrites, in the order they run (each exact: the same values and gradients, bit for bit)
RULES = (
    Rule("constant-checks", constant_checks),
    Rule("constant-scalars", constant_scalars),
    Rule("idle-block-grads", idle_block_grads),
    Rule("identities", identities),
    Rule("common-subexpressions", common_subexpressions),
    Rule("argmax-indices", argmax_indices, settled=True),
)
