"""A tmux control-mode client (``tmux -C``) that the tmux executor keeps open for its launches.

Each tmux command the executor runs would otherwise be a tmux exec: a client process that
starts, connects, sends its environment and terminal, and waits. On a 2-core VM that is ~8 ms
for a ``new-window`` (``-P`` and a pane to fork), against ~2.6 ms for the same command written
as a line to a client kept open, and a refill that opens one window pays it whole.

The client attaches to one of our sessions with ``-f no-output,ignore-size``: it receives no
pane output (jobs may print a lot) and never changes the size a user's terminal sees. It
answers every command of a line with one block, ``%begin`` ... ``%end`` (its output) or
``%error`` (its message), and like a tmux argv it stops a ``;`` chain at the first command
that fails; lines starting with ``%`` outside a block are notifications, read and dropped.

:class:`ControlClient` returns what a tmux exec would (stdout, stderr, return code), so the
executor's callers see no difference; where it cannot answer (a tmux without ``-f`` flags, a
line holding a newline, the client gone) it returns None and the executor execs tmux as
before. The builders and the block reader are pure.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import subprocess
import time
from collections.abc import Callable, Sequence

from msgspec import Struct

from gpusched.errors import CommandFailed

log = logging.getLogger(__name__)


def commands(argv: Sequence[str]) -> list[list[str]]:
    """A tmux argv chain (commands separated by ``;`` tokens, a literal trailing ``;`` of an
    argument escaped as ``\\;``, see :func:`gpusched.executors.tmux.chain`) -> its commands."""
    out: list[list[str]] = [[]]
    for arg in argv:
        if arg == ";":
            out.append([])
        else:
            out[-1].append(arg[:-2] + ";" if arg.endswith("\\;") else arg)
    return [c for c in out if c]


def quote(arg: str) -> str:
    """One argument for tmux's command parser, taken literally: single quotes (inside them
    tmux expands nothing: no ``$VAR``, no ``~``), a single quote as ``'\\''``."""
    return "'" + arg.replace("'", "'\\''") + "'"


def command_line(cmds: Sequence[Sequence[str]]) -> str | None:
    """The control-mode line running ``cmds`` in order, or None when an argument holds a
    newline or a NUL (a line ends at the first newline: such a command must be exec'd)."""
    if any("\n" in a or "\r" in a or "\0" in a for c in cmds for a in c):
        return None
    return " ; ".join(" ".join(quote(a) for a in c) for c in cmds)


class Reply(Struct, kw_only=True):
    """What the blocks of one command line said, read so far."""

    expected: int  # commands in the line: as many blocks, or fewer when one fails
    own: bool = True  # count only blocks of this client's commands (flags 1), not the server's
    stdout: list[str] = []
    stderr: str = ""
    blocks: int = 0
    failed: bool = False
    in_block: bool = False
    skipping: bool = False  # inside a block that is not ours
    lines: list[str] = []
    exited: bool = False  # tmux told the client to go (%exit): it runs no command of ours after
    ended: bool = False  # the client's output ended (or it did not answer in time)

    @property
    def unsent(self) -> bool:
        """The client went away before tmux began any command of the line: none of it ran."""
        return self.exited and self.blocks == 0 and not self.in_block

    @property
    def done(self) -> bool:
        return self.failed or self.blocks >= self.expected

    def feed(self, line: str) -> None:
        """Take one line of the client's output (without its newline)."""
        if self.in_block:
            if line.startswith(("%end ", "%error ")) and len(line.split(" ")) == 4:
                self.in_block = False
                if self.skipping:
                    return
                self.blocks += 1
                if line.startswith("%error "):
                    self.failed, self.stderr = True, "\n".join(self.lines) + "\n"
                else:
                    self.stdout += [f"{x}\n" for x in self.lines]
            else:
                self.lines.append(line)
        elif line.startswith("%begin "):
            self.in_block, self.lines = True, []
            self.skipping = self.own and line.split(" ")[-1] != "1"
        elif line == "%exit" or line.startswith("%exit "):
            self.exited = True
        # else: a notification (%window-add, %session-changed, ...): not ours to answer


def _dies_with(parent: int) -> Callable[[], None] | None:
    """What the client runs before its exec on Linux: SIGKILL when ``parent`` (the daemon)
    dies. A daemon killed with SIGKILL left its client attached: tmux 3.3 never ends a control
    client whose input and output went with the daemon, and a server asked to exit (`tmux
    kill-server`, which the README says is safe) then waits for it for good, answering every
    later command, the next daemon's launches too, `server exited unexpectedly`. The daemon
    runs one thread, the one that starts the client (the signal follows the thread)."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: no parent-death signal
        return None

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the daemon died as the client was forked
            os._exit(1)

    return preexec


_PR_SET_PDEATHSIG = 1


class ControlClient:
    """``tmux -S SOCKET -f CONF -C attach-session -f no-output,ignore-size -t =SESSION``,
    kept open; :meth:`run` sends one command line and reads its blocks."""

    def __init__(self, base: Sequence[str], session: str, *, timeout_s: float) -> None:
        """``base``: the tmux argv prefix (binary, ``-S`` socket, ``-f`` conf)."""
        self.base = list(base)
        self.timeout_s = timeout_s
        self._buf = b""
        argv = [*self.base, "-C", "attach-session", "-f", "no-output,ignore-size", "-t", f"={session}"]
        self._proc: subprocess.Popen[bytes] | None = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a signal to the daemon's group is not the client's
            preexec_fn=_dies_with(os.getpid()),
        )
        attached = self._read(Reply(expected=1, own=False))  # the attach answers with a block
        if not attached.done or attached.failed:
            self.close()

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def run(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str] | None:
        """Run the tmux argv chain ``argv`` (what follows ``-S``/``-f``) as one line; its
        result as a tmux exec would give it, or None where this client cannot run it (the
        caller execs tmux then). Raises :class:`CommandFailed` (code 124) when tmux does not
        answer within the timeout, or the client goes away part-way: the commands may have
        run, so running them again is not safe."""
        cmds = commands(argv)
        line = command_line(cmds)
        if line is None or not cmds or not self.alive:
            return None
        assert self._proc is not None and self._proc.stdin is not None
        try:
            self._proc.stdin.write(line.encode() + b"\n")
            self._proc.stdin.flush()
        except OSError:
            self.close()
            return None
        reply = self._read(Reply(expected=len(cmds)))
        full = [*self.base, *argv]
        if not reply.done:
            self.close()
            if reply.unsent:  # its session or the server went as the line was written
                return None
            raise CommandFailed(full, 124, "the tmux control client did not answer")
        code = 1 if reply.failed else 0
        return subprocess.CompletedProcess(full, code, "".join(reply.stdout), reply.stderr)

    def close(self) -> None:
        """End the client (closing its input detaches it); the server and its panes stay."""
        p, self._proc = self._proc, None
        if p is None:
            return
        for stream in (p.stdin, p.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):  # a line it never read: a broken pipe
                    stream.close()
        try:
            p.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

    def _read(self, reply: Reply) -> Reply:
        """Feed ``reply`` the client's lines until it is done, the client's output ends or
        the timeout passes (``reply.ended``)."""
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        deadline = time.monotonic() + self.timeout_s
        while not reply.done and not reply.ended:
            nl = self._buf.find(b"\n")
            if nl >= 0:
                line, self._buf = self._buf[:nl], self._buf[nl + 1 :]
                reply.feed(line.decode("utf-8", "replace").rstrip("\r"))
                continue
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                log.warning("tmux control client: no answer within %.0f s", self.timeout_s)
                reply.ended = True
                return reply
            chunk = os.read(fd, 65536)
            if not chunk:  # the client exited: server gone, session gone, or -f not known
                reply.ended = True
                return reply
            self._buf += chunk
        return reply
