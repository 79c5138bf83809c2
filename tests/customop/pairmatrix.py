"""Issue 25 item 3: every ordered pair of differentiable operators in one graph, on each path.

Run as ``python -m tests.customop.pairmatrix PATHS [--errors-only]`` (a comma-separated
list of ``bound``, ``hybridized`` and ``exported``) from the repository root: for every
ordered pair (A, B) of the operators in ``CASES`` it builds one graph holding both (A's
node created first; B's main input shifted by ``0.1 * mean`` of A's first output, so B's
gradient also flows through A), runs forward and backward on each path and the same math
recorded imperatively (the ops called on ``mx.nd`` under ``mx.autograd.record()``, their
default dispatch), and prints one JSON object: ``{PATH: {"A>B": {"path": {...}, "recorded":
{...}}}}`` with the heads' values, the gradient of every differentiable input and the aux
states after the backward, or ``{PATH: {"A>B": {"error": "..."}}}`` when a run raised
(``--errors-only``: without the recorded runs).  tests/customop/test_pairs.py compares.

Operators in the matrix: those of ``ops/`` with a gradient for some float input, plus
four user-style ops from tests/customop/composeops.py.  Left out, because no float input
has a gradient (their docstrings: zeros by definition):

* ``box_iou`` (``auto_grad=False``, no ``def_grad``: IoU is a matching criterion);
* ``box_nms`` (a selection: ``auto_grad=False``, zero gradient);
* ``ohem_sampler`` (produces sample weights: ``auto_grad=False``, zero gradient).

``topk`` is in with ``ret_typ='value'`` (the one output with a gradient: the head
gradient scattered back to the selected positions); ``box_encode`` is in through its
``targets`` output (differentiable w.r.t. anchors, refs, means and stds; ``masks`` has
zero gradient).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback
from collections import namedtuple

import mxnet as mx
import numpy as np

import customop
from customop import ops
from customop.dispatch import forced_path
from tests.customop import composeops as C

# inputs: {name: array}; grads: names with a gradient; aux: {name: shape};
# apply(F, ins, aux, node): list of outputs (aux None: left to MXNet; node: Symbol name);
# output_layer: its output is a head as it is (need_top_grad=False), else make_loss(sum(w*out)).
Case = namedtuple("Case", "inputs grads aux apply output_layer")


def _f(rng, *shape, scale=1.0):
    return (rng.randn(*shape) * scale).astype(np.float32)


def _named(F, node):
    return {"name": node} if F is mx.sym else {}


def _with_aux(aux, name):
    return () if aux is None else (aux[name],)


def _cases():
    rng = np.random.RandomState(25)
    label4 = np.array([0, 2, 1, 3], np.float32)
    anchors = np.array([[[0, 0, 4, 4], [2, 1, 6, 5], [1, 3, 5, 9]]], np.float32)
    refs = np.array([[[0.5, 0, 4, 5], [2, 2, 7, 5]]], np.float32)
    cases = {
        "focal_loss": Case(
            {"pred": _f(rng, 4, 3), "label": label4},
            ("pred",),
            {},
            lambda F, i, a, n: [ops.focal_loss(i["pred"], i["label"], **_named(F, n))],
            False,
        ),
        "smooth_l1": Case(  # optional weight left out: the '~without_weight' op
            {"data": _f(rng, 4, 3), "sigma": np.array([1.5], np.float32)},
            ("data",),
            {},
            lambda F, i, a, n: [ops.smooth_l1(i["data"], i["sigma"], **_named(F, n))],
            False,
        ),
        "wing_loss": Case(
            {
                "pred": _f(rng, 4, 3, scale=3),
                "target": _f(rng, 4, 3),
                "weight": np.abs(_f(rng, 1, 3)) + 0.5,
            },
            ("pred", "target", "weight"),
            {},
            lambda F, i, a, n: [
                ops.wing_loss(
                    i["pred"], i["target"], i["weight"], w=2.0, epsilon=1.0, **_named(F, n)
                )
            ],
            False,
        ),
        "center_loss": Case(
            {"data": _f(rng, 4, 2), "label": np.array([0, 2, 1, 0], np.float32)},
            ("data",),
            {"centers": (3, 2)},
            lambda F, i, a, n: [
                ops.center_loss(
                    i["data"], i["label"], *_with_aux(a, "centers"), num_class=3, **_named(F, n)
                )
            ],
            False,
        ),
        "softmax_ce": Case(
            {"data": _f(rng, 4, 3), "label": np.array([0, 2, 1, 1], np.float32)},
            ("data",),
            {},
            lambda F, i, a, n: [ops.softmax_ce(i["data"], i["label"], **_named(F, n))],
            True,
        ),
        "tile": Case(
            {"data": _f(rng, 2, 3)},
            ("data",),
            {},
            lambda F, i, a, n: [ops.tile(i["data"], reps=(2, 1), **_named(F, n))],
            False,
        ),
        "topk": Case(
            {"data": _f(rng, 2, 5)},
            ("data",),
            {},
            lambda F, i, a, n: [ops.topk(i["data"], k=3, ret_typ="value", **_named(F, n))],
            False,
        ),
        "arr_pick": Case(
            {
                "arr": _f(rng, 2, 3, 5),
                "indicate": np.array([[[0, 1, 1, 0, 1]], [[1, 0, 0, 1, 0]]], np.float32),
            },
            ("arr",),
            {},
            lambda F, i, a, n: [ops.arr_pick(i["arr"], i["indicate"], num=2, **_named(F, n))],
            False,
        ),
        "box_encode": Case(
            {
                "anchors": anchors,
                "samples": np.array([[1, -1, 1]], np.float32),
                "matches": np.array([[0, 1, 1]], np.float32),
                "refs": refs,
                "means": np.array([0.1, 0, -0.1, 0], np.float32),
                "stds": np.array([0.1, 0.1, 0.2, 0.2], np.float32),
            },
            ("anchors", "refs", "means", "stds"),
            {},
            lambda F, i, a, n: [
                ops.box_encode(
                    i["samples"],
                    i["matches"],
                    i["anchors"],
                    i["refs"],
                    i["means"],
                    i["stds"],
                    **_named(F, n),
                )[0]
            ],
            False,
        ),
        "box_decode": Case(
            {"data": _f(rng, 2, 3, 4, scale=0.3), "anchors": anchors},
            ("data", "anchors"),
            {},
            lambda F, i, a, n: [
                ops.box_decode(
                    i["data"],
                    i["anchors"],
                    std0=0.1,
                    std1=0.1,
                    std2=0.2,
                    std3=0.2,
                    format="corner",
                    **_named(F, n),
                )
            ],
            False,
        ),
        # user-style ops (tests/customop/composeops.py)
        "output_layer": Case(
            {"x": _f(rng, 4, 3), "target": _f(rng, 4, 3)},
            ("x",),
            {},
            lambda F, i, a, n: [C.l2_output(i["x"], i["target"], **_named(F, n))],
            True,
        ),
        "aux_op": Case(
            {"x": _f(rng, 3, 2)},
            ("x",),
            {"count": (1,)},
            lambda F, i, a, n: [C.counted_double(i["x"], *_with_aux(a, "count"), **_named(F, n))],
            False,
        ),
        "two_outputs": Case(
            {"x": _f(rng, 2, 3)},
            ("x",),
            {},
            lambda F, i, a, n: list(C.split_two(i["x"], **_named(F, n))),
            False,
        ),
        "numpy_op": Case(
            {"x": _f(rng, 3, 2)},
            ("x",),
            {},
            lambda F, i, a, n: [C.cube_np(i["x"], **_named(F, n))],
            False,
        ),
    }
    return cases


CASES = _cases()
PAIRS = [(a, b) for a in CASES for b in CASES]


class Pair:
    """The graph of one ordered pair: every input is named ``a_<input>`` or ``b_<input>``,
    the head weights ``a_w<k>``/``b_w<k>`` (one array per output that is not an output layer)."""

    def __init__(self, first, second):
        self.parts = [("a_", CASES[first]), ("b_", CASES[second])]
        rng = np.random.RandomState(7)
        self.values = {p + k: v for p, case in self.parts for k, v in case.inputs.items()}
        self.grads = [p + k for p, case in self.parts for k in case.grads]
        self.aux = {p + k: s for p, case in self.parts for k, s in case.aux.items()}
        # output shapes (for the head weights): one plain forward
        shapes = [
            [
                o.shape
                for o in case.apply(
                    mx.nd,
                    {k: mx.nd.array(v) for k, v in case.inputs.items()},
                    {k: mx.nd.zeros(s) for k, s in case.aux.items()},
                    None,
                )
            ]
            for _, case in self.parts
        ]
        for (p, case), outs in zip(self.parts, shapes):
            if not case.output_layer:
                for k, shape in enumerate(outs):
                    self.values[f"{p}w{k}"] = rng.uniform(0.5, 1.5, shape).astype(np.float32)
        self.names = sorted(self.values)

    def heads(self, F, ins, aux):
        """A's node, then B's (its first gradient input plus 0.1 * mean of A's output 0)."""
        heads, first_out = [], None
        for p, case in self.parts:
            mine = {k: ins[p + k] for k in case.inputs}
            if first_out is not None:
                main = case.grads[0]
                mine[main] = F.broadcast_add(mine[main], 0.1 * F.mean(first_out))
            mine_aux = None if aux is None else {k: aux[p + k] for k in case.aux}
            outs = case.apply(F, mine, mine_aux, p + "node")
            first_out = outs[0] if first_out is None else first_out
            if case.output_layer:
                heads.extend(outs)
            else:
                heads.extend(F.make_loss(F.sum(o * ins[f"{p}w{k}"])) for k, o in enumerate(outs))
        return heads


def _summary(heads, grads, aux):
    return {
        "heads": [h.asnumpy().tolist() for h in heads],
        "grads": {k: g.asnumpy().tolist() for k, g in grads.items()},
        "aux": {k: a.asnumpy().tolist() for k, a in aux.items()},
    }


def recorded(pair, path="native"):
    """The pair recorded imperatively: the ops' paths before issue 41 (``native``: an op
    without def_grad records its forward's operators, one with def_grad runs its closures
    in Python), the reference, or each op's native graph where it has one (``graph``)."""
    ins = {k: mx.nd.array(v) for k, v in pair.values.items()}
    aux = {k: mx.nd.zeros(s) for k, s in pair.aux.items()}
    for k in pair.grads:
        ins[k].attach_grad()
    with forced_path(path), mx.autograd.record():
        heads = pair.heads(mx.nd, ins, aux)
    mx.autograd.backward(heads)
    return _summary(heads, {k: ins[k].grad for k in pair.grads}, aux)


def bound(pair):
    sym = mx.sym.Group(pair.heads(mx.sym, {k: mx.sym.var(k) for k in pair.names}, None))
    reqs = {k: "write" if k in pair.grads else "null" for k in pair.names}
    exe = sym.simple_bind(mx.cpu(), grad_req=reqs, **{k: v.shape for k, v in pair.values.items()})
    for k, v in pair.values.items():
        exe.arg_dict[k][:] = v
    exe.forward(is_train=True)
    exe.backward()
    aux = {k: exe.aux_dict[k.replace("_", "_node_", 1)] for k in pair.aux}
    return _summary(exe.outputs, {k: exe.grad_dict[k] for k in pair.grads}, aux)


class PairBlock(mx.gluon.HybridBlock):
    """The pair as a Gluon block: inputs in ``pair.names`` order, aux states as Parameters."""

    def __init__(self, pair, **kwargs):
        super().__init__(**kwargs)
        self.pair = pair
        with self.name_scope():
            for k, shape in pair.aux.items():
                # an attribute: Gluon passes it to hybrid_forward by that name
                setattr(
                    self, k, self.params.get(k, shape=shape, init=mx.init.Zero(), grad_req="null")
                )

    def hybrid_forward(self, F, *args, **aux):
        ins = dict(zip(self.pair.names, args))
        return tuple(self.pair.heads(F, ins, {k: aux[k] for k in self.pair.aux}))


def _run_block(net, pair):
    ins = [mx.nd.array(pair.values[k]) for k in pair.names]
    for k, x in zip(pair.names, ins):
        if k in pair.grads:
            x.attach_grad()
    with mx.autograd.record():
        heads = net(*ins)
    heads = list(heads) if isinstance(heads, (list, tuple)) else [heads]
    mx.autograd.backward(heads)
    return heads, {k: x.grad for k, x in zip(pair.names, ins) if k in pair.grads}


def _aux_of(net, pair):
    params = net.collect_params()
    return {k: next(p.data() for name, p in params.items() if name.endswith(k)) for k in pair.aux}


def hybridized(pair):
    net = PairBlock(pair)
    net.initialize()
    net.hybridize()
    heads, grads = _run_block(net, pair)
    return _summary(heads, grads, _aux_of(net, pair))


def exported(pair):
    """Export a hybridized block that ran one forward (not training), reload, train on it."""
    net = PairBlock(pair)
    net.initialize()
    net.hybridize()
    net(*[mx.nd.array(pair.values[k]) for k in pair.names])
    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "pair")
        net.export(prefix)
        loaded = customop.imports(
            prefix + "-symbol.json",
            [f"data{i}" for i in range(len(pair.names))],
            prefix + "-0000.params",
        )
    loaded.hybridize()
    heads, grads = _run_block(loaded, pair)
    return _summary(heads, grads, _aux_of(loaded, pair))


PATHS = {"bound": bound, "hybridized": hybridized, "exported": exported}


def main(paths, references=True):
    """Every pair on each of ``paths`` (one process serves them all: MXNet's import, about
    3.5 s of CPU, and the recorded reference are paid once), as one JSON line:
    ``{path: {"A>B": {...}}}``.  Without ``references`` (``--errors-only``: a setting whose
    test reads only which pairs raise) the recorded runs are left out."""
    result = {path: {} for path in paths}
    for a, b in PAIRS:
        key = f"{a}>{b}"
        try:
            pair = Pair(a, b)
            reference = recorded(pair) if references else None
            graph = recorded(pair, "graph") if references and "bound" in paths else None
        except Exception:  # noqa: BLE001 -- every failing pair is reported, not only the first
            for path in paths:
                result[path][key] = {"error": traceback.format_exc(limit=-3)}
            continue
        for path in paths:
            try:
                result[path][key] = {"recorded": reference, "path": PATHS[path](pair)}
                if path == "bound" and references:  # (one run also checks the imperative graphs)
                    result[path][key]["graph"] = graph
            except Exception:  # noqa: BLE001
                result[path][key] = {"error": traceback.format_exc(limit=-3)}
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1].split(","), references="--errors-only" not in sys.argv[2:])
