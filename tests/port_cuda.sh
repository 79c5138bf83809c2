#!/usr/bin/env bash
# The port tests with CUDA tensors, for a machine with a GPU (MXNet 1.9.1 itself runs on the
# CPU there: its wheels have no code for current GPUs; the references are computed by MXNet
# on the CPU and the ports run on cuda:0).  A few minutes.  From the repository root:
#
#     bash tests/port_cuda.sh            # uses .venv (make venv; pip install '.[port]')
#
# It fails if torch sees no CUDA device, so that a run on the wrong machine is not mistaken
# for a pass.  The jax variants need a CUDA jaxlib (pip install 'jax[cuda12]'); with the CPU
# jaxlib they skip, saying so.
set -euo pipefail
PY=${PY:-.venv/bin/python}
"$PY" - <<'PY'
import sys, torch, jax
if not torch.cuda.is_available():
    sys.exit("tests/port_cuda.sh: torch sees no CUDA device")
print("torch", torch.__version__, torch.cuda.get_device_name(0), "| jax", jax.__version__,
      jax.devices())
PY
exec timeout 900 "$PY" -m pytest -q -p no:cacheprovider -m cuda tests/port "$@"
