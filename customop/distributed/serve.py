"""A ``dist_*`` job's scheduler and servers from ``libmxnet``, MXNet's Python package only
when a server needs it.

MXNet starts a scheduler or server as a side effect of ``import mxnet`` with ``DMLC_ROLE``
set (``mxnet/kvstore/kvstore_server.py`` creates a ``'dist'`` kvstore and runs it at the
end of the import).  The import builds MXNet's Python operator functions first: 3.2-3.8 s
of CPU on these machines, against 0.2 s to load the library and make the same C calls
(``MXKVStoreCreate``, ``MXKVStoreRunServer``).  A scheduler only relays ps-lite's messages;
a server aggregates pushes in C++ and calls back into Python only for an optimizer that a
worker sends it (``update_on_kvstore=True``).  So here a server imports ``mxnet`` at that
command, then hands it to MXNet's own ``KVStoreServer`` controller, which unpickles the
optimizer and runs it as MXNet's server would.  ``customop.distributed.launch`` runs this
file for both roles.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import sys
from typing import Any, Callable

__all__ = ["main"]

_NAME = "customop.distributed.serve"
_CONTROLLER = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)


def library_path() -> str:
    """The ``libmxnet`` that ``import mxnet`` would load (``mxnet/libinfo.py``'s search)."""
    spec = importlib.util.find_spec("mxnet")  # finds the package without running it
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            f"{_NAME}: MXNet is not installed; install customop[cpu] or customop[gpu]"
        )
    where = os.path.join(list(spec.submodule_search_locations)[0], "libinfo.py")
    info_spec = importlib.util.spec_from_file_location("_customop_mxnet_libinfo", where)
    libinfo = importlib.util.module_from_spec(info_spec)
    info_spec.loader.exec_module(libinfo)
    return libinfo.find_lib_path()[0]


class _Controller:
    """A server's command handler: MXNet's, from the first command on (mxnet imported then)."""

    def __init__(self, handle: ctypes.c_void_p):
        self.handle = handle
        self.mxnets: Callable[[int, bytes, Any], None] | None = None

    def __call__(self, head: int, body: bytes, _: Any) -> None:
        if self.mxnets is None:
            role = os.environ["DMLC_ROLE"]
            # the import would start another server at its end unless this is a worker
            os.environ["DMLC_ROLE"] = "worker"
            try:
                import mxnet
            finally:
                os.environ["DMLC_ROLE"] = role
            store = mxnet.kvstore.KVStore(self.handle)  # frees the handle at exit, as MXNet's
            self.mxnets = mxnet.kvstore.KVStoreServer(store)._controller()
        self.mxnets(head, body, None)


def main() -> int:
    """Run the scheduler or server that ``DMLC_*`` describes; return when the job ends."""
    role = os.environ.get("DMLC_ROLE")
    if role not in ("scheduler", "server"):
        print(
            f"{_NAME}: runs a dist job's scheduler or server and needs DMLC_ROLE=scheduler "
            f"or server (got {role!r}); start jobs with python -m "
            "customop.distributed.launch",
            file=sys.stderr,
        )
        return 2
    lib = ctypes.CDLL(library_path(), ctypes.RTLD_LOCAL)  # the handle import mxnet gets too
    lib.MXGetLastError.restype = ctypes.c_char_p

    def check(rc: int) -> None:
        if rc != 0:
            raise RuntimeError(f"{_NAME}: {lib.MXGetLastError().decode(errors='replace')}")

    handle = ctypes.c_void_p()
    check(lib.MXKVStoreCreate(b"dist", ctypes.byref(handle)))
    controller = _Controller(handle)
    check(lib.MXKVStoreRunServer(handle, _CONTROLLER(controller), None))
    if controller.mxnets is None:  # (else MXNet's KVStore object frees it)
        check(lib.MXKVStoreFree(handle))
    return 0


if __name__ == "__main__":
    sys.exit(main())
