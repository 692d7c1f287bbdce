"""Module loggers that import :mod:`logging` on first use; the last lines of a log file.

``gpusched status`` imports the daemon's and the memory watch's modules for a few of their
functions and logs nothing; importing :mod:`logging` for their module-level loggers cost it
~21 M instructions (~5 ms) of a ~470 M command. Everything else is :mod:`logging` itself:
the same named loggers, levels, handlers and ``caplog``.
"""

from __future__ import annotations

import re
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


#: What a terminal takes as an instruction rather than text: colours and cursor moves (CSI,
#: ``ESC [ ... m``), window titles and links (OSC, ``ESC ] ... BEL``), the other escapes, and
#: the C0 controls but tab and the line ends. A trainer's coloured logger or progress bar
#: writes them into output.log; shown as text they are ``[1;31m`` noise in ``status``.
_CONTROLS = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI: colours, cursor moves, erase
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC: window title, hyperlink
    r"|\x1b[ -/]*[0-~]?"  # the other escapes: ESC ( B, ESC 7, ...
    r"|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]"  # C0 controls but tab, \n and \r
)


def plain(text: str) -> str:
    """``text`` without terminal control sequences: what a reader of the terminal saw as text."""
    return _CONTROLS.sub("", text)


def last_line(text: str) -> str:
    """The last line of ``text`` that is not blank, as text (no colours), stripped ('' if none)."""
    lines = [ln for ln in plain(text).strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else ""
