"""Memory-aware scheduling end to end through Scheduler.tick on a real SQLite store, with
fake GPUs that list per-process memory, injected process trees and host RAM: outsiders,
learned peaks, start safer, never deadlock, host RAM, release, misplaced jobs, status."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gpusched import memwatch
from gpusched.executors.fake import FakeExecutor
from gpusched.gpus.fake import FakeProbe, FakeUsage
from gpusched.memory import RELEASE_S, HostMemory
from gpusched.memwatch import MemoryWatch, OomKills
from gpusched.model import GpuPlan, GpuProcess, JobSpec, Suite, Tier
from gpusched.outcome import SIGKILL_NOT_KERNEL, SIGKILL_REASON
from gpusched.scheduler import Scheduler, Settings
from gpusched.store import Store
from gpusched.views import format_status, memory_cell, status

GIB = 1024
TIERS = (Tier(name="A"), Tier(name="B"), Tier(name="C"), Tier(name="D", exclusive=True))


def oom_tail(held_gib: float) -> str:
    return (
        "Traceback (most recent call last):\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total"
        " capacity of 24.00 GiB of which 20.00 MiB is free. Including non-PyTorch memory, this process"
        f" has {held_gib:.2f} GiB memory in use.\n"
    )


def make_suite(tmp: Path, n: int, task: str = "qnli") -> Suite:
    (tmp / "train.py").touch()  # the script its command runs: launches wait while it is missing
    return Suite(
        name="E1",
        plan_path=str(tmp / "E1.yaml"),
        workdir=str(tmp),
        logs_dir=str(tmp / "logs" / "E1"),
        command="python train.py --config {config}",
        base_config=None,
        tiers=TIERS,
        jobs=tuple(JobSpec(suite="E1", name=f"{i}-{task}", task=task) for i in range(n)),
    )


class Box:
    """A machine: fake cards whose processes the test sets, our jobs' process trees, host RAM."""

    def __init__(
        self,
        tmp: Path,
        plan: GpuPlan,
        cards: str = "2x24GiB",
        oom_kills: OomKills | None = None,
        backend: str = "fake",
        **settings: object,
    ) -> None:
        self.tmp, self.plan, self.now = tmp, plan, 1000.0
        self.procs: dict[int, list[GpuProcess]] = {}  # card -> processes on it
        self.trees: dict[str, frozenset[int]] = {}  # attempt token -> its pids
        self.host = HostMemory(available_mib=200 * GIB, total_mib=256 * GIB)
        self.events: list[str] = []
        self.store = Store(tmp / "gs.db")
        self.backend = backend
        self.ex = FakeExecutor(name=backend)
        self.probe = FakeProbe.from_spec(cards, usage=self._usage, clock=lambda: self.now)
        self.sched = Scheduler(
            self.store,
            self.probe,
            {backend: self.ex},
            settings=Settings(**settings),  # type: ignore[arg-type]
            on_event=self.events.append,
            process_trees=self._trees,
            host_memory=lambda: self.host,
            oom_kills=oom_kills,
        )

    def _usage(self) -> dict[int, FakeUsage]:
        return {
            g: FakeUsage(used_mib=sum(p.used_mib or 0 for p in ps), processes=tuple(ps))
            for g, ps in self.procs.items()
        }

    def _trees(self, attempts):  # type: ignore[no-untyped-def]
        return {a.id: self.trees[a.token] for a in attempts if a.token in self.trees}

    def submit(self, suite: Suite) -> None:
        cwd = str(self.tmp)
        self.store.submit(suite, self.plan, backend=self.backend, cwd=cwd, env_path=None, now=self.now)

    def tick(self, dt: float = 1.0):  # type: ignore[no-untyped-def]
        self.now += dt
        return self.sched.tick(self.now)

    def run_on(self, job_id: str, gpu: int, pids: dict[int, float]) -> str:
        """Give ``job_id``'s running attempt the process tree ``pids`` with that memory on ``gpu``."""
        token = self.ex.token_of(job_id)
        self.trees[token] = frozenset({99, *pids})  # 99: its wrapper, which holds no GPU memory
        self.procs[gpu] = [p for p in self.procs.get(gpu, []) if p.pid not in pids]
        self.procs[gpu] += [GpuProcess(pid=pid, used_mib=int(gib * GIB)) for pid, gib in pids.items()]
        return token

    def status(self) -> dict:  # type: ignore[type-arg]
        return status(
            self.store, self.probe.snapshot(), daemon=None, now=self.now, trees=self._trees, host=self.host
        ).doc()

    def attempt(self, job_id: str):  # type: ignore[no-untyped-def]
        return self.store.attempts(job_id)[-1]


def test_a_card_filled_by_an_outsider_is_avoided_and_status_names_the_outsider(tmp_path: Path) -> None:
    box = Box(tmp_path, GpuPlan(gpus=(0, 1), slots=(1, 1)))
    box.procs[0] = [GpuProcess(pid=4242, used_mib=20 * GIB)]  # someone else's 20 GiB job
    box.submit(make_suite(tmp_path, 1))
    assert box.tick().launched == [("E1/0-qnli", 1, "A")]
    box.run_on("E1/0-qnli", 1, {101: 6, 102: 1})  # the trainer and a data worker that touched CUDA
    box.tick()
    gpus = {g["index"]: g for g in box.status()["gpus"]}
    assert gpus[0]["processes"] == [{"pid": 4242, "used_mib": 20 * GIB, "ours": False, "job": None}]
    assert gpus[0]["outside_mib"] == 20 * GIB
    assert all(p["ours"] and p["job"] == "E1/0-qnli" for p in gpus[1]["processes"])  # the child too
    assert gpus[1]["outside_mib"] == 0


def test_each_attempts_peak_is_sampled_over_its_process_tree_and_never_goes_down(tmp_path: Path) -> None:
    box = Box(tmp_path, GpuPlan(gpus=(0,), slots=(1,)), cards="1x24GiB")
    box.submit(make_suite(tmp_path, 1))
    box.tick()
    box.run_on("E1/0-qnli", 0, {101: 6, 102: 1.5})
    box.tick()
    assert box.attempt("E1/0-qnli").peak_mib == int(7.5 * GIB)
    token = box.run_on("E1/0-qnli", 0, {101: 5, 102: 1})
    box.tick()
    assert box.attempt("E1/0-qnli").peak_mib == int(7.5 * GIB)
    box.ex.finish(token, exit_code=0, runtime={"peak_mib": 7 * GIB})  # the in-job helper's figure is lower
    box.tick()
    assert box.attempt("E1/0-qnli").peak_mib == int(7.5 * GIB)


def test_queued_jobs_show_the_prediction_they_will_be_placed_with_and_its_source(tmp_path: Path) -> None:
    box = Box(tmp_path, GpuPlan(gpus=(0,), slots=(1,)), cards="1x24GiB")
    box.submit(make_suite(tmp_path, 2))
    box.tick()
    jobs = {j["id"]: j for j in box.status()["jobs"]}
    assert (jobs["E1/1-qnli"]["predicted_mib"], jobs["E1/1-qnli"]["prediction_source"]) == (
        int(24 * GIB * 0.9) - GIB,
        "default",
    )
    box.ex.finish(box.ex.token_of("E1/0-qnli"), exit_code=0, runtime={"peak_mib": 9 * GIB})
    box.store.request_cancel(["E1/1-qnli"])  # keep it queued... no: cancel, then requeue it to look at it
    box.store.retry("E1/1-qnli", tier=0)
    box.sched.settings.hold_after_s = 1e9
    box.store.set_flag("draining", "1")
    box.tick()
    job = next(j for j in box.status()["jobs"] if j["id"] == "E1/1-qnli")
    assert (job["state"], job["predicted_mib"], job["prediction_source"], job["start_tier"]) == (
        "queued",
        9 * GIB,
        "task",
        "A",
    )
    assert memory_cell(job) == "~9.0 task"


def test_a_peak_that_fits_no_card_even_empty_starts_its_siblings_at_the_first_tier_that_does(
    tmp_path: Path,
) -> None:
    box = Box(tmp_path, GpuPlan(gpus=(0, 1), slots=(1, 1)))
    box.submit(make_suite(tmp_path, 3))
    box.tick()  # two siblings start at A
    box.ex.finish(
        box.ex.token_of("E1/0-qnli"),
        exit_code=1,
        output=oom_tail(23.5),
        runtime={"peak_mib": int(23.5 * GIB)},
    )
    box.tick()  # it died alone on its card holding 23.5 GiB: tier A cannot fit a 24 GiB card; it reruns at B
    assert (box.store.job("E1/2-qnli").wait_reason or "").startswith("tier B instead of A")  # type: ignore[union-attr]
    box.ex.finish(box.ex.token_of("E1/1-qnli"), exit_code=0)
    box.tick()
    third = box.attempt("E1/2-qnli")
    assert (third.tier_name, third.prediction_source) == ("B", "default")
    assert "tier B instead of A" in (third.placement_reason or "") and "even when empty" in (
        third.placement_reason or ""
    )


def test_an_outsider_is_waited_for_not_planned_around(tmp_path: Path) -> None:
    box = Box(tmp_path, GpuPlan(gpus=(0, 1), slots=(1, 1)))
    box.procs = {0: [GpuProcess(pid=7, used_mib=19 * GIB)], 1: [GpuProcess(pid=8, used_mib=20 * GIB)]}
    box.submit(make_suite(tmp_path, 2))
    box.procs[1] = [GpuProcess(pid=9, used_mib=300)]  # only an X server left there
    assert box.tick().launched == [("E1/0-qnli", 1, "A")]
    assert box.tick().launched == []  # GPU 0's outsider may leave: its sibling waits at its own tier
    job = box.store.job("E1/1-qnli")
    assert (
        job is not None
        and (job.tier, job.wait_reason) == (0, job.wait_reason)
        and "needs" in (job.wait_reason or "")
    )


def test_never_deadlocks_when_nothing_runs_and_nothing_fits(tmp_path: Path) -> None:
    box = Box(tmp_path, GpuPlan(gpus=(0, 1), slots=(1, 1)))
    box.procs = {0: [GpuProcess(pid=7, used_mib=19 * GIB)], 1: [GpuProcess(pid=8, used_mib=20 * GIB)]}
    box.submit(make_suite(tmp_path, 2))
    assert box.tick().launched == []  # other people's jobs may end: wait for them, for a while
    assert box.tick(dt=1800).launched == []
    rep = box.tick(dt=1800)  # an hour of nothing: the queue must not stall for ever
    assert rep.launched == [("E1/0-qnli", 0, "D")]  # the most conservative tier, on the roomiest card
    a = box.attempt("E1/0-qnli")
    assert "nothing runs and nothing fits" in (a.placement_reason or "") and "tier D" in (
        a.placement_reason or ""
    )
    assert box.tick().launched == []  # something runs now: the other one waits, with its reason
    assert "needs" in (box.store.job("E1/1-qnli").wait_reason or "")  # type: ignore[union-attr]


def test_a_job_whose_peak_is_only_a_guess_is_measured_beside_an_outsider_not_kept_waiting(
    tmp_path: Path,
) -> None:
    # as seen on a real H200 (benchmarks/gpu_outsider.py): someone holds 105 of 140 GiB; a plan of
    # 4 guesses 31.3 GiB a job, 21 GiB is left under headroom, and each job needs 8 GiB
    box = Box(tmp_path, GpuPlan(gpus=(0,), slots=(4,)), cards="1x140GiB")
    box.procs = {0: [GpuProcess(pid=7, used_mib=105 * GIB)]}
    box.submit(make_suite(tmp_path, 4))
    assert box.tick().launched == [("E1/0-qnli", 0, "A")]  # at once, at its own tier
    assert "to measure its peak" in (box.attempt("E1/0-qnli").placement_reason or "")
    token = box.run_on("E1/0-qnli", 0, {101: 8})
    assert box.tick().launched == []  # its siblings wait for what it really takes
    box.ex.finish(token, exit_code=0)
    box.procs[0] = [p for p in box.procs[0] if p.pid != 101]
    launched = [box.tick().launched for _ in range(2)]
    assert sorted(j for batch in launched for j in batch) == [("E1/1-qnli", 0, "A"), ("E1/2-qnli", 0, "A")]
    job = box.store.job("E1/3-qnli")  # two of 8 GiB fit in 21 GiB: the fourth waits, with its reason
    assert job is not None and job.state == "queued" and "needs" in (job.wait_reason or "")


def test_a_card_a_guessed_job_would_take_alone_waits_ten_minutes_for_a_job_that_shares_it(
    tmp_path: Path,
) -> None:
    """Someone's 6 GiB notebook on GPU 1 leaves 15.6 GiB under headroom, under two guesses of a
    slot's share: the first jobs of an unknown task fill GPU 0, the third waits with its reason
    while a peak is being learned, and takes GPU 1 alone once it has stood empty for 10 min."""
    box = Box(tmp_path, GpuPlan(gpus=(0, 1), slots=(2, 2)))
    box.procs = {1: [GpuProcess(pid=7, used_mib=6 * GIB)]}
    box.submit(make_suite(tmp_path, 3))
    assert sorted(box.tick().launched) == [("E1/0-qnli", 0, "A"), ("E1/1-qnli", 0, "A")]
    assert box.tick(dt=300).launched == []
    job = box.store.job("E1/2-qnli")
    assert job is not None and (job.wait_reason or "").endswith(
        "GPU 1 is left to jobs known to share them while its peak is a guess"
    )
    assert box.tick(dt=301).launched == [("E1/2-qnli", 1, "A")]


def test_once_a_running_job_settles_its_siblings_are_guessed_from_its_plateau_and_share_a_card(
    tmp_path: Path,
) -> None:
    """Minutes into a night, no job has finished, but the first two have settled at 5 GiB: their
    queued siblings are guessed at 5 x 1.3 = 6.5 GiB instead of a slot's share (10.8), so two
    of them share GPU 1, which someone's 6 GiB notebook leaves 15.6 GiB under headroom, where
    a slot's share each had kept all but one of them off it until one finished."""
    box = Box(tmp_path, GpuPlan(gpus=(0, 1), slots=(2, 2)))
    box.procs = {1: [GpuProcess(pid=7, used_mib=6 * GIB)]}
    box.submit(make_suite(tmp_path, 5, task="cola"))
    assert sorted(box.tick().launched) == [("E1/0-cola", 0, "A"), ("E1/1-cola", 0, "A")]
    box.run_on("E1/0-cola", 0, {101: 5})
    box.run_on("E1/1-cola", 0, {102: 5})
    assert box.tick().launched == []  # still ramping for all it knows: GPU 1 waits for a sharer
    rep = box.tick(dt=box.sched.settings.ramp_s + 1)  # settled
    assert sorted(rep.launched) == [("E1/2-cola", 1, "A"), ("E1/3-cola", 1, "A")]
    assert [a.predicted_mib for a in (box.attempt("E1/2-cola"), box.attempt("E1/3-cola"))] == [6656, 6656]
    waiting = {j["id"]: j for j in box.status()["jobs"]}["E1/4-cola"]  # status says what placement uses
    assert (waiting["predicted_mib"], waiting["prediction_source"]) == (6656, "default")


def test_one_measuring_run_per_task_an_oom_there_is_not_followed_down_the_ladder(tmp_path: Path) -> None:
    box = Box(tmp_path, GpuPlan(gpus=(0,), slots=(4,)), cards="1x140GiB")
    box.procs = {0: [GpuProcess(pid=7, used_mib=105 * GIB)]}
    box.submit(make_suite(tmp_path, 2))
    assert box.tick().launched == [("E1/0-qnli", 0, "A")]  # measured alone
    token = box.run_on("E1/0-qnli", 0, {101: 20})
    box.ex.finish(token, exit_code=1, output=oom_tail(20))  # it needs more than the room left
    box.procs[0] = [p for p in box.procs[0] if p.pid != 101]
    rep = box.tick()
    assert rep.reaped == [("E1/0-qnli", "oom")]
    # neither it (now at tier B, again a guess there) nor its sibling starts: they wait
    assert rep.launched == [] and box.tick().launched == [] and box.tick(dt=600).launched == []
    assert box.store.job("E1/0-qnli").state == "queued"  # type: ignore[union-attr]
    assert "needs" in (box.store.job("E1/1-qnli").wait_reason or "")  # type: ignore[union-attr]


def oom_beside(held_gib: float, others: dict[int, float]) -> str:
    """An OOM message that lists the card's other processes (pid -> GiB), as PyTorch's does."""
    listed = "".join(f"Process {pid} has {gib:.2f} GiB memory in use. " for pid, gib in others.items())
    return (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity"
        f" of 24.00 GiB of which 20.00 MiB is free. {listed}Including non-PyTorch memory, this process has"
        f" {held_gib:.2f} GiB memory in use.\n"
    )


@pytest.mark.parametrize("still_there", [True, False])
def test_a_job_someone_elses_new_process_ran_out_of_memory_runs_again_at_its_tier_elsewhere(
    tmp_path: Path, still_there: bool
) -> None:
    """A colleague starts a 12 GiB job on our card while ours runs there; ours dies of OOM. It
    did not outgrow its tier, so it runs again at it, on another card, and the crash teaches
    the memory history nothing. The newcomer may be gone by the reap (its own allocation
    failed too): the OOM message still names it. The X server there from the start is not
    a newcomer."""
    box = Box(tmp_path, GpuPlan(gpus=(0, 1), slots=(1, 1)))
    box.procs = {0: [GpuProcess(pid=7, used_mib=300)], 1: [GpuProcess(pid=8, used_mib=400)]}
    box.submit(make_suite(tmp_path, 1))
    ((job_id, gpu, _),) = box.tick().launched
    token = box.run_on(job_id, gpu, {101: 10})
    box.tick()  # first seen: the X server was there before
    if still_there:
        box.procs[gpu].append(GpuProcess(pid=500, used_mib=12 * GIB))
    box.ex.finish(token, exit_code=1, output=oom_beside(10, {500: 12, 7 + gpu: 0.3}))
    box.procs[gpu] = [p for p in box.procs[gpu] if p.pid != 101]
    rep = box.tick()
    assert rep.reaped == [(job_id, "oom")]
    assert rep.launched == [(job_id, 1 - gpu, "A")]  # its own tier (no OOM learned at A), elsewhere
    said = f"OOM at tier A after someone else's process (pid 500, 12.0 GiB) came onto GPU {gpu}"
    assert any(said in e for e in box.events)
    peaks, _ = memwatch.records(box.store, ["qnli"])
    assert peaks["qnli"] == []  # the crash is not a sample of its need
    # crowded out again at the same tier: it may have outgrown it after all, so it steps down
    token = box.run_on(job_id, 1 - gpu, {102: 10})
    box.tick()
    box.ex.finish(token, exit_code=1, output=oom_beside(10, {501: 14}))
    box.procs[1 - gpu] = [p for p in box.procs[1 - gpu] if p.pid != 102]
    assert box.tick().reaped == [(job_id, "oom")]
    job = box.store.job(job_id)
    assert (
        job is not None
        and job.tier == 1
        and [s.outcome for s in memwatch.records(box.store, ["qnli"])[0]["qnli"]] == ["oom"]
    )


def test_a_daemon_that_cannot_see_its_jobs_pids_on_the_card_claims_no_arrival(tmp_path: Path) -> None:
    """In a container's PID namespace the driver's pids are not the job's: every process on the
    card looks like someone else's, a card-mate of ours started later too, so an OOM there
    steps down as ever rather than being blamed on a newcomer."""
    box = Box(tmp_path, GpuPlan(gpus=(0,), slots=(2,)))
    box.submit(make_suite(tmp_path, 1, task="mrpc"))
    assert box.tick().launched == [("E1/0-mrpc", 0, "A")]
    token = box.run_on("E1/0-mrpc", 0, {})  # its tree holds only its wrapper, pid 99
    box.procs[0] = [GpuProcess(pid=70001, used_mib=6 * GIB)]  # its process, by the driver's pid
    box.tick()
    box.procs[0].append(GpuProcess(pid=70002, used_mib=12 * GIB))
    box.ex.finish(token, exit_code=1, output=oom_beside(6, {70002: 12}))
    assert box.tick().reaped == [("E1/0-mrpc", "oom")]
    job = box.store.job("E1/0-mrpc")
    assert job is not None and job.tier == 1 and not any("someone else" in e for e in box.events)


@pytest.mark.parametrize("both_die", [False, True])
def test_an_oom_beside_our_own_job_steps_down_as_ever(tmp_path: Path, both_die: bool) -> None:
    """What our own job took beside it is placement's to answer for, not someone else's
    arrival: the job steps down, even when the other job was first listed after it started,
    and when it died in the same moment (its processes gone, its pids only remembered)."""
    box = Box(tmp_path, GpuPlan(gpus=(0,), slots=(2,)))
    box.submit(make_suite(tmp_path, 2, task="mrpc"))
    assert [j for j, _, _ in box.tick().launched] == ["E1/0-mrpc", "E1/1-mrpc"]
    first = box.run_on("E1/0-mrpc", 0, {101: 6})
    box.tick()
    second = box.run_on("E1/1-mrpc", 0, {201: 12})
    box.tick()
    box.ex.finish(first, exit_code=1, output=oom_beside(6, {201: 12}))
    if both_die:
        box.ex.finish(second, exit_code=1, output=oom_beside(12, {101: 6}))
        del box.trees[first], box.trees[second]
    box.procs[0] = [p for p in box.procs[0] if p.pid != 101]
    assert box.tick().reaped == [("E1/0-mrpc", "oom"), ("E1/1-mrpc", "oom")][: 1 + both_die]
    job = box.store.job("E1/0-mrpc")
    assert job is not None and job.tier == 1 and not any("someone else" in e for e in box.events)


def test_launches_wait_while_host_ram_is_low(tmp_path: Path) -> None:
    box = Box(tmp_path, GpuPlan(gpus=(0, 1), slots=(1, 1)))
    box.host = HostMemory(available_mib=2 * GIB, total_mib=256 * GIB)
    box.submit(make_suite(tmp_path, 1))
    assert box.tick().launched == []
    assert "host RAM low: 2.0 GiB available" in (box.store.job("E1/0-qnli").wait_reason or "")  # type: ignore[union-attr]
    assert "host RAM low" in (box.status()["host"]["wait"] or "")
    box.host = HostMemory(available_mib=50 * GIB, total_mib=256 * GIB)
    assert len(box.tick().launched) == 1


def test_a_host_oom_holds_launches_until_host_ram_recovers(tmp_path: Path) -> None:
    box = Box(tmp_path, GpuPlan(gpus=(0,), slots=(1,)), cards="1x24GiB")
    box.submit(make_suite(tmp_path, 2))
    box.tick()
    box.host = HostMemory(available_mib=6 * GIB, total_mib=256 * GIB)  # above the 4 GiB minimum
    box.ex.finish(box.ex.token_of("E1/0-qnli"), exit_code=137, output="Killed\n")  # the kernel's OOM killer
    assert box.tick().reaped == [("E1/0-qnli", "host_oom")]
    held = box.store.job("E1/1-qnli").wait_reason or ""  # type: ignore[union-attr]
    assert (
        "held after a host OOM of E1/0-qnli" in held
        and box.status()["host"]["held_after_oom_of"] == "E1/0-qnli"
    )
    box.host = HostMemory(available_mib=40 * GIB, total_mib=256 * GIB)
    assert box.tick(dt=5).launched == []  # recovered, but give the box a moment to settle
    assert len(box.tick(dt=60).launched) == 1
    assert box.status()["host"]["held_after_oom_of"] is None


def test_a_sigkill_the_kernels_oom_killer_did_not_send_says_who_else_might_have(tmp_path: Path) -> None:
    """A SIGKILL was always put down to the kernel's OOM killer. Where the kernel's count of OOM
    kills did not move while the job ran, the reason names the senders it leaves (systemd-oomd,
    earlyoom, a kill -9); it is still a host OOM (the job steps down and launches wait). Where
    the count moved, or was not read before the job began, it stays the kernel's."""
    count: list[int | None] = [5]
    box = Box(
        tmp_path,
        GpuPlan(gpus=(0,), slots=(4,)),
        cards="1x24GiB",
        oom_kills=OomKills(lambda: count[0], since=1000.0),
    )
    box.submit(make_suite(tmp_path, 4))
    assert len(box.tick().launched) == 4  # at 1001, after the count was first read

    def kill(job_id: str) -> str:
        box.ex.finish(box.ex.token_of(job_id), exit_code=137, output="Killed\n")
        assert box.tick().reaped == [(job_id, "host_oom")]
        return box.store.attempts(job_id)[0].reason or ""

    assert kill("E1/0-qnli") == SIGKILL_NOT_KERNEL
    assert box.store.job("E1/0-qnli").tier == 1  # type: ignore[union-attr]  # stepped down all the same
    count[0] = 6  # the kernel killed something meanwhile
    assert kill("E1/1-qnli") == SIGKILL_REASON
    assert kill("E1/2-qnli") == SIGKILL_REASON  # began before the count was seen at 6: not known
    count[0] = None  # /proc/vmstat gone
    assert kill("E1/3-qnli") == SIGKILL_REASON


def test_a_sigkill_on_a_cluster_node_is_not_judged_by_this_machines_count(tmp_path: Path) -> None:
    kills = OomKills(lambda: 5, since=1000.0)
    box = Box(tmp_path, GpuPlan(gpus=(0,), slots=(1,)), cards="1x24GiB", oom_kills=kills, backend="slurm")
    box.submit(make_suite(tmp_path, 1))
    box.tick()
    box.ex.finish(box.ex.token_of("E1/0-qnli"), exit_code=137, output="Killed\n")
    assert box.tick().reaped == [("E1/0-qnli", "host_oom")]
    assert box.store.attempts("E1/0-qnli")[0].reason == SIGKILL_REASON


def test_oom_kills_knows_nothing_without_the_count() -> None:
    assert not OomKills(lambda: None, since=0.0).none_since(1.0, 2.0)
    seen = OomKills(lambda: 7, since=10.0)
    assert seen.none_since(10.0, 20.0) and not seen.none_since(9.0, 20.0)
    assert memwatch.kernel_oom_kills() is None or memwatch.kernel_oom_kills() >= 0  # type: ignore[operator]


def test_an_ended_jobs_processes_stay_ours_until_their_memory_is_released(tmp_path: Path) -> None:
    box = Box(tmp_path, GpuPlan(gpus=(0,), slots=(1,)), cards="1x24GiB")
    box.submit(make_suite(tmp_path, 1))
    box.tick()
    token = box.run_on("E1/0-qnli", 0, {101: 10})
    box.tick()
    box.ex.finish(token, exit_code=0)
    box.tick()  # reaped; pid 101 still holds its memory on the card
    assert list(box.sched.memory.releasing) == [box.attempt("E1/0-qnli").id]
    att = box.sched.memory.measure([], box.probe.snapshot(), box.now)
    assert att.outside_mib.get(0, 0) == 0 and att.owner(0, 101).ending  # type: ignore[union-attr]
    box.procs[0] = []
    box.tick()
    assert box.sched.memory.releasing == {}


def test_status_counts_an_ended_jobs_process_still_on_its_card_as_ours(tmp_path: Path) -> None:
    # seen on a real H200: a job's process stays listed by NVML for a moment after the job was
    # reaped, and `status` named it an outside process (pid 732, 8.5 GiB) beside the real one.
    # Its environment carries the attempt's token: that is how status still knows it.
    box = Box(tmp_path, GpuPlan(gpus=(0,), slots=(1,)), cards="1x24GiB")
    box.submit(make_suite(tmp_path, 1))
    box.tick()
    token = box.ex.token_of("E1/0-qnli")
    env = {"PATH": os.environ.get("PATH", ""), "GPUSCHED_TOKEN": token}
    with subprocess.Popen(["sleep", "60"], env=env) as releasing:
        try:
            box.procs[0] = [
                GpuProcess(pid=releasing.pid, used_mib=8 * GIB),
                GpuProcess(pid=4242, used_mib=2 * GIB),  # someone else's
            ]
            box.ex.finish(token, exit_code=0)
            assert box.tick().reaped == [("E1/0-qnli", "ok")]
            gpu = box.status()["gpus"][0]
            assert gpu["processes"] == [
                {"pid": releasing.pid, "used_mib": 8 * GIB, "ours": True, "job": "E1/0-qnli"},
                {"pid": 4242, "used_mib": 2 * GIB, "ours": False, "job": None},
            ]
            assert gpu["outside_mib"] == 2 * GIB
        finally:
            releasing.kill()


def test_status_counts_an_exited_jobs_process_the_driver_still_lists_as_ours(tmp_path: Path) -> None:
    # seen on a real H200 (after the test above was written): once a job's process has exited,
    # NVML lists its pid for a moment more while the memory is released. No /proc entry is left
    # to read then; the daemon wrote down the pids it saw on the job's card while it ran.
    gone = 2**22 + 1  # above any pid_max: no process here has it
    box = Box(tmp_path, GpuPlan(gpus=(0,), slots=(1,)), cards="1x24GiB")
    box.submit(make_suite(tmp_path, 1))
    box.tick()
    token = box.run_on("E1/0-qnli", 0, {gone: 8})
    box.procs[0].append(GpuProcess(pid=4242, used_mib=2 * GIB))  # someone else's
    box.tick()  # the daemon sees the job's process on its card, and writes its pid down once
    box.tick()
    assert [tuple(r) for r in box.store.db.execute("SELECT pid, attempt_id FROM gpu_pids")] == [
        (gone, box.attempt("E1/0-qnli").id)
    ]
    box.ex.finish(token, exit_code=0)
    assert box.tick().reaped == [("E1/0-qnli", "ok")]
    gpu = box.status()["gpus"][0]
    assert gpu["processes"] == [
        {"pid": gone, "used_mib": 8 * GIB, "ours": True, "job": "E1/0-qnli"},
        {"pid": 4242, "used_mib": 2 * GIB, "ours": False, "job": None},
    ]
    assert gpu["outside_mib"] == 2 * GIB
    # past the release window, the daemon no longer counts it as ours, and neither does status
    # (by then the pid could be someone else's process)
    box.tick(dt=RELEASE_S + 1)
    assert box.status()["gpus"][0]["outside_mib"] == 10 * GIB


def test_a_jobs_exited_process_is_ours_before_its_attempt_is_reaped(tmp_path: Path) -> None:
    # seen on a real H200 with the tmux backend: between a job's process exiting and the daemon
    # reaping its attempt (the wrapper still writing how it ended, the pane closing), NVML still
    # lists the process, no longer below the job's wrapper, and `status` named it someone else's.
    gone = 2**22 + 1  # above any pid_max: no process here has it
    box = Box(tmp_path, GpuPlan(gpus=(0,), slots=(1,)), cards="1x24GiB")
    box.submit(make_suite(tmp_path, 1))
    box.tick()
    token = box.run_on("E1/0-qnli", 0, {gone: 8, 102: 4})  # the trainer and a helper on the card
    box.procs[0].append(GpuProcess(pid=4242, used_mib=2 * GIB))  # someone else's
    box.tick()  # the daemon sees the job's processes on its card and writes their pids down
    box.trees[token] = frozenset({99, 102})  # the trainer exited; its attempt still runs
    gpu = box.status()["gpus"][0]
    assert gpu["processes"] == [
        {"pid": gone, "used_mib": 8 * GIB, "ours": True, "job": "E1/0-qnli"},
        {"pid": 102, "used_mib": 4 * GIB, "ours": True, "job": "E1/0-qnli"},
        {"pid": 4242, "used_mib": 2 * GIB, "ours": False, "job": None},
    ]
    assert gpu["outside_mib"] == 2 * GIB
    live = box.store.live_attempts()
    att = box.sched.memory.measure(live, box.probe.snapshot(), box.now + 1)  # the daemon's next look
    assert att.outside_mib == {0: 2 * GIB} and att.owner(0, gone) is not None
    assert att.usage[box.attempt("E1/0-qnli").id].used_mib == 12 * GIB


def test_the_daemon_reads_the_process_table_again_only_when_its_answer_could_differ(tmp_path: Path) -> None:
    """Whose a card's processes are comes from the process table, every process of the machine
    (hundreds on a GPU box), which the daemon read at every look, every second, and in every
    refill's tick before placing. It now reads it again only when a card lists a pid it did not
    list at the last read, an attempt running then had no tree, or that read is a minute old;
    meanwhile the cards' numbers still count at every look, and a job that ends or starts is
    no reason (what the cards list came before it)."""
    box = Box(tmp_path, GpuPlan(gpus=(0, 1), slots=(1, 1)))
    reads: list[float] = []
    watch = box.sched.memory
    watch.trees = lambda attempts: reads.append(box.now) or box._trees(attempts)
    box.submit(make_suite(tmp_path, 3))
    box.tick()  # two start; the cards list nothing yet, so nothing is read
    assert reads == [] and len(box.store.live_attempts()) == 2
    a = box.run_on("E1/0-qnli", 0, {101: 8})
    box.tick()
    box.tick()  # the other job has no tree yet (its wrapper's pid not known): read at each look
    assert len(reads) == 2
    box.run_on("E1/1-qnli", 1, {201: 6})
    box.tick()
    box.tick()
    assert len(reads) == 3
    box.procs[0] = [GpuProcess(pid=101, used_mib=10 * GIB)]  # it grows: the same pids, new numbers
    box.tick()
    assert len(reads) == 3 and box.attempt("E1/0-qnli").peak_mib == 10 * GIB
    box.trees[a] = frozenset({99, 101, 102})  # a helper the trainer started opens the card
    box.procs[0].append(GpuProcess(pid=102, used_mib=1 * GIB))
    box.tick()
    assert len(reads) == 4 and box.attempt("E1/0-qnli").peak_mib == 11 * GIB  # 102 counted as the job's
    box.procs[1].append(GpuProcess(pid=4242, used_mib=3 * GIB))  # someone else's, new
    box.tick()
    att = watch.measure(box.store.live_attempts(), box.probe.snapshot(), box.now)
    assert len(reads) == 5 and att.outside_mib == {1: 3 * GIB}
    box.tick(memwatch.TREES_KEPT_S - 2)
    assert len(reads) == 5
    box.tick(2)  # a minute after the last read: a pid may have been reused meanwhile
    assert len(reads) == 6
    box.ex.finish(a, exit_code=0)
    box.procs[0] = []  # its memory released
    box.tick()  # the refill: the ended job reaped, the third placed on its card, nothing read
    assert len(reads) == 6 and box.attempt("E1/2-qnli").gpu == 0
    box.run_on("E1/2-qnli", 0, {301: 5})
    box.tick()  # the new job's process on the card: read, and counted as its
    assert len(reads) == 7 and box.attempt("E1/2-qnli").peak_mib == 5 * GIB


def test_status_does_not_take_a_live_process_for_ours_by_a_reused_pid(tmp_path: Path) -> None:
    # a running job's process the daemon saw on its card exits; hours later someone else's
    # process gets the same pid and opens the same card. It carries no token: it is not ours.
    box = Box(tmp_path, GpuPlan(gpus=(0,), slots=(1,)), cards="1x24GiB")
    box.submit(make_suite(tmp_path, 1))
    box.tick()
    with subprocess.Popen(["sleep", "60"], env={"PATH": os.environ.get("PATH", "")}) as other:
        try:
            token = box.run_on("E1/0-qnli", 0, {other.pid: 8, 102: 4})  # (as if the pid were ours then)
            box.tick()
            box.trees[token] = frozenset({99, 102})  # now the pid is someone else's live process
            gpu = box.status()["gpus"][0]
            assert gpu["processes"] == [
                {"pid": other.pid, "used_mib": 8 * GIB, "ours": False, "job": None},
                {"pid": 102, "used_mib": 4 * GIB, "ours": True, "job": "E1/0-qnli"},
            ]
            assert gpu["outside_mib"] == 8 * GIB
        finally:
            other.kill()


def test_a_restarted_daemon_still_counts_an_ended_jobs_releasing_memory_as_ours(tmp_path: Path) -> None:
    gone = 2**22 + 1  # above any pid_max: an exited process the driver still lists
    box = Box(tmp_path, GpuPlan(gpus=(0,), slots=(1,)), cards="1x24GiB")
    box.submit(make_suite(tmp_path, 1))
    box.tick()
    token = box.run_on("E1/0-qnli", 0, {gone: 8})
    box.tick()
    box.ex.finish(token, exit_code=0)
    box.tick()
    restarted = MemoryWatch(box.store)  # what a new daemon starts with: nothing in memory
    att = restarted.measure([], box.probe.snapshot(), box.now + 1)
    assert att.outside_mib.get(0, 0) == 0 and att.owner(0, gone).ending  # type: ignore[union-attr]
    box.procs[0] = []  # released
    restarted.measure([], box.probe.snapshot(), box.now + 2)
    assert restarted.releasing == {}


def test_a_job_running_on_a_card_it_was_not_given_is_reported_once(tmp_path: Path) -> None:
    box = Box(tmp_path, GpuPlan(gpus=(0, 1), slots=(1, 1)))
    box.submit(make_suite(tmp_path, 1))
    box.tick()
    gpu = box.attempt("E1/0-qnli").gpu
    box.run_on("E1/0-qnli", 1 - gpu, {101: 3})  # it ignored CUDA_VISIBLE_DEVICES
    box.tick()
    box.tick()
    notes = [e for e in box.store.events("E1/0-qnli") if e["kind"] == "misplaced"]
    assert (
        len(notes) == 1 and f"was given GPU {gpu}" in notes[0]["message"] and "pid 101" in notes[0]["message"]
    )


def test_status_renders_memory_outsiders_and_host_waits(tmp_path: Path) -> None:
    box = Box(tmp_path, GpuPlan(gpus=(0, 1), slots=(1, 1)))
    box.procs[0] = [GpuProcess(pid=4242, used_mib=5 * GIB)]
    box.submit(make_suite(tmp_path, 1))
    box.tick()
    box.host = HostMemory(available_mib=1 * GIB, total_mib=256 * GIB)
    text = format_status(box.status(), width=200)
    assert "pid 4242 5.0 GiB" in text and "launches wait: host RAM low" in text and "~20.6 default" in text


def _one_job_suite(tmp: Path, name: str, task: str) -> Suite:
    (tmp / "train.py").touch()  # the script its command runs: launches wait while it is missing
    return Suite(
        name=name,
        plan_path=str(tmp / f"{name}.yaml"),
        workdir=str(tmp),
        logs_dir=str(tmp / "logs" / name),
        command="python train.py --config {config}",
        base_config=None,
        tiers=TIERS,
        jobs=(JobSpec(suite=name, name=task, task=task),),
    )


def _night_until_boolq_settles(tmp: Path, *, mrpc_settles: bool, mrpc_first_gib: float = 7) -> Box:
    """An mrpc job runs alone and ends ok: it holds 7 GiB, then 8.4 GiB at its evaluation
    (``mrpc_settles``: it stays at 7 GiB long enough to count as settled before it grows).
    Then the night's first boolq runs, its peak a guess, and sits at 12.9 GiB; one more mrpc
    (its peak known: 8.4 GiB) waits in the queue for the card's other slot."""
    box = Box(tmp, GpuPlan(gpus=(0,), slots=(2,)), cards="1x24GiB")
    box.submit(_one_job_suite(tmp, "S1", "mrpc"))
    box.tick()
    token = box.run_on("S1/mrpc", 0, {101: mrpc_first_gib})
    box.tick()  # seen at its first level
    box.tick(61 if mrpc_settles else 1)
    box.run_on("S1/mrpc", 0, {101: 8.4})
    box.tick()
    box.ex.finish(token, exit_code=0)
    box.procs[0] = []
    box.tick(31)  # reaped, its memory released
    box.submit(_one_job_suite(tmp, "S2", "boolq"))
    assert box.tick().launched == [("S2/boolq", 0, "A")]
    assert box.attempt("S2/boolq").prediction_source == "default"
    box.run_on("S2/boolq", 0, {201: 12.9})
    box.tick()
    box.tick(61)  # settled
    box.submit(_one_job_suite(tmp, "S3", "mrpc"))
    return box


def test_a_settled_job_whose_peak_is_a_guess_keeps_room_for_what_jobs_grew_by_after_settling(
    tmp_path: Path,
) -> None:
    # 12.9 + 8.4 GiB fit under the card's 21.6 GiB (10 % headroom), but mrpc grew by 1.2x after
    # settling: the boolq may yet reach ~15.5 GiB (at its evaluation), and 15.5 + 8.4 does not fit
    box = _night_until_boolq_settles(tmp_path / "learned", mrpc_settles=True)
    mrpc = box.attempt("S1/mrpc")
    assert box.store.settled(mrpc.id) == 7 * GIB
    assert box.store.step_up(2.0) == pytest.approx(8.4 / 7, rel=1e-3)
    assert box.store.settled(box.attempt("S2/boolq").id) == int(12.9 * GIB)
    assert box.tick().launched == []
    assert (box.store.job("S3/mrpc").wait_reason or "").startswith(  # type: ignore[union-attr]
        "GPU 0 has 8.5 GiB free after 2.6 GiB reserved for running jobs yet to grow"
    )
    # a restarted daemon (a new scheduler on the same store) still knows both
    box.sched = Scheduler(
        box.store, box.probe, {"fake": box.ex}, process_trees=box._trees, host_memory=lambda: box.host
    )
    assert box.tick().launched == []
    # the boolq reached its peak: nothing more to keep for it, and 15.5 + 8.4 GiB still do not fit
    box.run_on("S2/boolq", 0, {201: 15.5})
    assert box.tick().launched == []
    # without a step-up learned (mrpc grew before it ever settled), the mrpc goes beside it at once
    fresh = _night_until_boolq_settles(tmp_path / "unlearned", mrpc_settles=False)
    assert fresh.store.step_up(2.0) is None
    assert fresh.tick().launched == [("S3/mrpc", 0, "A")]


def test_a_pause_at_a_fraction_of_the_peak_is_not_taken_for_settling(tmp_path: Path) -> None:
    # the mrpc sat at 3 GiB for a minute (loading its data before its model, say), then went to
    # 8.4 GiB: 2.8x is not a plateau before an evaluation, and would make every guess hold far too
    # much; the 3 GiB is forgotten, and as the mrpc ended before it settled again, nothing is learned
    box = _night_until_boolq_settles(tmp_path, mrpc_settles=True, mrpc_first_gib=3)
    assert box.store.settled(box.attempt("S1/mrpc").id) is None
    assert box.store.step_up(2.0) is None
    assert box.tick().launched == [("S3/mrpc", 0, "A")]


def test_a_job_that_grew_past_a_pause_is_held_from_its_next_plateau(tmp_path: Path) -> None:
    box = Box(tmp_path, GpuPlan(gpus=(0,), slots=(1,)), cards="1x24GiB")
    box.submit(_one_job_suite(tmp_path, "S1", "boolq"))
    box.tick()
    box.run_on("S1/boolq", 0, {301: 0.5})  # its CUDA context, while it loads data
    box.tick()
    box.tick(61)
    assert box.store.settled(box.attempt("S1/boolq").id) == GIB // 2
    box.run_on("S1/boolq", 0, {301: 6})  # its model: the half GiB was a pause, not a plateau
    box.tick()
    assert box.store.settled(box.attempt("S1/boolq").id) is None
    box.tick(61)
    assert box.store.settled(box.attempt("S1/boolq").id) == 6 * GIB
