"""Training graphs for operators with their own gradient: the closures traced and transposed.

A ``def_grad`` closure ``grad(g)`` is linear in the head gradient ``g``.  The
forward and every closure are recorded together (:func:`customop.graphs.trace.record`)
with ``g`` as a variable; each closure's graph is transposed
(:mod:`customop.graphs.transpose`) into ``h(v) = J v``, whose coefficients are the
closure's ``g``-free values.  The operator's output ``k`` becomes::

    forward_k(stop_gradient(x)) + h_k(x - stop_gradient(x))

whose value is the forward's (``h`` of a zero vector is zero) and whose
gradient, by MXNet's own backward, is ``J^T g``: what the closure gives.  An
output layer (``need_top_grad=False``) whose closure ``c`` ignores ``g`` adds
``zeros_like(make_loss(x * stop_gradient(c)))``: ``make_loss`` ignores its head
gradient (measured on MXNet 1.9.1: bound, Module and autograd), so ``x`` gets
``c`` whatever the head gradient.  Inputs without a closure keep MXNet's
gradient of the forward (``auto_grad``) or none.

The graph is checked like a forward's (:mod:`customop.graphs.native`): on other
values and other shapes, MXNet's backward of it must give the closures'
gradients (:mod:`customop.graphs.closure_values`).  What does not trace or transpose
raises ``native.NotNative`` with the closure and the operator (or the read)
that stopped it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import mxnet as mx
import numpy as np

from .. import errors, gradients
from . import closure_values as on_values
from . import compare, graph_json, guards, native, rules, trace
from . import constants as consts
from .transpose import ZEROS, NotLinear, Transposer, transpose

if TYPE_CHECKING:
    from ..operator import CustomOperator


def native_graph(op: CustomOperator, params: dict[str, Any], shapes, dtypes, purpose: str,
                 values=None) -> native.Verdict:
    """:func:`customop.graphs.native.native_graph`, ops with their own gradients included in
    training."""
    return native.native_graph(op, params, shapes, dtypes, purpose, values,
                               closures=training_graph)


def has_own_gradient(op: CustomOperator) -> bool:
    """Whether ``op``'s training graph transposes closures (def_grad, or an output layer)."""
    return bool(op.grads) or not op.need_top_grad


def describe(maker: Any) -> str:
    """A closure as explain names it: its name and where it is defined."""
    name = getattr(maker, "__qualname__", None) or repr(maker)
    code = getattr(maker, "__code__", None)
    if code is None:
        return name
    return f"{name} ({code.co_filename}:{code.co_firstlineno})"


class _Closure:
    """One gradient closure: the inputs it gives gradients for, and how to call it."""

    def __init__(self, op, first: int, joint: gradients.Joint | None):
        self.first, self.joint = first, joint
        self.maker = op.grads[first]
        self.inputs = list(joint.argnums) if joint is not None else [first]
        names = [op.signature.inputs[i] for i in self.inputs]
        self.label = (f"gradient closure {describe(self.maker)} for input"
                      f"{'s' if len(names) > 1 else ''} {', '.join(map(repr, names))}")


class Builder(native.Tracer):
    """Records an operator's forward and closures and builds its training graph."""

    def __init__(self, op: CustomOperator, params: dict[str, Any]):
        super().__init__(op, params, native.TRAIN)
        self.n = len(op.signature.inputs)
        self.closures: list[_Closure] = []
        self.auto: list[int] = []  # inputs MXNet differentiates through the forward
        seen: set[int] = set()
        for i, name in enumerate(op.signature.inputs):
            if name in op.no_grad:
                continue
            if i in op.grads:
                joint = op.grad_groups.get(i)
                if joint is None or id(joint) not in seen:
                    self.closures.append(_Closure(op, i, joint))
                    if joint is not None:
                        seen.add(id(joint))
            elif op.auto_grad:
                self.auto.append(i)
        self.owned = {i for c in self.closures for i in c.inputs}

    def _frozen(self, i: int) -> bool:
        if i >= self.n:  # a head gradient: the closures' variable
            return False
        return i in self.owned or super()._frozen(i)

    # ---- recording ----------------------------------------------------------------------
    def record(self, values, seed: int = 5) -> trace.Recording:
        op, params = self.op, self.params
        self.spans: list[tuple[int, _Closure]] = []
        self.picks: list[tuple[int, _Closure]] = []  # per closure head: (input, closure)
        rng = np.random.RandomState(seed)
        self.in_dtypes = [np.dtype(v.dtype) for v in values]

        def then(xs, outs, saved, log):
            gs = []
            single = len(outs) == 1
            if op.need_top_grad:
                for o in outs:
                    g = mx.nd.array(rng.uniform(-1, 1, o.shape), dtype=o.dtype)
                    g.attach_grad()
                    gs.append(g)
                log.inputs |= {mx.autograd.get_symbol(g).name for g in gs}
            g = None if not gs else (gs[0] if single else tuple(gs))
            ans = outs[0] if single else tuple(outs)
            heads = []
            for c in self.closures:
                self.spans.append((len(log.reads), c))
                if c.joint is None:
                    found = [gradients.from_closure(op, c.first, ans, list(xs), g, params,
                                                     lambda: saved)]
                else:
                    got = gradients.from_joint(op, c.joint, c.first, ans, list(xs), g,
                                                params, lambda: saved)
                    found = [got[c.joint.picks[k]] for k in range(len(c.inputs))]
                for i, grad in zip(c.inputs, found):
                    if grad is None:
                        continue
                    if not isinstance(grad, mx.nd.NDArray):
                        raise native.NotNative(f"its {c.label} returns a "
                                                f"{type(grad).__name__}, not an NDArray")
                    if log.poison is not None and np.issubdtype(grad.dtype, np.floating):
                        # a failed require() check: NaN gradients, not only NaN outputs
                        grad = mx.nd.broadcast_mul(grad, log.poison.astype(grad.dtype,
                                                                           copy=False))
                    heads.append(grad)
                    self.picks.append((i, c))
            return gs, heads

        try:
            return trace.record(op, list(values), params, then=then)
        except native.NotNative:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure is the reason
            text = errors.mxnet_text(exc) if isinstance(exc, mx.base.MXNetError) else exc
            raise native.NotNative(f"its forward or a gradient closure failed while being "
                                    f"traced on placeholder inputs: {type(exc).__name__}: "
                                    f"{text}") from None

    def check(self, rec: trace.Recording) -> None:
        closure_reads = rec.reads[rec.forward_reads:]
        rec.reads = rec.reads[:rec.forward_reads]
        try:
            super().check(rec)
        finally:
            rec.reads = rec.reads + closure_reads
        if closure_reads:
            raise native.NotNative.of("closure-reads", self._reader(rec), closure_reads[0])

    def _reader(self, rec: trace.Recording) -> str:
        first = rec.forward_reads
        owner = self.closures[0]
        for start, c in self.spans:
            if start <= first:
                owner = c
        return owner.label

    # ---- the graph ----------------------------------------------------------------------
    def build(self, values, shapes) -> native.NativeGraph:
        rec = self.record(values)
        self.check(rec)
        return self.assemble(rec, shapes)

    def assemble(self, rec: trace.Recording, shapes) -> native.NativeGraph:
        n_out = len(rec.heads) - len(self.picks)
        n_g = len(rec.inputs) - self.n
        out_shapes = [tuple(o.shape) for o in rec.outputs[:n_out]]
        out_dtypes = [o.dtype for o in rec.outputs[:n_out]]
        frag = self.fragment(rec, list(shapes))
        nodes = [dict(nd) for nd in frag.nodes]
        sources = [("in", self.n + k) for k in range(n_g)]
        linear = []
        for nd in nodes:
            linear.append(any(r in sources or (r[0] == "node" and linear[r[1]])
                              for r in nd["inputs"]))
        known = graph_json.entry_signatures(frag, [*shapes, *out_shapes],
                                  [*self.in_dtypes, *out_dtypes])
        fwd_heads = list(frag.heads[:n_out])

        def shape(r):
            if r[0] == "in":
                return tuple(shapes[r[1]]) if r[1] < self.n else out_shapes[r[1] - self.n]
            if known.get((r[1], r[2]), (None,))[0] is None:
                raise native.NotNative(f"the shape of MXNet operator {nodes[r[1]]['op']!r}'s "
                                        "output in its gradient closure is not known")
            return known[(r[1], r[2])][0]

        def dtype(r):
            if r[0] == "in":
                return self.in_dtypes[r[1]] if r[1] < self.n else out_dtypes[r[1] - self.n]
            return known[(r[1], r[2])][1]

        def like(r):
            want = shape(r)
            if r in sources:
                return fwd_heads[r[1] - self.n]
            for i in range(self.n):
                if tuple(shapes[i]) == want:
                    return ("in", i)
            for h in fwd_heads:
                if shape(h) == want:
                    return h
            for k in range(len(frag.nodes)):
                if not linear[k] and known.get((k, 0), (None,))[0] == want:
                    return ("node", k, 0)
            return None

        stopped: dict[tuple, tuple] = {}

        def coefficient(r):
            if not self.auto or r[0] != "node":
                return r
            if r not in stopped:
                stopped[r] = t.add("BlockGrad", [r])
            return stopped[r]

        def is_zero(r):
            return r[0] == "node" and nodes[r[1]]["op"] in ZEROS

        t = Transposer(nodes, shape, dtype, like, coefficient, is_zero)
        seeds: dict[int, tuple] = {}

        def seed(i):  # x - stop_gradient(x): the value 0, the gradient of x
            if i not in seeds:
                stop = next((("node", k, 0) for k, nd in enumerate(nodes) if nd["op"] ==
                             "BlockGrad" and nd["inputs"] == [("in", i)]), None)
                stop = stop or t.add("BlockGrad", [("in", i)])
                seeds[i] = t.add("elemwise_sub", [("in", i), stop])
            return seeds[i]

        parts: dict[int, list] = {k: [] for k in range(n_g)}
        losses: list[tuple[int, tuple, _Closure]] = []
        heads = frag.heads[n_out:]
        for c in self.closures:
            mine = [(i, h) for (i, cc), h in zip(self.picks, heads) if cc is c]
            lin = []
            for i, h in mine:
                if h in sources or (h[0] == "node" and linear[h[1]]):
                    lin.append((h, seed(i)))
                elif not self.op.need_top_grad:
                    losses.append((i, h, c))
                elif not is_zero(h):
                    raise native.NotNative.of("closure-constant", c.label,
                                              repr(self.op.signature.inputs[i]))
            if not lin:
                continue
            try:
                found = transpose(nodes, linear, lin, sources, t)
            except NotLinear as exc:
                raise native.NotNative.of("closure-not-linear", c.label, exc) from None
            for k, s in enumerate(sources):
                if found[s] is not None:
                    parts[k].append(found[s])
        out_heads = []
        for k, h in enumerate(fwd_heads):
            if parts.get(k):
                hk = parts[k][0] if len(parts[k]) == 1 else t.add("add_n", parts[k],
                                                                   num_args=len(parts[k]))
                h = t.add("elemwise_add", [h, hk])
            out_heads.append(h)
        alone = list(fwd_heads)  # the heads where no closure's input needs a gradient
        if not self.op.need_top_grad and self.auto:
            # An output layer's automatic gradient is that of the sum of its outputs.
            for k in range(len(out_heads)):
                stop = t.add("BlockGrad", [fwd_heads[k]])
                out_heads[k] = t.add("elemwise_add", [stop, t.add("zeros_like", [
                    t.add("make_loss", [fwd_heads[k]])])])
            alone = list(out_heads)
        for i, c_ref, c in losses:
            if shape(c_ref) != tuple(shapes[i]):
                raise native.NotNative(f"its {c.label} returns a gradient of shape "
                                        f"{shape(c_ref)} for an input of shape "
                                        f"{tuple(shapes[i])}")
            m = t.add("make_loss", [t.add("elemwise_mul", [("in", i), t.add("BlockGrad",
                                                                                [c_ref])])])
            h = out_heads[0]
            if out_shapes[0] == tuple(shapes[i]):  # (out_heads[0] is shaped like it)
                out_heads[0] = t.add("elemwise_add", [h, t.add("zeros_like", [m])])
            else:
                out_heads[0] = t.add("broadcast_add", [h, t.add("zeros_like", [
                    t.add("sum", [m])])])
        full = _pruned(nodes, out_heads, self.n)
        if out_heads != alone:
            # What a graph runs where none of the closures' inputs can need a gradient: the
            # forward alone (its coefficients would be computed in every forward for nothing).
            # (its inputs' BlockGrad nodes pass nothing there: none can need a gradient)
            through = {k: nd["inputs"][0] for k, nd in enumerate(nodes) if nd["op"] ==
                       "BlockGrad" and nd["inputs"][0][0] == "in" and nd["inputs"][0][1]
                       in self.owned}

            def past(r):
                return through.get(r[1], r) if r[0] == "node" else r

            plain = [dict(nd, inputs=[past(r) for r in nd["inputs"]]) for nd in nodes]
            full.forward_only = _pruned(plain, [past(h) for h in alone], self.n)
            full.differentiates = tuple(sorted(self.owned))
        return full


def _pruned(nodes: list[dict], heads: list[tuple], n: int) -> native.NativeGraph:
    keep: set[int] = set()
    stack = [h[1] for h in heads if h[0] == "node"]
    while stack:
        k = stack.pop()
        if k in keep:
            continue
        keep.add(k)
        for r in nodes[k]["inputs"]:
            if r[0] == "in" and r[1] >= n:  # pragma: no cover - a rule left g in the graph
                raise native.NotNative("its transposed gradient still reads the head gradient")
            if r[0] == "node":
                stack.append(r[1])
    order = sorted(keep)
    new = {k: j for j, k in enumerate(order)}

    def moved(r):
        return ("node", new[r[1]], r[2]) if r[0] == "node" else r

    out = [dict(nodes[k], inputs=[moved(r) for r in nodes[k]["inputs"]]) for k in order]
    for j, nd in enumerate(out):
        nd["name"] = f"{nd['name']}" if not nd["name"].startswith("t") else f"g{j}_{nd['op']}"
    return native.NativeGraph(out, [moved(h) for h in heads])


def training_graph(op: CustomOperator, params: dict[str, Any], shapes, dtypes,
                   values) -> native.NativeGraph:
    """The training graph of an operator with its own gradient (raises ``native.NotNative``)."""
    b = Builder(op, params)
    first = list(values) if values is not None else on_values.passing(
        op, params, native.placeholders(shapes, dtypes, 1))
    second = native.perturbed(first)
    rec1 = b.record(first, seed=5)
    b.check(rec1)
    rec2 = b.record(second, seed=6)
    b.check(rec2)
    if compare.structure(rec1) != compare.structure(rec2):
        raise native.NotNative("its graph, or its gradient closures' graph, depends on the "
                                "input values (control flow on values read from its inputs)")
    changed = [rec1.nodes[i]["name"] for i in rec1.free
               if not consts.same(rec1.free[i], rec2.free[i])]
    if changed:
        raise native.NotNative("it or its gradient closures compute arrays from the inputs or "
                                "the head gradient outside the recorded graph (detach(), "
                                "backward() inside a closure, or arrays made from values read "
                                "back); the graph would hold them as constants")
    plain = on_values.forward_alone(op, params, shapes, dtypes, first)
    if plain is not None:
        return plain
    graph = b.assemble(rec1, shapes)
    graph.checks = rec1.checks  # its customop.require conditions, as NaN poisoning
    # Other values for the inputs that get gradients; labels, indices and scales keep theirs.
    # (Positive ones: where a closure's coefficient is inf, h(0) = inf * 0 is NaN, so the
    # inlined output is NaN where the op's is finite: degenerate inputs, said in the docs.)
    fixed = set(op.no_grad)
    third = native.placeholders(shapes, dtypes, 2)
    others = [v if name in fixed or not np.issubdtype(v.dtype, np.floating) else w
              for name, v, w in zip(op.signature.inputs, first, third)]
    wrong = on_values.mismatch(op, params, graph, others)
    if wrong:
        raise native.NotNative.of("closure-differs", wrong)
    graph.specialized = on_values.generality(b, graph, shapes, first)
    if graph.specialized:
        raise native.NotNative(f"its training graph holds only at the traced input shapes "
                                f"({graph.specialized}); a hybridized block may see others")
    graph.dtype_generic = on_values.dtype_generic(b, graph, shapes, dtypes, first)
    if graph.forward_only is not None:
        graph.forward_only = guards.guarded(graph.forward_only, rec1.guarded, rules.INDEX_GUARDS)
    return guards.guarded(graph, rec1.guarded, rules.INDEX_GUARDS)
