"""Virtual GPUs for tests, demos, the simulator and laptops without a GPU.

A :class:`FakeProbe` is built from a spec such as ``4x24GiB`` (``GPUSCHED_FAKE_GPUS``).
Memory held by "outside" processes comes from an optional ``usage`` callable and/or a JSON
state file (``GPUSCHED_FAKE_GPU_STATE``) read afresh on every snapshot, e.g.::

    {"0": {"used_mib": 5000, "processes": [{"pid": 1, "used_mib": 5000}]}, "2": {"lost": true}}

(``"lost": true``: the card reads as NVML reads one that fell off the bus.)

Like every probe, ``snapshot()`` never raises: a missing or malformed state file reads as
"no usage".
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from msgspec import Struct

from gpusched.errors import PlanError
from gpusched.model import MIB_PER_GIB, GpuProcess, GpuState

SPEC_ENV = "GPUSCHED_FAKE_GPUS"
STATE_ENV = "GPUSCHED_FAKE_GPU_STATE"
MAX_FAKE_GPUS = 64

_GROUP = re.compile(r"^\s*(\d+)\s*x\s*(\d+(?:\.\d+)?)\s*(gib|gb|g|mib|mb|m)\s*$", re.IGNORECASE)
_MIB_PER_UNIT = {"gib": MIB_PER_GIB, "gb": MIB_PER_GIB, "g": MIB_PER_GIB, "mib": 1, "mb": 1, "m": 1}


class FakeUsage(Struct, frozen=True, kw_only=True):
    """Memory held on one fake GPU by processes the scheduler did not start."""

    used_mib: int = 0
    processes: tuple[GpuProcess, ...] = ()
    util_pct: int | None = None
    lost: bool = False  # the card is gone: it reads as NVML's GPU_IS_LOST does


UsageFn = Callable[[], Mapping[int, FakeUsage]]


def parse_fake_spec(text: str, *, source: str = SPEC_ENV) -> tuple[int, ...]:
    """``"2x80GiB,1x24GiB"`` -> total MiB per GPU, in index order. Units: GiB/GB/G (all
    read as GiB) or MiB/MB/M, any case; sizes may be decimal. Raises :class:`PlanError`."""
    totals: list[int] = []
    for group in text.split(","):
        count, size_mib = _parse_group(group, text, source)
        totals.extend([size_mib] * count)
    if not 0 < len(totals) <= MAX_FAKE_GPUS:
        raise _spec_error(text, source, f"between 1 and {MAX_FAKE_GPUS} GPUs in all")
    return tuple(totals)


def _parse_group(group: str, text: str, source: str) -> tuple[int, int]:
    match = _GROUP.match(group)
    if match is None:
        raise _spec_error(text, source, None)
    count, size, unit = int(match[1]), float(match[2]), match[3].lower()
    size_mib = int(size * _MIB_PER_UNIT[unit])
    if count < 1 or size_mib < 1:
        raise _spec_error(text, source, "count and size must be positive")
    return count, size_mib


def _spec_error(text: str, source: str, detail: str | None) -> PlanError:
    why = f" ({detail})" if detail else ""
    return PlanError(
        f"{source}: {text!r} is not a fake GPU list{why}: use COUNTxSIZE[,COUNTxSIZE...] with SIZE in "
        "GiB or MiB, e.g. 4x24GiB, 2x80GiB,1x24GiB or 3x16000MiB"
    )


class FakeProbe:
    """Virtual GPUs of fixed sizes. ``snapshot()`` reports each as ``GPU-fake-<i>-<size>mib``,
    with the outside usage of ``usage()`` plus the state file added together, capped at the
    card's size."""

    name = "fake"

    def __init__(
        self,
        totals_mib: Sequence[int],
        *,
        usage: UsageFn | None = None,
        state_path: str | Path | None = None,
        clock: Callable[[], float] = time.time,
        source: str = SPEC_ENV,
    ) -> None:
        self.totals_mib = tuple(totals_mib)
        self.usage = usage
        self.state_path = Path(state_path) if state_path else None
        self.clock = clock
        self.source = source

    @classmethod
    def from_spec(
        cls,
        text: str,
        *,
        usage: UsageFn | None = None,
        state_path: str | Path | None = None,
        clock: Callable[[], float] = time.time,
        source: str = SPEC_ENV,
    ) -> FakeProbe:
        """Build from ``"4x24GiB"``-style text; raises :class:`PlanError` naming ``source``."""
        totals = parse_fake_spec(text, source=source)
        return cls(totals, usage=usage, state_path=state_path, clock=clock, source=source)

    def snapshot(self) -> list[GpuState]:
        now = self.clock()
        usage = self._usage()
        return [self._state(i, total, usage.get(i, FakeUsage()), now) for i, total in self._cards()]

    def notice(self) -> str | None:
        return f"fake GPUs: {describe_totals(self.totals_mib)} ({self.source})"

    def _cards(self) -> Iterable[tuple[int, int]]:
        return enumerate(self.totals_mib)

    def _state(self, index: int, total: int, usage: FakeUsage, now: float) -> GpuState:
        uuid = f"GPU-fake-{index}-{total}mib"
        if usage.lost:
            return GpuState(
                index=index, uuid=uuid, name="Fake GPU", total_mib=total, sampled_at=now, lost=True
            )
        used = min(max(usage.used_mib, 0), total)
        return GpuState(
            index=index,
            uuid=uuid,
            name="Fake GPU",
            total_mib=total,
            free_mib=total - used,
            used_mib=used,
            util_pct=usage.util_pct if usage.util_pct is not None else 0,
            processes=usage.processes,
            sampled_at=now,
        )

    def _usage(self) -> dict[int, FakeUsage]:
        parts: list[Mapping[int, FakeUsage]] = [read_state_file(self.state_path)] if self.state_path else []
        if self.usage is not None:
            parts.append(_call_usage(self.usage))
        return merge_usage(parts)


def describe_totals(totals_mib: Sequence[int]) -> str:
    """``(24576, 24576, 8192)`` -> ``"2 x 24.0 GiB, 1 x 8.0 GiB"`` (runs of equal size)."""
    runs: list[list[int]] = []
    for total in totals_mib:
        if runs and runs[-1][1] == total:
            runs[-1][0] += 1
        else:
            runs.append([1, total])
    return ", ".join(f"{count} x {total / MIB_PER_GIB:.1f} GiB" for count, total in runs)


def merge_usage(parts: Iterable[Mapping[int, FakeUsage]]) -> dict[int, FakeUsage]:
    """Add several usage maps together: memory sums, processes concatenate, util takes the max."""
    merged: dict[int, FakeUsage] = {}
    for part in parts:
        for index, extra in part.items():
            merged[index] = _add(merged.get(index), extra)
    return merged


def _add(base: FakeUsage | None, extra: FakeUsage) -> FakeUsage:
    if base is None:
        return extra
    utils = [u for u in (base.util_pct, extra.util_pct) if u is not None]
    return FakeUsage(
        used_mib=base.used_mib + extra.used_mib,
        processes=base.processes + extra.processes,
        util_pct=max(utils) if utils else None,
        lost=base.lost or extra.lost,
    )


def _call_usage(usage: UsageFn) -> Mapping[int, FakeUsage]:
    # A probe never raises into the loop, even when a test's or the simulator's callable does.
    try:
        return dict(usage())
    except Exception:
        return {}


def read_state_file(path: Path | None) -> dict[int, FakeUsage]:
    """The outside usage written in a JSON state file; ``{}`` when it is missing or malformed.
    Malformed entries are skipped one by one."""
    if path is None:
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    parsed = {_int_or_none(k): _usage_entry(v) for k, v in data.items()}
    return {k: v for k, v in parsed.items() if k is not None and v is not None}


def _usage_entry(raw: Any) -> FakeUsage | None:
    if not isinstance(raw, dict):
        return None
    procs = tuple(p for p in map(_process_entry, _as_list(raw.get("processes"))) if p is not None)
    used = _int_or_none(raw.get("used_mib"))
    if used is None:
        used = sum(p.used_mib or 0 for p in procs)
    util = _int_or_none(raw.get("util_pct"))
    return FakeUsage(used_mib=used, processes=procs, util_pct=util, lost=raw.get("lost") is True)


def _process_entry(raw: Any) -> GpuProcess | None:
    pid = _int_or_none(raw.get("pid")) if isinstance(raw, dict) else None
    if pid is None:
        return None
    return GpuProcess(pid=pid, used_mib=_int_or_none(raw.get("used_mib")))


def _as_list(raw: Any) -> list[Any]:
    return raw if isinstance(raw, list) else []


def _int_or_none(raw: Any) -> int | None:
    if isinstance(raw, bool):
        return None
    try:
        return int(raw)
    except (TypeError, ValueError):
        return None
