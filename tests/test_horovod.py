"""Horovod, the other engine MXNet jobs ran on: 2-rank jobs on 127.0.0.1 (Gloo, no MPI).

Our ops' aux states merge across the ranks by each state's rule, with
``hvd.DistributedTrainer`` (imperative and hybridized) and ``hvd.DistributedOptimizer`` and no
call of ours, or ``AuxSync(..., hvd)`` where Horovod drives nothing (forgetting it raises);
``examples/dist_train.py --horovod`` (a ``def_grad`` loss as a Custom node, the library's
center loss, ``hvd.broadcast_parameters`` over ranks that drew different initial values)
ends equal on both ranks and to one process with two devices; a rank that fails stops the
job.  Each job runs under ``tests/horovodrun.py`` (``horovodrun`` with every server on
127.0.0.1) with a timeout.

Skipped where Horovod is not installed with its MXNet extension (``make test``'s .venv): the
``horovod`` nox session builds it against the pinned MXNet and runs this module.
"""

import importlib.util
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from tests.customop.auxops import RULE_STATES, merged_reference
from tests.customop.test_launch import _job_processes
from tests.test_dist_train import _example


def _horovod_mxnet() -> bool:
    # Looked up on disk: importing horovod.mxnet here would load Horovod into the test process
    spec = importlib.util.find_spec("horovod")
    if spec is None or not spec.submodule_search_locations:
        return False
    return any(Path(p, "mxnet").glob("mpi_lib*.so") for p in spec.submodule_search_locations)


pytestmark = pytest.mark.skipif(
    not _horovod_mxnet(),
    reason="Horovod with its MXNet extension is not installed; "
    "`nox -s horovod` builds it and runs these tests (docs/development.md)",
)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "dist_train.py"
WORKER = ROOT / "tests" / "customop" / "horovod_worker.py"
RUN = [
    "tests/horovodrun.py",
    "--gloo",
    "-np",
    "2",
    "-H",
    "localhost:2",
    "--network-interface",
    "lo",
]


def _horovodrun(*command, timeout=120):
    """A 2-rank job; killed whole (its process group) past ``timeout`` seconds."""
    mark = uuid.uuid4().hex
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, *RUN, sys.executable, *map(str, command)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TEST_MARK": mark},
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the Horovod job ran past {timeout} s:\n{err[-3000:]}")
    took = time.monotonic() - start
    time.sleep(0.2)
    assert _job_processes(mark) == [], "processes of the job outlived horovodrun"
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), took


def _load(out, api, rank):
    with np.load(out / f"{api}-rank{rank}.npz") as f:
        return dict(f)


def test_every_rule_merges_across_two_horovod_ranks(tmp_path):
    # merged's five states ('sum', 'mean', 'first', 'local', a step count by 'first'), one
    # copy a rank: DistributedTrainer plain and hybridized, a plain Trainer + AuxSync(hvd),
    # Module + DistributedOptimizer; float64 references from the rules' definitions
    # imported here: the worker module puts the checkout on sys.path as a path of its own, and
    # customop modules imported after that (at collection) get file names test_layout.py's
    # call tracing does not recognise
    from tests.customop.aux_rules_worker import shards

    proc, _ = _horovodrun(WORKER, "--out", tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "AuxStateWarning" not in proc.stderr
    want = merged_reference(shards(1))
    for rank in range(2):
        with np.load(tmp_path / f"rank{rank}.npz") as f:
            saved = dict(f)
        for run in ("gluon", "gluon-hybridized", "by_hand", "module"):
            for name in RULE_STATES:
                np.testing.assert_array_equal(
                    saved[f"{run}/{name}"],
                    want[rank][name],
                    err_msg=f"{run}: {name} on rank {rank}",
                )


def test_a_forgotten_aux_sync_is_an_error_that_stops_the_job(tmp_path):
    # a plain Trainer, gradients allreduced by hand, no AuxSync: the second step's forward
    proc, took = _horovodrun(WORKER, "--out", tmp_path, "--forget")
    assert proc.returncode != 0
    assert (
        "AuxStateError: customop 'tests.customop.auxops.merged' (aux state 'total'): the "
        "last gluon.Trainer step left its copies unmerged: this is a Horovod job of 2 ranks"
        in proc.stderr
    ), proc.stderr[-3000:]
    assert "AuxSync([...its Parameter...], hvd)" in proc.stderr
    assert took < 60


# softmax_xent: a 'numpy' op with def_grad (a Custom node); ops.focal_loss (Gluon): an
# 'mxnet' op, MXNet's operators in the hybridized graph and in the recorded imperative calls
@pytest.mark.parametrize(
    "api, extra",
    [
        ("gluon", ["--focal-loss", "1"]),
        ("gluon", ["--focal-loss", "1", "--hybridize"]),
        ("module", []),
    ],
    ids=["gluon", "gluon-hybridized", "module"],
)
def test_center_loss_on_two_horovod_ranks_equals_one_process(api, extra, tmp_path):
    args = ["--api", api, "--center-loss", "0.1", *extra]
    proc, _ = _horovodrun(EXAMPLE, "--horovod", "--out", tmp_path, *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "AuxStateWarning" not in proc.stderr
    r0, r1 = _load(tmp_path, api, 0), _load(tmp_path, api, 1)
    assert sorted(r0) == sorted(r1)
    for key in r0:  # identical on both ranks, the centers too
        np.testing.assert_array_equal(r1[key], r0[key], err_msg=key)
    # One process with a device per rank sees the same shards: the same weights and centers
    # (rank 1 drew other initial values: hvd.broadcast_parameters made them rank 0's)
    one = _example().main(["--kvstore", "local", "--contexts", "2", *args])
    for key in r0:
        np.testing.assert_allclose(r0[key], one[key], rtol=1e-5, atol=1e-5, err_msg=key)
    centers = "net_center_centers@0" if api == "gluon" else "center_centers@0"
    assert np.abs(r0[centers]).max() > 0.5  # the centers moved


def test_a_rank_whose_op_rejects_its_input_stops_the_job(tmp_path):
    proc, took = _horovodrun(EXAMPLE, "--horovod", "--api", "gluon", "--fail-rank", "1")
    assert proc.returncode != 0
    assert (
        "[1]<stderr>:ValueError: customop '__main__.softmax_xent' (forward): softmax_xent: "
        "label has values outside [0, 3)" in proc.stderr
    ), proc.stderr[-3000:]
    assert "one or more processes exited with non-zero status" in proc.stderr
    assert took < 60


@pytest.mark.soak
def test_a_longer_horovod_job_keeps_the_ranks_equal(tmp_path):
    # 3,000 steps (about 50 s on 2 cores), against one process with two devices
    args = [
        "--api",
        "gluon",
        "--center-loss",
        "0.1",
        "--focal-loss",
        "1",
        "--hybridize",
        "--steps",
        "3000",
    ]
    proc, _ = _horovodrun(EXAMPLE, "--horovod", "--out", tmp_path, *args, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0, r1 = _load(tmp_path, "gluon", 0), _load(tmp_path, "gluon", 1)
    for key in r0:
        np.testing.assert_array_equal(r1[key], r0[key], err_msg=key)
    one = _example().main(["--kvstore", "local", "--contexts", "2", *args])
    for key in r0:
        np.testing.assert_allclose(r0[key], one[key], rtol=1e-4, atol=1e-4, err_msg=key)


def test_horovodrun_here_listens_on_the_loopback_only():
    # horovodrun's own rendezvous server binds every interface; tests/horovodrun.py's binds
    # 127.0.0.1 (Gloo's connections use the interface given, lo)
    import importlib.util as util

    from horovod.runner.http import http_server

    spec = util.spec_from_file_location("horovodrun_lo", ROOT / "tests" / "horovodrun.py")
    runner = util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    bare = http_server.RendezvousServer(verbose=0)
    bare.start()
    try:
        assert bare._httpd.server_address[0] == "0.0.0.0"  # what tests/horovodrun.py fixes
    finally:
        bare.stop()
    http_server.find_port, saved = runner._loopback_port, http_server.find_port
    try:
        server = http_server.RendezvousServer(verbose=0)
        server.start()
    finally:
        http_server.find_port = saved
    try:
        assert server._httpd.server_address[0] == "127.0.0.1"
    finally:
        server.stop()
