"""``ops.ohem_sampler``: online hard example mining as sample re-weighting."""
from __future__ import annotations

import mxnet as mx
import numpy as np

from customop import customop


def _check(conf_data, conf_target, conf_weight, ratio, min_neg, loss_type):
    if loss_type != "softmax":
        raise ValueError(f"ops.ohem_sampler: loss_type must be 'softmax', got {loss_type!r}")
    if len(conf_data) != 3 or conf_data[-1] < 2:
        raise ValueError(f"ops.ohem_sampler: conf_data must have shape (B, N, C) with C >= 2 "
                         f"(class 0 = background), got {tuple(conf_data)}")
    for name, shape in (("conf_target", conf_target), ("conf_weight", conf_weight)):
        if tuple(shape) != tuple(conf_data[:2]):
            raise ValueError(f"ops.ohem_sampler: {name} must have shape (B, N) = "
                             f"{tuple(conf_data[:2])}, got {tuple(shape)}")
    if not ratio >= 0:
        raise ValueError(f"ops.ohem_sampler: ratio must be >= 0, got {ratio!r}")
    if isinstance(min_neg, bool) or not isinstance(min_neg, int) or min_neg < 0:
        raise ValueError(f"ops.ohem_sampler: min_neg must be an int >= 0, got {min_neg!r}")


@customop("mxnet", name="ops.ohem_sampler", auto_grad=False)
def ohem_sampler(conf_data, conf_target, conf_weight, *, ratio=3.0, min_neg=0, ignore_label=-1,
                 loss_type="softmax"):
    r"""Online hard example mining (Shrivastava et al., 2016) by re-weighting samples.

    Per image ``b``: a sample is *usable* if ``conf_weight > 0`` and
    ``conf_target != ignore_label``; usable samples with ``conf_target > 0`` are
    positives, with ``conf_target == 0`` negatives. Every positive is kept, and the

    .. math::

        n_{neg} = \min\left(\max\left(\lfloor \mathrm{ratio} \cdot n_{pos} \rfloor,\
                  \mathrm{min\_neg}\right),\ \#\text{negatives}\right)

    negatives with the highest background loss are kept, where (``loss_type='softmax'``)

    .. math::

        \ell_i = -\log \frac{e^{x_{i,0}}}{\sum_c e^{x_{i,c}}}

    is the softmax cross-entropy of sample ``i`` if it were background (class 0).
    Ties in :math:`\ell` are broken by the lower sample index first (exactly, in
    both modes). The output is 1 for kept and 0 for every other sample (dropped
    negatives, ignored and zero-weight samples); feed it as the weight of the
    classification loss. No gradient flows to any input (zeros).

    ``ops.ohem_sampler`` runs in ``'mxnet'`` mode (one ``sort`` per image row plus
    element-wise ops; no host copy) and does not check label values or NaNs (that
    would cost a device sync; a NaN loss ranks unpredictably); the ``'numpy'``
    twin ``ops.ohem_sampler.numpy`` rejects labels outside ``{ignore_label} ∪ [0, C)``
    and NaN in ``conf_data``.

    Parameters
    ----------
    ratio : float, default 3.0
        Negatives kept per positive.
    min_neg : int, default 0
        Keep at least this many negatives per image (when there are that many).
    ignore_label : int, default -1
        Samples with this target are neither positive nor negative.
    loss_type : {'softmax'}, default 'softmax'
        How negatives are ranked (see above).

    Shapes: ``conf_data`` (B, N, C) logits, class 0 = background;
    ``conf_target`` (B, N) class ids; ``conf_weight`` (B, N);
    output ``new_conf_weight`` (B, N), ``conf_weight``'s dtype.

    Example:
        >>> import mxnet as mx, ops
        >>> x = mx.nd.array([[[0, 0], [0, 3], [0, 1], [0, 2], [5, 0]]])   # losses rise with x1
        >>> t, w = mx.nd.array([[1, 0, 0, 0, 0]]), mx.nd.ones((1, 5))
        >>> ops.ohem_sampler(x, t, w, ratio=2).asnumpy().tolist()
        [[1.0, 1.0, 0.0, 1.0, 0.0]]
    """
    _check(conf_data.shape, conf_target.shape, conf_weight.shape, ratio, min_neg, loss_type)
    f64 = "float64"
    loss = -mx.nd.log_softmax(conf_data, axis=-1)[:, :, 0].astype(f64)
    usable = (conf_weight > 0) * (conf_target != ignore_label)
    pos = (usable * (conf_target > 0)).astype(f64)
    neg = (usable * (conf_target == 0)).astype(f64)
    wanted = mx.nd.maximum(mx.nd.floor(pos.sum(axis=1) * ratio), float(min_neg))
    num_neg = mx.nd.minimum(wanted, neg.sum(axis=1)).reshape((-1, 1))  # (B, 1)
    key = mx.nd.where(neg, loss, -mx.nd.ones_like(loss))  # losses are >= 0
    ranked = mx.nd.sort(key, axis=1, is_ascend=False)
    cut = mx.nd.pick(ranked, mx.nd.maximum(num_neg - 1, 0).reshape((-1,)), axis=1,
                     keepdims=True)  # the num_neg-th largest loss
    above = neg * mx.nd.broadcast_greater(key, cut)
    at_cut = neg * mx.nd.broadcast_equal(key, cut)
    room = num_neg - above.sum(axis=1, keepdims=True)  # ties at the cut: lowest index first
    kept_ties = at_cut * mx.nd.broadcast_lesser_equal(mx.nd.cumsum(at_cut, axis=1), room)
    return (pos + above + kept_ties).astype(conf_weight.dtype)


@ohem_sampler.twin("numpy")
def _ohem_sampler_numpy(conf_data, conf_target, conf_weight, *, ratio=3.0, min_neg=0,
                        ignore_label=-1, loss_type="softmax"):
    _check(conf_data.shape, conf_target.shape, conf_weight.shape, ratio, min_neg, loss_type)
    num_class = conf_data.shape[-1]
    labels = conf_target[conf_target != ignore_label]
    if np.any((labels < 0) | (labels >= num_class) | (labels != np.round(labels))):
        raise ValueError(f"ops.ohem_sampler: conf_target has values outside "
                         f"{{ignore_label={ignore_label}}} and the classes [0, {num_class})")
    if np.isnan(conf_data).any():
        raise ValueError("ops.ohem_sampler: conf_data contains NaN")
    x = conf_data.astype(np.float64)
    top = x.max(axis=-1, keepdims=True)
    loss = (np.log(np.exp(x - top).sum(axis=-1)) + top[..., 0]) - x[..., 0]
    out = np.zeros_like(conf_weight)
    for b in range(x.shape[0]):
        usable = (conf_weight[b] > 0) & (conf_target[b] != ignore_label)
        pos = usable & (conf_target[b] > 0)
        neg = np.flatnonzero(usable & (conf_target[b] == 0))
        num_neg = min(max(int(np.floor(ratio * pos.sum())), min_neg), len(neg))
        hardest = neg[np.argsort(-loss[b, neg], kind="stable")[:num_neg]]
        out[b, pos] = 1
        out[b, hardest] = 1
    return out
