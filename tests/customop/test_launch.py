"""python -m customop.distributed.launch: a local dist_sync job runs; a failing worker ends it."""

import ast
import os
import re
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from customop.distributed import launch, serve

ROOT = Path(__file__).resolve().parents[2]

# Each worker pushes rank+1 and pulls the sum; WHO (a DMLC_TASK_ID) then fails in the way HOW
# says, while the other worker waits for it in the next push.  With LISTENERS set, worker 0
# first prints every socket the job's processes listen on, with its address (the other
# worker waits for it in that push, so every process of the job is alive then).
WORKER = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    import mxnet as mx
    import customop
    kv = mx.kv.create("dist_sync")
    kv.init(3, mx.nd.zeros((2,)))
    kv.push(3, mx.nd.ones((2,)) * (kv.rank + 1))
    out = mx.nd.zeros((2,))
    kv.pull(3, out=out)
    def say(line):  # one write(2) of a whole line: the workers share one pipe
        os.write(1, (line + "\\n").encode())
    say(f"pulled {out.asnumpy().tolist()}")
    if os.environ.get("LISTENERS") and kv.rank == 0:
        mark = os.environ["TEST_MARK"].encode()
        inodes = set()
        for proc in Path("/proc").iterdir():
            try:
                if proc.name.isdigit() and mark in (proc / "environ").read_bytes():
                    for fd in (proc / "fd").iterdir():
                        link = os.readlink(fd)
                        if link.startswith("socket:["):
                            inodes.add(link[8:-1])
            except OSError:
                pass
        for table in ("tcp", "tcp6"):
            for line in Path("/proc/net", table).read_text().splitlines()[1:]:
                f = line.split()
                if f[3] == "0A" and f[9] in inodes:
                    say(f"LISTEN {table} {f[1]}")
        for proc in Path("/proc").iterdir():  # every process of the job: role and command
            try:
                environ = (proc / "environ").read_bytes().split(b"\\0")
                if proc.name.isdigit() and b"TEST_MARK=" + mark in environ:
                    role = [v[10:].decode() for v in environ if v.startswith(b"DMLC_ROLE=")]
                    command = (proc / "cmdline").read_bytes().rstrip(b"\\0").split(b"\\0")
                    numpy = "_multiarray_umath" in (proc / "maps").read_text()
                    say(f"ROLE {role[0] if role else '-'} numpy={numpy} {command[-1].decode()}")
            except OSError:
                pass
    if os.environ["DMLC_TASK_ID"] == os.environ.get("WHO"):
        how = os.environ["HOW"]
        if how == "raise":
            raise ValueError("boom in worker")
        if how == "abort":
            os.abort()
        if how == "hang":
            import time; time.sleep(600)
    kv.push(3, out)
    kv.pull(3, out=out)
    say(f"done {out.asnumpy().tolist()}")
    if os.environ.get("OPTIMIZER"):  # on the servers: w = 1 - 0.25 * (1 + 1)
        kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.25, rescale_grad=1.0))
        kv.init(5, mx.nd.ones((2,)))
        kv.push(5, mx.nd.ones((2,)))
        kv.pull(5, out=out)
        say(f"optimized {out.asnumpy().tolist()}")
""")


def _job_processes(mark):
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if mark.encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def _launch(tmp_path, *launch_args, **env):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    mark = uuid.uuid4().hex
    start = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "customop.distributed.launch",
            *launch_args,
            sys.executable,
            str(script),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TEST_MARK": mark, **env},
    )
    took = time.monotonic() - start
    time.sleep(0.2)
    assert _job_processes(mark) == [], "processes of the job outlived the launcher"
    return proc, took


@pytest.fixture(scope="module")
def good_job(tmp_path_factory):
    """One job that succeeds, read by the tests that need one (each job costs 4 processes)."""
    proc, _ = _launch(
        tmp_path_factory.mktemp("job"),
        "-n",
        "2",
        "-s",
        "1",
        "--launcher",
        "local",
        "--timeout",
        "90",
        LISTENERS="1",
        OPTIMIZER="1",
    )
    return proc


def test_two_workers_one_server_run_and_exit_zero(good_job):
    proc = good_job
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("pulled [3.0, 3.0]") == 2
    assert proc.stdout.count("done [6.0, 6.0]") == 2


@pytest.mark.parametrize(
    "how, says", [("raise", "exited with code 1"), ("abort", "killed by SIGABRT")]
)
def test_a_failing_worker_stops_the_job(tmp_path, how, says):
    proc, took = _launch(tmp_path, "-n", "2", "-s", "1", "--timeout", "90", WHO="1", HOW=how)
    assert proc.returncode == 1
    assert "customop.distributed.launch: worker 1 of 2 (pid " in proc.stderr and says in proc.stderr
    assert "every process it started was ended" in proc.stderr
    if how == "raise":  # the end of its error output is repeated under the report
        report = proc.stderr.split("customop.distributed.launch: worker 1")[1]
        assert "ValueError: boom in worker" in report
    assert took < 60  # not the 90 s timeout: the other worker was waiting for it forever


def test_timeout_ends_a_hanging_job(tmp_path):
    proc, took = _launch(tmp_path, "-n", "2", "-s", "1", "--timeout", "6", WHO="0", HOW="hang")
    assert proc.returncode == 1 and "job timed out after 6 s" in proc.stderr
    assert took < 40


@pytest.mark.parametrize(
    "argv, says", [(["-n", "2"], "no COMMAND"), (["-n", "0", "true"], "at least one worker")]
)
def test_usage_errors(argv, says, capsys):
    # main() as `python -m customop.distributed.launch` runs it (sys.exit(main())); the
    # jobs above go through that line with exit codes 0 and 1.  Nothing is started here.
    with pytest.raises(SystemExit) as exited:
        launch.main(argv)
    assert exited.value.code == 2 and says in capsys.readouterr().err


def test_every_process_listens_on_loopback_only(good_job):
    proc = good_job
    assert proc.returncode == 0, proc.stderr[-3000:]
    # (the other worker prints into the same pipe meanwhile: print() wrote a record in
    # pieces and a CI run saw a line hold pieces of two; each record is now one write(2),
    # and is still found by its shape, not by its line)
    listening = re.findall(r"LISTEN (\w+) ([0-9A-F]+):[0-9A-F]{4}", proc.stdout)
    assert len(listening) >= 4, proc.stdout  # scheduler, server, two workers
    assert proc.stdout.count("LISTEN") == len(listening), proc.stdout
    for table, address in listening:  # 0100007F is 127.0.0.1 in /proc/net/tcp's byte order
        assert table == "tcp" and address == "0100007F", listening


def test_scheduler_and_servers_run_from_libmxnet_and_import_mxnet_for_an_optimizer(
    good_job, monkeypatch, capsys
):
    # `import mxnet` starts a scheduler or server too, after 3.5 s of CPU building MXNet's
    # Python operator functions; the launcher runs serve.py, which makes the same C calls
    # from the library alone, and imports mxnet in a server when an optimizer arrives
    proc = good_job
    assert proc.returncode == 0, proc.stderr[-3000:]
    roles = re.findall(r"ROLE (\w+) numpy=(\w+) ([^\n]+)", proc.stdout)
    assert sorted(r[:2] for r in roles) == [
        ("scheduler", "False"),
        ("server", "False"),
        ("worker", "True"),
        ("worker", "True"),
    ], roles
    assert {command for role, _, command in roles if role != "worker"} == {serve.__file__}
    # the SGD step ran on the server (without it the server would store the sum, 2)
    assert proc.stdout.count("optimized [0.5, 0.5]") == 2, proc.stdout
    tree = ast.parse(Path(serve.__file__).read_text())
    imported = {
        a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    }
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported == {"__future__", "ctypes", "importlib", "os", "sys", "typing", "mxnet"}
    import mxnet

    assert serve.library_path() == mxnet.libinfo.find_lib_path()[0]
    monkeypatch.setenv("DMLC_ROLE", "worker")
    assert serve.main() == 2
    assert "needs DMLC_ROLE=scheduler or server (got 'worker')" in capsys.readouterr().err
