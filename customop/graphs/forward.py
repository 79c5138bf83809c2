"""An operator's forward as a graph of MXNet operators: recorded, checked, written.

:class:`ForwardGraph` is the builder :func:`customop.graphs.verify.verified` checks for
an operator whose gradient MXNet takes through its forward (and for every op in an
export): it records the forward (:mod:`customop.graphs.trace`), refuses a recording
that a table of :mod:`customop.graphs.rules` refuses, and writes the recording as a
:class:`~customop.symbol_json.NativeGraph` (constants folded or written as
operators, inputs that get no gradient stopped, values computed inside
``autograd.pause()`` cut from the gradient).
"""

from __future__ import annotations

from typing import Any

import mxnet as mx
import numpy as np

from ..opinfo import Differentiable
from ..symbol_json import NativeGraph, evaluate
from . import compare, guards, rules, trace
from . import constants as consts
from .rules import EXPORT, TRAIN, NotNative
from .sample_inputs import resized


class ForwardGraph:
    """Records one operator's forward and writes it as a native graph, for one purpose."""

    DIFFERS = "other-outputs"  # the refusal when the graph gives other outputs

    def __init__(self, op: Differentiable, params: dict[str, Any], purpose: str):
        self.op, self.params, self.purpose = op, params, purpose

    # ---- the builder's part of the verification (customop.graphs.verify) ------------------
    def recorded(self, values, seed: int = 5) -> trace.Recording:
        """The forward recorded on ``values`` (raises :class:`NotNative` for a refused one)."""
        try:
            rec = trace.record(self.op, list(values), self.params)
        except Exception as exc:  # noqa: BLE001 - any failure of the forward is the reason
            raise NotNative.of("forward-failed", f"{type(exc).__name__}: {exc}") from None
        self.check(rec)
        return rec

    def check(self, rec: trace.Recording) -> None:
        found = rules.recorded_refusal(rec, self.purpose)
        if found is not None:
            raise NotNative(found[1], found[0].name)

    def build(self, rec: trace.Recording, shapes) -> NativeGraph:
        return self.fragment(rec, shapes)

    def differs(self, graph: NativeGraph, first, second, rec2: trace.Recording) -> str:
        """ "" when the graph gives the forward's outputs at the second recording's values."""
        return "" if compare.close(evaluate(graph, second), rec2.outputs) else "differs"

    def other_values(self, first, shapes) -> list[np.ndarray]:
        return resized(first, shapes)

    def at(self, inputs, shapes) -> tuple[NativeGraph, trace.Recording]:
        """The graph at other inputs (raises what the forward raises there)."""
        rec = trace.record(self.op, inputs, self.params)
        self.check(rec)
        return self.fragment(rec, shapes), rec

    def differs_at(self, graph: NativeGraph, inputs, rec: trace.Recording, alt: NativeGraph) -> str:
        if compare.close(evaluate(graph, inputs, alt.constants), rec.outputs):
            return ""
        return "other outputs"

    def guarded(self, graph: NativeGraph, rec: trace.Recording) -> NativeGraph:
        return guards.guarded(graph, rec.guarded, rules.INDEX_GUARDS)

    # ---- the recorded graph as a NativeGraph ------------------------------------------------
    def fragment(self, rec: trace.Recording, shapes) -> NativeGraph:
        nodes = [dict(n, attrs=dict(n["attrs"])) for n in rec.nodes]
        for n in nodes:
            rewrite = rules.REWRITES.get(n["op"])
            if rewrite is not None:
                n["op"], n["attrs"] = rewrite(n["attrs"])
        slot = {node: i for i, node in enumerate(rec.inputs) if node is not None}
        const, values = consts.folded(nodes, slot, rec.free, rec.heads)
        out_nodes: list[dict[str, Any]] = []
        constants: dict[str, np.ndarray] = {}
        refs: dict[tuple[int, int], tuple] = {}
        placed: dict[int, int] = {}

        def ref(j: int, k: int) -> tuple:
            found = refs.get((j, k))
            if found is None:
                if j in slot:
                    found = ("in", slot[j])
                    if self.frozen(slot[j]):  # no gradient reaches it (MXNet would give one)
                        found = consts.add_node(out_nodes, "BlockGrad", {}, [found])
                elif const[j]:
                    found = self._constant(
                        values[(j, k)], out_nodes, constants, shapes, f"{nodes[j]['name']}_{k}"
                    )
                else:
                    found = ("node", placed[j], k)
                refs[(j, k)] = found
            return found

        stopped: dict[tuple, tuple] = {}

        def leaving(j: int, k: int, into: int | None) -> tuple:
            # A value computed inside mx.autograd.pause() carries no gradient out of it.
            r = ref(j, k)
            if (
                self.purpose == TRAIN
                and j in rec.paused
                and r[0] == "node"
                and (into is None or into not in rec.paused)
            ):
                if r not in stopped:
                    stopped[r] = consts.add_node(out_nodes, "BlockGrad", {}, [r])
                r = stopped[r]
            return r

        for j, n in enumerate(nodes):
            if j in slot or const[j]:
                continue
            if n["op"] == "null":
                raise NotNative.of("unread-array")
            inputs = [leaving(e[0], e[1], j) for e in n["inputs"]]
            out_nodes.append(
                {"op": n["op"], "name": n["name"], "attrs": n["attrs"], "inputs": inputs}
            )
            placed[j] = len(out_nodes) - 1
        heads = []
        for j, k in rec.heads:
            r = leaving(j, k, None)
            if r[0] != "node" or out_nodes[r[1]]["op"] == "BlockGrad":
                r = consts.add_node(out_nodes, "_copy", {}, [r])  # an input or a constant as is
            heads.append(r)
        return NativeGraph(out_nodes, heads, constants)

    def frozen(self, i: int) -> bool:
        """Whether input ``i`` gets no gradient in this graph (it is stopped)."""
        op = self.op
        if self.purpose != TRAIN:
            return False
        return op.signature.inputs[i] in op.no_grad or not op.auto_grad

    def _constant(self, value: np.ndarray, nodes, constants, shapes, name) -> tuple:
        if self.purpose == EXPORT:
            constants[name] = value
            return ("const", name)
        start = len(nodes)
        expressed = consts.expressed(value, nodes, shapes)
        if expressed is None:
            raise NotNative.of("constant-unheld", value.shape, value.dtype)
        # MXNet parses number attributes itself: the written constant must be exact.
        probe = NativeGraph(
            [dict(n, inputs=[_shifted(r, start) for r in n["inputs"]]) for n in nodes[start:]],
            [_shifted(expressed, start)],
        )
        try:
            got = evaluate(probe, [np.zeros(s, np.float32) for s in shapes])[0]
        except mx.base.MXNetError as exc:
            got = exc
        if not isinstance(got, np.ndarray) or not consts.same(
            got.reshape(value.shape) if got.size == value.size else got, value
        ):
            raise NotNative.of("constant-inexact", value.shape, value.dtype)
        return expressed


def _shifted(r: tuple, start: int) -> tuple:
    return ("node", r[1] - start, r[2]) if r[0] == "node" else r
