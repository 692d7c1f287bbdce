"""Peak GPU memory of a job at a tier, predicted from recorded history. Pure: the caller
hands in the samples and the fallbacks (STYLE #2). :func:`predict_peak` and
:func:`predict_duration` say what a prediction is; :class:`TaskHistory` keeps a task's samples
as they come and predicts the same without a pass over them (what the daemon uses each tick).

Sources, first that has data wins (``Prediction.source`` names it; ``status`` shows it):

1. ``"job"``: this job's own successful runs at this tier -> their largest peak.
2. ``"task"``: its siblings' successful runs (same task, same tier) -> a high percentile
   (nearest-rank p90, which is the maximum for fewer than ten samples).
3. An OOM at this tier means the peak was at least what fit. When nothing of (1) or (2) is
   known, OOM samples of this job (``"job"``) or else of its siblings (``"task"``) at this tier
   predict ``usable_mib``: a whole card's usable memory, so that the job waits for an empty card
   rather than repeating the OOM next to another job. The choice keeps the four sources the
   status view knows; the reported peak at OOM time is used when it is larger. An OOM of an
   attempt that was placed with a whole card's prediction (it ran out alone on a card) predicts
   ``usable_mib + 1``: the tier fits no card, and the job starts further down the ladder.
4. ``"default"``: ``default_mib`` (the caller's card size / plan slots), or ``running_mib``
   when a sibling that is running at this tier, none of whose kind has finished there yet,
   already holds more (its peak is at least that; a launch beside it on a share would OOM).
   Once such a sibling has settled, ``plateau_mib`` instead (the caller's guess from its
   plateau, :data:`memory.PLATEAU_MARGIN`), above or below the share: a small task's siblings
   then share a card minutes into a night, where the share's guess kept two of them apart
   until one finished. Still a guess (``"default"``): it holds room as one does.
5. ``"unknown"``: ``mib=None``; placement then checks slots and tier minimums only.

Peaks recorded at the moment of this job's own OOMs at this tier are lower bounds of its
need, so a prediction from (1) or (2) is never below them. Samples of other outcomes
(errors, cancels, host OOM) say nothing certain about GPU memory and are ignored.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from msgspec import Struct

from gpusched.model import Outcome

SOURCES = ("job", "task", "default", "unknown")


class PeakSample(Struct, frozen=True, kw_only=True):
    """One finished attempt's measured peak (``None`` when the trainer did not report it)."""

    job_id: str
    task: str
    tier: int
    peak_mib: int | None
    outcome: Outcome | str
    predicted_mib: int | None = None  # what the attempt was placed with


class Prediction(Struct, frozen=True, kw_only=True):
    mib: int | None
    source: str  # one of SOURCES


def predict_peak(
    task: str,
    job_id: str,
    tier: int,
    history: Sequence[PeakSample],
    *,
    default_mib: int | None,
    usable_mib: int | None = None,
    running_mib: int | None = None,
    plateau_mib: int | None = None,
) -> Prediction:
    """Predicted peak of ``job_id`` (of ``task``) at ``tier``; see the module docstring.
    ``running_mib``: the most a sibling running at this tier holds so far (raises a default);
    ``plateau_mib``: the guess from a running sibling's plateau (replaces the default)."""
    at_tier = [s for s in history if s.tier == tier and s.task == task]
    mine = [s for s in at_tier if s.job_id == job_id]
    siblings = [s for s in at_tier if s.job_id != job_id]
    floor = max(_peaks(mine, Outcome.OOM), default=None)
    if ok := _peaks(mine, Outcome.OK):
        return Prediction(mib=_at_least(max(ok), floor), source="job")
    if ok := _peaks(siblings, Outcome.OK):
        return Prediction(mib=_at_least(p90(ok), floor), source="task")
    for source, samples in (("job", mine), ("task", siblings)):
        if _count(samples, Outcome.OOM):
            return _after_oom(samples, source, usable_mib, default_mib)
    return _default(default_mib, running_mib, plateau_mib)


def _default(default_mib: int | None, running_mib: int | None, plateau_mib: int | None) -> Prediction:
    """Source 4 (or 5) of the module docstring: nothing of the task has ended at this tier."""
    if plateau_mib is not None:
        return Prediction(mib=max(plateau_mib, running_mib or 0), source="default")
    if default_mib is not None:
        return Prediction(mib=max(default_mib, running_mib or 0), source="default")
    return Prediction(mib=None, source="unknown")


def _after_oom(
    samples: Sequence[PeakSample], source: str, usable_mib: int | None, default_mib: int | None
) -> Prediction:
    """What ``samples``' OOMs predict (see :meth:`_OomStats.after`)."""
    ooms = _OomStats()
    for s in samples:
        if s.outcome == Outcome.OOM:
            ooms.add(s.peak_mib, s.predicted_mib)
    return ooms.after(source, usable_mib, default_mib)


def p90(values: Sequence[int]) -> int:
    """Nearest-rank 90th percentile (the maximum below ten values)."""
    return _p90_of_sorted(sorted(values))


def _p90_of_sorted(ordered: Sequence[int]) -> int:
    rank = (9 * len(ordered) + 9) // 10  # ceil(0.9 n) in integers
    return ordered[max(0, rank - 1)]


def _peaks(samples: Sequence[PeakSample], outcome: Outcome) -> list[int]:
    return [s.peak_mib for s in samples if s.outcome == outcome and s.peak_mib is not None]


def _count(samples: Sequence[PeakSample], outcome: Outcome) -> int:
    return sum(1 for s in samples if s.outcome == outcome)


def _at_least(value: int, floor: int | None) -> int:
    return value if floor is None else max(value, floor)


# --------------------------------------------------------------------------- run time

DURATION_SOURCES = ("job", "task", "running", "unknown")


class RunSample(Struct, frozen=True, kw_only=True):
    """How long one successful attempt ran (``started_at`` to ``ended_at``)."""

    job_id: str
    task: str
    tier: int
    seconds: float
    attempt_id: int = 0  # (0: not known)


#: One ended attempt of a task with a peak or an OOM, as :class:`TaskHistory` keeps it (a row of
#: the store's, :func:`memwatch.history_rows`): task, job id, tier, peak (MiB), outcome, the
#: prediction it was placed with, how long it ran if it succeeded (else ``None``: also one whose
#: start or end is not known), and its place among the task's attempts (its id). The
#: :class:`PeakSample` and :class:`RunSample` of :func:`predict_peak` and :func:`predict_duration`,
#: in one row, with no record made per run.
HistoryRow = tuple[str, str, int, int | None, str, int | None, float | None, int]


#: One tier of a task's history as :meth:`TaskHistory.extend_peaks` takes it: the tier, the peaks
#: of its successful runs (any order), how many of its runs ran out of memory, the largest peak
#: and the largest prediction placed among those (``None``: none known).
PeakSummary = tuple[int, Sequence[int], int, int | None, int | None]


class Duration(Struct, frozen=True, kw_only=True):
    seconds: float | None
    source: str  # one of DURATION_SOURCES


UNKNOWN_DURATION = Duration(seconds=None, source="unknown")


def predict_duration(
    task: str,
    job_id: str,
    tier: int,
    runs: Sequence[RunSample],
    *,
    running_s: float | None = None,
) -> Duration:
    """Predicted run time of ``job_id`` (of ``task``) at ``tier``, learned the way peaks are:

    1. ``"job"``: the mean of this job's own successful runs at this tier;
    2. ``"task"``: the median of its siblings' successful runs at this tier, else at the
       nearest tier they ran at (tiers differ by tens of per cent; the figure orders the
       queue, it promises nothing);
    3. ``"running"``: ``running_s``, the longest a sibling has been running so far (a lower
       bound: a task none of whose jobs has finished yet is at least that long);
    4. ``"unknown"``: ``seconds=None``.
    """
    mine = [r.seconds for r in runs if r.task == task and r.job_id == job_id and r.tier == tier]
    if mine:
        return Duration(seconds=sum(mine) / len(mine), source="job")
    siblings = [r for r in runs if r.task == task]
    if siblings:
        nearest = min(abs(r.tier - tier) for r in siblings)
        at = [r.seconds for r in siblings if abs(r.tier - tier) == nearest]
        return Duration(seconds=median(at), source="task")
    if running_s is not None:
        return Duration(seconds=running_s, source="running")
    return Duration(seconds=None, source="unknown")


def median(values: Sequence[float]) -> float:
    """The middle value (the lower of the two middle ones for an even count)."""
    return _median_of_sorted(sorted(values))


def _median_of_sorted(ordered: Sequence[float]) -> float:
    return ordered[(len(ordered) - 1) // 2]


# --------------------------------------------------------------------------- kept as runs end


class _OomStats:
    """A set of samples' OOMs (one at least) as :func:`_after_oom` reads them: their largest
    peak and the largest prediction one was placed with."""

    __slots__ = ("peak", "placed")

    def __init__(self) -> None:
        self.peak: int | None = None
        self.placed: int | None = None

    def add(self, peak_mib: int | None, predicted_mib: int | None) -> None:
        """One more OOM, or more of them: its (their largest) peak and what it was placed with
        (each may be unknown)."""
        if peak_mib is not None:
            self.peak = peak_mib if self.peak is None else max(self.peak, peak_mib)
        if predicted_mib is not None:
            self.placed = predicted_mib if self.placed is None else max(self.placed, predicted_mib)

    def after(self, source: str, usable_mib: int | None, default_mib: int | None) -> Prediction:
        """What these OOMs predict when nothing at the tier succeeded: a card and one MiB if one
        of them was given a whole card and still ran out (this tier needs more than a card),
        else the most of the usable memory and the peaks they measured, else the default."""
        if usable_mib is not None and self.placed is not None and self.placed >= usable_mib:
            return Prediction(mib=usable_mib + 1, source=source)
        known = [m for m in (usable_mib, self.peak) if m is not None]
        if known:
            return Prediction(mib=max(known), source=source)
        if default_mib is not None:
            return Prediction(mib=default_mib, source="default")
        return Prediction(mib=None, source="unknown")


class TaskHistory:
    """One task's samples and runs, kept so that :meth:`peak` and :meth:`duration` predict what
    :func:`predict_peak` and :func:`predict_duration` predict from the same samples without a
    pass over them: a night's ten-thousandth run costs a tick what its first did. Per tier: the
    successful runs' peaks and the run times, sorted (the p90 and the median), and the OOMs; per
    job and tier: its largest peak, its OOMs and its run times, in attempt order (their mean)."""

    def __init__(self, task: str) -> None:
        self.task = task
        self.jobs: set[str] = set()  # the jobs with a sample
        self._ok: dict[int, list[int]] = {}
        self._oom: dict[int, _OomStats] = {}
        self._runs: dict[int, list[float]] = {}
        self._own_ok: dict[tuple[str, int], int] = {}
        self._own_oom: dict[tuple[str, int], _OomStats] = {}
        self._own_runs: dict[tuple[str, int], list[tuple[int, float]]] = {}  # (attempt order, seconds)

    def add(self, rows: Iterable[HistoryRow]) -> None:
        """A few more of this task's ended attempts (:data:`HistoryRow`; any order: nothing kept
        of them depends on it), each put in place in the sorted lists: what a tick's reaps add."""
        self._keep(rows, bisect.insort)

    def extend(self, rows: Iterable[HistoryRow]) -> None:
        """Many of them (a history read whole: the daemon's start, after a submit, every
        ``status`` that predicts), kept as :meth:`add` keeps them: appended, then each list
        sorted once, n log n for a task's n runs where an insertion into a sorted list moves up
        to n values each time (50,000 runs of a task: ~0.5 s of insertions)."""
        self._keep(rows, list.append)
        for kept in (self._ok, self._runs, self._own_runs):
            for values in kept.values():
                values.sort()  # (a sorted list appended to is two runs to Timsort)

    def maxima(self) -> tuple[dict[int, int], dict[int, int]]:
        """Per tier, the largest peak of a successful run and of an OOM (the tiers with one):
        :func:`memory.peak_maxima` of this task's samples, by tier."""
        ok = {tier: peaks[-1] for tier, peaks in self._ok.items()}
        return ok, {tier: o.peak for tier, o in self._oom.items() if o.peak is not None}

    def extend_peaks(self, tiers: Iterable[PeakSummary]) -> None:
        """The task's peaks as every job's siblings see them, summed up per tier
        (:data:`PeakSummary`), for a reader that asks a few jobs' peaks only (``status``, which
        shows no run time: the jobs standing for the queue's kinds), who gives those jobs' own
        runs with :meth:`extend_own`. Then :attr:`jobs` holds only those of them with a sample,
        :meth:`peak` predicts for them what :meth:`extend` of every run would, and
        :meth:`duration` knows their own run times only: 10,000 runs of a task are a row per
        tier from the store, not a row each."""
        for tier, peaks, ooms, oom_peak, oom_placed in tiers:
            if peaks:
                ok = self._ok.setdefault(tier, [])
                ok.extend(peaks)
                ok.sort()
            if ooms:
                self._oom.setdefault(tier, _OomStats()).add(oom_peak, oom_placed)

    def extend_own(self, rows: Iterable[HistoryRow]) -> None:
        """All the runs of some jobs of the task, as their own (see :meth:`extend_peaks`)."""
        self._keep_own(rows, list.append)
        for values in self._own_runs.values():
            values.sort()

    def _keep(self, rows: Iterable[HistoryRow], put: Callable[[list[Any], Any], None]) -> None:
        rows = rows if isinstance(rows, list) else list(rows)
        self._keep_shared(rows, put)
        self._keep_own(rows, put)

    def _keep_shared(self, rows: Iterable[HistoryRow], put: Callable[[list[Any], Any], None]) -> None:
        ok, runs, oom = self._ok, self._runs, self._oom
        for _, _, tier, peak_mib, outcome, predicted_mib, seconds, _ in rows:
            if outcome == Outcome.OK and peak_mib is not None:
                put(ok.setdefault(tier, []), peak_mib)
            elif outcome == Outcome.OOM:
                oom.setdefault(tier, _OomStats()).add(peak_mib, predicted_mib)
            if seconds is not None:  # a successful run: how long it took
                put(runs.setdefault(tier, []), seconds)

    def _keep_own(self, rows: Iterable[HistoryRow], put: Callable[[list[Any], Any], None]) -> None:
        own_ok, own_oom, own_runs = self._own_ok, self._own_oom, self._own_runs
        for _, job_id, tier, peak_mib, outcome, predicted_mib, seconds, order in rows:
            self.jobs.add(job_id)
            key = (job_id, tier)
            if outcome == Outcome.OK and peak_mib is not None:
                own = own_ok.get(key)
                own_ok[key] = peak_mib if own is None else max(own, peak_mib)
            elif outcome == Outcome.OOM:
                own_oom.setdefault(key, _OomStats()).add(peak_mib, predicted_mib)
            if seconds is not None:
                put(own_runs.setdefault(key, []), (order, seconds))

    def peak(
        self,
        job_id: str,
        tier: int,
        *,
        default_mib: int | None,
        usable_mib: int | None = None,
        running_mib: int | None = None,
        plateau_mib: int | None = None,
    ) -> Prediction:
        """:func:`predict_peak` of ``job_id`` at ``tier`` from this task's samples."""
        own_oom = self._own_oom.get((job_id, tier))
        floor = own_oom.peak if own_oom is not None else None
        own = self._own_ok.get((job_id, tier))
        if own is not None:
            return Prediction(mib=_at_least(own, floor), source="job")
        if ok := self._ok.get(tier):  # the job has none of its own: they are all its siblings'
            return Prediction(mib=_at_least(_p90_of_sorted(ok), floor), source="task")
        if own_oom is not None:
            return own_oom.after("job", usable_mib, default_mib)
        if (oom := self._oom.get(tier)) is not None:  # none of them the job's: all its siblings'
            return oom.after("task", usable_mib, default_mib)
        return _default(default_mib, running_mib, plateau_mib)

    def duration(self, job_id: str, tier: int, *, running_s: float | None = None) -> Duration:
        """:func:`predict_duration` of ``job_id`` at ``tier`` from this task's runs."""
        if mine := self._own_runs.get((job_id, tier)):
            return Duration(seconds=sum(x for _, x in mine) / len(mine), source="job")
        if self._runs:
            nearest = min(abs(t - tier) for t in self._runs)
            at = [x for t in {tier - nearest, tier + nearest} for x in self._runs.get(t, ())]
            if nearest:
                at.sort()
            return Duration(seconds=_median_of_sorted(at), source="task")
        if running_s is not None:
            return Duration(seconds=running_s, source="running")
        return UNKNOWN_DURATION
