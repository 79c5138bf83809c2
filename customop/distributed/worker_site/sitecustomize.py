"""Run at start-up by every worker of ``python -m customop.distributed.launch`` (and only there).

The launcher puts this folder first on the workers' ``PYTHONPATH``.  A ``dist_*``
worker that raises otherwise dies with SIGABRT or hangs while MXNet's kvstore
threads shut down, and the job never ends: here an uncaught exception prints its
traceback and leaves through ``os._exit(1)``.  A ``sitecustomize`` further down
the path still runs.
"""

import importlib.machinery
import importlib.util
import os
import sys

if os.environ.get("DMLC_ROLE") == "worker":
    from customop.distributed.launch import exit_on_error

    exit_on_error()

_here = os.path.dirname(os.path.abspath(__file__))
_rest = [p for p in sys.path if os.path.abspath(p or ".") != _here]
_next = importlib.machinery.PathFinder.find_spec("sitecustomize", _rest)
if _next is not None and _next.loader is not None:
    _next.loader.exec_module(importlib.util.module_from_spec(_next))
