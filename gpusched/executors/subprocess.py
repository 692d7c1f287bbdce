"""Attempts as plain detached processes, each leading its own process group.

For machines without tmux, CI, and speed (no terminal emulation). Each attempt's wrapper
(gpusched/wrap.sh in "file" mode) reads /dev/null and writes only into the attempt directory,
so it outlives the daemon and the user's logout; it leads its own process group, which a
cancel signals.

The wrappers are started by a *runner*: one ``sh gpusched/runner.sh`` per executor, started
at the first launch, that defines the wrapper once (``wrap.sh --define``), reads a line per
attempt and forks a subshell which runs it, instead of an exec of ``sh wrap.sh`` per attempt
(a third of the CPU, and the daemon does not wait for an exec). The runner has job control
(see runner.sh), so each subshell leads its own group. Where no runner can be had (no pty, a
``sh`` without job control, ``GPUSCHED_RUNNER=0``), or a request's values cannot be written
on one line, the wrapper is started on its own: ``sh wrap.sh ATTEMPT_DIR file`` in its own
session, with ``GPUSCHED_TOKEN`` (and ``GPUSCHED_HOME``) in its environment, by which a
restarted daemon finds it again (:meth:`SubprocessExecutor.discover`). A wrapper the runner
started is found by its handle and its pid file.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import select
import shlex
import time
from collections.abc import Mapping

from gpusched import proc
from gpusched.errors import CommandFailed
from gpusched.executors import (
    TOKEN_ENV,
    WRAPPER,
    Handle,
    LaunchRequest,
    LaunchUncertain,
    attempt_alive,
    begin_finish,
    env_setting,
    signal_attempt,
)
from gpusched.home import Home, this_host

log = logging.getLogger(__name__)

RUNNER = WRAPPER.parent / "runner.sh"

#: The runner's shell: the system's ``sh`` (dash on Debian and Ubuntu, bash elsewhere).
SH = "sh"

#: How long the runner may take to say it is ready, or to answer a launch with its pid.
ANSWER_S = 5.0

#: After the runner could not be started, wrappers are started on their own this long
#: before it is tried again.
RETRY_S = 60.0

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

#: ``GPUSCHED_RUNNER=0`` in the daemon's environment: each wrapper started on its own.
RUNNER_ENV = "GPUSCHED_RUNNER"


def parse_runner(raw: str) -> bool:
    """A value of :data:`RUNNER_ENV`: 1, on, yes, true, or 0, off, no, false; else ValueError."""
    word = raw.strip().lower()
    if word in ("1", "on", "yes", "true"):
        return True
    if word in ("0", "off", "no", "false"):
        return False
    raise ValueError(raw)


class RunnerGone(Exception):
    """The runner is gone or did not answer. ``took``: it may have read the line (so the
    attempt may be running); else the line never reached it."""

    def __init__(self, message: str, *, took: bool) -> None:
        super().__init__(message)
        self.took = took


class Runner:
    """A long-lived ``sh runner.sh WRAPPER TTY``: :meth:`send` writes it a line, and
    :meth:`answer` gives the pid of the subshell it forked for it. Ends when :meth:`close` (or
    this process's end) closes its input; the attempts it started run on."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self._buf = b""
        self._w = self._r = -1
        master, slave = os.openpty()
        try:
            tty = os.ttyname(slave)
            os.close(slave)
            slave = -1
            r, self._w = os.pipe()
            self._r, w = os.pipe()
            os.set_blocking(self._r, False)
            os.set_blocking(self._w, False)  # (a runner that stopped reading must not hang the daemon)
            try:
                self.child = proc.spawn([SH, str(RUNNER), str(WRAPPER), tty], env=env, stdin=r, stdout=w)
            finally:
                os.close(r)
                os.close(w)
            said = self._answer()
            if said != "ready":
                raise RunnerGone(f"the runner said {said!r}", took=False)
        except BaseException:
            self.close()
            raise
        finally:
            os.close(master)  # the hang-up: the runner's session keeps no terminal
            if slave >= 0:
                os.close(slave)

    def send(self, line: bytes) -> None:
        """Hand the runner one attempt's line (:meth:`answer` gives its wrapper's pid)."""
        view, deadline = memoryview(line), None
        try:
            while view:
                try:
                    view = view[os.write(self._w, view) :]
                except BlockingIOError:  # its pipe is full: it reads no more, or not yet
                    deadline = deadline or time.monotonic() + ANSWER_S
                    left = deadline - time.monotonic()
                    if left <= 0 or not select.select([], [self._w], [], left)[1]:
                        # (a line it has only part of never runs: at the end of its input,
                        # which closing it gives, `read` drops a line with no newline)
                        raise RunnerGone(
                            f"the runner read nothing for {ANSWER_S:.0f} s", took=False
                        ) from None
        except OSError as e:  # EPIPE: it is gone (a line it never read cannot have run)
            raise RunnerGone(f"the runner is gone ({e.strerror})", took=False) from e

    def answer(self) -> int:
        """The pid of the wrapper it forked for the oldest line not yet answered."""
        if self._r < 0:
            raise RunnerGone("the runner was let go", took=True)
        said = self._answer()
        if not said.isdigit():
            raise RunnerGone(f"the runner answered {said!r}", took=True)
        return int(said)

    def _answer(self) -> str:
        deadline = None
        while b"\n" not in self._buf:
            try:  # (non-blocking: in a burst the answer is there already, no select needed)
                data = os.read(self._r, 4096)
            except BlockingIOError:
                deadline = deadline or time.monotonic() + ANSWER_S
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self._r], [], [], left)[0]:
                    raise RunnerGone(f"the runner did not answer in {ANSWER_S:.0f} s", took=True) from None
                continue
            if not data:
                raise RunnerGone("the runner ended", took=True)
            self._buf += data
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode(errors="replace")

    def close(self) -> None:
        """Close its input (it ends once its last line is handled) and its answers."""
        for fd in (self._w, self._r):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._w = self._r = -1  # (closed twice, a number reused since would be closed)


class SubprocessExecutor:
    """The :class:`~gpusched.executors.Executor` that runs each attempt as a detached process.

    Handle: ``{"pid": wrapper pid, "pid_started_at": its start time, "token": the attempt's
    GPUSCHED_TOKEN, "host": this machine}``; the wrapper leads the attempt's process group,
    so ``pid`` is also the group id. ``runner``: start wrappers through a runner (default:
    unless :data:`RUNNER_ENV` says 0).
    """

    name = "subprocess"

    def __init__(self, home: Home, *, runner: bool | None = None) -> None:
        self.home = home
        self._environ = dict(os.environ)  # read once: os.environ decodes every variable per access
        self._host = this_host()  # a pid means something on this machine only
        if runner is None:
            runner = env_setting(self._environ, RUNNER_ENV, parse_runner, True)
        self._use_runner = runner
        self._runner: Runner | None = None
        self._no_runner_until = 0.0
        # begun, not finished: the runner that owes the pid, or the launch's result
        self._pending: list[tuple[LaunchRequest, Runner | Handle | Exception]] = []
        self._retired: list[Runner] = []  # found gone, still owing answers

    def launch(self, req: LaunchRequest) -> Handle:
        """Start the wrapper; return once it has been forked (by the runner) or exec'd. Its
        environment is this process's, plus ``GPUSCHED_JOB_ID`` (unless ``req.env`` sets
        it), ``req.env``, and last ``GPUSCHED_TOKEN`` and ``GPUSCHED_HOME``. Raises
        :class:`~gpusched.executors.LaunchUncertain` when the runner died holding the
        request."""
        return begin_finish(self, req)

    def begin(self, req: LaunchRequest) -> None:
        """Start ``req``'s wrapper without waiting for the runner to answer its pid (the
        daemon writes the next attempt's files meanwhile); :meth:`finish` gives the handles."""
        env = {
            "GPUSCHED_JOB_ID": req.job_id,
            **req.env,
            TOKEN_ENV: req.token,
            "GPUSCHED_HOME": str(self.home.root),
        }
        line = runner_line(req, env) if self._use_runner else None
        for _ in range(2):  # a runner found gone before it read the line: once more, a new one
            runner = self._get_runner() if line is not None else None
            if runner is None:
                break
            try:
                runner.send(line)  # type: ignore[arg-type]
            except RunnerGone as e:
                self._retire(runner, e)
                continue
            self._pending.append((req, runner))
            return
        try:
            p = proc.spawn(wrapper_argv(req), env={**self._environ, **env})  # (launch.sh cds to workdir)
            self._pending.append((req, self._handle(p.pid, req)))
        except Exception as e:
            self._pending.append((req, e))

    def finish(self) -> list[Handle | Exception]:
        """One result per :meth:`begin` since the last call, in order: a handle, the error
        that kept it from starting, or :class:`~gpusched.executors.LaunchUncertain` when
        the runner died holding it."""
        pending, self._pending = self._pending, []
        out: list[Handle | Exception] = []
        for req, how in pending:
            if not isinstance(how, Runner):
                out.append(how)
                continue
            try:
                out.append(self._handle(how.answer(), req))
            except RunnerGone as e:
                self._retire(how, e)
                out.append(LaunchUncertain(f"{req.job_id}: {e} with its launch in hand"))
        for runner in self._retired:
            runner.close()
        self._retired.clear()
        return out

    def _retire(self, runner: Runner, e: RunnerGone) -> None:
        """No more lines for ``runner``; the answers it wrote before it went are still read."""
        if runner is self._runner:
            self._runner = None
            self._retired.append(runner)
            log.warning("subprocess backend: %s; the next launch starts a new runner", e)
        if e.took:  # it may be alive but stuck: let it go
            runner.close()
        runner.child.poll()  # (reaped, if it has died: no zombie until the next spawn)

    def _handle(self, pid: int, req: LaunchRequest) -> Handle:
        # the clock, not /proc/PID/stat: reading that waits for the child's exec to finish,
        # and it is within a millisecond of the start time the kernel recorded
        return {"pid": pid, "pid_started_at": time.time(), "token": req.token, "host": self._host}

    def _get_runner(self) -> Runner | None:
        if self._runner is None and time.monotonic() >= self._no_runner_until:
            try:
                self._runner = Runner({**self._environ, "GPUSCHED_HOME": str(self.home.root)})
            except (OSError, RunnerGone, CommandFailed) as e:
                log.warning(
                    "subprocess backend: no runner (%s); each wrapper is started on its own for %.0f s",
                    e,
                    RETRY_S,
                )
                self._no_runner_until = time.monotonic() + RETRY_S
        return self._runner

    def close(self) -> None:
        """Let the runner go (the attempts it started run on)."""
        if self._runner is not None:
            self._runner.close()
            self._runner = None

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
        """token -> handle of every wrapper this home started on its own that still runs
        (this backend keeps nothing of an ended attempt; one the runner started is found by
        its pid file). Scans the process table once: reads each process's command line, and
        the environment of wrappers only."""
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


def runner_line(req: LaunchRequest, env: Mapping[str, str], mode: str = "file") -> bytes | None:
    """The runner's line for ``req``: ``export NAME='value' ...; set -- 'DIR' file``, the
    variables of ``env`` the runner's own environment lacks (all but GPUSCHED_HOME). None
    when a name is not a shell variable's or a value spans lines: such a request's wrapper
    is started on its own. ``mode``: the wrapper's (a reused tmux pane's loop asks "tee")."""
    words = []
    for name, value in env.items():
        if name == "GPUSCHED_HOME":
            continue
        if not _NAME.match(name) or "\n" in value:
            return None
        words.append(f"{name}={shlex.quote(value)}")
    where = os.fspath(req.attempt_dir)
    if "\n" in where:
        return None
    return f"export {' '.join(words)}; set -- {shlex.quote(where)} {mode}\n".encode(errors="surrogateescape")


def wrapper_argv(req: LaunchRequest) -> list[str]:
    """The wrapper's command line in ``file`` mode (output only to output.log)."""
    return ["sh", str(WRAPPER), str(req.attempt_dir), "file"]
