"""The pure memory decisions (gpusched.memory): attribution of GPU processes, reservations,
the tier ladder learned across tasks, start safer, pack down, holds, never deadlock, host RAM."""

from __future__ import annotations

import math
import time

import pytest
from msgspec.structs import replace

from gpusched import memory, memwatch
from gpusched.memory import Holding, HostLimit, HostMemory, Tree
from gpusched.model import GpuProcess, GpuState, Outcome, Tier
from gpusched.placement import GpuSlotView, QueuedJob, assign
from gpusched.predict import PeakSample, Prediction

GIB = 1024
TIERS = (Tier(name="A"), Tier(name="B"), Tier(name="C"), Tier(name="D", exclusive=True))


def card(
    index: int, used: float = 0, total: float = 24, procs: tuple[tuple[int, float], ...] = ()
) -> GpuState:
    return GpuState(
        index=index,
        total_mib=int(total * GIB),
        used_mib=int(used * GIB),
        free_mib=int((total - used) * GIB),
        processes=tuple(GpuProcess(pid=p, used_mib=int(m * GIB)) for p, m in procs),
    )


def view(
    index: int, free: float = 24, running: int = 0, total: float = 24, reserved: float = 0
) -> GpuSlotView:
    return GpuSlotView(
        index=index,
        running=running,
        free_mib=int(free * GIB),
        total_mib=int(total * GIB),
        reserved_mib=int(reserved * GIB),
    )


def job(
    pred: float | None, tier: int = 0, allowed: dict[int, int] | None = None, name: str = "j"
) -> QueuedJob:
    return QueuedJob(
        job_id=name,
        seq=1,
        tier=tier,
        tiers=TIERS,
        allowed=allowed or {0: 2, 1: 2},
        predicted_mib=None if pred is None else int(pred * GIB),
    )


# --------------------------------------------------------------------------- attribution


def test_a_jobs_whole_process_tree_is_ours_not_only_its_wrapper() -> None:
    # wrapper 100 -> python 101 -> dataloader 102 (which touched CUDA); 555 is someone else's
    gpus = [card(0, used=15, procs=((101, 9), (102, 1), (555, 5)))]
    att = memory.attribute(gpus, [Tree(attempt_id=1, job_id="E1/a", gpu=0, pids=frozenset({100, 101, 102}))])
    assert att.usage[1].used_mib == 10 * GIB  # summed over its tree on its card
    assert att.owner(0, 101) is not None and att.owner(0, 102).job_id == "E1/a"  # type: ignore[union-attr]
    assert att.owner(0, 555) is None
    assert att.outside_mib == {0: 5 * GIB} and att.ours_mib == {0: 10 * GIB}


def test_a_process_on_a_card_the_job_was_not_given_is_reported_elsewhere() -> None:
    gpus = [card(0), card(1, used=4, procs=((101, 4),))]
    att = memory.attribute(gpus, [Tree(attempt_id=1, job_id="E1/a", gpu=0, pids=frozenset({100, 101}))])
    assert att.usage[1].elsewhere == ((1, 101),)
    assert att.usage[1].used_mib is None  # nothing of it on its own card


def test_a_card_where_our_job_shows_no_process_counts_no_outside_memory() -> None:
    # our pids are invisible (container) or the job has not touched the GPU yet: the listed
    # process is probably ours, and calling it an outsider would make its card look full
    gpus = [card(0, used=9, procs=((7777, 9),)), card(1, used=6, procs=((8888, 6),))]
    att = memory.attribute(gpus, [Tree(attempt_id=1, job_id="E1/a", gpu=0, pids=frozenset({100}))])
    assert att.outside_mib == {1: 6 * GIB}


# --------------------------------------------------------------------------- reservations


@pytest.mark.parametrize(
    ("holding", "reserved"),
    [
        (Holding(predicted_mib=10 * GIB, learned=False, used_mib=None, ramping=True), 10 * GIB),
        (Holding(predicted_mib=10 * GIB, learned=False, used_mib=4 * GIB, ramping=True), 6 * GIB),
        (
            Holding(predicted_mib=10 * GIB, learned=False, used_mib=4 * GIB, ramping=False),
            0,
        ),  # a default is a guess
        (
            Holding(predicted_mib=10 * GIB, learned=True, used_mib=8 * GIB, ramping=False),
            2 * GIB,
        ),  # will grow back
        (Holding(predicted_mib=10 * GIB, learned=True, used_mib=None, ramping=False), 0),
        (Holding(predicted_mib=10 * GIB, learned=True, used_mib=12 * GIB, ramping=True), 0),
        (Holding(predicted_mib=None, learned=False, used_mib=None, ramping=True), 0),
        (  # a guess, settled at 12 GiB, where jobs have been seen to grow by 1/4 after settling
            Holding(
                predicted_mib=10 * GIB, learned=False, used_mib=12 * GIB, ramping=False, grows_to_mib=15 * GIB
            ),
            3 * GIB,
        ),
        (  # ... and once it has grown so
            Holding(
                predicted_mib=10 * GIB, learned=False, used_mib=15 * GIB, ramping=False, grows_to_mib=15 * GIB
            ),
            0,
        ),
        (  # a learned peak is what it will come back to, whatever others grew by
            Holding(
                predicted_mib=13 * GIB, learned=True, used_mib=12 * GIB, ramping=False, grows_to_mib=15 * GIB
            ),
            GIB,
        ),
    ],
)
def test_reservation_is_the_rest_of_the_predicted_peak_while_it_can_still_come(
    holding: Holding, reserved: int
) -> None:
    assert memory.reserved_mib(holding) == reserved


def test_ramping_restarts_when_usage_grows() -> None:
    assert memory.is_ramping(100, launched_at=50, last_growth_at=None, ramp_s=60)
    assert not memory.is_ramping(200, launched_at=50, last_growth_at=None, ramp_s=60)
    assert memory.is_ramping(200, launched_at=50, last_growth_at=180, ramp_s=60)


# --------------------------------------------------------------------------- the ladder


def sample(task: str, tier: int, peak: float, outcome: Outcome = Outcome.OK, job_id: str = "x") -> PeakSample:
    return PeakSample(job_id=job_id, task=task, tier=tier, peak_mib=int(peak * GIB), outcome=outcome)


def test_ladder_points_are_each_tasks_ratio_between_two_tiers_at_most_one() -> None:
    points = memory.ladder_points(
        [
            sample("qnli", 0, 14),
            sample("qnli", 1, 9),
            sample("mnli", 0, 12),
            sample("mnli", 1, 9),
            sample("boolq", 0, 22, Outcome.OOM),
            sample("boolq", 1, 15),
            sample("rte", 1, 8),
            sample("rte", 2, 9),
        ],
        tiers=4,
    )
    assert points[1] == (  # smallest peak first; boolq's from its OOM's peak (a lower bound)
        (12 * GIB, pytest.approx(0.75)),
        (14 * GIB, pytest.approx(9 / 14)),
        (22 * GIB, pytest.approx(15 / 22)),
    )
    assert points[2] == ((8 * GIB, 1.0),)  # capped: a more conservative tier never needs more


def test_fill_ladder_scales_a_learned_peak_down_and_otherwise_only_caps_the_guess() -> None:
    preds = [
        Prediction(mib=14 * GIB, source="task"),
        Prediction(mib=11 * GIB, source="default"),
        Prediction(mib=11 * GIB, source="default"),
    ]
    scaled = memory.fill_ladder(preds, {1: ((14 * GIB, 0.6),)})
    assert scaled[1] == Prediction(mib=int(14 * GIB * 0.6) + 1, source="ladder")
    assert scaled[2].source == "default" and scaled[2].mib == scaled[1].mib  # capped, still a guess
    small = [Prediction(mib=6 * GIB, source="task"), Prediction(mib=11 * GIB, source="default")]
    assert memory.fill_ladder(small, {}) == [small[0], Prediction(mib=6 * GIB, source="default")]


def test_ladder_ratio_is_that_of_the_task_of_the_nearest_smaller_peak() -> None:
    """A tier cuts activations, not weights: a big task's peak shrinks by more than a small
    one's, so a big task is scaled by the nearest smaller task's ratio, not the largest."""
    points = memory.ladder_points(
        [
            sample("sst2", 0, 7),
            sample("sst2", 1, 5.6),  # 0.8
            sample("mnli", 0, 13),
            sample("mnli", 1, 8.45),  # 0.65
            sample("boolq", 0, 19, Outcome.OOM),
            sample("boolq", 1, 15.2),  # 0.8, from an OOM's lower bound
        ],
        tiers=4,
    )
    assert [lo for lo, _ in points[1]] == [7 * GIB, 13 * GIB, 19 * GIB]  # smallest peak first
    assert memory.ladder_ratio(points[1], int(14.5 * GIB)) == pytest.approx(0.65, abs=1e-3)  # qnli: mnli's
    assert memory.ladder_ratio(points[1], 10 * GIB) == pytest.approx(0.8, abs=1e-3)  # sst2's
    assert memory.ladder_ratio(points[1], 6 * GIB) == pytest.approx(0.8, abs=1e-3)  # below all: the largest
    assert memory.ladder_ratio(points[1], 20 * GIB) == pytest.approx(0.8, abs=1e-3)  # boolq's
    assert memory.ladder_ratio((), 10 * GIB) is None
    preds = [Prediction(mib=int(14.5 * GIB), source="task"), Prediction(mib=11 * GIB, source="default")]
    filled = memory.fill_ladder(preds, points)
    assert filled[1] == Prediction(mib=math.ceil(int(14.5 * GIB) * points[1][1][1]), source="ladder")
    assert memory.ladder_points([sample("cola", 0, 6)], tiers=4) == {}  # one tier only: no ratio


def test_below_a_whole_card_stand_in_the_ladder_scales_the_ooms_peak() -> None:
    """After an OOM at A the prediction there is a whole card (no peak): B is guessed from the
    peak the OOM measured, by the largest ratio, not from the whole card."""
    samples = [sample("mnli", 0, 11, Outcome.OOM), sample("mnli", 0, 9.5, Outcome.OOM), sample("sst2", 1, 5)]
    floors = memory.oom_floors(samples, "mnli", 4)
    assert floors == [11 * GIB, None, None, None]
    points = {1: ((7 * GIB, 0.8), (13 * GIB, 0.65))}
    whole = int(21.6 * GIB)
    preds = [Prediction(mib=whole, source="task"), Prediction(mib=10 * GIB, source="default")]
    filled = memory.fill_ladder(preds, points, whole_mib=whole, floors=floors)
    assert filled[1] == Prediction(mib=math.ceil(11 * GIB * 0.8), source="ladder")
    stand_in = memory.fill_ladder(preds, points)  # without the floors: the whole card scaled
    assert stand_in[1] == Prediction(mib=math.ceil(whole * 0.65), source="ladder")


def test_faster_tiers_are_the_learned_ones_between_a_jobs_own_tier_and_its_start() -> None:
    preds = (
        Prediction(mib=13 * GIB, source="task"),
        Prediction(mib=9 * GIB, source="ladder"),
        Prediction(mib=7 * GIB, source="task"),
        Prediction(mib=5 * GIB, source="ladder"),
    )
    assert memwatch.faster_tiers(preds, 0, 2, TIERS) == ((0, 13 * GIB), (1, 9 * GIB))
    assert memwatch.faster_tiers(preds, 1, 2, TIERS) == ((1, 9 * GIB),)
    assert memwatch.faster_tiers(preds, 2, 2, TIERS) == ()  # starts at its own tier
    guessed = (Prediction(mib=10 * GIB, source="default"), *preds[1:])
    assert memwatch.faster_tiers(guessed, 0, 2, TIERS) == ((1, 9 * GIB),)  # a default is no peak


# --------------------------------------------------------------------------- start safer


def test_a_tier_that_fits_a_card_stays() -> None:
    assert memory.start_tier([20 * GIB, 12 * GIB, 9 * GIB, 5 * GIB], 0, "ABCD", 21 * GIB) == memory.Start(
        tier=0, predicted_mib=20 * GIB
    )


def test_a_peak_that_fits_no_card_even_empty_starts_at_the_first_tier_that_does() -> None:
    start = memory.start_tier([26 * GIB, 23 * GIB, 15 * GIB, 8 * GIB], 0, "ABCD", 21 * GIB)
    assert (start.tier, start.predicted_mib) == (2, 15 * GIB)
    assert start.note and "tier C instead of A" in start.note and "fits no GPU even when empty" in start.note


def test_when_no_tier_fits_it_runs_at_the_last_one_alone_on_the_roomiest_card() -> None:
    start = memory.start_tier([40 * GIB, 35 * GIB, 30 * GIB, 25 * GIB], 1, "ABCD", 21 * GIB)
    assert (start.tier, start.predicted_mib) == (3, 21 * GIB)
    assert start.note and "most conservative tier D" in start.note


def test_a_learned_peak_over_a_slots_share_starts_one_tier_down_when_that_is_learned_too() -> None:
    preds = [14 * GIB, 9 * GIB, 7 * GIB, 5 * GIB]
    start = memory.start_tier(
        preds,
        0,
        "ABCD",
        21 * GIB,
        share_mib=10 * GIB,
        learned=[True, True, False, False],
        exclusive=[False, False, False, True],
    )
    assert start.tier == 1 and "share" in (start.note or "")
    # a guess at B is no reason to slow the job down
    guess = memory.start_tier(
        preds, 0, "ABCD", 21 * GIB, share_mib=10 * GIB, learned=[True, False, False, False]
    )
    assert guess.tier == 0


# --------------------------------------------------------------------------- pack down, holds, unstick


def falls(j: QueuedJob, *peaks: float, now: bool = False) -> QueuedJob:
    """``j`` with slower tiers B, C, ... at these peaks (GiB) to fall back to."""
    lower = tuple((j.tier + 1 + i, int(p * GIB)) for i, p in enumerate(peaks))
    return replace(j, fallback=lower, pack_now=now)


def test_a_job_memory_keeps_out_starts_one_tier_down_where_that_fits_now() -> None:
    views = [view(0, free=12, running=1), view(1, free=11, running=1)]
    d = assign([falls(job(14), 9, 6)], views, headroom_frac=0.1)
    assert [(p.job_id, p.tier, p.gpu) for p in d.placements] == [("j", 1, 0)]
    assert d.placements[0].reason.startswith("tier B instead of A: ~14.0 GiB at A fits no GPU now, ~9.0 GiB")
    # the second pass goes one tier down only: C would fit, B does not
    d = assign([falls(job(14), 11, 6)], views, headroom_frac=0.1)
    assert not d.placements and d.waits[0].reason.startswith("GPU 0 has 12.0 GiB free, needs 14.0 GiB")


def test_a_slower_tier_only_takes_room_no_job_can_use_at_its_own() -> None:
    views = [view(0, free=12, running=1)]
    long = replace(falls(job(14, name="long"), 9), predicted_s=7200.0)
    short = replace(job(8, name="short"), predicted_s=600.0)
    d = assign([long, short], views, headroom_frac=0.1)
    assert [(p.job_id, p.tier) for p in d.placements] == [("short", 0)]  # at its own tier first
    assert [w.job_id for w in d.waits] == ["long"]
    d = assign([long], views, headroom_frac=0.1)
    assert [(p.job_id, p.tier) for p in d.placements] == [("long", 1)]


def test_a_starved_job_takes_its_first_slower_tier_that_fits_at_its_turn() -> None:
    views = [view(0, free=12, running=1)]
    starved = replace(falls(job(14, name="starved"), 11, 6, now=True), predicted_s=7200.0)
    short = replace(job(8, name="short"), predicted_s=600.0)
    d = assign([starved, short], views, headroom_frac=0.1)
    assert [(p.job_id, p.tier) for p in d.placements] == [("starved", 2)]  # C: B does not fit either
    assert "tier C instead of A" in d.placements[0].reason


def test_pack_gives_every_job_its_slower_tiers_and_the_starved_ones_at_once() -> None:
    preds = tuple(Prediction(mib=m * GIB, source="task") for m in (14, 9, 6, 4))
    one = {0: 2}  # more jobs than cards: not the last wave (see the test after the next)
    d = memwatch.Demand(view=job(14, allowed=one), predictions=preds)
    out = memwatch.pack(
        {"j": d, "k": replace(d, view=job(14, allowed=one, name="k"))}, {"j": 0.0, "k": 900.0}, after_s=600
    )
    assert out["j"].view.fallback == ((1, 9 * GIB), (2, 6 * GIB))  # D is exclusive: left out
    assert not out["j"].view.pack_now and out["k"].view.pack_now


def test_pack_keeps_a_view_that_already_has_its_fallbacks_and_is_not_starved() -> None:
    """demands() gives each view its slower tiers, so a full queue that nothing starves costs
    pack() no replace() per job (it was ~800 a tick at 1,000 queued)."""
    preds = tuple(Prediction(mib=m * GIB, source="task") for m in (14, 9, 6, 4))
    ready = replace(job(14), fallback=memwatch.slower_tiers(preds, 0, TIERS))
    d, k = (
        memwatch.Demand(view=ready, predictions=preds),
        memwatch.Demand(view=job(14, name="k"), predictions=preds),
    )
    out = memwatch.pack({"j": d, "k": k, "s": d}, {"s": 900.0}, after_s=600)
    assert out["j"] is d  # kept, not rebuilt
    assert out["k"].view.fallback == ready.fallback and not out["k"].view.pack_now  # filled in
    assert out["s"].view.pack_now and out["s"].view.fallback == ready.fallback  # starved: rebuilt


def test_the_last_wave_falls_back_to_no_slower_tier() -> None:
    """No more jobs waiting than cards they may use: each gets a slot at its own tier once a run
    beside it ends, and a slower tier would only end the night later (seed 11 of
    benchmarks/placement.py ran its last rte at C beside rte)."""
    preds = tuple(Prediction(mib=m * GIB, source="task") for m in (14, 9, 6, 4))
    d = memwatch.Demand(view=job(14), predictions=preds)  # may use cards 0 and 1
    last = {"j": d, "k": replace(d, view=job(14, name="k"))}
    assert memwatch.last_wave(last)
    out = memwatch.pack(last, {"j": 0.0, "k": 900.0}, after_s=600)
    assert all(o.view.fallback == () and not o.view.pack_now for o in out.values())
    more = {**last, "m": replace(d, view=job(14, name="m"))}  # three jobs, two cards
    assert not memwatch.last_wave(more)
    assert memwatch.pack(more, {}, after_s=600)["j"].view.fallback == ((1, 9 * GIB), (2, 6 * GIB))


def test_a_hold_goes_to_a_card_the_job_would_not_take_alone() -> None:
    """Of two cards it fits emptied, a starved job is kept one where it leaves a slot's share
    beside it, not the one with someone's notebook on it (15.6 GiB usable, 7.8 a slot), where
    its card-mate's slot would idle for its whole run."""
    views = [view(0, free=10, running=1), view(1, free=12, running=1)]
    room = {0: 21 * GIB, 1: 15 * GIB}  # card 1: an outsider's 6 GiB
    big = job(10, name="big")

    def holds(v: list[GpuSlotView]) -> dict[int, str]:
        return memory.choose_holds(
            [(big, 3600)], v, room, current={}, hold_after_s=1800, max_holds=1, headroom_frac=0.1
        )

    assert holds(views) == {0: "big"}  # card 1 has more free now, but big would take it alone
    assert holds([views[1]]) == {1: "big"}  # still held when it is the only card


def test_a_job_over_every_card_s_share_is_kept_the_card_that_leaves_most_beside_it() -> None:
    """A 13 GiB job takes more than a slot's share of every card. The card with someone's
    notebook (16 GiB of room) runs one of our jobs, a full card (22 GiB) two: fewer to wait
    for, but beside the job there it leaves 3 GiB, where nothing runs, and 9 on the other."""
    views = [view(0, free=2, running=2), view(1, free=3, running=1)]
    room = {0: 22 * GIB, 1: 16 * GIB}
    holds = memory.choose_holds(
        [(job(13, name="big"), 3600)],
        views,
        room,
        current={},
        hold_after_s=1800,
        max_holds=1,
        headroom_frac=0.1,
    )
    assert holds == {0: "big"}


def test_a_card_drained_for_an_exclusive_job_is_the_one_with_fewest_slots() -> None:
    """At tier D (alone on its card) a job idles every slot of the card it gets. On a 2,1 plan
    with one of our jobs on each card, draining the 1-slot card idles nothing more, where the
    2-slot card, with more free memory now, would idle a slot for the job's whole run. Not so
    for a peak that is only a guess, as placement does not."""
    views = [view(0, free=12, running=1), view(1, free=8, running=1)]
    room = {0: 21 * GIB, 1: 21 * GIB}

    def holds(j: QueuedJob) -> dict[int, str]:
        return memory.choose_holds(
            [(j, 3600)], views, room, current={}, hold_after_s=1800, max_holds=1, headroom_frac=0.1
        )

    assert holds(job(10, tier=3, allowed={0: 2, 1: 1}, name="alone")) == {1: "alone"}
    assert holds(job(10, tier=2, allowed={0: 2, 1: 1}, name="shares")) == {0: "shares"}  # not exclusive
    assert holds(job(10, tier=3, allowed={0: 1, 1: 1}, name="alone")) == {0: "alone"}  # equal: as before
    guess = replace(job(10, tier=3, allowed={0: 2, 1: 1}, name="guess"), guessed=True)
    assert holds(guess) == {0: "guess"}  # a guessed peak: the most room, as placement keeps it


def test_a_job_memory_kept_waiting_long_gets_a_card_kept_free_and_nothing_else_lands_there() -> None:
    views = [view(0, free=10, running=1), view(1, free=2, running=1)]
    big, small = job(16, name="big"), job(4, name="small")
    room = {0: 21 * GIB, 1: 21 * GIB}
    assert (
        memory.choose_holds(
            [(big, 60)], views, room, current={}, hold_after_s=300, max_holds=1, headroom_frac=0.1
        )
        == {}
    )
    holds = memory.choose_holds(
        [(big, 600)], views, room, current={}, hold_after_s=300, max_holds=1, headroom_frac=0.1
    )
    assert holds == {0: "big"}
    decision = assign(
        [small], list(memory.held_views({v.index: v for v in views}, holds).values()), headroom_frac=0.1
    )
    assert not decision.placements and "kept free for big" in decision.waits[0].reason
    # kept while the job waits, dropped once it is placed (no longer waiting)
    assert (
        memory.choose_holds(
            [(big, 700)], views, room, current=holds, hold_after_s=300, max_holds=1, headroom_frac=0.1
        )
        == holds
    )
    assert (
        memory.choose_holds([], views, room, current=holds, hold_after_s=300, max_holds=1, headroom_frac=0.1)
        == {}
    )


def test_no_card_is_kept_free_for_a_job_that_a_slower_tier_lets_onto_one() -> None:
    """Starved, it takes that tier at its turn; a card drained for its faster tier would idle
    meanwhile. A job with no such tier still gets its card."""
    views = [view(0, free=10, running=1), view(1, free=9, running=1)]
    room = {0: 21 * GIB, 1: 21 * GIB}

    def holds(j: QueuedJob) -> dict[int, str]:
        return memory.choose_holds(
            [(j, 3600)], views, room, current={}, hold_after_s=1800, max_holds=1, headroom_frac=0.1
        )

    assert holds(falls(job(16, name="big"), 6, now=True)) == {}  # 6 GiB at B fits card 0 now
    assert holds(falls(job(16, name="big"), 12, now=True)) == {0: "big"}  # B does not fit either
    assert holds(job(16, name="big")) == {0: "big"}


def test_a_task_two_of_whose_jobs_fit_no_card_gets_its_queued_time_over_its_cards() -> None:
    from types import SimpleNamespace

    preds = (Prediction(mib=15 * GIB, source="task"),)
    cards = {"s": memwatch._Cards(allowed={0: 2, 1: 2, 2: 0}, best=21 * GIB, share=10 * GIB)}

    def demand(name: str, task: str, mib: float, seconds: float) -> memwatch.Demand:
        v = replace(job(mib, name=name), predicted_s=seconds)
        return memwatch.Demand(view=v, predictions=preds)

    specs = [("b1", "boolq", 15, 3000), ("b2", "boolq", 15, 3000), ("b3", "boolq", 15, 3000)]
    specs += [("m1", "mnli", 8, 5400), ("m2", "mnli", 8, 5400), ("m3", "mnli", 8, 5400)]
    out = {n: demand(n, t, m, s) for n, t, m, s in specs}
    jobs = [SimpleNamespace(id=n, suite="s", task=t) for n, t, _, _ in specs]
    chained = memwatch._chains(dict(out), jobs, cards)  # type: ignore[arg-type]
    assert [chained[n].view.chain_s for n in ("b1", "b2", "b3")] == [4500.0] * 3  # 9000 s over 2 cards
    assert all(chained[n] is out[n] for n in ("m1", "m2", "m3"))  # two fit a card: no chain
    few = memwatch._chains({"b1": out["b1"]}, jobs[:1], cards)  # type: ignore[arg-type]
    assert few["b1"].view.chain_s is None  # 3000 s over 2 cards: its own run is longer
    single = {"s": memwatch._Cards(allowed={0: 1, 1: 1}, best=21 * GIB, share=None)}
    alone = memwatch._chains(dict(out), jobs, single)  # type: ignore[arg-type]
    assert all(alone[n] is out[n] for n in out)  # one job per card anyway: nothing to order by


def test_unstick_runs_a_job_that_fits_no_empty_card_at_its_last_tier_at_once() -> None:
    views = [view(0, free=20), view(1, free=20)]  # nothing of ours runs
    placed = memory.unstick([job(30, name="j1")], views, headroom_frac=0.1)
    assert placed is not None and placed.tier == 3 and placed.gpu == 0
    assert "nothing runs and nothing fits" in placed.reason and "tier D" in placed.reason
    assert memory.unstick([job(4)], views, headroom_frac=0.1) is None  # it fits: not stuck


def test_unstick_waits_for_other_peoples_memory_for_a_while_first() -> None:
    views = [view(0, free=8), view(1, free=6)]  # outsiders hold the rest
    assert (
        memory.unstick([job(14, name="j")], views, headroom_frac=0.1, waited={"j": 600}, patience_s=3600)
        is None
    )
    placed = memory.unstick(
        [job(14, name="j")], views, headroom_frac=0.1, waited={"j": 3600}, patience_s=3600
    )
    assert placed is not None and placed.tier == 3 and "waited 60 min for memory others hold" in placed.reason


def test_unstick_starts_a_job_whose_peak_is_only_a_guess_at_once_at_its_own_tier_to_measure_it() -> None:
    # found on a real H200: someone's process held 105 of 140 GiB, the default guess for a plan of
    # 4 was 31.3 GiB, the jobs needed 8: they waited for the hour the unstick patience gives
    views = [view(0, free=10, total=24), view(1, free=12, total=24)]  # 9.6 GiB left under headroom on 1
    guess = replace(job(14, name="g"), guessed=True, unmeasured=True)
    placed = memory.unstick([guess], views, headroom_frac=0.1, waited={"g": 0}, patience_s=3600)
    assert placed is not None and (placed.gpu, placed.tier) == (1, 0)  # the roomiest card, tier A
    assert "only a guess" in placed.reason and "started alone at tier A to measure its peak" in placed.reason
    learned = job(14, name="g")  # the same figure, measured: others' memory is waited for, as before
    assert memory.unstick([learned], views, headroom_frac=0.1, waited={"g": 0}, patience_s=3600) is None
    tight = [view(0, free=8, total=24), view(1, free=9, total=24)]  # 6.6 GiB left: under half the guess
    assert memory.unstick([guess], tight, headroom_frac=0.1, waited={"g": 0}, patience_s=3600) is None
    later = memory.unstick([guess], tight, headroom_frac=0.1, waited={"g": 3600}, patience_s=3600)
    assert later is not None and later.tier == 3  # then the last tier, after the patience, as before
    huge = replace(
        job(30, name="h"), guessed=True, unmeasured=True
    )  # fits no card even empty: the last tier at once
    forced = memory.unstick([huge], views, headroom_frac=0.1)
    assert forced is not None and forced.tier == 3


# --------------------------------------------------------------------------- host RAM


def test_host_minimum_is_the_smaller_of_the_fixed_figure_and_the_share() -> None:
    assert memory.host_min_mib(256 * GIB, HostLimit()) == 4 * GIB
    assert memory.host_min_mib(16 * GIB, HostLimit()) == int(1.6 * GIB)
    assert memory.host_min_mib(16 * GIB, HostLimit(min_mib=0, min_frac=0)) == 0


def test_launches_wait_while_host_ram_is_low_and_after_a_host_oom_until_it_recovers() -> None:
    limit = HostLimit(min_mib=4 * GIB, min_frac=0.10, recover_factor=2, hold_s=30)
    low, ok, plenty = (HostMemory(available_mib=m * GIB, total_mib=256 * GIB) for m in (3, 6, 20))
    assert "host RAM low: 3.0 GiB available" in (memory.host_wait(low, limit, oom_hold=None, now=0) or "")
    assert memory.host_wait(ok, limit, oom_hold=None, now=0) is None
    hold = (100.0, "E1/a")
    assert "host OOM of E1/a" in (memory.host_wait(ok, limit, oom_hold=hold, now=200) or "")  # 6 < 2 x 4
    held = memory.host_wait(ok, limit, oom_hold=hold, now=200) or ""
    assert "waiting for host RAM to recover (6.0 GiB available, needs 8.0 GiB)" in held
    # RAM is back but the OOM is too recent: the line says when launches resume, not "waiting for RAM"
    clock = time.strftime("%H:%M:%S", time.localtime(130.0))
    soon = memory.host_wait(plenty, limit, oom_hold=hold, now=110) or ""
    assert soon.endswith(f"resume at {clock} while host RAM stays at 8.0 GiB or more (20.0 GiB available)")
    assert memory.host_wait(plenty, limit, oom_hold=hold, now=131) is None
    assert memory.host_recovered(plenty, limit, 100.0, 200.0)


@pytest.mark.parametrize(
    ("text", "limit"),
    [
        ("4GiB", HostLimit(min_mib=4 * GIB, min_frac=0)),
        ("10%", HostLimit(min_mib=0, min_frac=0.1)),
        ("2048MiB,5%", HostLimit(min_mib=2048, min_frac=0.05)),
        ("0", HostLimit(min_mib=0, min_frac=0)),
    ],
)
def test_host_minimum_parses(text: str, limit: HostLimit) -> None:
    assert memory.parse_host_min(text) == limit


def test_a_bad_host_minimum_is_refused() -> None:
    with pytest.raises(ValueError):
        memory.parse_host_min("lots")


def test_a_job_overtaken_by_later_jobs_counts_as_starved_until_it_is_placed(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from gpusched.placement import Decision
    from gpusched.store import Store

    watch = memwatch.MemoryWatch(Store(tmp_path / "q.db"))
    big = replace(job(16, name="big"), predicted_s=7200.0)
    small = replace(job(4, name="small"), predicted_s=600.0)
    later = replace(job(9, name="later"), predicted_s=300.0)  # after small in the queue: not overtaken
    demand = {j.job_id: memwatch.Demand(view=j, predictions=()) for j in (big, small, later)}
    views = [view(0, free=10, running=1)]
    watch.overtaken([later, big, small], assign([later, big, small], views, headroom_frac=0.1), now=100.0)
    assert watch.starved(demand, 700.0) == {"big": 600.0, "small": 0.0, "later": 0.0}
    watch.overtaken([big], Decision(), now=800.0)  # nothing placed: still starved since 100
    assert watch.starved(demand, 900.0)["big"] == 800.0
    placed = assign([big], [view(0, free=24)], headroom_frac=0.1)
    watch.overtaken([big], placed, now=1000.0)
    assert watch.starved(demand, 1000.0)["big"] == 0.0


def test_a_card_is_kept_free_for_a_starved_job_even_when_every_slot_is_busy() -> None:
    views = [view(0, free=6, running=2), view(1, free=3, running=2)]  # a busy cluster: no slot free
    holds = memory.choose_holds(
        [(job(16, name="big"), 1800)],
        views,
        {0: 21 * GIB, 1: 21 * GIB},
        current={},
        hold_after_s=1800,
        max_holds=1,
        headroom_frac=0.1,
    )
    assert holds == {0: "big"}
    fits = memory.choose_holds(  # the memory is there: it waits for a slot, no card is held for it
        [(job(3, name="small"), 1800)],
        views,
        {0: 21 * GIB, 1: 21 * GIB},
        current={},
        hold_after_s=1800,
        max_holds=1,
        headroom_frac=0.1,
    )
    assert fits == {}
