"""Ports: a decorated op's native graphs run as PyTorch and JAX operators.

An ``'mxnet'``-mode op that inlines is two graphs of MXNet operators: its forward, and
its training graph, whose gradient by the framework's own autograd is the op's (its
``def_grad`` closures, transposed: :mod:`customop.graphs.backward`).  ``to_torch`` and
``to_jax`` translate both node by node with one rule table per framework
(:mod:`.torch_rules`, :mod:`.jax_rules`); ``save_port`` writes them to one JSON file that
``load_port`` reads where MXNet is not installed.

Entry points: :func:`to_torch`, :func:`to_jax`, :func:`save_port` (they import
:mod:`.extract`, which needs MXNet) and :func:`load_port` (:mod:`.loading`).  Only
:mod:`.extract` and :mod:`.host` import MXNet (and the rest of customop); the file format
(:mod:`.portfile`), the graph runner (:mod:`.graph`) and the two frameworks' modules import
neither, so ``from customop.port import load_port`` works without MXNet.  torch and jax are
imported when a port for them is first built.
"""

from __future__ import annotations

from typing import Any

from .loading import load_port  # the MXNet-free entry point
from .runner import PortError, framework_module

__all__ = ["to_torch", "to_jax", "save_port", "load_port", "PortError"]


def to_torch(op: Any, **params: Any) -> Any:
    """``op`` as a PyTorch operator: a ``torch.library`` custom op with the op's own gradient.

    The op's native training graph (the one hybridized blocks run: its forward traced to
    MXNet operators, its ``def_grad`` closures transposed) is translated operator by operator
    into torch (:mod:`customop.port.torch_rules`).  The returned
    ``torch.library.custom_op`` (named ``customop::<op type>``) takes torch tensors in the
    op's input order (an optional input may be ``None``) and the op's parameters as
    keywords, and returns a tensor, or a tuple for several outputs.  Its backward
    (``register_autograd``) is the training graph's gradient, so it is the op's gradient
    closure's, not torch's derivative of the forward; integer inputs and ``no_grad`` inputs
    get none.  A fake kernel (``register_fake``) lets ``torch.compile(fullgraph=True)``
    trace it, and ``torch.library.opcheck`` passes on the library's ops.

    ``params`` given here are fixed (not keywords of the torch op): parameters without a
    default must be (``to_torch(ops.tile, reps=(2, 3))``), and so must all of them for an op
    whose output count depends on them (``ops.topk``).  A ``'numpy'``-mode op runs on the
    host, through MXNet, inside the torch op (CPU copies each call).  Needs MXNet and
    torch; for a process without MXNet see :func:`save_port` and :func:`load_port`.

    Raises :class:`PortError` naming the op when it cannot be ported: auxiliary states
    (``ops.center_loss``), a forward that does not trace to MXNet operators (the reason
    :func:`customop.explain` gives), or an MXNet operator with no torch rule (named).

    Example::

        import torch, customop
        from customop import ops
        focal = customop.to_torch(ops.focal_loss)
        logits = torch.randn(2, 100, 5, requires_grad=True)
        labels = torch.randint(-1, 6, (2, 100)).float()
        focal(logits, labels, gamma=1.5).sum().backward()   # logits.grad: the op's closure's
    """
    return framework_module("torch_port", "customop.to_torch").to_torch(op, **params)


def to_jax(op: Any) -> Any:
    """``op`` as a JAX function: ``jax.custom_vjp`` over its native graphs.

    The returned function takes jax (or NumPy) arrays in the op's input order and the op's
    parameters as keywords (static: each set of parameters and input shapes is its own
    trace), and returns an array, or a tuple for several outputs.  Its forward is the op's
    forward graph and its VJP the training graph's (the op's ``def_grad`` closures),
    translated by :mod:`customop.port.jax_rules`; it works under ``jax.jit``, ``jax.grad``,
    ``jax.vjp`` and ``jax.vmap`` (a vmapped call is the op called on each slice).  Inputs
    that get no gradient (integer, ``no_grad``) get zeros.  A ``'numpy'``-mode op runs on the
    host through ``jax.pure_callback`` inside the same ``custom_vjp``.  Needs MXNet and jax;
    errors as :func:`to_torch`.  JAX's default 32-bit mode turns an operator's ``float64`` /
    ``int64`` casts into ``float32`` / ``int32``.

    Example::

        import jax, jax.numpy as jnp, customop
        from customop import ops
        focal = customop.to_jax(ops.focal_loss)
        step = jax.jit(jax.value_and_grad(lambda x, y: focal(x, y, gamma=1.5).sum()))
        loss, grad = step(jnp.zeros((2, 100, 5)), jnp.zeros((2, 100)))
    """
    return framework_module("jax_port", "customop.to_jax").to_jax(op)


def save_port(op: Any, path: Any, *inputs: Any, **params: Any) -> None:
    """Writes ``op``'s port to ``path``: one JSON file that :func:`load_port` runs without MXNet.

    ``inputs``: example arrays (NumPy, ``mx.nd``, torch) in the op's input order (an
    optional input left out, or ``None``, is absent from the port); ``params``: the op's
    parameters, fixed in the file.  The file holds the op's forward and training graphs
    at the example's signature, which also serve the other sizes of its shape family (the
    sizes checked to hold at another value: a batch size, a box count), its input names,
    shapes and dtypes.  It is data only: JSON, no pickle, no code, no module named by the
    file is imported when it is loaded.

    Raises :class:`PortError` saying why for a ``'numpy'``-mode op (its forward is Python,
    not a graph), an op with auxiliary states, and an op whose forward does not trace.

    Example::

        import numpy as np, customop
        from customop import ops
        customop.save_port(ops.focal_loss, "focal.port.json",
                           np.zeros((2, 100, 5), "float32"), np.zeros((2, 100), "float32"),
                           gamma=1.5)
    """
    from .extract import save_port as _save

    _save(op, path, *inputs, **params)
