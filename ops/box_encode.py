"""``ops.box_encode``: ``mx.nd.contrib.box_encode`` plus ``legacy_box``, differentiable."""

from __future__ import annotations

import mxnet as mx
import numpy as np
from autograd import numpy as anp
from autograd.tracer import getval

from customop import customop

from . import _checks
from ._boxes import to_center


def _check_shapes(samples, matches, anchors, refs, means, stds):
    _checks.boxes("box_encode", "anchors", anchors, ndim=3)
    _checks.boxes("box_encode", "refs", refs, ndim=3)
    b, n = anchors[:2]
    for name, shape in (("samples", samples), ("matches", matches)):
        _checks.same_shape("box_encode", name, shape, (b, n), "(B, N) like anchors")
    _checks.shape_is("box_encode", "refs", refs, refs[0] == b, f"(B, M, 4) with B = {b}")
    for name, shape in (("means", means), ("stds", stds)):
        _checks.same_shape("box_encode", name, shape, (4,), "one value per coordinate")


def _check_dtypes(anchors, refs, means, stds):
    for name, dtype in (("anchors", anchors), ("refs", refs), ("means", means), ("stds", stds)):
        _checks.floating("box_encode", name, dtype)


def _check(samples, matches, anchors, refs, means, stds, legacy_box):
    _check_shapes(*(x.shape for x in (samples, matches, anchors, refs, means, stds)))
    _check_dtypes(anchors.dtype, refs.dtype, means.dtype, stds.dtype)
    _checks.boolean("box_encode", "legacy_box", legacy_box)


_MATCHES = "of positive samples must be integers in [0, M={m})"


# Symbols, Module and hybridized blocks ask for the output shapes and dtypes at every new
# signature (a new box count): answered from the shapes and dtypes with the forward's own
# checks, so a bad signature raises the op's named error at the bind, as ops.box_iou does
def _infer_shape(samples, matches, anchors, refs, means, stds, *, legacy_box=False):
    _check_shapes(samples, matches, anchors, refs, means, stds)
    _checks.boolean("box_encode", "legacy_box", legacy_box)
    return [anchors, anchors]


def _infer_type(samples, matches, anchors, refs, means, stds, **_):
    dtypes = [np.dtype(d) for d in (samples, matches, anchors, refs, means, stds)]
    # (bfloat16 arrives as a structured NumPy dtype: a float, computed on as float32)
    _check_dtypes(*(np.float32 if d.kind == "V" else d for d in dtypes[2:]))
    floats = [d for d in dtypes if d.kind in "fV"]  # the first float input's, as before
    return [floats[0] if floats else np.dtype(np.float32)] * 2


# samples and matches select; they get no gradient.
@customop(
    "mxnet",
    name="ops.box_encode",
    infer_shape=_infer_shape,
    infer_type=_infer_type,
    num_outputs=2,
    no_grad=("samples", "matches"),
)
def box_encode(samples, matches, anchors, refs, means, stds, *, legacy_box=False):
    r"""Regression targets of matched reference boxes w.r.t. anchors (R-CNN coding).

    For anchor :math:`a` matched to reference box :math:`r` (both corner boxes),
    with :math:`w = x_2 - x_1 + \delta`, :math:`x = x_1 + w/2` (:math:`\delta = 1`
    when ``legacy_box``, else 0):

    .. math::

        t = \left(\frac{x_r - x_a}{w_a}, \frac{y_r - y_a}{h_a},
                  \log\frac{w_r}{w_a}, \log\frac{h_r}{h_a}\right),\qquad
        \mathrm{targets} = \frac{t - \mathrm{means}}{\mathrm{stds}}

    for positive samples (``samples > 0.5``) and 0 elsewhere; ``masks`` is 1 for
    positive samples and 0 elsewhere, on all 4 coordinates. With
    ``legacy_box=False`` the outputs equal ``mx.nd.contrib.box_encode`` bit for bit
    (the ``'mxnet'`` op calls it; ``legacy_box=True`` composes ``take``, ``log``,
    ``where``); unlike it, this op is differentiable w.r.t. ``anchors``, ``refs`` (e.g. predicted
    boxes), ``means`` and ``stds`` (``samples`` and ``matches`` get zero).
    Degenerate boxes give ``inf``/``nan`` targets as in MXNet. ``matches`` of
    non-positive samples may be anything (clipped into range before MXNet's kernel,
    which does not bound-check them).  A positive sample's match outside ``[0, M)``
    (or not an integer): ``ops.box_encode.numpy`` raises ``ValueError``; the
    ``'mxnet'`` op gives that anchor NaN targets and mask, on the device (no sync),
    on every path, exported graphs included.

    Parameters
    ----------
    legacy_box : bool, default False
        Widths and heights are ``x2 - x1 + 1``, ``y2 - y1 + 1`` (Caffe/Detectron).

    Notes
    -----
    Shapes: ``samples`` (B, N): +1 positive, -1 negative, 0 ignore;
    ``matches`` (B, N): index into ``refs``; ``anchors`` (B, N, 4); ``refs`` (B, M, 4);
    ``means``, ``stds`` (4,); all four float (integer: ``TypeError``).
    Outputs ``targets``, ``masks``: (B, N, 4).

    Example:
        >>> import mxnet as mx
        >>> from customop import ops
        >>> f = lambda x: mx.nd.array(x, dtype='float64')
        >>> s, m, a, r = f([[1]]), f([[0]]), f([[[0, 0, 9, 9]]]), f([[[0, 0, 19, 9]]])
        >>> t, mask = ops.box_encode(s, m, a, r, f([0] * 4), f([1] * 4), legacy_box=True)
        >>> t.asnumpy().round(4).tolist()   # width 20 vs 10: dx = (10 - 5) / 10, log 2
        [[[0.5, 0.0, 0.6931, 0.0]]]
    """
    _check(samples, matches, anchors, refs, means, stds, legacy_box)
    # A positive sample's match must index refs; MXNet's kernel reads refs[matches] without a
    # bound check, so it gets indices clipped into range, and an anchor whose match was not
    # valid gets NaN targets and mask (1 / 0 * 0), on the device: no read back on any path.
    # M - 1 is read with operators (the last of 0..M-1), not from refs.shape[1]: the training
    # graph then serves any batch size and number of reference boxes (a number would
    # specialize it to the traced M); two operators, each a call in every training step.
    with mx.autograd.pause():
        last = mx.nd.max(mx.nd.contrib.arange_like(refs, axis=1)).astype(matches.dtype, copy=False)
        clipped = mx.nd.broadcast_minimum(mx.nd.maximum(matches, 0), last)
        # in range and an integer: the floor of the clipped match is the match (NaN never
        # equals); a sample that is not positive compares its floor with itself
        floor = mx.nd.floor(clipped)
        ok = floor == mx.nd.where(samples > 0.5, matches, floor)
        nan_or_one = mx.nd.expand_dims(ok / ok, axis=2).astype(anchors.dtype, copy=False)
        matches = clipped
    if not legacy_box:  # MXNet's kernel, for bit-equal outputs; gradients: _encode_grad
        outs = mx.nd.contrib.box_encode(samples, matches, anchors, refs, means, stds)
    else:
        outs = _encode_nd(samples, matches, anchors, refs, means, stds, 1)
    return tuple(mx.nd.broadcast_mul(o, nan_or_one) for o in outs)


def _encode_nd(samples, matches, anchors, refs, means, stds, one):
    # Each anchor's reference by a one-hot product (as _encode_grads), shapes by operators:
    # the graph holds at every (B, N, M) (rows counted from refs.shape did not).
    with mx.autograd.pause():
        valid = samples > 0.5
    work = np.float64 if anchors.dtype == np.float64 else np.float32  # (no float16 dot on CPU)
    ref = mx.nd.batch_dot(_one_hot_refs(matches, refs, work), refs.astype(work, copy=False))
    ref = ref.astype(anchors.dtype, copy=False)
    rx, ry, rw, rh = to_center(*mx.nd.split(ref, 4, axis=-1), one)
    ax, ay, aw, ah = to_center(*mx.nd.split(anchors, 4, axis=-1), one)
    t = mx.nd.concat((rx - ax) / aw, (ry - ay) / ah, mx.nd.log(rw / aw), mx.nd.log(rh / ah), dim=-1)
    t = mx.nd.broadcast_div(
        mx.nd.broadcast_sub(t, means.reshape((1, 1, 4))), stds.reshape((1, 1, 4))
    )
    masks = mx.nd.broadcast_like(mx.nd.expand_dims(valid, axis=2), anchors)
    return mx.nd.where(masks, t, mx.nd.zeros_like(t)), masks


# d targets / d (anchors, refs, means, stds), written out: contrib.box_encode has no gradient.
# With G = g * masks / stds (the gradient of t), per anchor and coordinate k of x1 y1 x2 y2:
# the x (y) coordinates get G0 (G1) and G2 (G3) times coefficients of the boxes; a ref's
# gradient is the sum over the anchors matched to it (a one-hot product, never a read-back).
# Linear in g: training graphs transpose it (customop.graphs.backward), and a recorded
# forward computes its coefficients every call. So coordinates are mixed by products with
# 4 x 4 matrices of 0, 1 and 1/2 (_mixers), never split and concatenated on the last axis:
# MXNet's split and Concat there took 2.2 of the graph's 5.4 ms at 8 x 768 anchors, and
# slicing or broadcasting g would transpose into Concat and slow sums (both measured).
def _one_hot_refs(matches, refs, dtype):
    index = mx.nd.floor(matches.astype(dtype, copy=False))  # (as MXNet's kernel truncates)
    return mx.nd.broadcast_equal(
        index.expand_dims(2),
        mx.nd.reshape(
            mx.nd.contrib.arange_like(refs, axis=1).astype(dtype, copy=False), shape=(1, 1, -1)
        ),
    ).astype(dtype)


def _encode_grads(ans, samples, matches, anchors, refs, means, stds, *, legacy_box=False):
    one = 1 if legacy_box else 0
    targets, masks = ans
    dtype = anchors.dtype
    hot = _one_hot_refs(matches, refs, dtype)  # (B, N, M)
    ref = mx.nd.batch_dot(hot, refs)  # each anchor's reference box (zeros: unmatched)
    centers, logs, sign = _mixers(stds, dtype)
    widths = logs - centers  # v . widths = (v2 - v0, v3 - v1, v2 - v0, v3 - v1)
    width = mx.nd.dot(anchors, widths) + one  # (w, h, w, h) of the anchors
    ref_width = mx.nd.dot(ref, widths) + one
    t = mx.nd.dot(ref - anchors, (centers + logs) * 0.5) / width  # centers: (x1 + x2 + one) / 2
    on, zeros = masks > 0.5, mx.nd.zeros_like(anchors)
    # anchors: x1 <- G0 (t/w - 1/2w) + G2 / w; x2 <- G0 (-t/w - 1/2w) - G2 / w; y alike
    a_same = mx.nd.where(on, (mx.nd.broadcast_mul(t, -sign) - 0.5) / width, zeros)
    a_log = mx.nd.where(on, mx.nd.broadcast_mul(1 / width, -sign), zeros)
    # refs: x1 <- G0 / 2w - G2 / w_ref; x2 <- G0 / 2w + G2 / w_ref
    r_same = mx.nd.where(on, 0.5 / width, zeros)
    r_log = mx.nd.where(on, mx.nd.broadcast_mul(1 / ref_width, sign), zeros)

    def grad(g):
        big = mx.nd.broadcast_div(g[0] * masks, stds.reshape((1, 1, 4)))  # d loss / d t
        by_same, by_log = mx.nd.dot(big, centers), mx.nd.dot(big, logs)  # (G0 G1 G0 G1), (G2..)
        d_anchors = by_same * a_same + by_log * a_log
        d_refs = mx.nd.batch_dot(hot, by_same * r_same + by_log * r_log, transpose_a=True)
        d_means = -big.sum(axis=(0, 1))
        d_stds = -(big * targets).sum(axis=(0, 1))
        return d_anchors, d_refs, d_means, d_stds

    return grad


def _mixers(like, dtype):
    # Products with a vector v = (v0, v1, v2, v3), made by operators (the graph has no
    # constants): v . centers = (v0, v1, v0, v1), v . logs = (v2, v3, v2, v3); and the signs
    # (-1, -1, 1, 1) of x1 y1 x2 y2. ``like``: any (4,) array.
    k = mx.nd.contrib.arange_like(like).astype(dtype, copy=False)  # 0 1 2 3
    upper = k >= 2
    column = mx.nd.expand_dims(k - upper * 2, axis=0)  # the axis of each coordinate: 0 1 0 1
    row = mx.nd.expand_dims(k, axis=1)
    centers = mx.nd.broadcast_equal(row, column)
    return centers, mx.nd.broadcast_equal(row, column + 2), upper * 2 - 1


box_encode.def_grad(_encode_grads, argnum=(2, 3, 4, 5))  # anchors, refs, means, stds


@box_encode.twin("numpy")
def _box_encode_numpy(samples, matches, anchors, refs, means, stds, *, legacy_box=False):
    # Written with autograd.numpy: HIPS autograd gives the gradients.
    _check(samples, matches, anchors, refs, means, stds, legacy_box)
    one = 1 if legacy_box else 0
    valid = getval(samples) > 0.5
    index = getval(matches)
    if np.any(valid & ((index < 0) | (index >= refs.shape[1]) | (index != np.round(index)))):
        raise _checks.fail("box_encode", "matches", _MATCHES.format(m=refs.shape[1]))
    index = np.clip(index, 0, refs.shape[1] - 1).astype(np.int64)
    ref = refs[np.arange(refs.shape[0])[:, None], index]
    rx, ry, rw, rh = to_center(ref[..., 0], ref[..., 1], ref[..., 2], ref[..., 3], one)
    ax, ay, aw, ah = to_center(
        anchors[..., 0], anchors[..., 1], anchors[..., 2], anchors[..., 3], one
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        t = anp.stack([(rx - ax) / aw, (ry - ay) / ah, anp.log(rw / aw), anp.log(rh / ah)], -1)
        t = (t - means) / stds
    masks = np.broadcast_to(valid[..., None], t.shape).astype(getval(anchors).dtype)
    return anp.where(masks > 0, t, 0.0), masks
