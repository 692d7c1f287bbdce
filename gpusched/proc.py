"""The one place gpusched runs external commands and touches other processes.

``run`` logs the command and raises :class:`CommandFailed` (command, exit code, stderr);
``spawn`` starts a detached process group; the rest answers "is that process still the
one we started?" without being fooled by PID reuse.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from typing import IO, Any

from gpusched.errors import CommandFailed, ExecutorError

log = logging.getLogger(__name__)


def run(
    cmd: Sequence[str],
    *,
    check: bool = True,
    timeout: float | None = 30.0,
    env: Mapping[str, str] | None = None,
    input: str | None = None,
    cwd: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` to completion; raise CommandFailed on a non-zero exit when ``check``."""
    log.debug("run: %s", " ".join(cmd))
    try:
        r = subprocess.run(
            list(cmd), capture_output=True, text=True, timeout=timeout, env=dict(env) if env else None,
            input=input, cwd=cwd, check=False,
        )
    except FileNotFoundError as e:
        raise ExecutorError(f"{cmd[0]}: not found on PATH") from e
    except subprocess.TimeoutExpired as e:
        raise CommandFailed(cmd, -1, f"timed out after {timeout} s") from e
    if check and r.returncode != 0:
        raise CommandFailed(cmd, r.returncode, r.stderr)
    return r


def spawn(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    stdout: IO[Any] | int | None = subprocess.DEVNULL,
    stderr: IO[Any] | int | None = subprocess.DEVNULL,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a new session (its own process group, no controlling terminal),
    so it survives the caller's death and the user's logout."""
    log.debug("spawn: %s", " ".join(argv))
    return subprocess.Popen(
        list(argv), env=dict(env) if env is not None else None, cwd=cwd, stdin=subprocess.DEVNULL,
        stdout=stdout, stderr=stderr, start_new_session=True, close_fds=True,
    )


_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_boot_time: float | None = None


def _boot() -> float:
    global _boot_time
    if _boot_time is None:
        import psutil

        _boot_time = psutil.boot_time()
    return _boot_time


def started_at(pid: int) -> float | None:
    """The process's start time (epoch seconds), or None if it does not exist or is a zombie.
    Reads /proc directly where it can (microseconds), psutil otherwise."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return _started_at_psutil(pid)
    rest = data[data.rfind(b")") + 2 :].split()
    if rest[0] in (b"Z", b"X"):  # zombie / dead: it has exited
        return None
    return _boot() + int(rest[19]) / _CLK_TCK


def _started_at_psutil(pid: int) -> float | None:
    import psutil

    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return None
        return p.create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def is_alive(pid: int | None, started: float | None) -> bool:
    """True if ``pid`` runs and is the same process (start time within 1 s) as recorded."""
    if not pid:
        return False
    now_started = started_at(int(pid))
    if now_started is None:
        return False
    return started is None or abs(now_started - float(started)) < 1.0


def signal_group(pid: int, sig: int = signal.SIGTERM) -> bool:
    """Signal the process group led by ``pid``; False if it is gone."""
    try:
        os.killpg(int(pid), sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return False


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (for matching GPU processes to jobs)."""
    import psutil

    try:
        p = psutil.Process(pid)
        return [pid, *(c.pid for c in p.children(recursive=True))]
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []
