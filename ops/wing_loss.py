"""Wing loss (Feng et al., CVPR 2018) for landmark regression."""

import math

import mxnet as mx
import numpy as np

from customop import customop

from . import _checks

__all__ = ["wing_loss", "WingLoss"]


def _check_params(w, epsilon):
    _checks.positive("wing_loss", "w", w)
    _checks.positive("wing_loss", "epsilon", epsilon)


def _check(pred, target, weight, w, epsilon):
    _check_params(w, epsilon)
    _checks.floating("wing_loss", "pred", pred.dtype)
    _checks.same_shape("wing_loss", "target", target.shape, pred.shape, "pred's shape")
    if weight is not None:
        _checks.broadcastable("wing_loss", "weight", weight.shape, pred.shape, "pred")


@customop("mxnet", name="ops.wing_loss", optional=("weight",))
def wing_loss(pred, target, weight=None, *, w=10.0, epsilon=2.0):
    r"""Wing loss: logarithmic for small errors, L1 for large ones (Feng et al. 2018).

    .. math::

        L = \mathrm{weight} \cdot \begin{cases}
              w \ln(1 + |x| / \epsilon), & |x| < w \\
              |x| - C, & \text{otherwise} \end{cases}
        \qquad x = \mathrm{pred} - \mathrm{target},\; C = w - w \ln(1 + w/\epsilon)

    elementwise.  It is continuous at :math:`|x| = w` but not differentiable there
    (slope :math:`w/(\epsilon + w)` inside, 1 outside: the gradient takes 1 there, and 0 at
    :math:`x = 0`).  Every input gets its gradient (``target`` the negative of ``pred``'s,
    ``weight`` the unweighted loss summed over the axes it is broadcast along).  In
    ``'mxnet'`` mode that is MXNet's automatic gradient of the forward (``abs``, ``where``,
    ``log1p``: exactly this rule), with no ``def_grad`` closure: a closure would be
    transposed into training graphs, up to 1.5x the cost of the forward's own backward
    there (``benchmarks/own_gradients.py``).

    Parameters
    ----------
    pred : float array, any shape
        E.g. ``(N, 2K)`` landmark coordinates; an integer ``pred`` raises ``TypeError``.
    target : array shaped like ``pred``
    weight : array broadcastable to ``pred``, optional
        Multiplies the loss elementwise.
    w : finite float > 0, default 10
        The width of the non-linear part.
    epsilon : finite float > 0, default 2
        Its curvature.

    Notes
    -----
    Returns the elementwise loss, shaped like ``pred``.  Call as
    ``wing_loss(pred, target, weight, w=..., epsilon=...)`` (parameters by keyword).

    Example:
        >>> import mxnet as mx
        >>> from customop import ops
        >>> ops.wing_loss(mx.nd.array([1.0, 12.0]), mx.nd.zeros(2), w=10.0, epsilon=2.0)
        <BLANKLINE>
        [ 4.054651 19.917595]
        <NDArray 2 @cpu(0)>
    """
    _check(pred, target, weight, w, epsilon)
    loss = _wing_nd(pred, target, w, epsilon)
    return loss if weight is None else loss * weight.astype(pred.dtype, copy=False)


@wing_loss.twin("numpy")
def _wing_loss_numpy(pred, target, weight=None, *, w=10.0, epsilon=2.0):
    _check(pred, target, weight, w, epsilon)
    loss = _wing_np(pred, target, w, epsilon)
    return (loss if weight is None else loss * weight).astype(pred.dtype, copy=False)


def _wing_nd(pred, target, w, epsilon):
    ax = mx.nd.abs(pred - target.astype(pred.dtype, copy=False))
    c = w - w * math.log(1 + w / epsilon)
    return mx.nd.where(ax < w, w * mx.nd.log1p(ax / epsilon), ax - c)


def _wing_np(pred, target, w, epsilon):
    ax = np.abs(pred - target)
    c = w - w * math.log(1 + w / epsilon)
    return np.where(ax < w, w * np.log1p(ax / epsilon), ax - c)


def _summed_axes(shape, to):
    # The axes along which an array of shape ``to`` was broadcast up to ``shape``.
    lead = len(shape) - len(to)
    return tuple(range(lead)) + tuple(
        lead + i for i, d in enumerate(to) if d == 1 and shape[lead + i] != 1
    )


def _unbroadcast_np(x, to):
    axes = _summed_axes(x.shape, to)
    return (x.sum(axis=axes, keepdims=True) if axes else x).reshape(to)


def _slope_numpy(pred, target, weight, w, epsilon, g):
    x = pred - target
    ax = np.abs(x)
    d = np.sign(x) * np.where(ax < w, w / (epsilon + ax), 1.0) * g
    return d if weight is None else d * weight


wing_loss.numpy.def_grad(
    lambda ans, pred, target, weight=None, *, w=10.0, epsilon=2.0: (
        lambda g: _slope_numpy(pred, target, weight, w, epsilon, g)
    )
)
wing_loss.numpy.def_grad(
    lambda ans, pred, target, weight=None, *, w=10.0, epsilon=2.0: (
        lambda g: -_slope_numpy(pred, target, weight, w, epsilon, g)
    ),
    1,
)
wing_loss.numpy.def_grad(
    lambda ans, pred, target, weight=None, *, w=10.0, epsilon=2.0: (
        lambda g: _unbroadcast_np(_wing_np(pred, target, w, epsilon) * g, weight.shape)
    ),
    2,
)


class WingLoss(mx.gluon.loss.Loss):
    r"""Gluon loss: the mean over non-batch axes of ``wing_loss(pred, label)``.

    .. math:: L = \frac{1}{K}\sum_k \mathrm{wing}(\mathrm{pred}_k - \mathrm{label}_k; w,
              \epsilon)

    Parameters
    ----------
    w : float > 0, default 10
    epsilon : float > 0, default 2
    weight, batch_axis
        As :class:`mxnet.gluon.loss.Loss`: the loss's scale, the mini-batch axis.

    Notes
    -----
    Inputs: ``pred``, ``label`` of one shape, optional ``sample_weight`` (broadcastable).
    Output: loss of shape ``(batch_size,)``.

    Example:
        >>> import mxnet as mx
        >>> from customop import ops
        >>> ops.WingLoss(w=10.0, epsilon=2.0)(mx.nd.array([[1.0, 12.0]]), mx.nd.zeros((1, 2)))
        <BLANKLINE>
        [11.986123]
        <NDArray 1 @cpu(0)>
    """

    def __init__(self, w=10.0, epsilon=2.0, weight=None, batch_axis=0, **kwargs):
        super().__init__(weight, batch_axis, **kwargs)
        _check_params(w, epsilon)
        self._w, self._epsilon = float(w), float(epsilon)

    def hybrid_forward(self, F, pred, label, sample_weight=None):
        """The Wing loss averaged over the non-batch axes, one value per sample."""
        loss = wing_loss(pred, label, sample_weight, w=self._w, epsilon=self._epsilon)
        if self._weight is not None:
            loss = loss * self._weight
        return F.mean(loss, axis=self._batch_axis, exclude=True)
