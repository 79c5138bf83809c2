"""Issue #3 items 1, 2, 3, 5: check_grad through MXNet, native symbols, the command line.

Every gradient below is written from its formula; check_grad is what is under test.
"""

import argparse
import re
import sys
from pathlib import Path

import autograd.numpy as anp
import mxnet as mx
import numpy as np
import pytest

from customop import customop
from customop.check import (
    ARGNUM_SKIP,
    COMPARISONS,
    GRAPH_COMPARISON,
    INTEGER_SKIP,
    NO_GRAD_SKIP,
    TOLERANCES,
    GradReport,
    check_grad,
    main,
)
from tests import fresh

ROOT = Path(__file__).resolve().parents[2]


@customop("numpy")
def scaled_mul(a, b, alpha=0.5):
    return alpha * a * b, a - b


scaled_mul.def_grad(lambda ans, a, b, alpha=0.5: lambda g: alpha * b * g[0] + g[1], 0)
scaled_mul.def_grad(lambda ans, a, b, alpha=0.5: lambda g: alpha * a * g[0] - g[1], 1)


@customop("numpy")
def wrong_tanh(x):
    return np.tanh(x)


wrong_tanh.def_grad(lambda ans, x: lambda g: g * (1 - ans))  # seeded bug: 1 - tanh(x)^2


@customop("numpy", need_top_grad=False)
def half_sq_err(pred, target):
    """Per-row 0.5 * ||pred - target||^2: an output layer, its gradient ignores the head."""
    return 0.5 * np.sum((pred - target) ** 2, axis=1)


half_sq_err.def_grad(lambda ans, pred, target: lambda g: pred - target, 0)
half_sq_err.def_grad(lambda ans, pred, target: lambda g: target - pred, 1)


@customop("numpy")
def row_nll(x, y):
    """Per-row -log softmax(x)[y]; y is an integer label."""
    lse = np.log(np.sum(np.exp(x), axis=1))
    return lse - x[np.arange(len(y)), y]


def _row_nll_grad(ans, x, y):
    def grad(g):
        p = np.exp(x) / np.sum(np.exp(x), axis=1, keepdims=True)
        p[np.arange(len(y)), y] -= 1
        return g[:, None] * p

    return grad


row_nll.def_grad(_row_nll_grad)


@customop("mxnet")
def softplus_nd(x, beta=1.0):
    return mx.nd.log1p(mx.nd.exp(beta * x)) / beta


softplus_nd.def_grad(lambda ans, x, beta=1.0: lambda g: g * mx.nd.sigmoid(beta * x))


@customop("numpy")
def sum_argmax(x, s):
    """sum(x) * s and argmax(x): a 0-d input and an integer output without gradient."""
    return np.sum(x) * s, np.argmax(x)


sum_argmax.def_grad(lambda ans, x, s: lambda g: g[0] * s * np.ones_like(x), 0)
sum_argmax.def_grad(lambda ans, x, s: lambda g: g[0] * np.sum(x), 1)


def normal(*shape, dtype=np.float32):
    return np.random.normal(size=shape).astype(dtype)


# ---- 1. check_grad on customops ----------------------------------------------------------
def test_a_correct_op_passes_with_every_comparison():
    report = check_grad(scaled_mul, normal(3, 4), normal(3, 4), alpha=0.25)
    assert isinstance(report, GradReport) and report.passed
    assert [(r.input, r.comparison) for r in report.rows] == [
        (name, c) for name in ("a", "b") for c in COMPARISONS
    ]
    assert all(r.status == "ok" and r.max_abs_err < 1e-5 for r in report.rows)
    assert report.heads == "3 random draws, seed 0"
    assert str(report).splitlines()[1].split()[:4] == ["input", "shape", "dtype", "comparison"]


def test_a_wrong_gradient_fails_with_the_table():
    with pytest.raises(AssertionError) as info:
        check_grad(wrong_tanh, normal(2, 3))
    msg = str(info.value)
    assert "FAILED" in msg and "max abs err" in msg and "worst index" in msg
    failing = [line for line in msg.splitlines() if line.endswith("FAIL")]
    assert [line.split()[0] for line in failing] == ["x", "x"]
    assert [c for c in COMPARISONS if any(c in line for line in failing)] == [
        "imperative vs numeric",
        "symbolic vs numeric",
    ]
    assert all("(2, 3)  float32" in line for line in failing)


def test_inputs_may_be_ndarrays_and_argnums_names():
    a, b = mx.nd.array(normal(2, 2)), mx.nd.array(normal(2, 2))
    report = check_grad(scaled_mul, a, b, argnums=["b"])
    assert report.row("a").status == ARGNUM_SKIP
    assert report.row("b", "symbolic vs numeric").passed
    with pytest.raises(ValueError, match="0=a, 1=b"):
        check_grad(scaled_mul, a, b, argnums=[2])


def test_no_grad_inputs_are_skipped_unless_asked_for():
    @customop("numpy", name="tests.check_no_grad", no_grad=("w",))
    def weighted(x, w):
        return x * w

    weighted.def_grad(lambda ans, x, w: lambda g: g * w)
    x, w = normal(2, 3), normal(2, 3)
    report = check_grad(weighted, x, w)
    assert report.passed and report.row("w").status == NO_GRAD_SKIP
    assert "declared no_grad" in str(report)
    # Asked for by name, it is checked, and its true gradient (x) is not the zero declared.
    with pytest.raises(AssertionError, match="FAILED"):
        check_grad(weighted, x, w, argnums=["w"])


def test_integer_inputs_are_skipped_and_reported():
    x, y = normal(4, 5), np.random.randint(0, 5, size=4).astype(np.int32)
    report = check_grad(row_nll, x, y)
    assert report.passed
    assert report.row("y").status == INTEGER_SKIP == "skipped: integer input, not differentiable"
    assert report.row("y").skipped and not report.row("x").skipped
    assert "int32" in str(report) and INTEGER_SKIP in str(report)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_default_tolerances_follow_the_input_dtype(dtype):
    report = check_grad(row_nll, normal(3, 4, dtype=dtype), np.array([0, 3, 1]))
    row = report.row("x", "symbolic vs numeric")
    assert row.dtype == np.dtype(dtype).name
    assert row.tolerance == TOLERANCES[np.dtype(dtype)]
    assert (
        check_grad(row_nll, normal(3, 4, dtype=dtype), np.array([0, 3, 1]), rtol=0.5, atol=0.25)
        .row("x")
        .tolerance.rtol
        == 0.5
    )


def test_an_mxnet_mode_op_passes():
    report = check_grad(softplus_nd, normal(3, 4), beta=2.0)
    assert report.passed and [r.comparison for r in report.rows] == [*COMPARISONS, GRAPH_COMPARISON]


def test_scalar_inputs_and_integer_outputs():
    report = check_grad(sum_argmax, normal(4), np.array(1.5, dtype=np.float32))
    assert report.passed and report.row("s").shape == ()
    assert report.row("x", "imperative vs numeric").max_abs_err < 1e-5


# ---- need_top_grad=False: the check_numeric_gradient trap --------------------------------
def test_an_output_layer_passes_where_check_numeric_gradient_cannot():
    pred, target = normal(4, 3), normal(4, 3)
    report = check_grad(half_sq_err, pred, target)
    assert report.passed and report.heads == "ones (output layer)"
    assert {r.input for r in report.rows} == {"pred", "target"}

    # MXNet's checker projects the output on random heads that this layer never sees.
    sym = half_sq_err(mx.sym.var("pred"), mx.sym.var("target"))
    with pytest.raises(AssertionError):
        mx.test_utils.check_numeric_gradient(
            sym,
            {"pred": pred, "target": target},
            grad_nodes=["pred"],
            numeric_eps=1e-3,
            rtol=1e-1,
            atol=1e-1,
        )


def test_output_layer_false_uses_random_heads_and_fails_for_a_loss_layer():
    with pytest.raises(AssertionError, match="3 random draws"):
        check_grad(half_sq_err, normal(4, 3), normal(4, 3), output_layer=False)


# ---- 3. native symbols -------------------------------------------------------------------
def away_from(x, kinks, gap=1e-2):
    """Move entries of x off the points where the function is not differentiable."""
    for k in kinks:
        x = np.where(np.abs(x - k) < gap, x + 2 * gap, x)
    return x.astype(np.float32)


def test_native_smooth_l1_with_a_parameter():
    sigma = 2.0
    x = away_from(normal(3, 4), [1 / sigma**2, -1 / sigma**2])
    report = check_grad(mx.sym.smooth_l1, x, scalar=sigma)
    assert report.passed and report.target == "smooth_l1"
    assert [r.comparison for r in report.rows] == list(COMPARISONS)
    assert report.row("data").input == "data"  # variables take the function's own names


def test_native_softmax_output_is_an_output_layer_with_a_loss():
    n, c = 4, 3
    x, label = normal(n, c), np.random.randint(0, c, size=n).astype(np.float32)

    def nll(outs, inputs):
        # SoftmaxOutput's backward is p - onehot(label) (normalization='null'): the gradient of
        # the summed negative log-likelihood, not of its output (the probabilities).
        return -np.sum(np.log(outs[0][np.arange(n), inputs[1].astype(int)]))

    report = check_grad(mx.sym.SoftmaxOutput, x, label, output_layer=True, argnums=[0], loss=nll)
    assert report.passed and report.row("label").status == ARGNUM_SKIP
    with pytest.raises(AssertionError, match="pass loss="):
        check_grad(mx.sym.SoftmaxOutput, x, label, output_layer=True, argnums=[0])


def test_a_built_symbol_takes_inputs_in_list_arguments_order():
    sym = mx.sym.tanh(mx.sym.var("x")) * mx.sym.var("w")
    assert sym.list_arguments() == ["x", "w"]
    report = check_grad(sym, normal(2, 3), normal(2, 3))
    assert report.passed and [r.input for r in report.rows] == ["x"] * 3 + ["w"] * 3
    with pytest.raises(TypeError, match=r"\['x', 'w'\]"):
        check_grad(sym, normal(2, 3))


def test_a_customop_symbol_is_checked_like_a_native_one():
    # The way to pass an operator parameter whose name check_grad uses itself.
    sym = scaled_mul(mx.sym.var("a"), mx.sym.var("b"), alpha=0.75)
    report = check_grad(sym, normal(2, 2), normal(2, 2))
    assert report.passed and len(report.rows) == 6


# ---- 5. the command line -----------------------------------------------------------------
def run_cli(*args):
    return fresh.run(
        [sys.executable, "-m", "customop.check", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_passes_and_reports_skipped_integer_inputs():
    proc = run_cli(
        "tests.customop.checkme_ops:pick_nll",
        "--shape",
        "x=4,5",
        "--shape",
        "y=4",
        "--dtype",
        "y=int32",
        "--int-high",
        "y=5",
        "--param",
        "scale=0.5",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "pick_nll': passed" in proc.stdout
    assert INTEGER_SKIP in proc.stdout


def test_cli_exits_1_and_prints_the_table_on_failure():
    proc = run_cli("tests.customop.checkme_ops:wrong_square", "--shape", "x=3")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAILED" in proc.stdout and "imperative vs numeric" in proc.stdout


def test_cli_in_process_params_and_symbol_functions(capsys):
    assert (
        main(
            [
                "tests.customop.checkme_ops:leaky",
                "--shape",
                "x=2,3",
                "--param",
                "alpha=0.25",
                "--param",
                "kind=leaky",
            ]
        )
        == 0
    )
    assert "leaky': passed" in capsys.readouterr().out
    assert (
        main(
            [
                "mxnet.symbol:smooth_l1",
                "--shape",
                "data=5",
                "--param",
                "scalar=1.0",
                "--seed",
                "3",
                "--num-heads",
                "1",
            ]
        )
        == 0
    )
    assert "1 random draw, seed 3" in capsys.readouterr().out


def test_cli_usage_errors_exit_2(capsys):
    for argv in (
        ["tests.customop.checkme_ops:leaky", "--shape", "x"],
        ["tests.customop.checkme_ops:leaky", "--shape", "y=3"],
        ["tests.customop.checkme_ops"],
    ):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2
    assert "the inputs are x" in capsys.readouterr().err


# ---- automatic gradients, checked like any other -----------------------------------------
@customop("numpy")
def log_cosh(x, y):
    """Automatic gradient (HIPS autograd): the forward uses autograd.numpy."""
    return anp.sum(anp.log(anp.cosh(x - y)), axis=1)


@customop("mxnet")
def scaled_softsign(x, k=2.0):
    """Automatic gradient (mx.autograd recorded inside the backward)."""
    return k * x / (1 + mx.nd.abs(x))


def test_automatic_gradients_pass_the_checker_from_the_package_root():
    import customop as package

    assert package.check_grad is check_grad
    assert package.check_grad(log_cosh, normal(3, 4), normal(3, 4)).passed
    report = package.check_grad(scaled_softsign, away_from(normal(3, 4), [0.0]), k=0.5)
    assert report.passed and [r.comparison for r in report.rows] == [*COMPARISONS, GRAPH_COMPARISON]


def test_cli_unknown_param_exits_2_with_one_line():
    # The CLI promises exit 2 on a usage error (--help); an operator parameter that does not exist
    # is one: one line naming it, no traceback.
    proc = run_cli("tests.customop.checkme_ops:leaky", "--shape", "x=3", "--param", "nosuch=1")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "nosuch" in lines[0], proc.stderr


def test_cli_help_documents_every_option_and_the_exit_codes():
    from customop.check.cli import _parser

    parser = _parser()
    for action in parser._actions:
        assert action.help and action.help != argparse.SUPPRESS, action.option_strings
    text = parser.format_help()
    assert "exit status:" in text
    for code, meaning in (("0", "passed"), ("1", "failed"), ("2", "usage error")):
        assert re.search(rf"^\s+{code}\s+.*{meaning}", text, re.M), code
    for option in ("--seed", "--num-heads", "--eps", "--rtol", "--atol"):
        assert option in text


def test_cli_leaves_out_optional_inputs_without_a_shape(capsys):
    from customop import ops

    # smooth_l1(data, sigma, weight=None): weight left out; a wrong sigma shape still fails
    assert main(["customop.ops:smooth_l1", "--shape", "data=4", "--shape", "sigma=1"]) == 0
    out = capsys.readouterr().out
    assert "passed" in out and "weight" not in out.split("\n", 1)[1]
    assert (
        main(
            [
                "customop.ops:focal_loss",
                "--shape",
                "pred=2,3,2",
                "--shape",
                "label=2,3",
                "--dtype",
                "label=int32",
                "--int-high",
                "label=3",
                "--wrt",
                "pred",
                "--param",
                "gamma=1",
            ]
        )
        == 0
    )
    assert "passed" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:  # a required input still needs its --shape
        main(["customop.ops:smooth_l1", "--shape", "data=4"])
    assert info.value.code == 2 and "missing: sigma" in capsys.readouterr().err
    assert ops.smooth_l1.signature.optional == ["weight"]


def test_cli_malformed_param_exits_2_with_one_line_naming_the_parameter(capsys):
    proc = run_cli("tests.customop.checkme_ops:leaky", "--shape", "x=3", "--param", "alpha=abc")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.strip().splitlines() if "MKLDNN" not in line]
    assert len(lines) == 1 and "alpha" in lines[0] and "float" in lines[0], proc.stderr
    for param in ("alpha", "=0.5", "alpha=True", "alpha=(1, 2)"):
        with pytest.raises(SystemExit) as info:
            main(["tests.customop.checkme_ops:leaky", "--shape", "x=3", "--param", param])
        assert info.value.code == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "--param" in err, err
    # a bare word is a string where the default is one
    assert (
        main(["tests.customop.checkme_ops:leaky", "--shape", "x=3", "--param", "kind=leaky"]) == 0
    )


def test_cli_ranges_draw_inputs_in_their_domain(capsys):
    # standard-normal boxes are inverted half the time (sqrt of a negative area: NaN);
    # one range per position of the last axis keeps x2 > x1 and y2 > y1
    op = "tests.customop.checkme_ops:sqrt_area"
    assert main([op, "--shape", "boxes=6,4"]) == 1
    capsys.readouterr()
    assert main([op, "--shape", "boxes=6,4", "--range", "boxes=0:1,0:1,2:3,2:3"]) == 0
    assert "sqrt_area': passed" in capsys.readouterr().out
    for bad in ("boxes=0:1,0:1", "boxes=1:0", "boxes=0-1", "other=0:1"):
        with pytest.raises(SystemExit) as info:
            main([op, "--shape", "boxes=6,4", "--range", bad])
        assert info.value.code == 2
    err = capsys.readouterr().err
    assert "--range boxes: 2 ranges" in err and "LOW must be below HIGH" in err
    assert "--range other: no input" in err
