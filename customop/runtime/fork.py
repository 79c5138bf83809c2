"""The ``fork`` patch: ``fork()`` and exit never wait for a callback that needs the GIL.

Off-switch: ``CUSTOMOP_RUNTIME_OFF=fork``; installed by the first call of a decorated op.

``os.register_at_fork(before=...)`` and ``atexit`` run MXNet's own fork
"prepare" and "parent" steps (``mxnet::pthread_atfork_prepare`` /
``pthread_atfork_parent``, exported by ``libmxnet.so``) once more, through
ctypes, so with the GIL released.  MXNet's prepare step, which also runs
inside every ``fork()``, joins its engine and CustomOp worker threads while
the forking thread holds the GIL; a Python callback still pending there (a
forward, or the deleter of a finished op, which MXNet's engine runs *after*
``waitall()`` returns) waits for the GIL forever (DataLoader workers, ``os.fork``
and ``subprocess`` hung after training calls; bounded waits for the deleters lost
the race under load; measured: docs/design.md, *Errors and threads*, *fork*).  Run
first with the GIL released, the same step drains the queues and *joins* those
threads, so every pending callback has finished when it returns, by construction
rather than by timing; the parent step starts fresh, idle threads, and the prepare
step inside ``fork()`` then has nothing left that needs Python.  Costs one engine
stop/start per fork (and at exit) in processes that ran a decorated op.  On Python < 3.10,
``subprocess`` forks without running ``os.register_at_fork`` handlers, so
``subprocess.Popen._execute_child`` runs the same step first.  Forks go one at a
time (a lock from the step before a fork to the fork's end): two threads forking at once
stopped MXNet's engine twice and hung.

That step stops MXNet's engine, and a thread that keeps pushing operations meanwhile (a
training thread beside one that shells out: a logger, a loader, ``git`` or ``nvidia-smi``)
still hung ``subprocess`` on Python 3.8 and 3.9, with MXNet's own operators too.  So there,
``subprocess.Popen`` starts a child that only execs without ``fork()``: through glibc's
``posix_spawn`` (clone with ``CLONE_VM | CLONE_VFORK``, which runs no ``pthread_atfork``
handler, so MXNet's engine is never stopped), as Python 3.10+ does with ``vfork``.  The
call keeps Popen's meaning (pipes, ``cwd``, ``env``, ``close_fds``, ``restore_signals``,
``start_new_session``, the PATH search, the exception of a failed exec); a call that asks
for what ``posix_spawn`` cannot do (``preexec_fn``, ``pass_fds``, ``user``/``group``/
``extra_groups``/``umask``, standard streams swapped among 0-2, a libc other than glibc
>= 2.24 or without the symbols the call needs) settles the engine and forks as above
(measured: docs/design.md, *Errors and threads*, *subprocess beside training*).
"""

from __future__ import annotations

import atexit
import ctypes
import errno
import functools
import inspect
import os
import signal
import stat
import subprocess
import sys
import threading

import mxnet as mx
from mxnet.base import _LIB

from . import MXNET_FORK_STEPS


@functools.lru_cache(maxsize=None)
def _fork_steps():
    try:
        steps = [getattr(_LIB, name) for name in MXNET_FORK_STEPS]
    except AttributeError:  # pragma: no cover - another build of MXNet
        return None
    for step in steps:
        step.restype = None
    return steps


def settle() -> None:
    """Finish every pending MXNet callback and join MXNet's worker threads, GIL released."""
    try:
        mx.nd.waitall()  # nothing may reach the CustomOp queue once its thread has stopped
    except Exception:  # noqa: BLE001 - the failure stays with MXNet's arrays; fork must go on
        pass
    steps = _fork_steps()
    if steps is None:  # pragma: no cover
        return
    prepare, parent = steps
    prepare()  # a ctypes call: the GIL is released while MXNet joins its threads
    parent()


# One fork at a time: a thread's settle() (MXNet's prepare step, GIL released) beside another
# thread's fork() (the same step inside it) stops MXNet's engine twice, and both wait forever
# (measured: two threads starting subprocesses at once hung a Python 3.8 test run).
_forking = threading.RLock()


def _before_fork() -> None:
    _forking.acquire()
    settle()


def _after_fork_in_parent() -> None:
    _forking.release()


def _after_fork_in_child() -> None:
    global _forking
    _forking = threading.RLock()  # the child has one thread: the one that forked


# --- Python < 3.10: subprocess children start without fork() ----------------------------

# <spawn.h> (glibc): posix_spawnattr_t flags
_POSIX_SPAWN_SETSIGDEF = 0x04
_POSIX_SPAWN_SETSID = 0x80


class _Glibc:
    """glibc's posix_spawn and the helpers a Popen call needs; ``chdir``, ``closefrom`` and
    ``setsid`` say which optional ones this glibc has."""

    def __init__(self, libc: ctypes.CDLL, version: tuple) -> None:
        vp, cp, i = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int
        self.spawn = libc.posix_spawn
        self.spawn.argtypes = [ctypes.POINTER(ctypes.c_int), cp, vp, vp, vp, vp]
        for name, args in (
            ("posix_spawn_file_actions_init", [vp]),
            ("posix_spawn_file_actions_destroy", [vp]),
            ("posix_spawn_file_actions_addclose", [vp, i]),
            ("posix_spawn_file_actions_adddup2", [vp, i, i]),
            ("posix_spawnattr_init", [vp]),
            ("posix_spawnattr_destroy", [vp]),
            ("posix_spawnattr_setflags", [vp, ctypes.c_short]),
            ("posix_spawnattr_setsigdefault", [vp, vp]),
        ):
            setattr(self, name, getattr(libc, name))
            getattr(self, name).argtypes = args
        self.chdir = getattr(libc, "posix_spawn_file_actions_addchdir_np", None)  # 2.29
        if self.chdir is not None:
            self.chdir.argtypes = [vp, cp]
        self.closefrom = getattr(libc, "posix_spawn_file_actions_addclosefrom_np", None)  # 2.34
        if self.closefrom is not None:
            self.closefrom.argtypes = [vp, i]
        self.setsid = version >= (2, 26)
        self.dup2_clears_cloexec = version >= (2, 29)  # dup2(fd, fd) makes fd inheritable
        self.environ = ctypes.c_void_p.in_dll(libc, "environ")
        self.internal_signals = range(32, getattr(libc, "__libc_current_sigrtmin")())

    def internal_signals_to_reset(self) -> list:
        """glibc's own signals (32 up to SIGRTMIN) that this process does not ignore: glibc's
        posix_spawn makes them ignored in the child, and SIG_IGN outlives exec, whereas a
        forked child execs with the parent's (sigaction refuses to read them: /proc does)."""
        try:
            with open("/proc/self/status", "rb") as status:
                ignored = next(
                    int(line.split()[1], 16) for line in status if line.startswith(b"SigIgn:")
                )
        except (OSError, StopIteration, ValueError):  # pragma: no cover - no /proc
            ignored = 0
        return [sig for sig in self.internal_signals if not ignored >> (sig - 1) & 1]


@functools.lru_cache(maxsize=None)
def _glibc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        name, number = os.confstr("CS_GNU_LIBC_VERSION").split()  # 'glibc 2.36'
        version = tuple(int(part) for part in number.split(".")[:2])
    except (AttributeError, OSError, ValueError):  # another libc (musl), or none reported
        return None
    if name != "glibc" or version < (2, 24):  # older: may fork, loses the exec error
        return None
    try:
        return _Glibc(ctypes.CDLL(None, use_errno=True), version)
    except (AttributeError, OSError):  # pragma: no cover - a stripped libc
        return None


def _can_spawn(call: dict) -> bool:
    """Whether posix_spawn can do all that this ``Popen._execute_child`` call asks."""
    lib = _glibc()
    if (
        lib is None
        or call["preexec_fn"] is not None
        or call["pass_fds"]
        or call.get("gid") is not None
        or call.get("gids") is not None
        or call.get("uid") is not None
        or call.get("umask", -1) >= 0  # Python 3.9
        or (call["close_fds"] and lib.closefrom is None)
        or (call["cwd"] is not None and lib.chdir is None)
        or (call["start_new_session"] and not lib.setsid)
    ):
        return False
    written = {}  # the dup2 actions run in this order: no source may be a target written before
    for fd, target in ((call["p2cread"], 0), (call["c2pwrite"], 1), (call["errwrite"], 2)):
        if fd != -1:
            if written.get(fd, fd) != fd or (fd == target and not lib.dup2_clears_cloexec):
                return False
            written[target] = fd
    return True


def _fsencode(value) -> bytes:
    encoded = os.fsencode(value)
    if b"\0" in encoded:
        raise ValueError("embedded null byte")
    return encoded


def _char_pp(items: list):
    return (ctypes.c_char_p * (len(items) + 1))(*items, None)


def _spawn_child(
    self,
    args,
    executable,
    close_fds,
    cwd,
    env,
    shell,
    p2cread,
    p2cwrite,
    c2pread,
    c2pwrite,
    errread,
    errwrite,
    restore_signals,
    start_new_session,
    **_unused,
) -> None:
    """``Popen._execute_child`` (CPython 3.8/3.9, POSIX) through posix_spawn, for a call
    :func:`_can_spawn` accepts: the same arguments, PATH search, pid, pipes and errors."""
    if isinstance(args, (str, bytes)):  # Popen's own preamble, as in CPython 3.8 and 3.9
        args = [args]
    elif isinstance(args, os.PathLike):
        if shell:
            raise TypeError("path-like args is not allowed when shell is true")
        args = [args]
    else:
        args = list(args)
    if shell:
        unix_shell = "/system/bin/sh" if hasattr(sys, "getandroidapilevel") else "/bin/sh"
        args = [unix_shell, "-c"] + args
        if executable:
            args[0] = executable
    if executable is None:
        executable = args[0]
    sys.audit("subprocess.Popen", executable, args, cwd, env)

    if env is not None:
        env_list = []
        for key, value in env.items():
            key = _fsencode(key)
            if b"=" in key:
                raise ValueError("illegal environment variable name")
            env_list.append(key + b"=" + _fsencode(value))
    exe = _fsencode(executable)
    if os.path.dirname(exe):
        candidates = [exe]
    else:  # Popen's (and os._execvpe's) PATH search, from the child's environment
        candidates = [os.path.join(os.fsencode(d), exe) for d in os.get_exec_path(env)]
    argv = _char_pp([_fsencode(arg) for arg in args])
    envp = _char_pp(env_list) if env is not None else None
    cwd_bytes = _fsencode(cwd) if cwd is not None else None

    lib = _glibc()
    actions = (ctypes.c_uint64 * 32)()  # posix_spawn_file_actions_t: 80 bytes on x86-64
    attr = (ctypes.c_uint64 * 64)()  # posix_spawnattr_t: 336 bytes
    sigdef = (ctypes.c_ulong * (1024 // (8 * ctypes.sizeof(ctypes.c_ulong))))()  # sigset_t
    lib.posix_spawn_file_actions_init(actions)
    lib.posix_spawnattr_init(attr)
    try:
        # What CPython's child does after fork() (Modules/_posixsubprocess.c), in its order
        for fd in (p2cwrite, c2pread, errread):
            if fd != -1:
                lib.posix_spawn_file_actions_addclose(actions, fd)
        for fd, target in ((p2cread, 0), (c2pwrite, 1), (errwrite, 2)):
            if fd != -1:  # fd == target: glibc >= 2.29 clears FD_CLOEXEC, as Python does
                lib.posix_spawn_file_actions_adddup2(actions, fd, target)
        if close_fds:
            lib.closefrom(actions, 3)
        else:
            for fd in {fd for fd in (p2cread, c2pwrite, errwrite) if fd > 2}:
                lib.posix_spawn_file_actions_addclose(actions, fd)
        if cwd_bytes is not None:
            lib.chdir(actions, cwd_bytes)
        defaults = lib.internal_signals_to_reset()
        if restore_signals:  # Python's _Py_RestoreSignals
            defaults += [
                getattr(signal, name)
                for name in ("SIGPIPE", "SIGXFZ", "SIGXFSZ")
                if hasattr(signal, name)
            ]
        bits = 8 * ctypes.sizeof(ctypes.c_ulong)
        for signum in defaults:  # sigset_t's layout: sigaddset refuses glibc's own signals
            sigdef[(signum - 1) // bits] |= 1 << ((signum - 1) % bits)
        lib.posix_spawnattr_setsigdefault(attr, sigdef)
        flags = _POSIX_SPAWN_SETSIGDEF
        if start_new_session:
            flags |= _POSIX_SPAWN_SETSID
        lib.posix_spawnattr_setflags(attr, flags)

        pid = ctypes.c_int()
        first = 0
        error = errno.ENOENT
        for candidate in candidates:  # the first error that is not "no such file" is reported
            if cwd is None or os.path.isabs(candidate):
                try:
                    os.stat(candidate)
                except (FileNotFoundError, NotADirectoryError) as exc:
                    error = exc.errno  # what exec would say, without a child to hear it
                    continue
                except OSError:
                    pass
            error = lib.spawn(
                ctypes.byref(pid),
                candidate,
                actions,
                attr,
                argv,
                envp if envp is not None else lib.environ.value,
            )
            if error == 0:
                break
            if error not in (errno.ENOENT, errno.ENOTDIR) and not first:
                first = error
    finally:
        lib.posix_spawn_file_actions_destroy(actions)
        lib.posix_spawnattr_destroy(attr)
    if error:
        error = first or error
        filename = executable
        if cwd is not None and _chdir_fails(cwd_bytes):
            error, filename = _chdir_fails(cwd_bytes), cwd
        raise OSError(error, os.strerror(error), filename)
    self.pid = pid.value
    self._child_created = True
    self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)


def _chdir_fails(path: bytes) -> int:
    """The errno ``chdir(path)`` would fail with, or 0 (posix_spawn reports one errno for the
    chdir and the exec; Popen names ``cwd`` for the first, the executable for the second)."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        return exc.errno or errno.ENOENT
    if not stat.S_ISDIR(mode):
        return errno.ENOTDIR
    return 0 if os.access(path, os.X_OK) else errno.EACCES


def install() -> None:
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=_after_fork_in_parent,
        after_in_child=_after_fork_in_child,
    )
    atexit.register(settle)
    if sys.version_info < (3, 10):  # noqa: UP036 - Python 3.8 and 3.9 are supported
        execute_child = subprocess.Popen._execute_child
        signature = inspect.signature(execute_child)

        def _execute_child(self, *args, **kwargs):
            call = signature.bind(self, *args, **kwargs).arguments
            if _can_spawn(call):
                return _spawn_child(**call)
            with _forking:
                settle()
                return execute_child(self, *args, **kwargs)

        subprocess.Popen._execute_child = _execute_child
