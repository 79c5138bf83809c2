"""examples/dist_train.py under python -m customop.launch: 2 dist_sync workers = one process."""
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
    proc = subprocess.run([sys.executable, "-m", "customop.launch", "-n", str(workers), "-s",
                           "1", "--launcher", "local", "--timeout", "90", sys.executable,
                           str(EXAMPLE), "--kvstore", "dist_sync", "--out", str(out), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "TEST_MARK": mark})
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


@pytest.mark.parametrize("api", ["gluon", "module"])
def test_dist_sync_workers_end_equal_to_one_process(api, tmp_path):
    proc, _ = _launch(tmp_path, "--api", api)
    assert proc.returncode == 0, proc.stderr[-3000:]
    w0, w1 = _load(tmp_path, api, 0), _load(tmp_path, api, 1)
    _assert_same(w1, w0, rtol=0, atol=0)  # identical on both workers
    one = _example().main(["--api", api, "--kvstore", "local"])
    _assert_same(w0, one, rtol=1e-5, atol=1e-6)
    assert max(np.abs(v).max() for v in one.values()) > 0.1


@pytest.mark.parametrize("api, contexts, extra", [("gluon", 2, ["--hybridize"]),
                                                  ("module", 1, [])])
def test_center_loss_keeps_one_set_of_centers(api, contexts, extra, tmp_path):
    args = ["--api", api, "--center-loss", "0.1", "--contexts", str(contexts), *extra]
    proc, _ = _launch(tmp_path, *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    w0, w1 = _load(tmp_path, api, 0), _load(tmp_path, api, 1)
    _assert_same(w1, w0, rtol=0, atol=0)
    centers = [k for k in w0 if "centers" in k]
    assert len(centers) == contexts
    for key in centers:  # every device of every worker holds the same centers
        np.testing.assert_array_equal(w0[key], w0[centers[0]])
    # One process with as many devices sees the same shards: the same centers and weights.
    one = _example().main(["--kvstore", "local", *args[:4], "--contexts", str(2 * contexts),
                           *extra])
    for key in w0:
        name, device = key.rsplit("@", 1)
        np.testing.assert_allclose(w0[key], one[f"{name}@{device}"], rtol=1e-5, atol=1e-5,
                                   err_msg=key)
    assert np.abs(w0[centers[0]]).max() > 0.5  # the centers moved


def test_a_worker_whose_op_rejects_its_input_stops_the_job(tmp_path):
    proc, took = _launch(tmp_path, "--api", "gluon", "--fail-rank", "1")
    assert proc.returncode == 1
    report = proc.stderr.split("customop.launch: worker")[-1]
    assert "exited with code 1" in report
    assert "softmax_xent: label has values outside [0, 3)" in report
    assert took < 60


def test_make_dist_demo_runs_as_written():
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^dist-demo:.*\n((?:\t.*\n)+)", makefile, re.M).group(1)
    command = recipe.replace("\\\n", " ").replace("$(PY)", sys.executable).strip()
    assert "--launcher local" in command and "dist_sync" in command
    assert "make dist-demo" in (ROOT / "README.md").read_text()
    mark = uuid.uuid4().hex
    proc = subprocess.run(command, shell=True, cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT),
                                            "TEST_MARK": mark})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rank 0: trained" in proc.stdout and "rank 1: trained" in proc.stdout
    time.sleep(0.2)
    assert _job_processes(mark) == []


def test_center_loss_on_two_devices_moves_centers_by_the_summed_shard_updates():
    import mxnet as mx

    from customop.auxsync import AuxSync

    op = _example().center_loss
    ctxs, alpha, classes = [mx.cpu(0), mx.cpu(1)], 0.5, 3
    centers = mx.gluon.Parameter("centers", shape=(classes, 4), init=mx.init.Zero(),
                                 grad_req="null")
    centers.initialize(ctx=ctxs)
    sync = AuxSync([centers])
    rng = np.random.RandomState(1)
    want = np.zeros((classes, 4))  # float64 reference (Wen et al.), per-device normalisation
    whole = np.zeros((classes, 4))  # one device on the whole batch, for the stated difference
    for _ in range(3):
        x = rng.normal(size=(8, 4)).astype(np.float32)
        y = rng.randint(0, classes, size=8)
        for copy, rows in zip(centers.list_data(), (slice(0, 4), slice(4, 8))):
            xs = mx.nd.array(x[rows], ctx=copy.context)
            xs.attach_grad()
            with mx.autograd.record():
                loss = op(xs, mx.nd.array(y[rows], ctx=copy.context), copy, num_class=classes,
                          alpha=alpha)
            loss.backward()
            np.testing.assert_allclose(loss.asnumpy(), 0.5 * ((x[rows] - want[y[rows]]) ** 2)
                                       .sum(axis=1), rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(xs.grad.asnumpy(), x[rows] - want[y[rows]], rtol=1e-5,
                                       atol=1e-6)
        sync()
        step = np.zeros_like(want)
        for rows in (slice(0, 4), slice(4, 8)):
            for j in range(classes):
                mine = y[rows] == j
                step[j] += (want[j] - x[rows][mine]).sum(axis=0) / (1 + mine.sum())
        whole_step = np.stack([(whole[j] - x[y == j]).sum(axis=0) / (1 + (y == j).sum())
                               for j in range(classes)])
        want = want - alpha * step
        whole = whole - alpha * whole_step
        for copy in centers.list_data():
            np.testing.assert_allclose(copy.asnumpy(), want, rtol=1e-5, atol=1e-6)
    assert np.abs(want - whole).max() > 1e-3  # the normalisation differs, as documented
