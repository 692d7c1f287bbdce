"""One user-facing error root. The CLI prints any :class:`GpuschedError` as one line and exits 2.

A message says what was wrong, where (file, key, flag) and how to fix it.
"""

from __future__ import annotations

from collections.abc import Iterable


class GpuschedError(Exception):
    """Base of every error a user may see. ``str(err)`` is the whole one-line message."""

    exit_code = 2

    def __str__(self) -> str:
        # one line whatever a user typed into the value it quotes (`--gpus $'0\n1'`)
        return super().__str__().replace("\r", "\\r").replace("\n", "\\n")


class PlanError(GpuschedError):
    """A suite plan file, or a plan-like flag (--gpu-plan, --gpus, --pairs), is wrong."""


class UsageError(GpuschedError):
    """A command was asked for something that cannot be done (unknown job, bad state...)."""


class StoreError(GpuschedError):
    """The state database cannot be opened or is from a newer gpusched."""


class DaemonError(GpuschedError):
    """The scheduler daemon could not be started, reached or stopped."""


class ExecutorError(GpuschedError):
    """A backend (tmux, processes, Slurm) is missing or refused a request."""


class IllegalTransition(GpuschedError):
    """A job was asked to move between two states that have no legal move between them."""

    def __init__(self, job_id: str, old: str, new: str) -> None:
        super().__init__(f"job {job_id}: illegal state change {old} -> {new}")
        self.job_id, self.old, self.new = job_id, old, new


class CommandFailed(GpuschedError):
    """An external command (tmux, sbatch, ...) exited non-zero."""

    def __init__(self, cmd: Iterable[str], returncode: int, stderr: str) -> None:
        self.cmd, self.returncode, self.stderr = list(cmd), returncode, stderr.strip()
        last = self.stderr.splitlines()[-1] if self.stderr else "no message"
        super().__init__(f"{self.cmd[0]} exited {returncode}: {last}")


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` when a close choice exists, else ``''``."""
    import difflib  # only on the way to an error message

    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""
