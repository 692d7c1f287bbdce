"""Peak GPU memory of a job at a tier, predicted from recorded history. Pure: the caller
hands in the samples and the fallbacks (STYLE #2).

Sources, first that has data wins (``Prediction.source`` names it; ``status`` shows it):

1. ``"job"``: this job's own successful runs at this tier -> their largest peak.
2. ``"task"``: its siblings' successful runs (same task, same tier) -> a high percentile
   (nearest-rank p90, which is the maximum for fewer than ten samples).
3. An OOM at this tier means the peak was at least what fit. When nothing of (1) or (2) is
   known, OOM samples of this job (``"job"``) or else of its siblings (``"task"``) at this tier
   predict ``usable_mib``: a whole card's usable memory, so that the job waits for an empty card
   rather than repeating the OOM next to another job. The choice keeps the four sources the
   status view knows; the reported peak at OOM time is used when it is larger.
4. ``"default"``: ``default_mib`` (the caller's card size / plan slots).
5. ``"unknown"``: ``mib=None``; placement then checks slots and tier minimums only.

Peaks recorded at the moment of this job's own OOMs at this tier are lower bounds of its
need, so a prediction from (1) or (2) is never below them. Samples of other outcomes
(errors, cancels, host OOM) say nothing certain about GPU memory and are ignored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpusched.model import Outcome

SOURCES = ("job", "task", "default", "unknown")


@dataclass(frozen=True, kw_only=True)
class PeakSample:
    """One finished attempt's measured peak (``None`` when the trainer did not report it)."""

    job_id: str
    task: str
    tier: int
    peak_mib: int | None
    outcome: Outcome | str


@dataclass(frozen=True, kw_only=True)
class Prediction:
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
) -> Prediction:
    """Predicted peak of ``job_id`` (of ``task``) at ``tier``; see the module docstring."""
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
    if default_mib is not None:
        return Prediction(mib=default_mib, source="default")
    return Prediction(mib=None, source="unknown")


def _after_oom(
    samples: Sequence[PeakSample], source: str, usable_mib: int | None, default_mib: int | None
) -> Prediction:
    known = [m for m in (usable_mib, *_peaks(samples, Outcome.OOM)) if m is not None]
    if known:
        return Prediction(mib=max(known), source=source)
    if default_mib is not None:
        return Prediction(mib=default_mib, source="default")
    return Prediction(mib=None, source="unknown")


def p90(values: Sequence[int]) -> int:
    """Nearest-rank 90th percentile (the maximum below ten values)."""
    ordered = sorted(values)
    rank = (9 * len(ordered) + 9) // 10  # ceil(0.9 n) in integers
    return ordered[max(0, rank - 1)]


def _peaks(samples: Sequence[PeakSample], outcome: Outcome) -> list[int]:
    return [s.peak_mib for s in samples if s.outcome == outcome and s.peak_mib is not None]


def _count(samples: Sequence[PeakSample], outcome: Outcome) -> int:
    return sum(1 for s in samples if s.outcome == outcome)


def _at_least(value: int, floor: int | None) -> int:
    return value if floor is None else max(value, floor)
