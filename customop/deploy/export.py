"""``customop.export``: a deployable model, our ops written as MXNet's own operators.

Gluon's ``block.export`` writes each decorated op as a ``Custom`` node: the files
then need Python, customop and the op's module wherever they run, MXNet's C++
predict API cannot run them and ``mx.onnx.export_model`` refuses them.  Here each
``'mxnet'``-mode op whose forward traces to a graph of MXNet operators (see
:mod:`customop.graphs.graph_verdicts`; ``def_grad`` ops too, inference takes no gradient) is
written as that graph, and the files load with plain MXNet.
"""

from __future__ import annotations

import contextlib
import io
import json
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import mxnet as mx
import numpy as np

from .. import runtime, symbol_json
from ..graphs import graph_verdicts, splice
from . import batch_sizes, rewrites

CHOICES = ("raise", "warn")


class NotInlinedError(ValueError):
    """An export found ops that stay ``Custom`` nodes, and was told to refuse them."""


@dataclass
class Exported:
    """What :func:`export` wrote, and which ``Custom`` nodes stayed (with why)."""

    symbol_file: str
    params_file: str
    # What a loader feeds: name -> (shape, dtype) exported at, in the forward's order; an
    # input the graph does not read (a label that only shapes a loss's gradient) is left out.
    inputs: dict[str, tuple] = field(default_factory=dict)
    inlined: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)  # what the loaders list, in order
    # Why the graph holds at the exported input shapes only ([] when it does not); its
    # inputs then carry those shapes, and loaders refuse others.
    fixed: list[str] = field(default_factory=list)
    # The inputs whose axis 0 is a batch the graph runs at any size of ([] when fixed).
    batch_inputs: list[str] = field(default_factory=list)


@dataclass
class OnnxModel:
    """What :func:`to_onnx` wrote: the file, its input and output names (the export's)."""

    file: str
    inputs: list[str]
    outputs: list[str]


def export(
    block: mx.gluon.HybridBlock,
    path: str,
    *inputs: Any,
    epoch: int = 0,
    not_inlined: str = "raise",
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
) -> Exported:
    """Write ``path-symbol.json`` and ``path-%04d.params`` for deployment.

    Like ``block.export(path, epoch)``, with every ``'mxnet'``-mode operator of
    ours whose forward traces to MXNet operators written as those operators:
    the files load with plain MXNet (``mx.gluon.SymbolBlock.imports``, no
    customop installed), ``mx.mod.Module``, MXNet's C predict API, and convert
    with :func:`to_onnx`.  ``inputs`` are example inputs for the block's
    ``forward`` (NDArrays): the ops are traced at their shapes and dtypes.

    ``input_names`` name the graph's inputs, one per input of the forward and in
    its order (default: Gluon's ``data``/``data0``, ``data1``, ...);
    ``output_names`` its outputs (default: Gluon's names; MXNet lists each as
    ``<name>_output``).  The returned :class:`Exported` says what a loader
    feeds (``inputs``: an input the graph does not read, such as a label that
    only shapes a loss's gradient, is left out) and gets back (``outputs``).
    Arrays an op builds are parameters (saved in the params file, with their
    shapes and dtypes in the graph), never inputs.

    The graph runs at other batch sizes where the math allows: arrays an op
    builds that follow the batch size become operators of the input's shape, and
    the export is checked at a larger batch.  Where an op fixes the shapes,
    ``fixed`` names it and the graph checks each input's shape, so that every
    loader refuses another shape with an error naming the op.  Else every other
    axis is checked (``<input>_must_have_shape_Nx6``): the ops' own checks ran at
    the exported shapes, and MXNet would broadcast a wrong one.  Value checks
    (:func:`customop.require`) travel as NaN outputs.

    Any ``Custom`` node that cannot be written as MXNet operators (a
    ``'numpy'``-mode op, an op with auxiliary states, a forward that reads
    values back, ...; :func:`customop.explain` says why) is named: with
    ``not_inlined='raise'`` (default) the export raises
    :class:`NotInlinedError` and writes nothing; with ``'warn'`` it warns and
    writes the graph with those nodes as they are (loading it then needs
    customop, see :func:`customop.imports`).

    Example:
        >>> import mxnet as mx, tempfile, os
        >>> import customop
        >>> from customop import ops
        >>> class Decode(mx.gluon.HybridBlock):
        ...     def hybrid_forward(self, F, offsets, anchors):
        ...         return ops.box_decode(offsets, anchors)
        >>> net = Decode()
        >>> path = os.path.join(tempfile.mkdtemp(), 'decode')
        >>> done = customop.export(net, path, mx.nd.zeros((1, 8, 4)), mx.nd.ones((1, 8, 4)),
        ...                        input_names=['offsets', 'anchors'], output_names=['boxes'])
        >>> done.kept, '"Custom"' in open(done.symbol_file).read()
        ([], False)
        >>> list(done.inputs), done.outputs, done.fixed
        (['offsets', 'anchors'], ['boxes_output'], [])
    """
    if not_inlined not in CHOICES:
        raise ValueError(
            f"customop.export: not_inlined must be one of {CHOICES}, got {not_inlined!r}"
        )
    if not isinstance(block, mx.gluon.HybridBlock):
        raise TypeError(f"customop.export: expected a HybridBlock, got {type(block).__name__}")
    if not inputs or not all(isinstance(a, mx.nd.NDArray) for a in inputs):
        raise TypeError(
            "customop.export(block, path, *inputs): pass example inputs for the "
            "block's forward as NDArrays (the ops are traced at their shapes)"
        )
    data, sym, shapes, dtypes = symbol_json.block_signature(block, inputs)
    if len(data) != len(inputs):
        raise TypeError(
            f"customop.export: the block's forward takes {len(data)} input(s), "
            f"got {len(inputs)} example input(s)"
        )
    names = _input_names(input_names, [d.name for d in data])
    params = {}
    for name, param in block.collect_params().items():
        params[name] = param.data()  # raises for one never initialized
        shapes[name], dtypes[name] = param.shape, param.dtype
    found = splice.inline(sym, shapes, dtypes, graph_verdicts.EXPORT)
    kept = [str(k) for k in found.kept] if found is not None else []
    kept += splice.foreign(symbol_json.parse(sym))
    if kept:
        text = (
            "customop.export: these Custom nodes cannot be written as MXNet operators:\n  "
            + "\n  ".join(kept)
        )
        if not_inlined == "raise":
            raise NotInlinedError(
                text + "\n(pass not_inlined='warn' to export them as Custom "
                "nodes: loading the files then needs customop)"
            )
        warnings.warn(
            text + "\nThey stay Custom nodes: loading the files needs customop.", stacklevel=2
        )

    def retrace(other: dict) -> Any:  # the splice at other data shapes
        return splice.inline(sym, {**shapes, **other}, dtypes, graph_verdicts.EXPORT)

    written = rewrites.deployable(
        sym, found, [d.name for d in data], names, list(inputs), output_names, retrace
    )
    sym, constants = written.symbol, written.constants
    if found is not None and found.inlined and not written.fixed and written.batched:
        why = _other_batch_differs(
            block,
            sym,
            params,
            constants,
            names,
            list(inputs),
            [names[[d.name for d in data].index(n)] for n in written.batched],
        )
        if why:
            written.fixed.append(why)
            sym = rewrites.guarded(sym, dict(zip(names, inputs)), "the_export")
    if found is not None and found.inlined and not written.fixed:
        # the ops' shape checks ran at the exported shapes: no other shape but a batch size
        gluon = [d.name for d in data]
        sym = rewrites.guarded_other_axes(
            sym, dict(zip(names, inputs)), [names[gluon.index(n)] for n in written.batched]
        )
    symbol_file, params_file = f"{path}-symbol.json", f"{path}-{epoch:04d}.params"
    arg_names, aux_names = set(sym.list_arguments()), set(sym.list_auxiliary_states())
    saved: dict[str, mx.nd.NDArray] = {}
    for name, value in params.items():
        if name in arg_names:
            saved[f"arg:{name}"] = value
        elif name in aux_names:
            saved[f"aux:{name}"] = value
    for name, value in constants.items():
        saved[f"arg:{name}"] = mx.nd.array(value, dtype=value.dtype)
    sym.save(symbol_file)
    mx.nd.save(params_file, saved)
    read = set(sym.list_inputs())
    inputs_at = {n: (tuple(a.shape), np.dtype(a.dtype)) for n, a in zip(names, inputs) if n in read}
    gluon = [d.name for d in data]
    batched = [] if written.fixed else [names[gluon.index(n)] for n in written.batched]
    return Exported(
        symbol_file,
        params_file,
        inputs_at,
        found.inlined if found is not None else [],
        kept,
        sym.list_outputs(),
        written.fixed,
        [n for n in batched if n in read],
    )


def _other_batch_differs(block, sym, params, constants, names, inputs, batched) -> str:
    """ "" when the exported graph gives the block's outputs at a larger batch size too."""
    longer = batch_sizes.longer_batch(names, inputs, batched)
    size = longer[names.index(batched[0])].shape[0]
    try:
        with mx.autograd.pause():
            want = block(*[mx.nd.array(a, dtype=a.dtype) for a in longer])
    except Exception:  # noqa: BLE001 - the block itself refuses it: nothing to compare
        return ""
    want = [want] if isinstance(want, mx.nd.NDArray) else list(want)
    try:
        got = rewrites.run(sym, {**params, **constants, **dict(zip(names, longer))})
    except mx.base.MXNetError as exc:
        return f"the exported graph fails at batch size {size}: {str(exc).splitlines()[0]}"
    if len(got) != len(want) or not all(
        g.shape == w.shape and np.allclose(g, w.asnumpy(), rtol=1e-4, atol=1e-5, equal_nan=True)
        for g, w in zip(got, want)
    ):
        return f"the exported graph gives other outputs than the block at batch size {size}"
    return ""


def _input_names(chosen, gluon: list[str]) -> list[str]:
    if chosen is None:
        return list(gluon)
    chosen = [chosen] if isinstance(chosen, str) else list(chosen)
    if len(chosen) != len(gluon) or not all(isinstance(n, str) and n for n in chosen):
        raise ValueError(
            f"customop.export: input_names must name each of the {len(gluon)} "
            f"input(s) of the block's forward, in its order; got {chosen!r}"
        )
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"customop.export: input_names must differ; got {chosen!r}")
    return chosen


ONNX_OPSET = 13  # the newest opset MXNet 1.9.1's converter has translations for


def to_onnx(exported: Exported, onnx_file: str) -> OnnxModel:
    """Convert :func:`export`'s files to ONNX with ``mx.onnx.export_model``.

    Needs the ``onnx`` package (``pip install 'customop[onnx]'``).  Inputs are
    given at the shapes and dtypes the model was exported with, the batch axis
    of ``exported.batch_inputs`` left open.  MXNet 1.9.1's
    converter writes opset-13 operators but declares the newest opset the
    installed ``onnx`` knows (19 for onnx 1.14.1), and ONNX Runtime then
    rejects its ``Split`` nodes; the file written here declares opset 13.  The
    ONNX model's inputs and outputs are named and ordered as ``exported.inputs``
    and ``exported.outputs`` (the converter's names and order are replaced, and
    the parameters it lists as inputs are left out).

    Example:
        >>> import customop  # doctest: +SKIP
        >>> done = customop.export(net, 'model', x)  # doctest: +SKIP
        >>> customop.to_onnx(done, 'model.onnx').inputs  # doctest: +SKIP
        ['data']
    """
    try:
        import onnx
    except ImportError as exc:
        raise ImportError(
            "customop.to_onnx needs the 'onnx' package: pip install "
            "'customop[onnx]' (onnx 1.14.1, the version measured beside "
            "mxnet 1.9.1)"
        ) from exc
    from mxnet.onnx import export_model

    runtime.install("onnxops")  # translations of operators MXNet's converter lacks

    with open(exported.symbol_file, encoding="utf-8") as f:
        graph = json.load(f)
    # the shape checks have no ONNX translation; an ONNX model of fixed shapes checks them
    sym = symbol_json.load(
        _one_hot_in_range(_reversed_named(_digit_free_names(rewrites.unguarded(graph))))
    )
    in_graph = [n for n in sym.list_inputs() if n in exported.inputs]  # the converter's order
    shapes = [tuple(exported.inputs[n][0]) for n in in_graph]
    dtypes = [exported.inputs[n][1] for n in in_graph]
    saved = mx.nd.load(exported.params_file)
    saved = saved if isinstance(saved, dict) else {}
    params = [
        {k[4:]: v for k, v in saved.items() if k.startswith("arg:")},
        {k[4:]: v for k, v in saved.items() if k.startswith("aux:")},
    ]
    batch = set(exported.batch_inputs)
    try:
        if batch and not exported.fixed:  # the batch axis left open, as in the MXNet graph
            with contextlib.redirect_stdout(io.StringIO()):  # its print of reversed nodes
                export_model(
                    sym,
                    params,
                    shapes,
                    dtypes,
                    onnx_file,
                    dynamic=True,
                    dynamic_input_shapes=[
                        (None,) + s[1:] if n in batch else s for n, s in zip(in_graph, shapes)
                    ],
                )
        else:
            batch = set()
    except Exception:  # noqa: BLE001 - a converter that needs the shapes: the exported ones
        batch = set()
    if not batch:
        with contextlib.redirect_stdout(io.StringIO()):
            export_model(sym, params, shapes, dtypes, onnx_file)
    model = onnx.load(onnx_file)
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx") and opset.version > ONNX_OPSET:
            opset.version = ONNX_OPSET
    names = list(exported.outputs) or sym.list_outputs()
    _onnx_names(model, list(exported.inputs), sym.list_outputs(), names)
    onnx.checker.check_model(model)
    onnx.save(model, onnx_file)
    return OnnxModel(onnx_file, list(exported.inputs), names)


# MXNet's converter writes ``_rminus_scalar`` and ``_rdiv_scalar`` as ``x - s`` and ``x / s``
# unless the node's name starts with (constant inputs) or holds (others) these markers,
# which only MXNet's automatic names have (measured: ops.focal_loss's ``1 - p`` came out
# as ``p - 1`` in ONNX Runtime); our exports name nodes ``<op>_node_<k>``.
_REVERSED = {"_rminus_scalar": "_rminusscalar", "_rdiv_scalar": "_rdivscalar"}


def _reversed_named(graph: dict) -> dict:
    """``graph`` with each reversed scalar node's name marked as the converter needs."""
    for node in graph["nodes"]:
        marker = _REVERSED.get(node["op"])
        if marker and not node["name"].startswith(marker):
            node["name"] = f"{marker}_{node['name']}"
    return graph


def _digit_free_names(graph: dict) -> dict:
    """``graph`` with each operator node's name that ends in a digit ended by ``_``.

    The converter names a node's outputs ``<name>0``, ``<name>1``, ... when it has several,
    so a node ``op_node_1`` with two outputs wrote ``op_node_10``, the name of another node
    (ONNX's checker: "Graph must be in single static assignment (SSA) form").
    """
    for node in graph["nodes"]:
        if node["op"] != "null" and node["name"][-1:].isdigit():
            node["name"] += "_"
    return graph


def _one_hot_in_range(graph: dict) -> dict:
    """``graph`` with each ``one_hot`` zeroed where its index is negative, as MXNet's is.

    The converter writes ``one_hot`` as ONNX ``OneHot``, which reads an index in
    ``[-depth, 0)`` from the end (measured: ops.focal_loss's background label, ``-1``
    after ``label - 1``, came out as the last class in ONNX Runtime; onnx's reference
    evaluator wraps every index, ``np.mod``).  A ``one_hot`` with other ``on_value`` and
    ``off_value`` than 1 and 0 becomes the 0/1 one, masked, then ``* (on - off) + off``.
    """
    nodes = [dict(n) for n in graph["nodes"]]
    moved = {}
    for i, node in enumerate(list(nodes)):
        if node["op"] != "one_hot":
            continue
        attrs = dict(symbol_json.attrs(node))
        on, off = float(attrs.pop("on_value", 1.0)), float(attrs.pop("off_value", 0.0))
        nodes[i] = dict(node, attrs=attrs)
        name, dtype = node["name"], attrs.get("dtype", "float32")
        k = len(nodes)
        nodes += [
            {
                "op": "_greater_equal_scalar",
                "name": f"{name}_nonneg",
                "attrs": {"scalar": "0"},
                "inputs": [node["inputs"][0]],
            },
            {
                "op": "Cast",
                "name": f"{name}_nonneg_cast",
                "attrs": {"dtype": dtype},
                "inputs": [[k, 0, 0]],
            },
            {
                "op": "expand_dims",
                "name": f"{name}_nonneg_axis",
                "attrs": {"axis": "-1"},
                "inputs": [[k + 1, 0, 0]],
            },
            {
                "op": "broadcast_mul",
                "name": f"{name}_in_range",
                "inputs": [[i, 0, 0], [k + 2, 0, 0]],
            },
        ]
        if (on, off) != (1.0, 0.0):
            nodes += [
                {
                    "op": "_mul_scalar",
                    "name": f"{name}_on",
                    "attrs": {"scalar": repr(on - off)},
                    "inputs": [[k + 3, 0, 0]],
                },
                {
                    "op": "_plus_scalar",
                    "name": f"{name}_off",
                    "attrs": {"scalar": repr(off)},
                    "inputs": [[k + 4, 0, 0]],
                },
            ]
        moved[i] = len(nodes) - 1
    if not moved:
        return graph
    for j, node in enumerate(nodes):
        if j < len(graph["nodes"]):
            node["inputs"] = [[moved.get(e[0], e[0]), e[1], 0] for e in node["inputs"]]
    heads = [[moved.get(h[0], h[0]), h[1], 0] for h in graph["heads"]]
    return symbol_json.toposorted(dict(graph, nodes=nodes, heads=heads))


def _onnx_names(model: Any, inputs: list[str], mxnet_outputs: list[str], names: list[str]) -> None:
    """The ONNX graph's inputs as the export lists them (its order, constants left out:
    MXNet's converter lists its initializers as inputs too), and its outputs renamed."""
    graph = model.graph
    by_name = {i.name: i for i in graph.input}
    ordered = [by_name[n] for n in inputs if n in by_name]
    del graph.input[:]
    graph.input.extend(ordered)
    written = [o.name for o in graph.output]
    renames = {}
    for k, name in enumerate(mxnet_outputs):  # the converter names output <node><index>|<node>
        node, _, index = name.rpartition("_output")
        old = next(n for n in (node + index, node, name, written[k]) if n in written)
        if old != names[k]:
            renames[old] = names[k]
    for node in graph.node:
        node.input[:] = [renames.get(n, n) for n in node.input]
        node.output[:] = [renames.get(n, n) for n in node.output]
    for out in graph.output:
        out.name = renames.get(out.name, out.name)
