"""subprocess.run after a decorated op ran: Python 3.8/3.9 fork without os.register_at_fork
handlers, and MXNet's own fork handler then waits for a worker thread that needs the GIL."""

import json
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
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
            ),
        }
        pid = os.posix_spawn(
            argv[0],
            argv,
            env,
            file_actions=[(os.POSIX_SPAWN_DUP2, fd, 1), (os.POSIX_SPAWN_DUP2, fd, 2)],
            setsid=True,
        )
    finally:
        os.close(fd)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1, Path(
                out_path
            ).read_text()
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
        pytest.fail(
            f"subprocess.run after a decorated op hung for {TIMEOUT} s on Python "
            f"{sys.version.split()[0]} (killed). Output:\n{out}"
        )
    assert code == 0, out
    assert "ran [" in out and "subprocess returned 0" in out, out


BESIDE_TRAINING = ROOT / "tests" / "customop" / "subprocess_beside_training.py"
# (ops, training threads, threads calling subprocess.run 25 times each): issue 42's script, and
# more threads shelling out beside the same two trainers
SHAPES = [("both", 2, 2), ("both", 2, 4)]


def _beside_training(tmp_path, ops, train, spawn, run=0):
    argv = [
        sys.executable,
        str(BESIDE_TRAINING),
        "--ops",
        ops,
        "--train",
        str(train),
        "--spawn",
        str(spawn),
    ]
    return _spawn_and_wait(argv, tmp_path / f"out{run}.txt", TIMEOUT)


@pytest.mark.skipif(not hasattr(os, "posix_spawn"), reason="needs os.posix_spawn (POSIX)")
@pytest.mark.parametrize("ops,train,spawn", SHAPES)
def test_threads_start_subprocesses_while_others_train(tmp_path, ops, train, spawn):
    # Python 3.8/3.9 forked, and MXNet's fork handlers stopped the engine under the training
    # threads (hung 5 of 5 before); the fork patch now starts those children with posix_spawn
    code, out = _beside_training(tmp_path, ops, train, spawn)
    if code is None:
        pytest.fail(
            f"{train} threads training beside {spawn} starting subprocesses hung for "
            f"{TIMEOUT} s on Python {sys.version.split()[0]} (killed). Output:\n{out}"
        )
    assert code == 0 and out.startswith("ok"), out


@pytest.mark.soak
@pytest.mark.skipif(not hasattr(os, "posix_spawn"), reason="needs os.posix_spawn (POSIX)")
@pytest.mark.parametrize("ops,train,spawn", SHAPES + [("mxnet", 2, 2), ("numpy", 2, 2)])
def test_threads_start_subprocesses_while_others_train_10_times(tmp_path, ops, train, spawn):
    outcomes = [_beside_training(tmp_path, ops, train, spawn, run) for run in range(10)]
    bad = [
        (run, code, out[-1500:])
        for run, (code, out) in enumerate(outcomes)
        if code != 0 or not out.startswith("ok")
    ]
    assert bad == [], f"{len(bad)} of 10 runs hung (code None) or failed: {bad}"


ON_GLIBC = sys.platform.startswith("linux") and (
    getattr(os, "confstr", lambda _: "")("CS_GNU_LIBC_VERSION") or ""
).startswith("glibc")


@pytest.mark.skipif(not ON_GLIBC, reason="the spawn path needs glibc's posix_spawn")
def test_spawned_children_get_what_popen_gives_forked_ones(tmp_path):
    # Every call runs through Python's own Popen (fork) and the fork patch's posix_spawn path:
    # the same output, exit code, pipes, cwd, env, PATH search, fds, signals, session and the
    # same exception (type, errno, filename); calls it cannot serve fork, as before
    argv = [sys.executable, str(ROOT / "tests" / "customop" / "popen_cases.py")]
    code, out = _spawn_and_wait(argv, tmp_path / "out.txt", TIMEOUT)
    assert code == 0, out
    report = json.loads(out.strip().splitlines()[-1])
    assert {name: rest[2:] for name, rest in report.items() if not rest[1]} == {}
    taken = {name: rest[0] for name, rest in report.items()}
    assert taken == {name: "fork" if name.endswith("(forks)") else "spawn" for name in taken}


SETTLES = """
import os, subprocess, sys
import mxnet as mx
from customop import runtime
runtime.install("fork")
from customop.runtime import fork
settled = []
fork.settle = lambda: settled.append(1)  # MXNet's engine stopped and restarted
subprocess.run([sys.executable, "-c", "pass"], check=True)
spawned = len(settled)
_, w = os.pipe()
subprocess.run([sys.executable, "-c", "pass"], check=True, pass_fds=[w])
print(spawned, len(settled) - spawned)
"""


@pytest.mark.skipif(not ON_GLIBC, reason="the spawn path needs glibc's posix_spawn")
def test_subprocess_stops_mxnets_engine_only_when_it_forks(tmp_path):
    script = tmp_path / "settles.py"
    script.write_text(SETTLES)
    code, out = _spawn_and_wait([sys.executable, str(script)], tmp_path / "out.txt", TIMEOUT)
    assert code == 0, out
    # 3.8/3.9: a plain call is spawned, pass_fds forks after the step; 3.10+: vfork, no step
    forks = 1 if sys.version_info < (3, 10) else 0
    assert out.strip().splitlines()[-1] == f"0 {forks}", out
