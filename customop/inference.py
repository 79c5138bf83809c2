"""Output shapes and dtypes, found by running the forward once per input signature.

A signature is (parameters, input shapes, input dtypes).  Real calls record
theirs for free; MXNet's shape and type passes (symbols, Module, hybridized
blocks) run the forward on placeholder inputs (ones, integer zeros) once and
reuse the answer.  ``infer_shape=``/``infer_type=`` on the decorator replace
this for forwards that cannot run on placeholders.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Tuple  # noqa: UP035 - Tuple: see Shape

import mxnet as mx
import numpy as np

from . import budget, errors, kernel, opinfo, value_checks
from .modes import BFLOAT16
from .runtime import randomness
from .side_thread import SideThread

Shape = Tuple[int, ...]  # noqa: UP006 - evaluated at run time on Python 3.8
INFERRED = 512  # an entry of the tables below (its key and metadata: measured 1 KiB of Python
# objects a signature for both tables, tracemalloc over 1,000 shapes)
_infer_thread = SideThread("customop-infer")  # forwards on placeholders run there


@contextlib.contextmanager
def _generators_kept() -> Iterator[None]:
    # A forward run on placeholders must not move the process's random streams (measured: a
    # simple_bind on a new shape moved a seeded NumPy stream, and a seeded sampler then gave
    # other numbers than an imperative run), nor roll back another thread's draws (putting
    # the streams back did: a loader thread's draws repeated).  Its np.random.* and random.*
    # calls draw from generators of its own (the ``randomness`` patch); with no other Python
    # thread, the global streams are also put back (for names bound before, such as
    # ``from numpy.random import normal``).  MXNet's generators need nothing: they are per
    # thread (measured), and 'mxnet'-mode placeholder runs have their own.
    np_state, py_state = np.random.get_state(), random.getstate()
    try:
        with randomness.placeholder_draws():
            yield
    finally:
        if threading.active_count() == 1:
            np.random.set_state(np_state)
            random.setstate(py_state)


@dataclass(frozen=True)
class OutputMeta:
    """What MXNet must know about one output: legacy shape, dtype, and 0-d-ness."""

    shape: Shape
    dtype: np.dtype
    scalar: bool

    @classmethod
    def of(cls, shape: Shape, dtype: Any) -> OutputMeta:
        shape = tuple(int(d) for d in shape)
        # Legacy MXNet shapes: () means "unknown", so a 0-d result is declared (1,).
        return cls(shape or (1,), np.dtype(dtype), shape == ())


def known(shape: Shape | None) -> bool:
    return bool(shape) and all(d > 0 for d in shape)


class Inference:
    """Per-operator caches of output metadata."""

    def __init__(self, op: opinfo.Inferred):
        self.op = op
        # per signature, so under the memory budget of customop.budget (an evicted
        # entry is found again by the same placeholder run)
        self.by_signature = budget.Table()
        self.by_shapes = budget.Table()
        # infer_shape='s answer by (parameters' key, input shapes), each output's legacy shape
        # and 0-d-ness: the type pass asks again at the shapes the shape pass just asked, with
        # dtypes (infer_shape= reads no dtype)
        self.user_shapes = budget.Table()

    def record(
        self,
        pkey: str,
        shapes: tuple[Shape, ...],
        dtypes: tuple[np.dtype, ...],
        metas: tuple[OutputMeta, ...],
    ) -> None:
        self.by_signature.keep((pkey, shapes, dtypes), metas, INFERRED)
        if (pkey, shapes) not in self.by_shapes:
            self.by_shapes.keep((pkey, shapes), metas, INFERRED)

    def outputs(
        self,
        pkey: str,
        params: dict[str, Any],
        shapes: tuple[Shape, ...],
        dtypes: tuple[np.dtype, ...] | None,
    ) -> tuple[OutputMeta, ...]:
        """Output metadata for inputs of these shapes (and dtypes, when known)."""
        found = (
            self.by_signature.recall((pkey, shapes, dtypes))
            if dtypes is not None
            else self.by_shapes.recall((pkey, shapes))
        )
        if found is not None:
            return found
        op = self.op
        if op.user_infer_shape is not None:
            metas = self._from_user(params, shapes, dtypes, pkey)
        elif dtypes is not None:
            metas = self._run(params, shapes, dtypes)
        else:
            metas = self._guess_dtypes(params, shapes, pkey)
            dtypes = None
        if dtypes is not None:
            self.record(pkey, shapes, dtypes, metas)
        else:
            self.by_shapes.keep((pkey, shapes), metas, INFERRED)
        return metas

    def _run(self, params, shapes, dtypes, seed=None) -> tuple[OutputMeta, ...]:
        if self.op.mode == "mxnet":
            # MXNet asks for shapes from inside an imperative call; NDArray ops issued on
            # that thread (while it records) corrupt its state, so run them on our own thread.
            return _infer_thread.run(self._run_here, params, shapes, dtypes, seed)
        return self._run_here(params, shapes, dtypes, seed)

    def _run_here(self, params, shapes, dtypes, seed=None) -> tuple[OutputMeta, ...]:
        mode = self.op.mode_impl
        # a bfloat16 input is computed on as float32, and the float32 outputs stored back as
        # bfloat16 (modes.widened)
        bf16 = BFLOAT16 in dtypes
        run_dtypes = tuple(np.dtype(np.float32) if d == BFLOAT16 else d for d in dtypes)
        if seed is None:
            args = [mode.placeholder(s, d) for s, d in zip(shapes, run_dtypes)]
        else:  # other values than the placeholders' (see _guess_dtypes)
            rng = np.random.RandomState(seed)
            args = [
                mode.from_numpy(
                    (
                        rng.randint(0, 1000, s)
                        if np.issubdtype(d, np.integer)
                        else rng.uniform(-100, 100, s)
                    ).astype(d)
                )
                for s, d in zip(shapes, run_dtypes)
            ]
        if self.op.signature.aux:  # scratch states: whatever the forward writes is dropped
            aux_dtype = kernel.aux_dtype_for(run_dtypes)
            args += [
                mode.placeholder(s, aux_dtype)
                for s in kernel.aux_shapes(self.op, list(shapes), params)
            ]
        # value checks (customop.require) are about values, not shapes: placeholders may
        # fail them, so they are collected and dropped here
        with np.errstate(
            all="ignore"
        ), mx.autograd.pause(), _generators_kept(), value_checks.collecting(lenient=True):
            outs = kernel.run_forward(
                self.op, args, params, where="shape inference on placeholder inputs"
            )
        metas = [
            OutputMeta.of(
                mode.shape(o), BFLOAT16 if bf16 and mode.dtype(o) == np.float32 else mode.dtype(o)
            )
            for o in outs
        ]
        if self.op.user_infer_type is not None:
            out_dtypes = self.dtypes_only(params, dtypes)
            metas = [
                OutputMeta.of(() if m.scalar else m.shape, d) for m, d in zip(metas, out_dtypes)
            ]
        return tuple(metas)

    def _guesses(self, n: int) -> Iterator[tuple[np.dtype, ...]]:
        # MXNet's shape pass does not tell dtypes: float32, then int32 for each subset of
        # inputs (labels), smallest subsets first (at most two).
        for k in range(min(n, 2) + 1):
            for ints in itertools.combinations(range(n), k):
                yield tuple(np.dtype(np.int32 if i in ints else np.float32) for i in range(n))

    def _guess_dtypes(self, params, shapes, pkey=None) -> tuple[OutputMeta, ...]:
        first_error = None
        for dtypes in self._guesses(len(shapes)):
            try:
                metas = self._run(params, shapes, dtypes)
            except Exception as exc:  # noqa: BLE001 - any failure means "try the next guess"
                first_error = first_error or exc
                continue
            if pkey is not None:  # the run these dtypes would make: MXNet's type pass, which
                # follows its shape pass with the graph's dtypes (most often these), reads it
                self.by_signature.keep((pkey, shapes, dtypes), metas, INFERRED)
            return metas
        if not errors.is_own_check(first_error, self.op.op_type) and not (
            _users_raise(first_error) and not self._passes_elsewhere(params, shapes)
        ):
            # (the message names the op already: once is enough; the forward's own code
            # raising whatever the values is its check of the inputs: they are wrong, not
            # the inference)
            errors.add_context(
                first_error,
                (
                    "Its forward ran on placeholder inputs (ones; integer zeros) to infer output "
                    "shapes; if it cannot, pass infer_shape= (and infer_type=) to @customop"
                ),
            )
        raise first_error

    def _passes_elsewhere(self, params, shapes) -> bool:
        """Whether the forward runs on random values of these shapes (then what it raised
        on the placeholders was about their values: infer_shape= helps)."""
        for dtypes in self._guesses(len(shapes)):
            try:
                self._run(params, shapes, dtypes, seed=0)
                return True
            except Exception:  # noqa: BLE001 - raised again: try the next guess
                continue
        return False

    def _from_user(self, params, shapes, dtypes, pkey=None) -> tuple[OutputMeta, ...]:
        op = self.op
        n = op.outputs.of(params)
        known_shapes = self.user_shapes.recall((pkey, shapes)) if pkey is not None else None
        if known_shapes is not None:  # (infer_shape= answered these shapes: it reads no dtype)
            float32 = tuple(np.dtype(np.float32) for _ in shapes)
            out_dtypes = self.dtypes_only(params, dtypes or float32)
            return tuple(
                OutputMeta(shape, np.dtype(d), scalar)
                for (shape, scalar), d in zip(known_shapes, out_dtypes)
            )
        out_shapes = op.user_infer_shape(*[tuple(s) for s in shapes], **params)
        if (
            n == 1
            or isinstance(out_shapes, tuple)
            and all(isinstance(d, (int, np.integer)) for d in out_shapes)
        ):
            out_shapes = [out_shapes]
        out_shapes = list(out_shapes)
        out_dtypes = self.dtypes_only(params, dtypes or tuple(np.dtype(np.float32) for _ in shapes))
        if len(out_shapes) != n:
            raise op.error(
                ValueError, f"infer_shape returned {len(out_shapes)} shapes for {n} output(s)"
            )
        metas = tuple(OutputMeta.of(s, d) for s, d in zip(out_shapes, out_dtypes))
        if pkey is not None:
            answer = tuple((m.shape, m.scalar) for m in metas)
            self.user_shapes.keep((pkey, shapes), answer, INFERRED)
        return metas

    def dtypes_only(self, params, dtypes: tuple[np.dtype, ...]) -> list[np.dtype]:
        """Output dtypes when shapes are unknown: infer_type=, else the first float input's."""
        op = self.op
        if op.user_infer_type is not None:
            out = op.user_infer_type(*dtypes, **params)
            out = list(out) if isinstance(out, (list, tuple)) else [out]
            return [np.dtype(d) for d in out]
        floats = [d for d in dtypes if kernel.floating(d)]
        return [floats[0] if floats else np.dtype(np.float32)] * op.outputs.of(params)


_LIBRARIES = tuple(
    os.path.dirname(os.path.abspath(m.__file__)) + os.sep for m in (mx, np, errors)
)  # mxnet/, numpy/, customop/


def _users_raise(exc: BaseException) -> bool:
    """Whether ``exc`` was raised by the user's own code (its innermost frame outside MXNet,
    NumPy and this package), not by an operator that failed on the placeholders."""
    tb = exc.__traceback__
    if tb is None or isinstance(exc, mx.base.MXNetError):
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    where = os.path.abspath(tb.tb_frame.f_code.co_filename)
    return not where.startswith(_LIBRARIES) and "<frozen" not in where
