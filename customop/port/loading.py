"""``customop.load_port``: a port file read as data, run by torch or jax (no MXNet here)."""

from __future__ import annotations

from typing import Any

from . import portfile
from .runner import framework_module


def load_port(path: Any, framework: str) -> Any:
    """The op saved at ``path`` by :func:`customop.save_port`, for ``framework``.

    ``framework``: ``'torch'`` (a ``torch.library`` custom op taking tensors, the
    saved inputs in order) or ``'jax'`` (a function of jax arrays on ``jax.custom_vjp``).
    Works without MXNet, and with NumPy 2: the file is JSON, read as data only.  Inputs of
    the saved example's shape family are accepted (another batch size, box count: the
    sizes the graph was checked to hold at another value); other shapes raise
    ``ValueError`` naming the op and the expected shapes.  The parameters are the ones
    saved.

    Example (MXNet need not be installed where this runs)::

        from customop.port import load_port
        loss = load_port("focal_loss.port.json", "torch")
        value = loss(logits, labels)
    """
    if framework not in ("torch", "jax"):
        raise ValueError(
            f"customop.load_port: framework must be 'torch' or 'jax', got {framework!r}"
        )
    record = portfile.read(path)
    module = framework_module(f"{framework}_port", "customop.load_port")
    return module.from_record(record)
