"""Sigmoid focal loss (Lin et al., ICCV 2017) with positive/valid normalization and a run-time
normalizer input (focal loss v2 of the research operators)."""

import mxnet as mx
import numpy as np

from customop import customop, residuals

from . import _checks

__all__ = ["focal_loss", "FocalLoss"]

NORMALIZATIONS = ("positive", "valid", "none")


def _check_params(alpha, gamma, normalization, ignore_label):
    _checks.number("focal_loss", "alpha", alpha, 0, 1)
    _checks.number("focal_loss", "gamma", gamma, 0)
    _checks.choice("focal_loss", "normalization", normalization, NORMALIZATIONS)
    _checks.integer("focal_loss", "ignore_label", ignore_label)


def _check(pred, label, normalizer, alpha, gamma, normalization, ignore_label):
    _check_params(alpha, gamma, normalization, ignore_label)
    if len(pred.shape) < 1 or pred.shape[-1] < 1:
        raise _checks.fail(
            "focal_loss", "pred", f"must have a class axis last, got shape {tuple(pred.shape)}"
        )
    _checks.floating("focal_loss", "pred", pred.dtype)
    _checks.same_shape(
        "focal_loss",
        "label",
        label.shape,
        pred.shape[:-1],
        "pred's shape without its last, class axis",
    )
    if normalizer is not None:
        if int(np.prod(normalizer.shape)) != 1:
            raise _checks.fail(
                "focal_loss",
                "normalizer",
                f"must hold one value (shape (1,)), got shape {tuple(normalizer.shape)}",
            )
        _checks.floating("focal_loss", "normalizer", normalizer.dtype)


def _label_message(num_class, ignore_label):
    return (
        f"has values outside [ignore_label, C]: every label must be "
        f"ignore_label={ignore_label}, 0 (background) or a class 1..C={num_class}"
    )


@customop(
    "mxnet",
    name="ops.focal_loss",
    optional=("normalizer",),
    no_grad=("label",),
    infer_shape=lambda pred, *_, **__: pred,
)
def focal_loss(
    pred,
    label,
    normalizer=None,
    *,
    alpha=0.25,
    gamma=2.0,
    normalization="positive",
    ignore_label=-1,
):
    r"""Sigmoid focal loss on logits, one binary classifier per foreground class.

    .. math::

        p = \sigma(x), \quad
        L_{\cdot c} = \frac{v}{Z}\Big(-\alpha\, t_c (1 - p_c)^\gamma \log p_c
                     - (1 - \alpha)(1 - t_c)\, p_c^\gamma \log(1 - p_c)\Big)

    with :math:`t_c = [\mathrm{label} = c + 1]` (label 0 is background, ``1..C`` the
    foreground classes on channels ``0..C-1``), :math:`v = [\mathrm{label} \ne
    \mathrm{ignore\_label}]` and :math:`Z` the normalizer: ``normalization='positive'``
    the number of foreground labels (at least 1), ``'valid'`` the number of non-ignored
    labels (at least 1), ``'none'`` 1.  When the ``normalizer`` input is given, :math:`Z`
    is its value instead and ``normalization`` is not used: a run-time gradient scale
    (cascaded detectors), which also receives its gradient :math:`-\sum g L / Z`; stop it
    with ``mx.nd.stop_gradient`` if it must not learn.  Logs are computed as
    :math:`\log p = -\mathrm{softplus}(-x)`, :math:`\log(1-p) = -\mathrm{softplus}(x)`, so
    large :math:`|x|` neither overflows nor takes ``log(0)``.

    Parameters
    ----------
    pred : float array, shape ``(N, ..., C)``
        Logits (e.g. ``(batch, anchors, classes)``); an integer ``pred`` raises
        ``TypeError`` (the loss is float math).
    label : float or int array, shape ``(N, ...)``
        Values in ``{ignore_label, 0, 1, ..., C}``; anything else raises ``ValueError``
        (one flag read back in ``'mxnet'`` mode), or makes the loss NaN in a native graph
        (an exported model; ``customop.require``).
    normalizer : float array of one value (shape ``(1,)``), optional
        The :math:`Z` above.
    alpha : float in [0, 1], default 0.25
        The weight of the positives.
    gamma : finite float >= 0, default 2
        The focusing exponent.
    normalization : {'positive', 'valid', 'none'}, default 'positive'
    ignore_label : int, default -1

    Notes
    -----
    Returns the normalized elementwise loss, shaped like ``pred`` (sum it for the paper's
    loss).  Parameters go by keyword: ``focal_loss(pred, label, normalizer, alpha=0.5)``.

    Example:
        >>> import mxnet as mx
        >>> from customop import ops
        >>> pred = mx.nd.array([[[0.0, 0.0], [2.0, -2.0]]])        # 1 image, 2 anchors, C=2
        >>> label = mx.nd.array([[2, 0]])                         # class 2, background
        >>> ops.focal_loss(pred, label, gamma=0.0).sum().asscalar()  # doctest: +ELLIPSIS
        2.38...
    """
    _check(pred, label, normalizer, alpha, gamma, normalization, ignore_label)
    num_class = pred.shape[-1]
    label = label.astype(pred.dtype, copy=False)
    # an integer in [0, C] is what clipping its floor leaves unchanged (NaN equals nothing);
    # as few operators as can be (each one runs in every step of a graph), ones MXNet's ONNX
    # converter knows (no >=, <=, !=); an ignore_label next to [0, C] widens the range
    if -1 <= ignore_label <= num_class + 1:
        low, high = min(ignore_label, 0), max(ignore_label, num_class)
        ok = label == mx.nd.clip(mx.nd.floor(label), low, high)
    else:
        ok = (label == mx.nd.clip(mx.nd.floor(label), 0, num_class)) + (label == ignore_label)
    alpha_t, alpha_1t, valid = _targets_nd(label, num_class, ignore_label, alpha)
    sp_pos = mx.nd.Activation(pred, act_type="softrelu")  # -log(1 - p)
    sp_neg = mx.nd.Activation(-pred, act_type="softrelu")  # -log p
    pos = alpha_t * mx.nd.exp(-gamma * sp_pos)  # alpha t (1 - p)^gamma
    neg = alpha_1t * mx.nd.exp(-gamma * sp_neg)  # (1 - alpha)(1 - t) p^gamma
    z = _normalizer_nd(label, valid, normalizer, normalization, ignore_label, pred)
    # z divides every loss and gradient element: a bad label makes it NaN, so all of them
    z = _checks.nan_unless(z, ok, "label", _label_message(num_class, ignore_label))
    loss = mx.nd.broadcast_div(mx.nd.broadcast_mul(pos * sp_neg + neg * sp_pos, valid), z)
    return residuals(loss, pos=pos, neg=neg, sp_pos=sp_pos, sp_neg=sp_neg, valid=valid, z=z)


@focal_loss.twin("numpy")
def _focal_loss_numpy(
    pred,
    label,
    normalizer=None,
    *,
    alpha,
    gamma,
    normalization,
    ignore_label,
):
    _check(pred, label, normalizer, alpha, gamma, normalization, ignore_label)
    num_class = pred.shape[-1]
    if np.any(
        ((label < 0) | (label > num_class) | (label != np.floor(label))) & (label != ignore_label)
    ):
        raise _checks.fail("focal_loss", "label", _label_message(num_class, ignore_label))
    t, valid = _targets_np(label, num_class, ignore_label, pred.dtype)
    sp_pos = np.logaddexp(0, pred)  # -log(1 - p)
    sp_neg = np.logaddexp(0, -pred)  # -log p
    pos = t * alpha * np.exp(-gamma * sp_pos)  # alpha t (1 - p)^gamma
    neg = (1 - t) * (1 - alpha) * np.exp(-gamma * sp_neg)  # (1 - alpha)(1 - t) p^gamma
    z = _normalizer_np(label, valid, normalizer, normalization)
    loss = ((pos * sp_neg + neg * sp_pos) * valid / z).astype(pred.dtype, copy=False)
    return residuals(loss, pos=pos, neg=neg, sp_pos=sp_pos, sp_neg=sp_neg, valid=valid, z=z)


def _targets_nd(label, num_class, ignore_label, alpha):
    # alpha t and (1 - alpha)(1 - t) of the one-hot targets t, each one one_hot (the same
    # values as multiplying t: 0, 1 and alpha are exact), and the valid mask
    valid = (label != ignore_label).expand_dims(-1)
    index = label - 1  # 0 (background) and ignore_label: no class, all zeros
    alpha_t = mx.nd.one_hot(index, num_class, on_value=alpha, off_value=0.0, dtype=label.dtype)
    alpha_1t = mx.nd.one_hot(index, num_class, on_value=0.0, off_value=1 - alpha, dtype=label.dtype)
    return alpha_t, alpha_1t, valid


def _targets_np(label, num_class, ignore_label, dtype):
    valid = (label != ignore_label)[..., None].astype(dtype)
    t = (label[..., None] == np.arange(1, num_class + 1)).astype(dtype)
    return t, valid


def _normalizer_nd(label, valid, normalizer, normalization, ignore_label, like):
    ones = (1,) * like.ndim
    if normalizer is not None:
        return normalizer.reshape(ones)
    if normalization == "none":
        return mx.nd.ones(ones, ctx=like.context, dtype=like.dtype)
    if normalization == "valid":
        counted = valid
    elif ignore_label < 1:  # the positives: ignored labels are not among them
        counted = label >= 1
    else:
        counted = valid * (label >= 1).expand_dims(-1)
    return mx.nd.maximum(counted.sum(), 1).reshape(ones)


def _normalizer_np(label, valid, normalizer, normalization):
    if normalizer is not None:
        return normalizer.reshape(())
    if normalization == "none":
        return 1.0
    counted = valid if normalization == "valid" else valid * (label >= 1)[..., None]
    return max(counted.sum(), 1.0)


# d/dx of the bracket: positives -alpha (1-p)^gamma (1 - p - gamma p log p), negatives
# -(1-alpha) p^gamma (gamma (1-p) log(1-p) - p); below with q = 1 - p, the stable logs
# log p = -softplus(-x), log q = -softplus(x), and the forward's weights, softplus terms,
# valid mask and normalizer (its residuals) instead of computing them again.
def _grad_pred_nd(
    ans, pred, label, normalizer=None, *, gamma, pos, neg, sp_pos, sp_neg, valid, z, **_
):
    def grad(g):
        p, q = mx.nd.sigmoid(pred), mx.nd.sigmoid(-pred)
        d = -pos * (q + gamma * p * sp_neg) + neg * (p + gamma * q * sp_pos)
        return g * mx.nd.broadcast_div(mx.nd.broadcast_mul(d, valid), z)

    return grad


def _grad_pred_np(
    ans, pred, label, normalizer=None, *, gamma, pos, neg, sp_pos, sp_neg, valid, z, **_
):
    def grad(g):
        p, q = np.exp(-sp_neg), np.exp(-sp_pos)
        d = -pos * (q + gamma * p * sp_neg) + neg * (p + gamma * q * sp_pos)
        return g * (d * valid / z)

    return grad


# The output is L_unnormalized / Z, so dZ = -sum(g * output) / Z.
focal_loss.def_grad(_grad_pred_nd)
focal_loss.def_grad(
    lambda ans, pred, label, normalizer=None, **_: (
        lambda g: -(g * ans).sum().reshape(normalizer.shape) / normalizer
    ),
    2,
)
focal_loss.numpy.def_grad(_grad_pred_np)
focal_loss.numpy.def_grad(
    lambda ans, pred, label, normalizer=None, **_: (
        lambda g: -(g * ans).sum().reshape(normalizer.shape) / normalizer
    ),
    2,
)


class FocalLoss(mx.gluon.loss.Loss):
    r"""Gluon loss: ``focal_loss`` summed over every non-batch axis.

    .. math:: L_n = \sum_{a, c} \mathrm{focal\_loss}(\mathrm{pred}, \mathrm{label})_{n a c}

    Parameters
    ----------
    alpha, gamma, normalization, ignore_label
        As :func:`ops.focal_loss`.
    weight, batch_axis
        As :class:`mxnet.gluon.loss.Loss`: the loss's scale, the mini-batch axis.

    Notes
    -----
    Inputs: ``pred`` logits ``(N, ..., C)``, ``label`` ``(N, ...)``, optional
    ``normalizer`` (one value).  Output: loss of shape ``(N,)``; its sum is the focal
    loss of the batch (the normalizer counts over the whole batch).

    Example:
        >>> import mxnet as mx
        >>> from customop import ops
        >>> loss = ops.FocalLoss(gamma=0.0)
        >>> loss(mx.nd.array([[[0.0, 0.0], [2.0, -2.0]]]), mx.nd.array([[2, 0]])).shape
        (1,)
    """

    def __init__(
        self,
        alpha=0.25,
        gamma=2.0,
        normalization="positive",
        ignore_label=-1,
        weight=None,
        batch_axis=0,
        **kwargs,
    ):
        super().__init__(weight, batch_axis, **kwargs)
        _check_params(alpha, gamma, normalization, ignore_label)
        self._op_params = dict(
            alpha=float(alpha),
            gamma=float(gamma),
            normalization=normalization,
            ignore_label=int(ignore_label),
        )

    def hybrid_forward(self, F, pred, label, normalizer=None):
        """The focal loss of each sample, summed over its anchors and classes."""
        loss = focal_loss(pred, label, normalizer, **self._op_params)
        if self._weight is not None:
            loss = loss * self._weight
        return F.sum(loss, axis=self._batch_axis, exclude=True)
