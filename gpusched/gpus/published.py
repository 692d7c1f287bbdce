"""The daemon's latest GPU snapshot, published for clients.

``status`` shows the snapshot the daemon last scheduled with instead of initialising NVML
itself (tens to hundreds of milliseconds per call on a machine with GPUs). The daemon writes
``gpus.json`` in the state directory at most once per tick interval (a temp file renamed
over it: a reader never sees half of one); a reader takes it only while it is fresh and
probes the GPUs itself otherwise (no daemon, or a daemon stuck in a failing tick).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import msgspec

from gpusched.home import Home
from gpusched.model import GpuProcess, GpuState

#: A snapshot older than this is not shown: the daemon publishes one every second or so.
MAX_AGE_S = 5.0


def path(home: Home) -> Path:
    return home.root / "gpus.json"


def publish(home: Home, gpus: Sequence[GpuState], *, notice: str | None, now: float) -> None:
    """Write ``gpus`` (and the probe's notice) as seen at ``now``, atomically."""
    doc = {"at": now, "notice": notice, "gpus": msgspec.to_builtins(gpus)}
    target = path(home)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, target)


def read(home: Home, *, now: float, max_age_s: float = MAX_AGE_S) -> tuple[list[GpuState], str | None] | None:
    """(GPUs, the probe's notice) of a snapshot published less than ``max_age_s`` ago, else None."""
    try:
        doc = json.loads(path(home).read_text())
        if not -1.0 <= now - float(doc["at"]) <= max_age_s:
            return None
        gpus = [
            GpuState(**{**g, "processes": tuple(GpuProcess(**p) for p in g["processes"])})
            for g in doc["gpus"]
        ]
        notice = doc.get("notice")
        return gpus, str(notice) if notice is not None else None
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def published_at(home: Home) -> float | None:
    """When the daemon last published a snapshot (the end of its last tick that worked), or None."""
    try:
        return float(json.loads(path(home).read_text())["at"])
    except (OSError, ValueError, TypeError, KeyError):
        return None
