"""The night ``gpusched simulate`` replays when no ``--trace`` is given: each job's figures
from what the queue has learned of its task, made up only where nothing was learned.

A researcher asks "what if" after a first night: would ``2,2,2,2,1,1,1`` or three jobs a card
finish sooner? Made-up peaks cannot answer that; the peaks and run times gpusched measured
can. Per job and tier (pure: the caller reads the samples, :func:`memwatch.records`):

1. the job's own successful runs at that tier: their largest peak, their mean run time (what
   the scheduler predicts from, source ``job``);
2. else its task's at that tier: the p90 peak and median run time (source ``task``);
3. else, for a task that succeeded at some tier, that tier's figures moved along the
   simulator's ladder (:func:`sim.ladder_profiles`: the model's share stays, activations
   shrink, runs slow down), from the task's lowest tier with a success; never below the
   peak an OOM recorded at the tier (an OOM shows the peak was at least that), and more than
   a card where the job ran out of memory alone on one (placed with ``whole_mib`` or more);
4. else, a task none of whose runs succeeded, made-up figures (:func:`sim.synthetic_trace`).

Ramp-up times are not recorded, so every job ramps as :class:`sim.TierProfile`'s default.
What sharing a card costs comes from :mod:`gpusched.sharing`: the caller gives run times as
long as they would have been alone, and each task's share of its card (``utils``), which its
tiers carry as ``util``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from msgspec import Struct
from msgspec.structs import replace

from gpusched import predict, sim


class HistoryTrace(Struct, frozen=True, kw_only=True):
    """A trace and where its figures came from."""

    trace: sim.Trace
    measured: dict[str, int]  # task -> successful runs its figures come from
    made_up: tuple[str, ...]  # tasks with no successful run: synthetic figures
    # measured tasks whose cost of sharing a card is known: how much of it a run alone kept
    # busy (0-1; at the task's lowest tier that had such a run)
    shared: dict[str, float] = {}

    def summary(self) -> str:
        """One line for the command's output."""
        if not self.measured:
            return "figures: made up (no run of these tasks has finished in this queue)"
        runs = sum(self.measured.values())
        line = (
            f"figures: measured for {len(self.measured)} task(s), from {runs} finished run(s) in this queue"
        )
        if self.made_up:
            line += f"; made up for {', '.join(self.made_up)} (no run finished)"
        return line

    def sharing(self) -> str:
        """One line: for which tasks the replay knows what sharing a card costs."""
        if not self.measured:
            return "sharing a card: free (made-up figures have no utilisation)"
        if not self.shared:
            return "sharing a card: free (no run had its card alone with its utilisation sampled)"
        busy = ", ".join(f"{task} {util * 100:.0f} %" for task, util in self.shared.items())
        line = (
            f"sharing a card: a run alone kept it busy {busy} (jobs wanting over 100 % of a card run slower)"
        )
        free = [t for t in [*self.measured, *self.made_up] if t not in self.shared]
        return line + (f"; free for {', '.join(free)}" if free else "")


def trace_from_history(
    jobs: Sequence[tuple[str, str, str]],
    tiers: int,
    peaks: Mapping[str, Sequence[predict.PeakSample]],
    runs: Mapping[str, Sequence[predict.RunSample]],
    *,
    seed: int = 0,
    card_mib: int | None = None,
    whole_mib: int | None = None,
    utils: Mapping[tuple[str, int], float] | None = None,
) -> HistoryTrace:
    """The trace of ``jobs`` ((job id, name, task) each) over ``tiers`` tiers, from ``peaks``
    and ``runs`` by task (see the module docstring). ``card_mib``: the simulated cards' size;
    ``whole_mib``: what a job placed alone on an empty one is placed with (its usable memory);
    ``utils``: per (task, tier), the share of its card's time a run kept busy alone
    (:func:`sharing.alone_utils`; ``runs`` already as long as alone): a tier without one
    takes its task's nearest tier's, a task without any shares for free."""
    utils = utils or {}
    unknown = sorted({task for _, _, task in jobs if not _ok(peaks.get(task, ()))})
    synthetic = {
        j.name: j
        for j in sim.synthetic_trace(
            [(name, task) for _, name, task in jobs if task in unknown], seed=seed, tiers=tiers
        ).jobs
    }
    out = []
    for job_id, name, task in jobs:
        if task in unknown:
            out.append(synthetic[name])
            continue
        too_big = card_mib + 1 if card_mib is not None and whole_mib is not None else None
        profiles = _profiles(job_id, tiers, peaks[task], runs.get(task, ()), too_big, whole_mib)
        known = sorted(t for (k, t) in utils if k == task)
        if known:
            nearest = [utils[(task, min(known, key=lambda k: (abs(k - t), k)))] for t in range(len(profiles))]
            profiles = tuple(replace(p, util=u) for p, u in zip(profiles, nearest, strict=True))
        out.append(sim.TraceJob(name=name, task=task, tiers=profiles))
    measured = {
        task: len(_ok(peaks[task])) for task in dict.fromkeys(t for _, _, t in jobs) if task not in unknown
    }
    shared = {
        task: utils[(task, min(t for k, t in utils if k == task))]
        for task in measured
        if any(k == task for k, _ in utils)
    }
    return HistoryTrace(
        trace=sim.Trace(jobs=tuple(out)), measured=measured, made_up=tuple(unknown), shared=shared
    )


def _ok(samples: Sequence[predict.PeakSample]) -> list[predict.PeakSample]:
    return [s for s in samples if s.outcome == "ok" and s.peak_mib is not None]


def _profiles(
    job_id: str,
    tiers: int,
    peaks: Sequence[predict.PeakSample],
    runs: Sequence[predict.RunSample],
    too_big: int | None,
    whole_mib: int | None,
) -> tuple[sim.TierProfile, ...]:
    ok = _ok(peaks)
    known: dict[int, tuple[int, float | None]] = {}
    for tier in sorted({s.tier for s in ok}):
        mine = [s.peak_mib for s in ok if s.tier == tier and s.job_id == job_id and s.peak_mib]
        own_runs = [r.seconds for r in runs if r.tier == tier and r.job_id == job_id]
        task_peaks = [s.peak_mib for s in ok if s.tier == tier and s.peak_mib]
        task_runs = [r.seconds for r in runs if r.tier == tier]
        peak = max(mine) if mine else predict.p90(task_peaks)
        seconds = (
            sum(own_runs) / len(own_runs)
            if mine and own_runs
            else (predict.median(task_runs) if task_runs else None)
        )
        known[tier] = (peak, seconds)
    lowest = min(known)
    peak_k, seconds_k = known[lowest]
    if seconds_k is None:  # a peak without a run time (no start recorded): the nearest tier's
        seconds_k = next((s for _, (_, s) in sorted(known.items()) if s is not None), 3600.0)
    ladder = sim.ladder_profiles(*_tier_a(peak_k, seconds_k, lowest), sim.RAMP_S, tiers)
    out = []
    for t, derived in enumerate(ladder):
        peak, seconds = known.get(t, (derived.peak_mib, derived.duration_s))
        if t not in known:  # an OOM here says the peak was at least what it measured
            ooms = [s for s in peaks if s.tier == t and s.outcome == "oom"]
            peak = max([peak, *(s.peak_mib for s in ooms if s.peak_mib)])
            if too_big and whole_mib and any((s.predicted_mib or 0) >= whole_mib for s in ooms):
                peak = too_big  # it ran out alone on a card: the tier fits none
        out.append(
            sim.TierProfile(peak_mib=peak, duration_s=derived.duration_s if seconds is None else seconds)
        )
    return tuple(out)


def _tier_a(peak_mib: int, seconds: float, tier: int) -> tuple[int, float]:
    """Tier-A figures that :func:`sim.ladder_profiles` turns into ``peak_mib`` and ``seconds``
    at ``tier``: its model inverted."""
    if tier == 0:
        return peak_mib, seconds
    k = min(tier, len(sim.TIER_MEMORY) - 1)
    slowdown = sim.TIER_SLOWDOWN[min(tier, len(sim.TIER_SLOWDOWN) - 1)]
    if peak_mib <= sim.MODEL_MIB:  # no activations to speak of: no tier cuts it
        return peak_mib, seconds / slowdown
    acts = (peak_mib - sim.MODEL_MIB + sim.LOGITS_SAVED_MIB) / sim.TIER_MEMORY[k]
    return sim.MODEL_MIB + int(acts), seconds / slowdown
