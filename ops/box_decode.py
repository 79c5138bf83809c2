"""``ops.box_decode``: ``mx.nd.contrib.box_decode`` plus ``legacy_box``, differentiable."""

from __future__ import annotations

import mxnet as mx
from autograd import numpy as anp

from customop import customop

from . import _checks
from ._boxes import to_center, to_corner


def _check(data, anchors, std0, std1, std2, std3, clip, format, legacy_box):
    _checks.boxes("box_decode", "data", data.shape, ndim=3)
    _checks.boxes("box_decode", "anchors", anchors.shape, ndim=3)
    _checks.floating("box_decode", "data", data.dtype)
    _checks.floating("box_decode", "anchors", anchors.dtype)
    _checks.shape_is(
        "box_decode",
        "anchors",
        anchors.shape,
        anchors.shape[0] in (1, data.shape[0]) and anchors.shape[1] == data.shape[1],
        f"(1, N, 4) or (B, N, 4) for data of shape {tuple(data.shape)}",
    )
    for i, std in enumerate((std0, std1, std2, std3)):
        _checks.number("box_decode", f"std{i}", std)
    if clip is None:
        raise _checks.fail(
            "box_decode",
            "clip",
            "must be a number (-1 or any value <= 0: no clip; GluonCV's clip=None), got None",
            TypeError,
        )
    _checks.number("box_decode", "clip", clip)
    _checks.box_format("box_decode", "format", format)
    _checks.boolean("box_decode", "legacy_box", legacy_box)


@customop("mxnet", name="ops.box_decode")
def box_decode(
    data,
    anchors,
    *,
    std0=1.0,
    std1=1.0,
    std2=1.0,
    std3=1.0,
    clip=-1.0,
    format="center",
    legacy_box=False,
):
    r"""Boxes from regression offsets w.r.t. anchors (inverse of :func:`ops.box_encode`).

    With anchor center :math:`(x_a, y_a)` and size :math:`(w_a, h_a)` (for
    ``format='corner'`` anchors, :math:`w_a = x_2 - x_1 + \delta`,
    :math:`x_a = x_1 + w_a/2`; :math:`\delta = 1` when ``legacy_box``, else 0):

    .. math::

        x = d_0 s_0 w_a + x_a,\quad w = e^{\min(d_2 s_2,\ \mathrm{clip})} w_a,\qquad
        \mathrm{out} = \left(x - \tfrac{w}{2},\ y - \tfrac{h}{2},\
                             x + \tfrac{w}{2} - \delta,\ y + \tfrac{h}{2} - \delta\right)

    (the clip only when ``clip > 0``; likewise for y, h with ``s_1``, ``s_3``). The output
    is always corner boxes; ``box_decode(box_encode(r))`` gives back ``r`` in both
    conventions. With ``legacy_box=False`` this equals ``mx.nd.contrib.box_decode``
    (whose ``std`` parameters multiply, despite their description); unlike it, it
    is differentiable w.r.t. ``data`` and ``anchors``.

    Parameters
    ----------
    std0, std1, std2, std3 : finite float, default 1
        Scales of the 4 offsets.
    clip : finite float, default -1
        If positive, the upper bound of the scaled log-size offsets (GluonCV's ``clip=None``
        is ``-1`` here; ``None`` raises ``TypeError``).
    format : {'center', 'corner'}, default 'center'
        Encoding of ``anchors``.
    legacy_box : bool, default False
        Widths and heights are ``x2 - x1 + 1``, ``y2 - y1 + 1``.

    Notes
    -----
    Shapes: ``data`` (B, N, 4), float; ``anchors`` (1, N, 4) (or (B, N, 4): one set per
    image, where MXNet's op would read only the first); output (B, N, 4).

    Example:
        >>> import mxnet as mx
        >>> from customop import ops
        >>> d, a = mx.nd.array([[[0.5, 0, 0.6931472, 0]]]), mx.nd.array([[[0, 0, 9, 9]]])
        >>> ops.box_decode(d, a, format='corner', legacy_box=True).asnumpy().round(3).tolist()
        [[[0.0, 0.0, 19.0, 9.0]]]
    """
    _check(data, anchors, std0, std1, std2, std3, clip, format, legacy_box)
    one = 1 if legacy_box else 0
    a = mx.nd.split(anchors, 4, axis=-1)
    ax, ay, aw, ah = to_center(*a, one) if format == "corner" else a
    d0, d1, d2, d3 = mx.nd.split(data, 4, axis=-1)
    x = mx.nd.broadcast_add(mx.nd.broadcast_mul(d0 * std0, aw), ax)
    y = mx.nd.broadcast_add(mx.nd.broadcast_mul(d1 * std1, ah), ay)
    dw, dh = d2 * std2, d3 * std3
    if clip > 0:
        dw, dh = mx.nd.minimum(dw, clip), mx.nd.minimum(dh, clip)
    w = mx.nd.broadcast_mul(mx.nd.exp(dw), aw)
    h = mx.nd.broadcast_mul(mx.nd.exp(dh), ah)
    return mx.nd.concat(*to_corner(x, y, w, h, one), dim=-1)


@box_decode.twin("numpy")
def _box_decode_numpy(
    data,
    anchors,
    *,
    std0,
    std1,
    std2,
    std3,
    clip,
    format,
    legacy_box,
):
    # Written with autograd.numpy: HIPS autograd gives the gradients.
    _check(data, anchors, std0, std1, std2, std3, clip, format, legacy_box)
    one = 1 if legacy_box else 0
    a = [anchors[..., i] for i in range(4)]
    ax, ay, aw, ah = to_center(*a, one) if format == "corner" else a
    x, y = data[..., 0] * std0 * aw + ax, data[..., 1] * std1 * ah + ay
    dw, dh = data[..., 2] * std2, data[..., 3] * std3
    if clip > 0:
        dw, dh = anp.minimum(dw, clip), anp.minimum(dh, clip)
    return anp.stack(to_corner(x, y, anp.exp(dw) * aw, anp.exp(dh) * ah, one), axis=-1)
