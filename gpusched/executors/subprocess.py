"""Attempts as plain detached processes: ``sh wrap.sh ATTEMPT_DIR file`` in its own session.

For machines without tmux, CI, and speed (no terminal emulation). The wrapper leads its own
session and process group, reads /dev/null and writes only into the attempt directory, so it
outlives the daemon and the user's logout. A restarted daemon finds it again by the
``GPUSCHED_TOKEN`` (and ``GPUSCHED_HOME``) in its environment.
"""

from __future__ import annotations

import os
import time

from gpusched import proc
from gpusched.executors import TOKEN_ENV, WRAPPER, Handle, LaunchRequest, attempt_alive, signal_attempt
from gpusched.home import Home, this_host


class SubprocessExecutor:
    """The :class:`~gpusched.executors.Executor` that runs each attempt as a detached process.

    Handle: ``{"pid": wrapper pid, "pid_started_at": its start time, "token": the attempt's
    GPUSCHED_TOKEN, "host": this machine}``; the wrapper leads the attempt's process group,
    so ``pid`` is also the group id.
    """

    name = "subprocess"

    def __init__(self, home: Home) -> None:
        self.home = home
        self._environ = dict(os.environ)  # read once: os.environ decodes every variable per access
        self._host = this_host()  # a pid means something on this machine only

    def launch(self, req: LaunchRequest) -> Handle:
        """Start the wrapper; return once it has been exec'd. Its environment is this process's,
        plus ``GPUSCHED_JOB_ID`` (unless ``req.env`` sets it), ``req.env``, and last
        ``GPUSCHED_TOKEN`` and ``GPUSCHED_HOME`` (which :meth:`discover` relies on)."""
        env = {
            **self._environ,
            "GPUSCHED_JOB_ID": req.job_id,
            **req.env,
            TOKEN_ENV: req.token,
            "GPUSCHED_HOME": str(self.home.root),
        }
        p = proc.spawn(wrapper_argv(req), env=env)  # launch.sh changes to req.workdir
        # the clock, not /proc/PID/stat: reading that waits for the child's exec to finish,
        # and it is within a millisecond of the start time the kernel recorded
        return {"pid": p.pid, "pid_started_at": time.time(), "token": req.token, "host": self._host}

    def alive(self, handle: Handle) -> bool:
        """True while the wrapper runs, or anything it left in its process group, or a process
        of the job that left the group (:func:`~gpusched.executors.attempt_alive`). No exec:
        one /proc read while the wrapper runs (and a reap of our own finished child)."""
        return attempt_alive(handle)

    def terminate(self, handle: Handle, *, force: bool = False) -> None:
        """SIGTERM (SIGKILL when ``force``) the attempt's process group and the job's processes
        that left it; nothing when all is gone."""
        signal_attempt(handle, force=force)

    def discover(self) -> dict[str, Handle]:
        """token -> handle of every wrapper this home started that still runs (this backend
        keeps nothing of an ended attempt). Scans the process table once: reads each
        process's command line, and the environment of wrappers only."""
        import psutil

        proc.reap()
        home = str(self.home.root)
        found: dict[str, Handle] = {}
        for p in psutil.process_iter(["cmdline"]):
            cmd = p.info["cmdline"] or []
            if len(cmd) != 4 or not cmd[1].endswith("/wrap.sh") or cmd[3] != "file":
                continue
            try:
                # the wrapper leads its process group; a subshell it forks for a moment
                # (`$(date ...)`) has the same command line and token but not its own group
                if os.getpgid(p.pid) != p.pid:
                    continue
                env = p.environ()
            except (psutil.Error, OSError):  # gone, or another user's
                continue
            token = env.get(TOKEN_ENV)
            started = proc.started_at(p.pid)
            if token and env.get("GPUSCHED_HOME") == home and started is not None:
                found[token] = {"pid": p.pid, "pid_started_at": started, "token": token}
        return found

    def release(self, handle: Handle) -> None:
        """Nothing to release: an ended process leaves nothing behind but its attempt dir."""


def wrapper_argv(req: LaunchRequest) -> list[str]:
    """The wrapper's command line in ``file`` mode (output only to output.log)."""
    return ["sh", str(WRAPPER), str(req.attempt_dir), "file"]
