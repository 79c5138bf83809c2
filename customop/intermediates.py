"""What a forward returns when it hands intermediate values (residuals) to its backward.

Separate from :mod:`customop.kernel` (which unpacks it) so that
:mod:`customop.gradients` can recognise it when it runs the forward again for
an automatic gradient.
"""

from __future__ import annotations

from typing import Any


class residuals:  # noqa: N801 - used like a function: ``return residuals(out, probs=p)``
    """A forward's outputs plus values its gradient closures may reuse (never outputs).

    ``return customop.residuals(out, probs=p)`` (several outputs:
    ``residuals(a, b, probs=p)``) hands ``probs`` to every gradient closure that
    names it (``def grad(ans, x, label, probs): ...``); callers still get only
    ``out``.  A recorded call keeps them as long as its autograd node lives (the
    ``function`` path) or until its backward (graph nodes: ``mx.nd.Custom``,
    executors, hybridized blocks), and never past MXNet's deletion of that node;
    a call that is not recorded, shape inference and ``is_train=False`` graph
    runs drop them.  Where none were kept (a second backward after one forward),
    the backward runs the forward again to get them.

    Example:
        >>> import numpy as np
        >>> from customop import customop, residuals
        >>> @customop('numpy')
        ... def softmax(x):
        ...     e = np.exp(x - x.max())
        ...     return residuals(e / e.sum(), total=e.sum())
        >>> _ = softmax.def_grad(lambda ans, x, total: lambda g: ans * (g - (g * ans).sum()))
    """

    __slots__ = ("outputs", "saved")

    def __init__(self, *outputs: Any, **saved: Any):
        if not outputs:
            raise TypeError(
                "customop.residuals(*outputs, **saved): give the forward's "
                "output(s) first, then the residuals by name"
            )
        self.outputs = outputs[0] if len(outputs) == 1 else tuple(outputs)
        self.saved = saved
