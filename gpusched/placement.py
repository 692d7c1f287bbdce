"""Which queued job goes to which GPU now, and why. Pure: plain values in, a
:class:`Decision` out; no clock, file or process (STYLE #2).

Rules, checked per job and per GPU in this order (the first that fails vetoes the GPU):

1. **plan**: the job's suite gpu-plan must list the GPU (``allowed[g] > 0``).
2. **slots**: ``allowed[g] > running`` on that GPU, where ``running`` counts every job on the
   card, from every suite: the plan's cap is a hard cap per card.
3. **alone**: a card running an exclusive job takes nothing else.
4. **exclusive tier**: a job whose tier is ``exclusive`` needs a card with nothing running.
5. **tier minimum**: when the card's free memory is known, ``free - reserved`` must be at
   least the tier's ``min_free_mib``.
6. **prediction**: when free memory and the job's ``predicted_mib`` are known, the card is
   vetoed when ``free - reserved - headroom_frac * total < predicted`` (no headroom term when
   the card's total is unknown). ``reserved`` is memory predicted for recently launched jobs
   that the card does not show yet.
7. **held**: a card kept free for one waiting job (``held_for``, see ``memory.choose_holds``)
   takes no other job, even one that would fit it.

Among the GPUs left, the job takes the one with the most usable free memory
(``free - reserved``; unknown sorts after known), then the fewest running jobs, then the
lowest index; a job at an exclusive tier whose peak is learned takes the card with the fewest
slots in its plan first (:func:`rank_for`: the slots it idles). ``avoid_gpu`` (where its
last attempt failed) is skipped when another GPU is left.

Jobs are served in order of priority (high first), then predicted run time (longest first,
so that a night does not end on a long job started late; unknown first, as running one is
how it gets known; a job's ``chain_s`` counts when longer: its task's queued time over its
cards, for a task two of whose jobs do not fit one card), then predicted peak (largest first,
unknown last), then ``seq`` (FIFO).
A job that cannot go anywhere does not block the jobs after it. Each placement updates the
views (``running + 1``, ``reserved + predicted``) before the next job is considered.

A job may carry slower tiers to fall back to (``fallback``, with their predicted peaks). A
second pass gives each job that memory left waiting the first of them (one tier down) on
the cards the first pass left: a slower tier only takes room no job could use at its own. A
starved job (``pack_now``: later jobs kept overtaking it) tries all of them at its turn in
the first pass. A job moved down from its own tier only because its peak there is over a
slot's share (``faster``) takes that faster tier, at its turn, on a card where it fills the
last slot and fits beside what runs there (:func:`fill_last_slot`). The first pass keeps a
job off an empty card of which it would take more than a slot's share (:func:`alone_on`:
the card's other slots would idle beside it), leaving the card to a later job that leaves
room; the second pass gives it the card when none did, unless its peak is only a guess and
the card has stood empty for less than :data:`GUESS_PATIENCE_S` (:func:`guess_waits`); nor does
the second pass give such a card to a slower tier whose peak is a guess.

Every placement carries a reason; every job left waiting carries the binding constraint:
the veto of the GPUs that got furthest through the checks above.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

from msgspec import Struct
from msgspec.structs import replace

from gpusched.model import MIB_PER_GIB, GpuState, Placement, Tier, Wait

DEFAULT_HEADROOM_FRAC = 0.10
#: how long an empty card is left to jobs known to share it before a job whose peak is a guess
#: takes it alone (:func:`guess_waits`)
GUESS_PATIENCE_S = 600.0


class QueuedJob(Struct, frozen=True, kw_only=True):
    """A job waiting for a GPU, with what placement needs to know of it."""

    job_id: str
    seq: int  # enqueue order; FIFO among equals
    priority: int = 0
    tier: int
    tiers: tuple[Tier, ...]  # the suite's ladder; ``tiers[tier]`` is the job's tier
    allowed: Mapping[int, int]  # gpu index -> slot cap from the job's suite gpu-plan
    predicted_mib: int | None = None  # peak at its current tier, None when unknown
    avoid_gpu: int | None = None
    predicted_s: float | None = None  # run time at its current tier, None when unknown
    # slower tiers it may start at instead, (tier, predicted peak) in order, when memory keeps
    # it off every card at its own tier (the second pass of :func:`assign`)
    fallback: tuple[tuple[int, int | None], ...] = ()
    pack_now: bool = False  # memory has kept it waiting long: its fallback tiers are tried at its turn
    # its task's queued run time over its cards when two of its jobs do not fit one card: the
    # least time the task still needs; ordered by when it exceeds ``predicted_s``
    chain_s: float | None = None
    # faster tiers (tier, learned peak), fastest first, that it was moved down from only because
    # its peak there exceeds a slot's share of a card: it takes one where it fills a card's last
    # slot (see :func:`fill_last_slot`)
    faster: tuple[tuple[int, int | None], ...] = ()
    # ``predicted_mib`` is only a guess (a slot's share of a card, or a running sibling's plateau):
    # no job of its task has ended at its tier. It leaves an empty card it would take alone to
    # jobs known to share it for a while (:func:`guess_waits`)
    guessed: bool = False
    # no attempt of its task has left a peak or an OOM yet: a guessed job may start alone to be
    # measured (memory.unstick); once one has, a guess at another tier is not worth such a run
    unmeasured: bool = False
    # the ``fallback`` tiers whose predicted peak is only a guess, as ``guessed`` says of its own
    guessed_below: frozenset[int] = frozenset()


class GpuSlotView(Struct, frozen=True, kw_only=True):
    """One GPU as placement sees it: occupancy and, when a probe knows it, memory."""

    index: int
    running: int = 0  # jobs on this card now, from all suites
    exclusive_running: bool = False
    free_mib: int | None = None
    total_mib: int | None = None
    reserved_mib: int = 0  # predicted-but-not-yet-visible memory of recently launched jobs
    held_for: str | None = (
        None  # kept free for this waiting job (it needs the memory when the card's jobs end)
    )
    empty_s: float | None = None  # how long no job has run on it; None: not tracked (as just emptied)

    @property
    def usable_mib(self) -> int | None:
        """Free memory not yet promised to a running job yet to grow; ``None`` when unknown."""
        return None if self.free_mib is None else self.free_mib - self.reserved_mib


class Decision(Struct, frozen=True, kw_only=True):
    """What :func:`assign` decided: placements in the order made, and the jobs left waiting
    in the queue's order (:func:`job_order`), which callers rely on."""

    placements: tuple[Placement, ...] = ()
    waits: tuple[Wait, ...] = ()


class Veto(enum.IntEnum):
    """Why a GPU cannot take a job; the order is how far the GPU got through the rules."""

    NOT_IN_PLAN = 1
    SLOTS = 2
    EXCLUSIVE_THERE = 3
    NEEDS_EMPTY = 4
    MIN_FREE = 5
    MEMORY = 6
    HELD = 7


# --------------------------------------------------------------------------- the decision


def assign(
    queued: Sequence[QueuedJob],
    gpus: Sequence[GpuSlotView],
    *,
    headroom_frac: float = DEFAULT_HEADROOM_FRAC,
) -> Decision:
    """Place as many queued jobs as the rules allow (see the module docstring).

    Two passes over the queue, in :func:`job_order`: :func:`_first_pass` places each job at its
    own tier (a starved job also at a slower one, at its turn); :func:`_second_pass` gives the
    jobs it left waiting what it held back, on what it left: one tier down, and the empty card
    a job was kept off (it would take it alone), so a slower tier or a lone job only fills room
    that no job could take at its own tier and beside another."""
    views = {g.index: g for g in sorted(gpus, key=lambda g: g.index)}
    placements: list[Placement] = []
    held = held_jobs(gpus)
    keys = {id(j): rules_key(j, held) for j in queued}  # once per job, for both passes
    waits, spared = _first_pass(sorted(queued, key=job_order), views, placements, keys, headroom_frac)
    left = _second_pass(waits, views, placements, keys, headroom_frac, spared)
    return Decision(placements=tuple(placements), waits=tuple(w for _, w in left))


# Both passes walk the queue in order and share two habits. A placement updates ``views`` (the
# card's ``running`` and ``reserved``) and is appended to ``placements``. A job that waits
# leaves the views as they were, so a later job the rules cannot tell from it (the same key:
# its :func:`rules_key` and what the pass tries for it) waits for the same reason: a long queue
# costs one check per kind of job, not one per job, until the next placement changes the views.

_Key = tuple[object, ...]


def _first_pass(
    jobs: Sequence[QueuedJob],
    views: dict[int, GpuSlotView],
    placements: list[Placement],
    keys: Mapping[int, _Key],
    headroom_frac: float,
) -> tuple[list[tuple[QueuedJob, Wait]], set[int]]:
    """Each job at its own tier, not on an empty card it would take alone (:func:`alone_on`),
    and a starved one (``pack_now``) at the first of its ``fallback`` tiers that fits where
    memory keeps it off every card at its own. Returns the jobs left waiting with why, and the
    ``id()`` of the jobs for which, at their turn, an empty card was one they would take alone
    (the second pass tries those again at their own tier, on every card)."""
    waits: list[tuple[QueuedJob, Wait]] = []
    spared: set[int] = set()
    waited: dict[_Key, Wait] = {}
    empty = [g for g in views.values() if g.running == 0]  # the cards a job may take alone
    alone: dict[_Key, bool] = {}  # by rules key, while ``empty`` stays as it is
    for job in jobs:
        kind = keys[id(job)]
        if kind not in alone:
            alone[kind] = any(alone_on(job, g, headroom_frac) for g in empty)
        if alone[kind]:
            spared.add(id(job))
        falls = job.fallback if job.pack_now else ()
        key = (kind, falls)
        if key in waited:
            waits.append((job, Wait(job_id=job.job_id, reason=waited[key].reason)))
            continue
        cards = list(views.values())
        outcome, placed = _own_tier(job, cards, headroom_frac, share=True)
        if not isinstance(outcome, Placement):
            outcome, placed = _slower_tier(job, cards, headroom_frac, falls) or (outcome, job)
        if isinstance(outcome, Placement):
            _occupy(outcome, placed, views, placements)
            waited.clear()
            if any(g.index == outcome.gpu for g in empty):
                empty = [g for g in empty if g.index != outcome.gpu]
                alone.clear()
        else:
            waits.append((job, outcome))
            waited[key] = outcome
    return waits, spared


#: Why a job waits that a slower tier's guessed peak keeps off an empty card (:func:`_noted`).
_KEPT_BELOW = "while its peak at a slower tier is a guess"


def _second_pass(
    jobs: Sequence[tuple[QueuedJob, Wait]],
    views: dict[int, GpuSlotView],
    placements: list[Placement],
    keys: Mapping[int, _Key],
    headroom_frac: float,
    spared: set[int],
) -> list[tuple[QueuedJob, Wait]]:
    """The jobs the first pass left waiting (with why), on the cards it left: a job the first
    pass kept off an empty card it would take alone (``spared``) tries its own tier again on
    every card, and a job memory keeps off every card at its own tier takes the first of its
    ``fallback`` tiers (one tier down) that fits now (not a starved one: it tried them all at
    its turn). Returns the jobs still waiting: with the first pass's why, or for a spared job
    with why its own tier fits no card now."""
    waits: list[tuple[QueuedJob, Wait]] = []
    waited: dict[_Key, tuple[Wait, list[int]]] = {}  # why, and the cards its slower tier is kept off
    for job, before in jobs:
        again = id(job) in spared
        left = guess_waits(job, views.values(), headroom_frac) if again else []
        if left:
            again = False
            before = _noted(before, left, "while its peak is a guess")
        falls = () if job.pack_now else job.fallback[:1]
        if not falls and not again:
            waits.append((job, before))  # nothing new to try: its first-pass why stands
            continue
        key = (keys[id(job)], falls, again, job.guessed_below)
        kept: list[int] = []
        if key in waited:  # a job like one before, the cards as they were: it waits alike
            like, kept = waited[key]
            alike = Wait(job_id=job.job_id, reason=like.reason) if again else before
            waits.append((job, _noted(alike, kept, _KEPT_BELOW) if kept and not again else alike))
            continue
        cards = list(views.values())
        outcome: Placement | Wait = before
        placed = job
        if again:
            outcome, placed = _own_tier(job, cards, headroom_frac, share=False)
        if not isinstance(outcome, Placement):
            outcome, placed = _slower_tier(job, cards, headroom_frac, falls, kept) or (outcome, job)
            if kept and not isinstance(outcome, Placement):
                outcome = _noted(outcome, kept, _KEPT_BELOW)
        if isinstance(outcome, Placement):
            _occupy(outcome, placed, views, placements)
            waited.clear()
        else:
            waits.append((job, outcome))
            waited[key] = (outcome, kept)
    return waits


def _occupy(
    placement: Placement, job: QueuedJob, views: dict[int, GpuSlotView], placements: list[Placement]
) -> None:
    """Record ``placement`` of ``job`` (as placed: its tier and peak) and update its card's view."""
    placements.append(placement)
    if placement.gpu is not None:
        views[placement.gpu] = occupy(views[placement.gpu], job)


def _own_tier(
    job: QueuedJob, views: Sequence[GpuSlotView], headroom_frac: float, *, share: bool
) -> tuple[Placement | Wait, QueuedJob]:
    """``job`` at its own tier, or at one of its ``faster`` tiers where that fills a card's last
    slot (:func:`fill_last_slot`); with ``share``, not on a card it would take alone
    (:func:`alone_on`). Returns the placement or why it waits, and the job as placed."""
    if job.faster:
        up = fill_last_slot(job, views, headroom_frac)
        if up is not None:
            return up
    cards = [g for g in views if not alone_on(job, g, headroom_frac)] if share else views
    return place_one(job, cards, headroom_frac), job


def _slower_tier(
    job: QueuedJob,
    views: Sequence[GpuSlotView],
    headroom_frac: float,
    falls: Sequence[tuple[int, int | None]],
    kept: list[int] | None = None,
) -> tuple[Placement, QueuedJob] | None:
    """``job`` at the first of ``falls`` (slower tiers, with their predicted peaks) that fits a
    card now, when memory keeps it off every card at its own tier; the job as placed. ``None``
    when it does not fall back. With ``kept`` (the second pass), not on an empty card it would
    take alone at a tier where its peak is a guess, while that card waits for jobs known to
    share it (:func:`guess_waits`); the cards so kept from it are added to ``kept``."""
    if not falls or not memory_bound(job, views, headroom_frac):
        return None
    for tier, predicted in falls:
        guessed = tier in job.guessed_below
        lower = replace(job, tier=tier, predicted_mib=predicted, fallback=(), pack_now=False, guessed=guessed)
        cards = views
        if kept is not None and (left := guess_waits(lower, views, headroom_frac)):
            kept.extend(i for i in left if i not in kept)
            cards = [g for g in views if g.index not in left]
        fell = place_one(lower, cards, headroom_frac)
        if isinstance(fell, Placement):
            return replace(fell, reason=f"{fallback_note(job, lower)}; {fell.reason}"), lower
    return None


def alone_on(job: QueuedJob, gpu: GpuSlotView, headroom_frac: float) -> bool:
    """True when ``job`` would take more than a slot's share of an empty card that several
    jobs may share (its usable memory, after headroom, over the plan's cap): the card's
    other slots would likely idle beside it. The first pass keeps such a job off such a card,
    so that a job that leaves room beside it may take it; the second gives it the card if
    none did. On the E1-like trace this is the card with a colleague's 6 GiB notebook (15.6
    GiB usable, 7.8 a slot): a 13-15 GiB job alone there idled its other slot for 1-3 h a
    night; the eight seeds went from 1.124 to 1.117 x the lower bound (1.112 with the ladder
    from an OOM's peak, ``memory.fill_ladder``), the eight others from 1.140 to 1.129."""
    cap, usable = job.allowed.get(gpu.index, 0), gpu.usable_mib
    if gpu.running or cap < 2 or usable is None or job.predicted_mib is None:
        return False
    return job.predicted_mib * cap > usable - headroom_mib(gpu, headroom_frac)


def guess_waits(job: QueuedJob, views: Collection[GpuSlotView], headroom_frac: float) -> list[int]:
    """The empty cards that ``job``, kept off them as it would take them alone
    (:func:`alone_on`), does not get in the second pass yet (none: it does not wait): each has
    been empty for less than :data:`GUESS_PATIENCE_S`, the job's peak is only a guess
    (``guessed``: no job of its task has ended at its tier; the second pass asks the same of a
    slower tier it would fall back to), some job runs, so a peak is being learned, and it has
    not waited long (``pack_now``). The guess is a slot's share of the smallest card (or, once
    a sibling has settled, its plateau x 1.3), so on a card with less room (someone's notebook)
    every job of an unknown task would take it alone; the card waits a while for a job known
    to share it instead: minutes into a night the small tasks' plateaus say that two of them
    fit. On the E1-like trace the notebook's card ran the night's second qqp (11 GiB) alone
    from 0 h for 1.3 h, nothing fitting in the 4.6 GiB beside it; with
    :func:`memory.choose_holds` ranking cards by room, 80 seeds went from 1.1136 to 1.1093 x
    the lower bound (docs/placement-rounds.md, "Stop 29"). Then it ran the first boolq at B
    (14.8 GiB; a guess after its OOM at A) alone for 0.85 h, from 3 min into every night; with
    the slower tiers asked too and the plateau guess, two colas share it from then: 80 seeds
    1.1088 -> 1.0977 (docs/placement-rounds.md, "Stop 30")."""
    if not job.guessed or job.pack_now or not any(g.running for g in views):
        return []
    return [
        g.index for g in views if alone_on(job, g, headroom_frac) and (g.empty_s or 0.0) < GUESS_PATIENCE_S
    ]


def _noted(wait: Wait, cards: Sequence[int], why: str) -> Wait:
    """``wait`` with the empty ``cards`` it is kept off (:func:`guess_waits`) and ``why``."""
    which = f"GPUs {_index_list(cards)} are" if len(cards) > 1 else f"GPU {_index_list(cards)} is"
    return replace(wait, reason=f"{wait.reason}; {which} left to jobs known to share them {why}")


def fill_last_slot(
    job: QueuedJob, views: Sequence[GpuSlotView], headroom_frac: float
) -> tuple[Placement, QueuedJob] | None:
    """``job`` at the fastest of its ``faster`` tiers that fits a card where it takes the last
    slot the card's cap allows, or ``None``. A job over a slot's share starts a tier down so
    as not to block its card-mates; where they are running already it blocks none of them
    now and runs ~8 % faster (the slot freed beside it later takes a smaller job). With the
    ladder guessed from the task of the nearest peak (``memory.ladder_ratio``) it took the
    eight E1-like seeds from 1.146 to 1.124 x the lower bound (bigger jobs at A beside a B;
    each alone measured no better: 1.138 and 1.146)."""
    last = [g for g in views if g.running + 1 == job.allowed.get(g.index, 0)]
    if not last:
        return None
    for tier, predicted in job.faster:
        if predicted is None:
            continue
        up = replace(job, tier=tier, predicted_mib=predicted, fallback=(), pack_now=False, faster=())
        placed = place_one(up, last, headroom_frac)
        if isinstance(placed, Placement):
            here, there = tier_of(up).name, tier_of(job).name
            note = f"tier {here} instead of {there}: it takes GPU {placed.gpu}'s last slot"
            return replace(placed, reason=f"{note}; {placed.reason}"), up
    return None


MEMORY_VETOES = frozenset({Veto.NEEDS_EMPTY, Veto.MIN_FREE, Veto.MEMORY})  # not HELD: a hold is a choice


def memory_bound(job: QueuedJob, views: Sequence[GpuSlotView], headroom_frac: float) -> bool:
    """True when memory (not slots or the plan) keeps ``job`` off every card it may use."""
    vetoes = [veto(job, g, headroom_frac) for g in views]
    planned = [v for v in vetoes if v is not Veto.NOT_IN_PLAN]
    return bool(planned) and None not in planned and any(v in MEMORY_VETOES for v in planned)


def fallback_note(job: QueuedJob, lower: QueuedJob) -> str:
    """``"tier B instead of A: ~13.0 GiB at A fits no GPU now, ~8.2 GiB at B does"``."""
    here, there = tier_of(job).name, tier_of(lower).name
    need = f"~{gib(job.predicted_mib)} at {here}" if job.predicted_mib is not None else f"tier {here}"
    now = (
        f"~{gib(lower.predicted_mib)} at {there} does" if lower.predicted_mib is not None else f"{there} does"
    )
    return f"tier {there} instead of {here}: {need} fits no GPU now, {now}"


def held_jobs(gpus: Iterable[GpuSlotView]) -> set[str]:
    """The jobs some card is kept free for."""
    return {g.held_for for g in gpus if g.held_for is not None}


def rules_key(job: QueuedJob, held: set[str]) -> tuple[object, ...]:
    """All that the vetoes and the wait reason read of a job: jobs with equal keys are vetoed
    alike by every card (``avoid_gpu`` only matters once a card fits). ``held``: see
    :func:`held_jobs`. ``tiers`` and ``allowed`` by identity: the jobs of one suite share one
    ladder and one map of caps, and both outlive the caller's loop."""
    return (
        id(job.tiers),
        job.tier,
        id(job.allowed),
        job.predicted_mib,
        job.faster,
        job.job_id if job.job_id in held else None,
    )


def job_order(job: QueuedJob) -> tuple[int, bool, float, bool, int, int]:
    """Priority desc, then predicted run time desc, or ``chain_s`` where longer (longest first,
    so that the night does not end on a long job started late; unknown first: running one is
    how it gets known), then predicted peak desc (unknown last), then seq."""
    return (
        -job.priority,
        job.predicted_s is not None,
        -max(job.predicted_s or 0.0, job.chain_s or 0.0),
        job.predicted_mib is None,
        -(job.predicted_mib or 0),
        job.seq,
    )


def place_one(job: QueuedJob, views: Sequence[GpuSlotView], headroom_frac: float) -> Placement | Wait:
    """The GPU for one job given the current views, or why it waits."""
    vetoes = {g.index: veto(job, g, headroom_frac) for g in views}
    ranked = sorted((g for g in views if vetoes[g.index] is None), key=rank_for(job))
    if not ranked:
        return Wait(job_id=job.job_id, reason=wait_reason(job, views, vetoes, headroom_frac))
    chosen, avoided = _skip_avoided(ranked, job.avoid_gpu)
    others = [g for g in ranked if g.index not in (chosen.index, avoided)]
    reason = placement_reason(job, chosen, others, avoided)
    return Placement(job_id=job.job_id, gpu=chosen.index, tier=job.tier, reason=reason)


def veto(job: QueuedJob, gpu: GpuSlotView, headroom_frac: float) -> Veto | None:
    """The first rule ``gpu`` breaks for ``job``, or ``None`` when it may take the job."""
    slot = _slot_veto(job, gpu)
    if slot is not None:
        return slot
    memory = _memory_veto(job, gpu, headroom_frac)
    if memory is not None:
        return memory
    return Veto.HELD if gpu.held_for is not None and gpu.held_for != job.job_id else None


def _slot_veto(job: QueuedJob, gpu: GpuSlotView) -> Veto | None:
    cap = job.allowed.get(gpu.index, 0)
    if cap <= 0:
        return Veto.NOT_IN_PLAN
    if gpu.running >= cap:
        return Veto.SLOTS
    if gpu.exclusive_running:
        return Veto.EXCLUSIVE_THERE
    if tier_of(job).exclusive and gpu.running > 0:
        return Veto.NEEDS_EMPTY
    return None


def _memory_veto(job: QueuedJob, gpu: GpuSlotView, headroom_frac: float) -> Veto | None:
    usable, min_free = gpu.usable_mib, tier_of(job).min_free_mib
    if usable is None:
        return None
    if min_free is not None and usable < min_free:
        return Veto.MIN_FREE
    if job.predicted_mib is not None and usable - headroom_mib(gpu, headroom_frac) < job.predicted_mib:
        return Veto.MEMORY
    return None


def rank_key(gpu: GpuSlotView) -> tuple[bool, int, int, int]:
    """Most usable free memory first (unknown after known), then fewest running, then index."""
    usable = gpu.usable_mib
    return (usable is None, -(usable or 0), gpu.running, gpu.index)


def rank_for(job: QueuedJob) -> Callable[[GpuSlotView], tuple[object, ...]]:
    """How ``job`` ranks the cards that may take it: :func:`rank_key`, except at an exclusive
    tier with a learned peak (:func:`fewest_slots_first`), where the card with the fewest slots
    in its plan comes first. Such a job idles all of its card's slots, and every card left to
    it fits its peak: on a plan like ``2,2,2,2,1,1,1`` it takes a 1-slot card and leaves a
    2-slot one to two jobs, where the most free memory (or the lowest index, among equal cards)
    gave it a 2-slot card and idled a slot for its whole run. Where its peak is a guess or
    unknown, the most free memory still comes first: the cards given fewer slots are often
    those that something else shares, and an exclusive tier is as a rule the ladder's last,
    where an OOM fails the job."""
    if not fewest_slots_first(job):
        return rank_key
    allowed = job.allowed
    return lambda g: (allowed.get(g.index, 0), *rank_key(g))


def fewest_slots_first(job: QueuedJob) -> bool:
    """True when ``job`` prefers the card with the fewest slots in its plan (:func:`rank_for`;
    a card drained for it, :func:`memory.choose_holds`, alike): an exclusive tier, and a peak
    learned, not a guess (``guessed``: a slot's share, a sibling's plateau)."""
    return tier_of(job).exclusive and job.predicted_mib is not None and not job.guessed


def occupy(gpu: GpuSlotView, job: QueuedJob) -> GpuSlotView:
    """``gpu`` after ``job`` was placed on it."""
    return replace(
        gpu,
        running=gpu.running + 1,
        reserved_mib=gpu.reserved_mib + (job.predicted_mib or 0),
        exclusive_running=gpu.exclusive_running or tier_of(job).exclusive,
    )


def tier_of(job: QueuedJob) -> Tier:
    """The job's tier; an index outside the ladder reads as a tier with no constraints
    (placement never raises into the loop; the plan loader validates tiers)."""
    if 0 <= job.tier < len(job.tiers):
        return job.tiers[job.tier]
    return Tier(name=f"#{job.tier}")


def headroom_mib(gpu: GpuSlotView, headroom_frac: float) -> int:
    return 0 if gpu.total_mib is None else int(headroom_frac * gpu.total_mib)


def _skip_avoided(ranked: list[GpuSlotView], avoid: int | None) -> tuple[GpuSlotView, int | None]:
    kept = [g for g in ranked if g.index != avoid]
    if kept and len(kept) < len(ranked):
        return kept[0], avoid
    return ranked[0], None


# --------------------------------------------------------------------------- reasons


def placement_reason(
    job: QueuedJob, chosen: GpuSlotView, others: Sequence[GpuSlotView], avoided: int | None
) -> str:
    """``"GPU 3: most free memory (21.3 GiB free, 1/2 slots used, needs ~9.0 GiB)"``."""
    details = [_free_text(chosen), f"{chosen.running}/{job.allowed[chosen.index]} slots used"]
    if job.predicted_mib is not None:
        details.append(f"needs ~{gib(job.predicted_mib)}")
    text = f"GPU {chosen.index}: {_why_best(job, chosen, others, avoided)} ({', '.join(details)})"
    return text + (f"; GPU {avoided} avoided (its last attempt failed there)" if avoided is not None else "")


def _why_best(job: QueuedJob, chosen: GpuSlotView, others: Sequence[GpuSlotView], avoided: int | None) -> str:
    if not others:
        return "the only other GPU that fits" if avoided is not None else "the only GPU that fits"
    if fewest_slots_first(job) and any(job.allowed[chosen.index] < job.allowed[g.index] for g in others):
        return "fewest slots to idle (its tier runs alone)"  # (what kept it off the others with more)
    runner_up = min(others, key=rank_for(job))
    if chosen.usable_mib is not None and (
        runner_up.usable_mib is None or chosen.usable_mib > runner_up.usable_mib
    ):
        return "most free memory"
    if chosen.running < runner_up.running:
        return "fewest running jobs"
    return "lowest index among equals"


def wait_reason(
    job: QueuedJob, views: Sequence[GpuSlotView], vetoes: Mapping[int, Veto | None], headroom_frac: float
) -> str:
    """The binding constraint: the veto of the GPUs that got furthest through the rules."""
    planned = [g for g in views if vetoes[g.index] is not Veto.NOT_IN_PLAN]
    if not planned:
        return _not_in_plan_reason(job, views)
    furthest = max(v for v in (vetoes[g.index] for g in planned) if v is not None)
    best = min((g for g in planned if vetoes[g.index] is furthest), key=rank_key)
    if furthest in (Veto.SLOTS, Veto.EXCLUSIVE_THERE):
        return _busy_reason(job, planned, vetoes, views)
    if furthest is Veto.HELD:
        return f"GPU {best.index} is kept free for {best.held_for} (it waits for that card's memory)"
    tier = tier_of(job)
    if furthest is Veto.NEEDS_EMPTY:
        return f"waits for an empty GPU (tier {tier.name} runs alone)"
    has = f"GPU {best.index} has {_free_text(best)}"
    if furthest is Veto.MIN_FREE:
        return f"{has}, tier {tier.name} needs at least {gib(tier.min_free_mib or 0)}"
    return f"{has}, needs {gib(job.predicted_mib or 0)}{_headroom_text(best, headroom_frac)}"


def _busy_reason(
    job: QueuedJob,
    planned: Sequence[GpuSlotView],
    vetoes: Mapping[int, Veto | None],
    views: Sequence[GpuSlotView],
) -> str:
    alone = [str(g.index) for g in planned if vetoes[g.index] is Veto.EXCLUSIVE_THERE]
    suffix = f" (GPU {','.join(alone)} runs an exclusive job)" if alone else ""
    if len(planned) == len(views):
        return f"all {sum(job.allowed[g.index] for g in planned)} slots busy{suffix}"
    return f"its GPUs ({_index_list(g.index for g in planned)}) are busy{suffix}"


def _not_in_plan_reason(job: QueuedJob, views: Sequence[GpuSlotView]) -> str:
    wanted = [g for g, cap in job.allowed.items() if cap > 0]
    if not wanted:
        return "its gpu-plan gives it no slot on any GPU"
    seen = _index_list(g.index for g in views) or "none"
    return f"its GPUs ({_index_list(wanted)}) are not among the GPUs seen ({seen})"


def _free_text(gpu: GpuSlotView) -> str:
    if gpu.usable_mib is None:
        return "free memory unknown"
    if gpu.reserved_mib:
        return (
            f"{gib(gpu.usable_mib)} free after {gib(gpu.reserved_mib)} reserved for running jobs yet to grow"
        )
    return f"{gib(gpu.usable_mib)} free"


def _headroom_text(gpu: GpuSlotView, headroom_frac: float) -> str:
    return f" (+{headroom_frac:.0%} headroom)" if headroom_mib(gpu, headroom_frac) > 0 else ""


def _index_list(indices: Iterable[int]) -> str:
    return ",".join(str(i) for i in sorted(indices))


def gib(mib: int) -> str:
    """``9216`` -> ``"9.0 GiB"``."""
    return f"{mib / MIB_PER_GIB:.1f} GiB"


# --------------------------------------------------------------------------- building views


def gpu_views(
    indices: Iterable[int],
    states: Sequence[GpuState] = (),
    *,
    running: Mapping[int, int] | None = None,
    exclusive: Iterable[int] = (),
    reserved_mib: Mapping[int, int] | None = None,
) -> tuple[GpuSlotView, ...]:
    """Views for ``indices`` (every GPU any plan uses), with memory from the probe's
    ``states`` where it has them (a GPU the probe does not list gets unknown memory)."""
    by_index = {s.index: s for s in states}
    alone, running, reserved_mib = frozenset(exclusive), running or {}, reserved_mib or {}
    return tuple(
        GpuSlotView(
            index=i,
            running=running.get(i, 0),
            exclusive_running=i in alone,
            free_mib=by_index[i].free_mib if i in by_index else None,
            total_mib=by_index[i].total_mib if i in by_index else None,
            reserved_mib=reserved_mib.get(i, 0),
        )
        for i in sorted(set(indices))
    )
