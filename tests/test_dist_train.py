"""examples/dist_train.py under ``python -m customop.distributed.launch``.

Two dist_sync workers end equal to one process."""

import importlib.util
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from tests.customop.test_launch import _job_processes

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "dist_train.py"


def _example():
    spec = importlib.util.spec_from_file_location("dist_train", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _launch(out, *args, workers=2):
    mark = uuid.uuid4().hex
    start = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "customop.distributed.launch",
            "-n",
            str(workers),
            "-s",
            "1",
            "--launcher",
            "local",
            "--timeout",
            "90",
            sys.executable,
            str(EXAMPLE),
            "--kvstore",
            "dist_sync",
            "--out",
            str(out),
            *args,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TEST_MARK": mark},
    )
    took = time.monotonic() - start
    time.sleep(0.2)
    assert _job_processes(mark) == [], "processes of the job outlived the launcher"
    return proc, took


def _load(out, api, rank):
    with np.load(out / f"{api}-rank{rank}.npz") as f:
        return dict(f)


def _assert_same(got, want, **tol):
    assert sorted(got) == sorted(want)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], err_msg=key, **tol)


# Both in `make soak` only (a job is four processes importing MXNet, about 14 s of CPU);
# `make test` makes both checks another way: gluon, the `make dist-demo` job below (the same
# loop with ops.center_loss on: the workers agree bit for bit and equal one process);
# module, module-fit below and the Module job of tests/customop/test_aux_rules.py.
@pytest.mark.parametrize(
    "api",
    [pytest.param("gluon", marks=pytest.mark.soak), pytest.param("module", marks=pytest.mark.soak)],
)
def test_dist_sync_workers_end_equal_to_one_process(api, tmp_path):
    proc, _ = _launch(tmp_path, "--api", api)
    assert proc.returncode == 0, proc.stderr[-3000:]
    w0, w1 = _load(tmp_path, api, 0), _load(tmp_path, api, 1)
    _assert_same(w1, w0, rtol=0, atol=0)  # identical on both workers
    one = _example().main(["--api", api, "--kvstore", "local"])
    _assert_same(w0, one, rtol=1e-5, atol=1e-6)
    assert max(np.abs(v).max() for v in one.values()) > 0.1


# module-update runs in `make soak` only (a job is four processes importing MXNet, about
# 8 s); `make test` still checks Module.update on dist_sync workers: module-fit (fit runs
# forward_backward + update, same op, same kvstore) and the Module job of
# tests/customop/test_aux_rules.py (the manual loop, aux states of every rule on two workers).
@pytest.mark.parametrize(
    "api, contexts, extra",
    [
        pytest.param("gluon", 2, ["--hybridize"], id="gluon-trainer"),
        pytest.param("module", 1, [], id="module-update", marks=pytest.mark.soak),
        pytest.param("module", 1, ["--fit"], id="module-fit"),
    ],
)
def test_ops_center_loss_keeps_one_set_of_centers_on_dist_sync_workers(
    api, contexts, extra, tmp_path
):
    # The standard loops, no AuxSync call: Trainer.step / Module.update / fit keep them equal.
    args = ["--api", api, "--center-loss", "0.1", "--contexts", str(contexts), *extra]
    proc, _ = _launch(tmp_path, *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    w0, w1 = _load(tmp_path, api, 0), _load(tmp_path, api, 1)
    _assert_same(w1, w0, rtol=0, atol=0)
    centers = [k for k in w0 if "centers" in k]
    # ops.CenterLoss's Parameter in Gluon, ops.center_loss's aux state on symbols
    name = "net_center_centers" if api == "gluon" else "center_centers"
    assert centers == [f"{name}@{i}" for i in range(contexts)]
    for key in centers:  # every device of every worker holds the same centers
        np.testing.assert_array_equal(w0[key], w0[centers[0]])
    # One process with as many devices sees the same shards: the same centers and weights.
    one = _example().main(
        ["--kvstore", "local", *args[:4], "--contexts", str(2 * contexts), *extra]
    )
    for key in w0:
        name, device = key.rsplit("@", 1)
        np.testing.assert_allclose(
            w0[key], one[f"{name}@{device}"], rtol=1e-5, atol=1e-5, err_msg=key
        )
    assert np.abs(w0[centers[0]]).max() > 0.5  # the centers moved
    assert "AuxStateWarning" not in proc.stderr


def test_optimizer_on_the_servers_is_named_and_the_workers_drift(tmp_path):
    proc, _ = _launch(tmp_path, "--api", "gluon", "--center-loss", "0.1", "--update-on-kvstore")
    assert proc.returncode == 0, proc.stderr[-3000:]
    warned = [line for line in proc.stderr.splitlines() if "AuxStateWarning" in line]
    assert len(warned) == 2, proc.stderr[-3000:]  # once per worker
    for line in warned:
        assert "customop 'ops.center_loss' (aux state 'centers')" in line
        assert "update_on_kvstore=True" in line and "update_on_kvstore=False" in line
    w0, w1 = _load(tmp_path, "gluon", 0), _load(tmp_path, "gluon", 1)
    assert np.abs(w0["net_center_centers@0"] - w1["net_center_centers@0"]).max() > 1e-3


def test_a_worker_whose_op_rejects_its_input_stops_the_job(tmp_path):
    proc, took = _launch(tmp_path, "--api", "gluon", "--fail-rank", "1")
    assert proc.returncode == 1
    report = proc.stderr.split("customop.distributed.launch: worker")[-1]
    assert "exited with code 1" in report
    assert "softmax_xent: label has values outside [0, 3)" in report
    assert took < 60


def test_make_dist_demo_runs_as_written(tmp_path):
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^dist-demo:.*\n((?:\t.*\n)+)", makefile, re.M).group(1)
    command = recipe.replace("\\\n", " ").replace("$(PY)", sys.executable).strip()
    assert "--launcher local" in command and "dist_sync" in command
    assert "make dist-demo" in (ROOT / "docs" / "howto" / "devices_and_workers.md").read_text()
    mark = uuid.uuid4().hex
    # the recipe as written, plus --out: the job also checks what the soak's plain Gluon job
    # checks (the workers end equal, and equal to one process)
    proc = subprocess.run(
        f"{command} --out {tmp_path}",
        shell=True,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TEST_MARK": mark},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rank 0: trained" in proc.stdout and "rank 1: trained" in proc.stdout
    time.sleep(0.2)
    assert _job_processes(mark) == []
    w0, w1 = _load(tmp_path, "gluon", 0), _load(tmp_path, "gluon", 1)
    _assert_same(w1, w0, rtol=0, atol=0)  # identical on both workers
    args = command.split("examples/dist_train.py", 1)[1].split()
    assert args == ["--api", "gluon", "--kvstore", "dist_sync", "--center-loss", "0.1"]
    # one process with a device per worker sees the same shards (as the center-loss jobs)
    one = _example().main(
        ["--api", "gluon", "--kvstore", "local", "--center-loss", "0.1", "--contexts", "2"]
    )
    _assert_same(w0, {k: v for k, v in one.items() if k.endswith("@0")}, rtol=1e-5, atol=1e-5)
    assert max(np.abs(v).max() for v in one.values()) > 0.1
    assert np.abs(w0["net_center_centers@0"]).max() > 0.5  # the centers moved
