"""The one place gpusched runs external commands and touches other processes (STYLE #8).

- :func:`run` runs a command to completion, logs it at DEBUG and raises
  :class:`~gpusched.errors.CommandFailed` (command, exit code, stderr) when it fails.
- :func:`spawn` starts a detached process in its own session, and remembers it so that
  :func:`is_alive` reaps it once it ends (no zombies, whichever executor object asks).
- The rest answers "is that still the process (group) we started?" without being fooled
  by PID reuse: a process is named by its pid *and* its start time.

No other module imports :mod:`subprocess`; no function here configures logging.
"""

from __future__ import annotations

import errno
import logging
import os
import shlex
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any

from gpusched.errors import CommandFailed
from gpusched.procfs import _HAVE_PROC, SAME_START_S, _environ, _stat, in_groups, started_at

log = logging.getLogger(__name__)

#: Children started by :func:`spawn` that may not have been reaped yet, by pid.
_children: dict[int, Child] = {}


def run(
    cmd: Sequence[str],
    *,
    check: bool = True,
    timeout: float | None = 30.0,
    env: Mapping[str, str] | None = None,
    input: str | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` to completion and return its result (stdout and stderr as text).

    ``env`` replaces the environment (None: inherit this process's); stdin is empty unless
    ``input`` is given. Raises :class:`CommandFailed` when the command exits non-zero and
    ``check``, when it outlives ``timeout`` seconds (code 124, the child is killed) and when
    the program does not exist (code 127), so callers handle one error type.
    """
    argv = [os.fspath(c) for c in cmd]
    if log.isEnabledFor(logging.DEBUG):
        log.debug("run: %s", shlex.join(argv))
    stdin: dict[str, Any] = {"input": input} if input is not None else {"stdin": subprocess.DEVNULL}
    try:
        r = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            encoding="utf-8",
            errors="replace",
            timeout=timeout,
            env=None if env is None else dict(env),
            cwd=cwd,
            check=False,
            **stdin,
        )
    except FileNotFoundError as e:
        raise CommandFailed(argv, 127, f"{argv[0]}: not found ({e.strerror})") from e
    except subprocess.TimeoutExpired as e:
        raise CommandFailed(argv, 124, f"timed out after {timeout} s") from e
    if check and r.returncode != 0:
        raise CommandFailed(argv, r.returncode, r.stderr)
    return r


class Child:
    """A process started by :func:`spawn`: its pid, and ``poll``/``wait`` that reap it (the
    part of :class:`subprocess.Popen` the daemon needs, without its cost per start)."""

    __slots__ = ("pid", "returncode")

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """The exit status once it has ended (reaping it), else None."""
        if self.returncode is None:
            self._reaped(os.waitpid(self.pid, os.WNOHANG))
        return self.returncode

    def wait(self) -> int:
        while self.returncode is None:
            self._reaped(os.waitpid(self.pid, 0))
        return self.returncode

    def _reaped(self, waited: tuple[int, int]) -> None:
        if waited[0] == self.pid:
            self.returncode = os.waitstatus_to_exitcode(waited[1])


def spawn(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    stdin: int | None = None,
    stdout: IO[Any] | int | None = None,
    stderr: IO[Any] | int | None = None,
) -> Child:
    """Start ``argv`` in a new session and return once it has been exec'd.

    The child leads its own session and process group (so :func:`signal_group` reaches all
    of it), has no controlling terminal (a logout's SIGHUP does not reach it), reads the file
    descriptor ``stdin`` (default /dev/null), writes to ``stdout``/``stderr`` (a file or a
    descriptor; default /dev/null) and inherits no other file descriptor (Python opens
    every other one close-on-exec). It runs in this process's
    working directory; ``env`` replaces the environment. It is started with posix_spawn
    (vfork + exec: ~0.4 ms from a 35 MiB daemon, a third of :class:`subprocess.Popen`'s
    cost), which is what a thousand short jobs' dispatch is made of; a program named without
    a slash is looked up on PATH once (:func:`_on_path`), not by the child at every spawn.
    The child is remembered until :func:`is_alive` (or :func:`reap`) sees it end; each
    spawn first reaps the children that ended, so a night of 10k jobs leaves neither 10k
    zombies nor 10k remembered children (the scheduler learns of an end from exit.json and
    seldom asks :func:`is_alive` about it again).
    Raises :class:`CommandFailed` (code 127) when the program cannot be started.
    """
    reap()
    args = [os.fspath(a) for a in argv]
    if log.isEnabledFor(logging.DEBUG):
        log.debug("spawn: %s", shlex.join(args))
    actions: list[tuple[Any, ...]] = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0)
        if stdin is None
        else (os.POSIX_SPAWN_DUP2, stdin, 0)
    ]
    for fd, target in ((1, stdout), (2, stderr)):
        if target is None:
            actions.append((os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_WRONLY, 0))
        else:
            actions.append((os.POSIX_SPAWN_DUP2, target if isinstance(target, int) else target.fileno(), fd))
    found = _on_path(args[0])
    # not found: posix_spawnp searches PATH itself, and says why nothing there can be started
    spawn_fn, program = (os.posix_spawnp, args[0]) if found is None else (os.posix_spawn, found)
    try:
        pid = spawn_fn(
            program,
            args,
            os.environ if env is None else env,
            file_actions=actions,
            setsid=True,
            setsigdef=IGNORED_HERE,
        )
    except OSError as e:
        _found.clear()  # (a program found before may have moved: look again next time)
        raise CommandFailed(args, 127, f"{args[0]}: cannot start ({e.strerror})") from e
    child = _children[pid] = Child(pid)
    return child


#: Signals ignored in gpusched's processes, which a process they start would otherwise inherit
#: ignored: Python ignores SIGPIPE and SIGXFSZ at its start (a job's ``yes | head`` would fail
#: with "Broken pipe"), the daemon SIGHUP (to outlive its user's logout; a wrapper that ignored
#: it could not say that ``kill -HUP`` stopped its job). At their defaults in the child.
IGNORED_HERE = (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGHUP)

#: Programs found on PATH: (name, PATH) -> the file. posix_spawnp would search PATH in the
#: child on every spawn, one failing exec per directory before the program's, while the
#: parent waits for the child's exec (~45 us of a ~360 us spawn with sh eighth on PATH, as
#: behind a conda environment's and a user's own directories).
_found: dict[tuple[str, str], str] = {}


def _on_path(name: str) -> str | None:
    """``name`` as posix_spawnp would find it on this process's PATH (itself when it names a
    file, with a slash), or None when it is not there. Looked up once per PATH."""
    if "/" in name:
        return name
    key = (name, os.environ.get("PATH", os.defpath))
    found = _found.get(key)
    if found is None:
        import shutil

        found = shutil.which(name, path=key[1])
        if found is None:
            return None
        _found[key] = found
    return found


def reap() -> None:
    """Collect every spawned child that has ended (one non-blocking wait each)."""
    for pid, child in list(_children.items()):
        if child.poll() is not None:
            del _children[pid]


# ---------------------------------------------------------------------- process facts


def is_alive(pid: int | None, started: float | None) -> bool:
    """True while ``pid`` runs and is the process that started at ``started`` (within
    :data:`SAME_START_S`; ``started`` None skips that check). Zombies count as dead. A child
    of :func:`spawn` is polled, which also reaps it once it has ended."""
    if not pid:
        return False
    child = _children.get(int(pid))
    if child is not None:
        if child.poll() is None:
            return True  # an unreaped child's pid cannot have been reused
        del _children[int(pid)]
        return False
    now = started_at(int(pid))
    return now is not None and (started is None or abs(now - float(started)) <= SAME_START_S)


def group_alive(pid: int | None, started: float | None) -> bool:
    """True while the process group led by ``pid`` (started at ``started``) has a live member:
    the leader itself, or, once the leader has exited, anything it left in its group (a job's
    child that ignored SIGTERM, say). Linux never reuses a number that still names a process
    group, so a pid that now names another live process means our group is gone. A live
    leader costs one /proc read; a gone one a kill(0) and, only if that finds someone, a
    scan of the process table."""
    if not pid:
        return False
    if is_alive(pid, started):
        return True
    st = _stat(int(pid))
    if st is not None and st[0] not in ("Z", "X"):  # the number now names another process
        return False
    return bool(group_members(int(pid)))  # the leader is gone (or a zombie): anyone left?


def group_members(pgid: int) -> list[int]:
    """Pids of the live (non-zombie) processes in process group ``pgid``; [] when none.
    Scans the process table, so callers ask only when the group's leader is gone."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []
    except PermissionError:
        pass  # it exists but belongs to someone else; list it anyway
    if not _HAVE_PROC:
        return _group_members_psutil(pgid)
    return [pid for pid, state, _ in in_groups({pgid}).get(pgid, ()) if state not in ("Z", "X")]


def _group_members_psutil(pgid: int) -> list[int]:  # pragma: no cover - no /proc
    import psutil

    members = []
    for pid in psutil.pids():
        try:
            if os.getpgid(pid) == pgid and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                members.append(pid)
        except (OSError, psutil.Error):
            continue
    return members


def signal_group(pid: int, sig: int = signal.SIGTERM) -> bool:
    """Send ``sig`` to the process group led by ``pid``. False (and nothing raised) when the
    group is gone or not ours to signal."""
    return _send(os.killpg, pid, sig)


def signal_pid(pid: int, sig: int = signal.SIGTERM) -> bool:
    """Send ``sig`` to one process; False (and nothing raised) when it is gone or not ours."""
    return _send(os.kill, pid, sig)


def _send(kill: Callable[[int, int], None], pid: int, sig: int) -> bool:
    try:
        kill(int(pid), sig)
    except OSError as e:
        if e.errno in (errno.ESRCH, errno.EPERM):
            return False
        raise
    return True


def carrying(key: str, value: str) -> list[int]:
    """Pids of the live processes whose environment holds ``key=value`` (this process aside):
    how a job's processes are found once they have left its process group (``setsid``, a
    helper that daemonises), because a process keeps the environment it was started with. One
    read of /proc/PID/environ per process, so only for rare moments (a cancel, an attempt
    gone without its exit record); [] where there is no /proc, and a process that cleared its
    environment (``env -i``) is not found."""
    if not _HAVE_PROC:
        return []
    needle = f"\0{key}={value}\0".encode()
    me = os.getpid()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        env = _environ(int(name))  # None: gone, or another user's
        if env is None or needle not in b"\0" + env:
            continue
        if (st := _stat(int(name))) is not None and st[0] not in ("Z", "X"):
            found.append(int(name))
    return found
