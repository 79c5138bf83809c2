"""``python -m customop.check MODULE:NAME --shape ...``: a gradient check on random inputs.

Exit status: 0 when every comparison passes, 1 when one fails, 2 for a usage
error (one line on stderr).  ``python -m customop.check --help`` lists every option.
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import mxnet as mx
import numpy as np

from .. import errors
from ..operator import CustomOperator
from .gradcheck import check_grad


def _pairs(items: list[str] | None, flag: str, parse: Callable[[str], Any]) -> dict[str, Any]:
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{flag} expects NAME=VALUE, got {item!r}")
        try:
            out[key] = parse(value)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{flag} {item!r}: {exc}") from None
    return out


def _shape(text: str) -> tuple[int, ...]:
    return tuple(int(d) for d in text.split(",") if d.strip())


def _ranges(text: str) -> list[tuple[float, float]]:
    out = []
    for part in text.split(","):
        low, sep, high = part.partition(":")
        if not sep:
            raise ValueError(
                "expected LOW:HIGH (e.g. 0:1), or one LOW:HIGH per position of "
                "the last axis, comma-separated"
            )
        lo, hi = float(low), float(high)
        if not lo < hi:
            raise ValueError(f"LOW must be below HIGH, got {part}")
        out.append((lo, hi))
    return out


def _literal(text: str) -> Any:
    return ast.literal_eval(text) if _is_literal(text) else text


def _load(spec: str) -> Any:
    module, sep, attr = spec.partition(":")
    if not sep or not attr:
        raise ValueError(f"expected MODULE:NAME (e.g. my_ops:focal_loss), got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    return functools.reduce(getattr, attr.split("."), importlib.import_module(module))


EXIT_CODES = """exit status:
  0  every comparison passed (the report is printed)
  1  a comparison failed (the report's table is printed)
  2  usage error: a bad option, a missing or unknown input, a malformed --param
     (one line on stderr, naming what is wrong)"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m customop.check",
        description="Check an operator's gradients on random inputs: the imperative "
        "(mx.autograd) and symbolic (bound executor) gradients against float64 "
        "central differences (see customop.check_grad).",
        epilog=EXIT_CODES + "\n\nexample:\n  python -m customop.check my_ops:my_softmax "
        "--shape x=8,5 --shape y=8 --dtype y=int32 --int-high y=5",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "target",
        help="MODULE:NAME of a customop, an mx.sym.Symbol or a "
        "function building one (e.g. mxnet.symbol:smooth_l1); MODULE is imported "
        "with the current directory on sys.path",
    )
    p.add_argument(
        "--shape",
        action="append",
        metavar="NAME=D1,D2",
        help="shape of an input (empty for a scalar); one flag per input, in order; "
        "an optional input (optional=) without a --shape is left out",
    )
    p.add_argument(
        "--dtype",
        action="append",
        metavar="NAME=DTYPE",
        help="dtype of an input (default float32); integer inputs are not checked",
    )
    p.add_argument(
        "--int-high",
        action="append",
        metavar="NAME=N",
        help="integer inputs are uniform in [0, N) (default 2)",
    )
    p.add_argument(
        "--range",
        action="append",
        metavar="NAME=LOW:HIGH[,LOW:HIGH...]",
        help="a float input uniform in [LOW, HIGH) instead of standard normal "
        "(default); several ranges, comma-separated, one per position of the last "
        "axis: boxes (x1, y1, x2, y2) that are never inverted are "
        "--range boxes=0:1,0:1,2:3,2:3",
    )
    p.add_argument(
        "--param",
        action="append",
        metavar="KEY=VALUE",
        help="operator parameter, a Python literal (0.25, 'a', (1, 2), True); a "
        "bare word is a string, accepted only where the parameter's default is one",
    )
    p.add_argument(
        "--wrt",
        action="append",
        metavar="NAME",
        help="check only these inputs (default: every float input not declared no_grad)",
    )
    p.add_argument(
        "--output-layer",
        action="store_true",
        default=None,
        help="check with ones heads, the gradient of sum(outputs) (default for "
        "need_top_grad=False ops)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        metavar="N",
        help="seed of the random inputs and head gradients (default 0)",
    )
    p.add_argument(
        "--num-heads",
        type=int,
        default=3,
        metavar="N",
        help="random head-gradient draws compared (default 3)",
    )
    p.add_argument(
        "--eps",
        type=float,
        default=None,
        metavar="H",
        help="finite-difference step (default by dtype: float16 1e-3, float32 1e-4, float64 1e-6)",
    )
    p.add_argument(
        "--rtol",
        type=float,
        default=None,
        metavar="R",
        help="relative tolerance (default by dtype: 1e-2, 1e-3, 1e-5)",
    )
    p.add_argument(
        "--atol",
        type=float,
        default=None,
        metavar="A",
        help="absolute tolerance (default by dtype: 1e-2, 1e-5, 1e-8); an error "
        "passes when |got - want| <= atol + rtol * |want|",
    )
    return p


def _check_param_types(op: CustomOperator, raw: dict[str, str], params: dict[str, Any]) -> None:
    # A value of another kind than the parameter's default (alpha=abc, where alpha defaults
    # to 0.25) is a typo on the command line: refused here, in one line, instead of as a
    # traceback from inside the forward.
    for key, value in params.items():
        default = op.signature.defaults.get(key)
        if not _same_kind(value, default):
            what = "" if _is_literal(raw[key]) else " (not a Python literal, so a string)"
            raise ValueError(
                f"--param {key}={raw[key]}: parameter {key!r} of "
                f"{errors.shown(op.op_type)!r} takes a {type(default).__name__} "
                f"(default {default!r}), got {value!r}{what}"
            )


def _same_kind(value: Any, default: Any) -> bool:
    if default is None or isinstance(default, str):
        return True  # no default to go by; strings name choices the op checks itself
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, (int, float)):
        return isinstance(value, (int, float))
    if isinstance(default, (tuple, list)):
        return isinstance(value, (tuple, list))
    return True


def _is_literal(text: str) -> bool:
    try:
        ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False
    return True


def _random_inputs(names, shapes, dtypes, highs, seed, ranges=None) -> list[np.ndarray]:
    rng = np.random.RandomState(seed)
    ranges = ranges or {}
    out = []
    for name in names:
        dtype = np.dtype(dtypes.get(name, "float32"))
        if np.issubdtype(dtype, np.integer):
            out.append(rng.randint(0, highs.get(name, 2), size=shapes[name]).astype(dtype))
        elif name in ranges:
            shape, found = shapes[name], ranges[name]
            if len(found) > 1 and (not shape or shape[-1] != len(found)):
                raise ValueError(
                    f"--range {name}: {len(found)} ranges, one per position of "
                    f"the last axis, but {name}'s shape is {shape}"
                )
            lo = np.array([r[0] for r in found]) if len(found) > 1 else found[0][0]
            hi = np.array([r[1] for r in found]) if len(found) > 1 else found[0][1]
            out.append((lo + (hi - lo) * rng.uniform(size=shape)).astype(dtype))
        else:
            out.append(rng.normal(size=shapes[name]).astype(dtype))
    return out


def _cli_names(obj: Any, shapes: dict[str, Any]) -> list[str]:
    if isinstance(obj, CustomOperator):
        names = list(obj.signature.inputs)
        optional = set(obj.signature.optional)
    elif isinstance(obj, mx.sym.Symbol):
        names, optional = obj.list_arguments(), set()
    else:
        return list(shapes)  # a symbol function: the --shape flags, in order
    missing = [n for n in names if n not in shapes and n not in optional]
    extra = [n for n in shapes if n not in names]
    if missing or extra:
        raise ValueError(
            f"the inputs are {', '.join(names)}; give exactly one --shape each"
            + (f" (missing: {', '.join(missing)})" if missing else "")
            + (f" (unknown: {', '.join(extra)})" if extra else "")
        )
    return [n for n in names if n in shapes]  # optional inputs without a --shape: left out


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: check ``MODULE:NAME`` on random inputs; 0 on pass, 1 on failure.

    Example:
        python -m customop.check tests.customop.checkme_ops:pick_nll \\
            --shape x=4,5 --shape y=4 --dtype y=int32 --int-high y=5
    """
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        obj = _load(args.target)
        shapes = _pairs(args.shape, "--shape", _shape)
        dtypes = _pairs(args.dtype, "--dtype", lambda s: np.dtype(s).name)
        highs = _pairs(args.int_high, "--int-high", int)
        ranges = _pairs(args.range, "--range", _ranges)
        unknown = [n for n in ranges if n not in shapes]
        if unknown:
            raise ValueError(f"--range {unknown[0]}: no input of that name has a --shape")
        raw = _pairs(args.param, "--param", str)
        params = {key: _literal(value) for key, value in raw.items()}
        names = _cli_names(obj, shapes)
        if isinstance(obj, CustomOperator):
            obj.signature.check_params(params)  # an unknown --param is a usage error
            _check_param_types(obj, raw, params)
            obj = obj.variant(names)  # the op registered for the inputs given
    except (ValueError, TypeError, ImportError, AttributeError) as exc:
        # one line, as for argparse's own errors but without the usage block
        print(f"{parser.prog}: error: {str(exc).splitlines()[0]}", file=sys.stderr)
        raise SystemExit(2) from None
    try:
        inputs = _random_inputs(names, shapes, dtypes, highs, args.seed, ranges)
    except ValueError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    argnums = None
    if args.wrt:
        argnums = [names.index(n) if n in names else n for n in args.wrt]
    try:
        report = check_grad(
            obj,
            *inputs,
            argnums=argnums,
            eps=args.eps,
            rtol=args.rtol,
            atol=args.atol,
            output_layer=args.output_layer,
            seed=args.seed,
            num_heads=args.num_heads,
            **params,
        )
    except AssertionError as exc:
        print(exc)
        return 1
    print(report)
    return 0
