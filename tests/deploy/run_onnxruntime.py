"""Run the exported ONNX models with ONNX Runtime and compare with the original outputs.

``python run_onnxruntime.py OUTDIR`` in an environment with onnxruntime and a current
NumPy, without MXNet (the deploy nox session builds one).  The model's inputs and outputs
must be named as ``customop.export`` reported them; each case (batch size) of the model
runs, and a case in ``refuses`` must be refused.
"""

import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

out = Path(sys.argv[1])
for entry in json.loads((out / "models.json").read_text()):
    if "onnx" not in entry:
        continue
    saved = np.load(out / f"{entry['name']}.npz")
    session = ort.InferenceSession(str(out / entry["onnx"]), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == entry["inputs"] == entry["onnx_inputs"], (
        entry["name"],
        [i.name for i in session.get_inputs()],
    )
    assert [o.name for o in session.get_outputs()] == entry["outputs"], entry["name"]
    for case in entry["cases"]:
        feed = {n: saved[f"{case}/input_{n}"] for n in entry["inputs"]}
        if case in entry["refuses"]:
            try:
                session.run(entry["outputs"], feed)
            except Exception as exc:  # noqa: BLE001 - onnxruntime's own exception types
                assert "dimension" in str(exc).lower() or "shape" in str(exc).lower(), exc
                print(f"onnxruntime {ort.__version__}: {entry['name']} ({case}) refused")
                continue
            raise AssertionError(
                f"{entry['name']} ({case}): inputs at another shape were not refused"
            )
        got = session.run(entry["outputs"], feed)
        assert len(got) == len(entry["outputs"]), (entry["name"], len(got))
        for i, g in enumerate(got):
            np.testing.assert_allclose(
                g,
                saved[f"{case}/output_{i}"],
                rtol=1e-5,
                atol=1e-5,
                err_msg=f"{entry['name']} ({case}) output {i}",
            )
        print(f"onnxruntime {ort.__version__}: {entry['name']} ({case}) equals the original block")
