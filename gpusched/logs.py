"""Module loggers that import :mod:`logging` on first use.

``gpusched status`` imports the daemon's and the memory watch's modules for a few of their
functions and logs nothing; importing :mod:`logging` for their module-level loggers cost it
~21 M instructions (~5 ms) of a ~470 M command. Everything else is :mod:`logging` itself:
the same named loggers, levels, handlers and ``caplog``.
"""

from __future__ import annotations

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
