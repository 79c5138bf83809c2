"""The port file: one op's graphs for one shape family, as JSON data, read and written.

A port file is JSON only (no pickle, no code, no import named by the file): what
:func:`customop.save_port` traced (the op's type, its inputs' names, the example's shapes
and dtypes, the sizes that may change, the fixed parameters) and its two graphs, forward
and training.  :class:`Record` is that content in memory; the live ports
(:func:`customop.to_torch` with MXNet at hand) build the same records.  This module
imports neither MXNet nor the rest of customop (but :mod:`customop.families`, which
imports nothing): ``load_port`` runs where neither is installed, with NumPy 2.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from ..families import serves
from .runner import PortError, port_error

FORMAT = "customop-port"
VERSION = 1
FLOATS = ("float16", "float32", "float64")
DTYPES = FLOATS + ("int8", "uint8", "int32", "int64", "bool")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass
class Record:
    """One op's graphs at one signature (and its shape family)."""

    op_type: str
    inputs: list[str]  # the inputs the graphs take, in order (absent optional ones left out)
    shapes: list[tuple]
    dtypes: list[str]
    n_out: int
    grads: list[int]  # inputs that get a gradient (floating, not no_grad)
    forward: dict[str, Any]
    train: dict[str, Any]
    generic: tuple = ()
    params: dict[str, Any] = field(default_factory=dict)
    absent: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "op_type": self.op_type,
            "inputs": self.inputs,
            "absent": self.absent,
            "shapes": [list(s) for s in self.shapes],
            "dtypes": self.dtypes,
            "generic": list(self.generic),
            "params": self.params,
            "n_out": self.n_out,
            "grads": self.grads,
            "forward": self.forward,
            "train": self.train,
        }

    @classmethod
    def from_json(cls, data: Any, where: str) -> Record:
        bad = _invalid(data)
        if bad:
            raise PortError(f"customop.load_port: {where} is not a customop port file: {bad}")
        return cls(
            op_type=data["op_type"],
            inputs=list(data["inputs"]),
            shapes=[tuple(int(d) for d in s) for s in data["shapes"]],
            dtypes=list(data["dtypes"]),
            n_out=int(data["n_out"]),
            grads=[int(i) for i in data["grads"]],
            forward=data["forward"],
            train=data["train"],
            generic=tuple(int(d) for d in data["generic"]),
            params=dict(data.get("params") or {}),
            absent=list(data.get("absent") or []),
        )

    def describe(self) -> str:
        return ", ".join(
            f"{n} {tuple(s)} {d}" for n, s, d in zip(self.inputs, self.shapes, self.dtypes)
        )

    def check(self, shapes: list[tuple], dtypes: list[str]) -> None:
        """Raises naming the op and the expected shapes unless ``shapes`` are of the family."""
        if len(shapes) != len(self.shapes):
            raise port_error(
                self.op_type,
                (
                    f"takes {len(self.inputs)} input(s) ({', '.join(self.inputs)}), got "
                    f"{len(shapes)}"
                ),
                TypeError,
            )
        for name, want, got in zip(self.inputs, self.dtypes, dtypes):
            if want != got:
                raise port_error(
                    self.op_type,
                    (f"input {name!r} must be {want} (the saved example's dtype), got {got}"),
                    TypeError,
                )
        if not serves(self.shapes, self.generic, shapes):
            sizes = ", ".join(str(d) for d in self.generic if d >= 2) or "none"
            raise port_error(
                self.op_type,
                (
                    f"input shapes {', '.join(str(tuple(s)) for s in shapes)} are outside the "
                    f"saved shape family: {self.describe()}, where only the sizes {sizes} may "
                    f"take another value (each the same on every axis that had it); save a "
                    f"port from an example of these shapes"
                ),
                ValueError,
            )


def _invalid(data: Any) -> str:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return "no 'format': 'customop-port' field"
    if data.get("version") != VERSION:
        return f"version {data.get('version')!r}, this customop reads version {VERSION}"
    for key, kind in (
        ("op_type", str),
        ("inputs", list),
        ("shapes", list),
        ("dtypes", list),
        ("n_out", int),
        ("grads", list),
        ("forward", dict),
        ("train", dict),
        ("generic", list),
    ):
        if not isinstance(data.get(key), kind):
            return f"field {key!r} missing or not a {kind.__name__}"
    if not all(isinstance(n, str) and _NAME.match(n) for n in data["inputs"]):
        return "an input name that is not an identifier"
    if not all(d in DTYPES for d in data["dtypes"]):
        return f"a dtype outside {DTYPES}"
    for key in ("forward", "train"):
        g = data[key]
        if not isinstance(g.get("nodes"), list) or not isinstance(g.get("heads"), list):
            return f"graph {key!r} without nodes and heads"
        for k, node in enumerate(g["nodes"]):
            if not isinstance(node, dict) or not isinstance(node.get("op"), str):
                return f"graph {key!r} node {k} is not an operator node"
            for r in node.get("inputs", []):
                if not _ref_ok(r, k, len(data["inputs"])):
                    return f"graph {key!r} node {k} has an input reference {r!r} out of order"
        if not all(_ref_ok(h, len(g["nodes"]), len(data["inputs"])) for h in g["heads"]):
            return f"graph {key!r} has a head out of range"
    return ""


def _ref_ok(r: Any, k: int, n_in: int) -> bool:
    if not isinstance(r, list) or not r:
        return False
    if r[0] == "in":
        return len(r) == 2 and isinstance(r[1], int) and 0 <= r[1] < n_in
    return (
        r[0] == "node"
        and len(r) == 3
        and isinstance(r[1], int)
        and 0 <= r[1] < k
        and isinstance(r[2], int)
        and r[2] >= 0
    )


def write(record: Record, path: Any) -> None:
    with open(os.fspath(path), "w", encoding="utf-8") as f:
        json.dump(record.to_json(), f, separators=(",", ":"))


def read(path: Any) -> Record:
    where = repr(os.fspath(path))
    with open(os.fspath(path), encoding="utf-8") as f:
        try:
            data = json.load(f)
        except ValueError as exc:
            raise PortError(
                f"customop.load_port: {where} is not JSON ({exc}); a port "
                f"file is written by customop.save_port"
            ) from None
    return Record.from_json(data, where)
