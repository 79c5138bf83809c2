"""subprocess.run after a decorated op ran: Python 3.8/3.9 fork without os.register_at_fork
handlers, and MXNet's own fork handler then waits for a worker thread that needs the GIL."""
import os
import signal
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 90

CHILD = """
import subprocess, sys
import mxnet as mx
from customop import customop

@customop('numpy')
def square(x):
    return x * x

square.def_grad(lambda ans, x: lambda g: 2 * x * g)

x = mx.nd.array([1.0, 2.0, 3.0]); x.attach_grad()
for _ in range(3):        # train: record, backward, update
    with mx.autograd.record():
        loss = square(x).sum()
    loss.backward()
    x[:] = x - 0.1 * x.grad
y = mx.nd.Custom(x, op_type=square.op_type)  # and the registered CustomOp's worker thread
# Nothing waited on: the ops may still be running when subprocess forks (that is what hangs).
rc = subprocess.run([sys.executable, '-c', 'pass']).returncode
print('subprocess returned', rc, flush=True)
print('ran', y.asnumpy().round(3).tolist(), flush=True)
"""


def _spawn_and_wait(argv, out_path, timeout):
    """Run argv with posix_spawn (no fork in this process, whose own fork could deadlock for
    the same reason) and return (exit code or None on timeout, output); kills on timeout."""
    fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
        pid = os.posix_spawn(argv[0], argv, env, file_actions=[
            (os.POSIX_SPAWN_DUP2, fd, 1), (os.POSIX_SPAWN_DUP2, fd, 2)], setsid=True)
    finally:
        os.close(fd)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1, \
                Path(out_path).read_text()
        time.sleep(0.2)
    os.killpg(pid, signal.SIGKILL)  # the child and the subprocess it may have started
    os.waitpid(pid, 0)
    return None, Path(out_path).read_text()


@pytest.mark.skipif(not hasattr(os, "posix_spawn"), reason="needs os.posix_spawn (POSIX)")
def test_subprocess_run_after_a_decorated_op_does_not_hang(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    code, out = _spawn_and_wait([sys.executable, str(script)], tmp_path / "out.txt", TIMEOUT)
    if code is None:
        pytest.fail(f"subprocess.run after a decorated op hung for {TIMEOUT} s on Python "
                    f"{sys.version.split()[0]} (killed). Output:\n{out}")
    assert code == 0, out
    assert "ran [" in out and "subprocess returned 0" in out, out
