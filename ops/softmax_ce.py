"""Softmax cross-entropy output layer: probabilities forward, the CE gradient backward."""

import mxnet as mx
import numpy as np

from customop import customop, residuals

from . import _checks

__all__ = ["softmax_ce", "SoftmaxCE"]


def _check(data, label):
    if len(data.shape) != 2:
        raise _checks.fail(
            "softmax_ce",
            "data",
            f"must have shape (N, C) (batch, classes), got shape {tuple(data.shape)}",
        )
    _checks.floating("softmax_ce", "data", data.dtype)
    _checks.same_shape(
        "softmax_ce", "label", label.shape, data.shape[:1], "one class index per sample"
    )


def _label_message(num_class):
    return (
        f"has values that are not class indices in [0, {num_class - 1}] (data has "
        f"{num_class} classes)"
    )


@customop(
    "mxnet",
    name="ops.softmax_ce",
    need_top_grad=False,
    infer_shape=lambda data, label: data,
    no_grad=("label",),
)
def softmax_ce(data, label):
    r"""Softmax output layer trained with cross-entropy, like ``mx.nd.SoftmaxOutput``.

    .. math::

        p_{ij} = \frac{e^{x_{ij}}}{\sum_k e^{x_{ik}}}, \qquad
        L = -\sum_i \log p_{i, y_i}, \qquad
        \frac{\partial L}{\partial x_{ij}} = p_{ij} - [j = y_i]

    The forward returns the probabilities ``p``; the backward ignores the head gradient
    (an output layer, ``need_top_grad=False``) and gives the gradient of the summed
    cross-entropy ``L`` (``SoftmaxOutput``'s defaults: ``grad_scale=1``,
    ``normalization='null'``).  ``label`` gets zero gradient.  The forward hands
    ``onehot(y)`` (the ``'numpy'`` twin: the integer labels it validated) to the backward
    as a residual instead of the backward building it again.

    Parameters
    ----------
    data : float array, shape ``(N, C)``
        Scores (integer: ``TypeError``).
    label : float or int array, shape ``(N,)``
        Class indices in ``[0, C)``.  Values outside raise ``ValueError`` (one flag read
        back from the device in ``'mxnet'`` mode; ``customop.require``).  The label only
        shapes the gradient: an exported (inference) graph does not take it.

    Notes
    -----
    Output: probabilities shaped like ``data``.

    Example:
        >>> import mxnet as mx
        >>> from customop import ops
        >>> ops.softmax_ce(mx.nd.array([[0.0, 0.0]]), mx.nd.array([1])).asnumpy()
        array([[0.5, 0.5]], dtype=float32)
    """
    _check(data, label)
    num_class = data.shape[1]
    _checks.class_indices(label, num_class, _label_message(num_class))
    onehot = mx.nd.one_hot(label, num_class, dtype=data.dtype)
    return residuals(mx.nd.softmax(data, axis=1), onehot=onehot)


@softmax_ce.twin("numpy")
def _softmax_ce_numpy(data, label):
    _check(data, label)
    num_class = data.shape[1]
    _checks.class_indices_numpy("softmax_ce", label, num_class, _label_message(num_class))
    index = label.astype(np.int64)
    e = np.exp(data - data.max(axis=1, keepdims=True))
    return residuals(e / e.sum(axis=1, keepdims=True), index=index)


def _grad_mxnet(ans, data, label, onehot):
    return lambda _: ans - onehot


def _grad_numpy(ans, data, label, index):
    def grad(_):
        d = ans.copy()
        d[np.arange(len(d)), index] -= 1
        return d

    return grad


softmax_ce.def_grad(_grad_mxnet)
softmax_ce.numpy.def_grad(_grad_numpy)


class SoftmaxCE(mx.gluon.HybridBlock):
    r"""Gluon output layer: ``softmax_ce(pred, label)``, probabilities out, CE gradient back.

    .. math:: p = \mathrm{softmax}(\mathrm{pred}), \quad
              \partial L / \partial \mathrm{pred} = p - \mathrm{onehot}(\mathrm{label})

    Inputs: ``pred`` of shape ``(N, C)``, ``label`` of shape ``(N,)``.  Output: the
    probabilities ``(N, C)``; call ``backward()`` on them (the head gradient is ignored).

    Example:
        >>> import mxnet as mx
        >>> from customop import ops
        >>> ops.SoftmaxCE()(mx.nd.zeros((1, 4)), mx.nd.array([2])).asnumpy()
        array([[0.25, 0.25, 0.25, 0.25]], dtype=float32)
    """

    def hybrid_forward(self, F, pred, label):
        """The softmax probabilities (the layer's output; its gradient is the cross-entropy's)."""
        return softmax_ce(pred, label)
