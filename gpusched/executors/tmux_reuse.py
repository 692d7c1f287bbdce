"""Attempts in reused tmux panes: the tmux backend's default (``GPUSCHED_TMUX_PANES=auto``),
and ``GPUSCHED_TMUX_PANES=reuse``.

The tmux executor opens a window per attempt, and every pane costs the tmux server a fork, a
pseudo-terminal and a utmp record (tmux waits for the setgid utempter helper it forks), about
3 ms a job on a 2-core VM and serial in the server: a night of a thousand short jobs spends
seconds there. Here a pane runs one job after another. Its process is a loop
(gpusched/pane.sh) that reads a line per attempt from a FIFO of its own and starts the same
wrapper, in "tee" mode, in a process group of its own brought to the foreground; it answers
the wrapper's pid on one FIFO shared by all panes (:attr:`answers`). A launch into an idle
pane is a write to its FIFO; the window is renamed after the job and the pane's tags are
updated in one control-client line per tick. A new pane opens only where none of the
suite's is idle, so a night of short jobs opens about as many windows as it runs jobs at once.

What a user sees: a window per running job, named after it, as before. A pane whose job did
not succeed (it exited non-zero: failed, ran out of memory, was cancelled or Ctrl-C'd) is not
used again: it keeps that job on screen, dead, as a window of its own does, and is closed as
the ended windows are (beyond KEEP_WINDOWS, or when that job runs again). With ``auto`` so is
a pane whose job succeeded after running :data:`SHORT_S` or longer: a night of real jobs looks
as it would with a window per job, and only jobs of seconds, where a pane a job is what the
night spends, share panes. A job that succeeded in a pane used again stays on its screen until
the pane's next job starts (its output stays in its output.log, and ``gpusched attach`` on it
says so), or, once its suite has nothing left queued, is shown dead there (:meth:`reaped`).
Cancels and Ctrl-C in the pane reach the job's process group; a closed pane or a killed tmux
server hangs up its terminal, not the job, which runs on to its exit record (pane.sh, note 10):
as in a window of its own.

Handles are the tmux executor's, with the wrapper's pid (not the pane's process): ``alive``
and ``terminate`` need no tmux call. A restarted daemon finds the panes again by their
``@gpusched_fifo`` option and the wrapper each last started by ``@gpusched_pid``, and keeps
launching into them; one restarted with ``GPUSCHED_TMUX_PANES=job`` ends them instead, each
as its job ends (:class:`TmuxWindowExecutor`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import time
import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from gpusched import proc
from gpusched.attempt import EXIT, AttemptPaths
from gpusched.errors import CommandFailed
from gpusched.executors import (
    TOKEN_ENV,
    WRAPPER,
    Handle,
    LaunchRequest,
    LaunchUncertain,
    begin_finish,
    env_setting,
)
from gpusched.executors.subprocess import ANSWER_S, runner_line  # (a pane's loop has as long as the runner)
from gpusched.executors.tmux import (
    KEEP_WINDOWS,
    PaneRow,
    TmuxExecutor,
    chain,
    launch_argv,
    parse_ids,
    session_name,
)
from gpusched.home import Home

log = logging.getLogger(__name__)

PANE_LOOP = WRAPPER.parent / "pane.sh"

#: ``GPUSCHED_TMUX_PANES`` in the daemon's environment: ``auto`` (the default), a pane runs the
#: next job when its last one succeeded in less than :data:`SHORT_S`; ``reuse``, whenever its
#: last one succeeded; ``job``, never: a window of its own for each attempt, started without
#: the pane's loop (:class:`TmuxWindowExecutor`).
PANES_ENV = "GPUSCHED_TMUX_PANES"
PANES = ("auto", "reuse", "job")
#: With ``auto``: a job that succeeded after running this long keeps its pane, as one that
#: failed does. A pane costs the tmux server ~3 ms (on 2 cores); a slot whose jobs take 10 s
#: launches one every 10 s, where that is 0.03 % of the slot's time: below this, panes are
#: what a night of jobs spends; above it, a job's screen is worth more.
SHORT_S = 10.0

#: While it waits, how often it looks whether the panes' loops still run.
LOOK_S = 0.05
#: A line not read by its pane's loop this long after it was written is not run (pane.sh, note
#: 5): well within ANSWER_S, after which the executor gives the launch up, and within the
#: scheduler's START_GRACE_S, after which it requeues an attempt that left no trace.
LINE_S = 2.0


def parse_panes(raw: str) -> str:
    """A value of :data:`PANES_ENV` (one of :data:`PANES`, any case); else ValueError."""
    word = raw.strip().lower()
    if word in PANES:
        return word
    raise ValueError(raw)


def panes_wanted(environ: Mapping[str, str]) -> str:
    """What the daemon's environment asks of tmux panes (:data:`PANES`)."""
    return env_setting(environ, PANES_ENV, parse_panes, "auto")


def pane_line(req: LaunchRequest, *, until: int) -> bytes | None:
    """The line a pane's loop reads for ``req``: its token, the time after which it must not
    run (``until``, :func:`boot_cs`), then ``export NAME='value' ...; set -- 'DIR' tee`` (the
    variables a window of its own gets with ``-e``). None when the request cannot be written
    on one line: it gets a window of its own."""
    if not req.token or any(c.isspace() for c in req.token):
        return None
    line = runner_line(req, {"GPUSCHED_JOB_ID": req.job_id, **req.env, TOKEN_ENV: req.token}, "tee")
    return None if line is None else f"{req.token} {until} ".encode() + line


def boot_cs() -> int:
    """The clock since boot in hundredths of a second, as the loop reads it from /proc/uptime."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * 100)


def parse_answers(buf: bytes) -> tuple[dict[str, int], bytes]:
    """``TOKEN PID`` lines -> {token: pid}, and what is left after the last whole line."""
    *lines, rest = buf.split(b"\n")
    out: dict[str, int] = {}
    for raw in lines:
        tok, _, pid = raw.decode(errors="replace").partition(" ")
        if pid.strip().isdigit():
            out[tok] = int(pid)
    return out, rest


def _write_all(fd: int, data: bytes) -> None:
    """Write ``data`` to the non-blocking FIFO ``fd`` whole (a line longer than the pipe
    holds goes as the loop reads it); OSError when the loop reads nothing for ANSWER_S."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            if not select.select([], [fd], [], ANSWER_S)[1]:
                raise OSError(f"a tmux pane read nothing for {ANSWER_S:.0f} s") from None


@dataclass
class Pane:
    """A reused pane this executor writes to."""

    pane: str  # "%3"
    window: str  # "@2"
    session: str  # "$1"
    sess: str  # the session's name (the suite's, see session_name)
    fifo: str
    fd: int  # the FIFO, opened read-write: a write never blocks and is kept until the loop reads
    loop: int  # the pane's process
    loop_started: float | None
    token: str | None = None  # the attempt it was last given
    wrapper: int | None = None  # that attempt's wrapper, once the loop answered
    wrapper_started: float | None = None
    exit_path: str | None = None  # that attempt's exit.json (its pane's @gpusched_exit)
    name: str = ""  # that attempt's job name (its window's)
    exited_ok: bool | None = None  # whether that attempt exited 0, once its exit record says
    exit_code: int | None = None  # its exit code, as that record gives it
    ran_s: float | None = None  # how long it ran, by that record (None: not known)

    def succeeded(self) -> bool | None:
        """Whether the last attempt given to it exited 0, by its exit record; None while there
        is no whole record (not ended, a wrapper killed before it wrote one, or a pane taken
        back from a daemon before this field was kept). (A record seen created but still
        empty, one short write, reads as none.)"""
        if self.exited_ok is None and self.exit_path is not None:
            record = AttemptPaths(os.path.dirname(self.exit_path)).read_exit()
            if record is None:
                return None
            self.exit_code, self.exited_ok = record.exit_code, record.exit_code == 0
            if record.started_at is not None and record.ended_at is not None:
                self.ran_s = record.ended_at - record.started_at
        return self.exited_ok

    def keeps_screen(self, short_s: float | None) -> bool:
        """Whether its last job stays on its screen (the pane is retired, not used again): one
        that did not succeed, and one that succeeded after running ``short_s`` or longer (or
        for a time not known); ``short_s`` None: only the first."""
        ok = self.succeeded()
        if ok is None:
            return False
        return not ok or (short_s is not None and (self.ran_s is None or self.ran_s >= short_s))

    def idle(self) -> bool:
        """Its loop waits for a line, or is about to. Either the last attempt given to it
        has written its exit record and succeeded (its wrapper is printing its last line),
        or that attempt has ended without a record and the loop has no live child (a child
        the tags do not name is a wrapper started by a line written just before a daemon
        died; one that has exited and is not yet reaped is the wrapper that just ended). A
        pane whose attempt did not succeed is never idle: it is retired
        (:meth:`TmuxReuseExecutor._retire`), as is one whose job :meth:`keeps_screen`."""
        if self.token is not None and self.wrapper is None:
            return False  # given a line, not answered: not known to be free
        ok = self.succeeded()
        if ok is not None:
            # its wrapper has written its exit record, and the scheduler reaped the attempt by
            # it: it is printing its last line and exiting, the loop reads the next line after
            return ok
        if proc.group_alive(self.wrapper, self.wrapper_started):
            return False
        try:
            with open(f"/proc/{self.loop}/task/{self.loop}/children") as f:
                children = f.read().split()
        except OSError:  # (a kernel without the file: the tags are all there is)
            return True
        return all(proc.started_at(int(pid)) is None for pid in children)

    def lives(self) -> bool:
        return proc.is_alive(self.loop, self.loop_started)


class _PaneLoops(TmuxExecutor):
    """The tmux executor, looking after the reused panes on its server (this daemon's, or an
    earlier one's, found again by their tags): each is told to end (:meth:`_retire`) once
    nothing more will run in it, and shows its last job dead, as a window of its own does.
    What the two ways of running attempts share: :class:`TmuxReuseExecutor` launches into
    them, :class:`TmuxWindowExecutor` only ends those an earlier daemon left. ``short_s``: a
    pane whose job succeeded after running that long or longer keeps it on screen, as a
    failed one's does; None, none does."""

    def __init__(self, home: Home, *, short_s: float | None) -> None:
        super().__init__(home)
        self.short_s = short_s
        self._panes: dict[str, Pane] = {}  # by pane id, oldest first

    def _may_run_next(self, queued: Collection[str]) -> set[str]:
        """The sessions (of the suites ``queued``: those with jobs still queued) whose idle
        panes may be given a next job."""
        return {session_name(suite) for suite in queued}

    def reaped(self, handles: Sequence[Handle], queued: Collection[str]) -> None:
        """Attempts the scheduler has reaped (none at its first tick or after another
        connection's commit, a cancel), and the suites that still have jobs queued. The pane of
        a reaped job that stays on its screen (:meth:`Pane.keeps_screen`) is retired now, so
        that it shows the job dead at its end, as a window of its own does, not only once its
        suite launches again (a night's last jobs never would be). So is every pane whose job
        succeeded where no next job will run (:meth:`_may_run_next`): a suite with no job
        ``queued``, where it shows its last job dead (status 0), not a loop waiting all
        morning. (A job requeued later opens a new pane.) The loop reads the line once the
        job's wrapper has exited."""
        for handle in handles:
            pane = self._panes.get(str(handle.get("pane")))
            if pane is not None and pane.token == handle.get("token") and pane.keeps_screen(self.short_s):
                self._retire(pane)
        waiting = self._may_run_next(queued)
        for pane in list(self._panes.values()):
            if pane.sess not in waiting and pane.wrapper is not None and pane.succeeded():
                self._retire(pane)

    def _retire(self, pane: Pane) -> None:
        """``pane``'s last job stays on its screen (it did not succeed, or it ran long, or no
        job will run there again): its loop is told to end (pane.sh, note 9), so that the pane
        shows that job, dead, as a window of its own would, and it is an ended window from now
        on: closed beyond KEEP_WINDOWS or when that job runs again."""
        code = pane.exit_code if pane.exit_code is not None and 0 <= pane.exit_code < 256 else 1
        with contextlib.suppress(OSError):  # (the loop exits with it: tmux shows it, as the wrapper's)
            _write_all(pane.fd, f"- {code} -\n".encode())
        self._drop(pane, gone=True)  # (the FIFO goes: a restarted daemon does not take it back)
        self._launched[pane.window] = ((pane.sess, pane.name), 0, None)
        if pane.name:
            self._windows[(pane.sess, pane.name)] = pane.window

    def _drop(self, pane: Pane, *, gone: bool = False) -> None:
        """Launch into ``pane`` no more (its FIFO is closed here; the pane stays on the server).
        ``gone``: the pane is closed, and its FIFO is removed too."""
        if self._panes.pop(pane.pane, None) is not None:
            with contextlib.suppress(OSError):
                os.close(pane.fd)
        if gone:
            with contextlib.suppress(OSError):
                os.unlink(pane.fifo)

    def release(self, handle: Handle) -> None:
        """A reused pane is kept for the next job (its window, not the attempt's); an attempt
        that had a window of its own has it closed."""
        if handle.get("pane") in self._panes or not self._is_window_of_its_own(handle):
            return
        super().release(handle)

    def _is_window_of_its_own(self, handle: Handle) -> bool:
        where = str(handle.get("pane"))
        r = self._tmux(["display-message", "-p", "-t", where, "#{@gpusched_fifo}"], check=False)
        return r.returncode == 0 and not r.stdout.strip()

    def _refresh(self) -> list[PaneRow]:
        """The tmux executor's, then the reused panes on the server taken back (a restarted
        daemon finds the panes the last one opened) and those gone let go."""
        rows = super()._refresh()
        live = {row.pane: row for row in rows if row.fifo and not row.dead}
        for pane in [p for p in self._panes.values() if p.pane not in live]:
            self._drop(pane, gone=True)
        for row in live.values():
            if row.pane in self._panes:
                continue
            try:
                fd = os.open(row.fifo, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError:
                continue  # its FIFO is gone: the pane shows its last job until it is closed
            wrapper = row.wrapper
            self._panes[row.pane] = Pane(
                row.pane,
                row.window,
                row.session,
                row.session_name,
                row.fifo,
                fd,
                row.pid,
                proc.started_at(row.pid),
                token=row.token or None,
                wrapper=wrapper,
                wrapper_started=proc.started_at(wrapper) if wrapper else None,
                exit_path=row.exit or None,
                name=row.window_name,
            )
        return rows

    def discover(self) -> dict[str, Handle]:
        """The tmux executor's; then the FIFOs of panes no longer on the server (closed by a
        user, or gone with the server while no daemon ran) are removed."""
        found = super().discover()
        self._unlink_unused()
        return found

    def _unlink_unused(self) -> None:
        folder = self.home.root / "panes"
        used = {p.fifo for p in self._panes.values()}
        with contextlib.suppress(OSError):
            for name in os.listdir(folder):
                path = str(folder / name)
                if name.endswith(".fifo") and path not in used:
                    with contextlib.suppress(OSError):
                        os.unlink(path)

    def close(self) -> None:
        """Close the FIFOs (the panes and what they run go on)."""
        for pane in list(self._panes.values()):
            self._drop(pane)


class TmuxWindowExecutor(_PaneLoops):
    """``GPUSCHED_TMUX_PANES=job``: a window of its own for each attempt (the tmux executor's
    launches). The reused panes a daemon left that ran with another setting are launched into
    no more: each ends as its job does (its job is shown dead, whatever its exit), and those
    already idle at the first tick, though their suite has jobs queued."""

    def __init__(self, home: Home) -> None:
        super().__init__(home, short_s=0.0)

    def _may_run_next(self, queued: Collection[str]) -> set[str]:
        return set()


class TmuxReuseExecutor(_PaneLoops):
    """The tmux :class:`~gpusched.executors.Executor` whose panes run one job after another.
    Starts attempts with ``begin``/``finish`` (the scheduler writes the next attempt's files
    while this one's loop forks); a request that cannot be written on one line gets a
    window of its own (:meth:`TmuxExecutor.launch`). ``short_s``: a pane whose job succeeded
    after running that long or longer keeps it on screen, as a failed one's does (``auto``:
    :data:`SHORT_S`); None, every pane whose job succeeded runs the next (``reuse``)."""

    def __init__(self, home: Home, *, short_s: float | None = SHORT_S) -> None:
        super().__init__(home, short_s=short_s)
        self._answers = -1
        self._buf = b""
        self._pending: list[tuple[LaunchRequest, Pane | Handle | Exception]] = []

    @property
    def answers(self) -> str:
        """The FIFO on which every pane's loop answers its wrapper's pid."""
        return str(self.home.root / "panes" / "answers")

    # ------------------------------------------------------------------ launching

    def launch(self, req: LaunchRequest) -> Handle:
        return begin_finish(self, req)

    def launch_many(self, reqs: Sequence[LaunchRequest]) -> list[Handle | Exception]:
        """:meth:`begin` each, then :meth:`finish`."""
        for req in reqs:
            self.begin(req)
        return self.finish()

    def begin(self, req: LaunchRequest) -> None:
        """Start ``req`` in an idle pane of its suite's session (its line written to the pane's
        FIFO: the job starts at once), or in a new pane; :meth:`finish` gives the handles."""
        try:
            self._pending.append((req, self._begin(req)))
        except Exception as e:
            self._pending.append((req, e))

    def _begin(self, req: LaunchRequest) -> Pane | Handle:
        self._prepare()
        self._open_answers()
        if not self._known:
            self._refresh()
        line = pane_line(req, until=boot_cs() + int(LINE_S * 100))
        if line is None:
            return TmuxExecutor.launch(self, req)
        AttemptPaths(req.attempt_dir).make_pipe()  # (the wrapper's tee reads it)
        pane = self._idle(session_name(req.suite))
        if pane is None:
            pane = self._open(req)
        pane.token, pane.wrapper, pane.wrapper_started = req.token, None, None
        pane.exit_path, pane.name = AttemptPaths(req.attempt_dir).file(EXIT), req.job_name
        pane.exited_ok = None
        try:
            _write_all(pane.fd, line)
        except OSError:
            self._drop(pane)  # (a line cut short is never run: the loop waits for its end)
            raise
        return pane

    def finish(self) -> list[Handle | Exception]:
        """One result per :meth:`begin` since the last call, in order: a handle, the error that
        kept it from starting, or :class:`~gpusched.executors.LaunchUncertain` when its pane
        did not answer (its pane is then used no more). Then one tmux line renames each
        window after its job, tags its pane with the attempt's token, wrapper pid and exit
        record, and closes the window that kept the job's last attempt (one that did not
        succeed), as a window of its own replaces it."""
        pending, self._pending = self._pending, []
        got = self._read_answers({p.token: p for _, p in pending if isinstance(p, Pane) and p.token})
        out: list[Handle | Exception] = []
        tags: list[list[str]] = []
        closes: list[list[str]] = []
        sess = ""
        for req, how in pending:
            if not isinstance(how, Pane):
                out.append(how)
                continue
            pid = got.get(req.token)
            if pid is None:
                self._drop(how)
                out.append(LaunchUncertain(f"{req.job_id}: its tmux pane {how.pane} did not answer"))
                continue
            how.wrapper, how.wrapper_started = pid, time.time()
            sess = how.sess
            tags += [
                ["rename-window", "-t", how.window, req.job_name],
                ["set-option", "-p", "-t", how.pane, "@gpusched_token", req.token],
                ["set-option", "-p", "-t", how.pane, "@gpusched_job", req.job_id],
                ["set-option", "-p", "-t", how.pane, "@gpusched_pid", str(pid)],
                ["set-option", "-p", "-t", how.pane, "@gpusched_exit", how.exit_path or ""],
            ]
            if (old := self._windows.get((how.sess, req.job_name))) not in (None, how.window):
                closes.append(["kill-window", "-t", old])  # (last: a window gone stops the chain)
                self._forget(old)
            out.append(
                {
                    "pane": how.pane,
                    "window": how.window,
                    "session": how.session,
                    "pid": pid,
                    "pid_started_at": how.wrapper_started,
                    "token": req.token,
                    "host": self._host,
                }
            )
        if tags:  # (the jobs run whatever becomes of this: the handles stand)
            try:
                r = self._launch_cmd(chain(*tags, *closes), sess)
            except Exception as e:
                log.warning("could not tag reused tmux panes: %s", e)
            else:
                if r.returncode != 0:  # a pane closed meanwhile: its job was hung up with it
                    log.debug("tmux after a launch into a reused pane: %s", r.stderr.strip())
        return out

    def _idle(self, sess: str) -> Pane | None:
        """The oldest idle pane of session ``sess``; panes whose loop is gone are let go, those
        whose job stays on screen (:meth:`Pane.keeps_screen`) retired."""
        for pane in list(self._panes.values()):
            if pane.sess != sess:
                continue
            if not pane.lives():
                self._drop(pane, gone=True)
            elif pane.keeps_screen(self.short_s):
                self._retire(pane)
            elif pane.idle():
                return pane
        return None

    def _open(self, req: LaunchRequest) -> Pane:
        """A new pane for ``req`` (in a new window of its suite's session), with its FIFO;
        idle panes beyond :data:`KEEP_WINDOWS` are closed in the same tmux line."""
        folder = self.home.root / "panes"
        fifo = str(folder / f"{uuid.uuid4().hex[:16]}.fifo")
        os.mkfifo(fifo, 0o600)
        fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        command = ["sh", str(PANE_LOOP), fifo, self.answers, str(WRAPPER)]
        sess = session_name(req.suite)
        for other in list(self._panes.values()):  # (the other sessions' too: their windows count)
            if other.keeps_screen(self.short_s):
                self._retire(other)
        try:
            closes = self._beyond_keep()
            for fresh in (False, True):
                new_session = sess not in self._sessions
                argv = launch_argv(req, new_session=new_session, closes=closes, command=command, fifo=fifo)
                r = self._launch_cmd(argv, sess)
                ids = parse_ids(r.stdout)
                if ids is not None or fresh:
                    break
                self._refresh()  # what we knew was stale: the session (or the server) went away
                kept = {p.window for p in self._panes.values()} | self._launched.keys()
                closes = [w for w in closes if w in kept]
            if ids is None:
                raise CommandFailed(r.args, r.returncode, r.stderr)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(fifo)
            raise
        for window in closes:
            for old in [p for p in self._panes.values() if p.window == window]:
                self._drop(old, gone=True)
            self._forget(window)
        if new_session:
            self._make_socket_private()
        self._sessions.add(sess)
        pane_id, window, session, pid = ids
        pane = Pane(pane_id, window, session, sess, fifo, fd, pid, time.time())
        self._panes[pane_id] = pane
        return pane

    def _beyond_keep(self) -> list[str]:
        """Windows to close as one more pane opens, as many as exceed :data:`KEEP_WINDOWS`: the
        oldest ended ones (a retired pane's, a window of its own's), then idle panes."""
        ended = self._ended_beyond_keep(None, adding=len(self._panes) + 1)
        excess = len(self._panes) + len(self._launched) + 1 - KEEP_WINDOWS - len(ended)
        if excess <= 0:
            return ended
        return ended + [p.window for p in self._panes.values() if p.idle()][:excess]

    # ------------------------------------------------------------------ answers

    def _open_answers(self) -> None:
        if self._answers >= 0:
            return
        folder = self.home.root / "panes"
        folder.mkdir(mode=0o700, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkfifo(self.answers, 0o600)
        # read-write: never at end of input while no loop writes
        self._answers = os.open(self.answers, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)

    def _read_answers(self, owed: dict[str, Pane]) -> dict[str, int]:
        """{token: wrapper pid} for the tokens ``owed``, read until all have answered, or
        their panes' loops are gone (a pane closed as its line was written), or
        :data:`ANSWER_S` has passed since the last answer. Answers to other tokens (a loop
        that answered after its launch was given up on) are dropped."""
        got: dict[str, int] = {}
        waiting = dict(owed)
        deadline = time.monotonic() + ANSWER_S
        while waiting:
            try:
                data = os.read(self._answers, 65536)
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                if not select.select([self._answers], [], [], min(left, LOOK_S))[0]:
                    waiting = {t: p for t, p in waiting.items() if p.lives()}
                continue
            said, self._buf = parse_answers(self._buf + data)
            for tok, pid in said.items():
                if waiting.pop(tok, None) is not None:
                    got[tok] = pid
            deadline = time.monotonic() + ANSWER_S
        return got

    def close(self) -> None:
        """Close the FIFOs (the panes and what they run go on)."""
        super().close()
        if self._answers >= 0:
            os.close(self._answers)
            self._answers = -1
