"""A GPU that fails under its jobs (an uncorrectable ECC error, a card fallen off the bus):
the job is requeued elsewhere without being charged, and a card that does it twice in a row
goes out of service instead of failing, one after another, every job placed on it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gpusched import outcome
from gpusched.gpus.fake import FakeProbe, FakeUsage
from gpusched.model import GPU_LOST_WHY, ExitRecord, GpuPlan, JobState, Outcome, RetryPolicy, StepKind, Tier
from gpusched.store import Store
from gpusched.views import format_status, status
from tests.unit.test_scheduler import World, make_suite

ECC = "RuntimeError: CUDA error: uncorrectable ECC error encountered"


def test_a_gpu_fault_requeues_the_job_elsewhere_uncharged_until_every_card_broke_under_it() -> None:
    c = outcome.classify(ExitRecord(exit_code=1), f"step 9\n{ECC}\n", cancel_requested=False)
    assert (c.outcome, c.reason, c.line) == (Outcome.GPU_FAULT, "the GPU hit an uncorrectable ECC error", ECC)
    tiers = (Tier(name="A"), Tier(name="B"))
    kw = {"tiers": tiers, "gpu": 3, "errors_so_far": 0, "lost_so_far": 0, "retry": RetryPolicy(), "now": 0.0}
    step = outcome.next_step(c, tier=1, **kw)  # type: ignore[arg-type]
    assert (step.kind, step.tier, step.avoid_gpu) == (StepKind.REQUEUE, 1, 3)  # no slower tier: not an OOM
    assert step.reason == (
        "the GPU hit an uncorrectable ECC error → requeued at tier B, away from GPU 3"
        " (not counted against the job)"
    )
    step = outcome.next_step(c, tier=1, faults_so_far=3, **kw)  # type: ignore[arg-type]
    assert step.kind is StepKind.FAIL and "failed under 4 of its attempts" in step.reason


def test_a_bug_that_looks_like_a_gpu_error_is_the_jobs_own() -> None:
    for line in (
        "RuntimeError: CUDA error: an illegal memory access was encountered",
        "RuntimeError: CUDA error: unspecified launch failure",
        "RuntimeError: CUDA error: device-side assert triggered",
    ):
        c = outcome.classify(ExitRecord(exit_code=1), line, cancel_requested=False)
        assert c.outcome is Outcome.ERROR, line


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path, GpuPlan(gpus=(0, 1), slots=(1, 1)))


def end(world: World, job_id: str, *, fault: bool) -> None:
    token = world.ex.token_of(job_id)
    world.ex.finish(token, exit_code=1 if fault else 0, output=f"{ECC}\n" if fault else "done\n")


def on_gpu(world: World, gpu: int) -> str:
    (a,) = [a for a in world.store.live_attempts() if a.gpu == gpu]
    return a.job_id


def test_a_card_that_fails_twice_in_a_row_goes_out_of_service_and_the_queue_runs_on_the_rest(
    world: World, tmp_path: Path
) -> None:
    world.submit(make_suite(tmp_path, n=6))
    world.tick()
    first = on_gpu(world, 1)
    end(world, first, fault=True)
    world.tick()  # reaped: requeued, away from GPU 1; GPU 1 has one fault, still in service
    job = world.store.job(first)
    assert job is not None and job.state in (JobState.QUEUED, JobState.RUNNING) and job.errors == 0
    assert world.store.gpus_out() == {}
    second = on_gpu(world, 1)  # (the same job: GPU 1 was the only free card, avoid_gpu is a preference)
    end(world, second, fault=True)
    world.tick()
    out = world.store.gpus_out()
    assert list(out) == [1] and out[1].faults == 2 and out[1].job_id == second
    assert out[1].why == f"the GPU hit an uncorrectable ECC error: {ECC}"
    for _ in range(20):  # the rest of the night: everything runs on GPU 0, nothing on GPU 1
        for a in world.store.live_attempts():
            end(world, a.job_id, fault=False)
        world.tick()
        assert all(a.gpu == 0 for a in world.store.live_attempts())
    assert {j.state for j in world.store.jobs()} == {JobState.SUCCEEDED}
    assert {a.outcome for a in world.store.attempts(first)} == {"gpu_fault", "ok"}

    doc = status(world.store, [], daemon=None, now=world.now, trees=lambda: {}).doc()
    gpu1 = next(g for g in doc["gpus"] if g["index"] == 1)
    assert gpu1["out_of_service"]["faults"] == 2 and gpu1["out_of_service"]["job_id"] == second
    assert next(g for g in doc["gpus"] if g["index"] == 0)["out_of_service"] is None
    text = format_status(doc, width=400)
    assert "GPU 1 OUT OF SERVICE since " in text and "`gpusched gpus --enable 1` once it is fixed" in text

    assert world.store.enable_gpus([1]) == [1] and world.store.gpus_out() == {}
    world.submit(make_suite(tmp_path, n=8))  # two more jobs: both cards take them again
    world.tick()
    assert sorted(a.gpu for a in world.store.live_attempts()) == [0, 1]


def test_a_success_between_two_faults_keeps_the_card_in_service(world: World, tmp_path: Path) -> None:
    world.submit(make_suite(tmp_path, n=5))
    world.tick()
    end(world, on_gpu(world, 1), fault=True)
    world.tick()
    end(world, on_gpu(world, 1), fault=False)
    world.tick()
    end(world, on_gpu(world, 1), fault=True)
    world.tick()
    assert world.store.gpus_out() == {}  # a flaky job or two, not a broken card


def test_reaps_of_one_tick_count_a_card_s_faults_in_the_order_its_jobs_ended(tmp_path: Path) -> None:
    """A tick's reaps are recorded together, but a success still ends the run of faults before
    it, and only those: a card with one fault whose next two jobs end in one tick, the earlier
    well and the later on a fault, has one fault in a row, not two, and stays in service."""
    world = World(tmp_path, GpuPlan(gpus=(1,), slots=(2,)))
    world.submit(make_suite(tmp_path, n=6))
    world.tick()
    first = min(world.store.live_attempts(), key=lambda a: a.id)
    end(world, first.job_id, fault=True)
    world.tick()  # one fault; the card's two slots run two jobs again
    older, newer = sorted(world.store.live_attempts(), key=lambda a: a.id)
    end(
        world, newer.job_id, fault=True
    )  # (the files written in the other order: the reaps' order is the tick's)
    end(world, older.job_id, fault=False)
    report = world.tick()
    assert report.reaped == [(older.job_id, "ok"), (newer.job_id, "gpu_fault")]
    assert world.store.gpus_out() == {}
    row = world.store.db.execute("SELECT faults, last_job FROM gpu_faults WHERE gpu = 1").fetchone()
    assert tuple(row) == (1, newer.job_id)


def test_jobs_whose_every_gpu_is_out_of_service_wait_and_say_why(tmp_path: Path) -> None:
    world = World(tmp_path, GpuPlan(gpus=(1,), slots=(1,)))
    world.store.gpu_fault(1, "E0/x", "the GPU is lost", now=1.0, out_after=1)
    world.submit(make_suite(tmp_path, n=2))
    assert world.tick().launched == []
    job = world.store.job("E1/0-task")
    assert job is not None and job.state is JobState.QUEUED
    assert job.wait_reason == (
        "every GPU of its plan is out of service (1; GPU 1: the GPU is lost); "
        "`gpusched gpus --enable 1` once fixed"
    )


def test_status_reads_a_database_of_an_older_gpusched_read_only(tmp_path: Path) -> None:
    """`status` opens the database read-only; one written before the stops, gpu_faults and
    gpu_pids tables existed reads as having none of them, instead of failing."""
    src = Path(__file__).resolve().parent.parent / "data" / "store-v1.db"
    shutil.copy(src, tmp_path / "gs.db")
    old = Store(tmp_path / "gs.db", readonly=True)
    assert old.stops() == {} and old.gpus_out() == {} and old.exited_gpu_pids({4242}, since=0) == []
    doc = status(old, [], daemon=None, trees=lambda: {}).doc()
    assert doc["jobs"] and all(j["stopping"] is None for j in doc["jobs"])


def test_a_card_the_probe_finds_lost_goes_out_of_service_at_once_and_stays_out_while_lost(
    world: World, tmp_path: Path
) -> None:
    """A card off the bus (NVML: GPU_IS_LOST) is out before any job fails on it; `gpus
    --enable` while the driver still finds it lost puts it back for one tick only."""
    lost = {1}
    world.sched.probe = FakeProbe.from_spec("2x24GiB", usage=lambda: {i: FakeUsage(lost=True) for i in lost})
    events: list[str] = []
    world.sched.on_event = events.append
    world.submit(make_suite(tmp_path, n=4))
    world.tick()
    assert [a.gpu for a in world.store.live_attempts()] == [0]  # nothing placed on the lost card
    out = world.store.gpus_out()
    assert list(out) == [1] and out[1].job_id == "" and out[1].faults == 0 and out[1].why == GPU_LOST_WHY
    assert f"GPU 1 out of service: {GPU_LOST_WHY}; `gpusched gpus --enable 1` once it is fixed" in events
    world.tick()
    assert sum("out of service" in e for e in events) == 1  # said once, not every tick

    doc = status(world.store, world.sched.last_snapshot, daemon=None, now=world.now, trees=lambda: {}).doc()
    gpu1 = next(g for g in doc["gpus"] if g["index"] == 1)
    assert gpu1["lost"] is True and gpu1["out_of_service"]["why"] == GPU_LOST_WHY
    text = format_status(doc, width=400)
    assert "GPU 1 OUT OF SERVICE since " in text
    assert f", because {GPU_LOST_WHY}: no job is placed there" in text
    assert "LOST / 24.0" in text

    assert world.store.enable_gpus([1]) == [1]
    world.tick()  # still lost: out again
    assert list(world.store.gpus_out()) == [1] and [a.gpu for a in world.store.live_attempts()] == [0]

    lost.clear()  # reset by a person, then put back
    assert world.store.enable_gpus([1]) == [1]
    world.tick()
    assert sorted(a.gpu for a in world.store.live_attempts()) == [0, 1] and world.store.gpus_out() == {}


def test_a_lost_card_keeps_the_faults_its_jobs_counted(world: World) -> None:
    world.store.gpu_fault(1, "E1/a", "the GPU is lost", now=1.0, out_after=2)
    assert world.store.gpu_lost(1, GPU_LOST_WHY, now=2.0) is True
    assert world.store.gpu_lost(1, GPU_LOST_WHY, now=3.0) is False  # already out
    out = world.store.gpus_out()[1]
    assert (out.faults, out.since, out.job_id, out.why) == (1, 2.0, "", GPU_LOST_WHY)


LAUNCH_FAILURE = "RuntimeError: CUDA error: unspecified launch failure"


def lost_world(world: World, lost: set[int], events: list[str]) -> None:
    world.sched.probe = FakeProbe.from_spec("2x24GiB", usage=lambda: {i: FakeUsage(lost=True) for i in lost})
    world.sched.on_event = events.append


def test_jobs_on_a_card_that_is_lost_are_stopped_and_run_again_on_the_other_cards(
    world: World, tmp_path: Path
) -> None:
    """A job on a card that falls off the bus can only fail or hang there (a hung one would
    hold its slot until morning): gpusched stops it and requeues it elsewhere, uncharged."""
    lost: set[int] = set()
    events: list[str] = []
    lost_world(world, lost, events)
    world.submit(make_suite(tmp_path, n=3))
    world.tick()
    victim, bystander = on_gpu(world, 1), on_gpu(world, 0)
    lost.add(1)
    world.tick()  # read lost: out of service, its job's stop recorded (in the store: a restart keeps it)
    assert list(world.store.gpus_out()) == [1]
    assert [why for why, _ in world.store.stops().values()] == ["its GPU 1 is lost"]
    assert f"{victim}: SIGTERM sent (its GPU 1 is lost)" in events  # in the same tick
    assert world.ex.terminated == [world.ex.token_of(victim)]
    world.tick()  # reaped
    (a,) = world.store.attempts(victim)
    assert (a.outcome, a.reason) == ("gpu_fault", "its GPU 1 was lost while it ran (stopped)")
    job = world.store.job(victim)
    assert job is not None and job.state is JobState.QUEUED and job.errors == 0 and job.lost == 0
    assert world.state(bystander) is JobState.RUNNING  # the other card's job runs on

    end(world, bystander, fault=False)
    for _ in range(3):
        world.tick()
        for a in world.store.live_attempts():
            assert a.gpu == 0
            end(world, a.job_id, fault=False)
    assert {j.state for j in world.store.jobs()} == {JobState.SUCCEEDED}


def test_a_job_that_fails_as_its_card_is_lost_is_not_charged_with_the_cards_failure(
    world: World, tmp_path: Path
) -> None:
    """CUDA tells a job whose card fell off the bus "unspecified launch failure", which on a
    healthy card is the job's own bug. The card is read when the job is reaped, since the job
    dies before any earlier read could find the card lost."""
    lost: set[int] = set()
    lost_world(world, lost, [])
    world.submit(make_suite(tmp_path, n=2))
    world.tick()
    on_lost, on_healthy = on_gpu(world, 1), on_gpu(world, 0)
    for job_id in (on_lost, on_healthy):
        world.ex.finish(world.ex.token_of(job_id), exit_code=1, output=f"step 3\n{LAUNCH_FAILURE}\n")
    lost.add(1)
    world.tick()
    a = world.store.attempts(on_lost)[0]
    assert a.outcome == "gpu_fault" and a.line == LAUNCH_FAILURE
    assert a.reason is not None and a.reason.startswith("its GPU 1 was lost while it ran (")
    job = world.store.job(on_lost)
    assert job is not None and job.errors == 0 and job.state is not JobState.FAILED
    b = world.store.attempts(on_healthy)[0]
    assert b.outcome == "error"  # the same line on a card that is fine is the job's own bug
