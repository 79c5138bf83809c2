"""The library ops' port cases: inputs, parameters, and MXNet's own outputs and gradients.

The reference is the op run by MXNet (``mx.autograd.record`` and ``backward`` with a random
head gradient: the op's forward and its ``def_grad`` closures), never the port's code.
"""

from __future__ import annotations

import numpy as np

R = np.random.RandomState


def boxes(r, *shape, legacy=False):
    lo = r.uniform(0, 10, shape + (2,))
    hi = lo + r.uniform(1, 5, shape + (2,))
    return np.concatenate([lo, hi], -1).astype(np.float32)


def _focal(r, n=2, a=6, c=3):
    return [r.randn(n, a, c).astype("f"), r.randint(-1, c + 1, (n, a)).astype("f")]


def _nms_data(r, n=2, a=12):
    ids = r.randint(0, 3, (n, a, 1)).astype("f")
    return [np.concatenate([ids, r.rand(n, a, 1).astype("f"), boxes(r, n, a)], -1)]


def _encode(r, n=2, a=6, m=3):
    return [
        r.choice([-1.0, 0.0, 1.0], (n, a)).astype("f"),
        r.randint(0, m, (n, a)).astype("f"),
        boxes(r, n, a),
        boxes(r, n, m),
        r.randn(4).astype("f") * 0.1,
        r.uniform(0.1, 0.3, 4).astype("f"),
    ]


def _ohem(r, n=2, a=8, c=3):
    return [
        r.randn(n, a, c).astype("f"),
        r.randint(-1, c, (n, a)).astype("f"),
        np.ones((n, a), "f"),
    ]


# (id, op name, inputs(r), params, inputs that get a gradient)
CASES = [
    ("focal_loss", "focal_loss", _focal, {}, [0]),
    (
        "focal_loss-params",
        "focal_loss",
        _focal,
        {"alpha": 0.5, "gamma": 1.5, "normalization": "valid"},
        [0],
    ),
    (
        "focal_loss-normalizer",
        "focal_loss",
        lambda r: _focal(r) + [np.array([2.5], "f")],
        {},
        [0, 2],
    ),
    (
        "smooth_l1",
        "smooth_l1",
        lambda r: [r.randn(2, 6, 4).astype("f"), np.array([1.5], "f")],
        {},
        [0],
    ),
    (
        "smooth_l1-weight",
        "smooth_l1",
        lambda r: [r.randn(2, 6, 4).astype("f"), np.array([0.8], "f"), r.rand(2, 6, 4).astype("f")],
        {},
        [0],
    ),
    (
        "wing_loss",
        "wing_loss",
        lambda r: [r.randn(2, 6).astype("f") * 5, r.randn(2, 6).astype("f") * 5],
        {},
        [0, 1],
    ),
    (
        "wing_loss-weight",
        "wing_loss",
        lambda r: [
            r.randn(2, 6).astype("f") * 5,
            r.randn(2, 6).astype("f") * 5,
            r.rand(2, 6).astype("f"),
        ],
        {"w": 5.0, "epsilon": 1.0},
        [0, 1, 2],
    ),
    (
        "softmax_ce",
        "softmax_ce",
        lambda r: [r.randn(4, 5).astype("f"), r.randint(0, 5, (4,)).astype("f")],
        {},
        [0],
    ),
    ("tile", "tile", lambda r: [r.randn(2, 3).astype("f")], {"reps": (2, 3)}, [0]),
    ("topk-value", "topk", lambda r: [r.randn(3, 7).astype("f")], {"k": 3}, [0]),
    ("topk-both", "topk", lambda r: [r.randn(3, 7).astype("f")], {"k": 2, "ret_typ": "both"}, [0]),
    (
        "topk-axis-ascend",
        "topk",
        lambda r: [r.randn(2, 7, 3).astype("f")],
        {"k": 2, "axis": 1, "is_ascend": True},
        [0],
    ),
    ("topk-mask", "topk", lambda r: [r.randn(3, 7).astype("f")], {"k": 3, "ret_typ": "mask"}, [0]),
    (
        "arr_pick",
        "arr_pick",
        lambda r: [r.randn(2, 5, 7).astype("f"), r.randint(0, 5, (2, 1, 7)).astype("f")],
        {"num": 5},
        [0],
    ),
    ("box_iou", "box_iou", lambda r: [boxes(r, 2, 5), boxes(r, 2, 4)], {}, [0, 1]),
    (
        "box_iou-center",
        "box_iou",
        lambda r: [boxes(r, 2, 5), boxes(r, 2, 4)],
        {"format": "center"},
        [0, 1],
    ),
    (
        "box_iou-legacy",
        "box_iou",
        lambda r: [boxes(r, 2, 5), boxes(r, 2, 4)],
        {"legacy_box": True},
        [0, 1],
    ),
    (
        "box_decode",
        "box_decode",
        lambda r: [r.randn(2, 6, 4).astype("f"), boxes(r, 1, 6)],
        {"clip": 4.0},
        [0, 1],
    ),
    (
        "box_decode-corner-legacy",
        "box_decode",
        lambda r: [r.randn(2, 6, 4).astype("f"), boxes(r, 1, 6)],
        {"format": "corner", "legacy_box": True, "std0": 0.1},
        [0, 1],
    ),
    ("box_encode", "box_encode", _encode, {}, [2, 3, 4, 5]),
    ("box_encode-legacy", "box_encode", _encode, {"legacy_box": True}, [2, 3, 4, 5]),
    ("ohem_sampler", "ohem_sampler", _ohem, {}, []),
    ("box_nms", "box_nms", _nms_data, {"overlap_thresh": 0.4}, []),
    ("box_nms-class", "box_nms", _nms_data, {"id_index": 0, "topk": 5, "valid_thresh": 0.1}, []),
]
IDS = [c[0] for c in CASES]


def mxnet_reference(op, inputs, params, grads, seed=1):
    """MXNet's outputs, head gradients and input gradients for ``op`` at ``inputs``."""
    import mxnet as mx

    xs = [mx.nd.array(a, dtype=a.dtype) for a in inputs]
    for i in grads:
        xs[i].attach_grad()
    with mx.autograd.record():
        out = op(*xs, **params)
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    r = R(seed)
    heads = [r.randn(*o.shape).astype(o.dtype) for o in outs]
    if grads:
        mx.autograd.backward(outs, [mx.nd.array(h, dtype=h.dtype) for h in heads])
    return ([o.asnumpy() for o in outs], heads, [xs[i].grad.asnumpy() for i in grads])
