"""Crash safety at every step of a launch, against real processes, a real tmux server and a
real SQLite file: the daemon "dies" (an exception nothing catches) at a chosen instant, a new
Scheduler over a fresh connection reconciles, and each job's command must have run exactly
once. Also: faults of the world (a vanished process group, a reused pid, an exit record that
cannot be written, an attempt directory that cannot be made, a GPU probe that fails, a
cancel racing a launch).

Every job appends its id to a shared file when it starts, so launches are counted from the
jobs' own side effects, not from what the store believes.
"""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpusched import plan, proc, scheduler
from gpusched.attempt import AttemptPaths
from gpusched.executors import LaunchUncertain
from gpusched.executors.fake import FakeExecutor
from gpusched.executors.select import make_executor
from gpusched.gpus.fake import FakeProbe
from gpusched.home import Home
from gpusched.model import GpuPlan, JobState
from gpusched.scheduler import Scheduler, Settings
from gpusched.store import Store
from tests.helpers import retry_until

needs_tmux = pytest.mark.skipif(not shutil.which("tmux"), reason="tmux not installed")
# tmux: its panes as by default (GPUSCHED_TMUX_PANES=auto); tmux-job: a window for each attempt
BACKENDS = ["subprocess", pytest.param("tmux", marks=needs_tmux), pytest.param("tmux-job", marks=needs_tmux)]


class Crash(BaseException):
    """The daemon dying right here (kill -9): nothing in gpusched catches a BaseException."""


class World:
    """A state home, a project with one plan, and a 'daemon' (Scheduler) that can be replaced."""

    def __init__(self, tmp: Path, backend: str, *, jobs: int = 1, script: str = "", slots: int = 4) -> None:
        self.tmp, self.backend = tmp, backend
        self.home = Home(tmp / "home").ensure()
        self.project = tmp / "project"
        (self.project / "plans").mkdir(parents=True)
        self.launches = tmp / "launches.txt"
        self.launches.touch()
        body = 'echo "$GPUSCHED_JOB_ID" >> "$LAUNCHES"; ' + (script or "sleep 0.2")
        doc = {
            "command": f"sh -c {_sq(body)} job {{config}}",
            "env": {"LAUNCHES": str(self.launches)},
            "jobs": [{"name": f"j{i}"} for i in range(jobs)],
        }
        (self.project / "plans" / "c.yaml").write_text(yaml.safe_dump(doc))
        self.suite = plan.load_suite("c", cwd=self.project)
        self.plan = GpuPlan(gpus=(0,), slots=(slots,))
        Store(self.home.db).submit(
            self.suite, self.plan, backend=backend, cwd=str(self.project), env_path=None
        )
        self.sched = self.restart()

    def restart(self, **settings: Any) -> Scheduler:
        """A new daemon: a fresh store connection and executor (nothing remembered in memory)."""
        self.store = Store(self.home.db)
        ex = make_executor(self.backend, self.home)
        self.sched = Scheduler(
            self.store, FakeProbe.from_spec("1x24GiB"), {self.backend: ex}, settings=Settings(**settings)
        )
        return self.sched

    def tick(self) -> Any:
        return self.sched.tick(time.time())

    def job(self, name: str = "j0") -> Any:
        return self.store.job(f"c/{name}")

    def run_until_done(self, timeout: float = 30) -> None:
        def done() -> bool:
            self.tick()
            return all(j.state.terminal for j in self.store.jobs())

        retry_until(done, timeout=timeout, interval=0.05)

    def launches_by_job(self) -> Counter[str]:
        return Counter(line.split("/", 1)[1] for line in self.launches.read_text().split())

    def outcomes(self, name: str = "j0") -> list[str | None]:
        return [a.outcome for a in self.store.attempts(f"c/{name}")]

    def cleanup(self) -> None:
        for a in self.store.live_attempts():
            if a.handle and a.handle.get("pid"):
                proc.signal_group(a.handle["pid"], signal.SIGKILL)
        if self.backend == "tmux":
            proc.run(["tmux", "-S", str(self.home.tmux_socket), "kill-server"], check=False)


def _sq(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


@pytest.fixture
def make_world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    made: list[World] = []

    def make(backend: str = "subprocess", **kw: Any) -> World:
        backend, _, panes = backend.partition("-")  # (tmux-job: the daemon's GPUSCHED_TMUX_PANES)
        monkeypatch.setenv("GPUSCHED_TMUX_PANES", panes or "auto")
        made.append(World(tmp_path, backend, **kw))
        return made[-1]

    yield make
    for w in made:
        w.cleanup()


# --------------------------------------------------------------------------- crash points


def test_killed_between_begin_attempt_and_launch_requeues_without_counting_a_loss(
    make_world: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = make_world()

    def crash(*_: Any, **__: Any) -> None:
        raise Crash

    monkeypatch.setattr(scheduler, "materialize", crash)
    with pytest.raises(Crash):
        w.tick()
    assert [a.state.value for a in w.store.attempts("c/j0")] == ["launching"]
    monkeypatch.undo()
    notes = w.restart().reconcile(time.time())
    assert any("never started" in n for n in notes), notes
    w.run_until_done()
    assert w.launches_by_job() == {"j0": 1}
    assert w.outcomes() == ["lost", "ok"]
    job = w.job()
    assert job.state is JobState.SUCCEEDED and job.lost == 0 and job.tier == 0


def test_an_attempt_whose_files_were_written_is_not_taken_for_never_started_at_once(
    make_world: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after the attempt's files were written, before its wrapper started: its wrapper
    may as well have been started an instant before, and one caught in its exec shows neither
    its command line nor its pid file. Requeued at once it could run twice (the 12-job crash
    test below did, once, in a full-suite run under load), so it waits out START_GRACE_S."""
    w = make_world()
    ex = w.sched.executors["subprocess"]
    monkeypatch.setattr(ex, "begin", _crash_on_call(1, ex.begin))
    with pytest.raises(Crash):
        w.tick()
    monkeypatch.undo()
    (a,) = w.store.attempts("c/j0")
    assert Path(a.dir, "launch.sh").exists() and a.state.value == "launching"
    sched = w.restart()
    assert sched.reconcile(a.launched_at + 1) == []  # no trace yet: looked at again later
    assert [x.state.value for x in w.store.attempts("c/j0")] == ["launching"]
    notes = sched.reconcile(a.launched_at + scheduler.START_GRACE_S)
    assert any("never started" in n for n in notes), notes
    w.run_until_done()
    assert w.launches_by_job() == {"j0": 1} and w.outcomes() == ["lost", "ok"]


def test_a_launch_the_runner_took_and_answered_no_more_is_adopted_when_its_wrapper_runs(
    make_world: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner died after it forked the wrappers, before it said their pids: the launches
    are uncertain, neither recorded running nor failed (a failure is requeued, and the jobs
    would run twice); the next tick finds them by their pid files."""
    w = make_world(jobs=2, script="sleep 0.3")
    ex = w.sched.executors["subprocess"]
    real_finish = ex.finish

    def answers_lost() -> list[Any]:
        return [LaunchUncertain("the runner ended with its launch in hand") for _ in real_finish()]

    monkeypatch.setattr(ex, "finish", answers_lost)
    events: list[str] = []
    w.sched.on_event = events.append
    assert not w.tick().launched
    assert [a.state.value for j in ("j0", "j1") for a in w.store.attempts(f"c/{j}")] == ["launching"] * 2
    assert any("looked at again at the next tick" in e for e in events), events
    monkeypatch.undo()
    retry_until(lambda: w.launches_by_job() == {"j0": 1, "j1": 1})  # (they run meanwhile)
    w.run_until_done()
    assert any("re-adopted by pid" in e for e in events), events
    assert w.launches_by_job() == {"j0": 1, "j1": 1}
    assert w.outcomes("j0") == ["ok"] and w.outcomes("j1") == ["ok"]


def test_a_backend_that_fails_to_give_its_handles_has_its_launches_looked_at_not_relaunched(
    make_world: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``finish`` raising after the wrappers started (a bug, say) must not requeue jobs that run."""
    w = make_world(jobs=2, script="sleep 0.3")
    ex = w.sched.executors["subprocess"]
    real_finish = ex.finish

    def broken() -> list[Any]:
        real_finish()
        raise RuntimeError("lost track")

    monkeypatch.setattr(ex, "finish", broken)
    w.tick()
    monkeypatch.undo()
    assert [a.state.value for j in ("j0", "j1") for a in w.store.attempts(f"c/{j}")] == ["launching"] * 2
    w.run_until_done()
    assert w.launches_by_job() == {"j0": 1, "j1": 1}
    assert w.outcomes("j0") == ["ok"] and w.outcomes("j1") == ["ok"]


def test_a_launch_the_runner_never_read_is_requeued_once_its_grace_is_over(
    make_world: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = make_world(script="exit 0")
    ex = w.sched.executors["subprocess"]
    monkeypatch.setattr(
        ex, "begin", lambda req: ex._pending.append((req, LaunchUncertain("the runner ended")))
    )
    w.tick()
    monkeypatch.undo()
    (a,) = w.store.attempts("c/j0")
    assert a.state.value == "launching"
    assert w.sched.reconcile(a.launched_at + 1) == []  # it may yet appear
    notes = w.sched.reconcile(a.launched_at + scheduler.START_GRACE_S)
    assert any("never started" in n for n in notes), notes
    w.run_until_done()
    assert w.launches_by_job() == {"j0": 1} and w.outcomes() == ["lost", "ok"]
    assert w.job().lost == 0  # (not counted: it never ran)


@pytest.mark.parametrize("backend", BACKENDS)
def test_killed_between_launch_and_mark_running_re_adopts_it(
    make_world: Any, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    w = make_world(backend, script="sleep 1")

    def crash(*_: Any, **__: Any) -> None:
        raise Crash

    monkeypatch.setattr(w.store, "mark_running_many", crash)
    with pytest.raises(Crash):
        w.tick()
    retry_until(lambda: w.launches_by_job() == {"j0": 1}, timeout=10)  # it runs, unrecorded
    notes = w.restart().reconcile(time.time())
    a = w.store.attempts("c/j0")[0]
    if backend == "subprocess":  # its runner's wrapper shows no token: found by its pid file
        pid = AttemptPaths(Path(a.dir)).read_pid()
        assert pid is not None and notes == [f"c/j0: re-adopted by pid {pid[0]}"], notes
    else:
        assert notes == ["c/j0: re-adopted"], notes
    a = w.store.attempts("c/j0")[0]
    assert a.state.value == "running" and a.handle and a.handle["pid"]
    if backend.startswith("tmux"):
        assert a.handle["pane"].startswith("%")  # attach still works after re-adoption
    w.run_until_done()
    assert w.launches_by_job() == {"j0": 1} and w.outcomes() == ["ok"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_job_that_ended_while_the_daemon_was_down_is_reaped_from_its_exit_record(
    make_world: Any, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    w = make_world(backend, script="exit 0")

    def crash(*_: Any, **__: Any) -> None:
        raise Crash

    monkeypatch.setattr(w.store, "mark_running_many", crash)
    with pytest.raises(Crash):
        w.tick()
    paths = AttemptPaths(Path(w.store.attempts("c/j0")[0].dir))
    retry_until(lambda: paths.read_exit() is not None, timeout=10)
    notes = w.restart().reconcile(time.time())
    assert notes == ["c/j0: ended while the daemon was down (ok)"], notes
    assert w.job().state is JobState.SUCCEEDED and w.launches_by_job() == {"j0": 1}


def test_a_failing_mark_running_is_recovered_by_the_next_tick(
    make_world: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon survives a failed tick (daemon.run retries); the next tick must adopt the
    attempt left `launching`, not leave its job wedged in `running` nor launch it again."""
    w = make_world(script="sleep 0.5")
    real = w.store.mark_running_many
    calls = {"n": 0}

    def flaky(*a: Any, **kw: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise sqlite3.OperationalError("disk I/O error")
        real(*a, **kw)

    monkeypatch.setattr(w.store, "mark_running_many", flaky)
    with pytest.raises(sqlite3.OperationalError):
        w.tick()
    w.run_until_done()
    assert w.launches_by_job() == {"j0": 1} and w.outcomes() == ["ok"]


def test_many_crashes_at_random_launch_steps_never_launch_twice(
    make_world: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """12 jobs, 4 slots; before each tick, a crash is armed at a random step (seeded)."""
    import random

    rng = random.Random(1234)
    w = make_world(jobs=12, script="sleep 0.1")
    steps = ["materialize", "launch", "answers", "mark_running", None, None]
    real_materialize = scheduler.materialize
    deadline = time.monotonic() + 60
    while not all(j.state.terminal for j in w.store.jobs()):
        assert time.monotonic() < deadline, "suite did not finish"
        step = rng.choice(steps)
        ex = w.sched.executors["subprocess"]
        monkeypatch.setattr(scheduler, "materialize", real_materialize)
        if step == "materialize":
            monkeypatch.setattr(scheduler, "materialize", _crash_on_call(rng.randint(1, 3), real_materialize))
        elif step == "launch":  # handed to the runner, its pid not yet read
            monkeypatch.setattr(ex, "begin", _crash_after_call(rng.randint(1, 3), ex.begin))
        elif step == "answers":  # a tick's launches all handed over, none recorded
            monkeypatch.setattr(ex, "finish", _crash_on_call(1, ex.finish))
        elif step == "mark_running":  # a tick records its launches running in one call
            monkeypatch.setattr(w.store, "mark_running_many", _crash_on_call(1, w.store.mark_running_many))
        try:
            w.tick()
        except Crash:
            w.restart().reconcile(time.time())
        time.sleep(0.02)
    assert w.launches_by_job() == {f"j{i}": 1 for i in range(12)}
    for j in w.store.jobs():
        assert j.state is JobState.SUCCEEDED and j.lost == 0
        assert w.outcomes(j.name).count("ok") == 1


def _crash_on_call(n: int, fn: Any) -> Any:
    """``fn``, except that its n-th call raises Crash instead of running."""
    calls = {"n": 0}

    def wrapped(*a: Any, **kw: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == n:
            raise Crash
        return fn(*a, **kw)

    return wrapped


def _crash_after_call(n: int, fn: Any) -> Any:
    """``fn``, except that its n-th call runs and then raises Crash (started, unrecorded)."""
    calls = {"n": 0}

    def wrapped(*a: Any, **kw: Any) -> Any:
        calls["n"] += 1
        out = fn(*a, **kw)
        if calls["n"] == n:
            raise Crash
        return out

    return wrapped


# --------------------------------------------------------------------------- faults of the world


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_process_group_killed_from_outside_is_lost_and_requeued_at_the_same_tier(
    make_world: Any, backend: str
) -> None:
    w = make_world(backend, script='[ "$GPUSCHED_ATTEMPT" = 1 ] && sleep 60; exit 0')
    w.tick()
    a = w.store.attempts("c/j0")[0]
    retry_until(lambda: w.launches_by_job() == {"j0": 1}, timeout=10)
    os.killpg(a.handle["pid"], signal.SIGKILL)  # the wrapper too: no exit record
    w.run_until_done()
    attempts = w.store.attempts("c/j0")
    assert [x.outcome for x in attempts] == ["lost", "ok"]
    assert [x.tier_name for x in attempts] == ["A", "A"]
    assert w.job().lost == 1 and w.job().state is JobState.SUCCEEDED


def test_a_reused_pid_is_not_taken_for_a_live_attempt(make_world: Any) -> None:
    """The attempt's recorded pid now names another live process (ours), started at another
    time: the attempt is gone, not running."""
    w = make_world()
    from gpusched.store import NewAttempt

    d = Path(w.suite.logs_dir) / "j0" / "1-A"
    d.mkdir(parents=True)
    me = os.getpid()
    wrong = (proc.started_at(me) or 0) - 1000
    (d / "pid").write_text(f"{me} {wrong}\n")
    now = time.time()
    aid = w.store.begin_attempt(
        NewAttempt(
            job_id="c/j0",
            tier=0,
            tier_name="A",
            gpu=0,
            gpu_uuid=None,
            backend="subprocess",
            dir=str(d),
            token="feedfacefeedface",
            placement_reason="test",
        ),
        now=now,
    )
    w.store.mark_running(aid, {"pid": me, "pid_started_at": wrong}, now=now)
    assert proc.is_alive(me, None) and not proc.is_alive(me, wrong)
    notes = w.restart().reconcile(time.time())
    assert notes == ["c/j0: vanished with no exit record (lost)"], notes
    assert w.job().state is JobState.QUEUED and w.job().lost == 1


def test_an_exit_record_that_cannot_be_written_means_lost_and_requeued(make_world: Any) -> None:
    """What a full log disk does to the wrapper: its exit.json write fails. Simulated by the
    job turning the file's name into a directory on its first attempt."""
    w = make_world(script='[ "$GPUSCHED_ATTEMPT" = 1 ] && mkdir "$GPUSCHED_ATTEMPT_DIR/exit.json"; exit 0')
    w.run_until_done()
    assert w.outcomes() == ["lost", "ok"]
    assert w.job().state is JobState.SUCCEEDED and w.launches_by_job() == {"j0": 2}


def test_an_attempt_dir_that_cannot_be_made_takes_the_launch_failed_path(make_world: Any) -> None:
    w = make_world()
    blocker = Path(w.suite.logs_dir) / "j0"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("a file where the job's log folder should go")
    t0 = time.time()
    w.sched.tick(t0)
    job = w.job()
    assert job.state is JobState.QUEUED and job.not_before and job.not_before > t0
    assert "launch failed" in (job.reason or "")
    assert w.outcomes() == ["lost"] and w.launches_by_job() == {}
    blocker.unlink()
    assert w.sched.tick(t0 + 1).launched == []  # backs off
    assert [j for j, _, _ in w.sched.tick(job.not_before + 0.1).launched] == ["c/j0"]
    w.run_until_done()
    assert w.outcomes() == ["lost", "ok"]


def _leave_an_earlier_run(w: Any, name: str = "j0") -> Path:
    """What another queue leaves in the project's logs: the state directory was deleted (or
    another GPUSCHED_HOME ran the same suite) and ``logs/c/j0/1-<tier>/`` holds last week's
    attempt, a success, its files a week old."""
    old = Path(w.suite.logs_dir) / name / f"1-{w.suite.tiers[0].name}"
    old.mkdir(parents=True)
    files = {
        "pid": "4242\n",
        "exit.json": '{"exit_code": 0, "signal": null, "wrapper_pid": 4242}\n',
        "output.log": "last week's run\n",
        "runtime.json": '{"peak_mib": 20000}\n',
    }
    week_ago = time.time() - 7 * 86400
    for f, text in files.items():
        (old / f).write_text(text)
        os.utime(old / f, (week_ago, week_ago))
    return old


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_earlier_queues_attempt_directory_is_neither_reused_nor_read(
    make_world: Any, backend: str
) -> None:
    """Reusing ``1-A/`` made the first tick after the launch reap its old exit.json: the job
    "succeeded" a week before it started while it still ran, and its slot went to the next."""
    wait_for_go = 'while [ ! -e "$GPUSCHED_ATTEMPT_DIR/../go" ]; do sleep 0.01; done; exit 3'
    w = make_world(backend, script=wait_for_go)
    old = _leave_an_earlier_run(w)
    before = {f.name: (f.read_bytes(), f.stat().st_mtime) for f in old.iterdir()}
    w.tick()
    retry_until(lambda: w.launches_by_job() == {"j0": 1}, timeout=10)
    for _ in range(3):
        w.tick()
        assert w.job().state is JobState.RUNNING
    a = w.store.attempts("c/j0")[0]
    assert Path(a.dir) == old.with_name(old.name + "~2")
    (old.parent / "go").touch()
    w.run_until_done()
    a = w.store.attempts("c/j0")[0]
    assert a.outcome == "error" and a.exit_code == 3 and a.peak_mib is None
    assert a.started_at is not None and a.ended_at is not None and a.ended_at >= a.started_at
    assert "last week" not in Path(a.dir, "output.log").read_text()
    assert {f.name: (f.read_bytes(), f.stat().st_mtime) for f in old.iterdir()} == before


def test_a_launch_cut_short_beside_an_earlier_queues_attempt_is_not_taken_for_it(
    make_world: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A daemon killed between recording the attempt and starting it: the restart looks for
    the attempt's traces in its directory, which must not be last week's exit record."""
    w = make_world()
    _leave_an_earlier_run(w)

    def crash(*_: Any, **__: Any) -> None:
        raise Crash

    monkeypatch.setattr(scheduler, "materialize", crash)
    with pytest.raises(Crash):
        w.tick()
    monkeypatch.undo()
    notes = w.restart().reconcile(time.time())
    assert any("never started" in n for n in notes), notes
    w.run_until_done()
    assert w.launches_by_job() == {"j0": 1} and w.outcomes() == ["lost", "ok"]
    assert [Path(a.dir).name for a in w.store.attempts("c/j0")] == ["1-A~2", "2-A"]


def test_a_cancel_that_races_the_launch_is_not_an_error(
    make_world: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another shell's `gpusched cancel` lands after the tick read the queue, before it
    recorded the launch: the job is cancelled, never started."""
    w = make_world()
    real = w.sched._candidates

    def read_then_cancel(now: float) -> Any:
        queued = real(now)
        Store(w.home.db).request_cancel([j.id for j in queued])
        return queued

    monkeypatch.setattr(w.sched, "_candidates", read_then_cancel)
    rep = w.tick()
    assert rep.launched == [] and w.job().state is JobState.CANCELLED
    assert w.store.attempts("c/j0") == [] and w.launches_by_job() == {}


# --------------------------------------------------------------------------- GPU probe faults


def _fake_world(tmp_path: Path, probe: Any, n: int = 4) -> tuple[Store, FakeExecutor, Scheduler]:
    from tests.unit.test_scheduler import make_suite

    store = Store(tmp_path / "gs.db")
    store.submit(
        make_suite(tmp_path, n=n),
        GpuPlan(gpus=(0, 1), slots=(1, 1)),
        backend="fake",
        cwd=str(tmp_path),
        env_path=None,
    )
    ex = FakeExecutor()
    return store, ex, Scheduler(store, probe, {"fake": ex})


def test_a_probe_that_raises_does_not_stop_the_queue(tmp_path: Path) -> None:
    class Broken:
        name = "broken"

        def snapshot(self) -> list[Any]:
            raise RuntimeError("driver gone")

        def notice(self) -> str | None:
            return None

    _, _, sched = _fake_world(tmp_path, Broken())
    rep = sched.tick(100.0)
    assert sorted(g for _, g, _ in rep.launched) == [0, 1]  # by slots: one per GPU of the plan


def test_nvml_failing_mid_run_falls_back_to_slots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("pynvml")
    from gpusched.gpus.nvml import NvmlProbe
    from tests.contract.test_probes import GIB_MIB, SimDevice, SimulatedNvml, fail

    sim = SimulatedNvml(devices=[SimDevice(total_mib=24 * GIB_MIB) for _ in range(2)])
    sim.install(monkeypatch)
    probe = NvmlProbe(retry_wait_s=0.001)
    _, ex, sched = _fake_world(tmp_path, probe)
    assert len(sched.tick(100.0).launched) == 2
    assert all(g.free_mib is not None for g in sched.last_snapshot)
    import pynvml

    for name in dir(sim):
        if name.startswith("nvmlDevice"):
            monkeypatch.setattr(pynvml, name, fail)
    for token in list(ex.live):
        ex.finish(token, exit_code=0)
    rep = sched.tick(101.0)
    assert len(rep.reaped) == 2 and len(rep.launched) == 2  # slots refilled with memory unknown
    assert all(g.free_mib is None for g in sched.last_snapshot)
    assert "placing by slots only" in (probe.notice() or "")


def test_discover_names_the_wrapper_not_a_subshell_with_its_command_line(tmp_path: Path) -> None:
    """The wrapper forks subshells (`$(date ...)`) that share its command line and token for
    an instant; adopting one of those would declare the job lost while it runs, and run it
    twice. Only a process that leads its own group (as the wrapper does) is the wrapper."""
    from gpusched.executors import WRAPPER, LaunchRequest
    from gpusched.executors.subprocess import SubprocessExecutor

    home = Home(tmp_path / "home").ensure()
    ex = SubprocessExecutor(home, runner=False)  # (a runner's wrapper is found by its pid file)
    dirs = []
    for name in ("fork", "real"):
        d = tmp_path / name
        d.mkdir()
        (d / "launch.sh").write_text("sleep 30\n")
        dirs.append(d)
    env = {**os.environ, "GPUSCHED_TOKEN": "forked", "GPUSCHED_HOME": str(home.root)}
    leader = proc.spawn(["sh", "-c", f"sh {WRAPPER} {dirs[0]} file; true"], env=env)  # not its own group
    handle = ex.launch(
        LaunchRequest(
            job_id="s/real", suite="s", job_name="real", token="real", attempt_dir=dirs[1], workdir=tmp_path
        )
    )
    try:
        pids = retry_until(lambda: all(AttemptPaths(d).read_pid() for d in dirs) and dirs, timeout=10)
        found = ex.discover()
        assert "forked" not in found
        assert found["real"]["pid"] == handle["pid"] == AttemptPaths(pids[1]).read_pid()[0]  # type: ignore[index]
    finally:
        proc.signal_group(leader.pid, signal.SIGKILL)
        proc.signal_group(handle["pid"], signal.SIGKILL)
