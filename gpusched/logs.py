"""Module loggers that import :mod:`logging` on first use; the last lines of a log file.

``gpusched status`` imports the daemon's and the memory watch's modules for a few of their
functions and logs nothing; importing :mod:`logging` for their module-level loggers cost it
~21 M instructions (~5 ms) of a ~470 M command. Everything else is :mod:`logging` itself:
the same named loggers, levels, handlers and ``caplog``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import logging


class _OnFirstUse:
    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:  # log.info, log.warning, ...: the real logger's
        import logging

        return getattr(logging.getLogger(self._name), attr)


def logger(name: str) -> logging.Logger:
    """``logging.getLogger(name)``, looked up at each use instead of at import."""
    return cast("logging.Logger", _OnFirstUse(name))


def tail(path: Path, max_bytes: int) -> str:
    """The whole lines among the last ``max_bytes`` of ``path`` ('' if unreadable)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return ""
    if size > max_bytes:
        data = data.partition(b"\n")[2]
    return data.decode("utf-8", "replace")


def last_line(text: str) -> str:
    """The last line of ``text`` that is not blank, stripped ('' when there is none)."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else ""
