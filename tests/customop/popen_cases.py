"""Each Popen call of :data:`CASES` run twice, by Python's own ``Popen._execute_child`` (fork)
and by the ``fork`` patch's spawn path (glibc's posix_spawn), on any Python 3.8+: prints one
JSON line, ``{case: [path taken, same result?, fork's result, spawn's result]}``.

Run by tests/customop/test_subprocess.py in a child process (it starts processes).
"""

import inspect
import json
import os
import pathlib
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from customop.runtime import fork  # noqa: E402

ORIGINAL = subprocess.Popen._execute_child
SIGNATURE = inspect.signature(ORIGINAL)
taken = []


def spawn_when_possible(self, *args, **kwargs):
    call = SIGNATURE.bind(self, *args, **kwargs).arguments
    if fork._can_spawn(call):
        taken.append("spawn")
        return fork._spawn_child(**call)
    taken.append("fork")
    return ORIGINAL(self, *args, **kwargs)


TMP = tempfile.mkdtemp()
NOEXEC = os.path.join(TMP, "noexec")
SCRIPT = os.path.join(TMP, "script.sh")
with open(NOEXEC, "w") as f:
    f.write("#!/bin/sh\necho hi\n")
with open(SCRIPT, "w") as f:
    f.write("#!/bin/sh\necho script $PWD $A\n")
os.chmod(SCRIPT, 0o755)
_, KEPT = os.pipe()
os.set_inheritable(KEPT, True)
PY = sys.executable
HAS_FD = f"import os; print(os.path.exists('/proc/self/fd/{KEPT}'))"
SIGNALS = ["grep", "-E", "Sig(Ign|Blk)", "/proc/self/status"]


def run(*args, **kwargs):
    kwargs.setdefault("capture_output", True)
    return subprocess.run(*args, **kwargs)


def to_file():
    path = os.path.join(TMP, "out.txt")
    with open(path, "w") as out:
        code = subprocess.run(["echo", "to a file"], stdout=out).returncode
    with open(path) as f:
        return code, f.read()


CASES = {
    "pipes": lambda: run(
        [PY, "-c", "import sys; print(sys.stdin.read().upper()); print('err', file=sys.stderr)"],
        input=b"abc",
    ),
    "stderr=STDOUT": lambda: run(
        [PY, "-c", "import sys; print('o'); print('e', file=sys.stderr)"],
        capture_output=False,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    ),
    "stdin=DEVNULL": lambda: run(["cat"], stdin=subprocess.DEVNULL),
    "stdout to a file": to_file,
    "cwd": lambda: run([PY, "-c", "import os; print(os.getcwd())"], cwd=TMP),
    "cwd as a Path": lambda: run(["pwd"], cwd=pathlib.Path(TMP)),
    "env": lambda: run(["env"], env={"A": "1", "B": "x y"}),
    "PATH of env, relative to cwd": lambda: run(
        ["script.sh"], cwd=TMP, env={"PATH": "/no/such:.", "A": "a"}
    ),
    "PATH of the process": lambda: run(["echo", "on PATH"]),
    "close_fds=True": lambda: run([PY, "-c", HAS_FD]),
    "close_fds=False": lambda: run([PY, "-c", HAS_FD], close_fds=False),
    "restore_signals=True": lambda: run(SIGNALS),
    "restore_signals=False": lambda: run(SIGNALS, restore_signals=False),
    "start_new_session": lambda: run(
        [
            PY,
            "-c",
            f"import os; print(os.getsid(0) == os.getpid(), os.getsid(0) == {os.getsid(0)})",
        ],
        start_new_session=True,
    ),
    "same session": lambda: run([PY, "-c", f"import os; print(os.getsid(0) == {os.getsid(0)})"]),
    "shell=True": lambda: run("echo $((1+2)) | tr 3 x", shell=True),
    "shell with executable": lambda: run("echo $0", shell=True, executable="/bin/bash"),
    "executable=": lambda: run(["argv0", "-c", "import sys; print(sys.argv)"], executable=PY),
    "exit code": lambda: run([PY, "-c", "raise SystemExit(7)"]),
    "Popen": lambda: (lambda p: (p.pid > 0, p.wait(), p.returncode))(subprocess.Popen(["true"])),
    "path-like and bytes": lambda: run([pathlib.Path("/bin/echo"), b"b", "s"]),
    "missing on PATH": lambda: run(["no-such-command-xyz"]),
    "missing path": lambda: run(["/no/such/dir/cmd"]),
    "not executable": lambda: run([NOEXEC]),
    "a directory": lambda: run([TMP]),
    "missing cwd": lambda: run(["echo"], cwd="/no/such/dir"),
    "cwd is a file": lambda: run(["echo"], cwd=NOEXEC),
    "null byte in an argument": lambda: run(["echo", "a\0b"]),
    "null byte in env": lambda: run(["echo"], env={"A": "a\0b"}),
    "= in an env name": lambda: run(["echo"], env={"A=B": "1"}),
    "an int argument": lambda: run(["echo", 5]),
    "path-like args with shell": lambda: run(pathlib.Path("/bin/echo"), shell=True),
    "pass_fds (forks)": lambda: run([PY, "-c", HAS_FD], pass_fds=[KEPT]),
    "preexec_fn (forks)": lambda: run(["echo", "p"], preexec_fn=lambda: None),
    "stdout=0 (forks)": lambda: run(
        ["true"], capture_output=False, stdin=subprocess.PIPE, stdout=0
    ),
}


def result(fn):
    try:
        out = fn()
    except BaseException as exc:  # noqa: BLE001 - the outcome compared
        return ["raised", type(exc).__name__, str(exc)]
    if isinstance(out, subprocess.CompletedProcess):
        return ["ran", out.returncode, repr(out.stdout), repr(out.stderr)]
    return ["ran", repr(out)]


def main():
    report = {}
    for name, fn in CASES.items():
        subprocess.Popen._execute_child = ORIGINAL
        by_fork = result(fn)
        subprocess.Popen._execute_child = spawn_when_possible
        del taken[:]
        by_spawn = result(fn)
        subprocess.Popen._execute_child = ORIGINAL
        report[name] = ["/".join(taken) or "none", by_fork == by_spawn, by_fork, by_spawn]
    print(json.dumps(report))


if __name__ == "__main__":
    main()
