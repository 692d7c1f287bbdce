"""A suite's ``limits`` (time, silence, output): parsed from the plan, judged by a pure rule, enforced
by the scheduler (SIGTERM, SIGKILL after the grace, reaped as ``timeout``) and remembered in
the store across a daemon restart; shown by status while it happens."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from msgspec.structs import replace

from gpusched import outcome
from gpusched.attempt import AttemptPaths
from gpusched.executors import Handle
from gpusched.executors.fake import FakeExecutor
from gpusched.gpus.fake import FakeProbe
from gpusched.model import (
    ExitRecord,
    GpuPlan,
    JobState,
    Limits,
    Outcome,
    RetryPolicy,
    StepKind,
    Suite,
    Tier,
)
from gpusched.scheduler import Scheduler
from gpusched.views import format_status, status
from tests.unit.test_plan import MINIMAL, load, load_error
from tests.unit.test_scheduler import World, make_suite

# --------------------------------------------------------------------------- the plan


def test_limits_read_durations_in_seconds_or_with_units(tmp_path: Path) -> None:
    suite = load(tmp_path, MINIMAL + "limits: {time: 1h30m, silence: 45m}\n")
    assert suite.limits == Limits(time_s=5400.0, silence_s=2700.0)
    assert load(tmp_path, MINIMAL + "limits: {time: 90}\n").limits == Limits(time_s=90.0)
    assert load(tmp_path, MINIMAL + "limits: {silence: 2d}\n").limits == Limits(silence_s=172800.0)
    assert load(tmp_path, MINIMAL + "limits: {time: 0.5s}\n").limits == Limits(time_s=0.5)
    assert load(tmp_path, MINIMAL).limits == Limits()  # none by default: nothing is ever stopped
    assert load(tmp_path, MINIMAL + "limits: {output: 2GiB}\n").limits == Limits(output_mib=2048)
    assert load(tmp_path, MINIMAL + "limits: {output: 500 MB}\n").limits == Limits(output_mib=500)
    assert load(tmp_path, MINIMAL + "limits: {output: 1.5tib}\n").limits == Limits(output_mib=3 << 19)


@pytest.mark.parametrize(
    ("body", "needles"),
    [
        (
            "limits: {time: 6 hours}\n",
            ("plans/s.yaml: limits.time: must be a duration above zero", "'6 hours'"),
        ),
        (
            "limits: {silence: 0}\n",
            ("limits.silence: must be a duration above zero", "e.g. limits: {time: 6h"),
        ),
        ("limits: {time: -5}\n", ("limits.time: must be a duration",)),
        ("limits: {time: true}\n", ("limits.time: must be a duration",)),
        ("limits: {time: h}\n", ("limits.time: must be a duration",)),
        (
            "limits: {timeout: 1h}\n",
            ("plans/s.yaml: limits.timeout: unknown key", "allowed keys here: time, silence, output"),
        ),
        (
            "limits: 6h\n",
            (
                "plans/s.yaml: limits: must be a mapping",
                "e.g. limits: {time: 6h, silence: 30m, output: 2GiB}",
            ),
        ),
        (  # a bare number: bytes or MiB?
            "limits: {output: 2048}\n",
            ("plans/s.yaml: limits.output: must be a size of at least 1 MiB, like 500MiB or 2GiB, got 2048",),
        ),
        ("limits: {output: 2 gigs}\n", ("limits.output: must be a size", "'2 gigs'")),
        ("limits: {output: 100KiB}\n", ("limits.output: must be a size of at least 1 MiB",)),
    ],
)
def test_a_bad_limit_is_one_line_naming_the_key(tmp_path: Path, body: str, needles: tuple[str, ...]) -> None:
    load_error(tmp_path, MINIMAL + body, *needles)


# --------------------------------------------------------------------------- the rule


def test_past_limit_counts_time_from_the_wrappers_start_and_silence_from_the_last_output() -> None:
    both = Limits(time_s=3600, silence_s=600)
    assert outcome.past_limit(both, started_at=0, output_at=3000, now=3599) is None
    assert outcome.past_limit(both, started_at=0, output_at=3599, now=3600) == (
        "ran past its time limit of 1h (limits.time)"
    )
    assert outcome.past_limit(both, started_at=0, output_at=2000, now=2599) is None
    assert outcome.past_limit(both, started_at=0, output_at=2000, now=2600) == (
        "printed nothing for 10m, taken as hung (limits.silence)"
    )
    # nothing written yet: silent since the wrapper started (a long import counts)
    assert outcome.past_limit(Limits(silence_s=600), started_at=100, output_at=None, now=699) is None
    assert outcome.past_limit(Limits(silence_s=600), started_at=100, output_at=None, now=700) is not None
    # an output.log older than the attempt (left by nothing else, but never trusted): the start counts
    assert outcome.past_limit(Limits(silence_s=600), started_at=100, output_at=50, now=699) is None
    assert outcome.past_limit(Limits(), started_at=0, output_at=None, now=1e9) is None


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (45.9, "45s"), (60, "1m"), (90, "1m30s"), (3600, "1h"), (5400, "1h30m"), (93784, "1d2h")],
)
def test_durations_read_back_as_a_person_writes_them(seconds: float, text: str) -> None:
    assert outcome.duration_text(seconds) == text


def test_a_stopped_attempt_is_a_timeout_unless_it_exited_0_first_and_a_cancel_wins() -> None:
    why = "ran past its time limit of 1h (limits.time)"
    killed = ExitRecord(exit_code=143, signal=15)
    c = outcome.classify(killed, "CUDA out of memory.", cancel_requested=False, stopped_for=why)
    assert (c.outcome, c.reason) == (Outcome.TIMEOUT, why)  # what its log said on the way out does not count
    assert outcome.classify(None, "", cancel_requested=False, stopped_for=why).outcome is Outcome.TIMEOUT
    ok = ExitRecord(exit_code=0)
    assert outcome.classify(ok, "", cancel_requested=False, stopped_for=why).outcome is Outcome.OK
    assert outcome.classify(killed, "", cancel_requested=True, stopped_for=why).outcome is Outcome.CANCELLED


def test_a_timeout_fails_the_job_unless_the_suite_retries_errors() -> None:
    c = outcome.classify(None, "", cancel_requested=False, stopped_for="printed nothing for 30m")
    tiers = (Tier(name="A"), Tier(name="B"))
    kw: dict[str, Any] = {"tier": 0, "tiers": tiers, "gpu": 1, "lost_so_far": 0, "now": 1000.0}
    step = outcome.next_step(c, errors_so_far=0, retry=RetryPolicy(), **kw)
    assert (step.kind, step.tier, step.reason) == (StepKind.FAIL, 0, "printed nothing for 30m")
    step = outcome.next_step(c, errors_so_far=0, retry=RetryPolicy(errors=1, backoff_s=30), **kw)
    assert (step.kind, step.tier, step.not_before) == (StepKind.REQUEUE, 0, 1030.0)  # a hang is no OOM
    assert step.reason == "timeout, retry 1 of 1 in 30 s: printed nothing for 30m"
    step = outcome.next_step(c, errors_so_far=1, retry=RetryPolicy(errors=1, backoff_s=30), **kw)
    assert step.kind is StepKind.FAIL


# --------------------------------------------------------------------------- the scheduler


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path, GpuPlan(gpus=(0, 1), slots=(2, 1)))


def limited(tmp: Path, **limits: float) -> Suite:
    return replace(make_suite(tmp, n=1), limits=Limits(**limits))


def wrapper_started(world: World, job_id: str, at: float, *, output_at: float | None = None) -> AttemptPaths:
    """What the real wrapper leaves when it starts (its pid file, at ``at``) and, with
    ``output_at``, a log last written then."""
    a = world.store.attempts(job_id)[-1]
    paths = AttemptPaths(Path(a.dir))
    paths.pid.write_text(f"{os.getpid()}\n")
    os.utime(paths.pid, (at, at))
    if output_at is not None:
        paths.output.write_text("step 10\n")
        os.utime(paths.output, (output_at, output_at))
    return paths


def test_a_job_past_its_time_limit_is_stopped_and_fails_as_a_timeout(world: World, tmp_path: Path) -> None:
    world.submit(limited(tmp_path, time_s=3600))
    world.tick()  # launched at 101
    wrapper_started(world, "E1/0-task", at=101, output_at=3000)
    world.now = 3699
    world.tick()  # at 3700: 3599 s since the wrapper started
    assert world.ex.terminated == [] and world.state("E1/0-task") is JobState.RUNNING
    world.now = 3701
    world.tick()  # SIGTERM (the fake ends the attempt with 143)
    assert len(world.ex.terminated) == 1
    world.tick()  # reaped
    job = world.store.job("E1/0-task")
    assert job is not None and job.state is JobState.FAILED and job.outcome == "timeout"
    assert job.reason == "ran past its time limit of 1h (limits.time)" and job.errors == 1
    assert [a.outcome for a in world.store.attempts("E1/0-task")] == ["timeout"]


def test_a_silent_job_is_stopped_as_hung_and_one_that_writes_is_not(world: World, tmp_path: Path) -> None:
    world.submit(replace(limited(tmp_path, silence_s=600), jobs=make_suite(tmp_path, n=2).jobs))
    world.tick()  # both launched at 101
    wrapper_started(world, "E1/0-task", at=101, output_at=200)  # quiet since 200
    talking = wrapper_started(world, "E1/1-task", at=101, output_at=200)
    world.now = 798
    world.tick()  # (a tick is one second on: at 799)
    assert world.ex.terminated == []
    os.utime(talking.output, (790, 790))  # it printed a step
    world.now = 800
    world.tick()
    world.tick()
    assert world.state("E1/0-task") is JobState.FAILED and world.state("E1/1-task") is JobState.RUNNING
    assert (world.store.job("E1/0-task") or pytest.fail()).reason == (
        "printed nothing for 10m, taken as hung (limits.silence)"
    )


def test_a_job_whose_wrapper_has_not_started_uses_none_of_its_limits(world: World, tmp_path: Path) -> None:
    """A Slurm job pending in Slurm's queue is `running` to gpusched, but has run for no time."""
    world.submit(limited(tmp_path, time_s=60, silence_s=60))
    world.tick()
    world.now = 100_000
    world.tick()
    assert world.ex.terminated == [] and world.state("E1/0-task") is JobState.RUNNING
    wrapper_started(world, "E1/0-task", at=100_000)
    world.now = 100_030
    world.tick()
    assert world.ex.terminated == []


def test_a_timeout_is_retried_at_the_same_tier_when_the_suite_retries_errors(
    world: World, tmp_path: Path
) -> None:
    world.submit(replace(limited(tmp_path, time_s=60), retry=RetryPolicy(errors=1, backoff_s=5)))
    world.tick()
    wrapper_started(world, "E1/0-task", at=101)
    world.now = 200
    world.tick()
    world.tick()
    job = world.store.job("E1/0-task")
    assert job is not None and job.state is JobState.QUEUED and job.tier == 0
    assert (job.reason or "").startswith("timeout, retry 1 of 1 in 5 s: ran past its time limit of 1m")


class Stubborn(FakeExecutor):
    """Its jobs ignore SIGTERM: only a SIGKILL (force) ends them."""

    def terminate(self, handle: Handle, *, force: bool = False) -> None:
        self.terminated.append(("SIGKILL" if force else "SIGTERM") + " " + handle["token"])
        if force and handle.get("token") in self.live:
            self.finish(handle["token"], exit_code=None, signal=9)


def past_its_time_limit(tmp_path: Path) -> World:
    """One job of a suite with a 1 min time limit, whose wrapper ignores SIGTERM, once the
    scheduler has sent it one."""
    world = World(tmp_path, GpuPlan(gpus=(0,), slots=(1,)))
    world.ex = Stubborn(name="fake")
    world.sched = Scheduler(world.store, FakeProbe.from_spec("1x24GiB"), {"fake": world.ex})
    world.submit(limited(tmp_path, time_s=60))
    world.tick()
    wrapper_started(world, "E1/0-task", at=101)
    world.now = 200
    world.tick()
    assert [t.split()[0] for t in world.ex.terminated] == ["SIGTERM"]
    return world


def test_a_restarted_daemon_still_reaps_a_stopped_job_as_a_timeout_and_kills_it(tmp_path: Path) -> None:
    world = past_its_time_limit(tmp_path)
    # the daemon dies; a new one knows from the store that this attempt is being stopped
    world.sched = Scheduler(world.store, FakeProbe.from_spec("1x24GiB"), {"fake": world.ex})
    world.tick()  # SIGTERM again (the new daemon cannot know the first one's time)
    world.now += world.sched.settings.cancel_grace_s
    world.tick()  # SIGKILL: the job ends with signal 9, which alone would read as a host OOM
    world.tick()
    assert [t.split()[0] for t in world.ex.terminated] == ["SIGTERM", "SIGTERM", "SIGKILL"]
    job = world.store.job("E1/0-task")
    assert job is not None and (job.state, job.outcome) == (JobState.FAILED, "timeout")
    assert world.store.stops() == {}  # only live attempts are being stopped


def test_a_job_that_ends_well_inside_the_grace_succeeds(tmp_path: Path) -> None:
    world = past_its_time_limit(tmp_path)
    world.ex.finish(world.ex.token_of("E1/0-task"), exit_code=0)  # it was saving its last checkpoint
    world.tick()
    assert world.state("E1/0-task") is JobState.SUCCEEDED


def test_status_says_which_job_is_being_stopped_and_how_long_each_has_been_quiet(
    world: World, tmp_path: Path
) -> None:
    world.ex = Stubborn(name="fake")
    world.sched = Scheduler(world.store, FakeProbe.from_spec("2x24GiB"), {"fake": world.ex})
    world.submit(replace(limited(tmp_path, silence_s=3600), jobs=make_suite(tmp_path, n=2).jobs))
    world.tick()
    wrapper_started(world, "E1/0-task", at=101, output_at=101)
    wrapper_started(world, "E1/1-task", at=101, output_at=2900)
    world.now = 3702
    world.tick()
    doc = status(world.store, [], daemon=None, now=world.now, trees=lambda: {}).doc()
    jobs = {j["id"]: j for j in doc["jobs"]}
    why = "printed nothing for 1h, taken as hung (limits.silence)"
    assert (jobs["E1/0-task"]["stopping"], jobs["E1/0-task"]["quiet_s"]) == (why, 3602.0)
    assert (jobs["E1/1-task"]["stopping"], jobs["E1/1-task"]["quiet_s"]) == (None, 803.0)
    text = format_status(doc, width=200)
    row0 = next(line for line in text.splitlines() if "E1/0-task" in line)
    row1 = next(line for line in text.splitlines() if "E1/1-task" in line)
    assert "running (stopping)" in row0 and f"stopping: {why}" in row0
    assert "(no output for 13 min) step 10" in row1
    assert json.loads(json.dumps(doc))  # still plain JSON


def test_time_the_machine_slept_counts_for_no_limit(world: World, tmp_path: Path) -> None:
    """A workstation suspended for the night: in the morning the wall clock is 8 h on, the
    jobs' logs 8 h old, and every job with ``limits.silence`` was stopped as hung at once.
    The daemon's monotonic clock stood still meanwhile: that time counts for no limit."""
    mono = [0.0]
    events: list[str] = []
    world.sched = Scheduler(
        world.store, FakeProbe.from_spec("2x24GiB"), {"fake": world.ex}, monotonic=lambda: mono[0],
        on_event=events.append,
    )  # fmt: skip

    def at(now: float, slept: float = 0.0) -> None:  # a tick at ``now``; the machine slept ``slept`` s before
        mono[0] += now - world.now - slept
        world.now = now - 1  # (World.tick adds the second)
        world.tick()

    world.submit(replace(limited(tmp_path, silence_s=600, time_s=3600), jobs=make_suite(tmp_path, n=1).jobs))
    at(101)
    wrapper_started(world, "E1/0-task", at=101, output_at=200)  # quiet since 200
    at(500)
    at(500 + 8 * 3600, slept=8 * 3600 - 1)  # woken: 8 h on by the wall clock, 1 s by the monotonic one
    assert world.ex.terminated == [] and world.state("E1/0-task") is JobState.RUNNING
    assert any("the clock moved 28799 s more than this process ran" in e for e in events), events
    at(200 + 8 * 3600 + 598)  # 598 s of silence that the job was awake for: not yet
    assert world.ex.terminated == []
    at(200 + 8 * 3600 + 601)
    assert len(world.ex.terminated) == 1
    world.tick()
    assert (world.store.job("E1/0-task") or pytest.fail()).reason == (
        "printed nothing for 10m, taken as hung (limits.silence)"
    )


def test_a_job_whose_log_grows_past_its_output_limit_is_stopped_before_it_fills_the_disk(
    world: World, tmp_path: Path
) -> None:
    """A print left in a tight loop writes gigabytes an hour; on a full disk every job of the
    night dies at its next save. With ``limits.output`` that job is stopped as it passes the
    size (a sparse file here: its size, none of the disk), and the job beside it runs on."""
    world.submit(replace(limited(tmp_path, output_mib=1024), jobs=make_suite(tmp_path, n=2).jobs))
    world.tick()
    runaway = wrapper_started(world, "E1/0-task", at=101, output_at=150)
    wrapper_started(world, "E1/1-task", at=101, output_at=150)
    os.truncate(runaway.output, 1 << 30)  # exactly the limit: not past it
    world.tick()
    assert world.ex.terminated == []
    os.truncate(runaway.output, (3 << 30) // 2)
    world.tick()
    world.tick()
    assert world.state("E1/0-task") is JobState.FAILED and world.state("E1/1-task") is JobState.RUNNING
    job = world.store.job("E1/0-task") or pytest.fail()
    assert (job.outcome, job.reason) == (
        "timeout",
        "wrote 1.5 GiB to its output.log, more than its limit of 1.0 GiB (limits.output)",
    )
