"""tests/fresh.py: a child forked from the MXNet server behaves as a new interpreter would."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests import fresh

REPORT = textwrap.dedent("""
    import json, os, sys
    print(json.dumps({"argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(),
                      "env": os.environ.get("FRESH_TEST"), "stdin": sys.stdin.read(),
                      "pythonpath": [p for p in sys.path if p.endswith("fresh-extra")],
                      "main": __name__, "customop": "customop" in sys.modules}))
""")


def _both(args, **kwargs):
    """The same call through the server and through a new interpreter."""
    return (
        fresh.run(args, capture_output=True, text=True, timeout=60, **kwargs),
        subprocess.run(args, capture_output=True, text=True, timeout=60, **kwargs),
    )


@pytest.mark.parametrize("how", ["-c", "script", "-m"])
def test_a_child_sees_what_a_new_interpreter_sees(how, tmp_path):
    (tmp_path / "report_mod.py").write_text(REPORT)
    args = {"-c": ["-c", REPORT], "script": ["report_mod.py"], "-m": ["-m", "report_mod"]}[how]
    env = dict(os.environ, FRESH_TEST="yes", PYTHONPATH=str(tmp_path / "fresh-extra"))
    forked, new = _both([sys.executable, *args, "a", "b"], cwd=tmp_path, env=env, input="in")
    assert forked.returncode == new.returncode == 0, forked.stderr + new.stderr
    assert forked.stdout == new.stdout
    assert '"customop": false' in forked.stdout and '"env": "yes"' in forked.stdout


@pytest.mark.parametrize(
    "code, returncode",
    [
        ("import sys; sys.exit(3)", 3),
        ("import sys; sys.exit('message')", 1),
        ("raise ValueError('from the child')", 1),
        ("import os; os.kill(os.getpid(), 9)", -signal.SIGKILL),
        (
            "import threading, time, atexit\natexit.register(print, 'atexit ran')\n"
            "threading.Thread(target=lambda: (time.sleep(0.5), print('thread ended'))).start()",
            0,
        ),
    ],
)
def test_exit_codes_messages_threads_and_atexit_as_a_new_interpreter(code, returncode):
    forked, new = _both([sys.executable, "-c", code])
    assert forked.returncode == new.returncode == returncode
    assert forked.stdout == new.stdout
    assert forked.stderr == new.stderr


def test_a_hung_child_is_killed_at_its_timeout():
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as caught:
        fresh.run(
            [
                sys.executable,
                "-c",
                "import os, time; print(os.getpid(), flush=True); time.sleep(60)",
            ],
            capture_output=True,
            text=True,
            timeout=2,
        )
    assert time.monotonic() - start < 20
    pid = int(caught.value.output.split()[0])
    with pytest.raises(ProcessLookupError):
        for _ in range(100):  # reaped by the server's waiter
            os.kill(pid, 0)
            time.sleep(0.05)


def test_mxnet_comes_imported_and_what_mxnet_reads_at_load_gets_a_new_interpreter():
    code = "import sys; print('mxnet' in sys.modules)"
    assert fresh.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    ).stdout.split() == ["True"]
    env = dict(os.environ, MXNET_ENGINE_TYPE="NaiveEngine")
    assert fresh.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    ).stdout.split() == ["False"]


@pytest.mark.parametrize("real", [False, True])
def test_merged_streams_and_a_session_killed_whole_at_its_timeout(real, tmp_path):
    code = textwrap.dedent("""
        import os, subprocess, sys, time
        print("out", flush=True)
        print("err", file=sys.stderr, flush=True)
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        print(os.getsid(0) == os.getpid(), child.pid, flush=True)
        time.sleep(60)
    """)
    with pytest.raises(subprocess.TimeoutExpired) as caught:
        fresh.run(
            [sys.executable, "-c", code],
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            timeout=3,
            real=real,
        )
    out = caught.value.output
    if isinstance(out, bytes):
        out = out.decode()
    lines = out.split("\n")
    assert lines[:2] == ["out", "err"] and lines[2].startswith("True "), out
    grandchild = int(lines[2].split()[1])
    with pytest.raises(ProcessLookupError):  # the session's other process went too
        for _ in range(100):
            os.kill(grandchild, 0)
            time.sleep(0.05)


@pytest.mark.parametrize("ending", ["exit", "killed"])
def test_the_server_ends_with_the_process_that_started_it(ending, tmp_path):
    code = textwrap.dedent("""
        import os, sys, time
        sys.path.insert(0, sys.argv[1])
        from tests import fresh
        fresh.PRELOAD = []  # the server's lifetime, not what it imported
        fresh.run([sys.executable, "-c", "pass"], timeout=60, check=True)
        print(fresh._server["proc"].pid, flush=True)
        if sys.argv[2] == "killed":
            os.kill(os.getpid(), 9)  # no atexit: the server sees its parent go
    """)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run(
        [sys.executable, "-c", code, root, ending], capture_output=True, text=True, timeout=120
    )
    server = int(done.stdout.split()[0])
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.kill(server, 0)
            with open(f"/proc/{server}/stat") as stat:  # a zombie has ended
                if stat.read().split(") ")[-1].startswith("Z"):
                    return
        except (ProcessLookupError, FileNotFoundError):
            return
        time.sleep(0.1)
    os.kill(server, signal.SIGKILL)
    pytest.fail(f"the fork server {server} outlived the process that started it")
