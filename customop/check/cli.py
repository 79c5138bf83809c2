"""``python -m customop.check MODULE:NAME --shape ...``: a gradient check on random inputs.

Exit status: 0 when every comparison passes, 1 when one fails, 2 for a usage
error (one line on stderr).
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

from ..operator import CustomOperator
from .grad import check_grad


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


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _load(spec: str) -> Any:
    module, sep, attr = spec.partition(":")
    if not sep or not attr:
        raise ValueError(f"expected MODULE:NAME (e.g. my_ops:focal_loss), got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    return functools.reduce(getattr, attr.split("."), importlib.import_module(module))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m customop.check",
        description="Check an operator's gradients on random inputs (see customop.check).")
    p.add_argument("target", help="MODULE:NAME of a customop, an mx.sym.Symbol or a "
                   "function building one (e.g. mxnet.symbol:smooth_l1)")
    p.add_argument("--shape", action="append", metavar="NAME=D1,D2",
                   help="shape of an input (empty for a scalar); one flag per input, in order")
    p.add_argument("--dtype", action="append", metavar="NAME=DTYPE",
                   help="dtype of an input (default float32)")
    p.add_argument("--int-high", action="append", metavar="NAME=N",
                   help="integer inputs are uniform in [0, N) (default 2)")
    p.add_argument("--param", action="append", metavar="KEY=VALUE",
                   help="operator parameter, a Python literal (else a string)")
    p.add_argument("--wrt", action="append", metavar="NAME", help="check only these inputs")
    p.add_argument("--output-layer", action="store_true", default=None,
                   help="check with ones heads (default for need_top_grad=False ops)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-heads", type=int, default=3)
    for name in ("eps", "rtol", "atol"):
        p.add_argument(f"--{name}", type=float, default=None)
    return p


def _random_inputs(names, shapes, dtypes, highs, seed) -> list[np.ndarray]:
    rng = np.random.RandomState(seed)
    out = []
    for name in names:
        dtype = np.dtype(dtypes.get(name, "float32"))
        if np.issubdtype(dtype, np.integer):
            out.append(rng.randint(0, highs.get(name, 2), size=shapes[name]).astype(dtype))
        else:
            out.append(rng.normal(size=shapes[name]).astype(dtype))
    return out


def _cli_names(obj: Any, shapes: dict[str, Any]) -> list[str]:
    if isinstance(obj, CustomOperator):
        names = list(obj.signature.inputs)
    elif isinstance(obj, mx.sym.Symbol):
        names = obj.list_arguments()
    else:
        return list(shapes)  # a symbol function: the --shape flags, in order
    missing = [n for n in names if n not in shapes]
    extra = [n for n in shapes if n not in names]
    if missing or extra:
        raise ValueError(f"the inputs are {', '.join(names)}; give exactly one --shape each"
                         + (f" (missing: {', '.join(missing)})" if missing else "")
                         + (f" (unknown: {', '.join(extra)})" if extra else ""))
    return names


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
        params = _pairs(args.param, "--param", _literal)
        names = _cli_names(obj, shapes)
        if isinstance(obj, CustomOperator):
            obj.signature.check_params(params)  # an unknown --param is a usage error
    except (ValueError, TypeError, ImportError, AttributeError) as exc:
        # one line, as for argparse's own errors but without the usage block
        print(f"{parser.prog}: error: {str(exc).splitlines()[0]}", file=sys.stderr)
        raise SystemExit(2) from None
    inputs = _random_inputs(names, shapes, dtypes, highs, args.seed)
    argnums = None
    if args.wrt:
        argnums = [names.index(n) if n in names else n for n in args.wrt]
    try:
        report = check_grad(obj, *inputs, argnums=argnums, eps=args.eps, rtol=args.rtol,
                            atol=args.atol, output_layer=args.output_layer, seed=args.seed,
                            num_heads=args.num_heads, **params)
    except AssertionError as exc:
        print(exc)
        return 1
    print(report)
    return 0


