"""One module object for the operator library when a checkout makes it importable twice.

The wheel installs the library as ``customop.ops`` only.  In a checkout with an editable
install the repository root is on ``sys.path`` too, so the same folder is importable as
``ops`` and as ``customop.ops``; importing it under both names would define (and
register) every operator twice.  Imported as ``customop.ops``, the package then makes
itself ``ops`` (imported first) by replacing its ``sys.modules`` entries, which the import
system supports; a top-level ``ops`` from elsewhere (Canonical's) is left alone.
"""

import importlib.util
import os
import sys

_package = __name__.rpartition(".")[0]  # "ops" or "customop.ops"


def _same_folder_is_top_level_ops() -> bool:
    try:
        spec = importlib.util.find_spec("ops")
    except ValueError:  # an ops module without __spec__
        return False
    origin = spec.origin if spec is not None else None
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "__init__.py")
    return bool(origin) and os.path.exists(origin) and os.path.samefile(origin, here)


if _package != "ops" and _same_folder_is_top_level_ops():
    import ops

    for _key, _module in list(sys.modules.items()):
        if _key == "ops" or _key.startswith("ops."):
            sys.modules[_package + _key[len("ops") :]] = _module
    del ops
