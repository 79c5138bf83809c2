"""The one place that starts (and always ends) a distributed MXNet job.

MXNet's ``dist_sync``/``dist_async`` kvstore runs a scheduler, servers and
workers that find each other through ``DMLC_*`` environment variables (the
protocol of ``dmlc_tracker``, shipped in the wheel).  The wheel's own
``tools/launch.py`` does not run on Python >= 3.9 (``Thread.isAlive``), and when a
worker fails the others, the servers and the scheduler wait for it forever.
This launcher starts every process itself, on 127.0.0.1 only (``--launcher
local``), each in its own process group, and **fails fast**: as soon as a worker
exits non-zero it ends the whole job, names the worker, shows the end of its
error output and exits 1.  Every wait is bounded (``--timeout``).

Usage::

    python -m customop.distributed.launch -n 2 -s 1 [--launcher local] [--timeout 600] \\
        python examples/dist_train.py --kvstore dist_sync

Other ``--launcher`` values (``ssh``, ``mpi``, ``sge``, ``yarn``) are handed to
MXNet's ``tools/launch.py`` with the Python 3.11 fix applied; they do not fail fast.
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Sequence

__all__ = ["main", "run_local", "exit_on_error"]

LOOPBACK = "127.0.0.1"
TAG = "CUSTOMOP_LAUNCH_JOB"  # set in every process of a job: tests find leftovers by it
# scheduler and servers: MXNet's C calls without its Python package (serve.py: 3.5 s of CPU
# less each); run by its path, so that it needs neither customop on the path nor its import
_SERVE = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "serve.py")]


class _Proc:
    """One started process: its role, a tail of its stderr (echoed live) and its exit."""

    def __init__(self, role: str, index: int, cmd: Sequence[str], env: dict[str, str], tail: int):
        self.role, self.index = role, index
        self.name = role if role == "scheduler" else f"{role} {index}"
        self.tail: collections.deque[str] = collections.deque(maxlen=tail)
        self.popen = subprocess.Popen(
            list(cmd),
            env=env,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.reader = threading.Thread(target=self._echo, daemon=True)
        self.reader.start()

    def _echo(self) -> None:
        for raw in iter(self.popen.stderr.readline, b""):
            self.tail.append(raw.decode(errors="replace"))
            try:
                sys.stderr.write(raw.decode(errors="replace"))
                sys.stderr.flush()
            except (OSError, ValueError):
                pass

    def poll(self) -> int | None:
        return self.popen.poll()

    def end(self, grace: float) -> None:
        """SIGTERM the process group, SIGKILL it after ``grace`` seconds; reap."""
        pgid = self.popen.pid  # start_new_session: the group id is the pid
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, grace)):
            try:
                os.killpg(pgid, sig)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                self.popen.wait(wait)
            except subprocess.TimeoutExpired:
                continue
            if sig is signal.SIGTERM:  # the leader is gone; end what it left in its group
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            break
        self.reader.join(grace)

    def describe_exit(self) -> str:
        rc = self.popen.returncode
        if rc is not None and rc < 0:
            try:
                return f"was killed by {signal.Signals(-rc).name}"
            except ValueError:
                return f"was killed by signal {-rc}"
        return f"exited with code {rc}"


def free_port(host: str = LOOPBACK) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def job_env(num_workers: int, num_servers: int, port: int, job: str) -> dict[str, str]:
    """The environment every process of a local job shares (loopback only)."""
    env = dict(os.environ)
    env.update(
        DMLC_PS_ROOT_URI=LOOPBACK,
        DMLC_PS_ROOT_PORT=str(port),
        DMLC_NODE_HOST=LOOPBACK,
        DMLC_NUM_WORKER=str(num_workers),
        DMLC_NUM_SERVER=str(num_servers),
        DMLC_JOB_CLUSTER="local",
    )
    env[TAG] = job
    # Workers start with worker_site/sitecustomize.py: an uncaught exception exits 1 at once.
    site = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker_site")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (site, env.get("PYTHONPATH")) if p)
    return env


def run_local(
    command: Sequence[str],
    num_workers: int,
    num_servers: int,
    timeout: float | None = None,
    grace: float = 5.0,
    tail: int = 30,
    port: int | None = None,
) -> int:
    """Run a local ``dist_*`` job; return 0 when every worker exits 0, else 1 (after ending it)."""
    if num_workers < 1 or num_servers < 1:
        raise ValueError(
            "customop.distributed.launch: need at least one worker (-n) and one server (-s)"
        )
    if not command:
        raise ValueError("customop.distributed.launch: no COMMAND to run on the workers")
    job = uuid.uuid4().hex
    env = job_env(num_workers, num_servers, port or free_port(), job)
    procs: list[_Proc] = []
    deadline = None if timeout is None else time.monotonic() + timeout
    failed: _Proc | None = None
    reason = ""

    def start(role: str, index: int, cmd: Sequence[str]) -> _Proc:
        proc = _Proc(role, index, cmd, {**env, "DMLC_ROLE": role, "DMLC_TASK_ID": str(index)}, tail)
        procs.append(proc)
        return proc

    previous = (
        signal.signal(signal.SIGTERM, _raise_interrupt)
        if threading.current_thread() is threading.main_thread()
        else None
    )
    try:
        start("scheduler", 0, _SERVE)
        for i in range(num_servers):
            start("server", i, _SERVE)
        workers = [start("worker", i, command) for i in range(num_workers)]
        while True:
            codes = [w.poll() for w in workers]
            bad = [w for w, rc in zip(workers, codes) if rc not in (None, 0)]
            if bad:
                failed, reason = bad[0], "failed"
                break
            others = [p for p in procs if p.role != "worker" and p.poll() not in (None, 0)]
            if others and any(rc is None for rc in codes):
                failed, reason = others[0], "failed before the workers finished"
                break
            if all(rc == 0 for rc in codes):
                # The scheduler and servers leave once every worker has finalised.
                end = time.monotonic() + grace
                while time.monotonic() < end and any(p.poll() is None for p in procs):
                    time.sleep(0.05)
                break
            if deadline is not None and time.monotonic() > deadline:
                reason = f"timed out after {timeout:g} s"
                break
            time.sleep(0.05)
    except KeyboardInterrupt:
        reason = "interrupted"
    finally:
        for proc in procs:
            if proc.poll() is None or proc.reader.is_alive():
                proc.end(grace)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if failed is not None:
        _report(
            f"{failed.name} of {num_workers if failed.role == 'worker' else num_servers} "
            f"(pid {failed.popen.pid}) {failed.describe_exit()}; the job was stopped "
            "and every process it started was ended",
            failed,
        )
        return 1
    if reason:
        _report(f"job {reason}; every process it started was ended", None)
        return 1
    return 0


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def _report(message: str, proc: _Proc | None) -> None:
    lines = [f"customop.distributed.launch: {message}"]
    if proc is not None:
        text = "".join(proc.tail).rstrip()
        lines.append(
            f"--- last lines of {proc.name}'s error output ---"
            if text
            else f"--- {proc.name} wrote nothing to stderr ---"
        )
        if text:
            lines.append(text)
    print("\n".join(lines), file=sys.stderr, flush=True)


def exit_on_error() -> None:
    """Make an uncaught exception end this worker with exit code 1.

    Workers started by this launcher get it at start-up; call it yourself in a
    worker started some other way.

    Without it, a ``dist_*`` worker that raises prints its traceback and then dies
    with SIGABRT (``terminate called without an active exception``) while MXNet's
    kvstore threads shut down.  With it, the traceback is printed and the process
    leaves at once through ``os._exit(1)`` (the launcher then ends the job).
    """

    def hook(kind, value, tb):
        traceback.print_exception(kind, value, tb)
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(1)

    sys.excepthook = hook


def main(argv: Sequence[str] | None = None) -> int:
    """The command line, ``python -m customop.distributed.launch -n N [-s S] COMMAND ...``.

    Returns the job's exit status: 0 when every worker exited 0, 1 when one failed (the
    job is ended and the worker named), 2 for a usage error.
    """
    parser = argparse.ArgumentParser(
        prog="python -m customop.distributed.launch",
        description="Start a distributed MXNet job (scheduler, servers, workers); fail fast.",
    )
    parser.add_argument("-n", "--num-workers", type=int, required=True)
    parser.add_argument(
        "-s", "--num-servers", type=int, default=None, help="default: the number of workers"
    )
    parser.add_argument(
        "--launcher",
        default="local",
        help="'local' (this launcher, 127.0.0.1 only) or one of MXNet's "
        "(ssh, mpi, sge, yarn: handed to mxnet/tools/launch.py)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="end the job after this many seconds (default: no limit)",
    )
    parser.add_argument("--port", type=int, default=None, help="scheduler port (default: free)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the worker command")
    args, rest = parser.parse_known_args(argv)
    servers = args.num_servers if args.num_servers is not None else args.num_workers
    if args.launcher != "local":
        import runpy

        import mxnet

        from .. import runtime

        runtime.install("isAlive")
        tool = os.path.join(os.path.dirname(mxnet.__file__), "tools", "launch.py")
        sys.argv = [
            tool,
            "-n",
            str(args.num_workers),
            "-s",
            str(servers),
            "--launcher",
            args.launcher,
            *rest,
            *args.command,
        ]
        runpy.run_path(tool, run_name="__main__")
        return 0
    if rest:
        parser.error(f"unknown options {' '.join(rest)} (with --launcher local)")
    if not args.command:
        parser.error("no COMMAND given")
    try:
        return run_local(
            args.command, args.num_workers, servers, timeout=args.timeout, port=args.port
        )
    except ValueError as exc:
        parser.error(str(exc))
        return 2


if __name__ == "__main__":
    sys.exit(main())
