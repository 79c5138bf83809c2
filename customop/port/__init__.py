"""Ports: a decorated op's native graphs run as PyTorch and JAX operators.

An ``'mxnet'``-mode op that inlines is two graphs of MXNet operators: its forward, and
its training graph, whose gradient by the framework's own autograd is the op's (its
``def_grad`` closures, transposed: :mod:`customop.graphs.transposed`).  ``to_torch`` and
``to_jax`` translate both node by node with one rule table per framework
(:mod:`.torch_rules`, :mod:`.jax_rules`); ``save_port`` writes them to one JSON file that
``load_port`` reads where MXNet is not installed.

Only :mod:`.extract` and :mod:`.host` import MXNet (and the rest of customop); the file
format (:mod:`.portfile`), the graph runner (:mod:`.graph`) and the two frameworks'
modules import neither, so ``from customop.port import load_port`` works without MXNet.
torch and jax are imported when a port for them is first built.
"""
from __future__ import annotations

from typing import Any

from .portfile import PortError, load_port  # noqa: F401 - the MXNet-free entry point

__all__ = ["to_torch", "to_jax", "save_port", "load_port", "PortError"]


def to_torch(op: Any, **params: Any) -> Any:
    """``op`` as a ``torch.library`` custom op; see :func:`customop.to_torch`."""
    from .torch_port import to_torch as _to_torch
    return _to_torch(op, **params)


def to_jax(op: Any) -> Any:
    """``op`` as a function of jax arrays; see :func:`customop.to_jax`."""
    from .jax_port import to_jax as _to_jax
    return _to_jax(op)


def save_port(op: Any, path: Any, *inputs: Any, **params: Any) -> None:
    """Writes ``op``'s port file; see :func:`customop.save_port`."""
    from .extract import save_port as _save
    _save(op, path, *inputs, **params)
