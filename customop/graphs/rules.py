"""The native-graph rules: which ops and recorded forwards stay ``Custom`` nodes, and rewrites.

An ``'mxnet'``-mode op stands in a graph as the MXNet operators its forward
records (:mod:`customop.graphs.graph_verdicts`) unless a refusal below applies.  A rule is one
entry of a table; :func:`customop.explain` shows the reason of the first entry
that applies (its ``name`` is on the verdict, ``Verdict.rule``).  Adding a rule:
one entry here and one test (tests/customop/test_rules.py: a case of its name).

* :data:`OP_REFUSALS`: ``(name, test(op, purpose), reason)``; what the operator
  declares, whatever its inputs (checked before anything is traced, and by the
  ``inline`` patch to decide whether it is needed at all).
* :data:`RECORDED_REFUSALS`: ``(name, test(recording, purpose), reason)``; what
  one recorded run of the forward (:class:`customop.graphs.trace.Recording`) shows.  A
  test returns what it found ("" or None when the rule does not apply), which
  fills the ``{}`` of the reason.
* :data:`TRACE_REFUSALS`: name -> reason, for what the method itself finds (a
  recording that does not stand for the forward: see :mod:`customop.graphs.graph_verdicts`).
* :data:`NODE_REFUSALS`: name -> reason, for a ``Custom`` node of a graph whose input
  shapes and dtypes the graph does not tell (:mod:`customop.graphs.splice`; its op is not
  asked).
* :data:`REWRITES`: by MXNet operator, how a recorded node is written into the
  graph (``rewrite(attrs) -> (operator, attrs)``).
* :data:`INDEX_GUARDS`: by MXNet operator, how a kernel that reads at computed
  indices is made safe (NaN outputs for an index out of range; :mod:`customop.graphs.guards`).

Which recorded MXNet operators count as random (:data:`RANDOM`) or as updating
auxiliary states (:data:`STATEFUL`) is here too, and which pass a gradient to which
inputs (:data:`NO_GRADIENT`, :data:`PASS_GRADIENT`: :mod:`customop.graphs.splice` and
:mod:`customop.graphs.tidy` read them).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, NamedTuple

from .. import errors, runtime
from . import guards

TRAIN, EXPORT = "train", "export"
PURPOSES = (TRAIN, EXPORT)

# MXNet operators whose outputs are not a function of their inputs.
RANDOM = re.compile(
    r"^(_random_|_sample_|random_|sample_|_npi_(random|uniform|normal|gamma|"
    r"exponential|weibull|pareto|power|rayleigh|logistic|gumbel|laplace|"
    r"multinomial|choice|bernoulli))|^(Dropout|_shuffle|_np_shuffle)$"
)
# MXNet operators with auxiliary states (moving statistics): in a graph these must be fed
# by variables, and they update them in place.
STATEFUL = frozenset({"BatchNorm", "BatchNorm_v1", "SyncBatchNorm", "_contrib_SyncBatchNorm"})


# MXNet operators that pass no gradient to the inputs listed (None: to any), measured or read
# in MXNet 1.9.1 (no FGradient, zero gradients, or shapes only): a def_grad op's input reached
# from a variable only through them needs no gradient.
NO_GRADIENT: dict[str, tuple | None] = {
    "BlockGrad": None,
    "argmax": None,
    "argmin": None,
    "argsort": None,
    "shape_array": None,
    "size_array": None,
    "zeros_like": None,
    "ones_like": None,
    "_contrib_arange_like": None,
    "broadcast_like": (1,),
    "reshape_like": (1,),
    **{
        op: None
        for op in (
            "_greater",
            "_greater_equal",
            "_lesser",
            "_lesser_equal",
            "_equal",
            "_not_equal",
            "broadcast_greater",
            "broadcast_greater_equal",
            "broadcast_lesser",
            "broadcast_lesser_equal",
            "broadcast_equal",
            "broadcast_not_equal",
            "_greater_scalar",
            "_greater_equal_scalar",
            "_lesser_scalar",
            "_lesser_equal_scalar",
            "_equal_scalar",
            "_not_equal_scalar",
            "floor",
            "ceil",
            "round",
            "rint",
            "fix",
            "sign",
        )
    },
    "one_hot": None,
    "_contrib_box_encode": None,
    "_contrib_box_decode": None,
}


# MXNet operators that pass a gradient, from the head gradient only (an FGradient in MXNet
# 1.9.1; with NO_GRADIENT's, each checked by tests/customop/test_tidy.py): a BlockGrad above a
# subgraph of only these and NO_GRADIENT operators, that reaches no variable, stops nothing;
# one below which only these and NO_GRADIENT operators lead to no head, too (customop.graphs.tidy).
PASS_GRADIENT = frozenset(
    {
        "BlockGrad",
        "Cast",
        "Reshape",
        "expand_dims",
        "slice_axis",
        "clip",
        "abs",
        "exp",
        "log",
        "min",
        "max",
        "sum",
        "where",
        "_full",
        "_zeros",
        "_ones",
        "elemwise_add",
        "elemwise_sub",
        "elemwise_mul",
        "elemwise_div",
        "broadcast_add",
        "broadcast_sub",
        "broadcast_mul",
        "broadcast_div",
        "broadcast_minimum",
        "broadcast_maximum",
        "_plus_scalar",
        "_minus_scalar",
        "_rminus_scalar",
        "_mul_scalar",
        "_div_scalar",
        "_rdiv_scalar",
        "_maximum_scalar",
        "_minimum_scalar",
        "_power_scalar",
        "negative",
        "_copy",
        "transpose",
        "Activation",
        "sigmoid",
        "relu",
        "square",
        "sqrt",
        "smooth_l1",
        "pick",
        "take",
        "Concat",
        "batch_dot",
        "mean",
        "_contrib_box_iou",
    }
)


class Refusal(NamedTuple):
    """One reason an op keeps its ``Custom`` node: ``reason`` when ``test`` finds something.

    A reason says what stopped the op and, where the user can change it, what to do.
    """

    name: str
    test: Callable[..., Any]
    reason: str


OP_REFUSALS = (
    Refusal(
        "numpy-mode",
        lambda op, purpose: op.mode != "mxnet",
        "a 'numpy'-mode operator: its forward runs on NumPy arrays, outside MXNet's graph; "
        "its 'mxnet'-mode twin, written with mx.nd operators, can inline",
    ),
    Refusal(
        "inline-false",
        lambda op, purpose: not getattr(op, "inline", True),
        "declared inline=False (leave it out to inline the op)",
    ),
    Refusal(
        "aux-states",
        lambda op, purpose: bool(op.signature.aux),
        "it has auxiliary states (aux=), which it updates in place; MXNet's own operators cannot",
    ),
    Refusal(
        "trace-off",
        lambda op, purpose: runtime.disabled("trace"),
        "CUSTOMOP_RUNTIME_OFF keeps the trace hooks out (take 'trace' out of it to inline)",
    ),
)
# (def_grad and need_top_grad=False ops inline in training too: their closures are traced and
# transposed by customop.graphs.backward, whose refusals are the "closure-*" TRACE_REFUSALS.)


def op_refusal(op: Any, purpose: str) -> Refusal | None:
    """The first entry of :data:`OP_REFUSALS` that applies to ``op`` for ``purpose``."""
    return next((r for r in OP_REFUSALS if r.test(op, purpose)), None)


def _inner_refused(rec: Any, purpose: str) -> str:
    for inner in rec.inner:
        found = op_refusal(inner, purpose)
        if found is not None:
            return f"{errors.shown(inner.op_type)!r}, which cannot be inlined: {found.reason}"
        if purpose == TRAIN and (inner.grads or not inner.need_top_grad):
            # its forward would be recorded into this graph and differentiated by MXNet
            return (
                f"{errors.shown(inner.op_type)!r}, whose gradient is its own (def_grad or "
                "need_top_grad=False): inside another op's forward MXNet would "
                "differentiate its forward instead"
            )
    return ""


def _stateful(rec: Any, purpose: str) -> str:
    return ", ".join(sorted({n["op"] for n in rec.nodes if n["op"] in STATEFUL}))


def _foreign_custom(rec: Any, purpose: str) -> bool:
    return any(n["op"] in ("_CustomFunction", "Custom") for n in rec.nodes)


RECORDED_REFUSALS = (
    Refusal("inner-customop", _inner_refused, "it calls customop {}"),
    Refusal(
        "asks-is-tracing",
        lambda rec, purpose: rec.asked[0] if rec.asked else "",
        "it asks customop.is_tracing() (at {}), so it may skip a check while traced; "
        "write value checks with customop.require, which makes the outputs NaN in a "
        "native graph, and drop the is_tracing() test",
    ),
    Refusal(
        "reads-values",
        lambda rec, purpose: rec.reads[0] if rec.reads else "",
        "it reads values back to Python (asnumpy, asscalar, bool) at {}; a graph would "
        "keep what it read once (a value check: write it with customop.require)",
    ),
    Refusal(
        "random",
        lambda rec, purpose: ", ".join(rec.randoms),
        "it calls random operators ({}); draw the random values outside the op and "
        "pass them in as an input",
    ),
    Refusal("stateful", _stateful, "it calls operators that update auxiliary states ({})"),
    Refusal(
        "unknown-free",
        lambda rec, purpose: bool(rec.unknown_free),
        "it uses arrays whose values the trace could not read; build them inside the "
        "forward from its inputs, or pass them in as inputs",
    ),
    Refusal(
        "foreign-custom",
        _foreign_custom,
        "it calls a custom operator that cannot be inlined itself (a 'numpy'-mode op, "
        "one with def_grad in training, or one with auxiliary states)",
    ),
)


def recorded_refusal(rec: Any, purpose: str) -> tuple[Refusal, str] | None:
    """The first entry of :data:`RECORDED_REFUSALS` that applies, and its reason filled in."""
    for rule in RECORDED_REFUSALS:
        found = rule.test(rec, purpose)
        if found:
            return rule, rule.reason.format(found)
    return None


# What the method of customop.graphs.graph_verdicts finds when a recording does not stand for the
# forward (two traces compared, the graph evaluated at other values and shapes, constants written):
# name -> reason, its {} filled with what was found.
TRACE_REFUSALS = {
    "forward-failed": "its forward failed while being traced on placeholder inputs: {}",
    "value-dependent": "its graph depends on the input values (control flow on values read "
    "from its inputs); compute every branch and choose with mx.nd.where",
    "outside-graph": "it computes arrays from its inputs outside the recorded graph (detach(), "
    "backward() inside a gradient closure, or new arrays from values it "
    "read); the graph would hold them as constants: compute them with MXNet "
    "operators on the inputs",
    "other-outputs": "its recorded graph does not give its outputs on other input values",
    "shape-specialized": "its graph holds only at the traced input shapes ({}); a hybridized "
    "block may see others: write shapes with reshape's 0/-1 codes or "
    "shape operators (zeros_like, broadcast_like), not numbers read "
    "from x.shape",
    "unread-array": "it uses an array the trace could not read",
    "bfloat16": "an input is bfloat16: the op computes in float32 there, cast at its Custom "
    "node (as MXNet's AMP casts a Custom node's inputs), and its graph is traced "
    "and checked on NumPy values, which have no bfloat16",
    "constant-unheld": "it builds a constant array of shape {} ({}) that a graph cannot hold "
    "without a parameter; pass it in as an input",
    "constant-inexact": "it builds a constant array of shape {} ({}) that the graph cannot "
    "write exactly; pass it in as an input",
    # an op with its own gradient (customop.graphs.backward; transposition rules by MXNet
    # operator: customop.graphs.transpose.TRANSPOSE)
    "closure-failed": "its forward or a gradient closure failed while being traced on "
    "placeholder inputs: {}",
    "closure-not-ndarray": "its {} returns a {}, not an NDArray",
    "closure-reads": "its {} reads values back to Python (asnumpy, asscalar, bool) at {}; a "
    "graph would keep what it read once",
    "closure-unknown-shape": "the shape of MXNet operator {!r}'s output in its gradient "
    "closure is not known",
    "closure-not-linear": "its {} is not linear in the head gradient ({}): {}; it runs with "
    "the real head gradient in a Custom node",
    "closure-constant": "its {} gives input {} a gradient that does not depend on the head "
    "gradient g: it is not linear in g (an output layer ignoring g "
    "declares need_top_grad=False)",
    "closure-shape": "its {} returns a gradient of shape {} for an input of shape {}",
    "closure-reads-g": "its transposed gradient still reads the head gradient",
    "closure-differs": "{} on other input values",
}


# What customop.graphs.splice finds when a graph does not tell a Custom node's input signature:
# name -> reason, its {} filled with what was found.
NODE_REFUSALS = {
    "no-node-rows": "the graph does not say where each node's outputs are",
    "signature-uninferable": "its input shapes or dtypes could not be inferred: {}",
    "rows-unmatched": "the graph's outputs could not be matched to its nodes",
    "input-shapes-unknown": "its input shapes are not known when the graph is built",
}


class NotNative(Exception):
    """The reason an operator's forward does not stand in as a native graph, and its rule."""

    def __init__(self, reason: str, rule: str = ""):
        super().__init__(reason)
        self.rule = rule

    @classmethod
    def of(cls, rule: str, *found: Any) -> NotNative:
        """The refusal ``rule`` of :data:`TRACE_REFUSALS`, filled in with ``found``."""
        return cls(TRACE_REFUSALS[rule].format(*found), rule)


def _copyto(attrs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    # astype() or a device copy: the graph runs on one device (trace notes the dtype)
    dtype = attrs.pop("__dtype__", None)
    return ("Cast", {"dtype": dtype}) if dtype else ("_copy", {})


REWRITES: dict[str, Callable[[dict[str, Any]], tuple[str, dict[str, Any]]]] = {
    "_copyto": _copyto,
}
# Index guards, by MXNet operator: kernels that read at computed indices without a bound
# check (or clip them to a plausible row) get their indices made safe, and NaN outputs for
# one out of range, once a graph is verified (customop.graphs.guards has the formulas):
# guard(node, add, dtypes) -> the entries standing for the node's outputs, or None.
INDEX_GUARDS: dict[str, Callable[..., Any]] = {
    "_contrib_box_encode": guards.box_encode,
    "pick": guards.along("-1"),
    "take": guards.along("0"),
}
# Tables of other rules by MXNet operator (transposition of gradient closures) belong beside
# these, keyed the same way.
