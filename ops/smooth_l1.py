"""Smooth L1 loss whose ``sigma`` is an input array (smooth-L1 v2 of the research operators)."""

import mxnet as mx
import numpy as np

from customop import customop

from . import _checks

__all__ = ["smooth_l1", "SmoothL1Loss"]


def _check_shapes(data, sigma, weight):
    _checks.broadcastable("smooth_l1", "sigma", sigma, data, "data")
    if weight is not None:
        _checks.broadcastable("smooth_l1", "weight", weight, data, "data")


def _check(data, sigma, weight):
    _checks.floating("smooth_l1", "data", data.dtype)
    _check_shapes(data.shape, sigma.shape, None if weight is None else weight.shape)


# Symbols, Module and hybridized blocks ask for the output shape and dtype at every new
# signature: answered from the shapes and dtypes, with the forward's own checks, instead of
# by a forward on placeholder inputs (as ops.box_iou; measured: 3-6 ms of the RetinaNet-style
# head's first simple_bind with saved verdicts, benchmarks/bind_cost.py)
def _infer_shape(data, sigma, weight=None):
    _check_shapes(data, sigma, weight)
    return tuple(data)


def _infer_type(data, sigma, weight=None):
    # The loss is in data's dtype.  A bfloat16 input (a structured NumPy dtype) is computed
    # on as float32, and a float32 result stored back as bfloat16, as the forward's own run
    # would give it (customop's widening).
    wide = [d for d in (data, sigma, weight) if d is not None and np.dtype(d).kind == "V"]
    out = np.float32 if np.dtype(data).kind == "V" else data
    _checks.floating("smooth_l1", "data", out)
    return wide[0] if wide and np.dtype(out) == np.float32 else data


_SIGMA = "must be finite and > 0 everywhere (it holds values <= 0, inf or NaN)"


@customop(
    "mxnet",
    name="ops.smooth_l1",
    optional=("weight",),
    no_grad=("sigma", "weight"),
    infer_shape=_infer_shape,
    infer_type=_infer_type,
)
def smooth_l1(data, sigma, weight=None):
    r"""Smooth L1 loss with a run-time ``sigma`` (an input array, not a fixed scalar).

    .. math::

        L = w \cdot \begin{cases} \frac{1}{2} (\sigma x)^2, & |x| < 1/\sigma^2 \\
                                  |x| - \frac{1}{2\sigma^2}, & \text{otherwise} \end{cases}

    elementwise; with a constant ``sigma = s`` it equals ``mx.nd.smooth_l1(data, scalar=s)``.
    The gradient flows to ``data`` only (``sigma`` and ``weight`` get zero): it is
    :math:`w \sigma^2 x` inside, :math:`w\,\mathrm{sign}(x)` outside (at :math:`|x| =
    1/\sigma^2`, too).  In ``'mxnet'`` mode it is MXNet's automatic gradient of the forward
    (``mx.nd.smooth_l1``'s own, exactly this rule), with no ``def_grad`` closure: a closure
    would be transposed into training graphs, 1.2-1.4x the cost of the forward's own
    backward there (``benchmarks/own_gradients.py``).

    Parameters
    ----------
    data : float array, any shape
        Usually a regression residual ``pred - target`` (an integer ``data`` raises
        ``TypeError``: the loss is float math).
    sigma : finite positive array broadcastable to ``data``
        E.g. shape ``(1,)``, or one value per box coordinate; ``sigma <= 0``, ``inf`` or
        NaN raises ``ValueError`` (NaN loss in a native graph: ``customop.require``).
    weight : array broadcastable to ``data``, optional
        Multiplies the loss elementwise.

    Notes
    -----
    Returns the elementwise loss, shaped like ``data``.  ``smooth_l1.numpy`` is the
    ``'numpy'``-mode twin.  Checking ``sigma > 0`` in ``'mxnet'`` mode reads one flag back
    from the device.

    Example:
        >>> import mxnet as mx
        >>> from customop import ops
        >>> x = mx.nd.array([-2.0, 0.1, 0.5])
        >>> ops.smooth_l1(x, mx.nd.array([2.0])).asnumpy()
        array([1.875, 0.02 , 0.375], dtype=float32)
    """
    _check(data, sigma, weight)
    _checks.require((sigma > 0) * (sigma - sigma == 0), "sigma", _SIGMA)  # inf - inf: NaN
    # sigma^2 at every element first: MXNet's backward of a broadcast_mul/div sums over the
    # broadcast axes even for an input that needs no gradient (0.5 ms of a 1 ms native
    # step at 8 x 768 x 4, measured), and training graphs run MXNet's gradient of this forward
    s2 = mx.nd.broadcast_add(mx.nd.zeros_like(data), (sigma * sigma).astype(data.dtype, copy=False))
    # smooth_l1(x; sigma) = smooth_l1(sigma^2 x; 1) / sigma^2: MXNet's fused kernel does the rest
    loss = mx.nd.smooth_l1(s2 * data, scalar=1.0) / s2
    return loss if weight is None else loss * weight.astype(data.dtype, copy=False)


@smooth_l1.twin("numpy")
def _smooth_l1_numpy(data, sigma, weight=None):
    _check(data, sigma, weight)
    if not np.all((sigma > 0) & (sigma < np.inf)):
        raise _checks.fail("smooth_l1", "sigma", _SIGMA)
    s2 = sigma * sigma
    ax = np.abs(data)
    loss = np.where(ax < 1 / s2, 0.5 * s2 * data * data, ax - 0.5 / s2)
    return (loss if weight is None else loss * weight).astype(data.dtype, copy=False)


def _grad_numpy(ans, data, sigma, weight=None):
    def grad(g):
        s2 = sigma * sigma
        d = np.where(np.abs(data) < 1 / s2, s2 * data, np.sign(data)) * g
        return d if weight is None else d * weight

    return grad


smooth_l1.numpy.def_grad(_grad_numpy)


class SmoothL1Loss(mx.gluon.loss.Loss):
    r"""Gluon loss: the mean over non-batch axes of ``smooth_l1(pred - label, sigma)``.

    .. math:: L = \frac{1}{K}\sum_k \mathrm{smooth\_l1}(\mathrm{pred}_k - \mathrm{label}_k;
              \sigma)

    Parameters
    ----------
    sigma : float, default 1
        The ``sigma`` used when the call passes none.
    weight, batch_axis
        As :class:`mxnet.gluon.loss.Loss`: the loss's scale, the mini-batch axis.

    Notes
    -----
    Inputs: ``pred``, ``label`` of one shape; optional ``sigma`` (an array broadcastable
    to ``pred``, overriding the constructor's) and ``sample_weight`` (broadcastable).
    Output: loss of shape ``(batch_size,)``.

    Example:
        >>> import mxnet as mx
        >>> from customop import ops
        >>> ops.SmoothL1Loss(sigma=1.0)(mx.nd.array([[0.5, 3.0]]), mx.nd.zeros((1, 2)))
        <BLANKLINE>
        [1.3125]
        <NDArray 1 @cpu(0)>
    """

    def __init__(self, sigma=1.0, weight=None, batch_axis=0, **kwargs):
        super().__init__(weight, batch_axis, **kwargs)
        self._sigma = _checks.positive("smooth_l1", "sigma", sigma)

    def hybrid_forward(self, F, pred, label, sigma=None, sample_weight=None):
        """Smooth L1 averaged over the non-batch axes; a ``sigma`` array overrides the block's."""
        if sigma is None:
            sigma = F.full(shape=(1,), val=self._sigma)
        loss = smooth_l1(pred - label, sigma, sample_weight)
        if self._weight is not None:
            loss = loss * self._weight
        return F.mean(loss, axis=self._batch_axis, exclude=True)
