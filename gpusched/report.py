"""The numbers of a suite's night, as plain data: what ran where, for how long, what it cost.

:func:`compute` turns plain rows (:class:`Attempt`, :class:`Job`, :class:`Sample`) into a
:class:`SuiteReport`; it touches no clock, file or database, so the simulator and the unit
tests feed it hand-made rows. :func:`from_store` is the one adapter from the state database.
Rendering (rich, CSV, JSON) lives in ``report_render``, the timeline picture in ``plot``.

Definitions a caller may rely on (the README repeats them):

* an attempt runs from ``started_at`` (``launched_at`` before its process existed) to
  ``ended_at``; one still running counts up to ``now``. Each attempt holds one GPU.
* *wall time*: from the suite's first attempt start to its last attempt end.
* *GPU-hours used*: the sum of attempt runtimes. *GPU-hours lost*: the runtime of attempts
  whose outcome is not ``ok`` (``oom``, ``host_oom``, ``error``, ``timeout``, ``gpu_fault``,
  ``disk_full``, ``network``, ``lost``, ``cancelled``) and whose work was not resumed, i.e. the
  job's next attempt did not start from a checkpoint.
  (Steps after the last checkpoint of a resumed attempt are lost too, but cannot be seen,
  so "lost" is a lower bound then.)
* *busy fraction* of a GPU: the union of its attempts' intervals / wall time (how long it
  ran anything); *slot occupancy*: the sum of its attempts' runtimes / (slots x wall time).
* *peak memory* of a GPU: the larger of its attempts' ``peak_mib`` and the daemon's
  ``gpu_samples.used_mib`` taken on it during the wall time.
* *util* of a GPU: the mean of the daemon's ``gpu_samples.util_pct`` (NVML's share of time a
  kernel ran, every 10 s) taken on it while it ran one of the suite's attempts; of an
  attempt: those taken on its GPU while it ran (the card's, whatever else ran there).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from msgspec import Struct
from msgspec.structs import replace

#: Outcomes reported for attempts, in display order (``running``: not ended yet).
OUTCOMES = (
    "ok", "oom", "host_oom", "error", "timeout", "gpu_fault", "disk_full", "network", "lost", "cancelled",
    "running",
)  # fmt: skip
#: Columns of :func:`attempt_records` (CSV header, JSON keys), in order.
COLUMNS = (
    "job",
    "attempt",
    "tier",
    "gpu",
    "lane",
    "start",
    "end",
    "duration_s",
    "outcome",
    "peak_mib",
    "lost",
    "reason",
    "log",
    "start_ts",
    "end_ts",
    "util_pct",
)
#: The line ``tiers.resolve`` puts in a resumed attempt's config.yaml header.
_RESUME_NOTE = "# injected: resume from "


# --------------------------------------------------------------------------- input rows


class Attempt(Struct, frozen=True, kw_only=True):
    """One attempt of a job, as the report needs it."""

    job: str  # job id, suite/name
    n: int  # 1-based attempt number
    tier: str  # tier name
    gpu: int | None
    start: float
    end: float | None  # None: still running
    outcome: str | None  # None while running
    peak_mib: int | None = None
    reason: str | None = None
    line: str | None = None
    log: str | None = None  # output.log of the attempt
    resumed: bool = False  # started from a checkpoint an earlier attempt of its job left

    @classmethod
    def from_row(cls, r: Any, *, resumed: bool = False) -> Attempt:
        """From a store ``AttemptRow``, a mapping with its column names, or an :class:`Attempt`."""
        if isinstance(r, Attempt):
            return r
        g = _getter(r)
        start = g("started_at") or g("launched_at") or g("start")
        log = g("log") or (str(Path(g("dir")) / "output.log") if g("dir") else None)
        return cls(
            job=g("job_id") or g("job"),
            n=int(g("n") or g("attempt") or 1),
            tier=str(g("tier_name") or g("tier") or "?"),
            gpu=g("gpu"),
            start=float(start or 0.0),
            end=g("ended_at") if g("ended_at") is not None else g("end"),
            outcome=g("outcome"),
            peak_mib=g("peak_mib"),
            reason=g("reason"),
            line=g("line"),
            log=log,
            resumed=bool(g("resumed") or resumed),
        )


class Job(Struct, frozen=True, kw_only=True):
    """A job's final word: its state and why."""

    id: str
    state: str  # queued, running, succeeded, failed, cancelled
    outcome: str | None = None
    reason: str | None = None
    line: str | None = None

    @classmethod
    def from_row(cls, r: Any) -> Job:
        if isinstance(r, Job):
            return r
        g = _getter(r)
        return cls(
            id=g("id"), state=str(g("state")), outcome=g("outcome"), reason=g("reason"), line=g("line")
        )


class Sample(Struct, frozen=True, kw_only=True):
    """One GPU sample (``gpu_samples`` row): memory and utilisation."""

    at: float
    gpu: int
    used_mib: int | None
    total_mib: int | None = None
    util_pct: int | None = None

    @classmethod
    def from_row(cls, r: Any) -> Sample:
        if isinstance(r, Sample):
            return r
        g = _getter(r)
        return cls(
            at=float(g("at")),
            gpu=int(g("gpu")),
            used_mib=g("used_mib"),
            total_mib=g("total_mib"),
            util_pct=g("util_pct"),
        )


def _getter(r: Any) -> Any:
    if isinstance(r, Mapping):
        return lambda k: r.get(k)
    if hasattr(r, "keys"):  # sqlite3.Row
        keys = set(r.keys())
        return lambda k: r[k] if k in keys else None
    return lambda k: getattr(r, k, None)


# --------------------------------------------------------------------------- output


class AttemptLine(Struct, frozen=True, kw_only=True):
    """An attempt as reported: its lane on its GPU, duration and whether its time was lost."""

    job: str
    n: int
    tier: str
    gpu: int | None
    lane: int  # 0-based slot lane on its GPU (greedy by start time)
    start: float
    end: float  # ``now`` for a running attempt
    duration_s: float
    outcome: str  # one of OUTCOMES
    peak_mib: int | None
    lost: bool
    reason: str | None
    line: str | None
    log: str | None
    util_pct: int | None = None  # its GPU's mean sampled utilisation while it ran


class JobLine(Struct, frozen=True, kw_only=True):
    id: str
    state: str
    attempts: int
    tier: str | None  # tier of its last attempt (where a finished job finished)
    path: str  # e.g. "A:oom > B:oom > C:ok"
    start: float | None
    end: float | None
    span_s: float  # first attempt start -> last attempt end
    gpu_s: float
    lost_s: float
    reason: str | None
    line: str | None
    log: str | None  # the last attempt's output.log


class GpuLine(Struct, frozen=True, kw_only=True):
    gpu: int | None
    slots: int  # from the suite's --gpu-plan; the lanes used when unknown
    lanes: int
    attempts: int
    busy_s: float
    busy_fraction: float
    occupancy: float
    peak_mib: int | None
    peak_source: str | None  # "attempt" or "sampled"
    total_mib: int | None
    util_pct: int | None = None  # mean sampled utilisation while it ran the suite's attempts


class SuiteReport(Struct, frozen=True, kw_only=True):
    suite: str
    now: float
    start: float | None
    end: float | None
    wall_s: float
    states: dict[str, int]
    outcomes: dict[str, int]
    finished_at: dict[str, int]  # tier name -> finished (succeeded/failed) jobs that ended there
    gpu_hours: float
    lost_gpu_hours: float
    jobs: tuple[JobLine, ...]
    attempts: tuple[AttemptLine, ...]
    gpus: tuple[GpuLine, ...]
    samples: tuple[Sample, ...] = ()

    @property
    def failing(self) -> list[JobLine]:
        """Jobs that ended failed (the reason and log of their last attempt)."""
        return [j for j in self.jobs if j.state == "failed"]

    def slowest(self, n: int = 5) -> list[JobLine]:
        """The ``n`` jobs with the longest span, longest first."""
        return sorted((j for j in self.jobs if j.attempts), key=lambda j: -j.span_s)[:n]

    @property
    def attempts_per_job(self) -> dict[int, int]:
        """Number of attempts -> how many jobs needed that many."""
        return dict(sorted(Counter(j.attempts for j in self.jobs).items()))


# --------------------------------------------------------------------------- the numbers


def compute(
    attempts: Iterable[Any],
    *,
    jobs: Iterable[Any] | None = None,
    samples: Iterable[Any] = (),
    slots: Mapping[int, int] | None = None,
    now: float | None = None,
    suite: str = "",
) -> SuiteReport:
    """The report over plain rows. ``jobs`` default to what the attempts imply; ``slots`` is
    GPU -> its cap in the suite's --gpu-plan; ``now`` ends still-running attempts (default:
    the last end seen, so the result never depends on the clock)."""
    atts = sorted((Attempt.from_row(a) for a in attempts), key=lambda a: (a.start, a.job, a.n))
    ends = [a.end for a in atts if a.end is not None]
    now = now if now is not None else max([*ends, *(a.start for a in atts)], default=0.0)
    lines = _attempt_lines(atts, now)
    start = min((a.start for a in lines), default=None)
    end = max((a.end for a in lines), default=None)
    wall = (end - start) if start is not None and end is not None else 0.0
    job_rows = [Job.from_row(j) for j in jobs] if jobs is not None else _implied_jobs(atts)
    in_window = [
        s
        for s in map(Sample.from_row, samples)
        if start is not None and end is not None and start <= s.at <= end
    ]
    utils = _utils(in_window)
    lines = [replace(a, util_pct=_mean_util(utils.get(a.gpu, []), [(a.start, a.end)])) for a in lines]
    return SuiteReport(
        suite=suite,
        now=now,
        start=start,
        end=end,
        wall_s=wall,
        states=dict(Counter(j.state for j in job_rows)),
        outcomes={k: v for k in OUTCOMES if (v := sum(a.outcome == k for a in lines))},
        finished_at=_finished_at(job_rows, lines),
        gpu_hours=sum(a.duration_s for a in lines) / 3600,
        lost_gpu_hours=sum(a.duration_s for a in lines if a.lost) / 3600,
        jobs=tuple(_job_lines(job_rows, lines)),
        attempts=tuple(lines),
        gpus=tuple(_gpu_lines(lines, in_window, slots or {}, wall, utils)),
        samples=tuple(in_window),
    )


def assign_lanes(intervals: Sequence[tuple[float, float]]) -> list[int]:
    """Greedy interval partitioning: in order of start, each interval takes the lowest lane
    free by its start. Returns a lane per interval (in the given order); the number of lanes
    is the peak number of overlapping intervals."""
    order = sorted(range(len(intervals)), key=lambda i: intervals[i])
    lane_end: list[float] = []
    out = [0] * len(intervals)
    for i in order:
        s, e = intervals[i]
        free = next((k for k, t in enumerate(lane_end) if t <= s), None)
        if free is None:
            lane_end.append(e)
            free = len(lane_end) - 1
        lane_end[free] = e
        out[i] = free
    return out


def union_s(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length covered by the union of ``intervals``."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None and cur_s is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None and cur_s is not None:
        total += cur_e - cur_s
    return total


def _attempt_lines(atts: list[Attempt], now: float) -> list[AttemptLine]:
    resumed_next = {(a.job, a.n - 1) for a in atts if a.resumed}
    spans = [(a.start, max(a.start, a.end if a.end is not None else now)) for a in atts]
    lanes = [0] * len(atts)
    for gpu in {a.gpu for a in atts}:
        idx = [i for i, a in enumerate(atts) if a.gpu == gpu]
        for i, lane in zip(idx, assign_lanes([spans[i] for i in idx]), strict=True):
            lanes[i] = lane
    out = []
    for a, (s, e), lane in zip(atts, spans, lanes, strict=True):
        outcome = "running" if a.end is None else (a.outcome or "lost")
        lost = outcome not in ("ok", "running") and (a.job, a.n) not in resumed_next
        out.append(
            AttemptLine(
                job=a.job,
                n=a.n,
                tier=a.tier,
                gpu=a.gpu,
                lane=lane,
                start=s,
                end=e,
                duration_s=e - s,
                outcome=outcome,
                peak_mib=a.peak_mib,
                lost=lost,
                reason=a.reason,
                line=a.line,
                log=a.log,
            )
        )
    return out


def _implied_jobs(atts: list[Attempt]) -> list[Job]:
    last: dict[str, Attempt] = {}
    for a in atts:
        if a.job not in last or a.n > last[a.job].n:
            last[a.job] = a
    state = {"ok": "succeeded", None: "running", "cancelled": "cancelled"}
    return [
        Job(
            id=a.job,
            state=state.get(a.outcome if a.end is not None else None, "failed"),
            outcome=a.outcome,
            reason=a.reason,
            line=a.line,
        )
        for a in last.values()
    ]


def _finished_at(jobs: list[Job], lines: list[AttemptLine]) -> dict[str, int]:
    last = _last_by_job(lines)
    done = [last[j.id].tier for j in jobs if j.state in ("succeeded", "failed") and j.id in last]
    return dict(sorted(Counter(done).items()))


def _last_by_job(lines: list[AttemptLine]) -> dict[str, AttemptLine]:
    out: dict[str, AttemptLine] = {}
    for a in lines:
        if a.job not in out or a.n > out[a.job].n:
            out[a.job] = a
    return out


def _job_lines(jobs: list[Job], lines: list[AttemptLine]) -> list[JobLine]:
    by_job: dict[str, list[AttemptLine]] = {}
    for a in sorted(lines, key=lambda a: (a.job, a.n)):
        by_job.setdefault(a.job, []).append(a)
    out = []
    for j in jobs:
        mine = by_job.get(j.id, [])
        start = min((a.start for a in mine), default=None)
        end = max((a.end for a in mine), default=None)
        out.append(
            JobLine(
                id=j.id,
                state=j.state,
                attempts=len(mine),
                tier=mine[-1].tier if mine else None,
                path=" > ".join(f"{a.tier}:{a.outcome}" for a in mine),
                start=start,
                end=end,
                span_s=(end - start) if start is not None and end is not None else 0.0,
                gpu_s=sum(a.duration_s for a in mine),
                lost_s=sum(a.duration_s for a in mine if a.lost),
                reason=j.reason or (mine[-1].reason if mine else None),
                line=j.line or (mine[-1].line if mine else None),
                log=mine[-1].log if mine else None,
            )
        )
    return out


def _utils(samples: list[Sample]) -> dict[int | None, list[tuple[float, int]]]:
    """Each GPU's utilisation samples, ``(at, util_pct)`` in time order."""
    out: dict[int | None, list[tuple[float, int]]] = {}
    for s in samples:
        if s.util_pct is not None:
            out.setdefault(s.gpu, []).append((s.at, s.util_pct))
    for seq in out.values():
        seq.sort()
    return out


def _mean_util(utils: list[tuple[float, int]], intervals: Iterable[tuple[float, float]]) -> int | None:
    """The mean of the utilisation samples ``utils`` (``(at, util_pct)``, in time order) taken
    inside any of ``intervals``, rounded; None where none was taken there (an attempt shorter
    than the daemon's 10 s between samples)."""
    from bisect import bisect_left, bisect_right

    taken: set[int] = set()
    ats = [at for at, _ in utils]
    for s, e in intervals:
        taken.update(range(bisect_left(ats, s), bisect_right(ats, e)))
    return round(sum(utils[i][1] for i in taken) / len(taken)) if taken else None


def _gpu_lines(
    lines: list[AttemptLine],
    samples: list[Sample],
    slots: Mapping[int, int],
    wall_s: float,
    utils: Mapping[int | None, list[tuple[float, int]]],
) -> list[GpuLine]:
    gpus = sorted({a.gpu for a in lines}, key=lambda g: (g is None, g if g is not None else 0))
    out = []
    for g in gpus:
        mine = [a for a in lines if a.gpu == g]
        lanes = 1 + max(a.lane for a in mine)
        cap = slots.get(g, lanes) if g is not None else lanes
        busy = union_s((a.start, a.end) for a in mine)
        peak, source = _peak(mine, [s for s in samples if s.gpu == g])
        totals = [s.total_mib for s in samples if s.gpu == g and s.total_mib]
        out.append(
            GpuLine(
                gpu=g,
                slots=cap,
                lanes=lanes,
                attempts=len(mine),
                busy_s=busy,
                busy_fraction=busy / wall_s if wall_s > 0 else 0.0,
                occupancy=sum(a.duration_s for a in mine) / (cap * wall_s) if wall_s > 0 and cap else 0.0,
                peak_mib=peak,
                peak_source=source,
                total_mib=max(totals, default=None),
                util_pct=_mean_util(utils.get(g, []), [(a.start, a.end) for a in mine]),
            )
        )
    return out


def _peak(lines: list[AttemptLine], samples: list[Sample]) -> tuple[int | None, str | None]:
    by_attempt = max((a.peak_mib for a in lines if a.peak_mib is not None), default=None)
    sampled = max((s.used_mib for s in samples if s.used_mib is not None), default=None)
    if sampled is not None and (by_attempt is None or sampled > by_attempt):
        return sampled, "sampled"
    return (by_attempt, "attempt") if by_attempt is not None else (None, None)


# --------------------------------------------------------------------------- plain records


def attempt_records(rep: SuiteReport) -> list[dict[str, Any]]:
    """One plain dict per attempt with the keys of :data:`COLUMNS` (times as ISO 8601 UTC in
    ``start``/``end`` and epoch seconds in ``start_ts``/``end_ts``), ready for CSV, JSON, pandas."""
    return [
        {
            "job": a.job,
            "attempt": a.n,
            "tier": a.tier,
            "gpu": a.gpu,
            "lane": a.lane,
            "start": _iso(a.start),
            "end": _iso(a.end) if a.outcome != "running" else None,
            "duration_s": round(a.duration_s, 3),
            "outcome": a.outcome,
            "peak_mib": a.peak_mib,
            "lost": a.lost,
            "reason": a.reason,
            "log": a.log,
            "start_ts": a.start,
            "end_ts": a.end if a.outcome != "running" else None,
            "util_pct": a.util_pct,
        }
        for a in rep.attempts
    ]


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).isoformat(timespec="milliseconds")


# --------------------------------------------------------------------------- the store adapter


def from_store(store: Any, suite: str, *, now: float | None = None) -> SuiteReport:
    """The report of ``suite`` from a :class:`gpusched.store.Store` (the real one, or the
    simulator's). Still-running attempts count up to ``now`` (default: the current time)."""
    import time

    now = time.time() if now is None else now
    rows = store.all_attempts(suite=suite)
    atts = [Attempt.from_row(r, resumed=_resumed(r.dir)) for r in rows]
    srow = store.suite(suite)
    slots = dict(zip(srow.gpu_plan.gpus, srow.gpu_plan.slots, strict=True)) if srow is not None else {}
    first = min((a.start for a in atts), default=now)
    return compute(
        atts,
        jobs=store.jobs(suite=suite),
        samples=store.gpu_samples(since=first),
        slots=slots,
        now=now,
        suite=suite,
    )


def _resumed(attempt_dir: str) -> bool:
    """Whether the attempt's config.yaml says it resumed from a checkpoint."""
    from gpusched.attempt import AttemptPaths

    try:
        with open(AttemptPaths(Path(attempt_dir)).config, encoding="utf-8", errors="replace") as f:
            head = f.read(16384)
    except OSError:
        return False
    return any(line.startswith(_RESUME_NOTE) for line in head.splitlines() if line.startswith("#"))
