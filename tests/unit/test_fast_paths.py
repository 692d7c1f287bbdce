"""The shortcuts that keep a tick cheap with a long queue decide exactly what the slow path
would: placement's reuse of a wait reason for jobs it cannot tell apart, and the job rows
that decode their spec only when asked."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from msgspec.structs import replace

from gpusched import codec
from gpusched.model import Placement, Tier, Wait
from gpusched.placement import (
    GUESS_PATIENCE_S,
    Decision,
    GpuSlotView,
    QueuedJob,
    alone_on,
    assign,
    fallback_note,
    job_order,
    memory_bound,
    occupy,
    place_one,
)

GIB = 1024
LADDERS = (
    (Tier(name="A"), Tier(name="B", min_free_mib=12 * GIB), Tier(name="D", exclusive=True)),
    (Tier(name="A"), Tier(name="C", min_free_mib=4 * GIB)),
)


def assign_one_by_one(queued: list[QueuedJob], gpus: list[GpuSlotView], headroom_frac: float) -> Decision:
    """placement.assign without the shortcut: every job checked against every card, in two
    passes (own tier, not on an empty card it would take alone, or a starved job's slower
    tiers; then own tier on every card for a job kept off one unless its peak is a guess that
    waits, and one tier down)."""
    views = {g.index: g for g in sorted(gpus, key=lambda g: g.index)}
    placements: list[Placement] = []
    first: list[tuple[QueuedJob, Wait]] = []

    def empty_alone(job: QueuedJob) -> list[int]:
        """The empty cards the second pass keeps ``job`` off for jobs that share them."""
        if not any(g.running for g in views.values()):
            return []
        return [
            g.index
            for g in sorted(views.values(), key=lambda g: g.index)
            if alone_on(job, g, headroom_frac) and (g.empty_s or 0.0) < GUESS_PATIENCE_S
        ]

    def note(wait: Wait, cards: list[int], why: str) -> Wait:
        which = f"GPUs {','.join(map(str, cards))} are" if len(cards) > 1 else f"GPU {cards[0]} is"
        return replace(wait, reason=f"{wait.reason}; {which} left to jobs known to share them {why}")

    def attempt(
        job: QueuedJob, tiers: tuple[tuple[int, int | None], ...], kept: list[int] | None = None
    ) -> bool:
        if not tiers or not memory_bound(job, list(views.values()), headroom_frac):
            return False
        for tier, predicted in tiers:
            lower = replace(job, tier=tier, predicted_mib=predicted, fallback=(), pack_now=False)
            cards = list(views.values())
            if kept is not None and tier in job.guessed_below and (left := empty_alone(lower)):
                kept.extend(i for i in left if i not in kept)
                cards = [g for g in cards if g.index not in left]
            fell = place_one(lower, cards, headroom_frac)
            if isinstance(fell, Placement):
                placements.append(replace(fell, reason=f"{fallback_note(job, lower)}; {fell.reason}"))
                views[fell.gpu] = occupy(views[fell.gpu], lower)  # type: ignore[index]
                return True
        return False

    def own(job: QueuedJob, cards: list[GpuSlotView]) -> Placement | Wait:
        outcome = place_one(job, cards, headroom_frac)
        if isinstance(outcome, Placement):
            placements.append(outcome)
            if outcome.gpu is not None:
                views[outcome.gpu] = occupy(views[outcome.gpu], job)
        return outcome

    spared = set()  # kept off an empty card they would take alone, in the first pass
    for job in sorted(queued, key=job_order):
        if any(alone_on(job, g, headroom_frac) for g in views.values()):
            spared.add(job.job_id)
        shared = [g for g in views.values() if not alone_on(job, g, headroom_frac)]
        outcome = own(job, shared)
        if not isinstance(outcome, Placement) and not (job.pack_now and attempt(job, job.fallback)):
            first.append((job, outcome))
    waits = []
    for job, wait in first:
        if job.job_id in spared and job.guessed and not job.pack_now and empty_alone(job):
            wait = note(wait, empty_alone(job), "while its peak is a guess")
        elif job.job_id in spared:  # the second pass: its own tier on every card, then one down
            outcome = own(job, list(views.values()))
            if isinstance(outcome, Placement):
                continue
            wait = outcome
        if job.pack_now:
            waits.append(wait)
            continue
        kept: list[int] = []
        if not attempt(job, job.fallback[:1], kept):
            waits.append(note(wait, kept, "while its peak at a slower tier is a guess") if kept else wait)
    return Decision(placements=tuple(placements), waits=tuple(waits))


@st.composite
def queues(draw: st.DrawFn) -> list[QueuedJob]:
    """Many jobs of few kinds (as a suite's are), so that waits repeat."""
    kinds = draw(
        st.lists(
            st.tuples(
                st.integers(0, len(LADDERS) - 1),
                st.integers(0, 2),
                st.dictionaries(st.integers(0, 3), st.integers(0, 2), max_size=4),
            ),
            min_size=1,
            max_size=3,
        )
    )
    count = draw(st.integers(0, 25))
    jobs = []
    for seq in range(count):
        ladder, tier, allowed = kinds[draw(st.integers(0, len(kinds) - 1))]
        jobs.append(
            QueuedJob(
                job_id=f"j{seq}",
                seq=seq,
                priority=draw(st.integers(0, 1)),
                tier=tier,
                tiers=LADDERS[ladder],
                allowed=allowed,
                predicted_mib=draw(st.sampled_from([None, 0, 6 * GIB, 20 * GIB])),
                avoid_gpu=draw(st.none() | st.integers(0, 3)),
                fallback=tuple(
                    (t, draw(st.sampled_from([None, 4 * GIB, 10 * GIB])))
                    for t in range(tier + 1, len(LADDERS[ladder]))
                )[: draw(st.integers(0, 2))],
                pack_now=draw(st.booleans()),
                guessed=draw(st.booleans()),
                guessed_below=frozenset(draw(st.lists(st.integers(1, 2), max_size=2))),
            )
        )
    return jobs


@st.composite
def cards(draw: st.DrawFn) -> list[GpuSlotView]:
    views = []
    for index in range(draw(st.integers(0, 4))):
        total = draw(st.none() | st.integers(1, 40 * GIB))
        running = draw(st.integers(0, 2))
        views.append(
            GpuSlotView(
                index=index,
                running=running,
                exclusive_running=running > 0 and draw(st.booleans()),
                free_mib=draw(st.none() | st.integers(0, total or 40 * GIB)),
                total_mib=total,
                reserved_mib=draw(st.integers(0, 4 * GIB)),
                held_for=draw(st.none() | st.sampled_from(["j0", "j3", "j7"])),
                empty_s=draw(st.none() | st.sampled_from([0.0, 2 * GUESS_PATIENCE_S]))
                if running == 0
                else 0.0,
            )
        )
    return views


def _guessed_pair() -> list[QueuedJob]:
    """Two jobs of one kind whose own tier and slower tier are both guesses, kept off the one
    empty card (hypothesis found it: the second waited without the slower tier's note). Their
    plan's slots are one map, as a suite's jobs share it: what makes them one kind."""
    allowed = {0: 0, 1: 2}
    return [
        QueuedJob(
            job_id=f"j{seq}",
            seq=seq,
            priority=0,
            tier=0,
            tiers=LADDERS[0],
            allowed=allowed,
            predicted_mib=6 * GIB,
            fallback=((1, 4 * GIB),),
            guessed=True,
            guessed_below=frozenset({1}),
        )
        for seq in (0, 1)
    ]


@settings(max_examples=300, deadline=None)
@given(queues(), cards(), st.sampled_from([0.0, 0.1, 0.2]))
@example(
    _guessed_pair(),
    [
        GpuSlotView(index=0, running=1, free_mib=None, total_mib=None, reserved_mib=0, empty_s=0.0),
        GpuSlotView(index=1, running=0, free_mib=0, total_mib=None, reserved_mib=0),
    ],
    0.0,
)
def test_assign_decides_as_if_it_checked_every_job(
    queued: list[QueuedJob], gpus: list[GpuSlotView], headroom: float
) -> None:
    assert assign(queued, gpus, headroom_frac=headroom) == assign_one_by_one(queued, gpus, headroom)


def test_a_job_row_decodes_its_spec_on_first_use_only(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from gpusched.store import Store
    from tests.unit.test_scheduler import make_suite

    suite = make_suite(tmp_path, n=2)
    store = Store(tmp_path / "db.sqlite")
    from gpusched.model import GpuPlan

    store.submit(suite, GpuPlan(gpus=(0,), slots=(1,)), backend="fake", cwd=str(tmp_path), env_path=None)
    row = store.jobs()[0]
    assert "spec" not in vars(row)  # not decoded by reading the row
    assert row.spec == codec.job_from_json(row.spec_json) == suite.jobs[0]
    assert row.spec is row.spec  # decoded once
    assert json.loads(row.spec_json)["name"] == suite.jobs[0].name


class _LazyExecutors(dict):  # type: ignore[type-arg]
    """Like the daemon's mapping: a backend exists only once something asks for it."""

    def __missing__(self, name: str):  # type: ignore[no-untyped-def]
        from gpusched.executors.fake import FakeExecutor

        self[name] = FakeExecutor(name=name)
        return self[name]

    def get(self, name, default=None):  # type: ignore[no-untyped-def]
        return self[name]


def test_a_backend_first_used_after_the_scheduler_started_launches(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`gpusched daemon start`, then a submit: the scheduler must not freeze the daemon's
    (then empty) mapping of backends."""
    from gpusched.gpus.fake import FakeProbe
    from gpusched.model import GpuPlan
    from gpusched.scheduler import Scheduler
    from gpusched.store import Store
    from tests.unit.test_scheduler import make_suite

    store = Store(tmp_path / "db.sqlite")
    sched = Scheduler(store, FakeProbe.from_spec("1x24GiB"), _LazyExecutors())
    store.submit(
        make_suite(tmp_path, n=1),
        GpuPlan(gpus=(0,), slots=(1,)),
        backend="fake",
        cwd=str(tmp_path),
        env_path=None,
    )
    assert [j for j, _, _ in sched.tick(100.0).launched] == ["E1/0-task"]


def test_a_suite_submitted_again_is_seen_by_the_next_tick(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from gpusched.executors.fake import FakeExecutor
    from gpusched.gpus.fake import FakeProbe
    from gpusched.model import GpuPlan
    from gpusched.scheduler import Scheduler
    from gpusched.store import Store
    from tests.unit.test_scheduler import make_suite

    store = Store(tmp_path / "db.sqlite")
    sched = Scheduler(store, FakeProbe.from_spec("2x24GiB"), {"fake": FakeExecutor(name="fake")})
    suite = make_suite(tmp_path, n=4)
    store.submit(
        suite, GpuPlan(gpus=(0,), slots=(1,)), backend="fake", cwd=str(tmp_path), env_path=None, now=1.0
    )
    assert [g for _, g, _ in sched.tick(100.0).launched] == [0]
    store.submit(
        suite, GpuPlan(gpus=(1,), slots=(2,)), backend="fake", cwd=str(tmp_path), env_path=None, now=2.0
    )
    assert [g for _, g, _ in sched.tick(101.0).launched] == [1, 1]  # the new plan, not the cached one


def test_the_status_table_reads_only_the_rows_it_shows(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Plain `status` costs what its 40 rows cost however big the store; the rest is summed
    up by state, and the counts, GPUs and slots are those of the whole store."""
    from gpusched.model import GpuPlan
    from gpusched.store import Store
    from gpusched.views import MAX_TABLE_JOBS, format_status, status
    from tests.unit.test_scheduler import make_suite

    store = Store(tmp_path / "db.sqlite")
    suite = make_suite(tmp_path, n=300)
    store.submit(suite, GpuPlan(gpus=(0, 1), slots=(2, 1)), backend="fake", cwd=str(tmp_path), env_path=None)
    store.request_cancel([j.id for j in suite.jobs[10:]])
    full = status(store, [], daemon=None, now=0.0).doc()
    table = status(store, [], daemon=None, now=0.0, table_rows=MAX_TABLE_JOBS).doc()
    first = table["jobs"]
    assert [j["state"] for j in first] == ["queued"] * 10 + ["cancelled"] * (MAX_TABLE_JOBS - 10)
    assert [j["name"] for j in first][9:11] == ["9-task", "10-task"]  # submission order within a state
    assert len(full["jobs"]) == 300 and len(table["jobs"]) == MAX_TABLE_JOBS
    assert table["counts"] == full["counts"] and table["gpus"] == full["gpus"]
    text = format_status(table, width=200)
    assert (
        "Jobs (300)" in text and "260 more jobs: 260 cancelled (use --all, --state STATE or --suite)" in text
    )


def test_rows_are_frozen_records_and_a_column_they_do_not_know_is_an_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import pytest

    from gpusched.model import GpuPlan
    from gpusched.store import JobRow, Store
    from tests.unit.test_scheduler import make_suite

    store = Store(tmp_path / "db.sqlite")
    store.submit(
        make_suite(tmp_path, n=1),
        GpuPlan(gpus=(0,), slots=(1,)),
        backend="fake",
        cwd=str(tmp_path),
        env_path=None,
    )
    row = store.jobs()[0]
    built = JobRow(**{name: getattr(row, name) for name in JobRow.__struct_fields__})
    assert row.spec.name == row.name  # the spec, decoded on first use, is not a field
    assert row == built and hash(row) == hash(built) and repr(row) == repr(built)
    with pytest.raises(AttributeError):
        row.tier = 3  # type: ignore[misc]
    extra = store.db.execute("SELECT *, 1 AS extra FROM jobs").fetchone()
    with pytest.raises(TypeError, match="extra"):
        JobRow.from_row(extra)  # a column the record does not know is not dropped


def test_spawned_children_that_ended_are_reaped_by_the_next_spawn() -> None:
    """A long night must not pile up zombies or remembered children in the daemon."""
    import psutil

    from gpusched import proc
    from tests.helpers import retry_until

    first = [proc.spawn(["sh", "-c", "exit 0"]) for _ in range(20)]
    retry_until(
        lambda: all(
            psutil.Process(p.pid).status() == psutil.STATUS_ZOMBIE for p in first if psutil.pid_exists(p.pid)
        )
    )
    last = proc.spawn(["sh", "-c", "exit 0"])
    assert not any(p.pid in proc._children for p in first)
    assert all(p.returncode == 0 for p in first)  # waited for: no zombies left
    last.wait()


def test_a_program_is_found_on_path_once_and_again_when_path_or_the_file_changes(
    tmp_path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """A spawn runs what posix_spawnp would find on PATH, without the child searching PATH at
    every spawn: the program the PATH of this moment names, and after a failed start (the
    file gone) the one PATH names then."""
    import pytest

    from gpusched import proc
    from gpusched.errors import CommandFailed

    out = tmp_path / "out"
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        prog = tmp_path / name / "gpusched-test-prog"
        prog.write_text(f"#!/bin/sh\necho {name} >> {out}\n")
        prog.chmod(0o755)
    monkeypatch.setattr(proc, "_found", {})

    def run() -> list[str]:
        proc.spawn(["gpusched-test-prog"]).wait()
        return out.read_text().split()

    monkeypatch.setenv("PATH", f"{tmp_path / 'a'}:{tmp_path / 'b'}")
    assert run() == ["a"]
    assert list(proc._found.values()) == [str(tmp_path / "a" / "gpusched-test-prog")]  # found once
    monkeypatch.setenv("PATH", f"{tmp_path / 'b'}:{tmp_path / 'a'}")
    assert run() == ["a", "b"]  # another PATH: looked up again
    (tmp_path / "b" / "gpusched-test-prog").unlink()
    with pytest.raises(CommandFailed) as failed:
        run()  # the file found before is gone: posix_spawn says so, as posix_spawnp would
    assert failed.value.returncode == 127 and "cannot start" in str(failed.value)
    assert run() == ["a", "b", "a"]  # looked up again: the one left on PATH
    (tmp_path / "a" / "gpusched-test-prog").unlink()
    with pytest.raises(CommandFailed, match="gpusched-test-prog: cannot start"):
        run()  # on PATH nowhere


def test_a_full_queue_that_nothing_starves_costs_pack_no_new_view(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """demands() gives each job its slower tiers once per kind; pack() then keeps every view
    that is not starved as it is (at 1,000 queued it rebuilt ~800 views a tick)."""
    from gpusched import memory, memwatch
    from gpusched.model import GpuPlan
    from gpusched.placement import DEFAULT_HEADROOM_FRAC
    from tests.unit.test_scheduler import World, make_suite

    world = World(tmp_path, GpuPlan(gpus=(0, 1), slots=(1, 1)), gpus="2x24GiB")
    world.submit(make_suite(tmp_path, n=20))
    world.tick()
    queued = [j for j in world.store.jobs() if j.state.value == "queued"]
    gpus = world.sched.probe.snapshot()
    rooms = memory.rooms(gpus, {}, DEFAULT_HEADROOM_FRAC)
    demand = memwatch.demands(
        world.store, queued, world.sched._suite, gpus, rooms, headroom_frac=DEFAULT_HEADROOM_FRAC
    )
    assert len(demand) == 18 and all(d.view.fallback for d in demand.values())
    packed = memwatch.pack(demand, {}, after_s=600)
    assert all(packed[j] is d for j, d in demand.items())
    starved = next(iter(demand))
    assert memwatch.pack(demand, {starved: 600.0}, after_s=600)[starved].view.pack_now


def test_candidates_reuse_a_row_only_while_every_column_is_the_same(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from gpusched.model import GpuPlan
    from tests.unit.test_scheduler import World, make_suite

    world = World(tmp_path, GpuPlan(gpus=(0,), slots=(1,)), gpus="1x24GiB")
    world.submit(make_suite(tmp_path, n=4))
    world.tick()
    first = {j.id: j for j in world.sched._candidates(world.now)}
    again = {j.id: j for j in world.sched._candidates(world.now)}
    assert len(first) == 3 and all(again[j] is first[j] for j in first)  # nothing changed: not decoded again
    changed = next(iter(first))
    world.store.set_waits({changed: "a new reason"})
    third = {j.id: j for j in world.sched._candidates(world.now)}
    assert third[changed] is not first[changed] and third[changed].wait_reason == "a new reason"
    assert all(third[j] is first[j] for j in first if j != changed)


class _CountingDb:
    """The store's connection, counting the reads of the queue: whole (every column of the
    window), its order only, and rows by seq (with how many seqs each asked for)."""

    def __init__(self, db) -> None:  # type: ignore[no-untyped-def]
        self.db, self.whole, self.order, self.rows = db, 0, 0, []
        self.on_order = lambda: None  # run once, just before the next read of the queue's order

    def execute(self, sql, *args):  # type: ignore[no-untyped-def]
        self.whole += sql.startswith("SELECT * FROM jobs WHERE state = 'queued' AND (not_before")
        if sql.startswith("SELECT seq FROM jobs WHERE state = 'queued'"):
            self.order += 1
            self.on_order, hook = (lambda: None), self.on_order
            hook()
        if sql.startswith("SELECT * FROM jobs WHERE state = 'queued' AND seq IN"):
            self.rows.append(len(args[0]))
        return self.db.execute(sql, *args)

    def __getattr__(self, name):  # type: ignore[no-untyped-def]
        return getattr(self.db, name)


def test_the_queue_is_read_again_only_when_the_database_or_a_not_before_says_so(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """An idle tick over a long queue reads no rows; a write by the daemon itself makes it read
    the queue's order and only the row it changed; one by another process (which the daemon
    cannot list) and a not_before that the clock passes make it read the queue whole."""
    from gpusched.model import GpuPlan
    from gpusched.store import Store
    from tests.unit.test_scheduler import World, make_suite

    world = World(tmp_path, GpuPlan(gpus=(0,), slots=(1,)), gpus="1x24GiB")
    world.submit(make_suite(tmp_path, n=4))
    world.tick()
    db = world.store.db = _CountingDb(world.store.db)  # type: ignore[assignment]
    sched, now = world.sched, world.now
    first = sched._candidates(now)  # after the tick's own launch: its order, no row read whole
    assert len(first) == 3 and db.whole == 0 and db.order == 1
    db.order, db.rows = 0, []
    assert sched._candidates(now + 5) == first and (db.whole, db.order, db.rows) == (0, 0, [])
    world.store.set_waits({first[0].id: "ours"})  # the daemon's own write
    again = sched._candidates(now + 5)
    assert again[0].wait_reason == "ours" and (db.whole, db.order, db.rows) == (0, 1, [1])
    assert again[1] is first[1] and again[2] is first[2]  # unchanged: not read, not decoded
    other = Store(tmp_path / "gs.db")  # another process (the CLI)
    other.db.execute("UPDATE jobs SET not_before = ? WHERE id = ?", (now + 100, first[1].id))
    other.db.commit()
    assert [j.id for j in sched._candidates(now + 6)] == [first[0].id, first[2].id] and db.whole == 1
    assert len(sched._candidates(now + 99)) == 2 and db.whole == 1 and db.order == 1
    back = sched._candidates(now + 100)  # its time came: the order is read, the row it lacks
    assert [j.id for j in back] == [j.id for j in first] and (db.order, db.rows) == (2, [1, 1])
    assert back[1].not_before == now + 100
    assert sched._candidates(now + 7) and db.order == 3  # the clock went back: read again


def test_a_commit_by_another_process_while_the_queue_is_read_is_not_missed(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Another process's commit that lands between the daemon's own checks and its reads (a
    `gpusched submit` again, changing a queued job) makes the tick read the window whole: no
    row kept from before it is used."""
    from gpusched.model import GpuPlan
    from gpusched.store import Store
    from tests.unit.test_scheduler import World, make_suite

    world = World(tmp_path, GpuPlan(gpus=(0,), slots=(1,)), gpus="1x24GiB")
    world.submit(make_suite(tmp_path, n=4))
    world.tick()
    db = world.store.db = _CountingDb(world.store.db)  # type: ignore[assignment]
    sched, now = world.sched, world.now
    first = sched._candidates(now)
    world.store.set_waits({first[0].id: "ours"})  # the daemon's own write: the next read is partial

    def other_commits() -> None:
        other = Store(tmp_path / "gs.db")
        other.db.execute("UPDATE jobs SET priority = 5 WHERE id = ?", (first[2].id,))
        other.db.commit()

    db.on_order, whole = other_commits, db.whole
    again = sched._candidates(now)
    assert db.whole == whole + 1  # read whole after all
    assert [j.id for j in again] == [first[2].id, first[0].id, first[1].id] and again[0].priority == 5


def test_a_launch_or_reap_the_daemon_rolled_back_leaves_the_queue_as_stored(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A change undone (a savepoint rolled back: a reap or launch that failed half-way) lists
    no job, and the kept rows still equal what the store holds."""
    from gpusched.model import GpuPlan
    from tests.unit.test_scheduler import World, make_suite

    world = World(tmp_path, GpuPlan(gpus=(0,), slots=(1,)), gpus="1x24GiB")
    world.submit(make_suite(tmp_path, n=4))
    world.tick()
    sched, now = world.sched, world.now
    first = sched._candidates(now)
    with world.store.tx():
        try:
            with world.store.tx():
                world.store.set_waits({first[0].id: "undone"})
                raise RuntimeError("a launch failed half-way")
        except RuntimeError:
            pass
        world.store.set_waits({first[1].id: "kept"})
    assert world.store.changed_jobs() == {first[1].seq}
    world.store.set_waits({first[1].id: "kept again"})
    stored = {j.id: j for j in world.store.jobs(states=["queued"])}
    assert sched._candidates(now) == [stored[j.id] for j in first]


def test_jobs_of_one_kind_get_the_view_their_own_row_would(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """demands() builds a kind's view once and copies it per job with the job's own id,
    order and avoided GPU: each must equal the view built for that job alone."""
    from gpusched import memory, memwatch
    from gpusched.model import GpuPlan
    from gpusched.placement import DEFAULT_HEADROOM_FRAC
    from tests.unit.test_scheduler import World, make_suite

    world = World(tmp_path, GpuPlan(gpus=(0,), slots=(1,)), gpus="1x24GiB")
    world.submit(make_suite(tmp_path, n=5))
    world.tick()
    world.store.db.execute(
        "UPDATE jobs SET priority = 3, avoid_gpu = 0 WHERE seq = (SELECT MAX(seq) FROM jobs)"
    )
    world.store.db.commit()
    queued = [j for j in world.store.jobs() if j.state.value == "queued"]
    gpus = world.sched.probe.snapshot()
    rooms = memory.rooms(gpus, {}, DEFAULT_HEADROOM_FRAC)

    def demand(jobs):  # type: ignore[no-untyped-def]
        return memwatch.demands(
            world.store, jobs, world.sched._suite, gpus, rooms, headroom_frac=DEFAULT_HEADROOM_FRAC
        )

    together = demand(queued)
    for job in queued:
        alone = demand([job])[job.id]
        assert together[job.id] == alone and together[job.id].view == alone.view
    assert together[queued[-1].id].view.priority == 3 and together[queued[-1].id].view.avoid_gpu == 0


def test_jobs_whose_tasks_never_ran_share_one_prediction(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A plan without ``task:`` makes each job its own task. A task none of whose jobs has run
    has nothing to predict from, so demands() predicts once for all such jobs of a suite, not
    once per job every tick; each job still gets the demand it would get alone."""
    from msgspec.structs import replace

    from gpusched import memory, memwatch
    from gpusched.model import GpuPlan
    from gpusched.placement import DEFAULT_HEADROOM_FRAC
    from tests.unit.test_scheduler import World, make_suite

    world = World(tmp_path, GpuPlan(gpus=(0,), slots=(1,)), gpus="1x24GiB")
    suite = make_suite(tmp_path, n=6)
    world.submit(replace(suite, jobs=tuple(replace(j, task=j.name) for j in suite.jobs)))
    world.tick()  # one job runs: its task is known from now on (a running sibling bounds its run time)
    queued = [j for j in world.store.jobs() if j.state.value == "queued"]
    gpus = world.sched.probe.snapshot()
    rooms = memory.rooms(gpus, {}, DEFAULT_HEADROOM_FRAC)
    calls: list[str] = []
    predictions = memwatch._predictions
    monkeypatch.setattr(
        memwatch, "_predictions", lambda job, *a: calls.append(job.task) or predictions(job, *a)
    )

    def demand(jobs):  # type: ignore[no-untyped-def]
        return memwatch.demands(
            world.store,
            jobs,
            world.sched._suite,
            gpus,
            rooms,
            headroom_frac=DEFAULT_HEADROOM_FRAC,
            now=2000.0,
        )

    together = demand(queued)
    assert len(queued) == 5 and len(calls) == 1
    for job in queued:
        alone = demand([job])[job.id]
        assert together[job.id] == alone and together[job.id].view == alone.view


def test_the_queue_s_next_not_before_is_an_index_lookup_not_a_walk_of_the_queue(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Each read of the candidates asks when the next ``not_before`` comes; over a 10k queue a
    walk of every queued job cost ~1 ms a tick, an index on (state, not_before) a lookup."""
    from gpusched.store import Store

    store = Store(tmp_path / "q.db")
    plan = store.db.execute(
        "EXPLAIN QUERY PLAN SELECT MIN(not_before) FROM jobs WHERE state = 'queued' AND not_before > 1"
    ).fetchall()
    assert any("jobs_not_before (state=? AND not_before>?)" in row["detail"] for row in plan), plan


def test_the_suites_with_jobs_queued_are_a_lookup_a_suite_not_a_walk_of_the_queue(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A tick asks which suites have jobs queued (the window's heads, the cards the views hold).
    ``SELECT DISTINCT suite`` over the queued jobs walked all of them: 0.7 ms of each tick with
    10k queued (`bench_tick.py --queued 10000`: 3.55 ms a refill tick against 2.88 ms at 1k).
    Asked suite by suite on an index of (state, suite), it is a lookup each, and the answer
    holds every suite with a job queued and no other."""
    from gpusched.gpus.fake import FakeProbe
    from gpusched.model import GpuPlan
    from gpusched.scheduler import Scheduler
    from gpusched.store import Store
    from tests.unit.test_scheduler import make_suite

    store = Store(tmp_path / "q.db")
    plan = GpuPlan(gpus=(0,), slots=(1,))
    for name in ("b", "a", "c"):
        store.submit(make_suite(tmp_path, n=3, name=name), plan, backend="fake", cwd=".", env_path=None)
    store.request_cancel([job.id for job in store.jobs(suite="c")])  # c: none queued any more
    sched = Scheduler(store, FakeProbe.from_spec("1x24GiB"), {})
    sent: list[str] = []
    store.db.set_trace_callback(sent.append)
    assert sched._queued_suite_names() == ["a", "b"]
    store.db.set_trace_callback(None)
    (sql,) = sent
    detail = [row["detail"] for row in store.db.execute("EXPLAIN QUERY PLAN " + sql)]
    assert any("jobs_state_suite (state=? AND suite=?)" in d for d in detail), detail
    assert not any(d.startswith("SCAN jobs") for d in detail), detail


def test_the_queued_kinds_are_an_index_walk_not_a_sort_of_the_queue(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``status --json`` asks the kinds of every queued job. Sorting 7.8k queued jobs by a kind
    string built per job cost ~75 M instructions; walking an index of (state, attempts, suite,
    task, tier, seq) gives each suite, task and tier its first job in order, with no sort."""
    from gpusched import status_rows
    from gpusched.model import GpuPlan
    from gpusched.store import Store
    from tests.unit.test_scheduler import make_suite

    store = Store(tmp_path / "q.db")
    store.submit(
        make_suite(tmp_path, n=3), GpuPlan(gpus=(0,), slots=(1,)), backend="fake", cwd=".", env_path=None
    )
    sent: list[str] = []
    store.db.set_trace_callback(sent.append)
    stand_in, groups = status_rows.queued_kinds(store)
    store.db.set_trace_callback(None)
    first = store.jobs()[0]
    kind = f"{first.suite}\x1f\x1f{first.tier}"  # no job of the task has run: the task is left out
    assert stand_in == {kind: first.id} and len(groups) == 1 and groups[0][3:] == ("", kind)
    (sql,) = [s for s in sent if "WITH q" in s]
    plan = [row["detail"] for row in store.db.execute("EXPLAIN QUERY PLAN " + sql)]
    assert any("jobs_kinds (state=? AND attempts=?)" in d for d in plan), plan
    assert not any("TEMP B-TREE" in d for d in plan), plan


def test_no_statement_of_a_tick_walks_the_jobs_or_attempts_that_ended(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A tick's cost must not grow with the night's finished jobs. Every statement a tick sends
    after the first (which loads the memory history once) is a lookup or a walk of the queue's
    or the live attempts' own index: none scans the jobs, the attempts or the events, and none
    walks an index that holds finished ones. (The stops' query once walked every attempt's
    entry in attempts_state, each tick: ``state != 'exited'`` cannot seek an index.)"""
    from gpusched.model import GpuPlan
    from tests.unit.test_scheduler import World, make_suite

    world = World(tmp_path, GpuPlan(gpus=(0, 1), slots=(1, 1)))
    world.submit(make_suite(tmp_path, n=12))
    world.tick()

    def end_one() -> None:
        (a, *_) = world.store.live_attempts()
        world.ex.finish(a.token, exit_code=0, runtime={"peak_mib": 9000})

    for _ in range(6):
        end_one()
        world.tick()
    sent: list[str] = []
    world.store.db.set_trace_callback(sent.append)
    end_one()
    world.tick()
    world.store.db.set_trace_callback(None)
    finished = world.store.db.execute("SELECT COUNT(*) FROM jobs WHERE state = 'succeeded'").fetchone()[0]
    assert finished == 7 and len(world.store.live_attempts()) == 2

    # a scan of these tables (or their aliases in gpusched's queries), or of any of their indexes
    long = {"jobs", "attempts", "events", "j", "a"}
    walks = []
    for sql in {s for s in sent if s.lstrip().upper().startswith(("SELECT", "UPDATE", "DELETE", "WITH"))}:
        for row in world.store.db.execute("EXPLAIN QUERY PLAN " + sql):
            words = [w for w in row["detail"].split() if w != "TABLE"]  # ("SCAN TABLE jobs" before 3.36)
            if words[0] == "SCAN" and (
                words[1] in long or any(w.startswith(("jobs_", "attempts_", "events_")) for w in words)
            ):
                walks.append((sql, row["detail"]))
    assert walks == []
    plans = {
        name: sql
        for name, sql in world.store.db.execute("SELECT name, sql FROM sqlite_master WHERE type = 'index'")
    }
    # the queue's indexes and the live attempts' hold those only: a job's end touches none of them
    for name in ("jobs_queued", "jobs_queue", "jobs_not_before", "jobs_kinds"):
        assert plans[name].endswith("WHERE state = 'queued'"), plans[name]
    assert plans["attempts_state"].endswith("WHERE state IN ('launching', 'running')")


def test_a_tick_commits_a_launch_and_the_waits_it_leaves_together_and_an_idle_one_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A commit costs ~0.1 ms, a refill tick ~3 ms. A tick that reaps one job and starts the
    next commits three times: the reap, the attempt recorded ``launching`` before its start, and
    the attempt ``running`` with why the jobs still queued wait (which was a fourth). A tick
    with every slot busy and nothing new to say writes nothing, and takes the write lock only
    to look for ended jobs (it took it twice more for nothing, keeping a ``submit`` waiting)."""
    from gpusched.model import GpuPlan
    from tests.unit.test_scheduler import World, make_suite

    world = World(tmp_path, GpuPlan(gpus=(0, 1), slots=(1, 1)))
    world.submit(make_suite(tmp_path, n=6))
    world.tick()
    sent: list[str] = []
    world.store.db.set_trace_callback(sent.append)
    world.tick()
    assert [s for s in sent if s.startswith(("BEGIN", "SAVEPOINT", "UPDATE", "INSERT"))] == [
        "BEGIN IMMEDIATE"
    ]
    (a, _) = world.store.live_attempts()
    world.ex.finish(a.token, exit_code=0)
    sent.clear()
    world.tick()
    world.store.db.set_trace_callback(None)
    assert sum(s.startswith("BEGIN") for s in sent) == 3
    assert sum(s == "COMMIT" for s in sent) == 3
    queued = world.store.jobs(states=["queued"])
    assert len(queued) == 3 and all(j.wait_reason for j in queued)
    assert world.state(a.job_id).value == "succeeded" and len(world.store.live_attempts()) == 2


def test_a_tick_starts_each_process_once_its_files_are_written_and_batches_only_for_tmux(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A tick that starts 16 plain processes starts each as soon as its attempt directory is
    written, so its wrapper runs on another core while the daemon writes the next one's (the
    first of 16 began 9.2 ms after the tick began on 2 cores, 7.4 ms now). A backend that
    starts a batch in one round trip (tmux's ``launch_many``) still gets them all at once."""
    from gpusched.executors.fake import FakeExecutor
    from gpusched.model import GpuPlan
    from tests.unit.test_scheduler import World, make_suite

    seen: list[list[bool]] = []  # at each start: which of the tick's attempt directories exist

    class OneByOne(FakeExecutor):
        def launch(self, req):  # type: ignore[no-untyped-def]
            seen.append([os.path.isdir(a.dir) for a in world.store.live_attempts()])
            return super().launch(req)

    class Batched(OneByOne):
        def launch_many(self, reqs):  # type: ignore[no-untyped-def]
            seen.append([os.path.isdir(a.dir) for a in world.store.live_attempts()])
            return [FakeExecutor.launch(self, r) for r in reqs]

    for executor in (OneByOne(name="fake"), Batched(name="fake")):
        world = World(
            tmp_path / type(executor).__name__, GpuPlan(gpus=(0, 1, 2), slots=(1, 1, 1)), gpus="3x24GiB"
        )
        world.sched.executors["fake"] = world.ex = executor
        world.submit(make_suite(world.tmp, n=3))
        seen.clear()
        world.tick()
        assert len(world.store.live_attempts()) == 3 and len(executor.launched) == 3
        if isinstance(executor, Batched):
            assert seen == [[True, True, True]]
        else:  # one at a time: the first started before the other two were written
            assert seen == [[True, False, False], [True, True, False], [True, True, True]]


def test_the_host_memory_and_boot_time_read_from_proc_are_psutils() -> None:
    """The daemon's first tick reads the host's RAM and the boot time (a process's start time
    is counted from it) from /proc instead of importing psutil: the same numbers psutil gives."""
    import psutil

    from gpusched import memwatch, proc, procfs

    host = memwatch.host_memory()
    vm = psutil.virtual_memory()
    assert host.total_mib == vm.total >> 20
    assert host.available_mib is not None and abs(host.available_mib - (vm.available >> 20)) < 256
    procfs._boot_time = None
    assert procfs._boot() == psutil.boot_time()
    assert proc.started_at(os.getpid()) == pytest.approx(psutil.Process().create_time(), abs=0.01)


def test_the_process_table_read_from_proc_gives_the_trees_psutil_does(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Whose a GPU process is comes from the process table, which the daemon reads every
    second while a GPU lists processes: read from /proc directly, it must give each job's tree
    as psutil does, a job whose processes have names with spaces and parentheses (a process
    may call itself anything) included, and the groups' members with their names."""
    import psutil

    from gpusched import procfs

    odd = tmp_path / "a) (b c"  # comm: what /proc/PID/stat puts in parentheses
    odd.symlink_to(shutil.which("sleep") or "/bin/sleep")
    script = f"'{odd}' 30 & (sleep 30 & sleep 30 & wait) & wait"
    root = subprocess.Popen(["sh", "-c", script], start_new_session=True)
    try:
        want = {root.pid}
        deadline = time.monotonic() + 10
        while len(want) < 5 and time.monotonic() < deadline:  # sh, the odd one, a subshell, 2 sleeps
            time.sleep(0.01)
            want = {root.pid, *(c.pid for c in psutil.Process(root.pid).children(recursive=True))}
        assert len(want) == 5
        trees = procfs.process_trees({root.pid, os.getpid(), 999_999_999})
        assert trees[root.pid] == want
        assert trees[os.getpid()] >= {os.getpid(), root.pid}  # the tree of this test's process
        assert 999_999_999 not in trees  # a root that is gone is left out
        members = procfs.in_groups({root.pid})[root.pid]
        assert {pid for pid, _, _ in members} == want
        # (its state read past the name: running or asleep, never a piece of the name)
        assert any(name == "a) (b c" and state in ("R", "S") for _, state, name in members)
        # every process psutil lists (those alive throughout), with its parent and group
        listed = {pid: (ppid, pgrp) for pid, ppid, pgrp, _, _ in procfs.table()}
        for p in psutil.process_iter(["ppid"]):
            if p.pid in want:
                assert listed[p.pid] == (p.info["ppid"], os.getpgid(p.pid))
    finally:
        os.killpg(root.pid, signal.SIGKILL)
        root.wait()


def test_submit_checks_the_daemon_s_settings_importing_only_those_that_are_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``check_env`` names each setting the daemon reads, and the function that parses it,
    without importing their modules: the names are the ones those modules read, each parser
    exists, and a submit with none set imports none of the daemon's modules (nor, checking
    its ``--backend``, the executors)."""

    from gpusched import daemon, disk, memwatch
    from gpusched.executors import subprocess as plain
    from gpusched.executors import tmux_reuse

    names = [name for name, *_ in daemon.ENV_SETTINGS]
    read = [memwatch.HOST_MIN_ENV, disk.DISK_MIN_ENV, daemon.CANCEL_GRACE_ENV, plain.RUNNER_ENV]
    assert names == [*read, tmux_reuse.PANES_ENV, daemon.LOG_ENV]
    for _, where, _, _ in daemon.ENV_SETTINGS:
        module, _, function = where.partition(":")
        assert callable(getattr(sys.modules[module], function))
    # each default, as written there, is what the daemon does with the variable unset
    for name in names:
        monkeypatch.delenv(name, raising=False)
    unset = {
        memwatch.HOST_MIN_ENV: memwatch.host_limit_from_env(),
        disk.DISK_MIN_ENV: disk.disk_limit_from_env(),
        daemon.CANCEL_GRACE_ENV: daemon._cancel_grace_s(),
        plain.RUNNER_ENV: True,  # (SubprocessExecutor's default: env_setting(..., True))
        tmux_reuse.PANES_ENV: tmux_reuse.panes_wanted({}),
        daemon.LOG_ENV: "INFO",  # (logging.basicConfig's level in run_daemon)
    }
    for name, where, _, default in daemon.ENV_SETTINGS:
        assert daemon._parser(where)(default) == unset[name], name
    code = (
        "import sys; from gpusched import cli_common, daemon; daemon.check_env(); "
        "cli_common.check_backend('subprocess'); "
        "heavy = ('gpusched.executors', 'gpusched.mem', 'gpusched.disk', 'logging'); "
        "print(sorted(m for m in sys.modules if m.startswith(heavy)))"
    )
    env = {k: v for k, v in os.environ.items() if k not in names}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_a_command_runs_with_the_collector_on_and_what_its_imports_made_frozen() -> None:
    """`gpusched` (its entry point, as the console script and `python -m gpusched` run it)
    imports the CLI without the cyclic collector and freezes what that made: no collection
    walks it again. The command itself, the daemon's whole night included, runs with the
    collector on: cycles a night makes are freed, not kept until the daemon exits."""
    code = (
        "import gc, sys; from gpusched import cli, entry\n"
        "def seen(argv, early=None):\n"
        "    print(gc.isenabled(), gc.get_freeze_count() > 0, argv, early); return 3\n"
        "cli.main = seen\n"
        "sys.exit(entry.main(['daemon', 'status']))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert (out.returncode, out.stdout.strip()) == (3, "True True ['daemon', 'status'] None"), out.stderr
