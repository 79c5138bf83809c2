"""The native-graph rules are tables: each refusal is one named entry, and verdicts name it."""

import mxnet as mx
import numpy as np
import pytest

import customop
from customop.graphs import backward, forward, graph_verdicts, rules
from customop.graphs.graph_verdicts import EXPORT, TRAIN


@customop.customop("mxnet")
def rules_reads(x):
    return x * float(x.asnumpy().sum() > 0)


@customop.customop("mxnet")
def rules_noisy(x):
    return x + mx.nd.random.uniform(shape=x.shape)


@customop.customop("mxnet")
def rules_own_gradient(x):
    return x * 2


rules_own_gradient.def_grad(lambda ans, x: lambda g: g * g)  # not linear in g


@customop.customop("mxnet")
def rules_detached(x):
    return x + x.detach() * 2


@customop.customop("mxnet")
def rules_old_advice(x):  # a check skipped while traced: the advice of an earlier release
    if not customop.is_tracing() and (x.asnumpy() < 0).any():
        raise ValueError("x must be >= 0")
    return x * 2


@customop.customop("numpy")
def rules_numpy(x):
    return x * 2


def test_every_refusal_has_one_name_and_a_reason():
    for table in (rules.OP_REFUSALS, rules.RECORDED_REFUSALS):
        names = [r.name for r in table]
        assert len(set(names)) == len(names)
        assert all(r.reason and callable(r.test) for r in table)
    names = [r.name for r in (*rules.OP_REFUSALS, *rules.RECORDED_REFUSALS)]
    assert not set(names) & set(rules.TRACE_REFUSALS)
    assert not set(rules.NODE_REFUSALS) & (set(names) | set(rules.TRACE_REFUSALS))


@pytest.mark.parametrize(
    "op, purpose, rule",
    [
        (rules_numpy, TRAIN, "numpy-mode"),
        (rules_own_gradient, TRAIN, "closure-not-linear"),
        (rules_reads, EXPORT, "reads-values"),
        (rules_old_advice, TRAIN, "asks-is-tracing"),
        (rules_old_advice, EXPORT, "asks-is-tracing"),
        (rules_noisy, EXPORT, "random"),
        (rules_detached, TRAIN, "outside-graph"),
    ],
)
def test_a_verdict_names_the_entry_that_refused_and_explain_says_its_reason(op, purpose, rule):
    verdict = graph_verdicts.native_graph(op, {}, [(3,)], ["float32"], purpose)
    assert verdict.graph is None and verdict.rule == rule
    reasons = {r.name: r.reason for r in (*rules.OP_REFUSALS, *rules.RECORDED_REFUSALS)}
    reasons.update(rules.TRACE_REFUSALS)
    assert verdict.reason.startswith(reasons[rule].split("{}")[0])
    report = customop.explain(op, (3,))
    assert verdict.reason in repr(report)


def test_every_refusal_raised_in_the_graphs_wing_is_a_table_entry():
    # NotNative is raised only through NotNative.of(<rule>) or with a recorded refusal's
    # entry, and a kept node (splice.Kept) gets no literal reason: never one explain could
    # not name
    import ast
    from pathlib import Path

    wing = Path(rules.__file__).parent
    literal, unknown = [], []
    for path in sorted(wing.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            if (
                isinstance(f, ast.Name)
                and f.id == "NotNative"
                and (node.args and isinstance(node.args[0], (ast.Constant, ast.JoinedStr)))
            ):
                literal.append(f"{path.name}:{node.lineno}")
            if (
                isinstance(f, ast.Name)
                and f.id == "Kept"
                and (
                    len(node.args) < 4
                    or any(isinstance(a, (ast.Constant, ast.JoinedStr)) for a in node.args[2:])
                )
            ):
                literal.append(f"{path.name}:{node.lineno}")
            if (
                isinstance(f, ast.Attribute)
                and f.attr == "of"
                and getattr(f.value, "id", "") == "_Refused"
                and not (
                    isinstance(node.args[0], ast.Constant)
                    and node.args[0].value in rules.NODE_REFUSALS
                )
            ):
                unknown.append(f"{path.name}:{node.lineno}")
            if (
                isinstance(f, ast.Attribute)
                and f.attr == "of"
                and getattr(f.value, "id", "") == "NotNative"
            ):
                name = node.args[0]
                if getattr(name, "attr", "") == "DIFFERS":  # a builder's, checked below
                    continue
                if not (isinstance(name, ast.Constant) and name.value in rules.TRACE_REFUSALS):
                    unknown.append(f"{path.name}:{node.lineno}")
    assert literal == [] and unknown == []
    assert {forward.ForwardGraph.DIFFERS, backward.TransposedGraph.DIFFERS} <= set(
        rules.TRACE_REFUSALS
    )


def test_a_kept_node_names_its_entry_and_imperative_calls_say_the_ops():
    from customop.graphs import imperative, splice

    x = mx.sym.var("x")
    sym = rules_own_gradient(x) + rules_numpy(x)
    done = splice.inline(sym, {}, {}, TRAIN)  # no input shapes given
    assert {k.rule for k in done.kept} == {"input-shapes-unknown", "numpy-mode"}
    for k in done.kept:
        reason = rules.NODE_REFUSALS.get(k.rule) or rules.op_refusal(rules_numpy, TRAIN).reason
        assert k.reason == reason
    assert imperative.eligible(rules_numpy) == rules.op_refusal(rules_numpy, TRAIN).reason
    assert imperative.eligible(rules_own_gradient) == ""


def test_rewrites_are_keyed_by_mxnet_operator():
    assert rules.REWRITES["_copyto"]({"__dtype__": "float16"}) == ("Cast", {"dtype": "float16"})
    assert rules.REWRITES["_copyto"]({}) == ("_copy", {})


def test_index_guards_are_keyed_by_mxnet_operator():
    assert set(rules.INDEX_GUARDS) == {"_contrib_box_encode", "pick", "take"}
    added = []

    def add(op, attrs, inputs):
        added.append(op)
        return ("node", len(added) - 1, 0)

    node = {"op": "take", "attrs": {"mode": "wrap"}, "inputs": [("in", 0), ("in", 1)]}
    assert rules.INDEX_GUARDS["take"](node, add, ["float32", "float32"]) is None  # wrap: as is
    node["attrs"] = {}
    outs = rules.INDEX_GUARDS["take"](node, add, ["float32", "float32"])
    assert added[-1] == "broadcast_mul" and "take" in added and len(outs) == 1


def test_a_bfloat16_signature_is_refused_by_its_entry():
    # NumPy has no bfloat16: such a Custom node computes in float32 itself (modes.widened)
    verdict = graph_verdicts.native_graph(
        rules_detached, {}, [(3,)], [np.dtype([("bfloat16", np.uint16)])], TRAIN
    )
    assert verdict.graph is None and verdict.rule == "bfloat16"
    assert verdict.reason == rules.TRACE_REFUSALS["bfloat16"]


def test_what_a_trace_asks_of_an_operator_is_what_all_its_names_say():
    # trace.op_kinds reads an operator's own name and a few handles, not the table of every
    # name; the table here is MXNet's list of every name and alias, looked up one by one
    import ctypes

    from mxnet.base import _LIB, check_call, py_str

    from customop.graphs import trace

    size, listed = ctypes.c_uint(), ctypes.POINTER(ctypes.c_char_p)()
    check_call(_LIB.MXListAllOpNames(ctypes.byref(size), ctypes.byref(listed)))
    names: dict[int, list[str]] = {}
    for i in range(size.value):
        name, h = py_str(listed[i]), ctypes.c_void_p()
        check_call(_LIB.NNGetOpHandle(ctypes.c_char_p(name.encode()), ctypes.byref(h)))
        names.setdefault(h.value, []).append(name)
    assert len(names) > 500
    for handle, its in names.items():
        random = any(rules.RANDOM.search(n) for n in its)
        want = (
            any(n in rules.INDEX_GUARDS for n in its),
            "_copyto" in its,
            its[0] if random else None,
        )
        assert trace.op_kinds(handle) == want, its
    assert sum(trace.op_kinds(h)[2] is not None for h in names) > 20  # (random ones are seen)
