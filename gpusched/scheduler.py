"""One scheduling step, ``Scheduler.tick(now)``: reap -> stop -> place -> launch.

The scheduler owns no clock and never sleeps: the daemon calls ``tick`` when woken (a job
exited, a client submitted) or when its sampling interval passes; tests and the simulator
call it with whatever ``now`` they like. Store, probe, executors and the launch step are
passed in, so the same code runs against tmux, plain processes, Slurm or fakes.
"""

from __future__ import annotations

import logging
import math
import os
import time
import uuid
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence

from msgspec import Struct, field
from msgspec.structs import replace

from gpusched import disk, memory, memwatch, outcome, placement, predict
from gpusched.attempt import LAUNCH, AttemptPaths, materialize
from gpusched.command import script_of
from gpusched.errors import GpuschedError
from gpusched.executors import Executor, Handle, LaunchRequest, LaunchUncertain, launch_each, launch_many
from gpusched.gpus import Probe
from gpusched.model import (
    GPU_LOST_WHY,
    MIB_PER_GIB,
    AttemptState,
    Classification,
    ExitRecord,
    GpuProcess,
    GpuState,
    JobState,
    Outcome,
    Placement,
    RetryPolicy,
    Step,
    StepKind,
    Suite,
)
from gpusched.store import AttemptRow, Ending, GpuOut, JobRow, NewAttempt, Store, SuiteRow, draining

log = logging.getLogger(__name__)

#: What an attempt on a card that is lost when it is reaped may have ended as, because of the
#: card (CUDA says "unspecified launch failure" or nothing at all; it hangs past its limit);
#: such an end is the card's fault, as an uncorrectable ECC error is.
_A_LOST_CARD_EXPLAINS = frozenset({Outcome.ERROR, Outcome.TIMEOUT, Outcome.LOST})
#: the queued jobs that may start at a time (its one ``?``): the candidates' condition
_MAY_START = "state = 'queued' AND (not_before IS NULL OR not_before <= ?)"


def _our_card(a: AttemptRow) -> int | None:
    """The card ``a`` runs on, when gpusched owns it: on Slurm the cluster owns its cards
    (their faults, their loss)."""
    return None if a.backend == "slurm" else a.gpu


def _held(processes: Sequence[GpuProcess]) -> int:
    return sum(p.used_mib or 0 for p in processes)


def _newcomers(came: Sequence[GpuProcess]) -> str:
    """Processes that came onto a card, for an OOM's reason."""
    pids = ", ".join(str(p.pid) for p in came)
    return f"someone else's process{'es' * (len(came) > 1)} (pid {pids}, {_held(came) / MIB_PER_GIB:.1f} GiB)"


def lost_stop(gpu: int) -> str:
    """Why gpusched stops an attempt whose card the probe finds lost."""
    return f"its GPU {gpu} is lost"


class Settings(Struct, kw_only=True):
    headroom_frac: float = 0.10  # keep this share of every card free (seeds: 10-20 %)
    ramp_s: float = 60.0  # a job launched (or last grown) this recently counts as holding its predicted peak
    release_s: float = memory.RELEASE_S  # an ended attempt's processes count as ours until gone, at most
    pack_after_s: float = 600.0  # later jobs kept overtaking a job this long: its slower tiers at its turn
    hold_after_s: float = 1800.0  # ... this long, a card is kept free of new jobs for it
    hold_frac: float = 0.3  # at most this share of the cards (at least one) kept free at once
    unstick_after_s: float = 3600.0  # nothing of ours runs and others' memory keeps a job out this long: go
    start_safer: bool = True  # start at the first tier whose predicted peak fits a card (memory.start_tier)
    fit_share: bool = True  # ... and, once peaks are learned, fits a slot's share of it
    host: memory.HostLimit = field(default_factory=memwatch.host_limit_from_env)  # launches wait below this
    disk_min: disk.DiskLimit = field(default_factory=disk.disk_limit_from_env)  # ... and on a suite's disk
    cancel_grace_s: float = 10.0  # SIGTERM, then SIGKILL to the group after this long
    max_lost: int = 3
    gpu_out_after: int = 2  # this many GPU faults in a row on one card take it out of service
    wake_path: str | None = None  # FIFO the wrapper pokes when a job ends
    candidates: int = 256  # queued jobs considered per tick (keeps a tick cheap at 10k queued)


class _Begun(Struct, frozen=True):
    """An attempt recorded ``launching`` (phase 1), with what starting it needs."""

    job: JobRow
    placement: Placement
    suite_row: SuiteRow
    paths: AttemptPaths
    attempt_id: int
    gpu_uuid: str | None
    request: LaunchRequest


#: (queued, views, *, headroom_frac) -> Decision, its waits in :func:`placement.job_order` of
#: ``queued`` as :func:`placement.assign` leaves them (holds and starvation read them in it).
AssignFn = Callable[..., placement.Decision]


class TickReport(Struct, kw_only=True):
    reaped: list[tuple[str, str]] = field(default_factory=list)  # (job id, outcome)
    launched: list[tuple[str, int | None, str]] = field(default_factory=list)  # (job id, gpu, tier)
    waiting: int = 0


#: A tick that finds the wall clock this much further on than the monotonic clock since the
#: last one finds the machine was away (:meth:`Scheduler._clock`); ticks come every second.
AWAY_S = 30.0
#: How long an attempt recorded ``launching`` whose files were written, with no trace of its
#: wrapper, is looked at again rather than requeued as never started (see ``_reconcile_one``).
START_GRACE_S = 5.0


class Scheduler:
    def __init__(
        self,
        store: Store,
        probe: Probe,
        executors: Mapping[str, Executor],
        *,
        settings: Settings | None = None,
        on_event: Callable[[str], None] | None = None,
        process_trees: memwatch.TreesFn | None = None,
        host_memory: memwatch.HostFn | None = None,
        disk_free: Callable[[str], disk.DiskFree] | None = None,
        assign: AssignFn | None = None,
        monotonic: Callable[[], float] | None = None,
        oom_kills: memwatch.OomKills | None = None,
    ) -> None:
        """``process_trees``, ``host_memory``, ``disk_free`` (defaults: the real process
        table, psutil and ``statvfs``) and ``assign`` (default :func:`placement.assign`; see
        :data:`AssignFn`) are seams for the simulator and tests. ``monotonic`` (the daemon's:
        :func:`time.monotonic`, which stands still while the machine sleeps) lets a tick tell
        the machine was away (see :meth:`_clock`); without it, ``now`` is the only clock.
        ``oom_kills`` (the daemon's reads the kernel's count) tells a SIGKILL the kernel's OOM
        killer did not send; without it, every SIGKILL is taken for the kernel's."""
        self.store = store
        self.probe = probe
        self.executors = executors  # not a copy: the daemon's makes a backend on first use
        self.settings = settings or Settings()
        self.on_event = on_event or (lambda msg: log.info("%s", msg))
        self.assign = assign or placement.assign
        self.disk_free = disk_free or disk.disk_free
        self._paused: tuple[float, str] | None = None  # (until, why): launches pause after a machine failure
        self._machine_failures = 0  # launch failures for want of a machine resource, in a row
        self._launch_flag = store.flag(disk.LAUNCH_WAIT_FLAG)  # as last written, to write only changes
        self._empty_since: dict[int, float] = {}  # card -> since when none of our jobs has run on it
        self.history = memwatch.History(store)  # the runs' peaks and run times, kept between ticks
        self.memory = memwatch.MemoryWatch(
            store,
            trees=process_trees,
            host=host_memory,
            limit=self.settings.host,
            ramp_s=self.settings.ramp_s,
            release_s=self.settings.release_s,
            on_event=self.on_event,
        )
        self._suites: dict[str, tuple[float, SuiteRow]] = {}
        self._queue: dict[int, JobRow] = {}  # the candidates last read, by seq, in the queue's order
        self._queue_version: int | None = None  # the database they were read from (its data_version)
        store.note_changed_jobs()  # ... and what this connection changed since
        self._queue_span = (math.inf, -math.inf)  # ... valid for these times (no not_before within)
        self._queued_suites: list[str] | None = None  # the suites with jobs queued, this tick
        self._told_version: int | None = None  # the database the backends were last told of
        self._term_sent: dict[int, float] = {}
        self._stops: dict[int, tuple[str, float]] = {}  # attempts stopped at a limit: (why, since)
        self.last_snapshot: list[GpuState] = []
        self._read: tuple[float, list[GpuState]] | None = None  # this tick's probe read: (now, it)
        self._monotonic = monotonic
        self._oom_kills = oom_kills
        self._scripts: dict[str, str | None] = {}  # a suite's command -> the script it runs
        self._clocks: tuple[float, float] | None = None  # the last tick's (now, monotonic)
        self._away: list[tuple[float, float]] = []  # (back at, seconds away): suspends, clock steps

    # ------------------------------------------------------------------ the step

    def tick(self, now: float, *, snapshot: list[GpuState] | None = None) -> TickReport:
        report = TickReport()
        self._clock(now)
        self._sync_suites()
        self._read = None if snapshot is None else (now, snapshot)
        live = self.store.live_attempts()
        self._stops = self.store.stops()
        live = self._reap(live, now, report)
        self._queued_suites = None  # read again once the reaps have requeued what they do
        gpus = self._gpus(now)
        self.last_snapshot = gpus
        if any(g.lost for g in gpus):
            self._take_out_lost(gpus, live, now)
        self._stop(live, now)  # (after: a lost card's jobs are signalled in the tick that finds it)
        att = self.memory.measure(live, gpus, now)
        paused = self._paused
        self._place(live, gpus, att, now, report)
        if self._paused is not paused:  # a launch failed for want of a resource: say so now
            self._launchable(self._candidates(now), now)
        if (version := self._data_version()) != self._told_version:
            # another connection committed (a cancel may have left a suite with nothing queued),
            # or this is the first tick (a restarted daemon took back panes of ended suites)
            self._told_version = version
            self._tell_reaped((), every=True)
        return report

    def _take_out_lost(self, gpus: list[GpuState], live: list[AttemptRow], now: float) -> None:
        """A card the probe finds lost goes out of service at once, as one that failed twice in
        a row under jobs does: nothing placed there could run, and only a person brings it
        back (``gpusched gpus --enable``; a card still lost then goes out again). The jobs
        running on it are stopped (they can only fail or hang there; a hung one would hold
        its slot until morning) and, reaped, requeued on other cards as a GPU fault."""
        out = self.store.gpus_out()
        lost = {g.index for g in gpus if g.lost}
        for i in sorted(lost - out.keys()):
            if self.store.gpu_lost(i, GPU_LOST_WHY, now=now):
                fix = f"`gpusched gpus --enable {i}` once it is fixed"
                self.on_event(f"GPU {i} out of service: {GPU_LOST_WHY}; {fix}")
        for a in live:
            card = _our_card(a)
            if card in lost and a.state is AttemptState.RUNNING and a.id not in self._stops:
                why = lost_stop(card)
                self.store.stop_attempt(a.id, a.job_id, why, now=now)
                self._stops[a.id] = (why, now)

    def _gpus(self, now: float) -> list[GpuState]:
        """This tick's probe read, taken once: by the first reap that asks, else here."""
        if self._read is None or self._read[0] != now:
            self._read = (now, self._snapshot())
        return self._read[1]

    def _card_lost(self, card: int, now: float) -> bool:
        """Whether ``card`` is lost now (read this tick: a job dies with its card before any
        earlier read could say so)."""
        return any(g.index == card and g.lost for g in self._gpus(now))

    def _snapshot(self) -> list[GpuState]:
        """The probe's snapshot; [] (place by slots only) should a probe break its promise
        never to raise: a GPU we cannot read must not stop the queue."""
        try:
            return self.probe.snapshot()
        except Exception:
            log.exception("GPU probe failed; placing by slots only this tick")
            return []

    # ------------------------------------------------------------------ reap

    def _reap(self, live: list[AttemptRow], now: float, report: TickReport) -> list[AttemptRow]:
        if any(a.state is AttemptState.LAUNCHING for a in live):
            # A launch completes within the tick that begins it, so an attempt still
            # `launching` here was left by a crash or a failed mark_running: reconcile it
            # as a restarted daemon would (adopt, reap, or requeue), never launch it again.
            for note in self.reconcile(now, only_launching=True):
                self.on_event(f"reconcile: {note}")
            live = self.store.live_attempts()
        still: list[AttemptRow] = []
        with self.store.tx():  # a tick's reaps in one commit
            cancelled = set(self.store.cancel_requested())  # under the write lock: none lands meanwhile
            ended: list[tuple[AttemptRow, ExitRecord | None]] = []
            for a in live:
                if a.state is AttemptState.LAUNCHING:
                    still.append(a)  # its backend could not be asked: keep its slot, ask again next tick
                    continue
                gone, exit_rec = self._ended(a, cancelled)
                if gone:
                    ended.append((a, exit_rec))
                else:
                    still.append(a)
            outcomes = self.reap_attempts(ended, now)
        report.reaped += [(a.job_id, o.value) for (a, _), o in zip(ended, outcomes, strict=True)]
        return still

    def _ended(self, a: AttemptRow, cancelled: Collection[str]) -> tuple[bool, ExitRecord | None]:
        """Whether ``a`` ended, and its exit record (None: it vanished without one).
        ``cancelled``: the running jobs a user asked to cancel."""
        paths = AttemptPaths(a.dir)
        exit_rec = paths.read_exit()
        if exit_rec is None or self._stopping(a, cancelled):
            ex = self.executors.get(a.backend)
            if ex is not None and a.handle is not None and ex.alive(a.handle):
                return False, None
            exit_rec = paths.read_exit()  # it may have written exit.json just before going
        return True, exit_rec

    def _stopping(self, a: AttemptRow, cancelled: Collection[str]) -> bool:
        """Being cancelled or stopped at a limit: reaped only once its whole process group is
        gone, not when its wrapper has written exit.json, so a child that ignores SIGTERM still
        gets the SIGKILL."""
        return a.id in self._term_sent or a.id in self._stops or a.job_id in cancelled

    def reap_attempt(self, a: AttemptRow, exit_rec: ExitRecord | None, now: float) -> Outcome:
        """Classify an ended attempt (``exit_rec`` None: vanished) and move its job on."""
        (result,) = self.reap_attempts([(a, exit_rec)], now)
        return result

    def reap_attempts(
        self, ended: Sequence[tuple[AttemptRow, ExitRecord | None]], now: float
    ) -> list[Outcome]:
        """Classify ended attempts (each with its exit record; None: vanished) and move their
        jobs on: their jobs read in one query and their ends recorded in one savepoint
        (:meth:`Store.finish_attempts`). Returns their outcomes, in order."""
        if not ended:
            return []
        jobs = self.store.jobs_by_id([a.job_id for a, _ in ended])
        ends: list[Ending] = []
        for a, exit_rec in ended:
            job = jobs[a.job_id]
            result, tail = self._classify(a, job, exit_rec, now)
            came = self._arrivals(a, tail, now) if result.outcome is Outcome.OOM else ()
            step = self._next_step(job, a, result, now, _newcomers(came) if came else None)
            if came:
                self.store.add_arrival(a.id, [p.pid for p in came], _held(came))
            ends.append(Ending(attempt_id=a.id, exit=exit_rec, result=result, step=step, job=job))
        self.store.finish_attempts(ends, now=now)
        ok: set[int] = set()  # cards a job succeeded on: their faults so far were not in a row
        for (a, exit_rec), e in zip(ended, ends, strict=True):
            AttemptPaths(a.dir).drop_pipe()  # (a tmux pane's: its wrapper's tee is done with it)
            card = _our_card(a)
            if card is not None and e.result.outcome is Outcome.OK:
                ok.add(card)
            elif card is not None:
                self.store.gpus_ok(ok)  # (those before this one, in order)
                ok.clear()
                self._count_fault(a, e.result, now)
            self._term_sent.pop(a.id, None)
            peak = exit_rec.peak_mib if exit_rec else None
            self.memory.ended(a, e.result.outcome, now, reported_peak_mib=peak)
            self.on_event(
                f"{a.job_id}: attempt {a.n} ({a.tier_name}) {e.result.outcome.value} -> {e.step.reason}"
            )
        self.store.gpus_ok(ok)
        self._tell_reaped([a for a, _ in ended])
        return [e.result.outcome for e in ends]

    def _tell_reaped(self, attempts: Sequence[AttemptRow], *, every: bool = False) -> None:
        """Hand each backend that has the optional ``reaped(handles, queued)`` (:class:`Executor`)
        the handles of its attempts just reaped, and the suites that still have jobs queued: a
        tmux pane that keeps its job on screen is marked dead at the job's end, as a window of
        its own is, not at its pane's next launch, and a suite with nothing left to run has its
        idle panes marked so too. ``every``: each such backend is told, with no handles where it
        has none. What it does is for the eye only, so a failure is logged, never the tick's."""
        by_backend: dict[str, list[Handle]] = {name: [] for name in self.executors} if every else {}
        for a in attempts:
            if a.handle is not None:
                by_backend.setdefault(a.backend, []).append(a.handle)
        queued: frozenset[str] | None = None
        for backend, handles in by_backend.items():
            reaped = getattr(self.executors.get(backend), "reaped", None)
            if reaped is not None:
                try:
                    if queued is None:  # (read once, after the reaps requeued what they do)
                        queued = frozenset(self.store.suites_with((JobState.QUEUED.value,)))
                    reaped(handles, queued)
                except Exception:
                    log.exception("%s: after reaping %d attempts", backend, len(handles))

    def _classify(
        self, a: AttemptRow, job: JobRow, exit_rec: ExitRecord | None, now: float
    ) -> tuple[Classification, str]:
        """What ended ``a``: :func:`outcome.classify` of its exit and log, then what only the
        daemon knows: no kernel OOM kill behind a SIGKILL, a card lost while it ran. With the
        tail of its log that was read (none after a success)."""
        failed = exit_rec is None or exit_rec.exit_code != 0 or exit_rec.oom_reported
        tail = AttemptPaths(a.dir).log_tail() if failed else ""
        stop = self._stops.get(a.id)
        result = outcome.classify(
            exit_rec, tail, cancel_requested=job.cancel_requested, stopped_for=stop[0] if stop else None
        )
        if (
            result.reason == outcome.SIGKILL_REASON
            and self._oom_kills is not None
            and a.backend != "slurm"  # this machine's count says nothing of a cluster node's kills
            and self._oom_kills.none_since(a.launched_at, now)
        ):
            result = Classification(outcome=Outcome.HOST_OOM, reason=outcome.SIGKILL_NOT_KERNEL)
        card = _our_card(a)
        if card is not None and result.outcome in _A_LOST_CARD_EXPLAINS and self._card_lost(card, now):
            how = "stopped" if stop and stop[0] == lost_stop(card) else result.reason
            why = f"its GPU {card} was lost while it ran ({how})"
            result = Classification(outcome=Outcome.GPU_FAULT, reason=why, line=result.line)
        return result, tail

    def _count_fault(self, a: AttemptRow, result: Classification, now: float) -> None:
        """A card that failed under its jobs ``gpu_out_after`` times in a row goes out of
        service (a success in between starts the count again, :meth:`Store.gpus_ok`): else it
        would fail every job placed there, and, as its slots free fastest, take most of the
        queue down with it."""
        assert a.gpu is not None
        if result.outcome is Outcome.GPU_FAULT:
            why = f"{result.reason}" + (f": {result.line}" if result.line else "")
            if self.store.gpu_fault(a.gpu, a.job_id, why, now=now, out_after=self.settings.gpu_out_after):
                self.on_event(
                    f"GPU {a.gpu} out of service after {self.settings.gpu_out_after} faults in a row "
                    f"(last: {a.job_id}: {why}); `gpusched gpus --enable {a.gpu}` once it is fixed"
                )

    def _arrivals(self, a: AttemptRow, log_tail: str, now: float) -> tuple[GpuProcess, ...]:
        """Someone else's processes that came onto ``a``'s card while it ran, when together
        they hold more than the headroom placement keeps (the job's own tier fit without
        them), for its OOM; none when an earlier attempt of the job at this tier also ran out
        of memory (then it steps down after all). The card's processes are the OOM message's
        (a newcomer whose own allocation then failed is gone by now) and the probe's."""
        card = next((g for g in self._gpus(now) if g.index == a.gpu), None)
        if card is None or card.total_mib is None:
            return ()
        listed = {p.pid: p.used_mib or 0 for p in card.processes}
        for pid, mib in outcome.oom_processes(log_tail).items():
            listed[pid] = max(mib, listed.get(pid, 0))
        on_card = [GpuProcess(pid=pid, used_mib=mib) for pid, mib in listed.items()]
        came = self.memory.arrivals(a, on_card, self.store.live_attempts())
        if _held(came) <= self.settings.headroom_frac * card.total_mib:
            return ()
        if any(
            b.id != a.id and b.tier == a.tier and b.outcome == Outcome.OOM
            for b in self.store.attempts(a.job_id)
        ):
            return ()
        return came

    def _next_step(
        self, job: JobRow, a: AttemptRow, result: Classification, now: float, arrival: str | None = None
    ) -> Step:
        suite = self._suite(job.suite)
        tiers = suite.suite.tiers if suite else ()
        # the job's earlier attempts that the machine failed the same way (a card, a disk, the network)
        faults = (
            self.store.count_outcomes(job.id, result.outcome)
            if result.outcome in (Outcome.GPU_FAULT, Outcome.DISK_FULL, Outcome.NETWORK)
            else 0
        )
        return outcome.next_step(
            result,
            tier=a.tier,
            tiers=tiers,
            gpu=a.gpu,
            errors_so_far=job.errors,
            lost_so_far=job.lost,
            retry=suite.suite.retry if suite else RetryPolicy(),
            now=now,
            max_lost=self.settings.max_lost,
            faults_so_far=faults,
            arrival=arrival,
        )

    # ------------------------------------------------------------------ stop: cancels and limits

    def _stop(self, live: list[AttemptRow], now: float) -> None:
        """Signal the attempts being stopped: those of jobs a user cancelled, and those past
        their suite's limits. SIGTERM to the process group, SIGKILL ``cancel_grace_s`` later."""
        self._check_limits(live, now)
        wanted = set(self.store.cancel_requested())
        if not wanted and not self._stops:
            return
        for a in live:
            stop = self._stops.get(a.id)
            if (a.job_id not in wanted and stop is None) or a.handle is None:
                continue
            ex = self.executors.get(a.backend)
            if ex is None:
                continue
            why = "cancel" if a.job_id in wanted else (stop[0] if stop else "")
            sent = self._term_sent.get(a.id)
            if sent is None:
                ex.terminate(a.handle, force=False)
                self._term_sent[a.id] = now
                self.on_event(f"{a.job_id}: SIGTERM sent ({why})")
            elif now - sent >= self.settings.cancel_grace_s:
                ex.terminate(a.handle, force=True)
                self.on_event(
                    f"{a.job_id}: SIGKILL sent to its process group "
                    f"after {self.settings.cancel_grace_s:.0f} s"
                )
                self._term_sent[a.id] = float("inf")  # once is enough

    def _clock(self, now: float) -> None:
        """Note when the wall clock moved on much further than the monotonic one since the last
        tick: the machine slept (a suspended workstation), or its clock was stepped forward.
        The jobs did not run meanwhile, so their limits do not count that time; without this,
        a machine woken in the morning stopped every job with ``limits.silence`` as hung."""
        if self._monotonic is None:
            return
        mono = self._monotonic()
        if self._clocks is not None:
            away = (now - self._clocks[0]) - (mono - self._clocks[1])
            if away >= AWAY_S:
                self._away = [*self._away[-63:], (now, away)]
                self.on_event(
                    f"the clock moved {away:.0f} s more than this process ran (the machine slept, or "
                    "its clock was set forward): the jobs' limits do not count that time"
                )
        self._clocks = (now, mono)

    def _away_since(self, t: float) -> float:
        """Seconds the machine was away (:meth:`_clock`) after ``t``."""
        return sum(gone for back, gone in self._away if back > t)

    def _check_limits(self, live: list[AttemptRow], now: float) -> None:
        """Record (in the store, so that a restarted daemon still knows) the running attempts
        that passed their suite's ``limits``: ``time`` since their wrapper started,
        ``silence``, no growth of output.log for that long (taken as hung), or ``output``, an
        output.log larger than that. An attempt whose wrapper has not started yet (a Slurm job
        still pending) has used none of them."""
        for a in live:
            if a.state is not AttemptState.RUNNING or a.id in self._stops:
                continue
            suite = self._suite(a.job_id.partition("/")[0])
            limits = suite.suite.limits if suite else None
            if limits is None or not limits.any:
                continue
            paths = AttemptPaths(a.dir)
            started = paths.read_pid()
            if started is None:
                continue
            output_at, output_bytes = paths.output_seen()
            why = outcome.past_limit(
                limits,
                started_at=started[1],
                output_at=output_at,
                now=now,
                away_since=self._away_since,
                output_bytes=output_bytes,
            )
            if why is not None:
                self.store.stop_attempt(a.id, a.job_id, why, now=now)
                self._stops[a.id] = (why, now)

    # ------------------------------------------------------------------ place + launch

    def _sync_suites(self) -> None:
        """Forget cached suites that were submitted again (or are gone): one small query per
        tick instead of one per job, however long the queue, and about the cached suites only,
        however many the store keeps (0.15 ms a tick with 246)."""
        if self._suites:
            current = self.store.submitted_at(list(self._suites))
            self._suites = {n: c for n, c in self._suites.items() if current.get(n) == c[0]}

    def _suite(self, name: str) -> SuiteRow | None:
        """The suite as last submitted (cached; :meth:`_sync_suites` drops stale entries)."""
        cached = self._suites.get(name)
        if cached is None:
            s = self.store.suite(name)
            if s is None:
                return None
            cached = self._suites[name] = (s.submitted_at, s)
        return cached[1]

    def _place(
        self,
        live: list[AttemptRow],
        gpus: list[GpuState],
        att: memory.Attribution,
        now: float,
        report: TickReport,
    ) -> None:
        if draining(self.store.drains_at(), now):
            return  # `gpusched drain`: running jobs finish, nothing new starts
        queued = self._launchable(self._candidates(now), now)
        if not queued:
            return
        backends = {s: self._backend(s) for s in {j.suite for j in queued}}  # once per suite, not per job
        on_slurm = [j for j in queued if backends[j.suite] == "slurm"]
        if on_slurm:
            self._place_on_slurm(on_slurm, live, now, report)
            queued = [j for j in queued if backends[j.suite] != "slurm"]
            if not queued:
                return
        host_wait = self.memory.host_wait(now)
        if host_wait is not None:  # host RAM low, or not recovered from a host OOM
            self.store.set_waits({j.id: host_wait for j in queued})
            report.waiting = len(queued)
            return
        headroom = self.settings.headroom_frac
        empty = memory.rooms(gpus, {}, headroom)  # a card with nothing on it: what "fits" means for tiers
        room = memory.rooms(gpus, att.outside_mib, headroom)  # ... and with other people's processes
        demand = memwatch.demands(
            self.store,
            queued,
            self._suite,
            gpus,
            empty,
            headroom_frac=headroom,
            start_safer=self.settings.start_safer,
            fit_share=self.settings.fit_share,
            now=now,
            history=self.history,
            step_up=self.memory.step_up(),
        )
        base = self._views(live, gpus, att, now)
        out = self.store.gpus_out()
        if out:  # no job is placed on a card that kept failing under jobs
            base = {i: v for i, v in base.items() if i not in out}
        if not live:
            self.memory.holds.clear()  # nothing to drain: an empty card is free for all
        views = list(memory.held_views(base, self.memory.holds).values())
        waited = self.memory.waited_on_memory(demand, views, now, headroom)
        starved = self.memory.starved(demand, now)
        demand = memwatch.pack(demand, starved, after_s=self.settings.pack_after_s)
        qjobs = [d.view for d in demand.values()]
        decision = self.assign(qjobs, views, headroom_frac=headroom)
        placements, waits = list(decision.placements), {w.job_id: w.reason for w in decision.waits}
        self.memory.overtaken(qjobs, decision, now)
        if not placements and not live and not self.memory.releasing:
            forced = memory.unstick(  # never deadlock
                qjobs, views, headroom_frac=headroom, waited=waited, patience_s=self.settings.unstick_after_s
            )
            if forced is not None:
                placements.append(forced)
                waits.pop(forced.job_id, None)
        by_id = {j.id: j for j in queued}
        launches = []
        for p in placements:
            d = demand[p.job_id]
            reason = f"{d.note}; {p.reason}" if d.note and p.tier == d.view.tier else p.reason
            launches.append((by_id[p.job_id], replace(p, reason=reason), d.prediction(p.tier)))
        self._hold(demand, starved, waits, list(base.values()), room)
        if out:
            self._say_out(waits, by_id, out)
        changed = {j: why for j, why in waits.items() if by_id[j].wait_reason != why}  # changes only
        self._launch(launches, gpus, now, report, waits=changed)
        report.waiting = len(waits)

    def _hold(
        self,
        demand: Mapping[str, memwatch.Demand],
        waited: Mapping[str, float],
        waits: dict[str, str],
        views: Sequence[placement.GpuSlotView],
        room: Mapping[int, int],
    ) -> None:
        """Keep a card free for a job that memory has kept waiting too long (the card's jobs
        end, nothing new lands there, the job gets it); add the why to the waits."""
        waiting = [(demand[j].view, waited[j]) for j in waits if j in demand]  # in the queue's order
        old = dict(self.memory.holds)
        self.memory.holds = memory.choose_holds(
            waiting,
            views,
            room,
            current=old,
            hold_after_s=self.settings.hold_after_s,
            max_holds=max(1, int(self.settings.hold_frac * len(views))),
            headroom_frac=self.settings.headroom_frac,
        )
        for gpu, job_id in self.memory.holds.items():
            if old.get(gpu) != job_id:
                self.on_event(f"{job_id}: GPU {gpu} kept free for it (it waits for memory)")
        held = {j: g for g, j in reversed(self.memory.holds.items())}  # job -> its (first) held card
        for job_id, why in list(waits.items()):
            d = demand.get(job_id)
            note = d.note if d is not None else None
            suffix = f"; GPU {held[job_id]} is kept free for it" if job_id in held else ""
            waits[job_id] = f"{note}; {why}{suffix}" if note else f"{why}{suffix}"

    def _say_out(self, waits: dict[str, str], by_id: Mapping[str, JobRow], out: Mapping[int, GpuOut]) -> None:
        """The why of a job whose every GPU of its plan is out of service."""
        for job_id in waits:
            suite = self._suite(by_id[job_id].suite)
            plan = suite.gpu_plan.gpus if suite else ()
            if plan and all(g in out for g in plan):
                listed = ",".join(map(str, plan))
                waits[job_id] = (
                    f"every GPU of its plan is out of service ({listed}; GPU {plan[0]}: {out[plan[0]].why}); "
                    f"`gpusched gpus --enable {listed}` once fixed"
                )

    def _backend(self, suite_name: str) -> str | None:
        suite = self._suite(suite_name)
        return suite.backend if suite else None

    def _place_on_slurm(
        self, queued: list[JobRow], live: list[AttemptRow], now: float, report: TickReport
    ) -> None:
        """On Slurm the cluster places jobs; gpusched only caps how many of a suite's jobs are
        submitted at once (``--max-queued``, default 100) so a 10k-job suite does not flood it."""
        in_flight = Counter(a.job_id.split("/", 1)[0] for a in live)
        waits: dict[str, str] = {}
        launches: list[tuple[JobRow, Placement, predict.Prediction | None]] = []
        for job in queued:
            suite = self._suite(job.suite)
            assert suite is not None
            cap = int(suite.options.get("max_queued") or 100)
            if in_flight[job.suite] >= cap:
                waits[job.id] = f"{cap} of the suite's jobs already submitted to Slurm (--max-queued)"
                continue
            in_flight[job.suite] += 1
            tier = min(job.tier, len(suite.suite.tiers) - 1)
            p = Placement(job_id=job.id, gpu=None, tier=tier, reason="submitted to Slurm, which places it")
            launches.append((job, p, None))
        self._launch(launches, [], now, report, waits=waits)

    def _launchable(self, queued: list[JobRow], now: float) -> list[JobRow]:
        """``queued`` less the jobs that wait for the machine: all of them while launches are
        paused after a machine failure, a suite's while its working directory or script is
        gone or its logs' or working directory's disk is low (:meth:`_disks_wait`). Records
        why they wait, for ``status``."""
        waits: dict[str, str] = {}
        if self._paused is not None and now < self._paused[0]:
            why = self._paused[1]
            waits = {j.id: why for j in queued}
        elif queued:
            low: dict[str, str] = {}
            for name in {j.suite for j in queued}:
                suite_row = self._suite(name)
                if suite_row is None:
                    continue
                if disks := self._disks_wait(suite_row.suite):
                    low[name] = disks
            waits = {j.id: low[j.suite] for j in queued if j.suite in low}
        self.store.set_waits(waits)  # the jobs' reasons first: status shows the flag with them
        flag = "; ".join(dict.fromkeys(waits.values())) or None
        if flag != self._launch_flag:
            self.store.set_flag(disk.LAUNCH_WAIT_FLAG, flag)
            self.on_event(f"launches wait: {flag}" if flag else "launches resume")
            self._launch_flag = flag
        return [j for j in queued if j.id not in waits] if waits else queued

    def _disks_wait(self, suite: Suite) -> str | None:
        """Why ``suite``'s launches wait for its files, or None: its working directory gone (a
        project folder moved or deleted, a network mount that dropped: every job would fail at
        its ``cd``), the script its command runs gone (a ``git checkout`` at 1 a.m.: every job
        would fail at its start), or its logs' or working directory's disk low. One
        ``statvfs`` each, which says whether the path is there as well as the room."""
        frees = {path: self.disk_free(path) for path in dict.fromkeys((suite.logs_dir, suite.workdir))}
        if frees[suite.workdir].missing:  # the logs' folder is made by the first launch
            return (
                f"the working directory {suite.workdir} of {suite.name} is gone (moved, deleted or"
                " unmounted): its jobs wait for it"
            )
        script = self._script(suite)
        if script is not None and self.disk_free(os.path.join(suite.workdir, script)).missing:
            return (
                f"the script {script} of {suite.name} is gone from {suite.workdir} (a checkout, a"
                " rename?): its jobs wait for it"
            )
        for free in frees.values():
            if (why := disk.disk_wait(free, self.settings.disk_min)) is not None:
                return why
        return None

    def _script(self, suite: Suite) -> str | None:
        """The script ``suite``'s command runs (:func:`gpusched.command.script_of`), read once."""
        if suite.command not in self._scripts:
            self._scripts[suite.command] = script_of(suite.command)
        return self._scripts[suite.command]

    def _candidates(self, now: float) -> list[JobRow]:
        """The first ``candidates`` queued jobs that may start at ``now``, in the queue's order,
        and when those are all of one suite or a few, the first of each other suite with jobs
        queued (:meth:`_with_heads`). Kept between ticks: read whole again when another connection
        committed (a submit, a cancel: ``PRAGMA data_version`` moves) or ``now`` left the span
        in which no ``not_before`` falls; after this connection's own writes (a tick's launches
        and reaps) only the window's order is read again, and whole only the rows it changed
        (:meth:`Store.changed_jobs`) or that are new to the window."""
        db, n = self.store.db, self.settings.candidates
        version = self._data_version()
        changed = self.store.changed_jobs()
        since, until = self._queue_span
        window = f"FROM jobs WHERE {_MAY_START} ORDER BY priority DESC, seq LIMIT ?"
        fresh = version == self._queue_version
        if fresh:
            if not changed and since <= now < until:
                return list(self._queue.values())
            kept = {seq: j for seq, j in self._queue.items() if seq not in changed}
            order = [seq for (seq,) in db.execute(f"SELECT seq {window}", (now, n))]  # (the index alone)
            new = [seq for seq in order if seq not in kept]
            if new:
                marks = ",".join("?" * len(new))
                q = f"SELECT * FROM jobs WHERE state = 'queued' AND seq IN ({marks})"
                kept.update((r["seq"], JobRow.from_row(r)) for r in db.execute(q, new))
            self._queue = self._with_heads(
                now, {seq: kept[seq] for seq in order if seq in kept}, full=len(order) == n
            )
            fresh = self._data_version() == version  # no other commit landed between those reads
        if not fresh:
            version = self._data_version()
            rows = db.execute(f"SELECT * {window}", (now, n)).fetchall()
            self._queue = self._with_heads(
                now, {r["seq"]: JobRow.from_row(r) for r in rows}, full=len(rows) == n
            )
        (later,) = db.execute(
            "SELECT MIN(not_before) FROM jobs WHERE state = 'queued' AND not_before > ?", (now,)
        ).fetchone()
        self._queue_version, self._queue_span = version, (now, math.inf if later is None else later)
        return list(self._queue.values())

    def _with_heads(self, now: float, window: dict[int, JobRow], *, full: bool) -> dict[int, JobRow]:
        """``window`` and, when it is ``full``, the first queued jobs of each suite that has
        none in it: as many as its plan has slots, at least 32, all in the queue's order.
        Without them a long suite at the head of the queue kept another suite's jobs out of
        every tick, and a card only that one may use sat idle all night."""
        if not full:
            return window
        seen = {j.suite for j in window.values()}
        q = f"SELECT * FROM jobs WHERE {_MAY_START} AND suite = ? ORDER BY priority DESC, seq LIMIT ?"
        heads = [
            JobRow.from_row(r)
            for name in self._queued_suite_names()
            if name not in seen and (row := self._suite(name)) is not None
            for r in self.store.db.execute(q, (now, name, max(32, row.gpu_plan.total_slots)))
        ]
        if not heads:
            return window
        merged = [*window.values(), *heads]
        return {j.seq: j for j in sorted(merged, key=lambda j: (-j.priority, j.seq))}

    def _queued_suite_names(self) -> list[str]:
        """The suites with jobs queued, read once a tick after its reaps (for the window's
        heads and the cards the views hold)."""
        if self._queued_suites is None:
            self._queued_suites = self.store.suites_with((JobState.QUEUED.value,))
        return self._queued_suites

    def _data_version(self) -> int:
        """Moves when another connection commits to the database (a submit, a cancel)."""
        return int(self.store.db.execute("PRAGMA data_version").fetchone()[0])

    def _views(
        self, live: list[AttemptRow], gpus: list[GpuState], att: memory.Attribution, now: float
    ) -> dict[int, placement.GpuSlotView]:
        running = Counter(a.gpu for a in live if a.gpu is not None)
        exclusive = {a.gpu for a in live if a.gpu is not None and self._is_exclusive(a)}
        reserved = self.memory.reserved(live, att, now)
        known = {g.index: g for g in gpus}
        indices = set(known) | {g for s in self._active_suites() for g in s.gpu_plan.gpus}
        self._empty_since = {i: self._empty_since.get(i, now) for i in indices if not running[i]}
        return {
            i: placement.GpuSlotView(
                index=i,
                running=running[i],
                exclusive_running=i in exclusive,
                free_mib=known[i].free_mib if i in known else None,
                total_mib=known[i].total_mib if i in known else None,
                reserved_mib=reserved[i],
                empty_s=now - self._empty_since[i] if i in self._empty_since else 0.0,
            )
            for i in sorted(indices)
        }

    def _active_suites(self) -> list[SuiteRow]:
        return [s for s in (self._suite(n) for n in self._queued_suite_names()) if s is not None]

    def _is_exclusive(self, a: AttemptRow) -> bool:
        suite = self._suite(a.job_id.split("/", 1)[0])
        if suite is None or a.tier >= len(suite.suite.tiers):
            return False
        return suite.suite.tiers[a.tier].exclusive

    def _predict(self, job: JobRow, suite: SuiteRow, gpus: list[GpuState], tier: int) -> predict.Prediction:
        default = memwatch.default_mib(suite, gpus, self.settings.headroom_frac)
        kept = self.history.read({job.task}).get(job.task) or predict.TaskHistory(job.task)
        return kept.peak(job.id, tier, default_mib=default)

    def _launch(
        self,
        items: Sequence[tuple[JobRow, Placement, predict.Prediction | None]],
        gpus: list[GpuState],
        now: float,
        report: TickReport,
        *,
        waits: dict[str, str],
    ) -> None:
        """Start a tick's placements in three steps: record every attempt ``launching`` with
        its token (one commit), write their attempt directories and start them (each as soon as
        its files are written; a backend with ``launch_many`` starts its share at once, once
        all are; one with ``begin``/``finish`` gives the handles once all are begun), then
        record them ``running``, with why the jobs left queued wait (``waits``,
        :meth:`Store.set_waits`), in one commit. A crash between the steps leaves attempts
        ``launching``, which :meth:`reconcile` settles by their tokens: nothing is ever started
        twice. So does a launch that may or may not have started
        (:class:`~gpusched.executors.LaunchUncertain`): the next tick reconciles it."""
        if not items:
            self.store.set_waits(waits)
            return
        begun = self._begin(items, gpus, now)
        started: list[tuple[_Begun, Handle | Exception]] = []
        ready: dict[str, list[_Begun]] = {}
        owed: dict[str, list[_Begun]] = {}  # begun, their handles not yet asked for
        for b in begun:
            try:
                materialize(
                    b.paths,
                    suite=b.suite_row.suite,
                    job=b.job.spec,
                    tier_index=b.placement.tier,
                    attempt_n=b.job.attempts + 1,
                    gpu=b.placement.gpu,
                    gpu_uuid=b.gpu_uuid,
                    backend=b.suite_row.backend,
                    env_file=b.suite_row.env_path,
                    run_since=self.store.run_since(b.job) if b.suite_row.suite.resume else None,
                )
                ex = self.executors[b.suite_row.backend]  # (or the backend itself is missing or broken)
            except Exception as e:  # a launch that fails must not wedge the job in "running"
                started.append((b, e))
                continue
            if hasattr(ex, "begin"):  # started at once, its handle asked for once all are
                try:
                    ex.begin(b.request)
                except Exception as e:
                    started.append((b, e))
                    continue
                owed.setdefault(b.suite_row.backend, []).append(b)
            elif hasattr(ex, "launch_many"):  # (tmux: one round trip to its server for them all)
                ready.setdefault(b.suite_row.backend, []).append(b)
            else:  # started at once: its wrapper runs on another core while the next one's files are written
                (handle,) = launch_each(ex, [b.request])
                started.append((b, handle))
        for backend, group in owed.items():
            try:
                handles = self.executors[backend].finish()  # type: ignore[attr-defined]
            except Exception as e:  # they may have started: the next tick looks (never a relaunch)
                log.exception("%s: the launches' handles were not given", backend)
                handles = [LaunchUncertain(f"{backend} did not give its handle ({e})")] * len(group)
            started += zip(group, handles, strict=True)
        for backend, group in ready.items():
            try:
                handles = launch_many(self.executors[backend], [b.request for b in group])
            except Exception as e:  # the backend itself is missing or broken
                handles = [e] * len(group)
            started += zip(group, handles, strict=True)
        machine: list[str] = []  # launches that failed for want of a machine resource
        with self.store.tx():
            self.store.set_waits(waits)
            if running := [(b.attempt_id, h) for b, h in started if not isinstance(h, Exception)]:
                self.store.mark_running_many(running, now=now)
            for b, handle in started:
                if isinstance(handle, LaunchUncertain):  # settled at the next tick (_reap)
                    log.warning("launch of %s uncertain: %s", b.job.id, handle)
                    self.on_event(f"{b.job.id}: {handle}; looked at again at the next tick")
                    continue
                if isinstance(handle, Exception):
                    log.error("launch of %s failed", b.job.id, exc_info=handle)
                    err = disk.machine_error(handle)
                    if err is not None:
                        machine.append(f"the launch of {b.job.id} failed: {err} (in {b.paths.dir})")
                    self._launch_failed(b.attempt_id, b.job, handle, now, uncharged=err is not None)
                    b.paths.drop_pipe()  # (a tmux launch makes it first)
                    continue
                tier = b.suite_row.suite.tiers[b.placement.tier]
                report.launched.append((b.job.id, b.placement.gpu, tier.name))
                where = f"GPU {b.placement.gpu}" if b.placement.gpu is not None else "no GPU"
                n, why = b.job.attempts + 1, b.placement.reason
                self.on_event(f"{b.job.id}: attempt {n} tier {tier.name} on {where} ({why})")
        if machine:
            self._pause(machine[0], now)
        elif started:
            self._machine_failures = 0

    def _pause(self, failure: str, now: float) -> None:
        """Pause every launch after one failed for want of a machine resource (a full disk,
        no file handles or processes left): 10 s, doubling while it keeps failing, at most
        5 min. The jobs wait queued, uncharged, instead of failing the queue in a minute."""
        self._machine_failures += 1
        pause = disk.pause_s(self._machine_failures)
        until = now + pause
        clock = time.strftime("%H:%M:%S", time.localtime(until))
        self._paused = (until, f"paused until {clock} ({pause:.0f} s) after {failure}")
        self.on_event(f"launches pause {pause:.0f} s: {failure}")

    def _begin(
        self,
        items: Sequence[tuple[JobRow, Placement, predict.Prediction | None]],
        gpus: list[GpuState],
        now: float,
    ) -> list[_Begun]:
        """Phase 1 of a tick's launches: their attempts recorded ``launching`` (one savepoint),
        less those whose job was cancelled (or moved) by a client since this tick read the
        queue."""
        planned: list[tuple[JobRow, Placement, SuiteRow, AttemptPaths, NewAttempt]] = []
        for job, p, pred in items:
            suite_row = self._suite(job.suite)
            assert suite_row is not None
            suite: Suite = suite_row.suite
            tier = suite.tiers[p.tier]
            paths = AttemptPaths.for_attempt(suite.logs_dir, job.name, job.attempts + 1, tier.name)
            gpu = next((g for g in gpus if g.index == p.gpu), None)
            pred = pred or self._predict(job, suite_row, gpus, p.tier)
            new = NewAttempt(
                job_id=job.id,
                tier=p.tier,
                tier_name=tier.name,
                gpu=p.gpu,
                gpu_uuid=gpu.uuid if gpu else None,
                backend=suite_row.backend,
                dir=os.fspath(paths.dir),
                token=uuid.uuid4().hex[:16],
                placement_reason=p.reason,
                predicted_mib=pred.mib,
                prediction_source=pred.source,
            )
            planned.append((job, p, suite_row, paths, new))
        begun: list[_Begun] = []
        ids = self.store.begin_attempts([new for *_, new in planned], now=now)
        for (job, p, suite_row, paths, new), attempt_id in zip(planned, ids, strict=True):
            if isinstance(attempt_id, GpuschedError):
                log.info("not launching %s: %s", job.id, attempt_id)
                continue
            req = self._request(job, suite_row.suite, paths, new.token)
            begun.append(_Begun(job, p, suite_row, paths, attempt_id, new.gpu_uuid, req))
        return begun

    def _request(self, job: JobRow, suite: Suite, paths: AttemptPaths, token: str) -> LaunchRequest:
        env = {"GPUSCHED_JOB_ID": job.id}
        if self.settings.wake_path:
            env["GPUSCHED_WAKE"] = self.settings.wake_path
        return LaunchRequest(
            job_id=job.id,
            suite=job.suite,
            job_name=job.name,
            token=token,
            attempt_dir=paths.dir,
            workdir=suite.workdir,
            env=env,
            options=dict(self._suite(job.suite).options),  # type: ignore[union-attr]
        )

    def _launch_failed(
        self, attempt_id: int, job: JobRow, err: Exception, now: float, *, uncharged: bool = False
    ) -> None:
        """A launch that failed: requeued at the same tier, counted as a loss (three fail the
        job) unless ``uncharged`` (the machine ran short of something; nothing of the job ran)."""
        result = Classification(outcome=Outcome.LOST, reason=f"launch failed: {err}")
        if uncharged:
            step = Step(
                kind=StepKind.REQUEUE,
                tier=job.tier,
                reason=f"launch failed, requeued (the machine's fault: not counted as lost): {err}",
            )
            self.store.finish_attempt(
                attempt_id, exit=None, result=result, step=step, now=now, count_lost=False
            )
            return
        lost = job.lost + 1
        if lost >= self.settings.max_lost:
            step = Step(kind=StepKind.FAIL, tier=job.tier, reason=f"launch failed {lost} times: {err}")
        else:
            step = Step(
                kind=StepKind.REQUEUE,
                tier=job.tier,
                reason=f"launch failed, retrying: {err}",
                not_before=now + 5.0 * lost,
            )
        self.store.finish_attempt(attempt_id, exit=None, result=result, step=step, now=now)

    # ------------------------------------------------------------------ restart

    def reconcile(self, now: float, *, only_launching: bool = False) -> list[str]:
        """After a daemon (re)start: adopt what still runs, reap what ended while we were
        down, and declare lost what vanished. Never launches anything twice: an attempt
        recorded ``launching`` is adopted if any trace of it exists (its token on a pane or
        in a process's environment, its pid file, its exit record), else it never started
        and its job is requeued at the same tier, not counted as lost. An attempt whose
        backend cannot be asked is left as it is. ``only_launching``: just those (the tick
        calls this for attempts a crash left ``launching``)."""
        self._sync_suites()
        live = self.store.live_attempts()
        if only_launching:
            live = [a for a in live if a.state is AttemptState.LAUNCHING]
        notes: list[str] = []
        found: dict[str, tuple[str, Handle]] = {}
        unreachable: set[str] = set()
        for name in sorted({a.backend for a in live}):
            try:
                for token, handle in self.executors[name].discover().items():
                    found[token] = (name, handle)
            except Exception as e:  # a backend that cannot answer must not stop the others
                unreachable.add(name)
                notes.append(f"{name}: could not list running attempts ({e})")
        for a in live:
            notes.append(self._reconcile_one(a, found, unreachable, now))
        return [n for n in notes if n]

    def _reconcile_one(
        self, a: AttemptRow, found: dict[str, tuple[str, Handle]], unreachable: set[str], now: float
    ) -> str:
        paths = AttemptPaths(a.dir)
        exit_rec = paths.read_exit()
        if exit_rec is not None:
            out = self.reap_attempt(a, exit_rec, now)
            return f"{a.job_id}: ended while the daemon was down ({out.value})"
        ex = self.executors.get(a.backend)
        pane = found[a.token][1] if a.token in found else None
        if pane is not None and not pane.get("dead"):
            return self._adopt(a, pane, now, "re-adopted")
        if a.handle is not None and ex is not None and ex.alive(a.handle):
            return f"{a.job_id}: still running"
        pid = paths.read_pid()
        if pid is not None and ex is not None:
            # a dead pane whose group still runs, or a wrapper we never saw: trust the pid
            # file, whose start time guards against a reused pid
            by_pid = {**(pane or {}), "pid": pid[0], "pid_started_at": pid[1]}
            by_pid.pop("dead", None)
            if ex.alive(by_pid):
                return self._adopt(a, by_pid, now, f"re-adopted by pid {pid[0]}")
        if a.backend in unreachable:
            return f"{a.job_id}: left as it is until {a.backend} answers"
        exit_rec = paths.read_exit()  # it may have ended while we looked
        if exit_rec is None and pid is None and a.state is AttemptState.LAUNCHING:
            if now - a.launched_at < START_GRACE_S and os.path.exists(paths.file(LAUNCH)):
                # Its files were written, so its wrapper may have been started an instant ago,
                # and one caught in its exec shows neither its command line nor its pid file:
                # requeued now, it could run twice. Looked at again at the next tick.
                return ""
            job = self.store.job(a.job_id)
            if job is not None and not job.cancel_requested:
                self._never_started(a, now)
                return f"{a.job_id}: attempt {a.n} never started; requeued at tier {a.tier_name}"
        out = self.reap_attempt(a, exit_rec, now)
        return f"{a.job_id}: vanished with no exit record ({out.value})"

    def _adopt(self, a: AttemptRow, handle: Handle, now: float, note: str) -> str:
        if a.state is AttemptState.LAUNCHING:
            self.store.mark_running(a.id, handle, now=now)
        else:
            self.store.set_handle(a.id, {**(a.handle or {}), **handle})
        return f"{a.job_id}: {note}"

    def _never_started(self, a: AttemptRow, now: float) -> None:
        """The daemon stopped between recording the attempt and starting its wrapper (no
        pid file, no process, no exit record: its command never ran). Requeue the job at
        the same tier without counting a loss, so crashes alone can never fail a job."""
        result = Classification(
            outcome=Outcome.LOST, reason="never started: the daemon stopped before launching it"
        )
        step = Step(
            kind=StepKind.REQUEUE,
            tier=a.tier,
            reason=f"requeued at tier {a.tier_name}: its launch was "
            "interrupted before it started (not counted as lost)",
        )
        self.store.finish_attempt(a.id, exit=None, result=result, step=step, now=now, count_lost=False)
        AttemptPaths(a.dir).drop_pipe()  # (a tmux launch cut short may have made it)
        self.on_event(f"{a.job_id}: attempt {a.n} ({a.tier_name}) never started -> {step.reason}")
