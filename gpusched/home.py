"""Where a user's gpusched state lives: one private directory per user (GPUs are a
machine-wide resource shared by all of a user's projects)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple


def this_host() -> str:
    """This machine's name, as gpusched records it: in ``daemon.json`` and in the handle of
    every attempt started as a process or tmux pane of this machine."""
    return os.uname().nodename


class Home(NamedTuple):
    """Every path of the per-user state directory. Created 0700 by :meth:`ensure`. (A plain
    tuple, not a msgspec record: ``submit`` finds it before msgspec is imported, see
    :mod:`gpusched.entry`.)"""

    root: Path

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Home:
        env = os.environ if environ is None else environ
        if env.get("GPUSCHED_HOME"):
            return cls(Path(env["GPUSCHED_HOME"]).expanduser().absolute())
        state = env.get("XDG_STATE_HOME") or str(Path("~/.local/state").expanduser())
        return cls(Path(state).absolute() / "gpusched")

    @property
    def db(self) -> Path:
        return self.root / "gpusched.db"

    @property
    def lock(self) -> Path:
        return self.root / "daemon.lock"

    @property
    def daemon_info(self) -> Path:
        """JSON with the running daemon's pid, start time, backend and probe."""
        return self.root / "daemon.json"

    @property
    def daemon_log(self) -> Path:
        return self.root / "daemon.log"

    @property
    def notify_log(self) -> Path:
        """What the plans' ``notify:`` commands were run for, and what they printed."""
        return self.root / "notify.log"

    @property
    def wake(self) -> Path:
        """FIFO the daemon listens on; a byte written here makes it tick at once."""
        return self.root / "wake"

    @property
    def tmux_socket(self) -> Path:
        return self.root / "tmux.sock"

    @property
    def tmux_conf(self) -> Path:
        return self.root / "tmux.conf"

    def suite_env(self, suite: str) -> Path:
        """The submitting shell's environment for ``suite``, as a sourceable sh file (0600)."""
        return self.root / "env" / f"{suite}.sh"

    def ensure(self) -> Home:
        """Make the state directory (0700); UsageError when it cannot be made there."""
        try:
            for d in (self.root, self.root / "env"):
                d.mkdir(parents=True, exist_ok=True)
                os.chmod(d, 0o700)
        except OSError as e:
            from gpusched.errors import UsageError

            where = "GPUSCHED_HOME" if os.environ.get("GPUSCHED_HOME") else "XDG_STATE_HOME or your home"
            raise UsageError(
                f"cannot make gpusched's state directory {self.root} ({e.strerror or e}): "
                f"point {where} at a folder you can write"
            ) from None
        return self
