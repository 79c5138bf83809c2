"""Running a port's graph: MXNet operator nodes evaluated through one framework's rule table.

A graph here is the JSON form of :class:`customop.graphs.graph_json.NativeGraph`: ``nodes``
in topological order (``{"op", "attrs", "inputs"}``, each input ``["in", i]`` or
``["node", k, output]``) and ``heads``.  :func:`compile_graph` turns it into a Python
function of the framework's arrays: one call of a rule per node, looked up once.  The
rules are the only framework code; this module imports neither MXNet nor torch nor jax.

Two MXNet operators carry the training graph's meaning and are the runner's own:
``BlockGrad`` (the framework's stop-gradient, a rule like the others) and ``make_loss``,
whose value passes through and whose gradient ignores the head gradient: the runner
hands its values back as losses, which the caller differentiates with a cotangent of ones
(MXNet's ``make_loss`` backward, ``grad_scale`` 1).
"""
from __future__ import annotations

import ast
import importlib
from collections.abc import Callable, Sequence
from typing import Any


class PortError(Exception):
    """A port that cannot be built or called: the message names the op and why."""


def port_error(op_type: str, msg: str, cls: type = PortError) -> Exception:
    """An error in the house's shape: ``customop 'ops.x' (port): ...``."""
    return cls(f"customop {op_type!r} (port): {msg}")


FRAMEWORKS = ("torch", "torchvision", "jax", "jaxlib")  # what the `port` extra installs


def framework_module(name: str, caller: str) -> Any:
    """``customop.port.<name>`` (a module importing torch or jax), or an ImportError that
    names ``caller`` and the extra to install, where the framework is missing."""
    try:
        return importlib.import_module(f"{__package__}.{name}")
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in FRAMEWORKS:
            raise
        raise ImportError(f"{caller} needs {exc.name}, which is not installed: pip install "
                          "'customop[port]' (torch, torchvision and jax)",
                          name=exc.name) from None


class Attrs:
    """An MXNet node's attributes (strings, as graph JSON keeps them), read by type."""

    __slots__ = ("raw", "_parsed")

    def __init__(self, raw: dict[str, str]):
        self.raw = raw
        self._parsed: dict[str, Any] = {}  # parsed once: rules read them on every call

    def __contains__(self, name: str) -> bool:
        return name in self.raw

    def value(self, name: str, default: Any = None) -> Any:
        if name not in self.raw:
            return default
        if name in self._parsed:
            return self._parsed[name]
        text = str(self.raw[name])
        if text in ("None", "none"):
            found = None
        else:
            try:  # literals only (numbers, tuples, booleans): never code
                found = ast.literal_eval(text) if len(text) < 4096 else text
            except (ValueError, SyntaxError):
                found = text
        self._parsed[name] = found
        return found

    def int(self, name: str, default: Any = None) -> Any:
        v = self.value(name, default)
        return None if v is None else int(v)

    def float(self, name: str, default: Any = None) -> Any:
        v = self.value(name, default)
        return None if v is None else float(v)

    def bool(self, name: str, default: bool = False) -> bool:
        v = self.value(name, default)
        return v.lower() in ("true", "1") if isinstance(v, str) else bool(v)

    def str(self, name: str, default: Any = None) -> Any:
        return str(self.raw[name]) if name in self.raw else default

    def shape(self, name: str, default: Any = ()) -> tuple:
        v = self.value(name, default)
        if v is None:
            return ()
        return tuple(v) if isinstance(v, (tuple, list)) else (v,)

    def axes(self, name: str = "axis") -> Any:
        """``axis`` as None (all axes), an int or a tuple of ints."""
        v = self.value(name, None)
        if v is None or v == ():
            return None
        return tuple(v) if isinstance(v, (tuple, list)) else int(v)


Rule = Callable[..., Any]


def mx_reshape(shape: Sequence[int], spec: Sequence[int], reverse: bool = False) -> tuple:
    """The target shape of MXNet's ``Reshape`` with its special codes 0, -1, -2, -3, -4."""
    src, spec = list(shape), list(spec)
    if reverse:
        src, spec = src[::-1], spec[::-1]
    out: list[int] = []
    i = j = 0
    infer = -1
    while j < len(spec):
        s = spec[j]
        if s == 0:
            out.append(src[i])
            i += 1
        elif s == -1:
            infer = len(out)
            out.append(-1)
            i += 1
        elif s == -2:
            out.extend(src[i:])
            i = len(src)
        elif s == -3:
            out.append(src[i] * src[i + 1])
            i += 2
        elif s == -4:
            a, b = spec[j + 1], spec[j + 2]
            d = src[i]
            if a == -1:
                a = d // b
            if b == -1:
                b = d // a
            out.extend([a, b])
            i += 1
            j += 2
        else:
            out.append(s)
            i += 1
        j += 1
    if reverse:
        out = out[::-1]
        if infer >= 0:
            infer = len(out) - 1 - infer
    if infer >= 0:
        total = 1
        for d in shape:
            total *= d
        known = 1
        for k, d in enumerate(out):
            if k != infer:
                known *= d
        out[infer] = total // known if known else 0
    return tuple(out)


def compile_graph(graph: dict[str, Any], rules: dict[str, Rule], op_type: str
                  ) -> Callable[[Sequence[Any]], tuple[list[Any], list[Any]]]:
    """``run(inputs) -> (heads, losses)`` for ``graph`` with ``rules`` (MXNet op -> rule).

    An operator without a rule is a :class:`PortError` naming it and the op, raised here,
    before anything runs.
    """
    steps = []
    for k, node in enumerate(graph["nodes"]):
        name = node["op"]
        refs = [tuple(r) for r in node["inputs"]]
        if name == "make_loss":
            steps.append((None, Attrs({}), refs))
            continue
        rule = rules.get(name)
        if rule is None:
            raise port_error(op_type, (
                f"MXNet operator {name!r} (node {k} of its graph) has no translation in "
                f"this framework's rule table; the op cannot be ported there"))
        steps.append((rule, Attrs(dict(node.get("attrs") or {})), refs))
    heads = [tuple(h) for h in graph["heads"]]

    def run(inputs: Sequence[Any]) -> tuple[list[Any], list[Any]]:
        values: list[Any] = []
        losses: list[Any] = []

        def get(r: tuple) -> Any:
            if r[0] == "in":
                return inputs[r[1]]
            v = values[r[1]]
            return v[r[2]] if isinstance(v, (tuple, list)) else v

        for rule, attrs, refs in steps:
            args = [get(r) for r in refs]
            if rule is None:
                losses.append(args[0])
                values.append(args[0])
            else:
                values.append(rule(attrs, *args))
        return [get(h) for h in heads], losses

    return run
