"""What the scheduler remembers of memory from one tick to the next, and the reads behind it.

The decisions are pure functions in :mod:`gpusched.memory`; :class:`MemoryWatch` gathers
their inputs -- the process trees of running attempts (one scan of the process table per
tick, and only when the probe lists GPU processes at all), host RAM, the store's peak
history -- and keeps what a single snapshot cannot tell: each attempt's peak so far and when
it last grew, the processes of attempts that just ended, the cards kept free for waiting
jobs, and a host OOM not yet recovered from (a store flag, so ``status`` sees it too).

:func:`demands` turns queued jobs into what placement needs (start tier and predicted peak);
the scheduler and ``status`` both call it, so both show the same prediction.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from msgspec import Struct
from msgspec.structs import replace

from gpusched import memory, placement, predict, procfs
from gpusched.logs import logger
from gpusched.model import GpuProcess, GpuState, Outcome, Tier
from gpusched.store import AttemptRow, JobRow, Store, SuiteRow, in_chunks

log = logger(__name__)  # logging is imported on first use (status logs nothing)

HOST_MIN_ENV = "GPUSCHED_HOST_MIN_FREE"  # e.g. "4GiB", "10%", "4GiB,10%", "0" (off)
HOST_OOM_FLAG = "host_oom"  # store flag: [when, job id] of a host OOM not yet recovered from
LEARNED_SOURCES = memory.LEARNED
#: How long the process trees read at one look at the cards serve the next looks, while the cards
#: list no pid they did not list then and every attempt running then had a tree: only a reused pid
#: could then change whose a listed process is (an attempt that started since owns none of them:
#: its processes came after). The daemon reads a process table of hundreds (every process of the
#: machine) once a minute instead of every second, and a refill's tick reads none.
TREES_KEPT_S = 60.0
#: What a card may hold that is nobody's job (driver, display server), left out of the default
#: prediction so that a 1-slot plan's default still fits a card with an X server on it.
CARD_ALLOWANCE_MIB = 1024

#: attempt id -> its wrapper's pid and every process below it (:func:`attempt_trees`)
Trees = Mapping[int, frozenset[int]]
TreesFn = Callable[[Sequence[AttemptRow]], Trees]
HostFn = Callable[[], memory.HostMemory]


# --------------------------------------------------------------------------- real reads


def attempt_trees(
    attempts: Sequence[AttemptRow], read_table: Callable[[], list[procfs.Entry]] | None = None
) -> dict[int, frozenset[int]]:
    """attempt id -> its wrapper's pid and every process below it (attempts whose wrapper
    pid is unknown, e.g. on Slurm, or gone are left out), from ``read_table`` (default: a
    scan of /proc of its own). Never raises."""
    from gpusched.attempt import AttemptPaths

    roots: dict[int, int] = {}
    for a in attempts:
        pid = (a.handle or {}).get("pid")
        if not pid:
            recorded = AttemptPaths(Path(a.dir)).read_pid()
            pid = recorded[0] if recorded else None
        if pid:
            roots[a.id] = int(pid)
    if not roots:
        return {}
    try:
        trees = procfs.process_trees(set(roots.values()), read_table or procfs.table)
    except Exception:  # a process table we cannot read: attribute nothing this tick
        log.exception("could not read the process table")
        return {}
    return {aid: trees[pid] for aid, pid in roots.items() if pid in trees}


def host_memory() -> memory.HostMemory:
    """Available and total host RAM; unknown values are None. From ``/proc/meminfo``, the
    numbers psutil reports on Linux, without importing psutil (10-20 ms, which the daemon's
    first tick would pay before the night's first launch); elsewhere through psutil."""
    try:
        with open("/proc/meminfo", "rb") as f:
            kib = {key: int(rest.split()[0]) for key, _, rest in (line.partition(b":") for line in f)}
        return memory.HostMemory(available_mib=kib[b"MemAvailable"] >> 10, total_mib=kib[b"MemTotal"] >> 10)
    except (OSError, KeyError, ValueError, IndexError):
        pass
    try:
        import psutil

        vm = psutil.virtual_memory()
        return memory.HostMemory(available_mib=int(vm.available) >> 20, total_mib=int(vm.total) >> 20)
    except Exception:
        return memory.HostMemory(available_mib=None, total_mib=None)


def kernel_oom_kills() -> int | None:
    """How many processes the kernel's OOM killer has killed since boot (``oom_kill`` in
    /proc/vmstat, Linux 4.13+; a cgroup's OOM kills count too), or None where it is not there."""
    try:
        with open("/proc/vmstat", "rb") as f:
            for line in f:
                if line.startswith(b"oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


class OomKills:
    """Whether the kernel's OOM killer certainly killed nothing since a moment. The count is
    read when the daemon starts and when a job ends by SIGKILL, never on a tick: while it has
    not moved, the kernel killed nothing since it was first seen at that value."""

    def __init__(self, read: Callable[[], int | None] = kernel_oom_kills, *, since: float) -> None:
        self.read = read
        self.count = read()
        self.since = since  # the count has been self.count at least since then

    def none_since(self, t: float, now: float) -> bool:
        """True when the kernel OOM-killed nothing from ``t`` to ``now``; False when it did or
        may have (the count moved, or was not read before ``t``, or cannot be read)."""
        count = self.read()
        if count is None or self.count is None or count != self.count:
            self.count, self.since = count, now
            return False
        return self.since <= t


def host_limit_from_env() -> memory.HostLimit:
    """``GPUSCHED_HOST_MIN_FREE`` (``4GiB``, ``10%``, ``4GiB,10%``, ``0``), else the default."""
    raw = os.environ.get(HOST_MIN_ENV, "").strip()
    if not raw:
        return memory.HostLimit()
    try:
        return memory.parse_host_min(raw)
    except ValueError:
        log.warning("%s=%r is not like 4GiB, 10%% or 0; using the default", HOST_MIN_ENV, raw)
        return memory.HostLimit()


def host_hold(store: Store) -> tuple[float, str] | None:
    raw = store.flag(HOST_OOM_FLAG)
    try:
        since, job_id = json.loads(raw) if raw else (None, None)
        return (float(since), str(job_id)) if since is not None else None
    except (ValueError, TypeError):
        return None


# --------------------------------------------------------------------------- demands


class Demand(Struct, frozen=True, kw_only=True):
    """A queued job as placement sees it, with the predictions behind it."""

    view: placement.QueuedJob  # at its start tier, with the predicted peak placed with
    predictions: tuple[predict.Prediction, ...]  # one per tier of its ladder
    note: str | None = None  # why it starts at another tier than its own
    duration: predict.Duration = predict.UNKNOWN_DURATION  # its run time at its start tier

    def prediction(self, tier: int | None = None) -> predict.Prediction:
        """The prediction at ``tier`` (default: its start tier, as placed)."""
        if tier is None or tier == self.view.tier:
            return predict.Prediction(
                mib=self.view.predicted_mib, source=self.predictions[self.view.tier].source
            )
        return self.predictions[tier]


def default_mib(suite: SuiteRow, gpus: Sequence[GpuState], headroom_frac: float) -> int | None:
    """The prediction without history: a slot's share of the smallest planned card, after
    headroom and :data:`CARD_ALLOWANCE_MIB`."""
    totals = [g.total_mib for g in gpus if g.index in suite.gpu_plan.gpus and g.total_mib]
    if not totals:
        return None
    slots = max(1, max(suite.gpu_plan.slots))
    usable = int(min(totals) * (1 - headroom_frac)) - CARD_ALLOWANCE_MIB
    return max(1, usable // slots)


def records(
    store: Store, tasks: Sequence[str]
) -> tuple[dict[str, list[predict.PeakSample]], dict[str, list[predict.RunSample]]]:
    """Peak samples of ended attempts and the run times of the successful ones, by task: the
    attempts with a peak or an OOM (through the index kept for them), with their start and
    end, in attempt order (what `gpusched simulate` replays; the daemon keeps :class:`History`)."""
    peaks: dict[str, list[predict.PeakSample]] = defaultdict(list)
    runs: dict[str, list[predict.RunSample]] = defaultdict(list)
    for task, job_id, tier, peak_mib, outcome, placed, seconds, attempt_id in history_rows(
        store, tasks=sorted(set(tasks))
    ):
        peaks[task].append(
            predict.PeakSample(
                job_id=job_id,
                task=task,
                tier=tier,
                peak_mib=peak_mib,
                outcome=outcome,
                predicted_mib=placed,
            )
        )
        if seconds is not None:
            runs[task].append(
                predict.RunSample(job_id=job_id, task=task, tier=tier, seconds=seconds, attempt_id=attempt_id)
            )
    return peaks, runs


class History:
    """What the daemon predicts peaks and run times from: per task, a
    :class:`predict.TaskHistory` of its ended runs, and the largest peak per tier (the ladder's
    and the OOM floors' input), read whole once per task and then kept up to date from the
    attempts its own connection ends (``Store.exited``). A tick reads the runs that ended since
    the last one, not every run of the night: :func:`records` costs ~6 us a finished run with a
    peak (on a GPU, every run), ~13 ms a tick after 2,000 runs, and the passes over its samples
    more. Read again whole when another connection committed (``PRAGMA data_version``: a
    submit, a retry) or one of ours rolled back, so nothing it keeps can be stale. With ``jobs``
    (``status``), what predicts those jobs' peaks only: the tasks' peaks summed up per tier
    (:func:`peak_summaries`) and those jobs' own runs."""

    def __init__(self, store: Store, *, jobs: Collection[str] | None = None) -> None:
        self.store = store
        # a reader that asks these jobs' peaks only (``status``, which shows no run time): each
        # task's peaks as SQLite sums them up, and these jobs' own runs (TaskHistory.extend_peaks)
        self._jobs = None if jobs is None else sorted(jobs)
        self._version: tuple[int, int] | None = None
        self._seen = 0  # how much of store.exited is read
        self._tasks: set[str] = set()  # the tasks read so far
        self._stats: dict[str, predict.TaskHistory] = {}  # of those with a sample
        self._ok: memory.Maxima = {}  # memory.peak_maxima of their samples, added to as they come
        self._floor: memory.Maxima = {}

    def read(self, tasks: Collection[str]) -> dict[str, predict.TaskHistory]:
        """Each of ``tasks`` that has a sample (a run of it ended with a peak or an OOM), up to
        date. Its own: read it, do not change it."""
        version = (self.store.db.execute("PRAGMA data_version").fetchone()[0], self.store.rollbacks)
        if version != self._version:
            self._version, self._tasks, self._stats, self._ok, self._floor = version, set(), {}, {}, {}
            self._seen = len(self.store.exited)
        ended = self.store.exited[self._seen :]
        self._seen += len(ended)
        if ended and self._tasks:  # (of the tasks read so far: the others are read whole when asked)
            reaped = [r for r in history_rows(self.store, attempts=ended) if r[0] in self._tasks]
            self._keep(reaped, whole=False)
        if new := set(tasks) - self._tasks:
            self._tasks |= new
            if self._jobs is None:
                self._keep(history_rows(self.store, tasks=sorted(new)), whole=True)
            else:
                self._keep_for_jobs(sorted(new), self._jobs)
        return {task: h for task, h in self._stats.items() if task in tasks}

    def maxima(self, tasks: Collection[str]) -> tuple[memory.Maxima, memory.Maxima]:
        """:func:`memory.peak_maxima` of ``tasks``' samples as of the last :meth:`read`."""
        return _only(self._ok, tasks), _only(self._floor, tasks)

    def _keep(self, rows: Iterable[predict.HistoryRow], *, whole: bool) -> None:
        """Ended attempts into their tasks' histories: the few a tick reaped
        (:meth:`predict.TaskHistory.add`), or the whole history of tasks not read before
        (:meth:`~predict.TaskHistory.extend`); and the maxima, of the tasks they touched."""
        by_task: dict[str, list[predict.HistoryRow]] = {}
        for row in rows:
            by_task.setdefault(row[0], []).append(row)
        for task, of_task in by_task.items():
            kept = self._stats.get(task)
            if kept is None:
                kept = self._stats[task] = predict.TaskHistory(task)
            (kept.extend if whole else kept.add)(of_task)
            self._keep_maxima(task, kept)

    def _keep_for_jobs(self, tasks: Sequence[str], jobs: Sequence[str]) -> None:
        """The peaks of ``tasks`` not read before, summed up per tier, and the own runs of
        those of ``jobs`` that are theirs (what :meth:`_keep` of a whole read keeps for every
        job; run times of these jobs only); and the tasks' maxima."""
        own: dict[str, list[predict.HistoryRow]] = {}
        for row in history_rows(self.store, jobs=jobs):
            own.setdefault(row[0], []).append(row)
        summaries: dict[str, list[predict.PeakSummary]] = {}
        for task, summary in peak_summaries(self.store, tasks):
            summaries.setdefault(task, []).append(summary)
        for task, of_task in summaries.items():
            kept = self._stats[task] = predict.TaskHistory(task)
            kept.extend_peaks(of_task)
            kept.extend_own(own.get(task, ()))
            self._keep_maxima(task, kept)

    def _keep_maxima(self, task: str, kept: predict.TaskHistory) -> None:
        """``task``'s largest peaks per tier, of successes and of OOMs, as ``kept`` has them now."""
        ok, floor = kept.maxima()
        self._ok.update(((task, tier), mib) for tier, mib in ok.items())
        self._floor.update(((task, tier), mib) for tier, mib in floor.items())


def _only(maxima: memory.Maxima, tasks: Collection[str]) -> memory.Maxima:
    return {key: mib for key, mib in maxima.items() if key[0] in tasks}


#: The ended attempts with a peak or an OOM where ``where`` holds (a run's seconds as Python's
#: ``ended - started``: the same subtraction of the same doubles).
_RUNS = (
    " FROM attempts a JOIN jobs j ON j.id = a.job_id WHERE +a.state = 'exited' AND {where}"
    " AND (a.peak_mib IS NOT NULL OR a.outcome = 'oom')"
    " AND a.id NOT IN (SELECT attempt_id FROM arrivals)"  # someone else's crash, not its need
)
#: The runs of the tasks named in a JSON array (one parameter, however many).
_OF_TASKS = "j.task IN (SELECT value FROM json_each(?))"
_SECONDS = "CASE WHEN a.outcome = 'ok' AND a.ended_at > a.started_at THEN a.ended_at - a.started_at END"
#: Those runs as :data:`predict.HistoryRow`, in attempt order.
_SELECT = (
    f"SELECT j.task, a.job_id, a.tier, a.peak_mib, a.outcome, a.predicted_mib, {_SECONDS}, a.id"
    + _RUNS
    + " ORDER BY a.id"
)
#: Those runs' peaks summed up per task and tier (a :data:`predict.PeakSummary` after the task):
#: the successful runs' peaks as one text, how many ran out of memory, their largest peak and the
#: largest prediction one of them was placed with (the text's order is SQLite's).
_PEAKS = (
    "SELECT j.task, a.tier, group_concat(CASE WHEN a.outcome = 'ok' THEN a.peak_mib END),"
    " sum(a.outcome = 'oom'), max(CASE WHEN a.outcome = 'oom' THEN a.peak_mib END),"
    " max(CASE WHEN a.outcome = 'oom' THEN a.predicted_mib END)" + _RUNS + " GROUP BY j.task, a.tier"
)


def history_rows(
    store: Store, *, tasks: Sequence[str] = (), attempts: Sequence[int] = (), jobs: Sequence[str] = ()
) -> Iterator[predict.HistoryRow]:
    """The ended attempts with a peak or an OOM, as :data:`predict.HistoryRow`, in attempt
    order: those of ``tasks`` in one query whatever their number (SQLite reads the names from
    one JSON array: a plan without ``task:`` asks for one task per job, and 500 names a query
    walked every run once per 500), then those of ``attempts`` (ids: a tick's few) and of
    ``jobs`` (ids), 500 a query."""
    cur = store.db.cursor()
    cur.row_factory = None  # tuples, as a HistoryRow is (a sqlite3.Row a row: 7 % more of a whole read)
    if tasks:
        yield from cur.execute(_SELECT.format(where=_OF_TASKS), [json.dumps(tasks)])
    yield from in_chunks(cur, _SELECT.format(where="a.id IN ({})"), attempts)
    yield from in_chunks(cur, _SELECT.format(where="a.job_id IN ({})"), jobs)


def peak_summaries(store: Store, tasks: Sequence[str]) -> Iterator[tuple[str, predict.PeakSummary]]:
    """The peaks of ``tasks``' runs summed up per tier (:data:`_PEAKS`), a row a task and tier
    whatever the number of runs, each as (task, :data:`predict.PeakSummary`)."""
    for task, tier, peaks, ooms, oom_peak, oom_placed in store.db.execute(
        _PEAKS.format(where=_OF_TASKS), [json.dumps(tasks)]
    ):
        yield task, (tier, list(map(int, peaks.split(","))) if peaks else [], ooms, oom_peak, oom_placed)


class Running(Struct, frozen=True):
    """What the attempts running now tell of their tasks."""

    longest_s: dict[str, float]  # task -> how long its longest-running attempt has run so far
    peak_mib: dict[tuple[str, int], int]  # (task, tier) -> the most one of them holds so far
    # (task, tier) -> of those that settled, the most one's plateau x the step-up (or its peak so
    # far, where more): what the task's peak there is guessed at until one of its jobs finishes
    plateau_mib: dict[tuple[str, int], int] = {}


def running_for(store: Store, now: float, step_up: float | None = None) -> Running:
    """:class:`Running` from one query over the live attempts (through their state's index).
    ``step_up``: the learned ratio of peak to plateau (:meth:`MemoryWatch.step_up`); a plateau
    is multiplied by it or by :data:`memory.PLATEAU_MARGIN`, whichever is more."""
    margin = max(memory.PLATEAU_MARGIN, step_up or 0.0)
    longest: dict[str, float] = {}
    peaks: dict[tuple[str, int], int] = {}
    plateaus: dict[tuple[str, int], int] = {}
    rows = store.db.execute(
        "SELECT j.task, a.tier, COALESCE(a.started_at, a.launched_at), a.peak_mib, s.mib FROM attempts a"
        " JOIN jobs j ON j.id = a.job_id LEFT JOIN settles s ON s.attempt_id = a.id"
        " WHERE a.state IN ('launching', 'running')"
    )
    for task, tier, since, peak, settled in rows:
        if since is not None:
            longest[task] = max(longest.get(task, 0.0), now - since)
        if peak:
            peaks[(task, tier)] = max(peaks.get((task, tier), 0), peak)
            if settled:
                guess = max(int(settled * margin), peak)
                plateaus[(task, tier)] = max(plateaus.get((task, tier), 0), guess)
    return Running(longest, peaks, plateaus)


def demands(
    store: Store,
    jobs: Sequence[JobRow],
    suite_of: Callable[[str], SuiteRow | None],
    gpus: Sequence[GpuState],
    room_mib: Mapping[int, int],
    *,
    headroom_frac: float,
    start_safer: bool = True,
    fit_share: bool = True,
    now: float | None = None,
    history: History | None = None,
    step_up: float | None = None,
) -> dict[str, Demand]:
    """job id -> :class:`Demand` for every job whose suite is known. Jobs of one task without
    history of their own share one prediction (a 10k-job queue costs one per task). ``now``:
    also let running attempts bound the run time of tasks none of whose jobs has finished.
    ``history``: where the daemon keeps the runs' history (else these jobs' peaks are read, as
    ``status`` needs them: their run times are then their own runs' only).
    ``step_up``: the learned ratio of peak to plateau (see :func:`running_for`)."""
    rows = {s: suite_of(s) for s in {j.suite for j in jobs}}
    suites = {name: row for name, row in rows.items() if row is not None and row.suite.tiers}
    tasks = {name: suite_tasks(store, row) for name, row in suites.items()}
    wanted = sorted(set().union(*tasks.values(), {j.task for j in jobs}))
    # status: one read of the peaks, summed up, and these jobs' own runs (no other run times:
    # status shows none)
    history = history or History(store, jobs={j.id for j in jobs})
    stats = history.read(set(wanted))
    ok, floor = history.maxima(set(wanted))
    running = running_for(store, now, step_up) if now is not None else Running({}, {})
    ladders = {  # tier -> (peak one tier up, ratio) per task, by suite
        name: memory.ladder_from(_only(ok, tasks[name]), _only(floor, tasks[name]), len(row.suite.tiers))
        for name, row in suites.items()
    }
    cards = {name: _Cards.of(row, room_mib) for name, row in suites.items()}
    memo: dict[tuple[str, str, str], tuple[predict.Prediction, ...]] = {}
    times: dict[tuple[str, str, str, int], predict.Duration] = {}
    starts: dict[tuple[str, str, str, int], memory.Start] = {}
    falls: dict[tuple[str, str, str, int], tuple[tuple[int, int | None], ...]] = {}
    kinds: dict[tuple[str, str, str, int], Demand] = {}  # by (*key, the job's own tier): demanded alike
    out: dict[str, Demand] = {}
    # a task none of whose jobs has run has no history (peaks, run times, running siblings) to
    # predict from: all such tasks of a suite predict alike ("" in the key), so a plan whose
    # jobs are each their own task costs a prediction per tier, not one per job, every tick
    known = {*stats, *running.longest_s, *(task for task, _ in running.peak_mib)}
    for job in jobs:
        suite = suites.get(job.suite)
        if suite is None:
            continue
        task = job.task if job.task in known else ""
        history_of = stats.get(job.task)
        key = (job.suite, task, job.id if history_of is not None and job.id in history_of.jobs else "")
        made = kinds.get((*key, job.tier))
        if made is not None:  # a job like one before: its view is that one's with its own id and order
            out[job.id] = _like_demand(made, job)
            continue
        if history_of is None:  # none of its task's runs has ended (once per kind of job, not per job)
            history_of = predict.TaskHistory(job.task)
        if key not in memo:
            memo[key] = _predictions(
                job,
                suite,
                gpus,
                room_mib,
                history_of,
                ladders[job.suite],
                floor,
                headroom_frac,
                running,
            )
        own = min(job.tier, len(suite.suite.tiers) - 1)
        if (*key, own) not in starts:  # the same predictions from the same tier start alike
            starts[(*key, own)] = _start(suite, cards[job.suite], memo[key], own, start_safer, fit_share)
        start = starts[(*key, own)]
        if (*key, start.tier) not in times:
            times[(*key, start.tier)] = history_of.duration(
                job.id, start.tier, running_s=running.longest_s.get(job.task)
            )
        duration = times[(*key, start.tier)]
        if (*key, start.tier) not in falls:  # one tuple per kind, so pack() replaces no view
            falls[(*key, start.tier)] = slower_tiers(memo[key], start.tier, suite.suite.tiers)
        fall = falls[(*key, start.tier)]
        up = faster_tiers(memo[key], own, start.tier, suite.suite.tiers)
        out[job.id] = kinds[(*key, job.tier)] = _demand(
            job,
            suite,
            cards[job.suite],
            memo[key],
            start,
            duration,
            fall,
            up,
            unmeasured=job.task not in stats,
        )
    return _chains(out, jobs, cards)


def _chains(out: dict[str, Demand], jobs: Sequence[JobRow], cards: Mapping[str, _Cards]) -> dict[str, Demand]:
    """``out`` with the jobs of a task two of which do not fit one card (at their start tier),
    on a plan that gives a card several slots, given their ``chain_s``: the task's queued run
    time over the cards its plan allows, the least time it still needs when each card runs one
    of them at a time. A task such as the 26 GiB boolq (~15 GiB at tier B, beside small jobs
    only) is the night's critical path while that exceeds its jobs' own run time; ordered by
    run time alone it started after every longer job and made the tail."""
    work: defaultdict[tuple[str, str], float] = defaultdict(float)
    solo: list[tuple[str, tuple[str, str]]] = []
    for job in jobs:
        d = out.get(job.id)
        if d is None:
            continue
        v, c = d.view, cards[job.suite]
        if c.share is None:  # no card of its plan takes two jobs: each card runs one at a time anyway
            continue
        if v.predicted_s and v.predicted_mib and c.best and 2 * v.predicted_mib > c.best:
            work[(job.suite, job.task)] += v.predicted_s
            solo.append((job.id, (job.suite, job.task)))
    for job_id, task in solo:
        d = out[job_id]
        chain = work[task] / max(1, sum(1 for cap in cards[task[0]].allowed.values() if cap > 0))
        if chain > (d.view.predicted_s or 0.0):
            out[job_id] = replace(d, view=replace(d.view, chain_s=chain))
    return out


def _like(view: placement.QueuedJob, job: JobRow) -> placement.QueuedJob:
    """``view`` (of a job of ``job``'s kind) as ``job``'s own."""
    return replace(view, job_id=job.id, seq=job.seq, priority=job.priority, avoid_gpu=job.avoid_gpu)


def _like_demand(demand: Demand, job: JobRow) -> Demand:
    """``demand`` (of a job of ``job``'s kind) as ``job``'s own."""
    return replace(demand, view=_like(demand.view, job))


class _Cards(Struct, frozen=True):
    """What a suite's gpu-plan allows, worked out once per call, not once per job."""

    allowed: dict[int, int]  # card -> the plan's slot cap (shared by the suite's queued jobs)
    best: int | None  # the most room on a card of the plan
    share: int | None  # the most room per slot on a card of the plan with several slots

    @classmethod
    def of(cls, suite: SuiteRow, room_mib: Mapping[int, int]) -> _Cards:
        allowed = {g: suite.gpu_plan.cap(g) for g in suite.gpu_plan.gpus}
        shares = [room_mib[g] // cap for g, cap in allowed.items() if cap > 1 and g in room_mib]
        return cls(allowed, _best_room(suite, room_mib), max(shares) if shares else None)


_TASKS: dict[tuple[str, str, float], frozenset[str]] = {}


def suite_tasks(store: Store, suite: SuiteRow) -> frozenset[str]:
    """The tasks of a suite's jobs (cached until the suite is submitted again)."""
    key = (str(store.path), suite.name, suite.submitted_at)
    if key not in _TASKS:
        if len(_TASKS) > 256:
            _TASKS.clear()
        q = "SELECT DISTINCT task FROM jobs WHERE suite = ?"
        _TASKS[key] = frozenset(r["task"] for r in store.db.execute(q, (suite.name,)))
    return _TASKS[key]


def _best_room(suite: SuiteRow, room_mib: Mapping[int, int]) -> int | None:
    caps = [(g, suite.gpu_plan.cap(g)) for g in suite.gpu_plan.gpus]
    return max((room_mib[g] for g, cap in caps if cap > 0 and g in room_mib), default=None)


def _predictions(
    job: JobRow,
    suite: SuiteRow,
    gpus: Sequence[GpuState],
    room_mib: Mapping[int, int],
    history: predict.TaskHistory,
    ladder: Mapping[int, Sequence[tuple[int, float]]],
    floor: memory.Maxima,
    headroom_frac: float,
    running: Running,
) -> tuple[predict.Prediction, ...]:
    fallback, best = default_mib(suite, gpus, headroom_frac), _best_room(suite, room_mib)
    preds = [
        history.peak(
            job.id,
            t,
            default_mib=fallback,
            usable_mib=best,
            running_mib=running.peak_mib.get((job.task, t)),
            plateau_mib=running.plateau_mib.get((job.task, t)),
        )
        for t in range(len(suite.suite.tiers))
    ]
    floors = memory.floors_from(floor, job.task, len(suite.suite.tiers))
    return tuple(memory.fill_ladder(preds, ladder, whole_mib=best, floors=floors))


def _start(
    suite: SuiteRow,
    cards: _Cards,
    preds: tuple[predict.Prediction, ...],
    own: int,
    start_safer: bool,
    fit_share: bool,
) -> memory.Start:
    if not start_safer:
        return memory.Start(tier=own, predicted_mib=preds[own].mib)
    tiers = suite.suite.tiers
    return memory.start_tier(
        [p.mib for p in preds],
        own,
        [t.name for t in tiers],
        cards.best,
        share_mib=cards.share if fit_share else None,
        learned=[p.source in LEARNED_SOURCES for p in preds],
        exclusive=[t.exclusive for t in tiers],
    )


def _demand(
    job: JobRow,
    suite: SuiteRow,
    cards: _Cards,
    preds: tuple[predict.Prediction, ...],
    start: memory.Start,
    duration: predict.Duration,
    fallback: tuple[tuple[int, int | None], ...] = (),
    faster: tuple[tuple[int, int | None], ...] = (),
    *,
    unmeasured: bool = False,
) -> Demand:
    """``unmeasured``: no attempt of the job's task has left a peak or an OOM at any tier, so
    a default prediction may be checked by running one job alone (:func:`memory.unstick`);
    once one has, a guess at another tier is not worth another such run."""
    view = placement.QueuedJob(
        job_id=job.id,
        seq=job.seq,
        priority=job.priority,
        tier=start.tier,
        tiers=suite.suite.tiers,
        allowed=cards.allowed,
        predicted_mib=start.predicted_mib,
        guessed=preds[start.tier].source == "default",
        unmeasured=unmeasured,
        guessed_below=frozenset(t for t, _ in fallback if preds[t].source == "default"),
        avoid_gpu=job.avoid_gpu,
        predicted_s=duration.seconds,
        fallback=fallback,
        faster=faster,
    )
    return Demand(view=view, predictions=preds, note=start.note, duration=duration)


def slower_tiers(
    predictions: Sequence[predict.Prediction], tier: int, tiers: Sequence[Tier]
) -> tuple[tuple[int, int | None], ...]:
    """(tier, predicted peak) of the tiers below ``tier`` that a job may fall back to: all but
    the exclusive ones (they wait for an empty card anyway)."""
    return tuple(
        (t, predictions[t].mib)
        for t in range(tier + 1, min(len(tiers), len(predictions)))
        if not tiers[t].exclusive
    )


def faster_tiers(
    predictions: Sequence[predict.Prediction], own: int, start: int, tiers: Sequence[Tier]
) -> tuple[tuple[int, int | None], ...]:
    """(tier, learned peak) of the tiers from ``own`` to just above ``start``, fastest first,
    not exclusive: where a job starts lower than its own tier, the tiers it may take instead
    where it fills a card's last slot (:func:`placement.fill_last_slot`)."""
    return tuple(
        (t, predictions[t].mib)
        for t in range(own, min(start, len(predictions)))
        if not tiers[t].exclusive and predictions[t].source in LEARNED_SOURCES and predictions[t].mib
    )


def pack(demand: Mapping[str, Demand], waited_s: Mapping[str, float], *, after_s: float) -> dict[str, Demand]:
    """``demand`` with every job given its slower tiers as fallbacks (:func:`slower_tiers`):
    placement's second pass starts a job that memory keeps waiting at the first of them that
    fits a card now, on room no job could take at its own tier; a job that memory has kept
    waiting ``after_s`` or more tries them at its turn in the first pass (``pack_now``),
    before the jobs after it in the queue. A view that has them already (:func:`demands`
    gives them) and is not starved is kept as it is: a full queue replaces few views a tick."""
    out = dict(demand)
    memo: dict[tuple[int, int, int], tuple[tuple[int, int | None], ...]] = {}
    wave = last_wave(demand)
    for job_id, d in demand.items():
        view = d.view
        key = (id(d.predictions), view.tier, id(view.tiers))  # both outlive the loop (held by demand)
        if key not in memo:
            memo[key] = () if wave else slower_tiers(d.predictions, view.tier, view.tiers)
        lower = memo[key]
        now = bool(lower) and waited_s.get(job_id, 0.0) >= after_s
        if lower != view.fallback or now != view.pack_now:
            out[job_id] = replace(d, view=replace(view, fallback=lower, pack_now=now))
    return out


def last_wave(demand: Mapping[str, Demand]) -> bool:
    """True when no more jobs wait than there are cards they may use: the night's last wave,
    in which :func:`pack` gives no job a slower tier. Each of them gets a slot at its own tier
    once one run beside it ends, and a slower tier (8-20 % longer) then only makes the night
    end later: seed 11 of ``benchmarks/placement.py`` ran its last half hour's rte at C beside
    rte (to 7.33 h; 7.28 h without). With a hold kept off a card the job would take alone
    (``memory.choose_holds``; 1.109 alone) the eight E1-like seeds went from 1.112 to 1.108 x
    the lower bound (seed 11 1.123 -> 1.115, seed 1 1.111 -> 1.114, the rest unchanged; this
    alone 1.111)."""
    plans = {id(d.view.allowed): d.view.allowed for d in demand.values()}  # one map per suite, shared
    cards = {g for allowed in plans.values() for g, cap in allowed.items() if cap > 0}
    return 0 < len(demand) <= len(cards)


# --------------------------------------------------------------------------- the watch


class _Seen(Struct, kw_only=True):
    pids: frozenset[int]  # its processes last seen on its card
    used_mib: int | None
    peak_mib: int
    grew_at: float | None
    settled_mib: int | None  # what it held when it first stopped growing, past any pause (stored too)
    others: frozenset[int] = frozenset()  # other people's processes on its card when first seen


def ending_tree(a: AttemptRow, pids: frozenset[int]) -> memory.Tree:
    """``a``'s processes ``pids`` after it ended: ours while the driver releases their memory."""
    return memory.Tree(attempt_id=a.id, job_id=a.job_id, gpu=a.gpu, pids=pids, ending=True)


class MemoryWatch:
    def __init__(
        self,
        store: Store,
        *,
        trees: TreesFn | None = None,
        host: HostFn | None = None,
        limit: memory.HostLimit | None = None,
        ramp_s: float = 60.0,
        release_s: float = memory.RELEASE_S,
        on_event: Callable[[str], None] | None = None,
    ) -> None:
        self.store = store
        self.trees = trees or attempt_trees
        self.host = host or host_memory
        self.limit = limit or memory.HostLimit()
        self.ramp_s = ramp_s
        self.release_s = release_s
        self.on_event = on_event or (lambda msg: log.info("%s", msg))
        self.seen: dict[int, _Seen] = {}
        self.releasing: dict[int, tuple[memory.Tree, float]] = {}  # attempt id -> (tree, ended at)
        self.holds: dict[int, str] = {}  # card index -> job id it is kept free for
        self.memory_bound_since: dict[str, float] = {}  # job id -> since when memory keeps it waiting
        self.overtaken_since: dict[str, float] = {}  # job id -> since when later jobs get placed past it
        self._warned: set[int] = set()
        # the last trees read for a look at the cards: the attempts, the pids the cards listed, when
        self._trees_read: tuple[frozenset[int], frozenset[int], float, Trees] | None = None
        self._step_up: float | None = None  # learned: how much jobs grow after settling (ratio)
        self._step_up_read = False
        self._releasing_read = False

    # ------------------------------------------------------------------ measure

    def measure(self, live: Sequence[AttemptRow], gpus: Sequence[GpuState], now: float) -> memory.Attribution:
        """Attribute the snapshot's GPU processes; record peaks; warn about misplaced jobs."""
        self._expire(gpus, now)
        trees: list[memory.Tree] = []
        if any(g.processes for g in gpus):
            pids = self._trees(live, gpus, now)
            trees = [
                memory.Tree(
                    attempt_id=a.id,
                    job_id=a.job_id,
                    gpu=a.gpu,
                    pids=pids.get(a.id, frozenset()) | self._last(a.id),
                )
                for a in live
            ]
            if not self._releasing_read:
                self._releasing_read = True
                self._read_releasing(gpus, trees, now)
        att = memory.attribute(gpus, [*trees, *(t for t, _ in self.releasing.values())])
        live_ids = {a.id for a in live}
        for a in live:
            usage = att.usage.get(a.id)
            if usage is not None:
                self._note(a, usage, now, gpus, att)
        for gone in set(self.seen) - live_ids:
            del self.seen[gone]
        return att

    def _trees(self, live: Sequence[AttemptRow], gpus: Sequence[GpuState], now: float) -> Trees:
        """:attr:`trees` of ``live``, read again only where it could say something new about the
        cards' processes (:data:`TREES_KEPT_S`): a card lists a pid it did not list then, an
        attempt running then had no tree (its wrapper's pid not known yet), or that read is a
        minute old. An attempt that ended or started since is no reason."""
        ids = frozenset(a.id for a in live)
        listed = frozenset(p.pid for g in gpus for p in g.processes)
        if (kept := self._trees_read) is not None:
            ids_then, listed_then, read_at, pids = kept
            if listed <= listed_then and now - read_at < TREES_KEPT_S and (ids & ids_then) <= pids.keys():
                return pids
        pids = self.trees(live)
        self._trees_read = (ids, listed, now, pids)
        return pids

    def _last(self, attempt_id: int) -> frozenset[int]:
        """The attempt's processes on its card at the last look. One that exited since, before
        the attempt was reaped, is no longer below its wrapper, but the driver may still list it."""
        s = self.seen.get(attempt_id)
        return s.pids if s is not None else frozenset()

    def _note(
        self, a: AttemptRow, u: memory.Usage, now: float, gpus: Sequence[GpuState], att: memory.Attribution
    ) -> None:
        s = self.seen.get(a.id)
        if s is None:  # first seen (by this daemon: a restarted one reads what was settled)
            s = _Seen(
                pids=frozenset(),
                used_mib=None,
                peak_mib=a.peak_mib or 0,
                grew_at=None,
                settled_mib=self.store.settled(a.id),
                others=frozenset(p.pid for g in gpus if g.index == a.gpu for p in g.processes)
                - {pid for card, pid in att.owners if card == a.gpu},
            )
        if u.pids_on_gpu:
            if new := u.pids_on_gpu - s.pids:
                self.store.add_gpu_pids(a.id, new)  # so `status` knows them once they exit
            s.pids = u.pids_on_gpu
        if u.used_mib is not None:
            if s.used_mib is None or u.used_mib > s.used_mib + memory.GROWTH_MIB:
                s.grew_at = now
            s.used_mib = u.used_mib
            if u.used_mib > s.peak_mib:
                s.peak_mib = u.used_mib
                self.store.set_peak(a.id, u.used_mib)
            if s.settled_mib and u.used_mib > memory.MAX_STEP_UP * s.settled_mib:
                s.settled_mib = None  # that was a pause (loading data before the model), not its plateau
                self.store.set_settled(a.id, None)
            if (
                s.settled_mib is None
                and u.used_mib
                and not memory.is_ramping(now, a.launched_at, s.grew_at, self.ramp_s)
            ):
                s.settled_mib = u.used_mib
                self.store.set_settled(a.id, u.used_mib)
        self.seen[a.id] = s
        if u.elsewhere and a.id not in self._warned:
            self._warned.add(a.id)
            self._misplaced(a, u, now)

    def _misplaced(self, a: AttemptRow, u: memory.Usage, now: float) -> None:
        where = ", ".join(f"pid {pid} on GPU {g}" for g, pid in u.elsewhere)
        msg = (
            f"{a.job_id}: attempt {a.n} was given GPU {a.gpu} (CUDA_VISIBLE_DEVICES={a.gpu_uuid or a.gpu})"
            f" but runs {where}: does the trainer choose its own device?"
        )
        log.warning("%s", msg)
        self.on_event(msg)
        self.store.note(a.job_id, "misplaced", msg, now=now)

    def _read_releasing(self, gpus: Sequence[GpuState], trees: Sequence[memory.Tree], now: float) -> None:
        """A restarted daemon's first look at the cards: the listed processes of attempts that
        ended in the last ``release_s`` (the pids a daemon wrote down, ``gpu_pids``) are still
        being released, as the daemon before it knew (and as `status` says)."""
        known = {pid for t in trees for pid in t.pids}
        unknown = {p.pid for g in gpus for p in g.processes if p.pid not in known}
        for a, pids in self.store.exited_gpu_pids(unknown, since=now - self.release_s) if unknown else ():
            if a.ended_at is not None:
                self.releasing.setdefault(a.id, (ending_tree(a, pids), a.ended_at))

    def _expire(self, gpus: Sequence[GpuState], now: float) -> None:
        """An ended attempt's processes stop being ours once none of them is on its card any
        more (its memory is released) or ``release_s`` has passed."""
        listed = {(g.index, p.pid) for g in gpus for p in g.processes}
        for aid, (tree, ended_at) in list(self.releasing.items()):
            still = any((tree.gpu, pid) in listed for pid in tree.pids)
            if not still or now - ended_at >= self.release_s:
                del self.releasing[aid]

    def arrivals(
        self, a: AttemptRow, processes: Iterable[GpuProcess], live: Sequence[AttemptRow]
    ) -> tuple[GpuProcess, ...]:
        """Of ``processes`` on ``a``'s card, those that are someone else's and were not there
        when this daemon first saw ``a`` run: what came onto the card while it ran. Call
        before :meth:`ended`. Empty when ``a`` was never seen (a restarted daemon counts what
        it found at its start as there before), or never seen on its card by pid: from a
        container's PID namespace the driver's pids are not ours, so nothing tells a card-mate
        of ours from someone else's newcomer."""
        s = self.seen.get(a.id)
        if s is None or not s.pids:
            return ()
        ours = {pid for pids in self.trees(live).values() for pid in pids}
        ours.update(pid for seen in self.seen.values() for pid in seen.pids)  # a job that died with it
        ours.update(pid for tree, _ in self.releasing.values() for pid in tree.pids)
        return tuple(p for p in processes if p.pid not in ours and p.pid not in s.others)

    def ended(
        self, a: AttemptRow, result: Outcome, now: float, *, reported_peak_mib: int | None = None
    ) -> None:
        """``a`` was reaped: its processes count as ours while its memory is released; a host
        OOM holds launches until host RAM recovers; a successful one that settled teaches how
        much jobs grow after settling (its peak, or the in-job helper's ``reported_peak_mib``
        where larger, over what it held when it settled)."""
        s = self.seen.pop(a.id, None)
        self._warned.discard(a.id)
        if s is not None and s.settled_mib and result is Outcome.OK:
            ratio = max(s.peak_mib, a.peak_mib or 0, reported_peak_mib or 0) / s.settled_mib
            if ratio <= memory.MAX_STEP_UP:
                self._step_up = max(self.step_up() or 0.0, ratio)
        if s is not None and s.pids:
            self.releasing[a.id] = (ending_tree(a, s.pids), now)
        if result is Outcome.HOST_OOM and a.backend != "slurm":  # a Slurm node's RAM is not ours to watch
            self.store.set_flag(HOST_OOM_FLAG, json.dumps([now, a.job_id]))
            self.on_event(f"{a.job_id}: host out of memory; launches wait until host RAM recovers")

    # ------------------------------------------------------------------ decisions' inputs

    def waited_on_memory(
        self,
        demand: Mapping[str, Demand],
        views: Sequence[placement.GpuSlotView],
        now: float,
        headroom_frac: float,
    ) -> dict[str, float]:
        """job id -> how long memory (not slots, not the plan) has kept it off every card,
        without a break; 0 for jobs it does not keep waiting now."""
        held = placement.held_jobs(views)
        keys = {j: placement.rules_key(d.view, held) for j, d in demand.items()}  # equal keys: bound alike
        kinds: dict[tuple[object, ...], placement.QueuedJob] = {}
        for j, k in keys.items():
            kinds.setdefault(k, demand[j].view)
        bound_kinds = {k for k, v in kinds.items() if memory.memory_bound(v, views, headroom_frac)}
        bound = {j for j, k in keys.items() if k in bound_kinds}
        since = {j: self.memory_bound_since.get(j, now) for j in bound}
        self.memory_bound_since = since
        return {j: now - since[j] if j in since else 0.0 for j in demand}

    def starved(self, demand: Mapping[str, Demand], now: float) -> dict[str, float]:
        """job id -> how long it has been starved: since jobs after it in the queue were first
        placed while it waited (see :meth:`overtaken`); 0 for jobs never overtaken."""
        self.overtaken_since = {j: t for j, t in self.overtaken_since.items() if j in demand}
        return {j: now - self.overtaken_since[j] if j in self.overtaken_since else 0.0 for j in demand}

    def overtaken(
        self, queued: Sequence[placement.QueuedJob], decision: placement.Decision, now: float
    ) -> None:
        """Note the jobs this decision left waiting while it placed a job after them in the
        queue's order: memory (or a hold) keeps them out while others get in. A busy cluster
        has no free slot between ticks, so "memory keeps it off every card now" would never
        last; being overtaken is what starving looks like there."""
        placed = {p.job_id for p in decision.placements}
        for job_id in placed:
            self.overtaken_since.pop(job_id, None)
        if not placed:
            return
        views = {j.job_id: j for j in queued}
        last = max(placement.job_order(views[j]) for j in placed if j in views)
        for w in decision.waits:  # in the queue's order: the overtaken ones come first
            if w.job_id in views:
                if placement.job_order(views[w.job_id]) >= last:
                    break
                self.overtaken_since.setdefault(w.job_id, now)

    def reserved(self, live: Sequence[AttemptRow], att: memory.Attribution, now: float) -> Counter[int]:
        """card index -> memory promised to its running attempts that it does not show yet."""
        out: Counter[int] = Counter()
        for a in live:
            if a.gpu is None or not a.predicted_mib:
                continue
            usage, seen = att.usage.get(a.id), self.seen.get(a.id)
            settled, step_up = seen.settled_mib if seen else None, None
            if settled and a.prediction_source not in LEARNED_SOURCES:
                step_up = self.step_up()
            holding = memory.Holding(
                predicted_mib=a.predicted_mib,
                learned=a.prediction_source in LEARNED_SOURCES,
                used_mib=usage.used_mib if usage else None,
                ramping=memory.is_ramping(now, a.launched_at, seen.grew_at if seen else None, self.ramp_s),
                grows_to_mib=math.ceil(settled * step_up) if settled and step_up else None,
            )
            out[a.gpu] += memory.reserved_mib(holding)
        return out

    def step_up(self) -> float | None:
        """How much jobs grow after settling, learned (a ratio: the most a successful
        attempt's peak exceeded what it held when it settled; see :data:`memory.MAX_STEP_UP`),
        read from the store once and then kept up to date as attempts end. None until one has."""
        if not self._step_up_read:
            self._step_up_read = True
            stored = self.store.step_up(memory.MAX_STEP_UP)
            self._step_up = max(stored or 0.0, self._step_up or 0.0) or None
        return self._step_up

    def host_wait(self, now: float) -> str | None:
        """Why launches wait for host RAM now (clearing a recovered host-OOM hold), or None."""
        hold = host_hold(self.store)
        host = self.host()
        if hold is not None and memory.host_recovered(host, self.limit, hold[0], now):
            self.store.set_flag(HOST_OOM_FLAG, None)
            self.on_event(f"host RAM recovered after the host OOM of {hold[1]}; launches resume")
            hold = None
        return memory.host_wait(host, self.limit, oom_hold=hold, now=now)
