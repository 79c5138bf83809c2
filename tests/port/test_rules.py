"""The rule tables: each MXNet operator's translation against MXNet itself on random inputs.

One sample per entry of :data:`customop.port.torch_rules.RULES` (the jax table has the
same entries): the operator called by MXNet (``mx.nd``) with the sample's attributes,
against the rule on the same values, in torch and in jax.
"""

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="the port tests need torch (pip install 'customop[port]')"
)
jax = pytest.importorskip("jax", reason="the port tests need jax (pip install 'customop[port]')")

import mxnet as mx  # noqa: E402

from customop.port import jax_rules, torch_rules  # noqa: E402
from customop.port.runner import Attrs  # noqa: E402

r = np.random.RandomState(0)


def f(*shape, lo=-2.0, hi=2.0):
    return lambda: r.uniform(lo, hi, shape).astype(np.float32)


def idx(n, *shape):
    return lambda: r.randint(0, n, shape).astype(np.float32)


def box(*shape):
    def make():
        lo = r.uniform(0, 10, shape + (2,))
        return np.concatenate([lo, lo + r.uniform(1, 5, shape + (2,))], -1).astype("f")

    return make


def nms_data():
    ids = r.randint(0, 3, (2, 10, 1)).astype("f")
    return np.concatenate([ids, r.rand(2, 10, 1).astype("f"), box(2, 10)()], -1)


POS = f(3, 4, lo=0.1, hi=3.0)
UNIT = f(3, 4, lo=-0.9, hi=0.9)
X = f(3, 4)
# op -> list of (attrs, input makers); attrs as MXNet's graph JSON keeps them (strings)
SAMPLES = {
    "BlockGrad": [({}, [X])],
    "stop_gradient": [({}, [X])],
    "_copy": [({}, [X])],
    "identity": [({}, [X])],
    "Cast": [({"dtype": "int32"}, [f(3, 4, lo=-5, hi=5)]), ({"dtype": "float16"}, [X])],
    "cast": [({"dtype": "float32"}, [X])],
    "Activation": [
        ({"act_type": k}, [X]) for k in ("sigmoid", "relu", "tanh", "softrelu", "softsign")
    ],
    "log": [({}, [POS])],
    "sqrt": [({}, [POS])],
    "rsqrt": [({}, [POS])],
    "reciprocal": [({}, [POS])],
    "smooth_l1": [({"scalar": "1.5"}, [X]), ({"scalar": "0.5"}, [X])],
    "_power_scalar": [({"scalar": "1.5"}, [POS])],
    "_rpower_scalar": [({"scalar": "2.0"}, [X])],
    "broadcast_power": [({}, [POS, f(1, 4)])],
    "add_n": [({"num_args": "3"}, [X, X, X])],
    "ElementWiseSum": [({"num_args": "2"}, [X, X])],
    "sum": [
        ({}, [X]),
        ({"axis": "1", "keepdims": "True"}, [X]),
        ({"axis": "(0,)", "exclude": "True"}, [X]),
    ],
    "mean": [({"axis": "0"}, [X])],
    "prod": [({"axis": "1"}, [X])],
    "max": [({}, [X]), ({"axis": "-1", "keepdims": "True"}, [X])],
    "min": [({"axis": "(0, 1)"}, [X])],
    "argmax": [({"axis": "1"}, [X])],
    "argmin": [({"axis": "0", "keepdims": "True"}, [X])],
    "Reshape": [
        ({"shape": "(0, -1)"}, [f(2, 3, 4)]),
        ({"shape": "(-3, 0)"}, [f(2, 3, 4)]),
        ({"shape": "(-1, 0)", "reverse": "True"}, [f(2, 3, 4)]),
        ({"shape": "(-4, 1, -1, -2)"}, [f(2, 3, 4)]),
        ({"shape": "(1, 1, 12)"}, [X]),
    ],
    "reshape": [({"shape": "(-2,)"}, [X])],
    "reshape_like": [({}, [f(2, 6), X])],
    "broadcast_like": [
        ({}, [f(1, 4), X]),
        ({"lhs_axes": "(0,)", "rhs_axes": "(0,)"}, [f(1, 4), X]),
    ],
    "broadcast_to": [({"shape": "(3, 0)"}, [f(1, 4)])],
    "broadcast_axis": [({"axis": "(0,)", "size": "(3,)"}, [f(1, 4)])],
    "expand_dims": [({"axis": "1"}, [X]), ({"axis": "-1"}, [X])],
    "squeeze": [({"axis": "(1,)"}, [f(3, 1, 4)])],
    "transpose": [({"axes": "(1, 0, 2)"}, [f(2, 3, 4)]), ({}, [X])],
    "SwapAxis": [({"dim1": "0", "dim2": "1"}, [X])],
    "swapaxes": [({"dim1": "1", "dim2": "0"}, [X])],
    "slice_axis": [
        ({"axis": "1", "begin": "1", "end": "None"}, [X]),
        ({"axis": "-1", "begin": "0", "end": "-1"}, [X]),
    ],
    "slice": [({"begin": "(0, 1)", "end": "(2, 3)"}, [X])],
    "SliceChannel": [
        ({"axis": "-1", "num_outputs": "2"}, [X]),
        ({"axis": "1", "num_outputs": "4", "squeeze_axis": "True"}, [X]),
    ],
    "split": [({"axis": "0", "num_outputs": "3"}, [X])],
    "Concat": [({"dim": "-1", "num_args": "2"}, [X, X])],
    "concat": [({"dim": "0", "num_args": "2"}, [X, X])],
    "stack": [({"axis": "1", "num_args": "2"}, [X, X])],
    "tile": [({"reps": "(2, 1, 3)"}, [X])],
    "shape_array": [({}, [X])],
    "size_array": [({}, [X])],
    "_full": [({"shape": "(2, 3)", "value": "1.5", "dtype": "float32"}, [])],
    "_zeros": [({"shape": "(2, 3)", "dtype": "float32"}, [])],
    "_ones": [({"shape": "(2,)", "dtype": "float32"}, [])],
    "_arange": [
        ({"start": "6.0", "stop": "-1.0", "step": "-1.0", "dtype": "int32", "repeat": "1"}, []),
        ({"start": "5.0", "dtype": "float32"}, []),
    ],
    "_contrib_arange_like": [
        ({}, [X]),
        ({"axis": "1"}, [X]),
        ({"axis": "0", "start": "2", "step": "0.5"}, [X]),
    ],
    "one_hot": [
        ({"depth": "4", "dtype": "float32"}, [idx(5, 6)]),
        (
            {"depth": "3", "on_value": "0.25", "off_value": "0.75", "dtype": "float32"},
            [f(2, 3, lo=-1, hi=4)],
        ),
    ],
    "take": [({}, [X, f(5, lo=-1, hi=4)]), ({"axis": "1", "mode": "wrap"}, [X, idx(6, 2, 2)])],
    "pick": [({"axis": "1"}, [X, idx(4, 3)]), ({"axis": "0", "keepdims": "True"}, [X, idx(3, 4)])],
    "gather_nd": [
        (
            {},
            [
                f(3, 4, 5),
                lambda: np.stack([r.randint(0, 3, (2, 6)), r.randint(0, 4, (2, 6))]).astype("f"),
            ],
        ),
        ({}, [X, lambda: r.randint(0, 3, (1, 5)).astype("f")]),
    ],
    "where": [({}, [idx(2, 3, 4), X, X]), ({}, [idx(2, 3), X, X])],
    "clip": [({"a_min": "-1", "a_max": "0.5"}, [X])],
    "softmax": [({"axis": "-1"}, [X]), ({"axis": "0", "temperature": "2.0"}, [X])],
    "log_softmax": [({"axis": "1"}, [X])],
    "topk": [
        ({"k": "2", "ret_typ": "value"}, [X]),
        ({"k": "2", "axis": "0", "ret_typ": "indices", "is_ascend": "True"}, [X]),
        ({"k": "3", "ret_typ": "mask"}, [X]),
        ({"k": "2", "ret_typ": "both", "dtype": "int64"}, [X]),
    ],
    "sort": [({"axis": "-1"}, [X]), ({"axis": "0", "is_ascend": "False"}, [X])],
    "argsort": [({"axis": "1"}, [X]), ({"is_ascend": "False", "dtype": "int32"}, [X])],
    "dot": [({}, [X, f(4, 2)]), ({"transpose_b": "True"}, [X, f(2, 4)])],
    "batch_dot": [
        ({}, [f(2, 3, 4), f(2, 4, 5)]),
        ({"transpose_a": "True"}, [f(2, 4, 3), f(2, 4, 5)]),
    ],
    "_np_cumsum": [({"axis": "1"}, [X])],
    "cumsum": [({"axis": "0"}, [X])],
    "_contrib_box_iou": [
        ({"format": "corner"}, [box(2, 5), box(2, 4)]),
        ({"format": "center"}, [box(5), box(4)]),
    ],
    "_contrib_box_encode": [
        (
            {},
            [
                lambda: r.choice([-1.0, 0.0, 1.0], (2, 6)).astype("f"),
                idx(3, 2, 6),
                box(2, 6),
                box(2, 3),
                lambda: np.zeros(4, "f"),
                lambda: np.full(4, 0.2, "f"),
            ],
        )
    ],
    "_contrib_box_nms": [
        ({"overlap_thresh": "0.3"}, [nms_data]),
        (
            {
                "overlap_thresh": "0.5",
                "id_index": "0",
                "topk": "4",
                "valid_thresh": "0.2",
                "force_suppress": "False",
            },
            [nms_data],
        ),
        ({"in_format": "corner", "out_format": "center"}, [nms_data]),
    ],
}
SAMPLES["_contrib_box_non_maximum_suppression"] = SAMPLES["_contrib_box_nms"]
for name in torch_rules.RULES:
    if name in SAMPLES:
        continue
    if name.endswith("_scalar"):
        SAMPLES[name] = [({"scalar": "0.5"}, [X]), ({"scalar": "-1.5"}, [X])]
    elif name.startswith(("broadcast_", "elemwise_", "_")) and name not in SAMPLES:
        shape2 = f(1, 4) if name.startswith("broadcast_") else X
        SAMPLES[name] = [({}, [X, shape2])]
    else:
        SAMPLES[name] = [({}, [X])]


def _mx_fn(name):
    if name == "_np_cumsum":
        return lambda x, axis=None: mx.nd.np.cumsum(
            x.as_np_ndarray(), axis=int(axis)
        ).as_nd_ndarray()
    return (
        getattr(mx.nd, name, None)
        or getattr(mx.nd._internal, name, None)
        or getattr(mx.nd.contrib, name.replace("_contrib_", ""), None)
    )


ENTRIES = [(name, k) for name in sorted(torch_rules.RULES) for k in range(len(SAMPLES[name]))]


def test_both_tables_translate_the_same_operators():
    assert set(torch_rules.RULES) == set(jax_rules.RULES)


@pytest.mark.parametrize("name,k", ENTRIES, ids=[f"{n}-{k}" for n, k in ENTRIES])
def test_rule_equals_mxnet(name, k):
    attrs, makers = SAMPLES[name][k]
    values = [m() for m in makers]
    out = _mx_fn(name)(*[mx.nd.array(v, dtype=v.dtype) for v in values], **attrs)
    want = [o.asnumpy() for o in (out if isinstance(out, (list, tuple)) else [out])]
    got_t = torch_rules.RULES[name](Attrs(attrs), *[torch.tensor(v) for v in values])
    got_j = jax_rules.RULES[name](Attrs(attrs), *[jax.numpy.asarray(v) for v in values])
    for fw, got in (("torch", got_t), ("jax", got_j)):
        got = list(got) if isinstance(got, (list, tuple)) else [got]
        assert len(got) == len(want), fw
        for g, w in zip(got, want):
            g = g.numpy() if fw == "torch" else np.asarray(g)
            assert g.shape == w.shape, (fw, g.shape, w.shape)
            np.testing.assert_allclose(
                g.astype(np.float64), w.astype(np.float64), rtol=2e-5, atol=2e-5, err_msg=fw
            )


def test_torch_softrelu_value_and_gradient_tiny_values_and_zero_included():
    """torch's softrelu is log1p written with log (see torch_rules._softrelu): its values,
    tiny ones relative to themselves, against float64 log(1 + exp(x)); values and gradient
    against MXNet's Activation (whose values below about -15 are 0 or off, by up to 8e-6)."""
    x = np.concatenate([np.linspace(-80, 30, 1 << 16), [0.0, -1e-8, 1e-8, 20.0, 20.5]]).astype("f")
    xm = mx.nd.array(x)
    xm.attach_grad()
    with mx.autograd.record():
        y = mx.nd.Activation(xm, act_type="softrelu")
    y.backward()
    xt = torch.tensor(x, requires_grad=True)
    yt = torch_rules.RULES["Activation"](Attrs({"act_type": "softrelu"}), xt)
    yt.sum().backward()
    np.testing.assert_allclose(
        yt.detach().numpy(), np.logaddexp(0, x.astype(np.float64)), rtol=3e-7, atol=0
    )
    np.testing.assert_allclose(yt.detach().numpy(), y.asnumpy(), rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(xt.grad.numpy(), xm.grad.asnumpy(), rtol=1e-6, atol=1e-7)
    assert xt.grad[x == 0].tolist() == [0.5]
