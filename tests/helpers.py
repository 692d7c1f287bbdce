"""Test helpers: poll for a condition instead of sleeping a fixed time."""

from __future__ import annotations

import time
from collections.abc import Callable
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
