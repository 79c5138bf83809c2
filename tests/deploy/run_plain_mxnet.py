"""Load the exported models with plain MXNet and compare with the original outputs.

``python run_plain_mxnet.py OUTDIR`` in an environment with MXNet but without
customop (the deploy nox session builds one; the test suite blocks the imports).
"""
import json
import sys
from pathlib import Path

for name in ("customop", "ops"):
    try:
        __import__(name)
    except ImportError:
        continue
    sys.exit(f"{name} is importable here: this check needs an environment without it")

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402

out = Path(sys.argv[1])
for entry in json.loads((out / "models.json").read_text()):
    saved = np.load(out / f"{entry['name']}.npz")
    assert '"Custom"' not in (out / entry["symbol"]).read_text(), entry["name"]
    net = mx.gluon.SymbolBlock.imports(str(out / entry["symbol"]), entry["inputs"],
                                       str(out / entry["params"]))
    got = net(*[mx.nd.array(saved[f"input_{n}"]) for n in entry["inputs"]])
    got = [got] if isinstance(got, mx.nd.NDArray) else list(got)
    assert len(got) == entry["outputs"], entry["name"]
    for i, g in enumerate(got):
        np.testing.assert_allclose(g.asnumpy(), saved[f"output_{i}"], rtol=1e-5, atol=1e-5,
                                   err_msg=f"{entry['name']} output {i}")
    print(f"plain MXNet {mx.__version__}: {entry['name']} equals the original block")
