"""The ``gpusched`` command (and ``python -m gpusched``): the CLI, after one thing done first.

When the command is ``submit`` and no daemon runs, the daemon that will run the suite is
started on standby (:class:`~gpusched.daemon.Starting`) before the CLI itself is imported:
its interpreter start and imports, the longest part of a night's first launch, then overlap
all of ``submit``'s own (the CLI's imports, msgspec, reading and queueing the plan) instead
of beginning after the first of them. This module reads the arguments only as far as that
needs: the command word, ``--dry-run`` and ``--fake-gpus``; argparse stays the judge of
them. ``submit`` checks what was guessed here and replaces a daemon started for other GPUs
than it settles on (:func:`gpusched.cli._standby`); a refused or empty submit lets it go, and
it exits without a trace.
"""

from __future__ import annotations

import gc
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpusched.daemon import Starting

#: Arguments that make ``submit`` start no daemon (or not run at all).
_NO_DAEMON = frozenset({"--dry-run", "-h", "--help", "--version"})


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # What the CLI's imports make (modules, classes, functions) lives as long as the process.
    # Made without the cyclic collector and frozen after (``gc.freeze``), it is walked by no
    # collection again, the one at exit included: ~17-20 M instructions fewer in every command
    # (callgrind: 3 % of a 10k-job `status --json`, 7 % of `status`, 10 % of `--version`).
    # Everything made later (a command's work, the daemon's night) is collected as before.
    gc.disable()
    try:
        early = standby_for(argv)
        from gpusched.cli import main as cli
    finally:
        gc.freeze()
        gc.enable()
    try:
        return cli(argv, early=early)
    finally:
        if early is not None:
            early.cancel()  # (a no-op once it was told to go)


def standby_for(argv: list[str]) -> Starting | None:
    """A daemon on standby for ``argv`` when it is a ``submit`` that will want one and none
    runs; None otherwise, and where anything goes wrong (``submit`` then tries again, and
    says what is wrong in its own words)."""
    named = next((a for a in argv if not a.startswith("-")), None)  # (global options take no value)
    if named != "submit" or _NO_DAEMON.intersection(argv):
        return None
    from gpusched import daemon
    from gpusched.cli_common import _probe_spec
    from gpusched.errors import GpuschedError
    from gpusched.home import Home

    fake = None
    for i, arg in enumerate(argv):
        if arg == "--fake-gpus" and i + 1 < len(argv):
            fake = argv[i + 1]
        elif arg.startswith("--fake-gpus="):
            fake = arg.partition("=")[2]
    try:
        return daemon.prestart(Home.from_env(), probe=_probe_spec(fake))
    except (GpuschedError, OSError):
        return None
