"""Attempts in tmux panes on a private, per-user tmux server.

One session per suite, one window per job (named after the job, so ``attach`` lands on
it), ``remain-on-exit`` so a finished pane still shows its last lines. Windows carry the
attempt token in a user option (``@gpusched_token``); a restarted daemon lists them with
one ``list-panes`` call. The pane's process is the wrapper, which leads the pane's
process group, so cancel signals the whole job.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from typing import Any

from gpusched import proc
from gpusched.errors import CommandFailed, ExecutorError
from gpusched.executors import WRAPPER, Handle, LaunchRequest
from gpusched.home import Home

_CONF = """# written by gpusched: its private tmux server (the user's own tmux is untouched)
set -g remain-on-exit on
set -g history-limit 20000
set -g exit-empty off
set -g default-terminal "tmux-256color"
"""
_SEP = "\t"


def session_name(suite: str) -> str:
    """tmux forbids '.' and ':' in session names."""
    return suite.replace(".", "_").replace(":", "_")


@dataclass
class TmuxExecutor:
    home: Home
    name: str = "tmux"
    _sessions: set[str] = field(default_factory=set)
    _server: Any = None

    # ------------------------------------------------------------------ plumbing

    @property
    def socket(self) -> str:
        return str(self.home.tmux_socket)

    def _tmux(self, *args: str, check: bool = True) -> str:
        """One tmux invocation through libtmux (which runs the tmux binary with our socket)."""
        if self._server is None:
            import libtmux

            self._server = libtmux.Server(socket_path=self.socket, config_file=str(self.home.tmux_conf))
        try:
            r = self._server.cmd(*args)
        except Exception as e:  # libtmux.exc.TmuxCommandNotFound and friends
            raise ExecutorError(f"tmux failed to run: {e}; is tmux installed?") from e
        if check and r.returncode != 0:
            raise CommandFailed(["tmux", *args], r.returncode, "\n".join(r.stderr))
        return "\n".join(r.stdout)

    def _ensure_conf(self) -> None:
        if not self.home.tmux_conf.exists():
            self.home.ensure()
            self.home.tmux_conf.write_text(_CONF)

    def _session_exists(self, name: str) -> bool:
        if name in self._sessions:
            return True
        try:
            self._tmux("has-session", "-t", f"={name}")
        except (CommandFailed, ExecutorError):
            return False
        self._sessions.add(name)
        return True

    # ------------------------------------------------------------------ protocol

    def launch(self, req: LaunchRequest) -> Handle:
        """One tmux invocation: create the window (or the suite's session), tag it, print ids."""
        self._ensure_conf()
        sess = session_name(req.suite)
        env_args: list[str] = []
        for k, v in {**req.env, "GPUSCHED_TOKEN": req.token}.items():
            env_args += ["-e", f"{k}={v}"]
        cmd = f"exec sh {_q(str(WRAPPER))} {_q(str(req.attempt_dir))} tee"
        fmt = _SEP.join(["#{pane_id}", "#{window_id}", "#{session_id}", "#{pane_pid}"])
        exists = self._session_exists(sess)
        if exists:
            self._kill_old_window(sess, req.job_name)
            create = ["new-window", "-d", "-P", "-F", fmt, "-t", f"={sess}:", "-n", req.job_name,
                      "-c", str(req.workdir), *env_args, cmd]
        else:
            create = ["new-session", "-d", "-P", "-F", fmt, "-s", sess, "-n", req.job_name,
                      "-x", "200", "-y", "50", "-c", str(req.workdir), *env_args, cmd]
        out = self._tmux(*create)
        pane, window, session, pid = out.strip().split(_SEP)
        self._sessions.add(sess)
        if not exists:
            os.chmod(self.socket, 0o600)
        # tag after creation; the wrapper's pid file is the fallback if we die in between
        self._tmux("set-option", "-w", "-t", window, "@gpusched_token", req.token, ";",
                   "set-option", "-w", "-t", window, "@gpusched_job", req.job_id, ";",
                   "set-option", "-w", "-t", window, "automatic-rename", "off")
        return {"pane": pane, "window": window, "session": session, "pid": int(pid),
                "pid_started_at": proc.started_at(int(pid))}

    def _kill_old_window(self, sess: str, job_name: str) -> None:
        """An older attempt's dead pane: close it, so `attach` lands on the current one."""
        out = self._tmux("list-windows", "-t", f"={sess}", "-F", "#{window_id}" + _SEP + "#{window_name}",
                         check=False)
        for line in out.splitlines():
            wid, _, wname = line.partition(_SEP)
            if wname == job_name:
                self._tmux("kill-window", "-t", wid, check=False)

    def alive(self, handle: Handle) -> bool:
        # no tmux call: the pane's process is the wrapper; when it exits the pane is dead
        return proc.is_alive(handle.get("pid"), handle.get("pid_started_at"))

    def terminate(self, handle: Handle, *, force: bool = False) -> None:
        pid = handle.get("pid")
        if pid and proc.is_alive(pid, handle.get("pid_started_at")):
            proc.signal_group(int(pid), signal.SIGKILL if force else signal.SIGTERM)

    def discover(self) -> dict[str, Handle]:
        if not self.home.tmux_socket.exists():
            return {}
        fmt = _SEP.join(["#{@gpusched_token}", "#{pane_id}", "#{window_id}", "#{session_id}", "#{pane_pid}",
                         "#{pane_dead}"])
        try:
            out = self._tmux("list-panes", "-a", "-F", fmt)
        except (CommandFailed, ExecutorError):  # no server: nothing to adopt
            return {}
        found: dict[str, Handle] = {}
        for line in out.splitlines():
            token, pane, window, session, pid, dead = (line.split(_SEP) + [""] * 6)[:6]
            if token:
                found[token] = {"pane": pane, "window": window, "session": session, "pid": int(pid or 0),
                                "pid_started_at": proc.started_at(int(pid or 0)) if pid else None,
                                "dead": dead == "1"}
        return found

    def release(self, handle: Handle) -> None:
        if handle.get("window"):
            self._tmux("kill-window", "-t", handle["window"], check=False)

    # ------------------------------------------------------------------ for the CLI

    def attach_argv(self, handle: Handle) -> list[str]:
        """argv that attaches the user's terminal to the attempt's window."""
        return ["tmux", "-S", self.socket, "attach-session", "-t", handle["session"], ";",
                "select-window", "-t", handle["window"]]

    def capture(self, handle: Handle, *, lines: int = 20) -> str:
        try:
            return self._tmux("capture-pane", "-p", "-t", handle["pane"], "-S", f"-{lines}")
        except (CommandFailed, ExecutorError):
            return ""


def _q(s: str) -> str:
    import shlex

    return shlex.quote(s)
