"""placement.assign: one table test per rule and reason, then properties over random queues."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from msgspec.structs import replace

from gpusched.model import GpuProcess, GpuState, Placement, Tier
from gpusched.placement import (
    GUESS_PATIENCE_S,
    Decision,
    GpuSlotView,
    QueuedJob,
    alone_on,
    assign,
    gpu_views,
    headroom_mib,
    job_order,
    occupy,
    tier_of,
    veto,
)

GIB = 1024
TIERS = (
    Tier(name="A"),
    Tier(name="B", min_free_mib=12 * GIB),
    Tier(name="D", exclusive=True),
)
TIER_A, TIER_B, TIER_D = 0, 1, 2


def job(
    job_id: str = "j",
    *,
    seq: int = 0,
    tier: int = TIER_A,
    allowed: dict[int, int] | None = None,
    predicted: int | None = None,
    priority: int = 0,
    avoid: int | None = None,
    seconds: float | None = None,
) -> QueuedJob:
    return QueuedJob(
        job_id=job_id,
        seq=seq,
        priority=priority,
        tier=tier,
        tiers=TIERS,
        allowed={i: 2 for i in range(8)} if allowed is None else allowed,
        predicted_mib=predicted,
        avoid_gpu=avoid,
        predicted_s=seconds,
    )


def gpu(
    index: int,
    *,
    running: int = 0,
    free: float | None = None,
    total: float | None = None,
    reserved: float = 0,
    exclusive: bool = False,
) -> GpuSlotView:
    """Memory in GiB for readability."""
    return GpuSlotView(
        index=index,
        running=running,
        exclusive_running=exclusive,
        free_mib=None if free is None else int(free * GIB),
        total_mib=None if total is None else int(total * GIB),
        reserved_mib=int(reserved * GIB),
    )


def one(queued: QueuedJob, gpus: Sequence[GpuSlotView], **kwargs: float) -> Placement | str:
    """The single job's placement, or its wait reason."""
    decision = assign([queued], gpus, **kwargs)
    if decision.placements:
        return decision.placements[0]
    return decision.waits[0].reason


# --------------------------------------------------------------------------- choice and reasons

PLACED = [
    pytest.param(
        job(),
        [gpu(0, free=10, total=24), gpu(1, free=20, total=24, running=1)],
        1,
        "GPU 1: most free memory (20.0 GiB free, 1/2 slots used)",
        id="most-free-memory",
    ),
    pytest.param(
        job(),
        [gpu(0, free=20, running=1), gpu(1, free=20)],
        1,
        "GPU 1: fewest running jobs (20.0 GiB free, 0/2 slots used)",
        id="tie-on-memory-fewest-running",
    ),
    pytest.param(
        job(),
        [gpu(0, free=20), gpu(1, free=20)],
        0,
        "GPU 0: lowest index among equals",
        id="full-tie-lowest-index",
    ),
    pytest.param(
        job(),
        [gpu(0), gpu(1, free=1)],
        1,
        "GPU 1: most free memory (1.0 GiB free",
        id="unknown-free-sorts-after-known",
    ),
    pytest.param(
        job(),
        [gpu(0, running=1), gpu(1)],
        1,
        "GPU 1: fewest running jobs (free memory unknown, 0/2 slots used)",
        id="no-memory-info-fewest-running",
    ),
    pytest.param(
        job(allowed={0: 1, 1: 1}),
        [gpu(0, running=1, free=23), gpu(1, free=2)],
        1,
        "GPU 1: the only GPU that fits (2.0 GiB free, 0/1 slots used)",
        id="slot-cap-counts-every-suite",
    ),
    pytest.param(
        job(predicted=9 * GIB),
        [gpu(0, free=20, total=24)],
        0,
        "GPU 0: the only GPU that fits (20.0 GiB free, 0/2 slots used, needs ~9.0 GiB)",
        id="reason-shows-prediction",
    ),
    pytest.param(
        job(tier=TIER_D),
        [gpu(0, running=1, free=20), gpu(1, free=5)],
        1,
        "GPU 1: the only GPU that fits",
        id="exclusive-tier-takes-empty-card",
    ),
    pytest.param(  # 2,2,1: at an exclusive tier it idles one slot on GPU 2, not two
        job(tier=TIER_D, allowed={0: 2, 1: 2, 2: 1}, predicted=10 * GIB),
        [gpu(0, free=24, total=24), gpu(1, free=24, total=24), gpu(2, free=24, total=24)],
        2,
        "GPU 2: fewest slots to idle (its tier runs alone) (24.0 GiB free, 0/1 slots used, needs ~10.0 GiB)",
        id="exclusive-tier-takes-the-card-with-fewest-slots",
    ),
    pytest.param(  # 2,2,1,1: GPUs 2 and 3 are equal, but the reason says why not 0 or 1
        job(tier=TIER_D, allowed={0: 2, 1: 2, 2: 1, 3: 1}, predicted=10 * GIB),
        [gpu(i, free=24, total=24) for i in range(4)],
        2,
        "GPU 2: fewest slots to idle (its tier runs alone)",
        id="exclusive-tier-reason-names-the-slots-among-equal-cards",
    ),
    pytest.param(  # less free memory there (someone's notebook), but its known peak fits
        job(tier=TIER_D, allowed={0: 2, 1: 1}, predicted=10 * GIB),
        [gpu(0, free=24, total=24), gpu(1, free=16, total=24)],
        1,
        "GPU 1: fewest slots to idle (its tier runs alone)",
        id="exclusive-tier-fewest-slots-before-most-memory",
    ),
    pytest.param(  # its known peak does not fit the 1-slot card: the 2-slot one
        job(tier=TIER_D, allowed={0: 2, 1: 1}, predicted=18 * GIB),
        [gpu(0, free=24, total=24), gpu(1, free=16, total=24)],
        0,
        "GPU 0: the only GPU that fits",
        id="exclusive-tier-fewest-slots-only-where-it-fits",
    ),
    pytest.param(  # an unknown peak: the most free memory, as any job
        job(tier=TIER_D, allowed={0: 2, 1: 1}),
        [gpu(0, free=24, total=24), gpu(1, free=16, total=24)],
        0,
        "GPU 0: most free memory",
        id="exclusive-tier-unknown-peak-takes-most-memory",
    ),
    pytest.param(  # a guessed peak alike: at the ladder's last tier an OOM fails the job
        replace(job(tier=TIER_D, allowed={0: 2, 1: 1}, predicted=10 * GIB), guessed=True),
        [gpu(0, free=24, total=24), gpu(1, free=16, total=24)],
        0,
        "GPU 0: most free memory",
        id="exclusive-tier-guessed-peak-takes-most-memory",
    ),
    pytest.param(  # equal slots: the usual order, and the usual words
        job(tier=TIER_D, allowed={0: 1, 1: 1}, predicted=10 * GIB),
        [gpu(0, free=20, total=24), gpu(1, free=22, total=24)],
        1,
        "GPU 1: most free memory",
        id="exclusive-tier-equal-slots-most-memory",
    ),
    pytest.param(
        job(tier=TIER_B),
        [gpu(0), gpu(1, running=1)],
        0,
        "GPU 0: fewest running jobs",
        id="tier-minimum-ignored-when-free-unknown",
    ),
    pytest.param(
        job(predicted=40 * GIB),
        [gpu(0, running=1), gpu(1, free=0.1, total=24)],
        0,
        "GPU 0: the only GPU that fits (free memory unknown",
        id="prediction-ignored-when-free-unknown",
    ),
    pytest.param(
        job(predicted=None),
        [gpu(0, free=0.1, total=24)],
        0,
        "GPU 0: the only GPU that fits (0.1 GiB free",
        id="unknown-prediction-no-veto",
    ),
    pytest.param(
        job(avoid=1),
        [gpu(0, free=10), gpu(1, free=20), gpu(2, free=5)],
        0,
        "GPU 0: most free memory (10.0 GiB free, 0/2 slots used); GPU 1 avoided",
        id="avoid-gpu-when-another-exists",
    ),
    pytest.param(
        job(avoid=1),
        [gpu(0, running=2), gpu(1, free=20)],
        1,
        "GPU 1: the only GPU that fits",
        id="avoid-gpu-ignored-when-alone",
    ),
    pytest.param(
        job(avoid=1),
        [gpu(0, free=10), gpu(1, free=20)],
        0,
        "GPU 0: the only other GPU that fits (10.0 GiB free, 0/2 slots used); GPU 1 avoided",
        id="avoid-gpu-leaves-one",
    ),
    pytest.param(
        job(predicted=9 * GIB),
        [gpu(0, free=9 * 1.1 + 0.01, total=9)],
        0,
        "GPU 0:",
        id="headroom-is-a-fraction-of-total",
    ),
]


@pytest.mark.parametrize(("queued", "gpus", "expected_gpu", "reason"), PLACED)
def test_placement_choice_and_reason(
    queued: QueuedJob, gpus: list[GpuSlotView], expected_gpu: int, reason: str
) -> None:
    placed = one(queued, gpus)
    assert isinstance(placed, Placement), placed
    assert placed.gpu == expected_gpu
    assert placed.tier == queued.tier
    assert placed.reason.startswith(reason), placed.reason


WAITS = [
    pytest.param(
        job(),
        [gpu(i, running=2, free=20) for i in range(7)],
        "all 14 slots busy",
        id="all-slots-busy",
    ),
    pytest.param(
        job(allowed={4: 1, 5: 1}),
        [gpu(i, free=20, running=1 if i in (4, 5) else 0) for i in range(6)],
        "its GPUs (4,5) are busy",
        id="subset-of-gpus-busy",
    ),
    pytest.param(
        job(allowed={0: 2, 1: 2}),
        [gpu(0, running=1, exclusive=True), gpu(1, running=2)],
        "all 4 slots busy (GPU 0 runs an exclusive job)",
        id="exclusive-job-blocks-card",
    ),
    pytest.param(
        job(tier=TIER_D),
        [gpu(0, running=1, free=20), gpu(1, running=1, free=20)],
        "waits for an empty GPU (tier D runs alone)",
        id="exclusive-tier-needs-empty",
    ),
    pytest.param(
        job(tier=TIER_B),
        [gpu(0, free=10, total=24), gpu(1, free=4, total=24)],
        "GPU 0 has 10.0 GiB free, tier B needs at least 12.0 GiB",
        id="tier-minimum-free",
    ),
    pytest.param(
        job(predicted=9 * GIB),
        [gpu(i, free=f, total=24) for i, f in enumerate([0.5, 0.8, 1.0, 1.2])],
        "GPU 3 has 1.2 GiB free, needs 9.0 GiB (+10% headroom)",
        id="prediction-too-big",
    ),
    pytest.param(
        job(predicted=9 * GIB),
        [gpu(0, free=20, total=24, reserved=15)],
        "GPU 0 has 5.0 GiB free after 15.0 GiB reserved for running jobs yet to grow,"
        " needs 9.0 GiB (+10% headroom)",
        id="reservations-count",
    ),
    pytest.param(
        job(predicted=9 * GIB),
        [gpu(0, free=8)],
        "GPU 0 has 8.0 GiB free, needs 9.0 GiB",
        id="no-headroom-when-total-unknown",
    ),
    pytest.param(
        job(predicted=9 * GIB),
        [gpu(0, running=2, free=23, total=24), gpu(1, free=5, total=24)],
        "GPU 1 has 5.0 GiB free, needs 9.0 GiB (+10% headroom)",
        id="binding-constraint-is-the-furthest-veto",
    ),
    pytest.param(
        job(allowed={7: 2}),
        [gpu(i) for i in range(4)],
        "its GPUs (7) are not among the GPUs seen (0,1,2,3)",
        id="plan-gpus-absent",
    ),
    pytest.param(
        job(allowed={0: 0}),
        [gpu(0)],
        "its gpu-plan gives it no slot on any GPU",
        id="plan-gives-no-slot",
    ),
    pytest.param(
        job(),
        [],
        "its GPUs (0,1,2,3,4,5,6,7) are not among the GPUs seen (none)",
        id="no-gpus-at-all",
    ),
]


@pytest.mark.parametrize(("queued", "gpus", "reason"), WAITS)
def test_wait_reason_names_the_binding_constraint(
    queued: QueuedJob, gpus: list[GpuSlotView], reason: str
) -> None:
    assert one(queued, gpus) == reason


def test_headroom_boundary_is_inclusive() -> None:
    card = gpu(0, free=20, total=24)
    need = card.free_mib - headroom_mib(card, 0.10)  # type: ignore[operator]
    assert isinstance(one(job(predicted=need), [card]), Placement)
    assert isinstance(one(job(predicted=need + 1), [card]), str)


def test_headroom_fraction_is_a_parameter() -> None:
    card = gpu(0, free=10, total=20)
    assert isinstance(one(job(predicted=9 * GIB), [card]), str)
    assert isinstance(one(job(predicted=9 * GIB), [card], headroom_frac=0.0), Placement)
    assert one(job(predicted=9 * GIB), [card], headroom_frac=0.2).endswith("(+20% headroom)")  # type: ignore[union-attr]


def test_tier_minimum_counts_reservations() -> None:
    assert isinstance(one(job(tier=TIER_B), [gpu(0, free=20, reserved=9)]), str)
    assert isinstance(one(job(tier=TIER_B), [gpu(0, free=20, reserved=8)]), Placement)


def test_unknown_tier_index_has_no_constraints() -> None:
    assert tier_of(job(tier=9)).name == "#9"
    assert isinstance(one(job(tier=9), [gpu(0, running=1)]), Placement)


# --------------------------------------------------------------------------- several jobs


def test_queue_order_priority_then_size_then_fifo() -> None:
    jobs = [
        job("small", seq=0, predicted=1 * GIB),
        job("unknown", seq=1),
        job("big", seq=2, predicted=9 * GIB),
        job("urgent", seq=3, priority=5, predicted=1 * GIB),
        job("big-later", seq=4, predicted=9 * GIB),
    ]
    assert [j.job_id for j in sorted(jobs, key=job_order)] == [
        "urgent",
        "big",
        "big-later",
        "small",
        "unknown",
    ]
    decision = assign(jobs, [gpu(0, free=40, total=80)], headroom_frac=0.0)
    assert [p.job_id for p in decision.placements] == ["urgent", "big"]
    assert [w.job_id for w in decision.waits] == ["big-later", "small", "unknown"]
    assert {w.reason for w in decision.waits} == {"all 2 slots busy"}


def test_longest_predicted_run_first_then_size_unknown_run_time_first() -> None:
    jobs = [
        job("short-big", seq=0, predicted=20 * GIB, seconds=600),
        job("long-small", seq=1, predicted=2 * GIB, seconds=5400),
        job("never-run", seq=2, predicted=4 * GIB),
        job("mid", seq=3, predicted=9 * GIB, seconds=3600),
        job("mid-bigger", seq=4, predicted=12 * GIB, seconds=3600),
        job("urgent", seq=5, priority=1, seconds=60),
    ]
    assert [j.job_id for j in sorted(jobs, key=job_order)] == [
        "urgent",
        "never-run",
        "long-small",
        "mid-bigger",
        "mid",
        "short-big",
    ]
    decision = assign(jobs, [gpu(0, free=40, total=80)], headroom_frac=0.0)
    assert [p.job_id for p in decision.placements] == ["urgent", "never-run"]


def test_a_task_that_cannot_share_a_card_goes_by_its_queued_time_over_its_cards_when_longer() -> None:
    long = job("long", seq=0, predicted=8 * GIB, seconds=5400)
    solo = replace(job("solo", seq=1, predicted=15 * GIB, seconds=3000), chain_s=7000.0)
    short_chain = replace(job("short-chain", seq=2, predicted=15 * GIB, seconds=3000), chain_s=2000.0)
    assert [j.job_id for j in sorted([long, solo, short_chain], key=job_order)] == [
        "solo",
        "long",
        "short-chain",
    ]


def test_each_placement_updates_the_views() -> None:
    jobs = [job(f"j{i}", seq=i, predicted=12 * GIB, allowed={0: 2, 1: 1}) for i in range(3)]
    decision = assign(jobs, [gpu(0, free=30, total=80), gpu(1, free=20, total=80)], headroom_frac=0.0)
    assert [(p.job_id, p.gpu) for p in decision.placements] == [("j0", 0), ("j1", 1), ("j2", 0)]
    assert decision.placements[2].reason.startswith(
        "GPU 0: the only GPU that fits (18.0 GiB free after 12.0 GiB"
    )
    assert decision.waits == ()


def test_exclusive_placement_closes_the_card_for_the_tick() -> None:
    jobs = [job("alone", seq=0, tier=TIER_D, priority=1), job("other", seq=1)]
    decision = assign(jobs, [gpu(0, free=20)])
    assert [(p.job_id, p.gpu) for p in decision.placements] == [("alone", 0)]
    assert decision.waits[0].reason == "all 2 slots busy (GPU 0 runs an exclusive job)"


def test_a_job_that_fits_nowhere_does_not_block_the_rest() -> None:
    jobs = [job("huge", seq=0, predicted=100 * GIB), job("small", seq=1, predicted=GIB)]
    decision = assign(jobs, [gpu(0, free=20, total=24)])
    assert [p.job_id for p in decision.placements] == ["small"]
    assert decision.waits[0].job_id == "huge"


def test_empty_queue() -> None:
    assert assign([], [gpu(0)]) == Decision()


def test_a_job_moved_down_for_its_share_takes_its_faster_tier_where_it_fills_the_last_slot() -> None:
    """``faster``: a job started a tier down only because its peak is over a slot's share
    takes the faster tier on a card whose other slot runs already, where it fits there."""
    moved = replace(job(tier=TIER_B, predicted=8 * GIB), tiers=(Tier(name="A"), Tier(name="B")))
    moved = replace(moved, faster=((TIER_A, 13 * GIB),))
    half = gpu(0, running=1, free=17, total=24)  # 17 - 2.4 headroom >= 13: A fits beside its mate
    empty = gpu(1, free=24, total=24)
    placed = one(moved, [half, empty], headroom_frac=0.10)
    assert isinstance(placed, Placement) and (placed.gpu, placed.tier) == (0, TIER_A)
    assert placed.reason.startswith("tier A instead of B: it takes GPU 0's last slot; GPU 0:")
    alone = one(moved, [empty], headroom_frac=0.10)  # a card it would share later: its own tier
    assert isinstance(alone, Placement) and (alone.gpu, alone.tier) == (1, TIER_B)
    tight = one(moved, [gpu(0, running=1, free=15, total=24), empty], headroom_frac=0.10)
    assert isinstance(tight, Placement) and (tight.gpu, tight.tier) == (1, TIER_B)  # A does not fit


def test_a_job_over_an_empty_cards_share_leaves_it_to_a_job_that_shares_it() -> None:
    """``alone_on``: a card whose other slot would idle beside a job (15.6 GiB usable with a
    notebook on it, a 13 GiB job) goes first to a job that leaves room; when none does, the
    second pass gives it to the job anyway."""
    notebook = gpu(0, free=18, total=24)  # 18 - 2.4 headroom = 15.6 usable, 7.8 a slot
    big = job("big", seq=1, predicted=13 * GIB, seconds=5400)
    small = job("small", seq=2, predicted=7 * GIB, seconds=2400)
    assert alone_on(big, notebook, 0.10) and not alone_on(small, notebook, 0.10)
    decision = assign([big, small], [notebook], headroom_frac=0.10)
    assert [p.job_id for p in decision.placements] == ["small"]
    assert [w.job_id for w in decision.waits] == ["big"]
    assert decision.waits[0].reason.startswith("GPU 0 has")  # its own tier's why, on every card
    alone = assign([big], [notebook], headroom_frac=0.10)  # nobody shares it: the big job takes it
    assert [(p.job_id, p.gpu) for p in alone.placements] == [("big", 0)]
    assert not alone_on(big, gpu(0, free=18, total=24, running=1), 0.10)  # it fills the last slot
    assert not alone_on(replace(big, allowed={0: 1}), notebook, 0.10)  # a card for one job


def test_a_job_of_a_guessed_peak_does_not_take_a_card_alone_while_a_peak_is_being_learned() -> None:
    """The notebook's card again, and a job whose peak is only the default guess (11 GiB, over
    that card's 7.8 GiB a slot): while another card runs a job it leaves the card empty for a job
    known to share it, and says so; it takes the card once it has waited long (``pack_now``),
    when nothing runs anywhere, once its peak is learned (not ``guessed``), or once the card has
    been empty for ``GUESS_PATIENCE_S``."""
    notebook, busy = gpu(0, free=18, total=24), gpu(1, free=2, total=24, running=2)
    guess = replace(job("guess", predicted=11 * GIB), guessed=True)
    waits = assign([guess], [notebook, busy], headroom_frac=0.10)
    assert not waits.placements
    assert waits.waits[0].reason.endswith(
        "GPU 0 is left to jobs known to share them while its peak is a guess"
    )
    for takes in (
        replace(guess, pack_now=True),
        replace(guess, guessed=False),
    ):
        placed = assign([takes], [notebook, busy], headroom_frac=0.10).placements
        assert [(p.job_id, p.gpu) for p in placed] == [("guess", 0)]
    idle = assign([guess], [notebook, gpu(1, free=2, total=24)], headroom_frac=0.10).placements
    assert [(p.job_id, p.gpu) for p in idle] == [("guess", 0)]  # nothing runs: it is how learning starts
    waited = replace(notebook, empty_s=GUESS_PATIENCE_S)  # empty for 10 min: no sharer came
    late = assign([guess], [waited, busy], headroom_frac=0.10).placements
    assert [(p.job_id, p.gpu) for p in late] == [("guess", 0)]


def test_a_slower_tier_whose_peak_is_a_guess_does_not_take_a_card_alone_while_one_is_learned() -> None:
    """A job that fits no card at its own tier (26 GiB) falls back one tier (a guessed 11 GiB)
    in the second pass, but not onto the notebook's card, which it would take alone there,
    while another card runs jobs: it waits, and says so. It takes the card once it has waited
    long (``pack_now``: then at its turn in the first pass), when nothing runs anywhere, once
    the card has been empty for ``GUESS_PATIENCE_S``, or when its peak there is learned."""
    notebook, busy = gpu(0, free=18, total=24), gpu(1, free=2, total=24, running=2)
    learned = replace(job("big", predicted=26 * GIB), fallback=((TIER_B, 11 * GIB),))
    big = replace(learned, guessed_below=frozenset({TIER_B}))
    waits = assign([big], [notebook, busy], headroom_frac=0.10)
    assert not waits.placements
    assert waits.waits[0].reason.endswith(
        "GPU 0 is left to jobs known to share them while its peak at a slower tier is a guess"
    )
    idle = gpu(1, free=2, total=24)
    waited = replace(notebook, empty_s=GUESS_PATIENCE_S)
    for takes, cards in (
        (replace(big, pack_now=True), [notebook, busy]),
        (big, [notebook, idle]),
        (big, [waited, busy]),
        (learned, [notebook, busy]),
    ):
        placed = assign([takes], cards, headroom_frac=0.10).placements
        assert [(p.job_id, p.gpu, p.tier) for p in placed] == [("big", 0, TIER_B)]
    # a job the rules cannot otherwise tell from the waiting one is not kept waiting for its why
    both = assign([big, replace(learned, job_id="known", seq=1)], [notebook, busy], headroom_frac=0.10)
    assert [(p.job_id, p.gpu) for p in both.placements] == [("known", 0)]


def test_gpu_views_merges_plan_probe_and_occupancy() -> None:
    states = [
        GpuState(index=1, total_mib=24 * GIB, free_mib=20 * GIB, processes=(GpuProcess(pid=1, used_mib=1),)),
        GpuState(index=5, total_mib=80 * GIB, free_mib=80 * GIB),
    ]
    views = gpu_views([1, 0, 1], states, running={1: 2}, exclusive=[0], reserved_mib={1: 512})
    assert views == (
        GpuSlotView(index=0, exclusive_running=True),
        GpuSlotView(index=1, running=2, free_mib=20 * GIB, total_mib=24 * GIB, reserved_mib=512),
    )


# --------------------------------------------------------------------------- properties

HEADROOM = 0.10


@st.composite
def gpu_lists(draw: st.DrawFn) -> list[GpuSlotView]:
    count = draw(st.integers(0, 5))
    views = []
    for index in range(count):
        total = draw(st.none() | st.integers(1, 80 * GIB))
        free = draw(st.none() | st.integers(0, total if total is not None else 80 * GIB))
        running = draw(st.integers(0, 3))
        views.append(
            GpuSlotView(
                index=index,
                running=running,
                exclusive_running=running > 0 and draw(st.booleans()),
                free_mib=free,
                total_mib=total,
                reserved_mib=draw(st.integers(0, 8 * GIB)),
            )
        )
    return views


@st.composite
def job_lists(draw: st.DrawFn) -> list[QueuedJob]:
    count = draw(st.integers(0, 8))
    seqs = draw(st.lists(st.integers(0, 1000), min_size=count, max_size=count, unique=True))
    jobs = []
    for seq in seqs:
        tier = draw(st.integers(0, len(TIERS) - 1))
        slower = range(tier + 1, draw(st.integers(tier + 1, len(TIERS))))  # a ladder's slower tiers
        jobs.append(
            QueuedJob(
                job_id=f"j{seq}",
                seq=seq,
                priority=draw(st.integers(0, 2)),
                tier=tier,
                tiers=TIERS,
                allowed=draw(st.dictionaries(st.integers(0, 5), st.integers(0, 3), max_size=6)),
                predicted_mib=draw(st.none() | st.integers(0, 40 * GIB)),
                avoid_gpu=draw(st.none() | st.integers(0, 5)),
                predicted_s=draw(st.none() | st.floats(0, 1e5)),
                fallback=tuple((t, draw(st.none() | st.integers(0, 40 * GIB))) for t in slower),
                pack_now=draw(st.booleans()),
                faster=tuple(
                    (t, draw(st.none() | st.integers(0, 40 * GIB)))
                    for t in range(draw(st.integers(0, tier)), tier)  # a ladder's faster tiers
                ),
            )
        )
    return jobs


def replay(queued: list[QueuedJob], gpus: list[GpuSlotView], decision: Decision):
    """Yield (job, the card as it was just before that placement) for each placement."""
    by_id = {j.job_id: j for j in queued}
    cards = {g.index: g for g in gpus}
    for placement in decision.placements:
        placed, card = by_id[placement.job_id], cards[placement.gpu]  # type: ignore[index]
        if placement.tier != placed.tier:  # a slower or faster tier: placed with that prediction
            other = dict(placed.fallback) if placement.tier > placed.tier else dict(placed.faster)
            assert placement.tier in other
            if placement.tier < placed.tier:  # a faster tier only fills a card's last slot
                assert card.running + 1 == placed.allowed.get(card.index, 0)
            placed = replace(placed, tier=placement.tier, predicted_mib=other[placement.tier])
        yield placed, card
        cards[card.index] = GpuSlotView(
            index=card.index,
            running=card.running + 1,
            exclusive_running=card.exclusive_running or TIERS[placed.tier].exclusive,
            free_mib=card.free_mib,
            total_mib=card.total_mib,
            reserved_mib=card.reserved_mib + (placed.predicted_mib or 0),
        )


@settings(max_examples=150, deadline=None)
@given(job_lists(), gpu_lists())
def test_every_job_is_placed_or_waits_once_with_a_reason(queued: list[QueuedJob], gpus: list[GpuSlotView]):
    decision = assign(queued, gpus, headroom_frac=HEADROOM)
    seen = Counter([p.job_id for p in decision.placements] + [w.job_id for w in decision.waits])
    assert seen == Counter(j.job_id for j in queued)
    assert all(p.reason for p in decision.placements) and all(w.reason for w in decision.waits)


@settings(max_examples=150, deadline=None)
@given(job_lists(), gpu_lists())
def test_the_jobs_left_waiting_come_in_the_queue_s_order(queued: list[QueuedJob], gpus: list[GpuSlotView]):
    """The scheduler's holds and its count of overtaken jobs read the waits in this order
    instead of sorting them again every tick."""
    by_id = {j.job_id: j for j in queued}
    waits = [by_id[w.job_id] for w in assign(queued, gpus, headroom_frac=HEADROOM).waits]
    assert waits == sorted(waits, key=job_order)


@settings(max_examples=150, deadline=None)
@given(job_lists(), gpu_lists())
def test_never_exceeds_a_slot_cap(queued: list[QueuedJob], gpus: list[GpuSlotView]):
    for placed, card in replay(queued, gpus, assign(queued, gpus, headroom_frac=HEADROOM)):
        assert card.running < placed.allowed.get(card.index, 0)


@settings(max_examples=150, deadline=None)
@given(job_lists(), gpu_lists())
def test_never_places_beyond_free_memory(queued: list[QueuedJob], gpus: list[GpuSlotView]):
    for placed, card in replay(queued, gpus, assign(queued, gpus, headroom_frac=HEADROOM)):
        if card.free_mib is None:
            continue
        usable = card.free_mib - card.reserved_mib
        if placed.predicted_mib is not None:
            assert usable - headroom_mib(card, HEADROOM) >= placed.predicted_mib
        minimum = TIERS[placed.tier].min_free_mib
        if minimum is not None:
            assert usable >= minimum


@settings(max_examples=150, deadline=None)
@given(job_lists(), gpu_lists())
def test_exclusive_is_respected(queued: list[QueuedJob], gpus: list[GpuSlotView]):
    for placed, card in replay(queued, gpus, assign(queued, gpus, headroom_frac=HEADROOM)):
        assert not card.exclusive_running
        if TIERS[placed.tier].exclusive:
            assert card.running == 0


@settings(max_examples=150, deadline=None)
@given(job_lists(), gpu_lists())
@example(  # 2,1: the 1-slot card, where the most free memory and the lowest index say card 0
    [job("x", tier=TIER_D, allowed={0: 2, 1: 1}, predicted=GIB)],
    [gpu(0, free=24, total=24), gpu(1, free=20, total=24)],
)
def test_an_exclusive_job_takes_the_card_with_fewest_slots(queued: list[QueuedJob], gpus: list[GpuSlotView]):
    """At an exclusive tier with a learned peak, no card it could have taken at its turn has
    fewer slots in its plan than the one it got: it idles them all. (Not its avoided card, nor
    one it would take alone, which the first pass keeps from a job.)"""
    views = {g.index: g for g in gpus}
    for placed, card in replay(queued, gpus, assign(queued, gpus, headroom_frac=HEADROOM)):
        if TIERS[placed.tier].exclusive and placed.predicted_mib is not None:
            takes = [
                g
                for g in views.values()
                if g.index != placed.avoid_gpu
                and veto(placed, g, HEADROOM) is None
                and not alone_on(placed, g, HEADROOM)
            ]
            assert all(placed.allowed[card.index] <= placed.allowed[g.index] for g in takes), placed.job_id
        views[card.index] = occupy(card, placed)


@settings(max_examples=150, deadline=None)
@given(job_lists(), gpu_lists())
@example(  # a starved head whose own tier would take card 0 alone, falling back to an exclusive tier
    [
        replace(
            job("j0", allowed={1: 1, 0: 2}, predicted=0),
            fallback=((TIER_B, None), (TIER_D, None)),
            pack_now=True,
        )
    ],
    [GpuSlotView(index=0, free_mib=0, reserved_mib=1), GpuSlotView(index=1, free_mib=0, reserved_mib=1)],
)
def test_head_job_is_placed_when_it_fits_anywhere(queued: list[QueuedJob], gpus: list[GpuSlotView]):
    """No starvation of the head job: whatever comes after it, it goes first, at its own tier on
    the cards it would not take alone there (``alone_on``; those go to it in the second pass if no
    job after it shares them), or, once starved (``pack_now``) and kept off every card by memory
    at its own tier, at the first of its slower tiers that fits any card. Its other slower tiers
    only take what the jobs after it leave."""
    if not queued:
        return
    head = min(queued, key=job_order)
    shared = [g for g in gpus if not alone_on(head, g, HEADROOM)]  # it leaves those to others first
    fits_alone = assign([replace(head, fallback=())], shared, headroom_frac=HEADROOM).placements
    if not fits_alone and head.pack_now:  # (a placement at its own tier now is the second pass's)
        alone = assign([head], gpus, headroom_frac=HEADROOM).placements
        fits_alone = tuple(p for p in alone if p.tier != head.tier)
    decision = assign(queued, gpus, headroom_frac=HEADROOM)
    placed = [p for p in decision.placements if p.job_id == head.job_id]
    if fits_alone:
        # Same job, card and tier; the reason may differ, since it names the cards it was chosen
        # among ("the only GPU that fits" alone vs "lowest index among equals" with the rest).
        first, alone = decision.placements[0], fits_alone[0]
        assert (first.job_id, first.gpu, first.tier) == (alone.job_id, alone.gpu, alone.tier)
    elif len(shared) == len(gpus):
        assert not placed or (placed[0].tier != head.tier and not head.pack_now)


@settings(max_examples=150, deadline=None)
@given(job_lists(), gpu_lists())
def test_a_free_slot_without_memory_info_is_used(queued: list[QueuedJob], gpus: list[GpuSlotView]):
    """With no memory information, a card with a free slot that some plain-tier job may use
    always gets at least one job."""
    blind = [
        GpuSlotView(index=g.index, running=g.running, exclusive_running=g.exclusive_running) for g in gpus
    ]
    usable = any(
        not g.exclusive_running and g.running < j.allowed.get(g.index, 0) and not TIERS[j.tier].exclusive
        for g in blind
        for j in queued
    )
    if usable:
        assert assign(queued, blind, headroom_frac=HEADROOM).placements


@settings(max_examples=100, deadline=None)
@given(job_lists(), gpu_lists(), st.randoms())
def test_input_order_does_not_matter(queued: list[QueuedJob], gpus: list[GpuSlotView], rnd) -> None:
    shuffled_jobs, shuffled_gpus = list(queued), list(gpus)
    rnd.shuffle(shuffled_jobs)
    rnd.shuffle(shuffled_gpus)
    assert assign(shuffled_jobs, shuffled_gpus) == assign(queued, gpus)
