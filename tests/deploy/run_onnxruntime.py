"""Run the exported ONNX models with ONNX Runtime and compare with the original outputs.

``python run_onnxruntime.py OUTDIR`` in an environment with onnxruntime and a current
NumPy, without MXNet (the deploy nox session builds one).
"""
import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

out = Path(sys.argv[1])
for entry in json.loads((out / "models.json").read_text()):
    saved = np.load(out / f"{entry['name']}.npz")
    options = ort.SessionOptions()
    options.log_severity_level = 3  # (MXNet's converter lists its constants as inputs too)
    session = ort.InferenceSession(str(out / entry["onnx"]), options,
                                   providers=["CPUExecutionProvider"])
    feed = {n: saved[f"input_{n}"] for n in entry["onnx_inputs"]}
    got = session.run(entry["onnx_outputs"], feed)
    assert len(got) == entry["outputs"], (entry["name"], len(got))
    for i, g in enumerate(got):
        np.testing.assert_allclose(g, saved[f"output_{i}"], rtol=1e-5, atol=1e-5,
                                   err_msg=f"{entry['name']} output {i}")
    print(f"onnxruntime {ort.__version__}: {entry['name']} equals the original block")
