"""customop: MinPy-style custom operators for Apache MXNet 1.9.

``@customop('numpy'|'mxnet')`` turns a forward function into a registered
MXNet CustomOp; ``op.def_grad(fn, argnum)`` attaches gradients (``return residuals(out, p=p)``
hands the forward's intermediate values to them);
``check_grad(op, *inputs)`` checks them against finite differences;
``imports``/``load_checkpoint`` reload saved graphs, importing their ops first.
``'mxnet'``-mode ops run as MXNet's own operators in hybridized and bound graphs
when their forward traces to one (``explain(op, ...)`` says whether, and why not);
``export(block, path, *inputs)`` writes a model plain MXNet loads, ``to_onnx`` converts it.

Importing this package changes nothing in MXNet or Python; what an operator
needs from MXNet is installed when it is first used (see :mod:`customop.runtime`).
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

from typing import Any

from .explain import explain
from .export import NotInlinedError, export, to_onnx
from .loading import imports, load_checkpoint
from .operator import CustomOperator, customop
from .saved import residuals
from .trace import is_tracing

__all__ = ["customop", "CustomOperator", "residuals", "check_grad", "imports",
           "load_checkpoint", "explain", "is_tracing", "export", "to_onnx",
           "NotInlinedError"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # Imported on first use so that ``python -m customop.check`` does not find its own
    # module already loaded (runpy warns about that).
    if name == "check_grad":
        from .check import check_grad

        return check_grad
    raise AttributeError(f"module 'customop' has no attribute {name!r}")
