"""``customop.export``: a deployable model, our ops written as MXNet's own operators.

Gluon's ``block.export`` writes each decorated op as a ``Custom`` node: the files
then need Python, customop and the op's module wherever they run, MXNet's C++
predict API cannot run them and ``mx.onnx.export_model`` refuses them.  Here each
``'mxnet'``-mode op whose forward traces to a graph of MXNet operators (see
:mod:`customop.native`; ``def_grad`` ops too, inference takes no gradient) is
written as that graph, and the files load with plain MXNet.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import mxnet as mx
import numpy as np

from . import graph_json, native, registry, splice

CHOICES = ("raise", "warn")


class NotInlinedError(ValueError):
    """An export found ops that stay ``Custom`` nodes, and was told to refuse them."""


@dataclass
class Exported:
    """What :func:`export` wrote, and which ``Custom`` nodes stayed (with why)."""

    symbol_file: str
    params_file: str
    inputs: dict[str, tuple] = field(default_factory=dict)  # name -> (shape, dtype) exported at
    inlined: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)


@dataclass
class OnnxModel:
    """What :func:`to_onnx` wrote: the file, its input and output names in MXNet's order."""

    file: str
    inputs: list[str]
    outputs: list[str]


def export(block: mx.gluon.HybridBlock, path: str, *inputs: Any, epoch: int = 0,
           not_inlined: str = "raise") -> Exported:
    """Write ``path-symbol.json`` and ``path-%04d.params`` for deployment.

    Like ``block.export(path, epoch)``, with every ``'mxnet'``-mode operator of
    ours whose forward traces to MXNet operators written as those operators:
    the files load with plain MXNet (``mx.gluon.SymbolBlock.imports``, no
    customop installed) and convert with ``mx.onnx.export_model``.  ``inputs``
    are example inputs for the block's ``forward`` (NDArrays): the ops are
    traced at their shapes and dtypes, so the exported graph is meant for
    inputs of those shapes (arrays an op builds, such as ``ops.topk``'s
    constants, are saved as parameters at those shapes).

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
        >>> done = customop.export(net, path, mx.nd.zeros((1, 8, 4)), mx.nd.ones((1, 8, 4)))
        >>> done.kept, '"Custom"' in open(done.symbol_file).read()
        ([], False)
    """
    if not_inlined not in CHOICES:
        raise ValueError(f"customop.export: not_inlined must be one of {CHOICES}, got "
                         f"{not_inlined!r}")
    if not isinstance(block, mx.gluon.HybridBlock):
        raise TypeError(f"customop.export: expected a HybridBlock, got {type(block).__name__}")
    if not inputs or not all(isinstance(a, mx.nd.NDArray) for a in inputs):
        raise TypeError("customop.export(block, path, *inputs): pass example inputs for the "
                        "block's forward as NDArrays (the ops are traced at their shapes)")
    data, sym, shapes, dtypes = graph_json.block_signature(block, inputs)
    if len(data) != len(inputs):
        raise TypeError(f"customop.export: the block's forward takes {len(data)} input(s), "
                        f"got {len(inputs)} example input(s)")
    params = {}
    for name, param in block.collect_params().items():
        params[name] = param.data()  # raises for one never initialized
        shapes[name], dtypes[name] = param.shape, param.dtype
    found = splice.inline(sym, shapes, dtypes, native.EXPORT)
    kept = [str(k) for k in found.kept] if found is not None else []
    kept += graph_json.foreign(graph_json.parse(sym), registry.lookup)
    if kept:
        text = ("customop.export: these Custom nodes cannot be written as MXNet operators:\n  "
                + "\n  ".join(kept))
        if not_inlined == "raise":
            raise NotInlinedError(text + "\n(pass not_inlined='warn' to export them as Custom "
                                  "nodes: loading the files then needs customop)")
        warnings.warn(text + "\nThey stay Custom nodes: loading the files needs customop.",
                      stacklevel=2)
    if found is not None:
        sym = found.symbol
    constants = found.constants if found is not None else {}
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
    inputs_at = {d.name: (tuple(a.shape), np.dtype(a.dtype)) for d, a in zip(data, inputs)}
    return Exported(symbol_file, params_file, inputs_at,
                    found.inlined if found is not None else [], kept)


ONNX_OPSET = 13  # the newest opset MXNet 1.9.1's converter has translations for


def to_onnx(exported: Exported, onnx_file: str) -> OnnxModel:
    """Convert :func:`export`'s files to ONNX with ``mx.onnx.export_model``.

    Needs the ``onnx`` package (``pip install 'customop[onnx]'``).  Inputs are
    given at the shapes and dtypes the model was exported with.  MXNet 1.9.1's
    converter writes opset-13 operators but declares the newest opset the
    installed ``onnx`` knows (19 for onnx 1.14.1), and ONNX Runtime then
    rejects its ``Split`` nodes; the file written here declares opset 13.  The
    ONNX model takes its inputs, and names its outputs, as ``inputs`` and
    ``outputs`` say (in the order of the MXNet graph's outputs).

    Example:
        >>> import customop  # doctest: +SKIP
        >>> done = customop.export(net, 'model', x)  # doctest: +SKIP
        >>> customop.to_onnx(done, 'model.onnx').inputs  # doctest: +SKIP
        ['data']
    """
    import onnx
    from mxnet.onnx import export_model

    sym = mx.sym.load(exported.symbol_file)
    names = [n for n in sym.list_inputs() if n in exported.inputs]
    export_model(exported.symbol_file, exported.params_file,
                 [exported.inputs[n][0] for n in names], [exported.inputs[n][1] for n in names],
                 onnx_file)
    model = onnx.load(onnx_file)
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx") and opset.version > ONNX_OPSET:
            opset.version = ONNX_OPSET
    onnx.checker.check_model(model)
    onnx.save(model, onnx_file)
    written = {o.name for o in model.graph.output}
    outputs = []
    for name in sym.list_outputs():  # the converter names an output <node><index>, or <node>
        node, _, index = name.rpartition("_output")
        outputs.append(next(n for n in (node + index, node, name) if n in written))
    return OnnxModel(onnx_file, names, outputs)
