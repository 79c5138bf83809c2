"""Load the exported models with plain MXNet, three ways, and compare with the original outputs.

``python run_plain_mxnet.py OUTDIR`` in an environment with MXNet but without
customop (the deploy nox session builds one; the test suite blocks the imports).
Each model of ``models.json`` runs, on each of its cases (batch sizes), in:

- ``mx.gluon.SymbolBlock.imports``;
- ``mx.mod.Module``, bound with the data shapes only;
- MXNet's C predict API, from the C program ``predict.c`` compiled here with gcc against
  the wheel's header and ``libmxnet.so`` (``c_predict.py``), run with no Python in its
  process.

A case listed in ``refuses`` (inputs at a shape the graph does not hold at) must be
refused by each of them with MXNet's shape error.
"""

import json
import sys
import tempfile
from pathlib import Path

for name in ("customop", "ops"):
    try:
        __import__(name)
    except ImportError:
        continue
    sys.exit(f"{name} is importable here: this check needs an environment without it")

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import c_predict  # noqa: E402


def symbol_block(entry, feed):
    net = mx.gluon.SymbolBlock.imports(
        str(out / entry["symbol"]), entry["inputs"], str(out / entry["params"])
    )
    got = net(*[mx.nd.array(feed[n]) for n in entry["inputs"]])
    return [g.asnumpy() for g in ([got] if isinstance(got, mx.nd.NDArray) else got)]


def module(entry, feed):
    sym, args, auxs = mx.model.load_checkpoint(str(out / entry["name"]), 0)
    mod = mx.mod.Module(sym, data_names=entry["inputs"], label_names=None)
    # layout "": the inputs need not share a batch size (anchors shared by the images)
    mod.bind(
        data_shapes=[mx.io.DataDesc(n, feed[n].shape, layout="") for n in entry["inputs"]],
        for_training=False,
    )
    mod.set_params(args, auxs)
    assert mod.output_names == entry["outputs"], (mod.output_names, entry["outputs"])
    mod.forward(mx.io.DataBatch([mx.nd.array(feed[n]) for n in entry["inputs"]]), is_train=False)
    return [o.asnumpy() for o in mod.get_outputs()]


def c_api(entry, feed):
    return c_predict.run(
        program,
        str(out / entry["symbol"]),
        str(out / entry["params"]),
        {n: feed[n] for n in entry["inputs"]},
    )


LOADERS = {"SymbolBlock.imports": symbol_block, "Module": module, "C predict API": c_api}

out = Path(sys.argv[1])
with tempfile.TemporaryDirectory(prefix="customop-c-") as build:
    program = c_predict.build(build)
    for entry in json.loads((out / "models.json").read_text()):
        saved = np.load(out / f"{entry['name']}.npz")
        assert '"Custom"' not in (out / entry["symbol"]).read_text(), entry["name"]
        assert mx.sym.load(str(out / entry["symbol"])).list_outputs() == entry["outputs"]
        for case in entry["cases"]:
            feed = {n: saved[f"{case}/input_{n}"] for n in entry["inputs"]}
            for loader, run in LOADERS.items():
                what = f"{entry['name']} ({case}) in {loader}"
                if case in entry["refuses"]:
                    try:
                        run(entry, feed)
                    except (mx.base.MXNetError, c_predict.PredictError, RuntimeError) as exc:
                        # (Module.bind wraps MXNetError in a RuntimeError: "simple_bind error")
                        assert "_fixed_at_" in str(exc), (what, str(exc)[:500])
                        continue
                    raise AssertionError(f"{what}: inputs at another shape were not refused")
                got = run(entry, feed)
                assert len(got) == len(entry["outputs"]), (what, len(got))
                for k, g in enumerate(got):
                    np.testing.assert_allclose(
                        g,
                        saved[f"{case}/output_{k}"],
                        rtol=1e-5,
                        atol=1e-5,
                        err_msg=f"{what} output {k}",
                    )
            print(
                f"plain MXNet {mx.__version__}: {entry['name']} ({case}) "
                f"{'refused' if case in entry['refuses'] else 'equals the original block'} "
                f"in {', '.join(LOADERS)}"
            )
