"""Scheduler.tick over a real SQLite store with the fake executor and fake GPUs: the core
decisions end to end (place, launch, reap, requeue down the ladder, cancel, restart)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import msgspec
import pytest

from gpusched import tiers
from gpusched.executors.fake import FakeExecutor
from gpusched.gpus.fake import FakeProbe
from gpusched.model import BatchRule, GpuPlan, JobSpec, JobState, ResumeSpec, Suite, Tier
from gpusched.scheduler import Scheduler, Settings
from gpusched.store import Store
from gpusched.tiers import DEFAULT_ENV
from tests.helpers import read_launch

OOM_TAIL = (
    "Traceback (most recent call last):\n"
    '  File "train.py", line 3, in <module>\n'
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of"
    " 23.65 GiB of which 28.25 MiB is free.\n"
)


def make_suite(tmp: Path, n: int = 4, name: str = "E1") -> Suite:
    (tmp / "train.py").touch()  # the script its command runs: launches wait while it is missing
    return Suite(
        name=name,
        plan_path=str(tmp / "plans" / f"{name}.yaml"),
        workdir=str(tmp),
        logs_dir=str(tmp / "logs" / name),
        command="python train.py --config {config}",
        base_config=None,
        env=dict(DEFAULT_ENV),
        base_config_data={"batch_size": 8, "gradient_accumulation_steps": 1, "num_data_workers": 8},
        tiers=(
            Tier(name="A"),
            Tier(name="B", config={"gradient_checkpointing": True, "num_data_workers": 2}),
            Tier(
                name="C",
                config={"gradient_checkpointing": True, "num_data_workers": 2},
                batch=BatchRule(scale=0.5),
            ),
        ),
        resume=ResumeSpec(flag_key="is_keep_training"),
        jobs=tuple(
            JobSpec(suite=name, name=f"{i}-task", task="task", config={"seed": i, "output_dir": f"out/{i}"})
            for i in range(n)
        ),
    )


class World:
    def __init__(self, tmp: Path, plan: GpuPlan, gpus: str = "2x24GiB") -> None:
        self.store = Store(tmp / "gs.db")
        self.ex = FakeExecutor(name="fake")
        self.sched = Scheduler(self.store, FakeProbe.from_spec(gpus), {"fake": self.ex})
        self.tmp, self.plan, self.now = tmp, plan, 100.0

    def submit(self, suite: Suite) -> None:
        self.store.submit(suite, self.plan, backend="fake", cwd=str(self.tmp), env_path=None)

    def tick(self):  # type: ignore[no-untyped-def]
        self.now += 1
        return self.sched.tick(self.now)

    def state(self, job_id: str) -> JobState:
        job = self.store.job(job_id)
        assert job is not None
        return job.state


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path, GpuPlan(gpus=(0, 1), slots=(2, 1)))


def test_fills_exactly_the_slots_of_the_plan_and_records_why_the_rest_waits(
    world: World, tmp_path: Path
) -> None:
    world.submit(make_suite(tmp_path, n=5))
    rep = world.tick()
    assert len(rep.launched) == 3  # 2 on GPU 0 + 1 on GPU 1
    assert sorted(g for _, g, _ in rep.launched) == [0, 0, 1]
    waiting = world.store.jobs(states=["queued"])
    assert len(waiting) == 2 and all("slots busy" in (j.wait_reason or "") for j in waiting)
    assert world.tick().launched == []  # nothing frees, nothing launches


def test_a_backend_that_asks_is_told_of_its_attempts_as_they_are_reaped(world: World, tmp_path: Path) -> None:
    """The optional ``reaped(handles, queued)`` of a backend (tmux marks a pane that keeps its
    job on screen dead at the job's end, and a suite's idle panes once it has nothing queued)
    gets each tick's reaped attempts, once, with the suites that still have jobs queued after
    those reaps; one that fails costs the tick nothing."""
    told: list[tuple[list[str], set[str]]] = []

    class Told(FakeExecutor):
        def reaped(self, handles: list[dict[str, str]], queued: frozenset[str]) -> None:
            told.append(([h["token"] for h in handles], set(queued)))
            raise RuntimeError("a tmux hiccup")

    world.ex = Told(name="fake")
    world.sched = Scheduler(world.store, FakeProbe.from_spec("2x24GiB"), {"fake": world.ex})
    world.submit(make_suite(tmp_path, n=4))
    assert world.tick().reaped == []
    assert told == [([], {"E1"})]  # (the first tick tells every backend: panes a restart took back)
    first = [r.token for r in world.ex.launched]
    assert len(first) == 3
    world.ex.finish(first[0], exit_code=0)
    world.ex.finish(first[2], exit_code=3)
    rep = world.tick()
    assert len(rep.reaped) == 2 and len(rep.launched) == 1
    assert told[1:] == [([first[0], first[2]], {"E1"})]  # (its last job launched after the reaps)
    world.tick()
    assert len(told) == 2
    world.ex.finish(first[1], exit_code=0)
    world.tick()
    assert told[-1] == ([first[1]], set())  # nothing left queued, one job still running
    world.ex.finish(world.ex.launched[3].token, exit_code=1, output=OOM_TAIL)
    world.tick()
    assert told[-1][1] == {"E1"}  # requeued at the next tier by this very reap


def test_a_backend_that_asks_is_told_when_a_cancel_leaves_a_suite_with_nothing_queued(
    world: World, tmp_path: Path
) -> None:
    """A cancel (another connection's commit, as the CLI's is) of a suite's queued jobs reaps
    nothing, yet leaves that suite's idle tmux panes with nothing to run: the next tick tells
    each backend that asks, with no handles, which suites still have jobs queued."""
    told: list[tuple[list[str], set[str]]] = []

    class Told(FakeExecutor):
        def reaped(self, handles: list[dict[str, str]], queued: frozenset[str]) -> None:
            told.append(([h["token"] for h in handles], set(queued)))

    world.ex = Told(name="fake")
    world.sched = Scheduler(world.store, FakeProbe.from_spec("2x24GiB"), {"fake": world.ex})
    world.submit(make_suite(tmp_path, n=5))
    world.tick()
    assert told == [([], {"E1"})] and len(world.ex.launched) == 3
    world.tick()
    assert len(told) == 1  # nothing changed: nothing told
    cli = Store(world.store.path)
    assert set(cli.request_cancel(["E1/3-task", "E1/4-task"]).values()) == {"cancelled"}
    cli.close()
    world.tick()
    assert told[1:] == [([], set())]
    world.tick()
    assert len(told) == 2


def test_a_suite_submitted_again_mid_night_launches_its_next_jobs_as_now_planned(
    world: World, tmp_path: Path
) -> None:
    """The scheduler keeps each suite it launches from; the plan edited and submitted again
    while its first jobs run, the next launch is the new plan's, not the remembered one."""
    world.submit(make_suite(tmp_path, n=4))
    assert len(world.tick().launched) == 3
    edited = msgspec.structs.replace(
        make_suite(tmp_path, n=4), command="python train.py --epochs 2 --config {config}"
    )
    world.now += 1
    world.store.submit(edited, world.plan, backend="fake", cwd=str(tmp_path), env_path=None, now=world.now)
    world.ex.finish(world.ex.launched[0].token, exit_code=0)
    assert [job for job, _, _ in world.tick().launched] == ["E1/3-task"]
    _, command = read_launch(Path(world.ex.launched[-1].attempt_dir) / "launch.sh")
    assert "--epochs 2" in command


def test_a_long_suite_at_the_head_of_the_queue_does_not_keep_another_suites_card_idle(tmp_path: Path) -> None:
    """E1's 300 jobs may use GPU 0 only, E2's few GPU 1 only (each suite its own --gpu-plan).
    A tick places from the queue's first ``candidates`` jobs, all E1's: E2's jobs were never
    among them, and GPU 1 sat idle until E1 had fewer queued than that."""
    store = Store(tmp_path / "gs.db")
    ex = FakeExecutor(name="fake")
    sched = Scheduler(store, FakeProbe.from_spec("2x24GiB"), {"fake": ex}, settings=Settings(candidates=8))
    for name, n, slots in (("E1", 20, (1, 0)), ("E2", 3, (0, 1))):
        plan = GpuPlan(gpus=(0, 1), slots=slots)
        store.submit(
            make_suite(tmp_path, n=n, name=name), plan, backend="fake", cwd=str(tmp_path), env_path=None
        )
    launched = sched.tick(100.0).launched
    assert sorted((job.split("/")[0], gpu) for job, gpu, _ in launched) == [("E1", 0), ("E2", 1)]
    ex.finish(ex.token_of(next(j for j, g, _ in launched if g == 1)), exit_code=0)
    again = sched.tick(101.0).launched  # a refill reads the window again after its own writes
    assert [(job.split("/")[0], gpu) for job, gpu, _ in again] == [("E2", 1)]


def test_attempt_directory_holds_config_and_a_launch_script_with_env_and_command(
    world: World, tmp_path: Path
) -> None:
    world.submit(make_suite(tmp_path, n=1))
    world.tick()
    d = tmp_path / "logs" / "E1" / "0-task" / "1-A"
    cfg = (d / "config.yaml").read_text()
    assert cfg.startswith("# materialized by gpusched for E1/0-task, attempt 1, tier A")
    assert "batch_size: 8" in cfg and "seed: 0" in cfg
    env, command = read_launch(d / "launch.sh")
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == env["PYTORCH_ALLOC_CONF"] == "expandable_segments:True"
    assert env["GPUSCHED_JOB_ID"] == "E1/0-task" and env["GPUSCHED_TIER"] == "A"
    assert set(env) >= tiers.SET_PER_ATTEMPT  # what a plan may not set (it would be overwritten)
    assert command == f"python train.py --config {d / 'config.yaml'}"
    assert "export OMP_NUM_THREADS=1" in (d / "launch.sh").read_text()
    assert sorted(p.name for p in d.iterdir()) == ["config.yaml", "launch.sh"]  # before the wrapper runs


def test_a_freed_slot_is_refilled_on_the_next_tick(world: World, tmp_path: Path) -> None:
    world.submit(make_suite(tmp_path, n=4))
    first = world.tick()
    done = first.launched[0][0]
    world.ex.finish(world.ex.token_of(done), exit_code=0)
    rep = world.tick()
    assert rep.reaped == [(done, "ok")] and len(rep.launched) == 1
    assert world.state(done) is JobState.SUCCEEDED


def test_an_ended_attempt_s_folder_keeps_no_fifo(world: World, tmp_path: Path) -> None:
    """A tmux pane's wrapper tees the job's output through the attempt folder's FIFO, which
    the tmux executor makes at launch: once the attempt is reaped it goes, whatever the
    outcome, and with it any chance of a later reader blocking on it."""
    world.submit(make_suite(tmp_path, n=2))
    launched = [job for job, _, _ in world.tick().launched]
    fifos = {}
    for job in launched:
        (attempt,) = world.store.attempts(job)
        fifos[job] = Path(attempt.dir, ".output.pipe")
        os.mkfifo(fifos[job])  # as TmuxExecutor.launch makes it
    world.ex.finish(world.ex.token_of(launched[0]), exit_code=0)
    world.ex.finish(world.ex.token_of(launched[1]), exit_code=1)
    assert sorted(outcome for _, outcome in world.tick().reaped) == ["error", "ok"]
    assert not any(f.exists() for f in fifos.values())


def test_oom_walks_down_the_ladder_keeping_the_effective_batch_and_resumes(
    world: World, tmp_path: Path
) -> None:
    world.submit(make_suite(tmp_path, n=1))
    job = "E1/0-task"
    world.tick()
    (tmp_path / "out" / "0" / "checkpoint-10").mkdir(parents=True)  # the trainer saved one
    world.ex.finish(world.ex.token_of(job), exit_code=1, output=OOM_TAIL)
    world.tick()  # reap -> queued at B -> relaunched in the same tick
    rec = world.store.job(job)
    assert rec is not None and rec.outcome == "oom" and rec.attempts == 2
    world.ex.finish(world.ex.token_of(job), exit_code=1, output=OOM_TAIL)
    world.tick()
    d = tmp_path / "logs" / "E1" / "0-task" / "3-C"
    cfg = (d / "config.yaml").read_text()
    assert "batch_size: 4" in cfg and "gradient_accumulation_steps: 2" in cfg
    assert "gradient_checkpointing: true" in cfg and "is_keep_training: true" in cfg
    world.ex.finish(world.ex.token_of(job), exit_code=0)
    world.tick()
    rec = world.store.job(job)
    assert rec is not None and rec.state is JobState.SUCCEEDED and rec.tier == 2
    assert [a.tier_name for a in world.store.attempts(job)] == ["A", "B", "C"]
    assert [a.outcome for a in world.store.attempts(job)] == ["oom", "oom", "ok"]


def _checkpoint(tmp_path: Path, job: int, step: int, *, age_s: float = 0.0) -> Path:
    """A checkpoint the trainer saved in job ``job``'s output dir, ``age_s`` ago."""
    ck = tmp_path / "out" / str(job) / f"checkpoint-{step}"
    ck.mkdir(parents=True)
    if age_s:
        os.utime(ck, (time.time() - age_s, time.time() - age_s))
    return ck


def _config(tmp_path: Path, job: str, attempt: str) -> str:
    return (tmp_path / "logs" / "E1" / job / attempt / "config.yaml").read_text()


@pytest.mark.parametrize("path_key", [None, "resume_from_checkpoint"])
def test_a_checkpoint_from_before_the_job_was_submitted_is_not_resumed_from(
    world: World, tmp_path: Path, path_key: str | None
) -> None:
    """Last week's run of the same job left its output dir: a new queue's job starts over
    (resuming would end it at once on those weights). After an OOM, its own checkpoint is
    resumed from when gpusched can name it (path_key); with the flag alone the trainer picks,
    by step number as a rule, and last week's checkpoint-500 would beat this run's -10."""
    old = _checkpoint(tmp_path, 0, 500, age_s=7 * 86400)
    suite = make_suite(tmp_path, n=1)
    suite = msgspec.structs.replace(suite, resume=ResumeSpec(flag_key="is_keep_training", path_key=path_key))
    world.submit(suite)
    job = "E1/0-task"
    world.tick()
    cfg = _config(tmp_path, "0-task", "1-A")
    assert "is_keep_training" not in cfg and "resume_from_checkpoint" not in cfg
    assert f"# not resumed from {old}: older than this run of the job" in cfg
    mine = _checkpoint(tmp_path, 0, 10)  # this run's, then an OOM
    world.ex.finish(world.ex.token_of(job), exit_code=1, output=OOM_TAIL)
    world.tick()
    cfg = _config(tmp_path, "0-task", "2-B")
    if path_key:
        assert f"resume_from_checkpoint: {mine}" in cfg and "is_keep_training: true" in cfg
    else:
        assert "is_keep_training" not in cfg
        assert f"# not resumed from {mine}: beside {old}, the trainer might take that one" in cfg


def test_a_rerun_or_a_retry_of_a_success_starts_over_a_retry_of_a_failure_continues(
    world: World, tmp_path: Path
) -> None:
    suite = make_suite(tmp_path, n=2)
    submitted = time.time() - 3600  # an hour ago
    world.store.submit(suite, world.plan, backend="fake", cwd=str(tmp_path), env_path=None, now=submitted)
    world.tick()
    for i, code in ((0, 0), (1, 1)):  # 0-task succeeds, 1-task fails with a plain error
        _checkpoint(tmp_path, i, 100, age_s=60)  # saved a minute before the end
        world.ex.finish(world.ex.token_of(f"E1/{i}-task"), exit_code=code, output="ValueError: bad\n")
    world.tick()
    assert [world.state(f"E1/{i}-task") for i in (0, 1)] == [JobState.SUCCEEDED, JobState.FAILED]
    world.store.retry_many({"E1/0-task": None, "E1/1-task": None})
    world.tick()
    again, cont = _config(tmp_path, "0-task", "2-A"), _config(tmp_path, "1-task", "2-A")
    assert "is_keep_training" not in again and "# not resumed from" in again
    assert "is_keep_training: true" in cont and "resume from" in cont
    job = world.store.job("E1/0-task")
    assert job is not None and job.reason == "retried by user at tier index 0, from the start"
    for i in (0, 1):
        world.ex.finish(world.ex.token_of(f"E1/{i}-task"), exit_code=0)
    world.tick()
    world.store.submit(suite, world.plan, backend="fake", cwd=str(tmp_path), env_path=None, rerun=True)
    world.tick()
    for i in (0, 1):
        cfg = _config(tmp_path, f"{i}-task", "3-A")
        assert "is_keep_training" not in cfg and "# not resumed from" in cfg


def test_oom_past_the_last_tier_fails_with_the_reason(world: World, tmp_path: Path) -> None:
    world.submit(make_suite(tmp_path, n=1))
    job = "E1/0-task"
    for _ in range(3):
        world.tick()
        world.ex.finish(world.ex.token_of(job), exit_code=1, output=OOM_TAIL)
    world.tick()
    rec = world.store.job(job)
    assert rec is not None and rec.state is JobState.FAILED
    assert "last tier" in (rec.reason or "") and "CUDA out of memory" in (rec.line or "")


def test_a_plain_error_is_not_retried(world: World, tmp_path: Path) -> None:
    world.submit(make_suite(tmp_path, n=1))
    world.tick()
    world.ex.finish(world.ex.token_of("E1/0-task"), exit_code=1, output="ValueError: bad label\n")
    world.tick()
    rec = world.store.job("E1/0-task")
    assert rec is not None and rec.state is JobState.FAILED and rec.attempts == 1
    assert "ValueError: bad label" in (rec.reason or "") + (rec.line or "")


def test_cancel_terminates_the_running_attempt_and_ends_cancelled(world: World, tmp_path: Path) -> None:
    world.submit(make_suite(tmp_path, n=1))
    world.tick()
    world.store.request_cancel(["E1/0-task"])
    world.tick()  # sends SIGTERM (the fake ends the attempt with 143)
    world.tick()  # reaps it
    assert world.state("E1/0-task") is JobState.CANCELLED
    assert len(world.ex.terminated) == 1


def test_a_vanished_attempt_is_lost_and_requeued_at_the_same_tier(world: World, tmp_path: Path) -> None:
    world.submit(make_suite(tmp_path, n=1))
    world.tick()
    world.ex.vanish(world.ex.token_of("E1/0-task"))
    world.tick()
    attempts = world.store.attempts("E1/0-task")
    assert [a.outcome for a in attempts] == ["lost", None] and [a.tier for a in attempts] == [0, 0]


def test_restart_adopts_running_attempts_and_never_launches_twice(world: World, tmp_path: Path) -> None:
    world.submit(make_suite(tmp_path, n=3))
    world.tick()
    running = {r.token for r in world.ex.launched}
    # a new daemon: new Scheduler over the same store, the executor still holds the jobs
    again = Scheduler(world.store, FakeProbe.from_spec("2x24GiB"), {"fake": world.ex})
    notes = again.reconcile(world.now)
    assert sum("re-adopted" in n for n in notes) == 3
    again.tick(world.now + 1)
    assert {r.token for r in world.ex.launched} == running  # nothing launched again


def test_draining_stops_new_launches(world: World, tmp_path: Path) -> None:
    world.submit(make_suite(tmp_path, n=2))
    world.store.set_flag("draining", "1")  # (as a gpusched before `drain --at` wrote it: now)
    assert world.tick().launched == []
    world.store.set_flag("draining", None)
    assert len(world.tick().launched) == 2


def test_a_drain_at_a_time_launches_until_then_and_nothing_after(world: World, tmp_path: Path) -> None:
    """`drain --at 07:30`: the night goes on until the clock reads it; from then on a freed slot
    stays empty and the jobs left wait queued, while the running ones finish."""
    world.submit(make_suite(tmp_path, n=4))  # 3 slots
    world.store.set_flag("draining", repr(world.now + 10))
    assert len(world.tick().launched) == 3  # (at now + 1: before the drain)
    first = world.ex.launched[0].token
    world.now += 20
    world.ex.finish(first, exit_code=0)
    report = world.tick()
    assert report.reaped and report.launched == []
    assert world.state("E1/3-task") is JobState.QUEUED


def test_a_backend_that_cannot_be_made_fails_the_launch_not_the_tick(tmp_path: Path) -> None:
    """e.g. tmux missing: the job is requeued with a reason (and retried later), the tick goes on."""
    from gpusched.errors import ExecutorError

    class Broken(dict):  # type: ignore[type-arg]
        def __getitem__(self, name: str) -> object:
            raise ExecutorError("tmux is not on PATH: install it or use --backend subprocess")

    w = World(tmp_path, GpuPlan(gpus=(0, 1), slots=(1, 1)))
    w.sched = Scheduler(w.store, FakeProbe.from_spec("2x24GiB"), Broken())
    w.submit(make_suite(tmp_path, n=2))
    assert w.tick().launched == []
    for job in w.store.jobs():
        assert job.state is JobState.QUEUED and "launch failed" in (job.reason or "")
        assert job.not_before is not None and job.not_before > w.now


# --------------------------------------------------------------------------- the machine's faults


class _ShortOfSomething(FakeExecutor):
    """A backend whose launches fail with ``err`` while ``failing`` is set."""

    failing: OSError | None = None
    tried: int = 0

    def launch(self, req):  # type: ignore[no-untyped-def]
        self.tried += 1
        if self.failing is not None:
            raise type(self.failing)(*self.failing.args)
        return super().launch(req)


def _job(w: World, job_id: str):  # type: ignore[no-untyped-def]
    job = w.store.job(job_id)
    assert job is not None
    return job


def test_a_launch_failing_for_want_of_a_resource_pauses_launches_and_charges_no_job(tmp_path: Path) -> None:
    """Without this, three failed launches fail a job: a full disk or a process limit at 2 a.m.
    fails the whole queue within a minute, and it stays failed after the space is freed."""
    import errno

    from gpusched.disk import LAUNCH_WAIT_FLAG

    ex = _ShortOfSomething(name="fake", failing=OSError(errno.ENOSPC, "No space left on device"))
    w = World(tmp_path, GpuPlan(gpus=(0, 1), slots=(1, 1)))
    w.sched = Scheduler(w.store, FakeProbe.from_spec("2x24GiB"), {"fake": ex})
    w.submit(make_suite(tmp_path, n=3))
    for _ in range(12):  # a long outage: each try fails, launches pause 10, 20, 40, ... s between
        w.now += 400
        assert w.sched.tick(w.now).launched == []
    assert ex.tried == 2 * 12  # one try per free slot per pause, not one per tick
    for job_id in ("E1/0-task", "E1/1-task", "E1/2-task"):
        job = _job(w, job_id)
        assert job.state is JobState.QUEUED and job.lost == 0
    assert "not counted as lost" in (_job(w, "E1/0-task").reason or "")
    flag = w.store.flag(LAUNCH_WAIT_FLAG)
    assert flag is not None and "paused until" in flag and "No space left on device" in flag
    assert "paused until" in (_job(w, "E1/2-task").wait_reason or "")  # the job that never got a slot

    ex.tried = 0
    w.now += 1
    assert w.sched.tick(w.now).launched == []  # still paused: nothing tried
    assert ex.tried == 0
    ex.failing = None  # space freed
    w.now += 300
    assert len(w.sched.tick(w.now).launched) == 2
    assert w.store.flag(LAUNCH_WAIT_FLAG) is None


def test_the_pause_doubles_while_launches_keep_failing_and_starts_over_once_one_works(
    tmp_path: Path,
) -> None:
    import errno

    ex = _ShortOfSomething(name="fake", failing=OSError(errno.EAGAIN, "Resource temporarily unavailable"))
    w = World(tmp_path, GpuPlan(gpus=(0,), slots=(1,)), gpus="1x24GiB")
    w.sched = Scheduler(w.store, FakeProbe.from_spec("1x24GiB"), {"fake": ex})
    w.submit(make_suite(tmp_path, n=3))
    tries_at = []
    for t in range(0, 80):
        before = ex.tried
        w.sched.tick(1000.0 + t)
        if ex.tried > before:
            tries_at.append(t)
    assert tries_at == [0, 10, 30, 70]  # paused 10, 20, 40 s
    ex.failing = None
    w.sched.tick(1000.0 + 150)
    assert len(ex.launched) == 1
    ex.failing = OSError(errno.EAGAIN, "Resource temporarily unavailable")
    ex.finish(ex.launched[0].token, exit_code=0)
    w.sched.tick(1000.0 + 151)
    before = ex.tried
    w.sched.tick(1000.0 + 162)  # a failure after a launch that worked pauses 10 s again, not 80
    assert ex.tried == before + 1


def test_a_launch_failing_for_the_job_s_own_reasons_is_still_counted(tmp_path: Path) -> None:
    import errno

    ex = _ShortOfSomething(name="fake", failing=PermissionError(errno.EACCES, "Permission denied"))
    w = World(tmp_path, GpuPlan(gpus=(0,), slots=(1,)), gpus="1x24GiB")
    w.sched = Scheduler(w.store, FakeProbe.from_spec("1x24GiB"), {"fake": ex})
    w.submit(make_suite(tmp_path, n=1))
    w.sched.tick(100.0)
    job = _job(w, "E1/0-task")
    assert job.lost == 1 and "launch failed, retrying" in (job.reason or "")


def test_a_real_enospc_writing_the_attempt_directory_is_the_machine_s_fault(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel's own ENOSPC, from /dev/full, through the real attempt writer."""
    if not os.access("/dev/full", os.W_OK):
        pytest.fail("/dev/full is missing: this test needs a Linux /dev")
    w = World(tmp_path, GpuPlan(gpus=(0,), slots=(1,)), gpus="1x24GiB")
    suite = make_suite(tmp_path, n=1)
    w.submit(suite)
    first = Path(suite.logs_dir) / "0-task" / "1-A"
    real_mkdir = os.mkdir

    def mkdir(path: str | Path, *a: int, **kw: int) -> None:  # the attempt writer makes a new directory
        real_mkdir(path, *a, **kw)
        if Path(path) == first:
            (first / "config.yaml").symlink_to("/dev/full")  # every write to it: ENOSPC

    monkeypatch.setattr(os, "mkdir", mkdir)
    assert w.tick().launched == []
    job = _job(w, "E1/0-task")
    assert job.state is JobState.QUEUED and job.lost == 0 and job.attempts == 1
    assert "No space left on device" in (job.reason or "")
    w.now += 11
    assert [j for j, _, _ in w.sched.tick(w.now).launched] == ["E1/0-task"]  # attempt 2, in 2-A
    assert (Path(suite.logs_dir) / "0-task" / "2-A" / "config.yaml").is_file()


def test_a_suite_whose_working_directory_is_gone_waits_for_it_instead_of_failing_every_job(
    tmp_path: Path,
) -> None:
    """A project folder renamed, or a network mount that dropped, under a queued suite: each
    job failed at once at its `cd`, and the queue burnt through in a minute. Its launches now
    wait (status and the plan's notify say why), another suite's go on, and they start once
    the folder is back."""
    from gpusched.disk import LAUNCH_WAIT_FLAG

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    w = World(tmp_path, GpuPlan(gpus=(0, 1), slots=(1, 1)))
    gone, other = make_suite(tmp_path / "a", n=2, name="E1"), make_suite(tmp_path / "b", n=1, name="E2")
    w.submit(gone)
    w.submit(other)
    (tmp_path / "a").rename(tmp_path / "a-moved")
    assert [j for j, _, _ in w.tick().launched] == ["E2/0-task"]
    want = f"the working directory {tmp_path / 'a'} of E1 is gone (moved, deleted or unmounted)"
    want += ": its jobs wait for it"
    assert _job(w, "E1/0-task").wait_reason == want and _job(w, "E1/0-task").state is JobState.QUEUED
    assert w.store.flag(LAUNCH_WAIT_FLAG) == want
    (tmp_path / "a-moved").rename(tmp_path / "a")
    assert [j for j, _, _ in w.tick().launched] == ["E1/0-task"]
    assert w.store.flag(LAUNCH_WAIT_FLAG) is None


@pytest.mark.parametrize(
    ("died", "outcome"),
    [
        ("OSError: [Errno 28] No space left on device", "disk_full"),
        (
            "huggingface_hub.errors.HfHubHTTPError: 503 Server Error: Service Unavailable for url: x",
            "network",
        ),
    ],
)
def test_a_job_the_machine_failed_waits_and_runs_again_at_its_tier(
    tmp_path: Path, died: str, outcome: str
) -> None:
    """A night's checkpoints fill the disk at 3 a.m., and each running job dies at its next
    save; the model hub answers 503 for ten minutes, and the jobs that start then die loading
    the model. They failed for good (an error); now each waits five minutes, doubling, and
    runs again at its tier (resuming), not charged with an error; the other jobs run on."""
    w = World(tmp_path, GpuPlan(gpus=(0,), slots=(1,)))
    suite = make_suite(tmp_path, n=2)  # submitted on the world's clock: attempts count from then
    w.store.submit(suite, w.plan, backend="fake", cwd=str(tmp_path), env_path=None, now=w.now)
    w.tick()
    traceback = f"Traceback (most recent call last):\n{died}\n"
    w.ex.finish(w.ex.token_of("E1/0-task"), exit_code=1, output=traceback)
    tick = w.tick()
    assert tick.reaped == [("E1/0-task", outcome)] and [j for j, _, _ in tick.launched] == ["E1/1-task"]
    job = _job(w, "E1/0-task")
    assert (job.state, job.tier, job.errors, job.not_before) == (JobState.QUEUED, 0, 0, w.now + 300)
    w.ex.finish(w.ex.token_of("E1/1-task"), exit_code=0)
    w.tick()
    assert w.tick().launched == []  # its wait is not over
    waits = [300.0]
    for _ in range(3):  # it keeps failing so: 10, 20 minutes, then it gives up
        w.now += waits[-1]
        assert [j for j, _, _ in w.tick().launched] == ["E1/0-task"]
        w.ex.finish(w.ex.token_of("E1/0-task"), exit_code=1, output=traceback)
        w.tick()
        job = _job(w, "E1/0-task")
        waits.append((job.not_before or w.now) - w.now if job.state is JobState.QUEUED else 0)
    assert waits == [300, 600, 1200, 0] and job.state is JobState.FAILED and job.errors == 0
    w.store.retry_many({"E1/0-task": None}, now=w.now)  # the disk freed, the hub back: counted anew
    assert [j for j, _, _ in w.tick().launched] == ["E1/0-task"]
    w.ex.finish(w.ex.token_of("E1/0-task"), exit_code=1, output=traceback)
    w.tick()
    job = _job(w, "E1/0-task")
    assert job.state is JobState.QUEUED and "(1 of 3;" in (job.reason or "")


def test_a_suite_whose_script_a_checkout_took_away_waits_for_it(tmp_path: Path) -> None:
    """`git checkout` of a branch without the training script, at 1 a.m.: every job left would
    fail at its start. They wait queued instead, and start once the script is back."""
    from gpusched.disk import LAUNCH_WAIT_FLAG

    w = World(tmp_path, GpuPlan(gpus=(0,), slots=(1,)))
    w.submit(make_suite(tmp_path, n=2))
    assert [j for j, _, _ in w.tick().launched] == ["E1/0-task"]
    (tmp_path / "train.py").rename(tmp_path / "train.py.orig")
    w.ex.finish(w.ex.token_of("E1/0-task"), exit_code=0)
    tick = w.tick()
    assert tick.reaped == [("E1/0-task", "ok")] and tick.launched == []
    want = f"the script train.py of E1 is gone from {tmp_path} (a checkout, a rename?): its jobs wait for it"
    assert _job(w, "E1/1-task").wait_reason == want and w.store.flag(LAUNCH_WAIT_FLAG) == want
    (tmp_path / "train.py.orig").rename(tmp_path / "train.py")
    assert [j for j, _, _ in w.tick().launched] == ["E1/1-task"]


def test_launches_wait_while_a_suite_s_disk_is_low_and_status_says_which(tmp_path: Path) -> None:
    from gpusched.disk import LAUNCH_WAIT_FLAG, DiskFree

    free = {"mib": 300}

    def disk_free(path: str) -> DiskFree:
        return DiskFree(path=path, free_mib=free["mib"], total_mib=100_000, free_inodes=10**6)

    w = World(tmp_path, GpuPlan(gpus=(0, 1), slots=(1, 1)))
    w.sched = Scheduler(w.store, FakeProbe.from_spec("2x24GiB"), {"fake": w.ex}, disk_free=disk_free)
    suite = make_suite(tmp_path, n=2)
    w.submit(suite)
    assert w.tick().launched == []
    want = f"disk low: {suite.logs_dir} has 0.3 GiB free, launches wait for 1.0 GiB"
    assert _job(w, "E1/0-task").wait_reason == want
    assert w.store.flag(LAUNCH_WAIT_FLAG) == want
    free["mib"] = 5000
    assert len(w.tick().launched) == 2
    assert w.store.flag(LAUNCH_WAIT_FLAG) is None
