"""customop: MinPy-style custom operators for Apache MXNet 1.9.

``@customop('numpy'|'mxnet')`` turns a forward function into a registered
MXNet CustomOp; ``op.def_grad(fn, argnum)`` attaches gradients.
"""
from . import errors as _errors
from .operator import CustomOperator, customop

_errors.install()

__all__ = ["customop", "CustomOperator"]
__version__ = "0.1.0"
