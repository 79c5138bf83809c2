"""Issue 25 item 3: the pairwise matrix (tests/customop/pairmatrix.py), one subprocess per setting.

Each subprocess runs every ordered pair of the matrix's operators (14 x 14 graphs) on the
paths of its setting's selected tests and the same math recorded imperatively, and prints
both; here every pair is compared and every failing pair is listed, not only the first.
The subprocesses of the selected tests run once, up front (tests/concurrently.py): three
processes (inlined, Custom nodes, deps off) where one per path took seven, 115 s of the
suite's time against about 70.
"""

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from tests import concurrently, fresh
from tests.customop import pairmatrix

ROOT = Path(__file__).resolve().parents[2]


PATHS = ("bound", "hybridized", "exported")
# what CUSTOMOP_RUNTIME_OFF switches off in each setting's process
SETTINGS = {
    "inlined": {},
    "Custom nodes": {"CUSTOMOP_RUNTIME_OFF": "inline"},
    "deps off": {"CUSTOMOP_RUNTIME_OFF": "deps,inline"},
}
# each test's (setting, path)
WHICH = {(path, inline): (inline, path) for path in PATHS for inline in ("inlined", "Custom nodes")}
WHICH["deps off"] = ("deps off", "bound")


@pytest.fixture(scope="module")
def matrix(request):
    def run(setting, paths):
        # 'deps off' is read only for which pairs raise: no recorded references there
        only = ["--errors-only"] if setting == "deps off" else []
        return lambda: fresh.run(
            [sys.executable, "-m", "tests.customop.pairmatrix", ",".join(paths), *only],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=ROOT,
            env={**os.environ, **SETTINGS[setting]},
        )

    wanted = {}  # setting: its selected paths, in PATHS order
    for key in concurrently.selected(request, "which"):
        setting, path = WHICH[key]
        wanted.setdefault(setting, set()).add(path)
    runs = concurrently.run_selected(
        {s: run(s, [p for p in PATHS if p in paths]) for s, paths in wanted.items()}
    )
    yield runs
    runs.wait()


def _result(matrix, key):
    setting, path = WHICH[key]
    out = matrix[setting]
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])[path]


def _differences(recorded, other):
    """What differs between two runs of one pair (float32 tolerance), as readable lines."""
    found = []
    for kind in ("heads", "grads", "aux"):
        want, got = recorded[kind], other[kind]
        keys = range(len(want)) if kind == "heads" else want
        if len(want) != len(got):
            found.append(f"{kind}: {len(got)} instead of {len(want)}")
            continue
        for k in keys:
            w, g = np.asarray(want[k]), np.asarray(got[k])
            if w.shape != g.shape or not np.allclose(g, w, rtol=1e-5, atol=1e-6):
                found.append(
                    f"{kind} {k}: max |diff| "
                    f"{np.max(np.abs(g - w)) if w.shape == g.shape else 'shape'}"
                )
    return found


@pytest.mark.parametrize(
    "which",
    [(path, inline) for path in PATHS for inline in ("inlined", "Custom nodes")],
    ids="-".join,
)
def test_every_ordered_pair_gives_the_gradients_of_the_recorded_run(which, matrix):
    # by default the ops that inline (issue 28) run as MXNet's operators; with inlining
    # switched off every op of the pair is a Custom node
    path = which[0]
    result = _result(matrix, which)
    assert sorted(result) == sorted(f"{a}>{b}" for a, b in pairmatrix.PAIRS)
    failing = {}
    for key, run in result.items():
        if "error" in run:
            failing[key] = [run["error"].strip().splitlines()[-1]]
            continue
        # the reference must not be vacuous: every differentiable input gets a gradient
        flat = [k for k, g in run["recorded"]["grads"].items() if not np.any(g)]
        found = _differences(run["recorded"], run["path"])
        if "graph" in run:  # the imperative native graphs too (issue 41)
            found += [f"imperative graph: {d}" for d in _differences(run["recorded"], run["graph"])]
        if flat or found:
            failing[key] = [f"zero reference gradient: {flat}"] * bool(flat) + found
    assert not failing, f"{len(failing)} of {len(result)} pairs fail on {path}:\n" + "\n".join(
        f"  {k}: {'; '.join(v)}" for k, v in sorted(failing.items())
    )


@pytest.mark.parametrize("which", ["deps off"])
def test_the_matrix_finds_mxnets_shared_dependencies_when_our_fix_is_off(which, matrix):
    # Without the 'deps' fix every pair whose first node is an output layer and whose
    # second reads its output gradient fails: the matrix can see the bug it guards against.
    # (Inlining is off too: an inlined second op is no Custom node, so it cannot meet the bug.)
    result = _result(matrix, which)
    layers = [n for n, case in pairmatrix.CASES.items() if case.output_layer]
    want = {f"{a}>{b}" for a in layers for b in pairmatrix.CASES if b not in layers}
    assert {k for k, run in result.items() if "error" in run} == want
    assert all("unknown storage type" in result[k]["error"] for k in want)
    # the one error names our op and says that customop's fix is off
    assert all(
        "customop '" in result[k]["error"]
        and "'deps') is switched off" in result[k]["error"]
        and "hand-written" not in result[k]["error"]
        for k in want
    ), [result[k]["error"] for k in sorted(want)][:2]
