"""customop: MinPy-style custom operators for Apache MXNet 1.9.

``@customop('numpy'|'mxnet')`` turns a forward function into a registered
MXNet CustomOp; ``op.def_grad(fn, argnum)`` attaches gradients;
``check_grad(op, *inputs)`` checks them against finite differences;
``imports``/``load_checkpoint`` reload saved graphs, importing their ops first.
"""
try:
    import mxnet as _mxnet  # noqa: F401
except ModuleNotFoundError as _exc:
    if _exc.name != "mxnet":
        raise
    raise ModuleNotFoundError(
        "customop needs MXNet 1.9.1, which is not installed. Install customop with one "
        "extra: pip install 'customop[cpu]' (mxnet==1.9.1) or 'customop[cu112]' "
        "(mxnet-cu112==1.9.1, CUDA 11.2), never both.", name="mxnet") from None

import os as _os
from typing import Any

from . import auxstate as _auxstate
from . import errors as _errors
from . import forking as _forking
from . import loading as _loading
from .loading import imports, load_checkpoint
from .operator import CustomOperator, customop

_errors.install()
_forking.install()
_auxstate.install()
_loading._record_hand_registrations()
if _os.environ.get("CUSTOMOP_LAUNCH_JOB") and _os.environ.get("DMLC_ROLE") == "worker":
    from .launch import exit_on_error as _exit_on_error

    _exit_on_error()  # a worker of ``python -m customop.launch`` that raises exits 1, not hangs

__all__ = ["customop", "CustomOperator", "check_grad", "imports", "load_checkpoint"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # Imported on first use so that ``python -m customop.check`` does not find its own
    # module already loaded (runpy warns about that).
    if name == "check_grad":
        from .check import check_grad

        return check_grad
    raise AttributeError(f"module 'customop' has no attribute {name!r}")
