"""Which arguments of a forward function are array inputs and which are parameters.

Positional parameters without a default are the operator's array inputs (in
order); parameters with a default and keyword-only parameters are operator
parameters, which must be Python literals.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from . import params as _params


class Signature:
    """The split of a forward function's parameters into inputs and parameters."""

    def __init__(self, fn: Callable, op: str):
        self.op = op
        sig = inspect.signature(fn)
        self.inputs: list[str] = []
        self.defaults: dict[str, Any] = {}
        self.required: list[str] = []
        for p in sig.parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise TypeError(
                    f"customop {op!r}: *{p.name} / **{p.name} are not supported; name every "
                    "array input and every parameter explicitly."
                )
            if p.kind == p.KEYWORD_ONLY:
                (self.required.append(p.name) if p.default is p.empty
                 else self.defaults.__setitem__(p.name, p.default))
            elif p.default is p.empty:
                self.inputs.append(p.name)
            else:
                self.defaults[p.name] = p.default
        if not self.inputs:
            raise TypeError(f"customop {op!r}: the forward function needs at least one array "
                            "input (a positional parameter without a default).")
        clash = (set(self.defaults) | set(self.required)) & _params.RESERVED
        if clash:
            raise TypeError(f"customop {op!r}: parameter name(s) {sorted(clash)} are reserved "
                            "by mx.nd.Custom / mx.sym.Custom; rename them.")

    @property
    def param_names(self) -> list[str]:
        return [*self.required, *self.defaults]

    def bind(self, args: tuple, kwargs: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        """Split a call into (inputs in order, normalized parameters)."""
        n = len(self.inputs)
        if len(args) > n:
            extra = self.param_names[: len(args) - n]
            hint = (f"; pass parameter(s) {', '.join(map(repr, extra))} by keyword"
                    if extra else "")
            raise TypeError(f"customop {self.op!r} takes {n} array input(s) "
                            f"({', '.join(self.inputs)}) but {len(args)} were given{hint}.")
        inputs = list(args)
        params: dict[str, Any] = {}
        for key, value in kwargs.items():
            if key in self.inputs:
                idx = self.inputs.index(key)
                if idx < len(args):
                    raise TypeError(f"customop {self.op!r} got input {key!r} twice.")
                continue
            if key not in self.defaults and key not in self.required:
                known = ", ".join(self.param_names) or "none"
                raise TypeError(f"customop {self.op!r} got an unknown keyword {key!r} "
                                f"(inputs: {', '.join(self.inputs)}; parameters: {known}).")
            params[key] = _params.normalize(value, self.op, key)
        for name in self.inputs[len(args):]:
            if name not in kwargs:
                raise TypeError(f"customop {self.op!r} is missing array input {name!r} "
                                f"(inputs: {', '.join(self.inputs)}).")
            inputs.append(kwargs[name])
        self.check_params(params)
        return inputs, params

    def check_params(self, params: dict[str, Any]) -> None:
        """Raise if a parameter is unknown or a required one is missing."""
        for key in params:
            if key not in self.defaults and key not in self.required:
                known = ", ".join(self.param_names) or "none"
                raise TypeError(f"customop {self.op!r} got an unknown parameter {key!r} "
                                f"(parameters: {known}).")
        missing = [k for k in self.required if k not in params]
        if missing:
            raise TypeError(f"customop {self.op!r} is missing required parameter(s) "
                            f"{', '.join(map(repr, missing))}.")
