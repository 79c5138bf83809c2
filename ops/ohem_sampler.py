"""``ops.ohem_sampler``: online hard example mining as sample re-weighting."""

from __future__ import annotations

import mxnet as mx
import numpy as np

from customop import customop

from . import _checks


def _check_shapes(conf_data, conf_target, conf_weight, data_dtype=None, **params):
    # (data_dtype: conf_data's, checked where the forward checks it; None: not known yet)
    op = "ohem_sampler"
    _checks.number(op, "ratio", params["ratio"], 0)
    _checks.integer(op, "min_neg", params["min_neg"], 0)
    _checks.integer(op, "ignore_label", params["ignore_label"])
    _checks.choice(op, "loss_type", params["loss_type"], ("softmax",))
    _checks.boolean(op, "from_logits", params["from_logits"])
    shape = tuple(conf_data)
    _checks.shape_is(
        op,
        "conf_data",
        shape,
        len(shape) == 3 and shape[-1] >= 2,
        "(B, N, C) with C >= 2 (class 0 = background)",
    )
    if data_dtype is not None:
        _checks.floating(op, "conf_data", data_dtype)
    _checks.same_shape(op, "conf_target", conf_target, shape[:2], "(B, N)")
    _checks.shape_is(
        op,
        "conf_weight",
        conf_weight,
        tuple(conf_weight) in (tuple(shape[:2]), tuple(shape[:2]) + (1,)),
        f"(B, N) = {tuple(shape[:2])} or (B, N, 1)",
    )


def _check(conf_data, conf_target, conf_weight, **params):
    _check_shapes(conf_data.shape, conf_target.shape, conf_weight.shape, conf_data.dtype, **params)


def _check_same_dtype(target, weight):
    # 'mxnet' mode multiplies a comparison of each (MXNet's elementwise operators take one
    # dtype; the 'numpy' twin takes any two)
    if np.dtype(target) != np.dtype(weight):
        raise _checks.fail(
            "ohem_sampler",
            "conf_weight",
            f"must have conf_target's dtype ({np.dtype(target).name}), got "
            f"{np.dtype(weight).name}; cast one of them first",
            TypeError,
        )


def _wide(dtype):
    # a bfloat16 input (a structured NumPy dtype) is computed on as float32
    return np.dtype(np.float32) if np.dtype(dtype).kind == "V" else np.dtype(dtype)


# Symbols, Module and hybridized blocks ask for the output shape and dtype at every new
# signature: answered from the shapes and dtypes, with the forward's own checks, instead of
# by a forward on placeholder inputs (as ops.box_iou and ops.smooth_l1)
def _infer_shape(conf_data, conf_target, conf_weight, **params):
    # (MXNet hands over only the parameters a call set: the others are the op's defaults)
    given = {**ohem_sampler.signature.defaults, **params}
    _check_shapes(conf_data, conf_target, conf_weight, **given)
    return tuple(conf_weight)


def _infer_type_numpy(conf_data, conf_target, conf_weight, **_):
    # the output is conf_weight's dtype; a float32 result is stored back as bfloat16 when an
    # input was one (customop's widening), as the forward's own run would give it
    _checks.floating("ohem_sampler", "conf_data", _wide(conf_data))
    wide = [d for d in (conf_data, conf_target, conf_weight) if np.dtype(d).kind == "V"]
    return wide[0] if wide and _wide(conf_weight) == np.float32 else conf_weight


def _infer_type(conf_data, conf_target, conf_weight, **params):
    out = _infer_type_numpy(conf_data, conf_target, conf_weight, **params)
    _check_same_dtype(_wide(conf_target), _wide(conf_weight))
    return out


@customop(
    "mxnet",
    name="ops.ohem_sampler",
    auto_grad=False,
    infer_shape=_infer_shape,
    infer_type=_infer_type,
)
def ohem_sampler(
    conf_data,
    conf_target,
    conf_weight,
    *,
    ratio=3.0,
    min_neg=0,
    ignore_label=-1,
    loss_type="softmax",
    from_logits=True,
):
    r"""Online hard example mining (Shrivastava et al., 2016) by re-weighting samples.

    Per image ``b``: a sample is *usable* if ``conf_weight > 0`` and
    ``conf_target != ignore_label``; usable samples with ``conf_target > 0`` are
    positives, with ``conf_target == 0`` negatives. Every positive is kept, and the

    .. math::

        n_{neg} = \min\left(\max\left(\lfloor \mathrm{ratio} \cdot n_{pos} \rfloor,\
                  \mathrm{min\_neg}\right),\ \#\text{negatives}\right)

    negatives with the highest background loss are kept, where (``loss_type='softmax'``)

    .. math::

        \ell_i = -\log p_{i,0},\qquad p_{i,0} = \frac{e^{x_{i,0}}}{\sum_c e^{x_{i,c}}}
        \ \text{(``from_logits=True``)},\quad p_{i,0} = x_{i,0}\ \text{(``from_logits=False``)}

    is the softmax cross-entropy of sample ``i`` if it were background (class 0). With
    ``from_logits=False`` (the seed's convention: ``conf_data`` holds softmax
    probabilities) this ranks by the lowest background probability ``x[..., 0]``;
    no softmax is applied.

    Rounding: :math:`\lfloor \mathrm{ratio} \cdot n_{pos} \rfloor`, as GluonCV's
    ``OHEMSampler``; SSD's hard negative mining (and GluonCV's ``SSDMultiBoxLoss``)
    rounds up, :math:`\lceil \mathrm{ratio} \cdot n_{pos} \rceil`. They differ only
    when ``ratio * n_pos`` is not an integer (``ratio=2.5``, 3 positives: 7 here, 8 in
    SSD).
    Ties in :math:`\ell` are broken by the lower sample index first (exactly, in
    both modes). The output is 1 for kept and 0 for every other sample (dropped
    negatives, ignored and zero-weight samples); feed it as the weight of the
    classification loss. No gradient flows to any input (zeros).

    ``ops.ohem_sampler`` runs in ``'mxnet'`` mode (one ``sort`` per image row plus
    element-wise ops; no host copy) and does not check label values or NaNs (that
    would cost a device sync; a NaN loss ranks unpredictably); the ``'numpy'``
    twin ``ops.ohem_sampler.numpy`` rejects labels outside ``{ignore_label} ∪ [0, C)``,
    NaN in ``conf_data`` and, with ``from_logits=False``, probabilities outside [0, 1].

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
    from_logits : bool, default True
        ``conf_data`` holds logits; ``False``: softmax probabilities (the seed's input).

    Notes
    -----
    Shapes: ``conf_data`` (B, N, C) float logits (or probabilities), class 0 = background;
    ``conf_target`` (B, N) class ids; ``conf_weight`` (B, N) or (B, N, 1);
    output ``new_conf_weight`` of ``conf_weight``'s shape and dtype.  In ``'mxnet'`` mode
    ``conf_target`` and ``conf_weight`` have one dtype (else ``TypeError``).

    Example:
        >>> import mxnet as mx
        >>> from customop import ops
        >>> x = mx.nd.array([[[0, 0], [0, 3], [0, 1], [0, 2], [5, 0]]])   # losses rise with x1
        >>> t, w = mx.nd.array([[1, 0, 0, 0, 0]]), mx.nd.ones((1, 5))
        >>> ops.ohem_sampler(x, t, w, ratio=2).asnumpy().tolist()
        [[1.0, 1.0, 0.0, 1.0, 0.0]]
    """
    _check(**locals())  # the arguments, by name
    _check_same_dtype(conf_target.dtype, conf_weight.dtype)
    f64 = "float64"
    # Shapes come from the arrays through operators (reshape_like, slice_axis, 0 and -1 in
    # mx.nd.reshape), never as numbers: a graph of it serves any batch size.
    weight = conf_weight
    conf_weight = mx.nd.reshape_like(conf_weight, conf_target)
    if from_logits:
        conf_data = mx.nd.log_softmax(conf_data, axis=-1)
    # -p0 ranks as -log p0 does
    loss = -mx.nd.reshape(mx.nd.slice_axis(conf_data, axis=2, begin=0, end=1), shape=(0, 0)).astype(
        f64
    )
    usable = (conf_weight > 0) * (conf_target != ignore_label)
    pos = (usable * (conf_target > 0)).astype(f64)
    neg = (usable * (conf_target == 0)).astype(f64)
    wanted = mx.nd.maximum(mx.nd.floor(pos.sum(axis=1) * ratio), float(min_neg))
    num_neg = mx.nd.reshape(mx.nd.minimum(wanted, neg.sum(axis=1)), shape=(-1, 1))  # (B, 1)
    key = mx.nd.where(neg, loss, mx.nd.log(mx.nd.zeros_like(loss)))  # -inf off the negatives
    ranked = mx.nd.sort(key, axis=1, is_ascend=False)
    cut = mx.nd.pick(
        ranked, mx.nd.reshape(mx.nd.maximum(num_neg - 1, 0), shape=(-1,)), axis=1, keepdims=True
    )  # the num_neg-th largest loss
    above = neg * mx.nd.broadcast_greater(key, cut)
    at_cut = neg * mx.nd.broadcast_equal(key, cut)
    room = num_neg - above.sum(axis=1, keepdims=True)  # ties at the cut: lowest index first
    kept_ties = at_cut * mx.nd.broadcast_lesser_equal(mx.nd.cumsum(at_cut, axis=1), room)
    return mx.nd.reshape_like((pos + above + kept_ties).astype(weight.dtype), weight)


@ohem_sampler.twin("numpy", infer_type=_infer_type_numpy)
def _ohem_sampler_numpy(
    conf_data,
    conf_target,
    conf_weight,
    *,
    ratio,
    min_neg,
    ignore_label,
    loss_type,
    from_logits,
):
    _check(**locals())  # the arguments, by name
    num_class = conf_data.shape[-1]
    labels = conf_target[conf_target != ignore_label]
    if np.any((labels < 0) | (labels >= num_class) | (labels != np.round(labels))):
        raise _checks.fail(
            "ohem_sampler",
            "conf_target",
            f"has values outside {{ignore_label={ignore_label}}} and the classes [0, {num_class})",
        )
    if np.isnan(conf_data).any():
        raise _checks.fail("ohem_sampler", "conf_data", "contains NaN")
    if not from_logits and np.any((conf_data < 0) | (conf_data > 1)):
        raise _checks.fail(
            "ohem_sampler",
            "conf_data",
            "holds values outside [0, 1], but from_logits=False says they are probabilities",
        )
    weight_shape = conf_weight.shape
    conf_weight = conf_weight.reshape(conf_target.shape)
    x = conf_data.astype(np.float64)
    if from_logits:
        top = x.max(axis=-1, keepdims=True)
        loss = (np.log(np.exp(x - top).sum(axis=-1)) + top[..., 0]) - x[..., 0]
    else:
        loss = -x[..., 0]
    out = np.zeros_like(conf_weight)
    for b in range(x.shape[0]):
        usable = (conf_weight[b] > 0) & (conf_target[b] != ignore_label)
        pos = usable & (conf_target[b] > 0)
        neg = np.flatnonzero(usable & (conf_target[b] == 0))
        num_neg = min(max(int(np.floor(ratio * pos.sum())), min_neg), len(neg))
        hardest = neg[np.argsort(-loss[b, neg], kind="stable")[:num_neg]]
        out[b, pos] = 1
        out[b, hardest] = 1
    return out.reshape(weight_shape)
