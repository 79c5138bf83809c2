"""Train one Gluon block four ways and return the loss of every step: the examples' harness.

The same block (its parameters copied from one seeded initialisation) takes plain SGD
steps (no momentum, no weight decay, ``rescale_grad`` 1) on four paths:

* ``imperative``: the block not hybridized, every op called on ``mx.nd`` under
  ``mx.autograd.record()``;
* ``hybridized``: ``block.hybridize()`` (one CachedOp graph);
* ``module``: the Symbol the block builds when called with ``mx.sym`` variables, trained by
  ``mx.mod.Module``;
* ``exported``: hybridized for ``export_after`` steps, exported, reloaded with
  ``customop.imports`` and trained further with a new ``Trainer``.  Plain SGD keeps no
  optimizer state, so the continued run must retrace the others exactly; exporting in
  the middle (not before step 1) checks both that the file holds the trained parameters
  and aux states and that the reloaded graph trains.

A block for this harness returns a tuple whose every output can take ``backward`` with
a head gradient of ones: losses (``F.make_loss``), output layers (``need_top_grad=False``)
and values wrapped in ``F.BlockGrad``.  Its Gluon ``Constant`` parameters (anchors, box
coder constants) stay fixed: ``Module`` gets them as ``fixed_param_names``; an exported
graph does not remember which parameters were constants, so the reloaded block's get
``grad_req='null'`` again.
"""

from __future__ import annotations

import os
import tempfile

import mxnet as mx
import numpy as np

import customop

PATHS = ("imperative", "hybridized", "module", "exported")


def initial_params(make_block, seed=0):
    """``{name: NumPy array}`` of one seeded initialisation (``make_block`` fixes the prefix)."""
    mx.random.seed(seed)
    net = make_block()
    net.initialize(mx.init.Xavier())
    return {name: p.data().asnumpy() for name, p in net.collect_params().items()}


def _fresh(make_block, params):
    net = make_block()
    net.initialize()
    for name, p in net.collect_params().items():
        p.set_data(mx.nd.array(params[name]))
    return net


def _constants(block):
    return [name for name, p in block.collect_params().items() if isinstance(p, mx.gluon.Constant)]


def _outputs(out):
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _gluon_step(net, trainer, batch):
    with mx.autograd.record():
        outs = _outputs(net(*[mx.nd.array(a) for a in batch]))
    mx.autograd.backward(outs)
    trainer.step(1)
    return [o.asnumpy() for o in outs]


def _sgd(params, lr):
    return mx.gluon.Trainer(params, "sgd", {"learning_rate": lr})


def train_gluon(make_block, params, batches, lr, hybridize):
    """The outputs of every step, on the ``imperative`` or ``hybridized`` path."""
    net = _fresh(make_block, params)
    if hybridize:
        net.hybridize()
    trainer = _sgd(net.collect_params(), lr)
    return [_gluon_step(net, trainer, batch) for batch in batches]


def train_module(make_block, params, batches, lr, input_names):
    """The outputs of every step through ``mx.mod.Module`` on the block's Symbol."""
    block = make_block()
    symbol = mx.sym.Group(_outputs(block(*[mx.sym.var(n) for n in input_names])))
    mod = mx.mod.Module(
        symbol, data_names=input_names, label_names=None, fixed_param_names=_constants(block)
    )
    mod.bind(data_shapes=[mx.io.DataDesc(n, a.shape) for n, a in zip(input_names, batches[0])])
    aux_names = set(symbol.list_auxiliary_states())
    mod.init_params(
        arg_params={n: mx.nd.array(a) for n, a in params.items() if n not in aux_names},
        aux_params={n: mx.nd.array(a) for n, a in params.items() if n in aux_names},
    )
    mod.init_optimizer(optimizer="sgd", optimizer_params={"learning_rate": lr, "rescale_grad": 1.0})
    steps = []
    for batch in batches:
        mod.forward_backward(mx.io.DataBatch([mx.nd.array(a) for a in batch]))
        mod.update()
        steps.append([o.asnumpy() for o in mod.get_outputs()])
    return steps


def train_exported(make_block, params, batches, lr, export_after=2):
    """Hybridized steps, ``export``, ``customop.imports``, then the remaining steps."""
    net = _fresh(make_block, params)
    net.hybridize()
    trainer = _sgd(net.collect_params(), lr)
    steps = [_gluon_step(net, trainer, batch) for batch in batches[:export_after]]
    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "model")
        net.export(prefix, epoch=export_after)
        names = [f"data{i}" for i in range(len(batches[0]))] if len(batches[0]) > 1 else "data"
        loaded = customop.imports(
            f"{prefix}-symbol.json", names, f"{prefix}-{export_after:04d}.params"
        )
    constants = set(_constants(net))
    for name, p in loaded.collect_params().items():
        if name in constants:
            p.grad_req = "null"
    loaded.hybridize()
    trainer = _sgd(loaded.collect_params(), lr)
    return steps + [_gluon_step(loaded, trainer, batch) for batch in batches[export_after:]]


def train_every_path(make_block, batches, lr, input_names, loss_of, before_path=None, seed=0):
    """``{path: [loss of step 1, 2, ...]}``; ``loss_of(outputs, batch)`` gives one step's loss.

    ``before_path`` (optional) runs before each path starts: seed a sampler's RNG there.
    """
    params = initial_params(make_block, seed)
    runs = {
        "imperative": lambda: train_gluon(make_block, params, batches, lr, hybridize=False),
        "hybridized": lambda: train_gluon(make_block, params, batches, lr, hybridize=True),
        "module": lambda: train_module(make_block, params, batches, lr, input_names),
        "exported": lambda: train_exported(make_block, params, batches, lr),
    }
    losses = {}
    for path in PATHS:
        if before_path is not None:
            before_path()
        losses[path] = [float(loss_of(outs, batch)) for outs, batch in zip(runs[path](), batches)]
    return losses


def print_losses(losses):
    """One row per step, one column per path, and the largest relative spread."""
    print("step " + "".join(f"{p:>14}" for p in PATHS) + "   max rel. diff")
    for step in range(len(losses[PATHS[0]])):
        row = np.array([losses[p][step] for p in PATHS])
        spread = (row.max() - row.min()) / abs(row).max()
        print(f"{step + 1:>4} " + "".join(f"{v:14.7f}" for v in row) + f"   {spread:.1e}")
