"""Memory decisions around placement. Pure: snapshots, pid sets and numbers in, values out;
no clock, file or process (STYLE #2). The scheduler gathers the inputs (NVML snapshot,
process trees of its attempts, host RAM) and acts on the answers.

* :func:`attribute` -- which GPU processes are ours (an attempt's whole process tree, not
  only its wrapper) and which belong to someone else; each attempt's measured memory on the
  card it was given, and any process of it found on another card (it ignored
  ``CUDA_VISIBLE_DEVICES``).
* :func:`reserved_mib` -- memory promised to a running attempt that the card does not show
  yet: the rest of its predicted peak while it ramps up, and for a learned prediction as long
  as it runs (a job below its learned peak will grow back to it); a job whose peak is still a
  guess, once settled, what jobs have been seen to grow by after settling (:data:`MAX_STEP_UP`).
* :func:`ladder_points` and :func:`fill_ladder` -- a task's peak at a tier it has not run
  yet, from its learned peak one tier up and the ratio measured between the two tiers on the
  suite's task of the nearest smaller peak (source ``"ladder"``, :func:`ladder_ratio`);
  without a ratio, never more than the tier above.
* :func:`rooms` and :func:`start_tier` -- what each card could hold with none of our jobs on
  it (minus headroom and other people's processes), and the first tier of the ladder whose
  predicted peak fits that ("start safer").
* pack down (:func:`gpusched.memwatch.pack`, placed by :func:`gpusched.placement.assign`) --
  a job that memory keeps off every card starts one tier down where that fits a card now and no
  job could take the room at its own tier; one that later jobs have kept overtaking for a while
  takes the first slower tier that fits, at its turn (a few per cent slower, but now and next to
  another job, instead of waiting for a whole card; the baselines get there only by crashing).
* :func:`choose_holds` -- a card kept free of new jobs so that a job waiting for memory gets
  it when the card's jobs end, instead of being starved by smaller jobs that keep refilling it.
* :func:`unstick` -- never deadlock: when nothing of ours runs and nothing fits, the first job
  runs at its most conservative tier anyway, with a reason that says so: at once when it fits
  no card even empty, after a patience when other people's memory is what keeps it out.
* :func:`host_wait` -- launches wait while available host RAM is low, and after a host OOM
  until it has recovered.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

from msgspec import Struct
from msgspec.structs import replace

from gpusched import placement
from gpusched.model import MIB_PER_GIB, GpuState, Outcome, Placement
from gpusched.placement import GpuSlotView, QueuedJob, gib
from gpusched.predict import PeakSample, Prediction

#: Measured usage rising by more than this counts as still ramping up.
GROWTH_MIB = 256

#: A job that grows to more than this many times what it held when it stopped growing had not
#: settled then (a pause before its model was loaded, say): that level is forgotten and its
#: next one kept, and no such ratio is learned as how much jobs grow after settling.
MAX_STEP_UP = 2.0

#: Until one of its jobs has finished at a tier, a task's peak there is guessed from a running
#: sibling that has settled: its plateau times the learned step-up, or times this where more (no
#: job has finished yet, or the jobs so far grew less). The E1-like trace's jobs grow by 1.177
#: after settling and differ by +-5 % from job to job: 1.3 covers both.
PLATEAU_MARGIN = 1.3

#: An ended attempt's processes still listed on its card count as ours (their memory is being
#: released) until none is listed any more, or this long at most.
RELEASE_S = 30.0

# --------------------------------------------------------------------------- attribution


class Tree(Struct, frozen=True, kw_only=True):
    """One attempt's processes: its wrapper and everything below it (or, for an attempt
    that just ended, the processes last seen of it on its card)."""

    attempt_id: int
    job_id: str
    gpu: int | None
    pids: frozenset[int]
    ending: bool = False  # ended, its memory may still be being released


class Usage(Struct, frozen=True, kw_only=True):
    """What a snapshot shows of one attempt."""

    attempt_id: int
    gpu: int | None
    used_mib: int | None  # its processes' memory on its own card; None when none is listed there
    pids_on_gpu: frozenset[int]
    elsewhere: tuple[tuple[int, int], ...] = ()  # (card index, pid) on a card it was not given


class Owner(Struct, frozen=True, kw_only=True):
    job_id: str
    ending: bool


class Attribution(Struct, frozen=True, kw_only=True):
    usage: Mapping[int, Usage]  # attempt id -> usage
    owners: Mapping[tuple[int, int], Owner]  # (card index, pid) -> the job it belongs to
    outside_mib: Mapping[int, int]  # card index -> memory of processes that are not ours
    ours_mib: Mapping[int, int]  # card index -> memory of our processes (ending ones included)

    def owner(self, gpu: int, pid: int) -> Owner | None:
        return self.owners.get((gpu, pid))


def attribute(gpus: Sequence[GpuState], trees: Sequence[Tree]) -> Attribution:
    """Match every GPU process of the snapshot to the attempt whose tree holds its pid.

    A card where one of our live attempts runs but shows no process of it while other
    processes are listed gets no outside memory: either the job has not touched the GPU yet
    or its pids cannot be seen from here (a container's PID namespace), and calling our own
    processes "outsiders" would be worse than missing a real one for a moment."""
    by_pid: dict[int, Tree] = {}
    for t in trees:
        for pid in t.pids:
            by_pid.setdefault(pid, t)
    owners: dict[tuple[int, int], Owner] = {}
    used: dict[int, int] = {}
    on_gpu: dict[int, set[int]] = {t.attempt_id: set() for t in trees}
    elsewhere: dict[int, list[tuple[int, int]]] = {t.attempt_id: [] for t in trees}
    outside: dict[int, int] = {}
    ours: dict[int, int] = {}
    for g in gpus:
        for p in g.processes:
            tree = by_pid.get(p.pid)
            if tree is None:
                outside[g.index] = outside.get(g.index, 0) + (p.used_mib or 0)
                continue
            owners[(g.index, p.pid)] = Owner(job_id=tree.job_id, ending=tree.ending)
            ours[g.index] = ours.get(g.index, 0) + (p.used_mib or 0)
            if tree.gpu is not None and g.index != tree.gpu:
                elsewhere[tree.attempt_id].append((g.index, p.pid))
                continue
            on_gpu[tree.attempt_id].add(p.pid)
            if p.used_mib is not None:
                used[tree.attempt_id] = used.get(tree.attempt_id, 0) + p.used_mib
    usage = {
        t.attempt_id: Usage(
            attempt_id=t.attempt_id,
            gpu=t.gpu,
            used_mib=used.get(t.attempt_id) if on_gpu[t.attempt_id] else None,
            pids_on_gpu=frozenset(on_gpu[t.attempt_id]),
            elsewhere=tuple(elsewhere[t.attempt_id]),
        )
        for t in trees
    }
    blind = {t.gpu for t in trees if not t.ending and t.gpu is not None and not on_gpu[t.attempt_id]}
    outside = {g: mib for g, mib in outside.items() if g not in blind}
    return Attribution(usage=usage, owners=owners, outside_mib=outside, ours_mib=ours)


# --------------------------------------------------------------------------- reservations


class Holding(Struct, frozen=True, kw_only=True):
    """One running attempt as reservations see it."""

    predicted_mib: int | None
    learned: bool  # the prediction comes from the job's or its task's own history
    used_mib: int | None  # measured now on its card (None: the probe cannot tell)
    ramping: bool  # launched, or last grew by more than GROWTH_MIB, within the ramp window
    grows_to_mib: int | None = None  # what it held when it settled, times the learned step-up


def reserved_mib(h: Holding) -> int:
    """Memory to hold back for ``h`` beyond what its card already shows as used.

    The rest of its predicted peak (``predicted - used``) while it ramps up; once it has
    settled, still that rest when the prediction is learned and its usage is measured (it
    will come back to its learned peak, e.g. at evaluation). A default prediction is a guess,
    not knowledge: once settled, such a job holds what jobs were seen to grow by after
    settling (``grows_to_mib - used``: a plateau before an evaluation's peak), else nothing."""
    if not h.predicted_mib:
        return 0
    left = 0
    if h.ramping or (h.learned and h.used_mib is not None):
        left = h.predicted_mib - (h.used_mib or 0)
    if not h.learned and h.grows_to_mib and h.used_mib is not None:
        left = max(left, h.grows_to_mib - h.used_mib)
    return max(0, left)


def is_ramping(now: float, launched_at: float, last_growth_at: float | None, ramp_s: float) -> bool:
    return now - max(launched_at, last_growth_at or launched_at) < ramp_s


# --------------------------------------------------------------------------- the ladder

LEARNED = frozenset({"job", "task", "ladder"})


#: (task, tier) -> the largest peak measured there: of successful runs, and of OOMs
Maxima = dict[tuple[str, int], int]


def peak_maxima(samples: Iterable[PeakSample]) -> tuple[Maxima, Maxima]:
    """The largest peak of each task's successful runs and of its OOMs, per tier: all that
    :func:`ladder_from` and :func:`floors_from` read of the samples."""
    ok: Maxima = {}
    floor: Maxima = {}
    for s in samples:
        add_peak(ok, floor, s)
    return ok, floor


def add_peak(ok: Maxima, floor: Maxima, s: PeakSample) -> None:
    """Count ``s`` into :func:`peak_maxima`'s two maxima (what a keeper of them adds a run by)."""
    if s.peak_mib is None:
        return
    key = (s.task, s.tier)
    if s.outcome == Outcome.OK:
        ok[key] = max(ok.get(key, 0), s.peak_mib)
    elif s.outcome == Outcome.OOM:
        floor[key] = max(floor.get(key, 0), s.peak_mib)


def ladder_points(samples: Sequence[PeakSample], tiers: int) -> dict[int, tuple[tuple[int, float], ...]]:
    """tier ``t`` -> (the task's peak at ``t - 1``, the ratio of its peak at ``t`` to that, at
    most 1), one per task that ran at both, smallest peak first. A tier-``t-1`` OOM's peak
    stands in for a missing successful run there (a lower bound of that peak: the ratio errs
    high, which is safe)."""
    return ladder_from(*peak_maxima(samples), tiers)


def ladder_from(ok: Maxima, floor: Maxima, tiers: int) -> dict[int, tuple[tuple[int, float], ...]]:
    """:func:`ladder_points` from the samples' :func:`peak_maxima`."""
    points: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for (task, t), hi in ok.items():
        lo = ok.get((task, t - 1)) or floor.get((task, t - 1))
        if 0 < t < tiers and lo:
            points[t].append((lo, min(1.0, hi / lo)))
    return {t: tuple(sorted(ps)) for t, ps in points.items()}


def oom_floors(samples: Sequence[PeakSample], task: str, tiers: int) -> list[int | None]:
    """Per tier, the largest peak measured at ``task``'s OOMs there (``None``: none): a lower
    bound of its peak at that tier."""
    return floors_from(peak_maxima(s for s in samples if s.task == task)[1], task, tiers)


def floors_from(floor: Maxima, task: str, tiers: int) -> list[int | None]:
    """:func:`oom_floors` from the samples' OOM maxima (:func:`peak_maxima`)."""
    return [floor.get((task, t)) or None for t in range(tiers)]


def ladder_ratio(points: Sequence[tuple[int, float]], above_mib: int) -> float | None:
    """The ratio to scale a peak of ``above_mib`` one tier up by: that of the task with the
    largest peak one tier up that is at most ``above_mib`` (the largest ratio when none is).
    A tier cuts a job's activations, not its weights, so the larger a peak the more of it a
    tier cuts: a smaller task's ratio errs high (safe), while the largest ratio of all (a small
    task's) is far too high for a large one. In the E1-like trace the 14.5 GiB qnli was guessed
    at ~11.6 GiB at B from the small tasks' ~0.8, over a slot's share (10.8 GiB), so it started
    at C and its B was never learned; from mnli's ~0.64 it is ~9.5 GiB and starts at B."""
    if not points:
        return None
    below = [r for lo, r in points if lo <= above_mib]
    return below[-1] if below else max(r for _, r in points)


def fill_ladder(
    predicted: Sequence[Prediction],
    points: Mapping[int, Sequence[tuple[int, float]]],
    *,
    whole_mib: int | None = None,
    floors: Sequence[int | None] = (),
) -> list[Prediction]:
    """Predictions per tier with each default/unknown one below a learned one replaced by
    that one scaled by the tier's ratio (source ``"ladder"``; ``points`` from
    :func:`ladder_points`, the ratio picked by the size of the peak scaled, :func:`ladder_ratio`),
    or capped by it when no ratio is known (a more conservative tier never needs more; still
    a guess: its source stays).

    A prediction of ``whole_mib`` or more above (a whole card's usable memory) is no peak but
    what an OOM there stands for (``predict``: wait for an empty card); given the largest peak
    measured at that tier's OOMs (``floors[t - 1]``, a lower bound of the peak), the tier below
    is guessed from that by the largest ratio (the conservative one) instead. Scaling the
    stand-in guessed mnli (13 GiB at A, OOMed beside another job while unknown) at ~17 GiB at
    B: it fit no card's share and started at C. The guess may be low (an OOM early in a run
    held little); a tier that then OOMs is a whole card again, and the one below it guessed
    from that OOM. Measured: 1.117 -> 1.112 x the lower bound on the eight seeds with
    ``placement.alone_on`` (1.124 -> 1.121 without); never below the default prediction:
    1.119 and a co-located OOM after learning."""
    out = list(predicted)
    for t in range(1, len(out)):
        above, here = out[t - 1], out[t]
        if here.source in LEARNED or above.source not in LEARNED or above.mib is None:
            continue
        floor = floors[t - 1] if t - 1 < len(floors) else None
        if whole_mib is not None and above.mib >= whole_mib and floor and points.get(t):
            out[t] = Prediction(mib=math.ceil(floor * max(r for _, r in points[t])), source="ladder")
            continue
        ratio = ladder_ratio(points.get(t, ()), above.mib)
        if ratio is not None:
            out[t] = Prediction(mib=math.ceil(above.mib * ratio), source="ladder")
        elif here.mib is None or above.mib < here.mib:
            out[t] = Prediction(mib=above.mib, source=here.source)
    return out


# --------------------------------------------------------------------------- start safer


def rooms(gpus: Sequence[GpuState], outside_mib: Mapping[int, int], headroom_frac: float) -> dict[int, int]:
    """Card index -> what the card could give one job with none of ours on it: its total,
    less headroom, less ``outside_mib`` (other people's processes; ``{}``: an empty card,
    which is what "fits" means when choosing a tier -- an outsider is waited for, not
    planned around). Cards of unknown size are left out."""
    return {
        g.index: g.total_mib - int(headroom_frac * g.total_mib) - outside_mib.get(g.index, 0)
        for g in gpus
        if g.total_mib is not None
    }


class Start(Struct, frozen=True, kw_only=True):
    tier: int  # the tier to start at
    predicted_mib: int | None  # the prediction to place with (clamped when nothing fits)
    note: str | None = None  # why not the job's own tier (shown with its placement or wait)


def start_tier(
    predicted: Sequence[int | None],
    tier: int,
    names: Sequence[str],
    room_mib: int | None,
    *,
    share_mib: int | None = None,
    learned: Sequence[bool] = (),
    exclusive: Sequence[bool] = (),
) -> Start:
    """The tier a job starts at, from its own ``tier`` on:

    1. when ``share_mib`` (a slot's share of its roomiest card: usable / the plan's cap) is
       given and the job's learned peak at ``tier`` exceeds it, the first later tier, not an
       exclusive one, whose *learned* peak fits the share: a job over its share blocks its
       card-mates for its whole run, a few per cent slower one tier down it blocks nobody;
       likewise, on such a plan, a job whose prediction at ``tier`` would take a whole card
       (after an OOM there) starts at the first later tier, not an exclusive one, that leaves
       room beside it;
    2. else the first tier whose predicted peak fits ``room_mib`` (the roomiest of its cards
       when empty; ``None``: unknown, no change). A tier with an unknown prediction fits;
    3. when no tier fits, the last one, with its prediction clamped to ``room_mib`` so that it
       runs alone on the roomiest card once that card is empty."""
    tier = max(0, min(tier, len(predicted) - 1))
    here = predicted[tier]
    if share_mib is not None and here is not None and here > share_mib and _at(learned, tier):
        for t in range(tier + 1, len(predicted)):
            p = predicted[t]
            if not _at(exclusive, t) and _at(learned, t) and p is not None and p <= share_mib:
                note = (
                    f"tier {names[t]} instead of {names[tier]}: ~{gib(here)} at {names[tier]} is more than a"
                    f" slot's share of a card ({gib(share_mib)}); ~{gib(p)} at {names[t]} is not"
                )
                return Start(tier=t, predicted_mib=p, note=note)
    if share_mib is not None and room_mib is not None and here is not None and here >= room_mib:
        for t in range(tier + 1, len(predicted)):
            p = predicted[t]
            if not _at(exclusive, t) and p is not None and p < room_mib:
                note = (
                    f"tier {names[t]} instead of {names[tier]}: ~{gib(here)} at {names[tier]} would take a"
                    f" whole card ({gib(room_mib)}); ~{gib(p)} at {names[t]} leaves room beside it"
                )
                return Start(tier=t, predicted_mib=p, note=note)
    if room_mib is None or here is None or here <= room_mib:
        return Start(tier=tier, predicted_mib=here)
    for t in range(tier + 1, len(predicted)):
        p = predicted[t]
        if p is None or p <= room_mib:
            note = (
                f"tier {names[t]} instead of {names[tier]}: ~{gib(here)} at {names[tier]} fits no GPU"
                f" even when empty ({gib(room_mib)} at most)"
            )
            return Start(tier=t, predicted_mib=p, note=note)
    last = len(predicted) - 1
    note = (
        f"~{gib(min(p for p in predicted[tier:] if p is not None))} or more at every tier from"
        f" {names[tier]} on fits no GPU even when empty ({gib(room_mib)} at most): runs at the most"
        f" conservative tier {names[last]}, alone on a card"
    )
    return Start(tier=last, predicted_mib=room_mib, note=note)


def _at(flags: Sequence[bool], i: int) -> bool:
    return i < len(flags) and flags[i]


# --------------------------------------------------------------------------- holds


MEMORY_VETOES = placement.MEMORY_VETOES
memory_bound = placement.memory_bound


def choose_holds(
    waiting: Sequence[tuple[QueuedJob, float]],
    views: Sequence[GpuSlotView],
    room_mib: Mapping[int, int],
    *,
    current: Mapping[int, str],
    hold_after_s: float,
    max_holds: int,
    headroom_frac: float,
) -> dict[int, str]:
    """Card index -> job id: cards that take no new job but that one.

    ``waiting`` holds the queued jobs (in placement order) with how long each has waited.
    A job that has waited ``hold_after_s`` or more because of memory gets a card it fits on
    when empty (its ``room_mib``): one it would not take more than a slot's share of when there
    are any (:func:`_alone`), then the one with the most room emptied, then the one that holds
    the fewest of our jobs (:func:`_hold_target`). A current hold is
    kept while its job still waits and still fits that card; at most ``max_holds``. A job that
    one of its slower tiers (``fallback``) would let onto an emptied card gets none: starved, it
    takes that tier at its turn, and a card drained for its faster tier idles meanwhile."""
    waits = {j.job_id: (j, s) for j, s in waiting}
    holds: dict[int, str] = {}
    for gpu, job_id in current.items():
        entry = waits.get(job_id)
        if entry and _fits_empty(entry[0], gpu, room_mib) and len(holds) < max_holds:
            holds[gpu] = job_id
    for job, waited_s in waiting:
        if len(holds) >= max_holds:
            break
        if job.job_id in holds.values() or waited_s < hold_after_s:
            continue
        free = [g for g in views if g.index not in holds]
        emptied = [replace(g, running=0) for g in free]
        if not memory_bound(job, emptied, headroom_frac):
            continue  # a card has the memory for it now: it waits for a slot, not for memory
        if any(
            not memory_bound(replace(job, tier=t, predicted_mib=p, fallback=()), emptied, headroom_frac)
            for t, p in job.fallback
        ):
            continue  # a slower tier has the memory now: it takes that at its turn
        target = _hold_target(job, free, room_mib)
        if target is not None:
            holds[target] = job.job_id
    return holds


def _fits_empty(job: QueuedJob, gpu: int, room_mib: Mapping[int, int]) -> bool:
    room = room_mib.get(gpu)
    return job.allowed.get(gpu, 0) > 0 and (
        job.predicted_mib is None or (room is not None and job.predicted_mib <= room)
    )


def _hold_target(job: QueuedJob, views: Sequence[GpuSlotView], room_mib: Mapping[int, int]) -> int | None:
    """The card to drain for ``job``: at an exclusive tier with a learned peak, the one with
    the fewest slots in its plan (:func:`placement.fewest_slots_first`: it idles them all); not
    one it would take alone where another fits; then the most room emptied, so that what it
    leaves beside it takes another job (a 13 GiB job leaves 8.6 GiB on a 24 GiB card, 2.6 on
    one with someone's 6 GiB notebook, where the other slot would idle for its whole run);
    then the fewest of our jobs to wait for. Ranked by our jobs first, the notebook's card,
    whose second slot is the one most often empty, got the hold of every job over a slot's
    share of every card. Most room first took 80 E1-like seeds from
    1.1189 to 1.1136 x the lower bound, and to 1.1093 with :func:`placement.guess_waits`."""
    fits = [g for g in views if _fits_empty(job, g.index, room_mib) and g.index != job.avoid_gpu]
    if not fits:
        fits = [g for g in views if _fits_empty(job, g.index, room_mib)]
    if not fits:
        return None
    slots_first = placement.fewest_slots_first(job)  # it idles the card's every slot: the fewest
    return min(
        fits,
        key=lambda g: (
            job.allowed.get(g.index, 0) if slots_first else 0,
            _alone(job, g.index, room_mib),
            -(room_mib.get(g.index) or 0),
            g.running,
            -(g.usable_mib or 0),
            g.index,
        ),
    ).index


def _alone(job: QueuedJob, gpu: int, room_mib: Mapping[int, int]) -> bool:
    """True when ``job`` would take more than a slot's share of ``gpu`` emptied (its room over
    the plan's cap), so that the card's other slots would likely idle beside it: a hold goes
    to such a card only when no other fits (see :func:`choose_holds`). On the E1-like trace
    the card with a colleague's 6 GiB notebook had the most free memory beside a running job
    and so got the hold; the eight seeds went from 1.112 to 1.109 x the lower bound (seed 1
    1.124 -> 1.111, seed 5 1.131 -> 1.116, seed 11 1.121 -> 1.123, the rest unchanged)."""
    room, cap = room_mib.get(gpu), job.allowed.get(gpu, 0)
    return cap >= 2 and room is not None and job.predicted_mib is not None and job.predicted_mib * cap > room


def held_views(views: Mapping[int, GpuSlotView], holds: Mapping[int, str]) -> dict[int, GpuSlotView]:
    return {i: replace(v, held_for=holds.get(i)) for i, v in views.items()}


# --------------------------------------------------------------------------- never deadlock


def unstick(
    queued: Sequence[QueuedJob],
    views: Sequence[GpuSlotView],
    *,
    headroom_frac: float,
    waited: Mapping[str, float] | None = None,
    patience_s: float = 3600.0,
) -> Placement | None:
    """When nothing of ours runs and nothing was placed: the first job (in placement order)
    that memory keeps off every card runs anyway, on its roomiest card, with a reason that says
    so. A job whose prediction is only a guess and no attempt of whose task has left a peak or
    an OOM (``guessed``, ``unmeasured``), and that others' memory keeps out, starts at once at its own tier
    where at least half the guess is left under headroom: run alone, it is measured, and its
    siblings are then placed by what it really took (a guess must not keep a queue waiting on
    someone's notebook for an hour). Any other stuck job runs at the last tier of its ladder:
    at once when it would not fit even an empty card (waiting cannot help), else once memory
    has kept it waiting ``patience_s`` (``waited``: job id -> seconds; other people's processes
    may well leave, and an OOM at the last tier fails the job for good). ``None`` when no job
    is stuck."""
    waited = waited or {}
    for job in sorted(queued, key=placement.job_order):
        if not memory_bound(job, views, headroom_frac):
            continue
        cards = [g for g in views if job.allowed.get(g.index, 0) > 0]
        best = min(cards, key=placement.rank_key)
        never = memory_bound(job, [_emptied(g) for g in views], headroom_frac)
        measure = not never and job.guessed and job.unmeasured and _measurable(job, best, headroom_frac)
        if not measure and not never and waited.get(job.job_id, 0.0) < patience_s:
            continue
        why = placement.wait_reason(  # only for the job that goes: a tick may skip many
            job, views, {g.index: placement.veto(job, g, headroom_frac) for g in views}, headroom_frac
        )
        if measure:
            return _measured(job, best, headroom_frac, why)
        last = len(job.tiers) - 1
        if not never:
            why += f"; waited {waited.get(job.job_id, 0.0) / 60:.0f} min for memory others hold"
        name = job.tiers[last].name if job.tiers else "?"
        reason = (
            f"GPU {best.index}: nothing runs and nothing fits ({why}); started at the most conservative"
            f" tier {name} anyway so that the queue cannot stall"
        )
        return Placement(job_id=job.job_id, gpu=best.index, tier=max(last, 0), reason=reason)
    return None


def _measurable(job: QueuedJob, gpu: GpuSlotView, headroom_frac: float) -> bool:
    """Whether ``job`` (whose peak is a guess) may run alone on ``gpu`` at its own tier to be
    measured: at least half its guess is left there under headroom and only memory bars it."""
    usable, guess = gpu.usable_mib, job.predicted_mib
    if usable is None or guess is None:
        return False
    if placement.veto(job, gpu, headroom_frac) is not placement.Veto.MEMORY:  # slots, min free, ...
        return False
    return usable - placement.headroom_mib(gpu, headroom_frac) >= guess / 2


def _measured(job: QueuedJob, gpu: GpuSlotView, headroom_frac: float, why: str) -> Placement:
    """The placement :func:`_measurable` allowed, with a reason that says why."""
    room = (gpu.usable_mib or 0) - placement.headroom_mib(gpu, headroom_frac)
    reason = (
        f"GPU {gpu.index}: nothing runs and nothing fits ({why}); ~{gib(job.predicted_mib or 0)} is only a"
        f" guess (nothing of its task measured yet) and {gib(room)} is left under headroom: started"
        f" alone at tier {placement.tier_of(job).name} to measure its peak"
    )
    return Placement(job_id=job.job_id, gpu=gpu.index, tier=job.tier, reason=reason)


def _emptied(g: GpuSlotView) -> GpuSlotView:
    """``g`` with nothing on it (its free memory unknown stays unknown)."""
    free = g.total_mib if g.free_mib is not None else None
    return replace(g, free_mib=free, reserved_mib=0, running=0, exclusive_running=False, held_for=None)


# --------------------------------------------------------------------------- host RAM


class HostMemory(Struct, frozen=True, kw_only=True):
    available_mib: int | None
    total_mib: int | None


class HostLimit(Struct, frozen=True, kw_only=True):
    """Launches wait while available host RAM is below ``min_mib`` or ``min_frac`` of the
    total, whichever is *smaller* (a small box is not blocked for good by a fixed figure; a
    big one still stops at ``min_mib``). 0 disables either."""

    min_mib: int = 4 * MIB_PER_GIB
    min_frac: float = 0.10
    recover_factor: float = 2.0  # after a host OOM: wait for this many times the minimum
    hold_s: float = 30.0  # ... and at least this long


def host_min_mib(total_mib: int | None, limit: HostLimit) -> int:
    return floor_mib(total_mib, limit.min_mib, limit.min_frac)


def floor_mib(total_mib: int | None, min_mib: int, min_frac: float) -> int:
    """The smaller of ``min_mib`` and ``min_frac`` of ``total_mib`` (either 0: not set; the
    share unknown without a total); 0 when neither is set. Host RAM's and disks' floors."""
    floors = [m for m in (min_mib, int(min_frac * total_mib) if total_mib else 0) if m > 0]
    return min(floors) if floors else 0


def host_wait(
    host: HostMemory, limit: HostLimit, *, oom_hold: tuple[float, str] | None, now: float
) -> str | None:
    """Why launches wait for host RAM now, or ``None``. ``oom_hold`` is (when, job id) of
    the last host OOM that is not yet known to have recovered."""
    floor = host_min_mib(host.total_mib, limit)
    avail = host.available_mib
    if oom_hold is not None:
        since, job_id = oom_hold
        need = int(floor * limit.recover_factor)
        if avail is None or avail < need:
            have = "unknown" if avail is None else gib(avail)
            return (
                f"held after a host OOM of {job_id}: waiting for host RAM to recover"
                f" ({have} available, needs {gib(need)})"
            )
        if now - since < limit.hold_s:  # RAM is back; the OOM is too recent to trust it
            clock = time.strftime("%H:%M:%S", time.localtime(since + limit.hold_s))
            return (
                f"held after a host OOM of {job_id}: launches resume at {clock} while host RAM"
                f" stays at {gib(need)} or more ({gib(avail)} available)"
            )
    if avail is not None and floor and avail < floor:
        return f"host RAM low: {gib(avail)} available, launches wait for {gib(floor)}"
    return None


def host_recovered(host: HostMemory, limit: HostLimit, since: float, now: float) -> bool:
    need = int(host_min_mib(host.total_mib, limit) * limit.recover_factor)
    return host.available_mib is not None and host.available_mib >= need and now - since >= limit.hold_s


def parse_host_min(text: str) -> HostLimit:
    """``"4GiB"``, ``"4096MiB"``, ``"10%"``, ``"4GiB,10%"`` or ``"0"`` (off) -> a :class:`HostLimit`.
    Raises ``ValueError`` naming the accepted forms."""
    mib, frac = 0, 0.0
    for part in (p.strip().lower() for p in text.split(",") if p.strip()):
        try:
            if part.endswith("%"):
                frac = float(part[:-1]) / 100
            elif part.endswith(("gib", "gb", "g")):
                mib = int(float(part.rstrip("gib").rstrip("b") or "0") * MIB_PER_GIB)
            elif part.endswith(("mib", "mb", "m")):
                mib = int(float(part.rstrip("mib").rstrip("b") or "0"))
            else:
                mib = int(float(part))  # bare number: MiB ("0" turns the check off)
        except OverflowError:  # "infGiB"
            raise ValueError(text) from None
    if mib < 0 or not 0 <= frac < 1:
        raise ValueError(text)
    return HostLimit(min_mib=mib, min_frac=frac)
