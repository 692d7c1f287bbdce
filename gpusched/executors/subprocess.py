"""Attempts as plain detached processes: ``sh wrap.sh DIR file`` in its own session.

For machines without tmux, CI, and speed (no terminal emulation). A process started here
outlives the daemon; a restarted daemon finds it again by the token in its environment.
"""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass, field

from gpusched import proc
from gpusched.executors import WRAPPER, Handle, LaunchRequest
from gpusched.home import Home


@dataclass
class SubprocessExecutor:
    home: Home
    name: str = "subprocess"
    _children: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    def launch(self, req: LaunchRequest) -> Handle:
        env = {**os.environ, **req.env, "GPUSCHED_TOKEN": req.token}
        p = proc.spawn(["sh", str(WRAPPER), str(req.attempt_dir), "file"], env=env, cwd=str(req.workdir))
        self._children[p.pid] = p
        return {"pid": p.pid, "pid_started_at": proc.started_at(p.pid)}

    def alive(self, handle: Handle) -> bool:
        pid = handle.get("pid")
        child = self._children.get(pid) if pid else None
        if child is not None:  # our own child: poll() also reaps it (no zombies)
            if child.poll() is None:
                return True
            del self._children[pid]
            return False
        return proc.is_alive(pid, handle.get("pid_started_at"))

    def terminate(self, handle: Handle, *, force: bool = False) -> None:
        pid = handle.get("pid")
        if pid and proc.is_alive(pid, handle.get("pid_started_at")):
            proc.signal_group(pid, signal.SIGKILL if force else signal.SIGTERM)

    def discover(self) -> dict[str, Handle]:
        """Live wrappers of this user, by the token in their environment."""
        import psutil

        found: dict[str, Handle] = {}
        me = os.getuid()
        for p in psutil.process_iter(["pid", "uids", "cmdline", "create_time"]):
            try:
                if p.info["uids"] is None or p.info["uids"].real != me:
                    continue
                cmd = p.info["cmdline"] or []
                if len(cmd) < 2 or not cmd[1].endswith("wrap.sh"):
                    continue
                token = p.environ().get("GPUSCHED_TOKEN")
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            if token:
                found[token] = {"pid": p.pid, "pid_started_at": p.info["create_time"]}
        return found

    def release(self, handle: Handle) -> None:
        pass
