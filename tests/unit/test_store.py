"""The durable queue against a real SQLite file: transitions, two-phase launch, atomic submit."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import msgspec
import pytest
from msgspec.structs import asdict

from gpusched.errors import IllegalTransition, StoreError, UsageError
from gpusched.model import (
    AttemptState,
    Classification,
    ExitRecord,
    GpuPlan,
    JobSpec,
    JobState,
    Outcome,
    Step,
    StepKind,
    Suite,
    Tier,
)
from gpusched.store import SCHEMA_VERSION, Ending, JobRow, NewAttempt, Store

PLAN = GpuPlan(gpus=(0, 1), slots=(2, 1))


def make_suite(name: str = "E1", n: int = 3) -> Suite:
    return Suite(
        name=name,
        plan_path=f"/p/plans/{name}.yaml",
        workdir="/p",
        logs_dir=f"/p/logs/{name}",
        command="echo {config}",
        base_config=None,
        tiers=(Tier(name="A"), Tier(name="B", config={"gradient_checkpointing": True})),
        jobs=tuple(JobSpec(suite=name, name=f"j{i}", task="t", config={"seed": i}) for i in range(n)),
    )


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "gs.db")


def submit(store: Store, suite: Suite | None = None, **kw) -> object:  # type: ignore[no-untyped-def]
    return store.submit(suite or make_suite(), PLAN, backend="subprocess", cwd="/p", env_path=None, **kw)


def new_attempt(job_id: str, token: str, *, tier: int = 0, why: str = "test") -> NewAttempt:
    return NewAttempt(
        job_id=job_id,
        tier=tier,
        tier_name="AB"[tier],
        gpu=tier,
        gpu_uuid=None,
        backend="subprocess",
        dir=f"/p/logs/{token}",
        token=token,
        placement_reason=why,
    )


def start(store: Store, job_id: str, token: str = "t1", now: float = 1.0) -> int:
    return store.begin_attempt(new_attempt(job_id, token), now=now)


def end(
    store: Store, attempt_id: int, step: Step, *, outcome: Outcome = Outcome.OK, now: float = 3.0
) -> None:
    """Reap an attempt that exited 0 (OK) or 1 with ``outcome``, moving its job per ``step``."""
    code = 0 if outcome is Outcome.OK else 1
    result = Classification(outcome=outcome, reason=outcome.value)
    store.finish_attempt(attempt_id, exit=ExitRecord(exit_code=code), result=result, step=step, now=now)


def test_submit_queues_every_job_in_order_and_snapshots_the_suite(store: Store) -> None:
    r = submit(store)
    assert r.queued == ("E1/j0", "E1/j1", "E1/j2")
    assert [j.id for j in store.jobs(states=["queued"])] == list(r.queued)
    row = store.suite("E1")
    assert row is not None and row.gpu_plan == PLAN
    assert [t.name for t in row.suite.tiers] == ["A", "B"]
    assert row.suite.tiers[1].config == {"gradient_checkpointing": True}


def test_the_backends_in_use_are_those_of_the_submitted_suites(store: Store) -> None:
    """What the daemon starts its executors for, before its first tick."""
    assert store.backends() == set()
    submit(store, make_suite("E1"), now=1.0)
    store.submit(make_suite("E2"), PLAN, backend="tmux", cwd="/p", env_path=None, now=2.0)
    submit(store, make_suite("E3"), now=3.0)
    assert store.backends() == {"subprocess", "tmux"}
    assert store.suite_names() == ["E1", "E2", "E3"]  # oldest submission first: `report` takes the last


def test_resubmit_leaves_active_and_finished_jobs_alone_unless_rerun(store: Store) -> None:
    submit(store)
    a = start(store, "E1/j0")
    store.finish_attempt(
        a,
        exit=ExitRecord(exit_code=0),
        result=Classification(outcome=Outcome.OK, reason="ok"),
        step=Step(kind=StepKind.DONE, tier=0, reason="done"),
        now=2.0,
    )
    again = submit(store)
    assert again.queued == ()
    assert dict(again.skipped) == {"E1/j0": "succeeded", "E1/j1": "queued", "E1/j2": "queued"}
    rerun = submit(store, rerun=True)
    assert rerun.requeued == ("E1/j0",)
    job = store.job("E1/j0")
    assert job is not None and job.state is JobState.QUEUED and job.tier == 0 and job.attempts == 1


def test_resubmit_with_another_gpu_plan_replaces_it_and_says_what_it_was(store: Store) -> None:
    """Mid-night, a GPU is wanted back: the same suite submitted again with a new --gpu-plan
    places its queued jobs by that plan from now, and the submit says which plan it replaced."""
    assert submit(store).plan_before is None  # a new suite: nothing replaced
    assert submit(store).plan_before is None  # the same plan again: nothing changed
    narrower = GpuPlan(gpus=(0, 1), slots=(2, 0))
    r = store.submit(make_suite(), narrower, backend="subprocess", cwd="/p", env_path=None)
    assert r.plan_before == "2,1 on GPUs 0,1" and r.queued == () and r.backend_before is None
    row = store.suite("E1")
    assert row is not None and row.gpu_plan == narrower
    # and a new backend, which the queued jobs are launched with from now, says which it replaced
    r = store.submit(make_suite(), narrower, backend="tmux", cwd="/p", env_path=None)
    assert (r.plan_before, r.backend_before) == (None, "subprocess")
    row = store.suite("E1")
    assert row is not None and row.backend == "tmux"


def test_resubmit_of_an_edited_plan_updates_the_queued_jobs_only(store: Store) -> None:
    """A typo fixed in the plan and the suite submitted again: the jobs still queued take the
    edit (the suite's own settings always did, a job's config did not); a running job keeps
    what it was launched with."""
    submit(store)
    start(store, "E1/j0")
    assert submit(store).updated == ()  # the same plan: nothing to update
    edited = make_suite()
    edited = msgspec.structs.replace(
        edited, jobs=tuple(msgspec.structs.replace(j, config={**j.config, "lr": 2e-5}) for j in edited.jobs)
    )
    r = store.submit(edited, PLAN, backend="subprocess", cwd="/p", env_path=None)
    assert r.updated == ("E1/j1", "E1/j2") and r.queued == ()
    for job_id, lr in (("E1/j0", None), ("E1/j1", 2e-5), ("E1/j2", 2e-5)):
        job = store.job(job_id)
        assert job is not None and job.spec.config.get("lr") == lr, job_id


def test_cancel_queued_only_leaves_a_job_that_started_meanwhile_running(store: Store) -> None:
    """`cancel --queued` read j0 queued, the daemon launched it before the cancel: it is left
    to finish (not SIGTERMed), and the answer says so."""
    submit(store)
    start(store, "E1/j0")
    said = store.request_cancel(["E1/j0", "E1/j1"], queued_only=True)
    assert said == {"E1/j0": "started meanwhile, left to finish", "E1/j1": "cancelled"}
    j0 = store.job("E1/j0")
    assert j0 is not None and j0.state is JobState.RUNNING and not j0.cancel_requested


def test_same_suite_name_from_another_directory_is_refused_while_active(store: Store) -> None:
    submit(store)
    with pytest.raises(UsageError, match="already active from /p"):
        store.submit(make_suite(), PLAN, backend="subprocess", cwd="/elsewhere", env_path=None)


def test_same_suite_name_from_another_directory_once_finished_says_where_it_ran(store: Store) -> None:
    submit(store)
    store.request_cancel(["E1/j0", "E1/j1", "E1/j2"])
    assert submit(store).moved_from is None  # the same directory
    r = store.submit(make_suite(), PLAN, backend="subprocess", cwd="/elsewhere", env_path=None)
    assert r.moved_from == "/p" and r.queued == () and len(r.skipped) == 3


def test_two_phase_launch_records_the_attempt_before_the_process_exists(store: Store) -> None:
    submit(store)
    aid = start(store, "E1/j1", token="tok")
    job = store.job("E1/j1")
    assert job is not None and job.state is JobState.RUNNING and job.attempts == 1
    a = store.attempt(aid)
    assert a is not None and a.state is AttemptState.LAUNCHING and a.token == "tok" and a.handle is None
    store.mark_running(aid, {"pid": 42}, now=2.0)
    a = store.attempt(aid)
    assert a is not None and a.state is AttemptState.RUNNING and a.handle == {"pid": 42}
    assert [x.id for x in store.live_attempts()] == [aid]


def test_a_batch_commits_together_and_a_failing_job_inside_it_is_undone_alone(store: Store) -> None:
    """The daemon records a tick's launches in one transaction; a job that cannot be
    launched (cancelled meanwhile) takes back only its own change."""
    submit(store)
    store.request_cancel(["E1/j1"])
    with store.tx():
        a0 = start(store, "E1/j0", token="t0")
        with pytest.raises(IllegalTransition):
            start(store, "E1/j1", token="t1")  # cancelled: refused, and nothing of it is kept
        a2 = start(store, "E1/j2", token="t2")
        assert Store(store.path, readonly=True).job("E1/j0").state is JobState.QUEUED  # not yet committed
    states = {j.name: j.state for j in store.jobs()}
    assert states == {"j0": JobState.RUNNING, "j1": JobState.CANCELLED, "j2": JobState.RUNNING}
    assert [a.id for a in store.live_attempts()] == [a0, a2]


def test_live_attempts_show_every_change_and_decode_only_rows_that_moved(store: Store) -> None:
    """The daemon reads the live attempts every tick; one whose row is as it was is the same
    object (not decoded again), and any change to a row shows at the next read."""
    submit(store)
    a0, a1 = start(store, "E1/j0", token="t0"), start(store, "E1/j1", token="t1")
    first = {a.id: a for a in store.live_attempts()}
    store.mark_running(a1, {"pid": 7}, now=2.0)
    second = {a.id: a for a in store.live_attempts()}
    assert second[a0] is first[a0]
    assert second[a1].state is AttemptState.RUNNING and second[a1].handle == {"pid": 7}
    store.set_peak(a0, 5000)
    store.set_handle(a1, {"pid": 8})
    third = {a.id: a for a in store.live_attempts()}
    assert third[a0].peak_mib == 5000 and third[a1].handle == {"pid": 8}
    end(store, a0, Step(kind=StepKind.DONE, tier=0, reason="done"))
    assert [a.id for a in store.live_attempts()] == [a1]


def test_a_tick_s_launches_begin_together_and_one_that_cannot_leaves_the_others(store: Store) -> None:
    """``begin_attempts``, the daemon's phase 1 for a whole tick: each job that can take its
    attempt does, numbered and logged as one at a time would be; a job cancelled since the tick
    read the queue, one that is gone, and a job asked for twice get why instead, and nothing."""
    submit(store, make_suite(n=4))
    done = start(store, "E1/j3", token="before")  # its second attempt is numbered 2
    end(store, done, Step(kind=StepKind.REQUEUE, tier=1, reason="OOM -> tier B"), outcome=Outcome.OOM)
    store.request_cancel(["E1/j1"])
    got = store.begin_attempts(
        [
            new_attempt("E1/j0", "t0", tier=1, why="placed t0"),
            new_attempt("E1/j1", "t1", tier=1, why="placed t1"),
            new_attempt("E1/nope", "t2", tier=1, why="placed t2"),
            new_attempt("E1/j3", "t3", tier=1, why="placed t3"),
            new_attempt("E1/j0", "t4", tier=1, why="placed t4"),
            new_attempt("E1/j2", "t5", tier=1, why="placed t5"),
        ],
        now=5.0,
    )
    errors = [str(e) for e in got if isinstance(e, Exception)]
    assert errors == [
        "job E1/j1: illegal state change cancelled -> running",
        "no job E1/nope",
        "job E1/j0: illegal state change running -> running",
    ]
    ids = {a.token: a.id for a in store.live_attempts()}
    assert got[0] == ids["t0"] and got[3] == ids["t3"] and got[5] == ids["t5"] and len(ids) == 3
    for token, job_id, n in (("t0", "E1/j0", 1), ("t3", "E1/j3", 2), ("t5", "E1/j2", 1)):
        a, job = store.attempt(ids[token]), store.job(job_id)
        assert a is not None and job is not None
        assert (a.job_id, a.n, a.state, a.tier, a.gpu, a.launched_at) == (
            job_id,
            n,
            AttemptState.LAUNCHING,
            1,
            1,
            5.0,
        )
        assert (job.state, job.attempts, job.tier) == (JobState.RUNNING, n, 1)
    assert store.job("E1/j1").state is JobState.CANCELLED
    launches = [
        m
        for _, job_id, kind, m in store.db.execute("SELECT at, job_id, kind, message FROM events")
        if kind == "launch"
    ]
    assert launches[-3:] == [
        "attempt 1 at tier B on GPU 1: placed t0",
        "attempt 2 at tier B on GPU 1: placed t3",
        "attempt 1 at tier B on GPU 1: placed t5",
    ]


def ending(
    attempt_id: int, step: Step, *, outcome: Outcome = Outcome.OK, job: JobRow | None = None
) -> Ending:
    code = 0 if outcome is Outcome.OK else 1
    result = Classification(outcome=outcome, reason=outcome.value)
    return Ending(attempt_id=attempt_id, exit=ExitRecord(exit_code=code), result=result, step=step, job=job)


def test_a_tick_s_reaps_end_together_each_as_one_at_a_time_would(store: Store) -> None:
    """``finish_attempts``, the daemon's reaps of a whole tick: each attempt recorded ended and
    its job moved per its own step (done, requeued with an error counted, failed), with its
    event, whether the caller passed the job it read or not; an attempt reaped already (a
    restarted daemon's second look), or twice in the batch, is left as it is."""
    submit(store, make_suite(n=4))
    ids = [start(store, f"E1/j{i}", token=f"t{i}") for i in range(4)]
    end(store, ids[3], Step(kind=StepKind.DONE, tier=0, reason="done before"))
    done = Step(kind=StepKind.DONE, tier=0, reason="done")
    retry = Step(kind=StepKind.REQUEUE, tier=0, reason="error -> retried", not_before=60.0)
    fail = Step(kind=StepKind.FAIL, tier=0, reason="error -> failed")
    got = store.finish_attempts(
        [
            ending(ids[0], done, job=store.job("E1/j0")),
            ending(ids[1], retry, outcome=Outcome.ERROR),
            ending(ids[3], fail, outcome=Outcome.ERROR),
            ending(ids[2], fail, outcome=Outcome.ERROR),
            ending(ids[1], fail, outcome=Outcome.ERROR),
        ],
        now=9.0,
    )
    assert got == [True, True, False, True, False]
    jobs = {j: store.job(f"E1/{j}") for j in ("j0", "j1", "j2", "j3")}
    assert {j: (r.state, r.errors, r.reason) for j, r in jobs.items() if r is not None} == {
        "j0": (JobState.SUCCEEDED, 0, "done"),
        "j1": (JobState.QUEUED, 1, "error -> retried"),
        "j2": (JobState.FAILED, 1, "error -> failed"),
        "j3": (JobState.SUCCEEDED, 0, "done before"),
    }
    assert jobs["j1"].not_before == 60.0 and jobs["j0"].ended_at == 9.0  # type: ignore[union-attr]
    attempts = {a: store.attempt(a) for a in ids}
    assert [(a.state, a.outcome, a.ended_at) for a in attempts.values() if a is not None] == [
        (AttemptState.EXITED, Outcome.OK, 9.0),
        (AttemptState.EXITED, Outcome.ERROR, 9.0),
        (AttemptState.EXITED, Outcome.ERROR, 9.0),
        (AttemptState.EXITED, Outcome.OK, 3.0),
    ]
    events = [
        (j, k, m) for j, k, m in store.db.execute("SELECT job_id, kind, message FROM events WHERE at = 9.0")
    ]
    assert events == [
        ("E1/j0", "done", "done"),
        ("E1/j1", "requeue", "error -> retried"),
        ("E1/j2", "fail", "error -> failed"),
    ]
    assert list(store.exited)[-3:] == [ids[0], ids[1], ids[2]]


def test_a_tick_s_reaps_are_undone_together_when_a_job_moved_meanwhile(store: Store) -> None:
    """A job the caller read running that moved since (its view is stale): nothing of the
    batch is recorded, so the tick that read it tries again from what is true."""
    submit(store)
    a0, a1 = start(store, "E1/j0", token="t0"), start(store, "E1/j1", token="t1")
    stale = store.job("E1/j1")
    end(store, a1, Step(kind=StepKind.REQUEUE, tier=0, reason="lost -> requeued"), outcome=Outcome.LOST)
    store.db.execute("UPDATE attempts SET state = 'running' WHERE id = ?", (a1,))  # as if not reaped
    done = Step(kind=StepKind.DONE, tier=0, reason="done")
    with pytest.raises(UsageError, match="changed state meanwhile"):
        store.finish_attempts([ending(a0, done), ending(a1, done, job=stale)], now=9.0)
    assert store.job("E1/j0").state is JobState.RUNNING  # type: ignore[union-attr]
    assert store.attempt(a0).state is AttemptState.LAUNCHING  # type: ignore[union-attr]
    assert 9.0 not in [at for (at,) in store.db.execute("SELECT at FROM events")]


def test_oom_requeue_moves_the_job_back_to_queued_at_the_next_tier(store: Store) -> None:
    submit(store)
    aid = start(store, "E1/j0")
    store.finish_attempt(
        aid,
        exit=ExitRecord(exit_code=1, peak_mib=20000),
        result=Classification(
            outcome=Outcome.OOM, reason="CUDA out of memory", line="torch.OutOfMemoryError: x"
        ),
        step=Step(kind=StepKind.REQUEUE, tier=1, reason="OOM at tier A -> requeued at tier B", avoid_gpu=0),
        now=3.0,
    )
    job = store.job("E1/j0")
    assert job is not None
    assert (job.state, job.tier, job.outcome, job.avoid_gpu) == (JobState.QUEUED, 1, "oom", 0)
    a = store.attempt(aid)
    assert a is not None and a.state is AttemptState.EXITED and a.peak_mib == 20000
    assert store.live_attempts() == []
    # reaping twice (a restarted daemon) changes nothing
    store.finish_attempt(
        aid,
        exit=None,
        result=Classification(outcome=Outcome.LOST, reason="x"),
        step=Step(kind=StepKind.FAIL, tier=0, reason="x"),
        now=4.0,
    )
    job2 = store.job("E1/j0")
    assert job2 is not None and job2.state is JobState.QUEUED


def test_cancel_ends_queued_jobs_at_once_and_flags_running_ones(store: Store) -> None:
    submit(store)
    start(store, "E1/j0")
    out = store.request_cancel(["E1/j0", "E1/j1"])
    assert out == {"E1/j0": "stopping", "E1/j1": "cancelled"}
    assert store.cancel_requested() == ["E1/j0"]
    job = store.job("E1/j1")
    assert job is not None and job.state is JobState.CANCELLED


def test_illegal_transitions_are_refused_and_name_the_job(store: Store) -> None:
    submit(store)
    aid = start(store, "E1/j0")
    store.finish_attempt(
        aid,
        exit=ExitRecord(exit_code=0),
        result=Classification(outcome=Outcome.OK, reason="ok"),
        step=Step(kind=StepKind.DONE, tier=0, reason="done"),
        now=2.0,
    )
    with pytest.raises(IllegalTransition, match="E1/j0: illegal state change succeeded -> running"):
        start(store, "E1/j0", token="t2")


def test_retry_requeues_only_finished_jobs(store: Store) -> None:
    submit(store)
    with pytest.raises(UsageError, match="only finished jobs"):
        store.retry("E1/j0", tier=None)
    store.request_cancel(["E1/j0"])
    job = store.retry("E1/j0", tier=1)
    assert job.state is JobState.QUEUED and job.tier == 1


def test_a_failed_submit_leaves_nothing_half_enqueued(store: Store) -> None:
    bad = make_suite()
    dup = Suite(**{**asdict(bad), "jobs": (*bad.jobs, bad.jobs[0])})  # duplicate id -> UNIQUE violation
    with pytest.raises(sqlite3.IntegrityError):
        submit(store, dup)
    assert store.jobs() == [] and store.suite("E1") is None


def test_a_database_from_a_newer_gpusched_is_refused_clearly(tmp_path: Path) -> None:
    s = Store(tmp_path / "gs.db")
    s.db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    s.close()
    with pytest.raises(StoreError, match="newer gpusched"):
        Store(tmp_path / "gs.db")


@pytest.mark.parametrize("readonly", [False, True])
def test_a_damaged_database_is_one_line_that_says_what_to_do(tmp_path: Path, readonly: bool) -> None:
    """A file that is not a database (a disk that lost it, a copy cut short) stopped `submit`
    and the daemon with a traceback; every command now says which file and how to go on."""
    path = tmp_path / "gs.db"
    path.write_bytes(bytes(range(256)) * 40)
    with pytest.raises(StoreError) as err:
        Store(path, readonly=readonly)
    assert f"cannot read the state database {path}: file is not a database" in str(err.value)
    assert f"mv {path} {path}.damaged" in str(err.value)


def test_schema_v1_database_from_tests_data_still_opens() -> None:
    src = Path(__file__).resolve().parent.parent / "data" / "store-v1.db"
    assert src.exists(), "keep one database per schema version in tests/data"
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        shutil.copy(src, Path(d) / "gs.db")
        s = Store(Path(d) / "gs.db")
        jobs = s.jobs()
        assert jobs and all(j.state in set(JobState) for j in jobs)
        assert s.suite(jobs[0].suite) is not None


def test_an_older_gpusched_s_indexes_are_made_again_as_this_one_defines_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stop 38 made the queue's indexes and the live attempts' partial (they hold the queued
    jobs, the live attempts, only) and dropped jobs_state and attempts_job (a copy of the
    index of UNIQUE(job_id, n)). A database an older gpusched wrote
    keeps its jobs and gets exactly this version's indexes on its next read-write open, in one
    transaction; an up-to-date one is only read (no index dropped or made)."""
    from gpusched.model import GpuPlan
    from gpusched.schema import INDEXES
    from tests.unit.test_scheduler import make_suite

    path = tmp_path / "gs.db"
    store = Store(path)
    store.submit(
        make_suite(tmp_path, n=5), GpuPlan(gpus=(0,), slots=(1,)), backend="fake", cwd=".", env_path=None
    )
    store.db.executescript(  # the definitions of stop 37
        "DROP INDEX jobs_queued; DROP INDEX jobs_queue; DROP INDEX attempts_state;"
        " CREATE INDEX jobs_state ON jobs(state);"
        " CREATE INDEX jobs_queue ON jobs(state, priority DESC, seq);"
        " CREATE INDEX attempts_state ON attempts(state);"
        " CREATE INDEX attempts_job ON attempts(job_id, n);"
    )
    store.db.close()

    def indexes(s: Store) -> dict[str, str]:
        q = "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL"
        return dict(s.db.execute(q).fetchall())

    again = Store(path)
    assert indexes(again) == INDEXES
    assert [j.id for j in again.jobs(states=["queued"])] == [f"E1/{i}-task" for i in range(5)]
    sent: list[str] = []
    real = sqlite3.connect

    def traced(*args, **kwargs):  # type: ignore[no-untyped-def]
        db = real(*args, **kwargs)
        db.set_trace_callback(sent.append)
        return db

    monkeypatch.setattr(sqlite3, "connect", traced)
    third = Store(path)  # the next open, traced from its first statement
    renewed = [
        s for s in sent if s.startswith("DROP") or (s.startswith("CREATE INDEX") and "IF NOT EXISTS" not in s)
    ]
    assert sent and renewed == []
    assert indexes(third) == INDEXES


def test_an_sqlite_too_old_for_the_store_is_one_clear_line_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Python linked with an SQLite before 3.24 (no UPSERT: pyenv on CentOS 7 has 3.7.17)
    gets one line naming both versions and the way out, exit 2, and no database file."""
    monkeypatch.setattr(sqlite3, "sqlite_version_info", (3, 7, 17))
    refused_in_one_line(
        tmp_path,
        monkeypatch,
        capsys,
        match=r"needs SQLite 3\.24\.0 or later.*uses SQLite 3\.7\.17",
        says="needs SQLite 3.24.0 or later",
    )


def refused_in_one_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    *,
    match: str,
    says: str,
) -> None:
    """Opening a store raises ``match``, writing no file, and ``gpusched status`` says ``says``
    in one line on stderr, no traceback, exit 2, and leaves no database in its home either."""
    from gpusched.cli import main

    home = tmp_path / "home"
    monkeypatch.setenv("GPUSCHED_HOME", str(home))
    with pytest.raises(StoreError, match=match):
        Store(tmp_path / "x.db")
    assert not (tmp_path / "x.db").exists()
    assert main(["status"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0] and "Traceback" not in err[0]
    assert not (home / "gpusched.db").exists()


def test_an_sqlite_without_json_functions_is_one_clear_line_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An SQLite before 3.38 built without its JSON functions (an option then) would let the
    daemon start and fail at its first prediction or a suite's end; it gets one line when the
    store opens, exit 2, and no database file. (The probe itself answers yes in every other test.)"""
    from gpusched import store as store_module

    assert store_module._json_functions()  # this machine's SQLite has them
    monkeypatch.setattr(store_module, "_json_functions", lambda: False)
    refused_in_one_line(
        tmp_path,
        monkeypatch,
        capsys,
        match=r"needs SQLite's JSON functions.*SQLite 3\.38 or later",
        says="needs SQLite's JSON functions",
    )


def test_no_index_is_written_twice_at_each_change(tmp_path: Path) -> None:
    """Every index costs each insert and each move of a row that it holds: no two indexes of a
    table hold the same columns over the same rows (``attempts_job`` did: SQLite already keeps
    the index of ``UNIQUE(job_id, n)``)."""
    store = Store(tmp_path / "gs.db")
    tables = [r[0] for r in store.db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    for table in tables:
        seen: dict[tuple[object, ...], str] = {}
        for index in store.db.execute(f"PRAGMA index_list({table})").fetchall():
            name, partial = index["name"], index["partial"]
            cols = tuple(r["name"] for r in store.db.execute(f"PRAGMA index_info({name})"))
            where = store.db.execute("SELECT sql FROM sqlite_master WHERE name = ?", (name,)).fetchone()
            key = (cols, where[0].partition(" WHERE ")[2] if partial and where else "")
            assert key not in seen, f"{table}: {name} holds what {seen[key]} holds"
            seen[key] = name
