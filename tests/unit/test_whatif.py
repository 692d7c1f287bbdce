"""The what-if night from the queue's history (`gpusched simulate` without --trace): measured
figures where the queue has them, the ladder model between them, made up only for tasks with
no finished run."""

from __future__ import annotations

from gpusched import sim
from gpusched.predict import PeakSample, RunSample
from gpusched.whatif import trace_from_history

GIB = 1024


def ok(job: str, task: str, tier: int, gib: float) -> PeakSample:
    return PeakSample(job_id=f"E1/{job}", task=task, tier=tier, peak_mib=int(gib * GIB), outcome="ok")


def ran(job: str, task: str, tier: int, minutes: float) -> RunSample:
    return RunSample(job_id=f"E1/{job}", task=task, tier=tier, seconds=minutes * 60)


def jobs(*names_tasks: tuple[str, str]) -> list[tuple[str, str, str]]:
    return [(f"E1/{n}", n, t) for n, t in names_tasks]


def test_a_job_replays_its_own_runs_and_a_new_one_its_tasks() -> None:
    peaks = {
        "qnli": [ok("87-qnli", "qnli", 0, 14), ok("88-qnli", "qnli", 0, 15), ok("89-qnli", "qnli", 0, 13)]
    }
    runs = {
        "qnli": [ran("87-qnli", "qnli", 0, 60), ran("88-qnli", "qnli", 0, 64), ran("89-qnli", "qnli", 0, 58)]
    }
    made = trace_from_history(jobs(("87-qnli", "qnli"), ("90-qnli", "qnli")), 4, peaks, runs)
    mine, new = made.trace.jobs
    assert (mine.tiers[0].peak_mib, mine.tiers[0].duration_s) == (14 * GIB, 60 * 60)  # its own run
    assert (new.tiers[0].peak_mib, new.tiers[0].duration_s) == (15 * GIB, 60 * 60)  # p90 peak, median run
    assert made.measured == {"qnli": 3} and made.made_up == ()
    assert made.summary() == "figures: measured for 1 task(s), from 3 finished run(s) in this queue"


def test_tiers_never_run_follow_the_ladder_from_the_tiers_that_did() -> None:
    peaks = {"mnli": [ok("1-mnli", "mnli", 0, 13)]}
    runs = {"mnli": [ran("1-mnli", "mnli", 0, 90)]}
    (job,) = trace_from_history(jobs(("2-mnli", "mnli")), 4, peaks, runs).trace.jobs
    ladder = sim.ladder_profiles(13 * GIB, 90 * 60, sim.RAMP_S)
    assert job.tiers == ladder
    assert [t.peak_mib for t in job.tiers] == sorted((t.peak_mib for t in job.tiers), reverse=True)


def test_a_tier_never_run_below_one_that_did_is_the_ladder_inverted() -> None:
    peaks = {"qqp": [ok("1-qqp", "qqp", 1, 9)]}
    runs = {"qqp": [ran("1-qqp", "qqp", 1, 54)]}
    (job,) = trace_from_history(jobs(("2-qqp", "qqp")), 4, peaks, runs).trace.jobs
    assert (job.tiers[1].peak_mib, job.tiers[1].duration_s) == (9 * GIB, 54 * 60)  # measured
    a = job.tiers[0]
    assert sim.ladder_profiles(a.peak_mib, a.duration_s, 1.0)[1:] == tuple(
        sim.TierProfile(peak_mib=t.peak_mib, duration_s=t.duration_s, ramp_s=1.0) for t in job.tiers[1:]
    )  # A's ladder gives B as measured, and C and D as the replay has them
    assert a.peak_mib > 9 * GIB and a.duration_s < 54 * 60


def test_a_tier_that_only_oomed_is_at_least_what_the_oom_measured() -> None:
    """boolq OOMed at A (at 23.5 GiB) and ran at B: the ladder up from B says ~14.5 GiB, but
    the OOM saw more, so the replay's A is what the OOM saw (and OOMs beside anything)."""
    oom = PeakSample(job_id="E1/1-boolq", task="boolq", tier=0, peak_mib=int(23.5 * GIB), outcome="oom")
    peaks = {"boolq": [oom, ok("1-boolq", "boolq", 1, 9)]}
    runs = {"boolq": [ran("1-boolq", "boolq", 1, 50)]}
    (job,) = trace_from_history(jobs(("2-boolq", "boolq")), 4, peaks, runs).trace.jobs
    assert job.tiers[0].peak_mib == int(23.5 * GIB) and job.tiers[1].peak_mib == 9 * GIB


def test_tasks_with_no_finished_run_are_made_up_as_before() -> None:
    pairs = (("87-qnli", "qnli"), ("87-sst2", "sst2"))
    made = trace_from_history(jobs(*pairs), 4, {}, {}, seed=3)
    assert made.trace == sim.synthetic_trace(list(pairs), seed=3, tiers=4)  # what simulate replayed before
    assert made.summary() == "figures: made up (no run of these tasks has finished in this queue)"
    oom_only = {"sst2": [PeakSample(job_id="E1/1-sst2", task="sst2", tier=0, peak_mib=None, outcome="oom")]}
    mixed = trace_from_history(jobs(*pairs), 4, {**oom_only, "qnli": [ok("1-qnli", "qnli", 0, 14)]}, {})
    assert mixed.made_up == ("sst2",) and mixed.summary().endswith("; made up for sst2 (no run finished)")
    assert mixed.trace.jobs[0].tiers[0].peak_mib == 14 * GIB


def test_a_tier_that_ran_out_alone_on_a_card_fits_no_card_in_the_replay() -> None:
    """An OOM with no peak recorded says little, unless the job had the card to itself (it
    was placed with the card's whole usable memory): then that tier fits no card of that size."""

    def oom(job: str, tier: int, placed_gib: float) -> PeakSample:
        return PeakSample(
            job_id=f"E1/{job}",
            task="big",
            tier=tier,
            peak_mib=None,
            outcome="oom",
            predicted_mib=int(placed_gib * GIB),
        )

    peaks = {"big": [oom("big", 0, 20.6), oom("big", 1, 10), ok("big", "big", 2, 9)]}
    args = {"card_mib": 24 * GIB, "whole_mib": int(20.6 * GIB)}
    (job,) = trace_from_history(jobs(("big", "big")), 4, peaks, {}, **args).trace.jobs  # type: ignore[arg-type]
    assert job.tiers[0].peak_mib == 24 * GIB + 1  # alone on a card and still out of memory
    assert job.tiers[1].peak_mib < 24 * GIB  # beside another job: the ladder's estimate stands
    assert job.tiers[2].peak_mib == 9 * GIB
