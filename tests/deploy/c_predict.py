"""Run exported models with MXNet's C predict API, from a C program with no Python in it.

:func:`build` compiles ``predict.c`` (next to this file) with ``gcc`` against the installed
MXNet wheel's ``include/mxnet/c_predict_api.h`` and ``libmxnet.so``; :func:`run` runs the
program on one model in a subprocess (with a timeout) and reads its outputs back.  Only
NumPy is needed here: the wheel is found without importing MXNet, so the plain-MXNet venv
of the deploy nox session can use this module too.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path

import numpy as np

SOURCE = Path(__file__).resolve().parent / "predict.c"
TIMEOUT_S = 120


def mxnet_dir() -> Path:
    """The installed ``mxnet`` package's folder (it holds ``libmxnet.so`` and ``include/``)."""
    spec = importlib.util.find_spec("mxnet")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("mxnet is not installed in this environment")
    return Path(list(spec.submodule_search_locations)[0])


def compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "gcc"))


def build(workdir: str | Path, source: str | Path = SOURCE) -> Path:
    """Compile ``source`` against the wheel's C predict API; return the program's path."""
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler (gcc) on PATH: the C predict API test needs one")
    mx_dir = mxnet_dir()
    exe = Path(workdir) / Path(source).stem
    subprocess.run(
        [
            cc,
            "-std=c99",
            "-Wall",
            "-Werror",
            str(source),
            f"-I{mx_dir / 'include'}",
            f"-L{mx_dir}",
            "-lmxnet",
            f"-Wl,-rpath,{mx_dir}",
            "-o",
            str(exe),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    return exe


class PredictError(RuntimeError):
    """The C program failed; the message is MXNet's (``MXGetLastError``)."""


def run(
    exe: str | Path, symbol_file: str, params_file: str, inputs: dict[str, np.ndarray]
) -> list[np.ndarray]:
    """The model's outputs, computed by the C program on ``inputs`` (fed as float32)."""
    with tempfile.TemporaryDirectory(prefix="customop-c-predict-") as work:
        args = [str(exe), symbol_file, params_file, work]
        for i, (name, value) in enumerate(inputs.items()):
            value = np.ascontiguousarray(value, dtype=np.float32)
            path = os.path.join(work, f"input_{i}.bin")
            value.tofile(path)
            args += [name, str(value.ndim), *map(str, value.shape), path]
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        done = subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
        if done.returncode != 0:
            raise PredictError(done.stderr.strip() or f"exit code {done.returncode}")
        outputs = []
        for i in range(len(os.listdir(work))):
            path = os.path.join(work, f"output_{i}.bin")
            if not os.path.exists(path):
                break
            raw = Path(path).read_bytes()
            _, ndim = struct.unpack_from("<iI", raw)
            shape = struct.unpack_from(f"<{ndim}I", raw, 8)
            outputs.append(np.frombuffer(raw, np.float32, offset=8 + 4 * ndim).reshape(shape))
        return outputs
