"""Executors: where an attempt's wrapper runs. Each is thin: it starts
``sh gpusched/wrap.sh ATTEMPT_DIR MODE`` somewhere, can tell whether it still lives, can
stop it, and can list what it still runs after a daemon restart. The attempt's result is
never read from the executor: the wrapper writes it to ``exit.json`` in the attempt dir."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

from msgspec import Struct, field

from gpusched import proc
from gpusched.procfs import TOKEN_ENV

log = logging.getLogger(__name__)

T = TypeVar("T")

#: JSON-able description of a launched attempt, stored in the ``attempts.handle`` column.
#: tmux: {"pane": "%3", "window": "@2", "session": "$1", "pid": 123, "pid_started_at": 1.7e9, "token": ...}
#: subprocess: {"pid": 123, "pid_started_at": 1.7e9, "token": ...}; slurm: {"slurm_job_id": "42"}
Handle = dict[str, Any]

WRAPPER = Path(__file__).resolve().parent.parent / "wrap.sh"


class LaunchRequest(Struct, frozen=True, kw_only=True):
    job_id: str  # "E1/87-glue-tvt_qnli"
    suite: str  # "E1" (tmux session name)
    job_name: str  # "87-glue-tvt_qnli" (tmux window name)
    token: str  # unique per attempt; tags the pane/process so a restarted daemon finds it
    attempt_dir: str | Path  # holds launch.sh; the wrapper writes pid, output.log, exit.json here
    workdir: str | Path
    env: dict[str, str] = field(default_factory=dict)  # variables the wrapper itself needs
    options: dict[str, Any] = field(default_factory=dict)  # backend options of the suite (Slurm partition...)


class Executor(Protocol):
    name: str  # "tmux", "subprocess", "slurm"

    def launch(self, req: LaunchRequest) -> Handle:
        """Start the wrapper for ``req``; return once it exists (not once it ends)."""
        ...

    def alive(self, handle: Handle) -> bool:
        """True while the attempt's wrapper (or its process group) still exists."""
        ...

    def terminate(self, handle: Handle, *, force: bool = False) -> None:
        """SIGTERM the attempt's whole process group (SIGKILL when ``force``). Idempotent."""
        ...

    def discover(self) -> dict[str, Handle]:
        """token -> handle for every attempt this backend still holds (live or dead pane)."""
        ...

    def release(self, handle: Handle) -> None:
        """Forget a reaped attempt (e.g. close an old pane when its job is relaunched)."""
        ...

    # Optional: ``launch_many(reqs) -> list[Handle | Exception]``, one result per request in
    # order, for a backend that starts several attempts at once more cheaply than one by one
    # (one tmux call for a tick's windows). See :func:`launch_many`.
    # Optional: ``begin(req) -> None`` and ``finish() -> list[Handle | Exception]``, for a
    # backend that starts an attempt at once but learns its handle later (the subprocess
    # backend's runner answers each pid while the daemon writes the next attempt's files):
    # the scheduler begins each attempt as soon as its files are written, then finishes
    # them all, one result per begin, in order. A backend with both (tmux with reused panes)
    # is begun and finished.
    # Optional: ``reaped(handles, queued) -> None``, told of its attempts the scheduler has just
    # reaped, and of the suites that still have jobs queued (``queued``, their names); also with
    # no handles at the first tick and after another connection's commit (a cancel). tmux with
    # reused panes marks a pane that keeps its job on screen dead at once, and the idle panes
    # of a suite with nothing left to run.


# ---------------------------------------------------------------------- an attempt's processes
# The tmux and subprocess backends both run the wrapper as the leader of a new process group,
# with GPUSCHED_TOKEN in its environment, and keep the token in the handle.

# Every attempt's processes carry its launch token under TOKEN_ENV (all backends), defined
# where /proc is read (status finds a job's processes by it without importing the executors).


def strays(handle: Handle) -> list[int]:
    """The attempt's processes that left its process group (``setsid``, a daemonised helper):
    they still carry its ``GPUSCHED_TOKEN``. Scans the process table; [] for a handle without
    a token (recorded by an older gpusched)."""
    token = handle.get("token")
    if not token:
        return []
    pgid = handle.get("pid")
    return [p for p in proc.carrying(TOKEN_ENV, str(token)) if _pgid(p) != pgid]


def attempt_alive(handle: Handle) -> bool:
    """True while the attempt's process group has a live member, or, once it has none, while
    one of its :func:`strays` runs: a cancelled job counts as stopped only when all are gone."""
    if proc.group_alive(handle.get("pid"), handle.get("pid_started_at")):
        return True
    return bool(strays(handle))


def signal_attempt(handle: Handle, *, force: bool = False) -> None:
    """SIGTERM (SIGKILL when ``force``) the attempt's process group, and each of its strays
    once (a group member is not signalled twice: a trainer may take a second SIGTERM as
    "stop now, skip the checkpoint"). Nothing when all is gone. A SIGTERM is followed by a
    SIGCONT, as a shell's ``kill`` of a stopped job does: a job stopped by a Ctrl-Z in its
    pane or a ``kill -STOP`` would otherwise keep its SIGTERM pending and save nothing until
    the grace's SIGKILL; a running job ignores it."""
    sigs = (signal.SIGKILL,) if force else (signal.SIGTERM, signal.SIGCONT)
    pid = handle.get("pid")
    if pid is not None and proc.group_alive(pid, handle.get("pid_started_at")):
        for sig in sigs:
            proc.signal_group(pid, sig)
    for p in strays(handle):
        for sig in sigs:
            proc.signal_pid(p, sig)


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def env_setting(environ: Mapping[str, str], name: str, parse: Callable[[str], T], default: T) -> T:
    """A backend's setting from the daemon's environment: ``parse`` of ``name``'s value,
    ``default`` when unset or (logged) when ``parse`` refuses it: ``submit`` and ``daemon
    start`` refuse such a value first (:func:`gpusched.daemon.check_env`)."""
    raw = environ.get(name, "").strip()
    try:
        return parse(raw) if raw else default
    except ValueError:
        shown = ("on" if default else "off") if isinstance(default, bool) else default
        log.warning("%s=%r is not a value it takes; %s as by default", name, raw, shown)
        return default


class LaunchUncertain(Exception):
    """A launch that may or may not have started: the process that was starting it died
    once it had the request (the subprocess backend's runner). The scheduler leaves such an
    attempt ``launching``, and the next tick settles it as after a crash: adopted by its pid
    file if its wrapper runs, requeued as never started if none appeared."""


def launch_many(ex: Executor, reqs: Sequence[LaunchRequest]) -> list[Handle | Exception]:
    """Start ``reqs`` on ``ex``: its own ``launch_many`` when it has one, else one
    :meth:`Executor.launch` after another. A request that fails gives its exception in its
    place and does not stop the others."""
    many = getattr(ex, "launch_many", None)
    if many is not None:
        return list(many(reqs))
    return launch_each(ex, reqs)


def begin_finish(ex: Any, req: LaunchRequest) -> Handle:
    """:meth:`Executor.launch` for a backend that starts attempts with ``begin``/``finish``:
    begins ``req`` alone, finishes it, and raises what kept it from starting."""
    assert not ex._pending, "launch() between begin() and finish()"
    ex.begin(req)
    (result,) = ex.finish()
    if isinstance(result, Exception):
        raise result
    return result


def launch_each(ex: Executor, reqs: Sequence[LaunchRequest]) -> list[Handle | Exception]:
    """:meth:`Executor.launch` each request in turn, a failure given in its place."""
    out: list[Handle | Exception] = []
    for req in reqs:
        try:
            out.append(ex.launch(req))
        except Exception as e:
            out.append(e)
    return out
