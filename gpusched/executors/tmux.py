"""Attempts in tmux panes on a private, per-user tmux server (``Home.tmux_socket``): a window of
its own for each attempt (``GPUSCHED_TMUX_PANES=job``); by default the subclass in
:mod:`gpusched.executors.tmux_reuse` has the panes of jobs of seconds run the next job.

One session per suite, one window per job, named after the job, so ``gpusched attach``
lands on it; ``remain-on-exit`` keeps a finished pane (and its last lines) on screen. The
pane's process is the wrapper itself (tmux execs a multi-word command without a shell), and
tmux makes it the leader of a new session and process group, so cancelling signals the whole
job. The pane carries its attempt's token and job id in user options, so a restarted daemon
lists every attempt with one ``list-panes`` call. Before a pane starts, the executor makes its
attempt folder's FIFO (:attr:`~gpusched.attempt.AttemptPaths.pipe`), through which the wrapper's
``tee``, started in the background, shows the job's output in the pane and appends it to
output.log (a pipeline costs two more processes a job, and a Ctrl-C in the pane stopped its tee).

Launching costs one tmux command line in the steady state: ``new-window`` (or ``new-session``
for a suite's first job), the tagging and, on a relaunch, closing the job's previous window are
chained with ``;``. Once a session exists, the executor keeps a control-mode client attached to
it (:mod:`gpusched.executors.tmux_control`) and writes launches to it as lines instead of
exec'ing tmux for each (~2.6 ms against ~8 ms a window on a 2-core VM); wherever the client
cannot answer, the launch execs tmux as before. The builders (:func:`launch_argv` and friends)
are pure; every other tmux call goes through :meth:`TmuxExecutor._tmux`, which goes through
:func:`gpusched.proc.run` (one choke point, with a timeout, unlike ``libtmux.Server.cmd``).
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from msgspec import Struct

from gpusched import proc
from gpusched.attempt import AttemptPaths
from gpusched.errors import CommandFailed, ExecutorError
from gpusched.executors import (
    TOKEN_ENV,
    WRAPPER,
    Handle,
    LaunchRequest,
    attempt_alive,
    launch_each,
    signal_attempt,
)
from gpusched.executors.tmux_control import ControlClient
from gpusched.home import Home, this_host

if TYPE_CHECKING:
    from subprocess import CompletedProcess

    import libtmux

log = logging.getLogger(__name__)

#: The server's configuration, read once when the server starts. Not ~/.tmux.conf: a user's
#: hooks or options must not change how jobs run. ``exit-empty`` stays on (the default):
#: the server goes away once no session is left, and the next launch starts it again.
CONF = """\
# Written by gpusched for its private tmux server; your own tmux and ~/.tmux.conf are untouched.
# Read when this server starts (it stops by itself once it holds no session).
set -g remain-on-exit on
set -g history-limit 20000
"""

#: Unix socket paths are limited to sizeof(sun_path) - 1 bytes.
SOCKET_PATH_MAX = 107
TIMEOUT_S = 30.0
#: Windows of ours kept on the server, newest first: beyond this many, each launch also closes
#: the oldest whose attempt has ended. Every pane the server starts is a fork of the server, so
#: a server holding many dead panes (and their scrollback) makes each launch dearer: per window
#: opened, 1.1-1.6 ms of server CPU with 16 kept, 1.8 with 64, 2.5-3.7 with 200, and more for
#: the forked child (benchmarks/README.md). An ended job's output stays in its output.log, and
#: ``gpusched attach`` on a closed window says so.
KEEP_WINDOWS = 64
#: Windows opened by one tmux exec at most (see :meth:`TmuxExecutor.launch_many`).
BATCH = 32
#: Attaches of a control client tried before launches keep to exec'ing tmux (a tmux before
#: 3.2 has no ``attach-session -f``).
CONTROL_TRIES = 3

_SEP = "\t"
_IDS = _SEP.join(["#{pane_id}", "#{window_id}", "#{session_id}", "#{pane_pid}"])
_ROW = _SEP.join(
    [
        "#{@gpusched_token}",
        "#{pane_id}",
        "#{window_id}",
        "#{session_id}",
        "#{pane_pid}",
        "#{pane_dead}",
        "#{@gpusched_fifo}",
        "#{@gpusched_pid}",
        "#{@gpusched_exit}",
        "#{session_name}",
        "#{window_name}",  # last: a window name may hold anything
    ]
)


# ---------------------------------------------------------------------- pure builders


def session_name(suite: str) -> str:
    """The tmux session of ``suite``: tmux forbids '.' and ':' there, so both become '_'
    (the real name is kept in the session's ``@gpusched_suite`` option)."""
    return suite.replace(".", "_").replace(":", "_") or "_"


def escape(arg: str) -> str:
    """Protect one argument from tmux's argv parser, which takes a trailing ';' for a
    command separator (``a;`` would become command ``a``): ``x;`` is passed as ``x\\;``."""
    return arg[:-1] + "\\;" if arg.endswith(";") else arg


def chain(*commands: Sequence[str]) -> list[str]:
    """One tmux argv running ``commands`` in order (tmux stops at the first that fails)."""
    argv: list[str] = []
    for cmd in commands:
        if argv:
            argv.append(";")
        argv += [escape(a) for a in cmd]
    return argv


def pane_env(req: LaunchRequest) -> dict[str, str]:
    """Variables given to the pane with ``-e``: ``GPUSCHED_JOB_ID`` (unless ``req.env`` sets
    it; the wrapper names the job with it), ``req.env``, and ``GPUSCHED_TOKEN`` last."""
    return {"GPUSCHED_JOB_ID": req.job_id, **req.env, TOKEN_ENV: req.token}


def window_args(req: LaunchRequest, command: Sequence[str] | None = None) -> list[str]:
    """Arguments shared by new-window and new-session: name, cwd, env, print the ids, and
    the wrapper as a multi-word command (exec'd directly, no shell in between). ``command``
    instead of the wrapper: a reused pane's loop, which gets each job's variables from the
    job's line, not from the pane's environment."""
    args = ["-n", req.job_name, "-c", str(req.workdir)]
    if command is None:
        for key, value in pane_env(req).items():
            args += ["-e", f"{key}={value}"]
        command = ["sh", str(WRAPPER), str(req.attempt_dir), "tee"]
    return [*args, "-P", "-F", _IDS, "--", *command]


def launch_argv(
    req: LaunchRequest,
    *,
    new_session: bool,
    replaces: str | None = None,
    closes: Sequence[str] = (),
    command: Sequence[str] | None = None,
    fifo: str | None = None,
) -> list[str]:
    """The tmux arguments (after ``-S SOCKET``) that start ``req``'s wrapper in one exec.

    The window is created detached (``-d``: an attached user's view does not jump) after the
    session's last window (``-a``), so ``{end}`` names it in the commands that follow. Its
    pane is tagged with ``@gpusched_token`` and ``@gpusched_job``; ``replaces`` (the job's
    previous window, if any), then ``closes`` (old windows of ended attempts) are closed
    last, so the session never empties on the way. ``command`` and ``fifo``: a reused pane's
    loop instead of the wrapper, and its FIFO, kept in ``@gpusched_fifo``
    (:mod:`gpusched.executors.tmux_reuse`).
    """
    sess = session_name(req.suite)
    end = f"={sess}:{{end}}"
    if new_session:
        create = [["new-session", "-d", "-s", sess, *window_args(req, command)]]
        # a bare "=NAME" is not a session target for set-option; "=NAME:" is
        create.append(["set-option", "-t", f"={sess}:", "@gpusched_suite", req.suite])
    else:
        create = [["new-window", "-d", "-a", "-t", end, *window_args(req, command)]]
    tag = [["set-option", "-p", "-t", end, "@gpusched_fifo", fifo]] if fifo else []
    tag += [
        ["set-option", "-p", "-t", end, "@gpusched_token", req.token],
        ["set-option", "-p", "-t", end, "@gpusched_job", req.job_id],
    ]
    gone = ([replaces] if replaces else []) + [w for w in closes if w != replaces]
    return chain(*create, *tag, *(["kill-window", "-t", w] for w in gone))


def attach_args(handle: Handle) -> list[str]:
    """tmux arguments that attach to the attempt's session and show its window."""
    return ["attach-session", "-t", handle["session"], ";", "select-window", "-t", handle["window"]]


class PaneRow(Struct, frozen=True):
    """One line of ``list-panes -a -F _ROW``. ``fifo``: set on a reused pane (its process is
    the pane loop, not a wrapper; see :class:`TmuxReuseExecutor`), ``wrapper``: the pid of
    the wrapper it last started, once known, and ``exit``: that attempt's exit record."""

    token: str
    pane: str
    window: str
    session: str
    pid: int
    dead: bool
    fifo: str
    wrapper: int | None
    exit: str
    session_name: str
    window_name: str

    @classmethod
    def parse(cls, line: str) -> PaneRow | None:
        parts = line.split(_SEP, 10)
        if len(parts) != 11 or not parts[4].isdigit():
            return None
        token, pane, window, session, pid, dead, fifo, wrapper, exit_path, sname, wname = parts
        wpid = int(wrapper) if wrapper.isdigit() else None
        return cls(token, pane, window, session, int(pid), dead == "1", fifo, wpid, exit_path, sname, wname)

    def handle(self) -> Handle:
        # a reused pane: the attempt's process is the wrapper its loop started (not known, or
        # ended: "dead", and a restarted daemon goes by the attempt's pid file)
        pid = self.wrapper if self.fifo else self.pid
        started = proc.started_at(pid) if pid and (self.fifo or not self.dead) else None
        return {
            "pane": self.pane,
            "window": self.window,
            "session": self.session,
            "pid": pid,
            "pid_started_at": started,
            "token": self.token,
            "dead": started is None,
        }


def parse_ids(stdout: str) -> tuple[str, str, str, int] | None:
    """(pane, window, session, pid) from the ``-P -F _IDS`` line; None when tmux printed none."""
    for line in stdout.splitlines():
        parts = line.split(_SEP)
        if len(parts) == 4 and parts[0].startswith("%") and parts[3].isdigit():
            return parts[0], parts[1], parts[2], int(parts[3])
    return None


def all_ids(stdout: str) -> list[tuple[str, str, str, int]]:
    """Every (pane, window, session, pid) line of a chained launch, in order."""
    return [ids for line in stdout.splitlines() if (ids := parse_ids(line)) is not None]


def _no_server(stderr: str) -> bool:
    return "no server running" in stderr or "error connecting to" in stderr


# ---------------------------------------------------------------------- the executor


class TmuxExecutor:
    """The :class:`~gpusched.executors.Executor` that runs each attempt in a tmux pane.

    Handle: ``{"pane": "%N", "window": "@N", "session": "$N", "pid": wrapper pid (the pane's
    process and its group leader), "pid_started_at": its start time, "token", "host": this
    machine}``; :meth:`discover` adds
    ``"dead"``. :meth:`alive` and :meth:`terminate` need no tmux call.
    """

    name = "tmux"

    def __init__(self, home: Home) -> None:
        self.home = home
        self._bin = shutil.which("tmux") or "tmux"
        self._host = this_host()
        self._prepared = False
        # What this executor knows of the server, read with one list-panes call at the first
        # launch and again when it proves stale: the sessions, our windows by (session, name).
        self._known = False
        self._sessions: set[str] = set()
        self._windows: dict[tuple[str, str], str] = {}
        # our windows, oldest first: window -> (its (session, job name), wrapper pid, start)
        self._launched: dict[str, tuple[tuple[str, str], int, float | None]] = {}
        self._control: ControlClient | None = None  # attached once a session exists
        self._control_fails = 0  # attaches that failed (an old tmux): at CONTROL_TRIES, no more

    @property
    def socket(self) -> str:
        return str(self.home.tmux_socket)

    # ------------------------------------------------------------------ protocol

    def launch(self, req: LaunchRequest) -> Handle:
        """Start ``req``'s wrapper in a new window of its suite's session (created, and the
        server started, when missing). A window of ours with the same job name in that
        session (an older attempt's pane) is closed: the caller relaunches a job only after
        reaping its previous attempt. One tmux exec unless what we knew of the server was
        stale. Raises :class:`CommandFailed` when tmux refuses."""
        self._prepare()
        if not self._known:
            self._refresh()
        AttemptPaths(req.attempt_dir).make_pipe()  # (the wrapper's tee reads it)
        sess = session_name(req.suite)
        for fresh in (False, True):
            new_session = sess not in self._sessions
            replaces = self._windows.get((sess, req.job_name))
            closes = self._ended_beyond_keep(exclude=replaces)
            argv = launch_argv(req, new_session=new_session, replaces=replaces, closes=closes)
            r = self._launch_cmd(argv, sess)
            ids = parse_ids(r.stdout)
            if ids is not None or fresh:
                break
            self._refresh()  # what we knew was stale: the session (or the server) went away
        if ids is None:
            raise CommandFailed(r.args, r.returncode, r.stderr)
        if r.returncode != 0:  # created, but a later command failed (e.g. the old window was gone)
            log.log(logging.DEBUG if replaces else logging.WARNING, "tmux after launch: %s", r.stderr.strip())
        for gone in [replaces, *closes]:
            self._forget(gone)
        if new_session:
            self._make_socket_private()
        return self._opened(req, ids)

    def launch_many(self, reqs: Sequence[LaunchRequest]) -> list[Handle | Exception]:
        """Start a tick's windows with one tmux exec (per :data:`BATCH`), where :meth:`launch`
        takes one each: every request's new-window and tags chained in order, then the
        closing of its job's previous window and of ended ones beyond :data:`KEEP_WINDOWS`.
        tmux stops a chain at the first command that fails, so the requests it did not get
        to (the server or a session went away meanwhile) are launched one by one."""
        if len(reqs) < 2:
            return launch_each(self, reqs)
        out: list[Handle | Exception] = []
        for i in range(0, len(reqs), BATCH):
            try:
                out += self._launch_batch(reqs[i : i + BATCH])
            except Exception as e:  # tmux itself could not be run
                out += [e] * len(reqs[i : i + BATCH])
        return out

    def _launch_batch(self, reqs: Sequence[LaunchRequest]) -> list[Handle | Exception]:
        self._prepare()
        if not self._known:
            self._refresh()
        sessions = set(self._sessions)
        argv: list[str] = []
        replaced: list[str] = []
        for req in reqs:
            AttemptPaths(req.attempt_dir).make_pipe()  # (the wrapper's tee reads it)
            sess = session_name(req.suite)
            argv += [";"] if argv else []
            argv += launch_argv(req, new_session=sess not in sessions)
            sessions.add(sess)
            if (old := self._windows.get((sess, req.job_name))) is not None:
                replaced.append(old)
        closes = self._ended_beyond_keep(exclude=None, adding=len(reqs), keep=set(replaced))
        gone = replaced + closes
        if gone:
            argv += [";", *chain(*(["kill-window", "-t", w] for w in gone))]
        r = self._launch_cmd(argv, session_name(reqs[0].suite))
        opened = all_ids(r.stdout)
        if r.returncode != 0 and len(opened) == len(reqs):
            log.debug("tmux after launch: %s", r.stderr.strip())  # a window to close was gone
        for w in gone:
            self._forget(w)
        if any(session_name(req.suite) not in self._sessions for req in reqs[: len(opened)]):
            self._make_socket_private()
        out: list[Handle | Exception] = [
            self._opened(req, ids) for req, ids in zip(reqs[: len(opened)], opened, strict=True)
        ]
        if len(opened) < len(reqs):
            self._refresh()  # what we knew was stale
            out += launch_each(self, reqs[len(opened) :])
        return out

    def _opened(self, req: LaunchRequest, ids: tuple[str, str, str, int]) -> Handle:
        """Remember the window tmux opened for ``req``; its handle."""
        pane, window, session, pid = ids
        sess = session_name(req.suite)
        self._sessions.add(sess)
        self._windows[(sess, req.job_name)] = window
        started = time.time()  # within ms of the pane's start (the /proc entry may already be gone)
        self._launched[window] = ((sess, req.job_name), pid, started)
        return {
            "pane": pane,
            "window": window,
            "session": session,
            "pid": pid,
            "pid_started_at": started,
            "token": req.token,
            "host": self._host,  # the pane is this machine's tmux server's
        }

    def _ended_beyond_keep(
        self, exclude: str | None, *, adding: int = 1, keep: frozenset[str] | set[str] = frozenset()
    ) -> list[str]:
        """Our oldest windows whose attempt has ended, as many as exceed KEEP_WINDOWS with the
        ``adding`` about to open (found at the front: the oldest windows are the ended ones),
        ``exclude`` and ``keep`` aside (closed anyway, as their jobs' previous windows). No
        tmux call: a /proc read per window looked at."""
        skip = {exclude, *keep}
        excess = len(self._launched) + adding - KEEP_WINDOWS - len(skip & self._launched.keys())
        out: list[str] = []
        for window, (_, pid, started) in self._launched.items():
            if len(out) >= excess:
                break
            if window not in skip and not proc.group_alive(pid, started):
                out.append(window)
        return out

    def _forget(self, window: str | None) -> None:
        entry = self._launched.pop(window, None) if window else None
        if entry is not None and self._windows.get(entry[0]) == window:
            del self._windows[entry[0]]

    def alive(self, handle: Handle) -> bool:
        """True while the wrapper runs, or anything it left in its process group, or a process
        of the job that left the group (:func:`~gpusched.executors.attempt_alive`). No tmux
        call: the pane's process is the wrapper; one /proc read while it runs."""
        return attempt_alive(handle)

    def terminate(self, handle: Handle, *, force: bool = False) -> None:
        """SIGTERM (SIGKILL when ``force``) the pane's process group and the job's processes
        that left it; nothing when all is gone. The pane stays (remain-on-exit) with the
        wrapper's last line."""
        signal_attempt(handle, force=force)

    def discover(self) -> dict[str, Handle]:
        """token -> handle of every tagged pane on the server, dead ones included (flagged
        ``"dead": True``). One tmux exec; {} when no server runs."""
        rows = self._refresh()
        found: dict[str, Handle] = {}
        for row in rows:
            if row.token and row.token not in found:
                found[row.token] = row.handle()
        return found

    def release(self, handle: Handle) -> None:
        """Close the attempt's window (and whatever still runs in it). Idempotent."""
        window = handle.get("window")
        if not window:
            return
        r = self._tmux(["kill-window", "-t", window], check=False)
        if r.returncode != 0:
            log.debug("tmux kill-window %s: %s", window, r.stderr.strip())
        for key, wid in list(self._windows.items()):
            if wid == window:
                del self._windows[key]
        self._launched.pop(window, None)

    # ------------------------------------------------------------------ for the CLI and views

    def attach_argv(self, handle: Handle) -> list[str]:
        """argv that attaches the calling terminal to the attempt's window. Run it with
        ``TMUX`` removed from the environment (see :func:`attach_env`): from inside another
        tmux, tmux refuses to nest unless it is unset."""
        return [self._bin, "-S", self.socket, *attach_args(handle)]

    def shows(self, handle: Handle) -> bool:
        """True while the attempt's pane is on the server and shows this attempt (not closed
        as one of the ended windows beyond :data:`KEEP_WINDOWS`, nor gone with its server, nor
        a reused pane that runs a later job now)."""
        fmt = _SEP.join(["#{pane_id}", "#{@gpusched_token}"])
        r = self._tmux(["display-message", "-p", "-t", handle["pane"], fmt], check=False)
        pane, _, token = r.stdout.strip("\n").partition(_SEP)
        return r.returncode == 0 and pane == handle["pane"] and token == handle.get("token", token)

    def capture(self, handle: Handle, *, lines: int = 20) -> str:
        """The pane's last ``lines`` non-blank lines, scrollback included and wrapped lines
        joined (a screen is mostly blank rows, and a dead pane's "Pane is dead" sits on the
        bottom one); '' when the pane or the server is gone."""
        r = self._tmux(["capture-pane", "-p", "-J", "-t", handle["pane"], "-S", f"-{lines}"], check=False)
        if r.returncode != 0:
            return ""
        shown = [line.rstrip() for line in r.stdout.splitlines()]
        return "\n".join([line for line in shown if line][-lines:])

    def server(self) -> libtmux.Server:
        """A libtmux view of the same private server (for interactive use and tests; the
        executor itself never needs one)."""
        import libtmux

        return libtmux.Server(socket_path=self.socket, config_file=str(self.home.tmux_conf))

    # ------------------------------------------------------------------ the one side-effecting edge

    def _launch_cmd(self, argv: Sequence[str], session: str) -> CompletedProcess[str]:
        """A launch's tmux argv, run by the control client where one is attached, else by a
        tmux exec; after an exec, a client is attached to ``session`` for the next launches."""
        if self._control is not None:
            r = self._control.run(argv)
            if r is not None:
                return r
            if not self._control.alive:  # gone with its session or the server: attach again
                self._control.close()
                self._control = None
        r = self._tmux(argv, check=False)
        if self._control is None and self._control_fails < CONTROL_TRIES and r.returncode == 0:
            self._attach_control(session)
        return r

    def _attach_control(self, session: str) -> None:
        base = [self._bin, "-S", self.socket, "-f", str(self.home.tmux_conf)]
        try:
            client = ControlClient(base, session, timeout_s=TIMEOUT_S)
        except OSError as e:
            log.debug("tmux control client: %s", e)
            client = None
        if client is None or not client.alive:
            self._control_fails += 1
            log.debug("tmux control client did not attach to %s; launches exec tmux", session)
            return
        self._control = client

    def _tmux(self, args: Sequence[str], *, check: bool = True) -> CompletedProcess[str]:
        cmd = [self._bin, "-S", self.socket, "-f", str(self.home.tmux_conf), *args]
        try:
            return proc.run(cmd, check=check, timeout=TIMEOUT_S)
        except CommandFailed as e:
            if e.returncode == 127:
                raise ExecutorError(
                    "tmux is not on PATH: install it (apt-get install tmux) or use --backend subprocess"
                ) from e
            raise

    def _refresh(self) -> list[PaneRow]:
        """Re-read sessions and our windows from the server (one exec; none without a socket)."""
        rows: list[PaneRow] = []
        if os.path.exists(self.socket):
            r = self._tmux(["list-panes", "-a", "-F", _ROW], check=False)
            if r.returncode != 0 and not _no_server(r.stderr):
                raise CommandFailed([self._bin, "list-panes", "-a"], r.returncode, r.stderr)
            rows = [row for line in r.stdout.splitlines() if (row := PaneRow.parse(line))]
        self._sessions = {row.session_name for row in rows}
        # a reused pane that runs no more (its job failed or ran long: it shows it) is an ended window
        # like any other; live ones are the subclass's
        ours = [row for row in rows if row.token and (row.dead or not row.fifo)]
        self._windows = {(row.session_name, row.window_name): row.window for row in ours}
        self._launched = {  # in the server's order, which is creation order within a session
            row.window: ((row.session_name, row.window_name), 0 if row.dead else row.pid, None)
            for row in ours
        }
        self._known = True
        return rows

    def _prepare(self) -> None:
        """Once per executor: the private home dir, a short enough socket path, the conf."""
        if self._prepared:
            return
        self.home.ensure()
        if len(os.fsencode(self.socket)) > SOCKET_PATH_MAX:
            raise ExecutorError(
                f"tmux socket path {self.socket} is longer than {SOCKET_PATH_MAX} bytes, the limit "
                "of a Unix socket: set GPUSCHED_HOME to a shorter directory"
            )
        conf = self.home.tmux_conf
        try:
            current = conf.read_text()
        except OSError:
            current = None
        if current != CONF:
            tmp = conf.with_name(conf.name + ".tmp")
            tmp.write_text(CONF)
            os.chmod(tmp, 0o600)
            os.replace(tmp, conf)
        self._prepared = True

    def _make_socket_private(self) -> None:
        """tmux creates its socket group-writable under some umasks: make it 0600 (tmux
        itself toggles only the execute bits, to mark attached clients)."""
        try:
            mode = os.stat(self.socket).st_mode
            if stat.S_IMODE(mode) & 0o077:
                os.chmod(self.socket, stat.S_IMODE(mode) & 0o700)
        except OSError as e:
            log.warning("cannot make %s private: %s", self.socket, e)


def attach_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """``environ`` (default: this process's) without ``TMUX``, for :meth:`TmuxExecutor.attach_argv`."""
    env = dict(os.environ if environ is None else environ)
    env.pop("TMUX", None)
    return env
