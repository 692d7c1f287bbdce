"""Test helpers: poll for a condition instead of sleeping a fixed time."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def retry_until(predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.02) -> T:
    """Call ``predicate`` until it returns something truthy; return that value.
    Raises AssertionError naming the predicate after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: T = predicate()
    while not last:
        if time.monotonic() > deadline:
            raise AssertionError(
                f"condition not met within {timeout} s: {getattr(predicate, '__name__', predicate)}"
            )
        time.sleep(interval)
        last = predicate()
    return last


def read_launch(path: Path) -> tuple[dict[str, str], str]:
    """(injected variables, command line) of an attempt, read back from its launch.sh the way
    a user would: the `export` lines after the "injected" comment, the lines after "the command"."""
    import shlex

    text = path.read_text()
    head, _, command = text.partition("\n# the command:\n")
    injected = head.split("\n# injected by gpusched (tier, GPU, attempt):\n", 1)[1].rpartition("\ncd ")[0]
    words = [w for w in shlex.split(injected) if w != "export"]
    return dict(w.partition("=")[::2] for w in words), command.rstrip("\n")
