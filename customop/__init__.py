"""customop: MinPy-style custom operators for Apache MXNet 1.9.

``@customop('numpy'|'mxnet')`` turns a forward function into a registered
MXNet CustomOp; ``op.def_grad(fn, argnum)`` attaches gradients (``return residuals(out, p=p)``
hands the forward's intermediate values to them);
``check_grad(op, *inputs)`` checks them against finite differences;
``imports``/``load_checkpoint`` reload saved graphs, registering their ops from code the
caller chose (``modules=``; a model file never chooses what is imported).
``'mxnet'``-mode ops run as MXNet's own operators in hybridized and bound graphs
when their forward traces to one (``explain(op, ...)`` says whether, and why not);
``export(block, path, *inputs)`` writes a model plain MXNet loads, ``to_onnx`` converts it;
``require(cond, arg, message)`` checks input values: an exception where the forward runs
in Python, NaN outputs in a native graph.
``to_torch(op)`` and ``to_jax(op)`` run an op's native graphs, its own gradient included, as
a PyTorch custom op or a JAX ``custom_vjp`` function; ``save_port`` writes them to a file
that ``load_port`` runs where MXNet is not installed (``customop.port``).

Importing this package changes nothing in MXNet or Python, and imports MXNet only when a
public name is first used; what an operator needs from MXNet is installed when it is first
used (see :mod:`customop.runtime`).
"""

import importlib as _importlib
import importlib.util as _util
import time as _time
from typing import TYPE_CHECKING, Any

# When this process imported customop: a source file changed after it may differ from the
# code that runs, so customop.graphs.code_hash names no source then (no verdict files).
_imported_ns = _time.time_ns()


def _mxnet_missing() -> bool:
    try:
        return _util.find_spec("mxnet") is None
    except ModuleNotFoundError:  # a finder that refuses mxnet
        return True
    except ValueError:  # mxnet imported, with no spec
        return False


_NO_MXNET = (
    "customop needs MXNet 1.9.1, which is not installed. Install customop with one "
    "extra: pip install 'customop[cpu]' (mxnet==1.9.1) or 'customop[cu112]' "
    "(mxnet-cu112==1.9.1, CUDA 11.2), never both. (Without MXNet only saved ports load: "
    "customop.load_port, from customop.port.)"
)
# Without MXNet the package imports, and offers only what reads saved ports (customop.port
# imports neither MXNet nor the rest of customop); every other name raises naming the extras.
_WITHOUT_MXNET = {"load_port", "port", "PortError"}

if TYPE_CHECKING:
    from .budget import cache_budget
    from .check import check_grad
    from .deploy.export import NotInlinedError, export, to_onnx
    from .deploy.trusted_imports import UntrustedModuleError, imports, load_checkpoint
    from .graphs.explain import explain
    from .graphs.trace import is_tracing
    from .intermediates import residuals
    from .operator import CustomOperator, customop
    from .port import PortError, load_port, save_port, to_jax, to_torch
    from .value_checks import require

__all__ = [
    "customop",
    "CustomOperator",
    "residuals",
    "check_grad",
    "imports",
    "load_checkpoint",
    "explain",
    "is_tracing",
    "export",
    "to_onnx",
    "NotInlinedError",
    "require",
    "UntrustedModuleError",
    "cache_budget",
    "to_torch",
    "to_jax",
    "save_port",
    "load_port",
    "PortError",
]
__version__ = "0.1.0"

# Each public name comes from its module on first use: `import customop` alone imports
# neither MXNet nor the rest of the package, so that `python -m customop.distributed.launch`
# (which runs no operator) starts without MXNet's import (about 3 s of CPU a process), and
# `python -m customop.check` does not find its own module already loaded (runpy warns).
_HOME = {
    "customop": "operator",
    "CustomOperator": "operator",
    "residuals": "intermediates",
    "check_grad": "check",
    "imports": "deploy.trusted_imports",
    "load_checkpoint": "deploy.trusted_imports",
    "explain": "graphs.explain",
    "is_tracing": "graphs.trace",
    "export": "deploy.export",
    "to_onnx": "deploy.export",
    "NotInlinedError": "deploy.export",
    "require": "value_checks",
    "UntrustedModuleError": "deploy.trusted_imports",
    "cache_budget": "budget",
    "to_torch": "port",
    "to_jax": "port",
    "save_port": "port",
    "load_port": "port",
    "PortError": "port",
}


def __getattr__(name: str) -> Any:
    if name not in _WITHOUT_MXNET and not name.startswith("__") and _mxnet_missing():
        raise ModuleNotFoundError(_NO_MXNET, name="mxnet")
    if name in _HOME:
        value = getattr(_importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    elif not name.startswith("__") and _util.find_spec(f"{__name__}.{name}") is not None:
        value = _importlib.import_module(f"{__name__}.{name}")  # customop.dispatch, ...
    else:
        raise AttributeError(f"module 'customop' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted(set(globals()) | set(__all__))
