"""One op's native graph when it has its own gradient: its closures traced and transposed.

The builder of that piece of graph (:class:`TransposedGraph`), for one operator at one
signature; :mod:`customop.graphs.binding` runs whole models' graphs with such pieces
spliced in.  A ``def_grad`` closure ``grad(g)`` is linear in the head gradient ``g``.  The
forward and every closure are recorded together (:func:`customop.graphs.trace.record`
with :mod:`customop.graphs.recorded_closures`) with ``g`` as a variable; each closure's graph
is transposed (:mod:`customop.graphs.transpose`) into ``h(v) = J v``, whose
coefficients are the closure's ``g``-free values.  The operator's output ``k``
becomes::

    forward_k(stop_gradient(x)) + h_k(x - stop_gradient(x))

whose value is the forward's (``h`` of a zero vector is zero) and whose
gradient, by MXNet's own backward, is ``J^T g``: what the closure gives.  An
output layer (``need_top_grad=False``) whose closure ``c`` ignores ``g`` adds
``zeros_like(make_loss(x * stop_gradient(c)))``: ``make_loss`` ignores its head
gradient (measured on MXNet 1.9.1: bound, Module and autograd), so ``x`` gets
``c`` whatever the head gradient.  Inputs without a closure keep MXNet's
gradient of the forward (``auto_grad``) or none.

The closure is the gradient: its own graph is transposed even where MXNet's gradient of
the forward would give the same numbers on sampled values (they differ at kinks and ties,
which samples never reach).  A closure that is not linear in ``g`` (its graph read
statically, :func:`customop.graphs.transpose.nonlinear_use`: ``clip(g)``, ``sign(g)``,
``g / norm(g)``) is refused here, so it keeps its ``Custom`` node and runs with the real
head gradient.

:class:`TransposedGraph` is the builder :func:`customop.graphs.verify.verified`
checks: MXNet's backward of the graph must give the closures' gradients on other
values and shapes (:mod:`customop.graphs.closure_check`).  What does not trace or
transpose raises :class:`~customop.graphs.rules.NotNative` with a rule of
``TRACE_REFUSALS`` naming the closure and the operator (or the read) that stopped it.
"""

from __future__ import annotations

from typing import Any

import mxnet as mx
import numpy as np

from .. import errors, symbol_json
from ..opinfo import Differentiable
from ..symbol_json import NativeGraph
from . import closure_check, trace
from .forward import ForwardGraph
from .recorded_closures import Closure, closures_of
from .rules import TRAIN, NotNative
from .sample_inputs import grown, placeholders
from .transpose import ZEROS, NotLinear, Transposer, nonlinear_use, transpose


def has_own_gradient(op: Differentiable) -> bool:
    """Whether ``op``'s training graph transposes closures (def_grad, or an output layer)."""
    return bool(op.grads) or not op.need_top_grad


class TransposedGraph(ForwardGraph):
    """Records an operator's forward and closures and builds its training graph."""

    DIFFERS = "closure-differs"

    def __init__(self, op: Differentiable, params: dict[str, Any]):
        super().__init__(op, params, TRAIN)
        self.n = len(op.signature.inputs)
        self.closures, self.auto = closures_of(op)  # auto: inputs MXNet differentiates
        self.owned = {i for c in self.closures for i in c.inputs}
        self.in_dtypes: list[np.dtype] = []

    def frozen(self, i: int) -> bool:
        if i >= self.n:  # a head gradient: the closures' variable
            return False
        return i in self.owned or super().frozen(i)

    # ---- the builder's part of the verification (customop.graphs.verify) ------------------
    def recorded(self, values, seed: int = 5) -> trace.Recording:
        self.in_dtypes = [np.dtype(v.dtype) for v in values]
        try:
            rec = trace.record(
                self.op, list(values), self.params, closures=self.closures, seed=seed
            )
        except NotNative:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure is the reason
            text = errors.mxnet_text(exc) if isinstance(exc, mx.base.MXNetError) else exc
            raise NotNative.of("closure-failed", f"{type(exc).__name__}: {text}") from None
        self.check(rec)
        return rec

    def check(self, rec: trace.Recording) -> None:
        closure_reads = rec.reads[rec.forward_reads :]
        rec.reads = rec.reads[: rec.forward_reads]
        try:
            super().check(rec)
        finally:
            rec.reads = rec.reads + closure_reads
        if closure_reads:
            raise NotNative.of("closure-reads", _reader(rec), closure_reads[0])

    def build(self, rec: trace.Recording, shapes) -> NativeGraph:
        graph = _Assembly(self, rec, shapes).graph()
        graph.note = (
            "its gradient is its def_grad closures' own graph, transposed" if self.closures else ""
        )
        if graph.note and any(nd["name"].endswith(_OWN) for nd in graph.nodes):
            graph.note += " (x * x with 2 * x * g: MXNet's square, whose backward is that graph)"
        return graph

    def differs(self, graph: NativeGraph, first, second, rec2: trace.Recording) -> str:
        # Other values for the inputs that get gradients; labels, indices and scales keep
        # theirs. (Positive ones: where a closure's coefficient is inf, h(0) = inf * 0 is NaN,
        # so the inlined output is NaN where the op's is finite: degenerate inputs, in the docs.)
        third = placeholders([v.shape for v in first], [v.dtype for v in first], 2)
        others = [
            v if name in self.op.no_grad or not np.issubdtype(v.dtype, np.floating) else w
            for name, v, w in zip(self.op.signature.inputs, first, third)
        ]
        return closure_check.mismatch(self.op, self.params, graph, others)

    def other_values(self, first, shapes) -> list[np.ndarray]:
        return grown(first, shapes)

    def passing(self, first: list) -> list[np.ndarray]:
        return closure_check.passing(self.op, self.params, first)

    def candidates(self, first: list) -> list[list[np.ndarray]]:
        return closure_check.candidates(self.op, first)

    def at(self, inputs, shapes) -> tuple[NativeGraph, trace.Recording]:
        rec = self.recorded(inputs)
        return self.build(rec, shapes), rec

    def differs_at(self, graph: NativeGraph, inputs, rec: trace.Recording, alt: NativeGraph) -> str:
        # Asked only where ``alt``, built from ``rec``, has the graph's operators, attributes
        # and outputs (customop.graphs.verify.generality): the graph is then the recording's,
        # and the question is whether it gives what the run it records gave.
        found = closure_check.replayed(self.op, graph, inputs, rec)
        if found is not None:
            return found
        return closure_check.mismatch(self.op, self.params, graph, inputs)

    def guarded(self, graph: NativeGraph, rec: trace.Recording) -> NativeGraph:
        if graph.forward_only is not None:
            graph.forward_only = super().guarded(graph.forward_only, rec)
        return super().guarded(graph, rec)


def _reader(rec: trace.Recording) -> str:
    """The label of the closure that was running at the first read of a closure."""
    spans = rec.closures.spans
    owner = spans[0][1] if spans else None
    for start, c in spans:
        if start <= rec.forward_reads:
            owner = c
    return owner.label if owner is not None else "gradient closure"


class _Assembly:
    """One recording of the forward and closures written as the training graph."""

    def __init__(self, b: TransposedGraph, rec: trace.Recording, shapes):
        self.b, self.op, self.n, self.shapes = b, b.op, b.n, [tuple(s) for s in shapes]
        self.picks = rec.closures.picks
        self.n_out = len(rec.heads) - len(self.picks)
        n_g = len(rec.inputs) - self.n
        self.out_shapes = [tuple(o.shape) for o in rec.outputs[: self.n_out]]
        self.out_dtypes = [o.dtype for o in rec.outputs[: self.n_out]]
        frag = b.fragment(rec, list(shapes))
        self.nodes = [dict(nd) for nd in frag.nodes]
        self.traced = len(frag.nodes)
        self.sources = [("in", self.n + k) for k in range(n_g)]
        self.linear: list[bool] = []
        for nd in self.nodes:
            self.linear.append(
                any(
                    r in self.sources or (r[0] == "node" and self.linear[r[1]])
                    for r in nd["inputs"]
                )
            )
        self.known = symbol_json.entry_signatures(
            frag, [*shapes, *self.out_shapes], [*b.in_dtypes, *self.out_dtypes]
        )
        self.fwd_heads = list(frag.heads[: self.n_out])
        self.closure_heads = list(frag.heads[self.n_out :])
        self.stopped: dict[tuple, tuple] = {}
        self.seeds: dict[int, tuple] = {}
        self.t = Transposer(self.nodes, self)

    # ---- what the transposition rules ask (customop.graphs.transpose.Entries) -------------
    def shape(self, r) -> tuple:
        if r[0] == "in":
            return self.shapes[r[1]] if r[1] < self.n else self.out_shapes[r[1] - self.n]
        if self.known.get((r[1], r[2]), (None,))[0] is None:
            raise NotNative.of("closure-unknown-shape", self.nodes[r[1]]["op"])
        return self.known[(r[1], r[2])][0]

    def dtype(self, r) -> Any:
        if r[0] == "in":
            return self.b.in_dtypes[r[1]] if r[1] < self.n else self.out_dtypes[r[1] - self.n]
        return self.known[(r[1], r[2])][1]

    def like(self, r) -> tuple | None:
        want = self.shape(r)
        if r in self.sources:
            return self.fwd_heads[r[1] - self.n]
        for i in range(self.n):
            if self.shapes[i] == want:
                return ("in", i)
        for h in self.fwd_heads:
            if self.shape(h) == want:
                return h
        for k in range(self.traced):
            if not self.linear[k] and self.known.get((k, 0), (None,))[0] == want:
                return ("node", k, 0)
        return None

    def coefficient(self, r) -> tuple:
        if not self.b.auto or r[0] != "node":
            return r
        if r not in self.stopped:
            self.stopped[r] = self.t.add("BlockGrad", [r])
        return self.stopped[r]

    def is_zero(self, r) -> bool:
        return r[0] == "node" and self.nodes[r[1]]["op"] in ZEROS

    # ---- the graph ----------------------------------------------------------------------
    def seed(self, i: int) -> tuple:
        """``x_i - stop_gradient(x_i)``: the value 0, the gradient of ``x_i``."""
        if i not in self.seeds:
            stop = next(
                (
                    ("node", k, 0)
                    for k, nd in enumerate(self.nodes)
                    if nd["op"] == "BlockGrad" and nd["inputs"] == [("in", i)]
                ),
                None,
            )
            stop = stop or self.t.add("BlockGrad", [("in", i)])
            self.seeds[i] = self.t.add("elemwise_sub", [("in", i), stop])
        return self.seeds[i]

    def transposed(self) -> tuple[dict[int, list], list[tuple[int, tuple, Closure]]]:
        """Each output's transposed closure terms, and the output layers' constant terms."""
        parts: dict[int, list] = {k: [] for k in range(len(self.sources))}
        losses: list[tuple[int, tuple, Closure]] = []
        for c in self.b.closures:
            mine = [(i, h) for (i, cc), h in zip(self.picks, self.closure_heads) if cc is c]
            lin = []
            for i, h in mine:
                if h in self.sources or (h[0] == "node" and self.linear[h[1]]):
                    lin.append((h, self.seed(i)))
                elif not self.op.need_top_grad:
                    losses.append((i, h, c))
                elif not self.is_zero(h):
                    raise NotNative.of(
                        "closure-constant", c.label, repr(self.op.signature.inputs[i])
                    )
            if not lin:
                continue
            try:
                wrong = nonlinear_use(self.nodes, self.linear, [h for h, _ in lin], self.sources)
                if wrong is not None:
                    raise wrong
                found = transpose(self.nodes, self.linear, lin, self.sources, self.t)
            except NotLinear as exc:
                raise NotNative.of("closure-not-linear", c.label, exc.op, exc) from None
            for k, s in enumerate(self.sources):
                if found[s] is not None:
                    parts[k].append(found[s])
        return parts, losses

    def heads(self, parts: dict[int, list]) -> tuple[list, list]:
        """The outputs with their closure terms, and the outputs where no closure's input
        can need a gradient."""
        t, out_heads = self.t, []
        for k, h in enumerate(self.fwd_heads):
            if parts.get(k):
                hk = (
                    parts[k][0]
                    if len(parts[k]) == 1
                    else t.add("add_n", parts[k], num_args=len(parts[k]))
                )
                h = t.add("elemwise_add", [h, hk])
            out_heads.append(h)
        alone = list(self.fwd_heads)
        if not self.op.need_top_grad and self.b.auto:
            # An output layer's automatic gradient is that of the sum of its outputs.
            for k in range(len(out_heads)):
                stop = t.add("BlockGrad", [self.fwd_heads[k]])
                out_heads[k] = t.add(
                    "elemwise_add",
                    [stop, t.add("zeros_like", [t.add("make_loss", [self.fwd_heads[k]])])],
                )
            alone = list(out_heads)
        return out_heads, alone

    def add_losses(self, out_heads: list, losses) -> None:
        """An output layer's closure ``c`` for input ``x``: ``make_loss(x * stop(c))``."""
        t = self.t
        for i, c_ref, c in losses:
            if self.shape(c_ref) != self.shapes[i]:
                raise NotNative.of("closure-shape", c.label, self.shape(c_ref), self.shapes[i])
            m = t.add(
                "make_loss", [t.add("elemwise_mul", [("in", i), t.add("BlockGrad", [c_ref])])]
            )
            h = out_heads[0]
            if self.out_shapes[0] == self.shapes[i]:  # (out_heads[0] is shaped like it)
                out_heads[0] = t.add("elemwise_add", [h, t.add("zeros_like", [m])])
            else:
                out_heads[0] = t.add("broadcast_add", [h, t.add("zeros_like", [t.add("sum", [m])])])

    def graph(self) -> NativeGraph:
        parts, losses = self.transposed()
        out_heads, alone = self.heads(parts)
        self.add_losses(out_heads, losses)
        full = _own_operators(_pruned(self.nodes, out_heads, self.n), self.b.in_dtypes)
        if out_heads != alone:
            full.forward_only = self.forward_only(alone)
            full.differentiates = tuple(sorted(self.b.owned))
        return full

    def forward_only(self, alone: list) -> NativeGraph:
        # What a graph runs where none of the closures' inputs can need a gradient: the
        # forward alone (its coefficients would be computed in every forward for nothing);
        # its inputs' BlockGrad nodes pass nothing there: none can need a gradient.
        through = {
            k: nd["inputs"][0]
            for k, nd in enumerate(self.nodes)
            if nd["op"] == "BlockGrad"
            and nd["inputs"][0][0] == "in"
            and nd["inputs"][0][1] in self.b.owned
        }

        def past(r):
            return through.get(r[1], r) if r[0] == "node" else r

        plain = [dict(nd, inputs=[past(r) for r in nd["inputs"]]) for nd in self.nodes]
        return _pruned(plain, [past(h) for h in alone], self.n)


_FLOATS = frozenset({"float16", "float32", "float64"})
_OWN = "_own_square"  # the name's end of a node _own_operators writes


def _own_operators(graph: NativeGraph, dtypes) -> NativeGraph:
    """``graph`` where an output written ``x * x + (2 * x) * (x - x)`` (``BlockGrad`` on
    each ``x`` but the seed's first: the forward ``x * x`` and the closure ``2 * x * g``,
    transposed) is MXNet's ``square(x)``, one operator instead of six.

    Exact, not a sampled agreement: ``square``'s forward is ``x * x``, one rounded product,
    and its backward is ``g * (2 * x)`` (``_backward_square``), the closure's two operations
    in the closure's order (a product's operands commute exactly).  Measured bit for bit on
    MXNet 1.9.1 in float16, float32 and float64, zeros, subnormals, infinities and NaNs
    included (``tests/customop/test_backward.py``); not in integer dtypes, where MXNet
    computes ``2 * x`` in float32, so only float inputs.  The written form is also NaN where
    ``2 * x`` overflows (``inf * 0``); ``square`` is the forward's ``inf`` there."""
    nodes, heads = graph.nodes, list(graph.heads)

    def node(r, *ops):
        return nodes[r[1]] if r[0] == "node" and r[2] == 0 and nodes[r[1]]["op"] in ops else None

    def stopped(r):  # the input x when r is BlockGrad(x)
        nd = node(r, "BlockGrad")
        return tuple(nd["inputs"][0]) if nd is not None and nd["inputs"][0][0] == "in" else None

    def squared(r):  # x when r is stop(x) * stop(x)
        nd = node(r, "broadcast_mul", "elemwise_mul")
        return (
            stopped(nd["inputs"][0])
            if nd is not None and tuple(nd["inputs"][0]) == tuple(nd["inputs"][1])
            else None
        )

    def twice_seed(r, x):  # r is (x - stop(x)) * (2 * stop(x)), in either order
        nd = node(r, "elemwise_mul")
        for d, c in [] if nd is None else [nd["inputs"], nd["inputs"][::-1]]:
            seed, two = node(d, "elemwise_sub"), node(c, "_mul_scalar")
            if (
                seed is not None
                and two is not None
                and tuple(seed["inputs"][0]) == x
                and stopped(seed["inputs"][1]) == x
                and stopped(two["inputs"][0]) == x
                and float(two["attrs"].get("scalar", "nan")) == 2.0
            ):
                return True
        return False

    added = []
    for k, h in enumerate(heads):
        add = node(h, "elemwise_add")
        for f, t in [] if add is None else [add["inputs"], add["inputs"][::-1]]:
            x = squared(f)
            if x is not None and np.dtype(dtypes[x[1]]).name in _FLOATS and twice_seed(t, x):
                added.append(
                    {
                        "op": "square",
                        "name": f"g{len(nodes) + len(added)}{_OWN}",
                        "attrs": {},
                        "inputs": [x],
                    }
                )
                heads[k] = ("node", len(nodes) + len(added) - 1, 0)
                break
    if not added:
        return graph
    return _pruned(nodes + added, heads, len(dtypes))


def _pruned(nodes: list[dict], heads: list[tuple], n: int) -> NativeGraph:
    keep: set[int] = set()
    stack = [h[1] for h in heads if h[0] == "node"]
    while stack:
        k = stack.pop()
        if k in keep:
            continue
        keep.add(k)
        for r in nodes[k]["inputs"]:
            if r[0] == "in" and r[1] >= n:  # pragma: no cover - a rule left g in the graph
                raise NotNative.of("closure-reads-g")
            if r[0] == "node":
                stack.append(r[1])
    order = sorted(keep)
    new = {k: j for j, k in enumerate(order)}

    def moved(r):
        return ("node", new[r[1]], r[2]) if r[0] == "node" else r

    out = [dict(nodes[k], inputs=[moved(r) for r in nodes[k]["inputs"]]) for k in order]
    for j, nd in enumerate(out):
        nd["name"] = f"{nd['name']}" if not nd["name"].startswith("t") else f"g{j}_{nd['op']}"
    return NativeGraph(out, [moved(h) for h in heads])
