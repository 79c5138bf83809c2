"""Which arguments of a forward function are array inputs, auxiliary states and parameters.

Positional parameters without a default are arrays, in order: the operator's
inputs, then the auxiliary states named in ``aux=`` (state the operator owns
and updates, never differentiated).  Parameters with a default and
keyword-only parameters are operator parameters, which must be Python literals.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from . import params as _params


class Signature:
    """The split of a forward function's parameters into inputs, aux states and parameters."""

    def __init__(
        self, fn: Callable, op: str, aux: tuple[str, ...] = (), optional: tuple[str, ...] = ()
    ):
        self.op = op
        self.optional: list[str] = []
        sig = inspect.signature(fn)
        arrays: list[str] = []
        self.defaults: dict[str, Any] = {}
        self.required: list[str] = []
        for p in sig.parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise TypeError(
                    f"customop {op!r}: *{p.name} / **{p.name} are not supported; name every "
                    "array input and every parameter explicitly."
                )
            if p.kind == p.KEYWORD_ONLY:
                (
                    self.required.append(p.name)
                    if p.default is p.empty
                    else self.defaults.__setitem__(p.name, p.default)
                )
            elif p.default is p.empty:
                arrays.append(p.name)
            elif p.name in optional:
                if p.default is not None:
                    raise TypeError(
                        f"customop {op!r}: optional input {p.name!r} must default "
                        f"to None (got {p.default!r})."
                    )
                arrays.append(p.name)
                self.optional.append(p.name)
            else:
                self.defaults[p.name] = p.default
        not_optional = [o for o in optional if o not in self.optional]
        if not_optional:
            raise TypeError(
                f"customop {op!r}: optional= names {', '.join(map(repr, not_optional))}"
                ", which must be positional parameters of the forward defaulting to "
                "None (e.g. def f(pred, label, weight=None, *, alpha=1.0))."
            )
        if optional and aux:
            raise TypeError(
                f"customop {op!r}: an operator cannot have both optional inputs and "
                "auxiliary states."
            )
        unknown = [a for a in aux if a not in arrays]
        if unknown:
            raise TypeError(
                f"customop {op!r}: aux= names {', '.join(map(repr, unknown))}, which "
                f"{'is' if len(unknown) == 1 else 'are'} not a positional array parameter of the "
                f"forward (its array parameters: {', '.join(arrays) or 'none'}); list the "
                "auxiliary states as positional parameters after the inputs."
            )
        n_in = len(arrays) - len(aux)
        if tuple(arrays[n_in:]) != tuple(aux) and aux:
            raise TypeError(
                f"customop {op!r}: auxiliary states {', '.join(map(repr, aux))} must be the last "
                f"positional parameters of the forward, in that order (got {', '.join(arrays)})."
            )
        self.inputs: list[str] = arrays[:n_in]
        self.aux: list[str] = arrays[n_in:]
        clash = (set(self.defaults) | set(self.required)) & _params.RESERVED
        if clash:
            raise TypeError(
                f"customop {op!r}: parameter name(s) {sorted(clash)} are reserved "
                "by mx.nd.Custom / mx.sym.Custom; rename them."
            )

    @property
    def arrays(self) -> list[str]:
        """Every array parameter of the forward: inputs, then auxiliary states."""
        return [*self.inputs, *self.aux]

    @property
    def param_names(self) -> list[str]:
        return [*self.required, *self.defaults]

    def describe(self) -> str:
        if not self.aux:
            return ", ".join(self.inputs) or "no inputs"
        text = f"inputs: {', '.join(self.inputs) or 'none'}"
        if self.aux:
            text += f"; auxiliary states: {', '.join(self.aux)}"
        return text

    def bind(self, args: tuple, kwargs: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        """Split a call into (arrays in order, normalized parameters).

        The arrays are the inputs followed by whichever auxiliary states were
        passed (a Symbol call may leave them out; the caller decides).
        """
        names = self.arrays
        n = len(names)
        if len(args) > n:
            extra = self.param_names[: len(args) - n]
            hint = f"; pass parameter(s) {', '.join(map(repr, extra))} by keyword" if extra else ""
            what = (
                f"{n} array input(s) ({', '.join(names)})"
                if not self.aux
                else f"{n} array argument(s) ({self.describe()})"
            )
            raise TypeError(f"customop {self.op!r} takes {what} but {len(args)} were given{hint}.")
        arrays = list(args)
        params: dict[str, Any] = {}
        for key, value in kwargs.items():
            if key in names:
                if names.index(key) < len(args):
                    raise TypeError(f"customop {self.op!r} got input {key!r} twice.")
                continue
            if key not in self.defaults and key not in self.required:
                known = ", ".join(self.param_names) or "none"
                raise TypeError(
                    f"customop {self.op!r} got an unknown keyword {key!r} "
                    f"({self.describe()}; parameters: {known})."
                )
            params[key] = _params.normalize(value, self.op, key)
        for name in self.inputs[len(args) :]:
            if name in self.optional and name not in kwargs:
                arrays.append(None)
                continue
            if name not in kwargs:
                raise TypeError(
                    f"customop {self.op!r} is missing array input {name!r} ({self.describe()})."
                )
            arrays.append(kwargs[name])
        given = [
            name
            for i, name in enumerate(self.aux, len(self.inputs))
            if i < len(args) or name in kwargs
        ]
        if given and len(given) < len(self.aux):
            missing = [a for a in self.aux if a not in given]
            raise TypeError(
                f"customop {self.op!r} is missing auxiliary state(s) "
                f"{', '.join(map(repr, missing))} ({self.describe()}); pass every "
                "auxiliary state, or none with Symbols (MXNet then creates them)."
            )
        arrays += [kwargs[name] for name in given[len(arrays) - len(self.inputs) :]]
        self.check_params(params)
        return arrays, params

    def check_params(self, params: dict[str, Any]) -> None:
        """Raise if a parameter is unknown or a required one is missing."""
        for key in params:
            if key not in self.defaults and key not in self.required:
                known = ", ".join(self.param_names) or "none"
                raise TypeError(
                    f"customop {self.op!r} got an unknown parameter {key!r} (parameters: {known})."
                )
        missing = [k for k in self.required if k not in params]
        if missing:
            raise TypeError(
                f"customop {self.op!r} is missing required parameter(s) "
                f"{', '.join(map(repr, missing))}."
            )

    def check_helper(
        self, fn: Callable, what: str, heads: list[str], residuals: bool = False
    ) -> None:
        """Raise ``TypeError`` now unless ``fn`` (an ``infer_shape``, an aux shape function, a
        gradient maker...) takes the arguments ``heads`` positionally and every operator
        parameter by name or through ``**params``, as calls will pass them.

        Without this check a helper that forgot a parameter fails only when a call first
        passes that parameter (MXNet passes only the parameters a call sets), far from the
        mistake: ``ws() got an unexpected keyword argument 'scale'``.  ``residuals``: other
        keywords reach it too (a gradient maker's residuals), so more may be required.
        """
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):
            return  # a builtin or C callable: nothing to read
        ps = list(sig.parameters.values())
        title = f"{what} {_name_of(fn)}()"
        var_kw = any(p.kind == p.VAR_KEYWORD for p in ps)
        by_name = {p.name for p in ps if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        names = self.param_names
        head = ", ".join(heads)
        defaults = [*self.required, *(f"{k}={v!r}" for k, v in self.defaults.items())]
        for name in names:
            if not var_kw and name not in by_name:
                raise TypeError(
                    f"customop {self.op!r}: {title} does not take the operator's parameter "
                    f"{name!r}, which calls pass to it by keyword (parameters: "
                    f"{', '.join(names)}); name every parameter or end its signature with "
                    f"**params: def {_plain(fn)}({head}{', ' if head else ''}*, "
                    f"{', '.join(defaults)}) or def {_plain(fn)}({head}"
                    f"{', ' if head else ''}**params)"
                )
        # Every parameter set, and only the required ones (a call that sets none of the
        # others passes none of them; a gradient maker gets the defaults it names).
        calls = [names] if residuals else [names, self.required]
        for given in calls:
            try:
                bind = sig.bind_partial if residuals else sig.bind
                bind(*[None] * len(heads), **{n: None for n in given})
            except TypeError as exc:
                raise TypeError(
                    f"customop {self.op!r}: {title} cannot be called as calls call it, with "
                    f"({head}) positionally and the parameters a call sets "
                    f"({', '.join(given) or 'none'}) by keyword: {exc}; give the parameters "
                    f"the operator's defaults (def {_plain(fn)}({head}{', ' if head else ''}*, "
                    f"{', '.join(defaults)})) or take **params"
                ) from None


def _name_of(fn: Callable) -> str:
    return getattr(fn, "__name__", None) or repr(fn)


def _plain(fn: Callable) -> str:
    name = getattr(fn, "__name__", "fn")
    return name if name.isidentifier() else "fn"
