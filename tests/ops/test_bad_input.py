"""No silent garbage (issue 19): wrong parameter types, NaN/inf parameters and integer inputs to
float math raise an exception naming the operator and the argument, in both modes, on every
call style, and the process stays usable."""

import contextlib
import re

import mxnet as mx
import numpy as np
import pytest

import ops
from customop.dispatch import forced_path
from tests.ops.detection import OpBlock


def f32(*shape):
    return np.random.rand(*shape).astype(np.float32) + 0.5


def i64(*shape):
    return np.random.randint(1, 3, size=shape).astype(np.int64)


BOXES = np.array([[0, 0, 9, 9], [5, 5, 14, 14]], np.float32)
DETS = np.array([[[0, 0.9, 0, 0, 9, 9], [0, 0.8, 5, 5, 14, 14]]], np.float32)
ENC = [
    np.ones((1, 2), np.float32),
    np.zeros((1, 2), np.float32),
    BOXES[None],
    BOXES[None],
    np.zeros(4, np.float32),
    np.ones(4, np.float32),
]
OHEM = [f32(1, 4, 3), np.array([[1, 0, 0, 0]], np.float32), np.ones((1, 4), np.float32)]
NAN, INF = float("nan"), float("inf")

# (case id, op, inputs, params, exception, the argument the message must name)
CASES = [
    (
        "box_iou-str-legacy_box",
        ops.box_iou,
        [BOXES, BOXES],
        dict(legacy_box="False"),
        TypeError,
        "legacy_box",
    ),
    ("box_iou-int-boxes", ops.box_iou, [BOXES.astype(np.int64), BOXES], {}, TypeError, "lhs"),
    (
        "box_encode-str-legacy_box",
        ops.box_encode,
        ENC,
        dict(legacy_box="False"),
        TypeError,
        "legacy_box",
    ),
    (
        "box_decode-str-legacy_box",
        ops.box_decode,
        [f32(1, 2, 4), BOXES[None]],
        dict(legacy_box="True", format="corner"),
        TypeError,
        "legacy_box",
    ),
    (
        "box_decode-clip-None",
        ops.box_decode,
        [f32(1, 2, 4), BOXES[None]],
        dict(clip=None),
        TypeError,
        "clip",
    ),
    (
        "box_decode-nan-std",
        ops.box_decode,
        [f32(1, 2, 4), BOXES[None]],
        dict(std2=NAN),
        ValueError,
        "std2",
    ),
    (
        "box_nms-str-force_suppress",
        ops.box_nms,
        [DETS],
        dict(force_suppress="False"),
        TypeError,
        "force_suppress",
    ),
    (
        "box_nms-nan-overlap",
        ops.box_nms,
        [DETS],
        dict(overlap_thresh=NAN),
        ValueError,
        "overlap_thresh",
    ),
    ("box_nms-float-topk", ops.box_nms, [DETS], dict(topk=1.5), TypeError, "topk"),
    (
        "focal-str-alpha",
        ops.focal_loss,
        [f32(2, 3, 4), i64(2, 3)],
        dict(alpha="0.25"),
        TypeError,
        "alpha",
    ),
    (
        "focal-nan-gamma",
        ops.focal_loss,
        [f32(2, 3, 4), i64(2, 3)],
        dict(gamma=NAN),
        ValueError,
        "gamma",
    ),
    ("focal-int-pred", ops.focal_loss, [i64(2, 3, 4), i64(2, 3)], {}, TypeError, "pred"),
    ("wing-int-pred", ops.wing_loss, [i64(2, 3), i64(2, 3)], {}, TypeError, "pred"),
    ("wing-str-w", ops.wing_loss, [f32(2, 3), f32(2, 3)], dict(w="10"), TypeError, "w"),
    (
        "wing-inf-epsilon",
        ops.wing_loss,
        [f32(2, 3), f32(2, 3)],
        dict(epsilon=INF),
        ValueError,
        "epsilon",
    ),
    (
        "smooth_l1-int-data",
        ops.smooth_l1,
        [i64(2, 3), np.array([2.0], np.float32)],
        {},
        TypeError,
        "data",
    ),
    (
        "smooth_l1-nan-sigma",
        ops.smooth_l1,
        [f32(2, 3), np.array([NAN], np.float32)],
        {},
        ValueError,
        "sigma",
    ),
    (
        "center-int-data",
        ops.center_loss,
        [i64(3, 2), np.array([0, 1, 1], np.float32), np.zeros((2, 2), np.float32)],
        dict(num_class=2),
        TypeError,
        "data",
    ),
    (
        "center-nan-scale",
        ops.center_loss,
        [f32(3, 2), np.array([0, 1, 1], np.float32), np.zeros((2, 2), np.float32)],
        dict(num_class=2, scale=NAN),
        ValueError,
        "scale",
    ),
    (
        "center-str-num_class",
        ops.center_loss,
        [f32(3, 2), np.array([0, 1, 1], np.float32), np.zeros((2, 2), np.float32)],
        dict(num_class="2"),
        TypeError,
        "num_class",
    ),
    (
        "softmax_ce-int-data",
        ops.softmax_ce,
        [i64(2, 3), np.array([0, 1], np.float32)],
        {},
        TypeError,
        "data",
    ),
    ("tile-str-reps", ops.tile, [f32(2, 3)], dict(reps="2"), TypeError, "reps"),
    ("topk-str-is_ascend", ops.topk, [f32(2, 5)], dict(is_ascend="False"), TypeError, "is_ascend"),
    ("topk-str-do_sort", ops.topk, [f32(2, 5)], dict(do_sort="False"), TypeError, "do_sort"),
    ("topk-str-k", ops.topk, [f32(2, 5)], dict(k="3"), TypeError, "k"),
    ("topk-str-k-both", ops.topk, [f32(2, 5)], dict(k="3", ret_typ="both"), TypeError, "k"),
    (
        "arr_pick-str-num",
        ops.arr_pick,
        [f32(1, 2, 5), np.ones((1, 1, 5), np.float32)],
        dict(num="2"),
        TypeError,
        "num",
    ),
    (
        "ohem-str-from_logits",
        ops.ohem_sampler,
        OHEM,
        dict(from_logits="False"),
        TypeError,
        "from_logits",
    ),
    ("ohem-nan-ratio", ops.ohem_sampler, OHEM, dict(ratio=NAN), ValueError, "ratio"),
]
IDS = [c[0] for c in CASES]


def _pattern(op, arg):
    """The message names the op (as ``customop 'ops.<name>'``) and the argument."""
    name = op.op_type.split("~")[0].split(".")[1]
    return rf"customop 'ops\.{name}'.*: {arg} "


def _named_once(exc):
    # One prefix: an op's own check already names it, so nothing may name it again.
    assert str(exc.value).count("customop '") == 1, str(exc.value)


# The value each refused parameter takes in the call that shows the process still works.
GOOD = {
    "legacy_box": False,
    "clip": -1.0,
    "std2": 1.0,
    "force_suppress": False,
    "overlap_thresh": 0.5,
    "topk": -1,
    "alpha": 0.25,
    "gamma": 2.0,
    "w": 10.0,
    "epsilon": 2.0,
    "scale": 1.0,
    "num_class": 2,
    "reps": 2,
    "is_ascend": False,
    "do_sort": True,
    "k": 1,
    "num": 2,
    "from_logits": True,
    "ratio": 3.0,
}


def _good_call(op, inputs, params):
    xs = [
        mx.nd.array(
            np.nan_to_num(a, nan=1.0).astype(
                np.float32 if np.issubdtype(a.dtype, np.integer) and i == 0 else a.dtype
            )
        )
        for i, a in enumerate(inputs)
    ]
    outs = op(*xs, **{k: GOOD.get(k, v) if k in GOOD else v for k, v in params.items()})
    return [o.asnumpy() for o in (outs if isinstance(outs, (tuple, list)) else [outs])]


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("mode", ["mxnet", "numpy"])
@pytest.mark.parametrize("how", ["direct", "function", "custom"])
def test_nd_call_raises_naming_the_op_and_the_argument(case, mode, how):
    name, op, inputs, params, error, arg = case
    op = op.numpy if mode == "numpy" else op
    xs = [mx.nd.array(a, dtype=a.dtype) for a in inputs]
    with forced_path(how):
        with pytest.raises(error, match=_pattern(op, arg)) as exc:
            with contextlib.nullcontext() if how == "direct" else mx.autograd.record():
                outs = op(*xs, **params)
            for o in outs if isinstance(outs, (tuple, list)) else [outs]:
                o.wait_to_read()
    _named_once(exc)
    for out in _good_call(op, inputs, params):  # the same call without the mistake works
        assert np.isfinite(out).all()


# values checked with customop.require in an op that inlines in a hybridized block
_VALUE_CHECKED = {"smooth_l1-nan-sigma"}


@pytest.mark.parametrize(
    "case",
    [
        c
        for c in CASES
        if c[0]
        in (
            "box_iou-str-legacy_box",
            "box_nms-nan-overlap",
            "focal-str-alpha",
            "topk-str-do_sort",
            "topk-str-k-both",
            "ohem-str-from_logits",
            "smooth_l1-nan-sigma",
            "wing-int-pred",
        )
    ],
    ids=lambda c: c[0],
)
@pytest.mark.parametrize("mode", ["mxnet", "numpy"])
def test_hybridized_block_raises_naming_the_op_and_the_argument(case, mode):
    _, op, inputs, params, error, arg = case
    op = op.numpy if mode == "numpy" else op
    net = OpBlock(op, params)
    net.hybridize()
    xs = [mx.nd.array(a, dtype=a.dtype) for a in inputs]
    if mode == "mxnet" and case[0] in _VALUE_CHECKED:  # inlined: a failed check is NaN
        out = net(*xs)
        for o in out if isinstance(out, (tuple, list)) else [out]:
            assert np.isnan(o.asnumpy()).all()
        return
    with pytest.raises(error, match=rf": {arg} ") as exc:
        out = net(*xs)
        for o in out if isinstance(out, (tuple, list)) else [out]:
            o.wait_to_read()
    _named_once(exc)
    assert mx.nd.ones((2,)).sum().asscalar() == 2  # MXNet still answers


def test_string_bool_was_taken_as_true_and_now_is_refused():
    # legacy_box='False' used to compute the legacy (+1) IoU: 10/190 for boxes sharing a row.
    a, b = mx.nd.array([[0, 0, 9, 9]]), mx.nd.array([[0, 9, 9, 18]])
    for op in (ops.box_iou, ops.box_iou.numpy):
        assert op(a, b, legacy_box=False).asscalar() == 0
        with pytest.raises(TypeError, match="legacy_box must be a bool"):
            op(a, b, legacy_box="False")


def test_gluon_blocks_check_their_parameters_at_construction():
    with pytest.raises(TypeError, match=r"customop 'ops.focal_loss': gamma must be a number"):
        ops.FocalLoss(gamma="2")
    with pytest.raises(ValueError, match=r"customop 'ops.smooth_l1': sigma must be a finite"):
        ops.SmoothL1Loss(sigma=NAN)
    with pytest.raises(TypeError, match=r"customop 'ops.smooth_l1': sigma must be a number"):
        ops.SmoothL1Loss(sigma="1")
    with pytest.raises(ValueError, match=r"customop 'ops.wing_loss': w must be a finite"):
        ops.WingLoss(w=INF)
    with pytest.raises(TypeError, match=r"customop 'ops.center_loss': feature_dim must be"):
        ops.CenterLoss(num_class=2, feature_dim="2")


@pytest.mark.parametrize("mode", ["mxnet", "numpy"])
@pytest.mark.parametrize(
    "case",
    [
        ("focal_loss", dict(p=(2, 3, 4), l=(2, 3)), {"p": np.int64}, {}, TypeError, "pred"),
        ("wing_loss", dict(p=(2, 3), l=(2, 3)), {"p": np.int64}, {}, TypeError, "pred"),
        (
            "center_loss",
            dict(p=(3, 2), l=(3,)),
            {"p": np.int64},
            dict(num_class=2),
            TypeError,
            "data",
        ),
        (
            "box_iou",
            dict(p=(2, 4), l=(3, 4)),
            {},
            dict(legacy_box="False"),
            TypeError,
            "legacy_box",
        ),
        ("focal_loss", dict(p=(2, 3, 4), l=(2, 3)), {}, dict(gamma=NAN), ValueError, "gamma"),
    ],
    ids=lambda c: f"{c[0]}-{c[-1]}",
)
def test_bound_symbol_raises_naming_the_op_and_the_argument(case, mode):
    name, shapes, types, params, error, arg = case
    op = getattr(ops, name)
    op = op.numpy if mode == "numpy" else op
    sym = op(mx.sym.var("p"), mx.sym.var("l"), **params)
    with pytest.raises(error, match=rf"customop 'ops\.{name}'.*: {arg} "):
        exe = sym.simple_bind(mx.cpu(), type_dict={"l": np.float32, **types}, **shapes)
        exe.forward()[0].asnumpy()
    assert mx.nd.ones((2,)).sum().asscalar() == 2


@pytest.mark.parametrize("mode", ["mxnet", "numpy"])
@pytest.mark.parametrize("how", ["direct", "function", "custom", "symbol"])
def test_a_wrong_input_names_the_op_the_user_called_not_its_variant(mode, how):
    # smooth_l1(data, sigma) without weight runs the registered variant
    # 'ops.smooth_l1~without_weight'; the user called ops.smooth_l1 (or its .numpy twin).
    op = ops.smooth_l1.numpy if mode == "numpy" else ops.smooth_l1
    called = "ops.smooth_l1" + (".numpy" if mode == "numpy" else "")
    if how == "symbol":
        data, sigma, bad, kind = mx.sym.var("data"), mx.sym.var("sigma"), 3, "int"
        calls = [lambda: op(data, bad), lambda: op(data, sigma, mx.nd.ones((2, 3)))]
    else:
        data, sigma, bad, kind = mx.nd.ones((2, 3)), mx.nd.ones((1,)), "3", "str"
        calls = [lambda: op(data, bad), lambda: op(data, sigma, bad)]
    for call in calls:
        with forced_path(None if how in ("direct", "symbol") else how):
            with pytest.raises(TypeError, match=rf"^customop '{re.escape(called)}': input") as exc:
                with (
                    contextlib.nullcontext()
                    if how in ("direct", "symbol")
                    else mx.autograd.record()
                ):
                    call()
        assert "~" not in str(exc.value) and str(exc.value).count("customop '") == 1
    assert f"is a {kind}" in str(pytest.raises(TypeError, calls[0]).value)
    # the op's own checks (a bad sigma) name the operator, for either twin, where its
    # forward runs in Python (forced_path('function'): what a signature's first call takes)
    with forced_path("function"), pytest.raises(
        ValueError, match=r"^customop 'ops\.smooth_l1': sigma "
    ) as exc:
        op(mx.nd.ones((2, 3)), mx.nd.array([float("nan")])).wait_to_read()
    assert "~" not in str(exc.value)
    if mode == "mxnet":  # from a signature's second call its native graph: NaN
        op(mx.nd.ones((2, 3)), mx.nd.ones((1,))).wait_to_read()
        assert np.isnan(op(mx.nd.ones((2, 3)), mx.nd.array([float("nan")])).asnumpy()).all()


# Issue 25 item 6: the last errors of the bad-input fuzz that named no operator.
CENTERS = [np.array([0, 1, 1], np.float32), np.zeros((2, 2), np.float32)]
LATE = [
    (
        "center-f16-data-f32-centers",
        ops.center_loss,
        [f32(3, 2).astype(np.float16), *CENTERS],
        dict(num_class=2),
        TypeError,
        "centers",
    ),
    (
        "center-f64-data-f32-centers",
        ops.center_loss,
        [f32(3, 2).astype(np.float64), *CENTERS],
        dict(num_class=2),
        TypeError,
        "centers",
    ),
    (
        "center-num_class-0",
        ops.center_loss,
        [f32(3, 2), *CENTERS],
        dict(num_class=0),
        ValueError,
        "num_class",
    ),
    ("tile-absurd-reps", ops.tile, [f32(2, 3)], dict(reps=(10**6, 10**6)), ValueError, "reps"),
    ("tile-reps-past-int32", ops.tile, [f32(2, 3)], dict(reps=(1, 2**31)), ValueError, "reps"),
]


@pytest.mark.parametrize("case", LATE, ids=[c[0] for c in LATE])
@pytest.mark.parametrize("mode", ["mxnet", "numpy"])
@pytest.mark.parametrize("how", ["direct", "function", "custom"])
def test_the_fuzzs_last_unnamed_errors_name_the_op_and_the_argument(case, mode, how):
    _, op, inputs, params, error, arg = case
    op = op.numpy if mode == "numpy" else op
    xs = [mx.nd.array(a, dtype=a.dtype) for a in inputs]
    called = re.escape(op.op_type)  # core checks name the twin called, the op's own its base
    with forced_path(how):
        with pytest.raises(
            error, match=rf"{_pattern(op, arg)}|^customop '{called}': {arg} "
        ) as exc:
            with contextlib.nullcontext() if how == "direct" else mx.autograd.record():
                op(*xs, **params)  # raised by the call itself: before any MXNet work
    _named_once(exc)
    assert mx.nd.ones((2,)).sum().asscalar() == 2


@pytest.mark.parametrize(
    "case",
    [c for c in LATE if c[0].startswith("tile")]
    + [
        (
            "center-num_class-0",
            ops.center_loss,
            [f32(3, 2), CENTERS[0]],
            dict(num_class=0),
            ValueError,
            "num_class",
        )
    ],
    ids=lambda c: c[0],
)
@pytest.mark.parametrize("how", ["simple_bind", "Module"])
def test_and_in_a_bound_symbol(case, how):
    name, op, inputs, params, error, arg = case
    names = [f"in{i}" for i in range(len(inputs))]
    sym = op(*[mx.sym.var(n) for n in names], **params)
    shapes = {n: a.shape for n, a in zip(names, inputs)}
    types = {n: a.dtype for n, a in zip(names, inputs)}
    with pytest.raises(error, match=_pattern(op, arg)):
        if how == "simple_bind":
            sym.simple_bind(mx.cpu(), type_dict=types, **shapes)
        else:
            mod = mx.mod.Module(mx.sym.make_loss(sym), data_names=names, label_names=None)
            mod.bind([mx.io.DataDesc(n, shapes[n], types[n]) for n in names])
            mod.init_params()
    assert mx.nd.ones((2,)).sum().asscalar() == 2
