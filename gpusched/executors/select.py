"""Pick and build an executor by name."""

from __future__ import annotations

import shutil

from gpusched.errors import ExecutorError, UsageError
from gpusched.executors import Executor
from gpusched.home import Home

BACKENDS = ("tmux", "subprocess", "slurm")


def default_backend() -> str:
    """tmux when it is on PATH (panes to attach to), plain detached processes otherwise."""
    return "tmux" if shutil.which("tmux") else "subprocess"


def check_backend(name: str) -> str:
    """Validate ``--backend`` before anything is enqueued."""
    if name not in BACKENDS:
        from gpusched.errors import did_you_mean

        raise UsageError(
            f"--backend {name}: unknown backend{did_you_mean(name, BACKENDS)}; "
            f"use one of {', '.join(BACKENDS)}"
        )
    if name == "tmux" and not shutil.which("tmux"):
        raise ExecutorError(
            "--backend tmux: tmux is not on PATH; "
            "install it (apt-get install tmux) or use --backend subprocess"
        )
    if name == "slurm":
        from gpusched.executors.slurm import check_available

        check_available()
    return name


def make_executor(name: str, home: Home) -> Executor:
    if name == "tmux":
        import os

        from gpusched.executors.tmux_reuse import TmuxReuseExecutor, reuse_wanted

        if reuse_wanted(os.environ):
            return TmuxReuseExecutor(home)
        from gpusched.executors.tmux import TmuxExecutor

        return TmuxExecutor(home)
    if name == "subprocess":
        from gpusched.executors.subprocess import SubprocessExecutor

        return SubprocessExecutor(home)
    if name == "slurm":
        from gpusched.executors.slurm import SlurmExecutor

        return SlurmExecutor(home)
    raise ExecutorError(f"unknown backend {name!r}")
