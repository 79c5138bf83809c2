import math

import numpy as np
import pytest

from customop import params


@pytest.mark.parametrize(
    "value",
    [
        0.25,
        1e-300,
        1 / 3,
        -2.5,
        3,
        -7,
        0,
        True,
        False,
        None,
        "valid",
        "",
        'it\'s "quoted"',
        "None",
        "1.5",
        "ünïcode",
        (1, 2),
        (1,),
        (),
        [1, 2],
        [],
        {"a": 1, "b": (2.0, None)},
        ((1, 2), [3, "x"]),
        float("inf"),
        -float("inf"),
        (float("inf"), -1.0),
    ],
)
def test_round_trip_keeps_value_and_type(value):
    decoded = params.decode(params.encode(value))
    assert decoded == value
    assert type(decoded) is type(value)
    if isinstance(value, (tuple, list)):
        assert [type(v) for v in decoded] == [type(v) for v in value]


def test_nan_round_trips():
    assert math.isnan(params.decode(params.encode(float("nan"))))


def test_numpy_scalars_become_python_literals():
    assert params.normalize(np.float32(0.5), "op", "alpha") == 0.5
    assert type(params.normalize(np.int64(3), "op", "k")) is int
    assert type(params.normalize(np.bool_(True), "op", "flag")) is bool


def test_unquoted_string_from_a_direct_mx_nd_custom_call_is_kept():
    # mx.nd.Custom(..., mode='valid') sends str('valid') == 'valid'
    assert params.decode("valid") == "valid"
    assert params.decode("0.25") == 0.25


def test_mxnet_dunder_attributes_are_dropped():
    assert params.decode_attrs({"alpha": "0.5", "__ctx_group__": "dev1"}) == {"alpha": 0.5}


@pytest.mark.parametrize("bad", [np.ones(3), object(), {1, 2}, lambda: 0])
def test_non_literal_parameter_names_op_and_key(bad):
    with pytest.raises(TypeError, match=r"customop 'my\.op'.*parameter 'alpha'"):
        params.normalize(bad, "my.op", "alpha")
