"""Build an executor by name (``submit`` checks the name: :func:`gpusched.cli_common.check_backend`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpusched.errors import ExecutorError

if TYPE_CHECKING:
    from gpusched.executors import Executor
    from gpusched.home import Home


def make_executor(name: str, home: Home) -> Executor:
    if name == "tmux":
        import os

        from gpusched.executors.tmux_reuse import TmuxReuseExecutor, TmuxWindowExecutor, panes_wanted

        panes = panes_wanted(os.environ)  # auto (SHORT_S), reuse or job
        if panes == "auto":
            return TmuxReuseExecutor(home)
        if panes == "reuse":
            return TmuxReuseExecutor(home, short_s=None)
        return TmuxWindowExecutor(home)
    if name == "subprocess":
        from gpusched.executors.subprocess import SubprocessExecutor

        return SubprocessExecutor(home)
    if name == "slurm":
        from gpusched.executors.slurm import SlurmExecutor

        return SlurmExecutor(home)
    raise ExecutorError(f"unknown backend {name!r}")
