"""Soaks under CPU load (``make soak``): training machines are busy, and races show up there.

Each test starts its own CPU hogs (busy Python processes, one more than the cores) and ends
them by pid, whatever happens; the work under test runs in children under timeouts.
"""

import contextlib
import os
import signal
import subprocess
import sys

import pytest

from tests.customop.test_reliability import FORK_SOAK, run_child

HOGS = 4


@contextlib.contextmanager
def cpu_hogs(n=HOGS):
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            os.kill(p.pid, signal.SIGKILL)
            p.wait()


@pytest.mark.soak
@pytest.mark.parametrize("run", range(3))
def test_fork_soak_beside_cpu_hogs(run):
    with cpu_hogs():
        rc, out = run_child(FORK_SOAK.replace("NFORKS", "200"), timeout=540)
    assert rc == 0 and "forks ok 200" in out, out[-3000:]


THREAD_AND_ERROR_TESTS = [
    "tests/customop/test_errors.py",
    "tests/customop/test_reliability.py",
    "tests/customop/test_multidevice.py",
]


@pytest.mark.soak
def test_thread_and_error_tests_pass_20_times_beside_cpu_hogs():
    failures = []
    with cpu_hogs():
        for run in range(20):
            args = ["-q", "-x", "-m", "not soak", "-p", "no:cacheprovider", *THREAD_AND_ERROR_TESTS]
            rc, out = run_child(f"import sys, pytest\nsys.exit(pytest.main({args!r}))", timeout=900)
            if rc != 0:
                failures.append((run, out[-2000:]))
    assert failures == []
