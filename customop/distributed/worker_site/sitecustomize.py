"""Run at start-up by every worker of ``python -m customop.distributed.launch`` (and only there).

The launcher puts this folder first on the workers' ``PYTHONPATH``.  A ``dist_*``
worker that raises otherwise dies with SIGABRT or hangs while MXNet's kvstore
threads shut down, and the job never ends: here an uncaught exception prints its
traceback and leaves through ``os._exit(1)``.  A ``sitecustomize`` further down
the path still runs.
"""
import importlib
import os
import sys

if os.environ.get("DMLC_ROLE") == "worker":
    from customop.distributed.launch import exit_on_error

    exit_on_error()

_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
del sys.modules[__name__]
try:
    importlib.import_module("sitecustomize")
except ImportError:
    pass
