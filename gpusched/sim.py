"""A discrete-event simulation that drives the REAL :class:`~gpusched.scheduler.Scheduler`.

Nothing is faked inside the scheduler: a real SQLite store (in a temporary directory, never
the user's queue), real attempt directories, real ``outcome.classify`` of real-looking logs.
Around it:

* a fake clock: ``tick(now=...)`` at every event (a job ends or dies, memory grows, an
  outside process comes or goes) and every ``heartbeat_s`` in between, as the daemon would;
* a :class:`~gpusched.gpus.fake.FakeProbe` whose memory is the sum of what the simulated jobs
  hold now (each with a ramp-up curve: start-up, ramp to a plateau, later a step up to its
  peak, e.g. at evaluation; never down, as PyTorch's caching allocator) plus outside
  processes, listed per process with the job's own pid;
* the :class:`~gpusched.executors.fake.FakeExecutor`: the simulation ends attempts as the
  wrapper would, with ``exit.json``, ``runtime.json`` (the in-job helper's peak) and
  ``output.log``.

A card whose processes would hold more than its capacity OOMs the way a real card does:
the process that allocated last dies (the job whose usage just grew, the youngest if several
did); its log ends with a genuine ``torch.OutOfMemoryError: CUDA out of memory ...`` message
naming the other processes on the card, so ``outcome.classify`` sees an OOM (and contention).
A process's memory is released a moment after it ends.

A trace gives each job, per tier, its peak memory, duration and ramp-up time; every run
draws noise around them. Policies other than gpusched's own are the baselines of
``benchmarks/placement.py``; they run through the same scheduler with placement swapped
(:data:`POLICIES`).

A night may be measured with history in the store (``Simulation.prior_nights``): the same
trace first runs that many times, each night a suite of its own run to completion with noise
of its own, and the measured night is submitted when the last of them ends. Its result is
about it alone, on a clock that starts at its submit. A first night (the default) starts with
every peak and run time unknown; a later one with what the earlier nights taught.
``Simulation.history`` gives it, instead, what a real queue measured (``gpusched simulate``
replaying a suite after a real night): those runs are written into the store, ended before the
clock starts, as the scheduler tonight would find them.
"""

from __future__ import annotations

import json
import math
import random
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec
from msgspec import Struct, field
from msgspec.structs import replace

from gpusched import disk, placement, predict, report
from gpusched.executors.fake import FakeExecutor
from gpusched.gpus.fake import FakeProbe, FakeUsage
from gpusched.memory import HostMemory
from gpusched.model import (
    MIB_PER_GIB,
    OOM_EXIT_CODE,
    Classification,
    ExitRecord,
    GpuPlan,
    GpuProcess,
    GpuState,
    JobSpec,
    Outcome,
    Step,
    StepKind,
    Suite,
)
from gpusched.scheduler import Scheduler, Settings
from gpusched.store import NewAttempt, Store

#: Past runs by task, as ``memwatch.records`` reads them from a queue: peak samples, and the
#: successful runs' times.
History = tuple[Mapping[str, Sequence[predict.PeakSample]], Mapping[str, Sequence[predict.RunSample]]]

CONTEXT_MIB = 500  # a CUDA context, held from a job's first touch of the GPU
STARTUP_S = 20.0  # imports and data loading before a job touches the GPU
PLATEAU = 0.85  # share of its peak a job holds between ramp-up and its first peak
RELEASE_S = 2.0  # a dead process's memory is freed this long after it ends
TIER_MEMORY = (
    1.0,
    0.50,
    0.30,
    0.12,
)  # activations kept per tier (A, B: checkpointing, C: half batch, D: batch 1)
TIER_SLOWDOWN = (1.0, 1.08, 1.20, 1.50)
LOGITS_SAVED_MIB = 512  # B and later keep only the last logits
MODEL_MIB = 4608  # weights + LoRA + optimizer + context of the example model; independent of tier


# --------------------------------------------------------------------------- traces


#: a trace job's time to grow to its plateau, where the trace gives none
RAMP_S = 120.0


class TierProfile(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    peak_mib: int
    duration_s: float  # alone on its card
    ramp_s: float = RAMP_S
    # the share of its card's time it keeps busy alone (NVML's util / 100): a card whose jobs
    # want more than all of it runs each of them slower by their total (0: sharing is free)
    util: float = 0.0


class TraceJob(Struct, frozen=True, kw_only=True):
    name: str
    task: str
    tiers: tuple[TierProfile, ...]  # one per tier of the ladder, A first


class Outsider(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Someone else's process on a card, from ``start_s`` to ``end_s``."""

    gpu: int
    mib: int
    start_s: float = 0.0
    end_s: float = math.inf
    pid: int = 0  # 0: assigned by the simulation


class Trace(Struct, frozen=True, kw_only=True):
    jobs: tuple[TraceJob, ...]
    outsiders: tuple[Outsider, ...] = ()
    noise: float = 0.03  # relative spread of each run's peak and duration


def ladder_profiles(
    peak_a_mib: int, duration_a_s: float, ramp_s: float, tiers: int = 4
) -> tuple[TierProfile, ...]:
    """A job's profile at every tier from its tier-A figures: the model's share stays, the
    activations shrink per :data:`TIER_MEMORY`, the run slows per :data:`TIER_SLOWDOWN`."""
    acts = max(0, peak_a_mib - MODEL_MIB)
    out = []
    for t in range(tiers):
        k = min(t, len(TIER_MEMORY) - 1)
        saved = LOGITS_SAVED_MIB if t > 0 else 0
        peak = MODEL_MIB + max(0, int(acts * TIER_MEMORY[k]) - saved) if acts else peak_a_mib
        out.append(
            TierProfile(
                peak_mib=min(peak, peak_a_mib), duration_s=duration_a_s * TIER_SLOWDOWN[k], ramp_s=ramp_s
            )
        )
    return tuple(out)


def synthetic_trace(jobs: Sequence[tuple[str, str]], *, seed: int = 0, tiers: int = 4) -> Trace:
    """A trace for (name, task) pairs: per task a tier-A peak (4.5 GiB of model plus
    lognormal activations around 6 GiB, a few tasks far more) and a duration of 20-90 min;
    per job a little spread around its task."""
    rng = random.Random(seed)
    task_fig: dict[str, tuple[int, float]] = {}
    out = []
    for name, task in jobs:
        if task not in task_fig:
            acts = min(24 * MIB_PER_GIB, int(rng.lognormvariate(math.log(6 * MIB_PER_GIB), 0.55)))
            task_fig[task] = (MODEL_MIB + acts, rng.uniform(20, 90) * 60)
        peak, dur = task_fig[task]
        peak = int(peak * rng.uniform(0.95, 1.05))
        out.append(
            TraceJob(
                name=name,
                task=task,
                tiers=ladder_profiles(peak, dur * rng.uniform(0.9, 1.1), rng.uniform(60, 240), tiers),
            )
        )
    return Trace(jobs=tuple(out))


class _JobFigures(Struct, kw_only=True, forbid_unknown_fields=True):
    """A trace file's job as given: each tier's figures, or tier A's alone."""

    name: str | int
    task: str | int | None = None
    tiers: list[TierProfile] | None = None
    peak_mib: int | None = None
    duration_s: float | None = None
    ramp_s: float = RAMP_S
    util: float | None = None


class _TraceFile(Struct, kw_only=True, forbid_unknown_fields=True):
    """A trace file as given (:func:`load_trace`)."""

    jobs: list[_JobFigures] = []
    outsiders: list[Outsider] = []
    noise: float = 0.03


def load_trace(path: str | Path) -> Trace:
    """A trace file (JSON, or YAML)::

        {"noise": 0.03,
         "jobs": [{"name": "87-qnli", "task": "qnli",
                   "tiers": [{"peak_mib": 15000, "duration_s": 3600, "ramp_s": 120}, ...]},
                  {"name": "88-qnli", "task": "qnli", "peak_mib": 15000, "duration_s": 3600}],
         "outsiders": [{"gpu": 3, "mib": 8000, "start_s": 0, "end_s": 7200}]}

    A job given by tier-A figures only (``peak_mib``, ``duration_s``, ``ramp_s``) gets the
    other tiers from :func:`ladder_profiles`. ``util`` (a tier's, or the job's for every
    tier; default 0): the share of its card's time a run keeps busy alone, e.g. 0.9 for a
    compute-bound trainer; cards whose jobs want more than all of it run them slower.
    :class:`ValueError` for anything else, saying what and where (``$.jobs[0].peak_mib``).
    Numbers may be given as text: YAML reads ``1e+18`` (what :func:`trace_to_json` writes for
    an outsider that never leaves) as text."""
    from gpusched.matrix import JOB_NAME_RE, JOB_NAME_RULE
    from gpusched.yamlfields import read_yaml  # (JSON is YAML: one reader, one line per mistake)

    raw = read_yaml(Path(path), f"--trace {path}", strict=False)
    try:
        given = msgspec.convert({} if raw is None else raw, _TraceFile, strict=False)
    except msgspec.ValidationError as e:  # ("Expected `int`, got `str` - at `$.jobs[0].peak_mib`")
        raise ValueError(f"{e}; a trace is a mapping with a list under 'jobs:'") from None
    jobs = []
    names: set[str] = set()
    for j in given.jobs:
        name = str(j.name)  # a folder's name in the replay, as a plan's job's is
        if not JOB_NAME_RE.fullmatch(name):
            raise ValueError(f"job name {name!r}: {JOB_NAME_RULE}, as in a plan")
        if name in names:
            raise ValueError(f"job name {name!r} is given twice: each job needs a name of its own")
        names.add(name)
        if j.tiers is not None:
            profiles = tuple(j.tiers)
        elif j.peak_mib is None or j.duration_s is None:
            missing = " and ".join(k for k in ("peak_mib", "duration_s") if getattr(j, k) is None)
            raise ValueError(f"job {name} has no {missing}: give each job tiers, or peak_mib and duration_s")
        else:
            profiles = ladder_profiles(j.peak_mib, j.duration_s, j.ramp_s)
            if j.util is not None:
                profiles = tuple(replace(p, util=j.util) for p in profiles)
        for p in profiles:
            if not 0.0 <= p.util <= 1.0:
                raise ValueError(
                    f"job {name}: util {p.util:g} is not a share of a card between 0 and 1"
                    f" (0.9 for a run that keeps its card 90 % busy)"
                )
        jobs.append(TraceJob(name=name, task=str(name if j.task is None else j.task), tiers=profiles))
    return Trace(jobs=tuple(jobs), outsiders=tuple(given.outsiders), noise=given.noise)


def trace_to_json(trace: Trace) -> str:
    """``trace`` as JSON that :func:`load_trace` reads back (an endless outsider ends at 1e18 s)."""
    doc = msgspec.to_builtins(trace)
    for o in doc["outsiders"]:
        if o["end_s"] == math.inf:
            o["end_s"] = 1e18
    return json.dumps(doc, indent=1)


# --------------------------------------------------------------------------- policies


class Policy(Struct, frozen=True, kw_only=True):
    name: str
    label: str
    assign: Callable[..., placement.Decision] | None = None  # None: placement.assign
    blind: bool = False  # the scheduler sees no memory at all (places by slots)
    memory_aware: bool = True  # start safer, holds


def _in_queue_order(
    decision: placement.Decision, queued: Sequence[placement.QueuedJob]
) -> placement.Decision:
    """``decision`` with its waits in the scheduler's queue order (``AssignFn``'s contract): a
    baseline places ``plain`` copies of the jobs, ordered without their run times."""
    rank = {j.job_id: placement.job_order(j) for j in queued}
    return replace(decision, waits=tuple(sorted(decision.waits, key=lambda w: rank[w.job_id])))


def static_assign(order: Sequence[int]) -> Callable[..., placement.Decision]:
    """Seed 004's tmux launcher: job k (in submit order) is bound to GPU ``order[k % n]``
    (the plan's slots dealt round-robin) and runs there whenever that card has a free slot."""

    def assign(
        queued: Sequence[placement.QueuedJob], views: Sequence[placement.GpuSlotView], *, headroom_frac: float
    ) -> placement.Decision:
        pinned = []
        for j in queued:
            g = order[(j.seq - 1) % len(order)]
            pinned.append(replace(plain(j), allowed={g: j.allowed.get(g, 0)}, predicted_mib=None))
        return _in_queue_order(placement.assign(pinned, views, headroom_frac=headroom_frac), queued)

    return assign


def ts_assign(free_frac: float = 0.90) -> Callable[..., placement.Decision]:
    """task-spooler's GPU mode: a card is free when at least ``free_frac`` of its memory is
    free; nothing is known of the jobs (a just-started one that has not allocated yet leaves
    its card looking free)."""

    def assign(
        queued: Sequence[placement.QueuedJob], views: Sequence[placement.GpuSlotView], *, headroom_frac: float
    ) -> placement.Decision:
        seen = []
        for v in views:
            free = v.free_mib is not None and v.total_mib and v.free_mib >= free_frac * v.total_mib
            blank = replace(v, free_mib=None, total_mib=None, reserved_mib=0, held_for=None)
            seen.append(blank if free else replace(blank, running=10**9))
        blind = [replace(plain(j), predicted_mib=None) for j in queued]
        return _in_queue_order(placement.assign(blind, seen, headroom_frac=headroom_frac), queued)

    return assign


def plain(job: placement.QueuedJob) -> placement.QueuedJob:
    """``job`` as a baseline sees it: no run time (its own or its task's) to order the queue
    by, no slower tier to fall back to (other tools run jobs in the order given, at the tier
    given; the OOM ladder that every policy gets stands for relaunching by hand)."""
    return replace(job, predicted_s=None, chain_s=None, fallback=(), pack_now=False, faster=())


def fifo_assign(
    queued: Sequence[placement.QueuedJob], views: Sequence[placement.GpuSlotView], *, headroom_frac: float
) -> placement.Decision:
    """Slot-only least-loaded placement (gpusched v1): :func:`placement.assign` on jobs in the
    order given (the scheduler's probe is blind for this policy, so no memory is known)."""
    return _in_queue_order(
        placement.assign([plain(j) for j in queued], views, headroom_frac=headroom_frac), queued
    )


def plan_order(plan: GpuPlan) -> list[int]:
    """The plan's slots dealt round-robin over its GPUs: 2,2,1 on 0,1,2 -> 0,1,2,0,1."""
    out, left = [], dict(zip(plan.gpus, plan.slots, strict=True))
    while any(left.values()):
        for g in plan.gpus:
            if left[g] > 0:
                out.append(g)
                left[g] -= 1
    return out


def policies(plan: GpuPlan) -> dict[str, Policy]:
    return {
        "static": Policy(
            name="static",
            label="static round-robin (seed 004 tmux launcher)",
            assign=static_assign(plan_order(plan)),
            blind=True,
            memory_aware=False,
        ),
        "ts": Policy(
            name="ts",
            label="ts-style: card free when >= 90 % of its memory is free",
            assign=ts_assign(),
            memory_aware=False,
        ),
        "slots": Policy(
            name="slots",
            label="slot-only least-loaded (gpusched v1)",
            assign=fifo_assign,
            blind=True,
            memory_aware=False,
        ),
        "gpusched": Policy(name="gpusched", label="gpusched memory-aware"),
    }


POLICIES = ("static", "ts", "slots", "gpusched")


# --------------------------------------------------------------------------- results


class OomEvent(Struct, frozen=True, kw_only=True):
    at_s: float
    job_id: str
    tier: str
    gpu: int
    colocated: bool  # other processes held memory on the card
    learned: bool  # a job of its task had already finished at this tier (its peak was known)
    # an outside process that started after the job did took the memory the job grew into:
    # the card had room for it without that arrival, which no placement could see coming
    arrival: bool = False
    prediction_source: str | None  # of the attempt that died
    lost_s: float


class SimResult(Struct, frozen=True, kw_only=True):
    policy: str
    label: str
    jobs: int
    gpus: int
    slots: int
    makespan_s: float
    lower_bound_s: float
    succeeded: int
    failed: int
    attempts: int
    ooms: tuple[OomEvent, ...]
    gpu_hours_lost: float
    mem_util: float  # time-averaged share of all cards' memory in use, over the makespan
    tiers: Mapping[str, int]  # successful runs per tier
    outsider_ooms: int = 0  # outside processes whose allocation failed
    finished: bool = True  # False: stopped at max_s with jobs left
    history_runs: int = 0  # past runs in the store before the night (``Simulation.history``)
    report: Any = None  # gpusched.report.SuiteReport of the night

    @property
    def oom_count(self) -> int:
        return len(self.ooms)

    @property
    def colocated_ooms(self) -> int:
        return sum(1 for o in self.ooms if o.colocated)

    @property
    def learned_colocated_ooms(self) -> int:
        """Co-located OOMs of a job whose peak was known, that placement could have avoided:
        not those an outside process's later arrival caused (:attr:`arrival_ooms`)."""
        return sum(1 for o in self.ooms if o.colocated and o.learned and not o.arrival)

    @property
    def arrival_ooms(self) -> int:
        """OOMs of our jobs that an outside process arriving on their card after they started
        caused (the card had room for them without it)."""
        return sum(1 for o in self.ooms if o.arrival)

    def as_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "label": self.label,
            "jobs": self.jobs,
            "gpus": self.gpus,
            "slots": self.slots,
            "makespan_s": round(self.makespan_s, 1),
            "lower_bound_s": round(self.lower_bound_s, 1),
            "makespan_over_bound": round(self.makespan_s / self.lower_bound_s, 3)
            if self.lower_bound_s
            else None,
            "succeeded": self.succeeded,
            "failed": self.failed,
            "attempts": self.attempts,
            "ooms": self.oom_count,
            "colocated_ooms": self.colocated_ooms,
            "learned_colocated_ooms": self.learned_colocated_ooms,
            "arrival_ooms": self.arrival_ooms,
            "gpu_hours_lost": round(self.gpu_hours_lost, 2),
            "mem_util": round(self.mem_util, 3),
            "tiers": dict(self.tiers),
            "outsider_ooms": self.outsider_ooms,
            "finished": self.finished,
            "history_runs": self.history_runs,
        }


def lower_bound_s(trace: Trace, plan: GpuPlan, totals_mib: Sequence[int]) -> float:
    """A makespan no schedule can beat: the largest of (1) total GPU work / slots, each job at
    its fastest tier that fits a card, (2) total memory-time / total memory, each job at the
    tier with the least peak x duration, (3) the longest job at its fastest tier, and (4) the
    cards' busy time the jobs need (duration x ``util``, the least over their tiers) / cards.
    Each bound holds alone, so their maximum does; it need not be reachable."""
    cards = [totals_mib[g] for g in plan.gpus if g < len(totals_mib)]
    if not trace.jobs or not cards:
        return 0.0
    fits = [[p for p in j.tiers if p.peak_mib <= max(cards)] or [j.tiers[-1]] for j in trace.jobs]
    fastest = [min(p.duration_s for p in f) for f in fits]
    area = sum(min(p.peak_mib * p.duration_s for p in f) for f in fits)
    busy = sum(min(p.duration_s * p.util for p in f) for f in fits)
    used = sum(1 for g in plan.gpus if g < len(totals_mib) and plan.cap(g))
    return max(sum(fastest) / max(1, plan.total_slots), area / sum(cards), max(fastest), busy / max(1, used))


# --------------------------------------------------------------------------- the simulation


class _Run(Struct):
    token: str
    job_id: str
    tier: int
    gpu: int
    pid: int
    start_s: float
    peak_mib: int
    duration_s: float
    ramp_s: float
    spike_s: float  # elapsed time at which it reaches its peak
    source: str | None
    used_mib: int = 0
    util: float = 0.0  # TierProfile.util
    lag_s: float = 0.0  # how much longer than alone it has taken so far, its card being shared

    def usage(self, now: float) -> int:
        e = now - self.start_s - STARTUP_S
        if e < 0:
            return 0
        ctx = min(CONTEXT_MIB, self.peak_mib)
        plateau = max(ctx, int(self.peak_mib * PLATEAU))
        if e < self.ramp_s:
            return int(ctx + (plateau - ctx) * e / self.ramp_s)
        return self.peak_mib if e >= self.spike_s else plateau


class _Gone(Struct):
    gpu: int
    pid: int
    mib: int
    until_s: float


def _roomy_disk(path: str) -> disk.DiskFree:
    return disk.DiskFree(path=path, free_mib=None, total_mib=None, free_inodes=None)  # unknown: never waits


class Simulation(Struct, dict=True):  # dict: a run's state, set up by run()
    trace: Trace
    plan: GpuPlan
    totals_mib: Sequence[int]
    policy: Policy
    suite: Suite | None = None  # tiers, env...; default: a suite named "sim" with the default ladder
    seed: int = 0
    dt_s: float = 5.0
    heartbeat_s: float = 30.0
    max_s: float = 30 * 86400.0  # of one night
    settings: Settings | None = None
    events: list[str] = field(default_factory=list)  # every night's (job ids name their suite)
    #: the same trace runs this many times first, in the same store and under the same daemon,
    #: each night a suite of its own (``<suite>-prior-1``, ...) run to completion with noise
    #: seeded apart; the measured night is submitted as the last of them ends (once its
    #: processes have left the cards, a few seconds on). Every figure of
    #: the result (makespan, OOMs, memory use, the report) is of the measured night alone, on a
    #: clock that starts at its submit; an OOM counts as after learning if any night had a job
    #: of its task finish at its tier.
    prior_nights: int = 0
    #: runs a real queue measured (``memwatch.records``: peak samples by task, the successful
    #: ones' run times by task), written into the store before anything else as a suite of
    #: their own (``<suite>-history``, a job per run, each ended before the clock starts at
    #: its tier, peak and outcome): the scheduler predicts the night's jobs from them by task,
    #: as it would a rerun's tonight. Only tasks of the trace are kept.
    history: History | None = None

    def run(self, workdir: Path | None = None) -> SimResult:
        """Simulate in ``workdir`` (its store, ``sim.db``, is left there to read), else in a
        temporary directory."""
        if workdir is not None:
            return self._run(workdir)
        with tempfile.TemporaryDirectory(prefix="gpusched-sim-") as tmp:
            return self._run(Path(tmp))

    # ------------------------------------------------------------------ setup

    def _run(self, tmp: Path) -> SimResult:
        self.now = 0.0
        self.runs: dict[str, _Run] = {}
        self.gone: list[_Gone] = []
        self.outsider_set: frozenset[int] | None = None
        self.adopted = 0  # launch requests turned into runs
        self.learned: set[tuple[str, int]] = set()  # (task, tier) that some job finished, any night
        self.next_pid = 40000
        self.outsiders = [replace(o, pid=o.pid or 90000 + i) for i, o in enumerate(self.trace.outsiders)]
        self.profiles = {j.name: j for j in self.trace.jobs}
        suite = self._suite(tmp)
        self.store = Store(tmp / "sim.db")
        self.ex = FakeExecutor(name="fake")
        self.probe = FakeProbe(self.totals_mib, usage=self._usage, clock=lambda: self.now)
        self.sched = Scheduler(
            self.store,
            self.probe,
            {"fake": self.ex},
            settings=self._settings(),
            on_event=self.events.append,
            process_trees=self._trees,
            host_memory=lambda: HostMemory(available_mib=200 * MIB_PER_GIB, total_mib=251 * MIB_PER_GIB),
            disk_free=_roomy_disk,  # a "what if" does not depend on this machine's disk
            assign=self.policy.assign,
        )
        try:
            written = self._write_history(tmp, f"{suite.name}-history") if self.history else 0
            for k in range(1, self.prior_nights + 1):
                prior = self._suite(tmp, name=f"{suite.name}-prior-{k}")
                if not self._night(prior, tmp, random.Random(f"{self.seed}/prior-night/{k}")):
                    raise RuntimeError(f"{prior.name}: not done after {self.max_s:.0f} s")
                while self.gone:  # its last processes leave the cards before the next night's submit
                    self.now += self.dt_s
                    self._advance()
            finished = self._night(suite, tmp, random.Random(self.seed))
            result = self._result(suite.name, finished=finished)
            # the same report (and timeline) as `gpusched report` gives for a real night
            night = report.from_store(self.store, suite.name, now=self.now)
            return replace(result, report=night, history_runs=written)
        finally:
            self.store.close()

    def _write_history(self, tmp: Path, name: str) -> int:
        """``history`` into the store: one job of suite ``name`` per past run, begun and ended
        through the store's own transitions at times before 0. Returns how many."""
        assert self.history is not None
        peaks, runs = self.history
        tasks = {j.task for j in self.trace.jobs}
        seconds: dict[tuple[str, int], list[float]] = {}
        for task in sorted(tasks & set(runs)):
            for r in runs[task]:
                seconds.setdefault((r.job_id, r.tier), []).append(r.seconds)
        samples = [p for task in sorted(tasks & set(peaks)) for p in peaks[task]]
        if not samples:
            return 0
        base = self._suite(tmp, name=name)
        tiers = base.tiers
        jobs = tuple(JobSpec(suite=name, name=f"run-{i}", task=p.task) for i, p in enumerate(samples))
        self.store.submit(
            replace(base, jobs=jobs), self.plan, backend="fake", cwd=str(tmp), env_path=None, now=-1.0
        )
        for i, (job, p) in enumerate(zip(jobs, samples, strict=True)):
            outcome = Outcome(p.outcome)  # as the store recorded it
            ok = outcome == Outcome.OK
            took = seconds.get((p.job_id, p.tier), [])
            run_s = took.pop(0) if ok and took else 0.0  # no run time known: none recorded
            ended = -1.0 - i
            aid = self.store.begin_attempt(
                NewAttempt(
                    job_id=job.id,
                    tier=p.tier,
                    tier_name=tiers[min(p.tier, len(tiers) - 1)].name,
                    gpu=None,
                    gpu_uuid=None,
                    backend="fake",
                    dir=str(tmp / "logs" / name / job.name),
                    token=f"history-{i}",
                    placement_reason="measured by the queue simulated from",
                    predicted_mib=p.predicted_mib,
                    prediction_source="history",
                ),
                now=ended - run_s,
            )
            self.store.mark_running(aid, {}, now=ended - run_s)
            code = 0 if ok else OOM_EXIT_CODE if outcome == Outcome.OOM else 1
            self.store.finish_attempt(
                aid,
                exit=ExitRecord(
                    exit_code=code, started_at=ended - run_s, ended_at=ended, peak_mib=p.peak_mib
                ),
                result=Classification(outcome=outcome, reason="a run of the queue simulated from"),
                step=Step(kind=StepKind.DONE if ok else StepKind.FAIL, tier=p.tier, reason="history"),
                now=ended,
            )
            if ok:
                self.learned.add((p.task, p.tier))
        return len(samples)

    def _night(self, suite: Suite, tmp: Path, rng: random.Random) -> bool:
        """Submit ``suite`` now and run until it is done (True) or ``max_s`` has passed. What
        the result counts starts afresh: OOMs, memory use, outsiders (they come and go on the
        night's own clock)."""
        self.rng = rng
        self.night = suite.name
        self.start_s = self.now
        self.ooms: list[OomEvent] = []
        self.outsider_ooms = 0
        self.dead_outsiders: set[int] = set()
        self.mem_integral = 0.0
        self.store.submit(suite, self.plan, backend="fake", cwd=str(tmp), env_path=None, now=self.now)
        return self._loop()

    def _suite(self, tmp: Path, name: str | None = None) -> Suite:
        from gpusched.tiers import DEFAULT_ENV, default_tiers

        base = self.suite or Suite(
            name="sim",
            plan_path=str(tmp / "sim.yaml"),
            workdir=str(tmp),
            logs_dir="",
            command="true {config}",
            base_config=None,
            env=dict(DEFAULT_ENV),
            tiers=default_tiers(),
        )
        name = name or base.name
        jobs = tuple(JobSpec(suite=name, name=j.name, task=j.task) for j in self.trace.jobs)
        return replace(
            base, name=name, workdir=str(tmp), logs_dir=str(tmp / "logs" / name), jobs=jobs, resume=None
        )

    def _settings(self) -> Settings:
        s = self.settings or Settings()
        if not self.policy.memory_aware:
            s = replace(s, start_safer=False, pack_after_s=math.inf, hold_after_s=math.inf)
        return s

    # ------------------------------------------------------------------ the loop

    def _loop(self) -> bool:
        """Tick until the night is done (True) or ``max_s`` has passed."""
        next_beat = self.now
        self._tick()
        while self.now - self.start_s < self.max_s:
            self.now += self.dt_s
            changed = self._advance()
            if changed or self.now >= next_beat:
                next_beat = self.now + self.heartbeat_s
                self._tick()
                if not self.runs and self._all_done():
                    return True
        return False

    def _tick(self) -> None:
        snap = self.probe.snapshot()
        if self.policy.blind:
            snap = [GpuState(index=g.index, uuid=g.uuid, name=g.name, sampled_at=g.sampled_at) for g in snap]
        self.sched.tick(self.now, snapshot=snap)
        self._adopt_launches()

    def _all_done(self) -> bool:
        c = self.store.counts(suites=[self.night])
        return c["queued"] == 0 and c["running"] == 0

    def _adopt_launches(self) -> None:
        for req in self.ex.launched[self.adopted :]:
            self.adopted += 1
            row = self.store.db.execute(
                "SELECT job_id, tier, gpu, prediction_source FROM attempts WHERE token = ?", (req.token,)
            ).fetchone()
            name = row["job_id"].split("/", 1)[1]
            prof = self.profiles[name].tiers[min(row["tier"], len(self.profiles[name].tiers) - 1)]
            noise = self.trace.noise
            peak = int(prof.peak_mib * (1 + self.rng.uniform(-noise, noise)))
            dur = prof.duration_s * (1 + self.rng.uniform(-noise, noise))
            ramp = prof.ramp_s * self.rng.uniform(0.8, 1.2)
            spike = self.rng.uniform(ramp, max(ramp, 0.5 * dur))
            self.next_pid += 1
            self.runs[req.token] = _Run(
                token=req.token,
                job_id=row["job_id"],
                tier=row["tier"],
                gpu=row["gpu"] if row["gpu"] is not None else 0,
                pid=self.next_pid,
                start_s=self.now,
                peak_mib=peak,
                duration_s=dur,
                ramp_s=ramp,
                spike_s=spike,
                source=row["prediction_source"],
                util=prof.util,
            )

    # ------------------------------------------------------------------ physics

    def _advance(self) -> bool:
        """Move every job to ``now``: ends, memory growth, OOMs, outsiders. True if anything
        the scheduler should react to happened."""
        changed = self._outsiders_changed()
        self._share()
        for run in [r for r in self.runs.values() if self.now - r.start_s - r.lag_s >= r.duration_s]:
            self._finish(run)
            changed = True
        before = len(self.gone)
        self.gone = [g for g in self.gone if g.until_s > self.now]
        changed |= len(self.gone) != before
        for gpu, total in enumerate(self.totals_mib):
            changed |= self._settle(gpu, total)
        for run in self.runs.values():
            run.used_mib = run.usage(self.now)
        self.mem_integral += self.dt_s * sum(
            min(self._card_used(g), t) for g, t in enumerate(self.totals_mib)
        )
        return changed

    def _share(self) -> None:
        """The last step on a card whose jobs wanted more than all of its time (the sum of
        their ``util`` over 1) gave each of them 1 / that sum of a step's progress."""
        wanted: dict[int, float] = {}
        for r in self.runs.values():
            wanted[r.gpu] = wanted.get(r.gpu, 0.0) + r.util
        for r in self.runs.values():
            if wanted[r.gpu] > 1.0:
                r.lag_s += self.dt_s * (1.0 - 1.0 / wanted[r.gpu])

    def _active_outsiders(self) -> list[Outsider]:
        return [
            o
            for o in self.outsiders
            if o.start_s <= self.now - self.start_s < o.end_s and o.pid not in self.dead_outsiders
        ]

    def _outsiders_changed(self) -> bool:
        prev, self.outsider_set = self.outsider_set, frozenset(o.pid for o in self._active_outsiders())
        return prev is not None and prev != self.outsider_set

    def _card_used(self, gpu: int) -> int:
        jobs = sum(r.usage(self.now) for r in self.runs.values() if r.gpu == gpu)
        outside = sum(o.mib for o in self._active_outsiders() if o.gpu == gpu)
        return jobs + outside + sum(g.mib for g in self.gone if g.gpu == gpu)

    def _settle(self, gpu: int, total: int) -> bool:
        """While the card is over capacity, the last allocator dies."""
        died = False
        while self._card_used(gpu) > total:
            on_card = [r for r in self.runs.values() if r.gpu == gpu]
            growers = [r for r in on_card if r.usage(self.now) > r.used_mib]
            if growers:
                self._oom(max(growers, key=lambda r: r.start_s), total)
                died = True
                continue
            arrivals = [o for o in self._active_outsiders() if o.gpu == gpu]
            if arrivals:  # an outside process's allocation fails: it is someone else's crash
                self.dead_outsiders.add(arrivals[-1].pid)
                self.outsider_ooms += 1
                continue
            self._oom(max(on_card, key=lambda r: r.start_s), total)  # pragma: no cover (defensive)
            died = True
        return died

    def _others(self, run: _Run) -> list[tuple[int, int]]:
        procs = [
            (r.pid, r.used_mib)
            for r in self.runs.values()
            if r.gpu == run.gpu and r is not run and r.used_mib
        ]
        procs += [(o.pid, o.mib) for o in self._active_outsiders() if o.gpu == run.gpu]
        return procs + [(g.pid, g.mib) for g in self.gone if g.gpu == run.gpu]

    def _oom(self, run: _Run, total: int) -> None:
        others = self._others(run)
        held = run.used_mib
        free = max(0, total - held - sum(m for _, m in others))
        tried = max(2, run.usage(self.now) - held)
        late = sum(
            o.mib
            for o in self._active_outsiders()
            if o.gpu == run.gpu and self.start_s + o.start_s > run.start_s
        )
        self.ex.finish(
            run.token,
            exit_code=1,
            output=oom_log(total, free, tried, held, others),
            started_at=run.start_s,
            ended_at=self.now,
            runtime={"peak_mib": held} if held else None,
        )
        self.ooms.append(
            OomEvent(
                at_s=self.now - self.start_s,
                job_id=run.job_id,
                tier="ABCDEFGH"[run.tier],
                gpu=run.gpu,
                colocated=bool(others),
                learned=(self._task(run), run.tier) in self.learned,
                arrival=late > 0 and self._card_used(run.gpu) - late <= total,
                prediction_source=run.source,
                lost_s=self.now - run.start_s,
            )
        )
        self._end(run, held)

    def _task(self, run: _Run) -> str:
        return self.profiles[run.job_id.split("/", 1)[1]].task

    def _finish(self, run: _Run) -> None:
        self.learned.add((self._task(run), run.tier))
        self.ex.finish(
            run.token,
            exit_code=0,
            output="training done\n",
            started_at=run.start_s,
            ended_at=self.now,
            runtime={"peak_mib": run.peak_mib},
        )
        self._end(run, run.usage(self.now))

    def _end(self, run: _Run, mib: int) -> None:
        del self.runs[run.token]
        if mib:
            self.gone.append(_Gone(gpu=run.gpu, pid=run.pid, mib=mib, until_s=self.now + RELEASE_S))

    # ------------------------------------------------------------------ what the probe sees

    def _usage(self) -> Mapping[int, FakeUsage]:
        procs: dict[int, list[GpuProcess]] = {}
        for r in self.runs.values():
            used = r.usage(self.now)
            if used:
                procs.setdefault(r.gpu, []).append(GpuProcess(pid=r.pid, used_mib=used))
        for o in self._active_outsiders():
            procs.setdefault(o.gpu, []).append(GpuProcess(pid=o.pid, used_mib=o.mib))
        for g in self.gone:
            procs.setdefault(g.gpu, []).append(GpuProcess(pid=g.pid, used_mib=g.mib))
        return {
            gpu: FakeUsage(used_mib=sum(p.used_mib or 0 for p in ps), processes=tuple(ps))
            for gpu, ps in procs.items()
        }

    def _trees(self, attempts: Sequence[Any]) -> dict[int, frozenset[int]]:
        out = {}
        for a in attempts:
            run = self.runs.get(a.token)
            if run is not None:
                out[a.id] = frozenset({run.pid})
        return out

    # ------------------------------------------------------------------ result

    def _result(self, suite: str, *, finished: bool) -> SimResult:
        counts = self.store.counts(suites=[suite])
        rows = self.store.db.execute(
            "SELECT a.tier_name, a.outcome FROM attempts a JOIN jobs j ON j.id = a.job_id"
            " WHERE j.suite = ? ORDER BY a.id",
            (suite,),
        ).fetchall()
        tiers: dict[str, int] = {}
        for r in rows:
            if r["outcome"] == "ok":
                tiers[r["tier_name"]] = tiers.get(r["tier_name"], 0) + 1
        total_mem = sum(self.totals_mib[g] for g in range(len(self.totals_mib)))
        makespan = self.now - self.start_s
        return SimResult(
            policy=self.policy.name,
            label=self.policy.label,
            jobs=len(self.trace.jobs),
            gpus=len(self.plan.gpus),
            slots=self.plan.total_slots,
            makespan_s=makespan,
            lower_bound_s=lower_bound_s(self.trace, self.plan, self.totals_mib),
            succeeded=counts["succeeded"],
            failed=counts["failed"],
            attempts=len(rows),
            ooms=tuple(self.ooms),
            gpu_hours_lost=sum(o.lost_s for o in self.ooms) / 3600,
            mem_util=self.mem_integral / (total_mem * makespan) if makespan and total_mem else 0.0,
            tiers=tiers,
            outsider_ooms=self.outsider_ooms,
            finished=finished,
        )


_OOM_ADVICE = (
    "Of the allocated memory 9.80 GiB is allocated by PyTorch, and 120.00 MiB is reserved by PyTorch but"
    " unallocated. If reserved but unallocated memory is large try setting"
    " PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
)


def oom_log(
    total_mib: int, free_mib: int, tried_mib: int, held_mib: int, others: Sequence[tuple[int, int]]
) -> str:
    """The tail of a trainer's log after a genuine CUDA OOM (PyTorch 2.x wording)."""
    procs = "".join(f"Process {pid} has {mib / MIB_PER_GIB:.2f} GiB memory in use. " for pid, mib in others)
    message = (
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {tried_mib:.2f} MiB. GPU 0 has a"
        f" total capacity of {total_mib / MIB_PER_GIB:.2f} GiB of which {free_mib:.2f} MiB is free. {procs}"
        f"Including non-PyTorch memory, this process has {held_mib / MIB_PER_GIB:.2f} GiB memory in use."
        f" {_OOM_ADVICE}"
    )
    lines = [
        "{'loss': 0.4127, 'grad_norm': 1.9, 'learning_rate': 4.1e-05, 'epoch': 0.31}",
        "Traceback (most recent call last):",
        '  File "train.py", line 211, in <module>',
        "    main()",
        '  File "train.py", line 204, in main',
        "    trainer.train()",
        message,
    ]
    return "\n".join(lines) + "\n"


def format_table(results: Sequence[SimResult]) -> str:
    """The results as a Markdown table (what ``gpusched simulate`` and the benchmark print)."""
    head = (
        "policy",
        "makespan",
        "÷ lower bound",
        "OOM crashes",
        "co-located OOMs after learning",
        "OOMs an outsider's arrival caused",
        "GPU-h lost",
        "mean memory use",
    )
    rows = [
        (
            r.label,
            f"{r.makespan_s / 3600:.2f} h" + ("" if r.finished else " (unfinished)"),
            f"{r.makespan_s / r.lower_bound_s:.2f}" if r.lower_bound_s else "?",
            str(r.oom_count),
            str(r.learned_colocated_ooms),
            str(r.arrival_ooms),
            f"{r.gpu_hours_lost:.1f}",
            f"{r.mem_util:.0%}",
        )
        for r in results
    ]
    widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    return "\n".join([line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


def simulate(
    trace: Trace,
    plan: GpuPlan,
    totals_mib: Sequence[int],
    *,
    policy: str = "gpusched",
    suite: Suite | None = None,
    seed: int = 0,
    settings: Settings | None = None,
    prior_nights: int = 0,
    history: History | None = None,
) -> SimResult:
    """Run ``trace`` on cards of ``totals_mib`` (index = GPU) under ``plan`` with one policy;
    with ``prior_nights``, measure it after that many nights of it (``Simulation.prior_nights``);
    with ``history``, after the runs a real queue measured (``Simulation.history``)."""
    return Simulation(
        trace=trace,
        plan=plan,
        totals_mib=totals_mib,
        policy=policies(plan)[policy],
        suite=suite,
        seed=seed,
        settings=settings,
        prior_nights=prior_nights,
        history=history,
    ).run()
