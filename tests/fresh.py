"""Fresh Python processes for tests, forked from a server that has imported MXNet.

``fresh.run([sys.executable, ...], ...)`` is ``subprocess.run`` for a test's child that
runs Python code (``-c``, ``-m`` or a script): a process of its own, with its own
arguments, environment, working directory, ``sys.path`` as a fresh interpreter sets it,
standard streams and time limit (``TimeoutExpired`` after it is killed, as
``subprocess.run``).  Only the start differs: the child is forked from a per-worker server
that has run ``import mxnet`` and nothing else (no customop, no ops, no MXNet operator
run), instead of a new interpreter paying MXNet's import again.  That import cost about
3 s of CPU each, in more than half of the suite's processes (docs/development.md, "The
suite's time").

What a child could tell apart from a new interpreter: MXNet and its dependencies are
imported already (a child asserting that ``import customop`` imports no MXNet needs a real
one), and interpreter options.  So a call falls back to ``subprocess.run`` when it passes
interpreter options, an environment whose MXNet, OpenMP or interpreter variables differ
from the server's (those are read when MXNet loads or Python starts), file objects as
streams, or ``real=True``.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading

# Variables read when Python starts or MXNet is loaded: a child whose value differs
# needs a process that starts with it.
_READ_AT_START = ("MXNET_", "DMLC_", "OMP_", "KMP_", "LD_", "MALLOC_", "PYTHON")
_ROOM_FOR_THE_CHILD = {"PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED"}

SERVER = r"""
import json, os, signal, socket, sys
for name in sys.argv[2].split(","):  # mxnet: the point of the server
    if name:
        __import__(name)

listener = socket.socket(fileno=int(sys.argv[1]))
listener.settimeout(2)
worker = os.getppid()
base_path = sys.path[1:]
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the waiters are reaped by the kernel


def child(req):
    import atexit, random, runpy, threading, traceback, types
    import numpy as np
    if req["session"]:
        os.setsid()
    for fd, (path, flags) in enumerate(((req["stdin"], os.O_RDONLY),
                                        (req["stdout"], os.O_WRONLY),
                                        (req["stderr"], os.O_WRONLY))):
        if fd == 2 and path == req["stdout"]:
            os.dup2(1, 2)  # stderr=STDOUT: one file, one offset
            continue
        opened = os.open(path, flags)
        os.dup2(opened, fd)
        os.close(opened)
    os.chdir(req["cwd"])
    if "multiprocessing.process" in sys.modules:  # read at its import, by spawn's children
        sys.modules["multiprocessing.process"].ORIGINAL_DIR = req["cwd"]
    os.environ.clear()
    os.environ.update(req["env"])
    sys.dont_write_bytecode = bool(req["env"].get("PYTHONDONTWRITEBYTECODE"))
    random.seed()
    np.random.seed()  # a new interpreter's streams differ per process
    how, what, args = req["how"], req["what"], req["args"]
    entry = "" if how == "-c" else os.getcwd() if how == "-m" else \
        os.path.dirname(os.path.realpath(what))
    extra = [os.path.abspath(p) for p in req["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [entry, *extra, *base_path]
    code = 0
    try:
        if how == "-c":
            sys.argv = ["-c", *args]
            main = types.ModuleType("__main__")
            sys.modules["__main__"] = main
            exec(compile(what, "<string>", "exec"), main.__dict__)
        elif how == "-m":
            sys.argv = [what, *args]
            runpy.run_module(what, run_name="__main__", alter_sys=True)
        else:
            sys.argv = [what, *args]
            runpy.run_path(what, run_name="__main__")
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException as exc:
        tb = exc.__traceback__.tb_next  # from the user's code on, as Python prints it
        while tb is not None and tb.tb_frame.f_code.co_filename == runpy.__file__:
            tb = tb.tb_next
        traceback.print_exception(type(exc), exc, tb)
        code = 1
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)


def waiter(conn):
    # forks the child and tells the test its pid, then how it ended
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    req = json.loads(conn.makefile("r").readline())
    pid = os.fork()
    if pid == 0:
        conn.close()
        listener.close()
        child(req)
    conn.sendall(b"%d\n" % pid)
    _, status = os.waitpid(pid, 0)
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    conn.sendall(b"%d\n" % code)
    os._exit(0)


while os.getppid() == worker:  # ends with the test worker that started it
    try:
        conn, _ = listener.accept()
    except socket.timeout:
        continue
    conn.settimeout(None)
    if os.fork() == 0:
        try:
            waiter(conn)
        finally:
            os._exit(1)
    conn.close()
"""

PRELOAD = ["mxnet"]  # what the server imports (its own tests need none of it)
_lock = threading.Lock()
_server: dict = {}


def _address() -> str:
    with _lock:
        proc = _server.get("proc")
        if proc is None or proc.poll() is not None:
            room = tempfile.mkdtemp(prefix="customop-fresh-")
            address = os.path.join(room, "server")
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(address)
            listener.listen(64)
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            proc = subprocess.Popen(
                [sys.executable, "-c", SERVER, str(listener.fileno()), ",".join(PRELOAD)],
                pass_fds=[listener.fileno()],
                cwd="/",
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
            )
            listener.close()
            atexit.register(proc.kill)
            atexit.register(shutil.rmtree, room, True)
            _server.update(proc=proc, address=address, env=env)
        return _server["address"]


def _needs_a_new_interpreter(args, env) -> bool:
    if len(args) < 2 or args[0] != sys.executable:
        return True
    if args[1].startswith("-") and args[1] not in ("-c", "-m"):
        return True  # interpreter options
    with _lock:
        server_env = _server.get("env") or {
            k: v for k, v in os.environ.items() if k != "PYTHONPATH"
        }
    for key in set(env) | set(server_env):
        if (
            key.startswith(_READ_AT_START)
            and key not in _ROOM_FOR_THE_CHILD
            and env.get(key) != server_env.get(key)
        ):
            return True
    return False


def run(
    args,
    *,
    env=None,
    cwd=None,
    timeout=None,
    input=None,
    capture_output=False,
    text=False,
    check=False,
    start_new_session=False,
    stderr=None,
    real=False,
    **kwargs,
) -> subprocess.CompletedProcess:
    """``subprocess.run(args, ...)`` for a Python child (see the module docstring).

    ``stderr=subprocess.STDOUT`` merges the streams; with ``start_new_session`` a timeout
    kills the child's whole process group, as a test that kills its session does.
    """
    env = dict(os.environ if env is None else env)
    if (
        real
        or kwargs
        or stderr not in (None, subprocess.STDOUT)
        or _needs_a_new_interpreter(list(args), env)
    ):
        return _new_interpreter(
            args,
            env=env,
            cwd=cwd,
            timeout=timeout,
            input=input,
            capture_output=capture_output,
            text=text,
            check=check,
            start_new_session=start_new_session,
            stderr=stderr,
            **kwargs,
        )
    args = [str(a) for a in args]
    how, what, rest = (
        (args[1], args[2], args[3:]) if args[1] in ("-c", "-m") else ("script", args[1], args[2:])
    )
    with tempfile.TemporaryDirectory(prefix="customop-child-") as room:
        streams = {name: os.path.join(room, name) for name in ("stdin", "stdout", "stderr")}
        if stderr == subprocess.STDOUT:
            streams["stderr"] = streams["stdout"]
        data = input.encode() if isinstance(input, str) else (input or b"")
        with open(streams["stdin"], "wb") as f:
            f.write(data)
        for name in ("stdout", "stderr"):
            open(streams[name], "wb").close()
        request = dict(
            how=how,
            what=what,
            args=rest,
            env=env,
            session=start_new_session,
            cwd=os.path.abspath(cwd or os.getcwd()),
            **streams,
        )
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(_address())
        try:
            conn.sendall(json.dumps(request).encode() + b"\n")
            replies = _Lines(conn)
            pid = replies.next(None)
            try:
                code = replies.next(timeout)
            except socket.timeout:
                (os.killpg if start_new_session else os.kill)(pid, signal.SIGKILL)
                replies.next(None)
                out, err = (_read(streams[n], text) for n in ("stdout", "stderr"))
                raise subprocess.TimeoutExpired(args, timeout, output=out, stderr=err) from None
        finally:
            conn.close()
        out, err = (_read(streams[n], text) for n in ("stdout", "stderr"))
    if stderr == subprocess.STDOUT:
        err = None
    elif not capture_output:
        for data, stream in ((out, sys.stdout), (err, sys.stderr)):
            stream.write(data if text else data.decode(errors="replace"))
        out = err = None
    done = subprocess.CompletedProcess(args, code, out, err)
    if check:
        done.check_returncode()
    return done


def run_json(args, *, cwd, env=None, timeout=120):
    """Run a Python child (as :func:`run`) that must succeed; the JSON its last line prints."""
    done = run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _new_interpreter(
    args, *, timeout, input, capture_output, check, stderr, start_new_session, **kwargs
) -> subprocess.CompletedProcess:
    # subprocess.run, but a timeout kills the whole session when it started one
    if stderr is not None:
        kwargs.update(stdout=subprocess.PIPE, stderr=stderr)
    elif capture_output:
        kwargs.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    with subprocess.Popen(
        args,
        stdin=subprocess.PIPE if input is not None else None,
        start_new_session=start_new_session,
        **kwargs,
    ) as proc:
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            (os.killpg if start_new_session else os.kill)(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise subprocess.TimeoutExpired(args, timeout, output=out, stderr=err) from None
    done = subprocess.CompletedProcess(args, proc.returncode, out, err)
    if check:
        done.check_returncode()
    return done


def _read(path: str, text: bool):
    with open(path, "rb") as f:
        data = f.read()
    return data.decode(errors="replace") if text else data


class _Lines:
    """The server's replies, a number a line (a timeout leaves the socket usable)."""

    def __init__(self, conn: socket.socket):
        self.conn, self.buffer = conn, b""

    def next(self, timeout) -> int:
        self.conn.settimeout(timeout)
        while b"\n" not in self.buffer:
            data = self.conn.recv(64)
            if not data:
                raise RuntimeError("tests/fresh.py: the fork server closed the connection")
            self.buffer += data
        line, self.buffer = self.buffer.split(b"\n", 1)
        return int(line)
