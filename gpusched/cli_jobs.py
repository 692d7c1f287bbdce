"""``gpusched`` commands on jobs: attach, logs (and ``-f``), cancel, retry, wait.

Heavy modules (rich, libtmux) are imported by the commands that need them.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from gpusched.cli_common import _home, _probe_spec, _store, known_suite, resolve_jobs
from gpusched.errors import UsageError

if TYPE_CHECKING:  # annotations only: the CLI imports its heavy modules lazily
    from collections.abc import Callable

    from gpusched.attempt import AttemptPaths
    from gpusched.store import AttemptRow, JobRow, Store


def _one_job(store: Store, ref: str) -> JobRow:
    ids = resolve_jobs(store, [ref])
    if len(ids) != 1:
        raise UsageError(f"'{ref}' matches {len(ids)} jobs: name one job")
    job = store.job(ids[0])
    assert job is not None
    return job


def cmd_attach(args: argparse.Namespace) -> int:
    store = _store()
    job = _one_job(store, args.job)
    attempts = store.attempts(job.id)
    if not attempts:
        raise UsageError(f"{job.id} is {job.state.value} and has not started yet: nothing to attach to")
    a = attempts[-1]
    if a.backend != "tmux" or not a.handle:
        hint = ""
        if a.backend == "slurm" and a.handle:
            from gpusched.attempt import AttemptPaths
            from gpusched.executors.slurm import SlurmExecutor

            ex = SlurmExecutor(_home())
            ex.refresh([a.handle])
            hint = f"; or: {ex.attach_hint(a.handle, log_path=AttemptPaths(Path(a.dir)).output)}"
        raise UsageError(
            f"{job.id} runs with the {a.backend} backend and has no pane: "
            f"use `gpusched logs -f {job.id}`{hint}"
        )
    from gpusched.executors.tmux import KEEP_WINDOWS, TmuxExecutor

    tmux = TmuxExecutor(_home())
    if not tmux.shows(a.handle):
        raise UsageError(
            f"{job.id}'s pane is no longer on gpusched's tmux server, or runs a later job now (the "
            f"newest {KEEP_WINDOWS} windows of ended jobs are kept): use `gpusched logs {job.id}`"
        )
    if not sys.stdin.isatty():  # tmux would say only "open terminal failed: not a terminal"
        raise UsageError(
            f"attach needs a terminal, and this command's input is not one: run it in a terminal, "
            f"or see the output with `gpusched logs -f {job.id}`"
        )
    argv = tmux.attach_argv(a.handle)
    env = {k: v for k, v in os.environ.items() if k != "TMUX"}
    os.execvpe(argv[0], argv, env)
    return 0  # not reached


def cmd_logs(args: argparse.Namespace) -> int:
    """A job's output: the last lines of its newest attempt (or ``--attempt N``). With
    ``--follow``, what it writes as it writes it, across its attempts: a queued job is waited
    for, and an attempt requeued after an OOM is followed by the next one, until the job
    succeeds, fails or is cancelled (with ``--attempt N``: until that attempt ends)."""
    from gpusched.attempt import AttemptPaths

    store = _store()
    job = _one_job(store, args.job)
    attempts = store.attempts(job.id)
    if args.attempt is not None:
        match = [a for a in attempts if a.n == args.attempt]
        if not match:
            raise UsageError(f"{job.id} has attempts 1..{len(attempts)}: no attempt {args.attempt}")
        a: AttemptRow | None = match[0]
    elif attempts:
        a = attempts[-1]
    elif args.follow:
        print(f"==> {job.id} is {job.state.value}: waiting for its first attempt <==", file=sys.stderr)
        a = _next_attempt(store, job.id, after=0)
    else:
        raise UsageError(f"{job.id} has not started yet: no log (`gpusched logs -f {job.id}` waits for it)")
    lines = args.lines
    while a is not None:
        paths = AttemptPaths(Path(a.dir))
        print(f"==> {paths.output} ({_attempt_said(a)}) <==", file=sys.stderr)
        if a.line:
            print(f"==> matching line: {a.line}", file=sys.stderr)
        if not args.follow:
            text = _last_lines(paths.log_tail(1 << 20).encode(), lines)
            _write(text if text.endswith(b"\n") or not text else text + b"\n")
            return 0
        ended = _follow(store, a.id, paths, lines)
        if ended is not None and ended.outcome and not a.outcome:  # it ended while followed
            print(f"==> attempt {ended.n} ended: {ended.outcome}: {ended.reason} <==", file=sys.stderr)
        if args.attempt is not None:
            return 0
        a = _next_attempt(store, job.id, after=a.n)
        lines = 0  # a later attempt is shown from its start
    if args.follow and (end := store.job(job.id)) is not None:  # followed to its end: say which
        why = f": {end.reason}" if end.reason else ""
        print(f"==> {end.id} {end.state.value}{why} <==", file=sys.stderr)
    return 0


def _attempt_said(a: AttemptRow) -> str:
    return f"attempt {a.n}, tier {a.tier_name}" + (f", {a.outcome}: {a.reason}" if a.outcome else "")


def _last_lines(data: bytes, n: int) -> bytes:
    """The last ``n`` lines of ``data`` (0: all of it), counted as ``tail`` counts them: by
    newlines, so a progress bar's carriage returns keep to their line."""
    cut = len(data) - 1 if data.endswith(b"\n") else len(data)
    for _ in range(n):
        cut = data.rfind(b"\n", 0, cut)
        if cut < 0:
            return data
    return data[cut + 1 :] if n > 0 else data


def _write(data: bytes) -> None:
    if data:
        sys.stdout.write(data.decode("utf-8", "replace"))
        sys.stdout.flush()


def _next_attempt(store: Store, job_id: str, *, after: int) -> AttemptRow | None:
    """The job's first attempt numbered above ``after``, once it exists; None once the job
    has ended without one (it succeeded, failed or was cancelled)."""
    while True:
        newer = [a for a in store.attempts(job_id) if a.n > after]
        if newer:
            return newer[0]
        job = store.job(job_id)
        if job is None or job.state.value in ("succeeded", "failed", "cancelled"):
            return None
        time.sleep(0.2)


def _follow(store: Store, attempt_id: int, paths: AttemptPaths, last: int) -> AttemptRow | None:
    """Print the last ``last`` lines of the attempt's log (0: the last MiB), then what it
    writes, until the attempt has ended; return its row then. A log not there yet (the
    attempt is launching) is waited for."""
    f = None
    while f is None:
        try:
            f = open(paths.output, "rb")  # noqa: SIM115 (closed by the `with` below)
        except FileNotFoundError:
            row = store.attempt(attempt_id)
            if row is None or row.state.value == "exited":
                return row
            time.sleep(0.2)
    with f:
        size = os.fstat(f.fileno()).st_size
        f.seek(max(0, size - (1 << 20)))
        _write(_last_lines(f.read(), last))
        while True:
            chunk = f.read(65536)
            if chunk:
                _write(chunk)
                continue
            row = store.attempt(attempt_id)
            if row is None or row.state.value == "exited":
                _write(f.read())
                return row
            time.sleep(0.2)


def cmd_cancel(args: argparse.Namespace) -> int:
    from gpusched import daemon

    store = _store()
    wanted = ["queued"] if args.queued else ["queued", "running"]
    if not args.suite and not args.jobs:
        raise UsageError("cancel what? name jobs (E1/87-glue-tvt_qnli, 'E1/88-*') or --suite NAME")
    if args.jobs:
        patterns = args.jobs
        if args.suite:  # `cancel --suite E1 '*-qnli'`: E1's qnli jobs (it cancelled all of E1)
            name = known_suite(store, args.suite)
            patterns = [p if "/" in p else f"{name}/{p}" for p in patterns]
        ids = resolve_jobs(store, patterns)
        if args.suite:
            ids = [i for i in ids if i.split("/", 1)[0] == name]
        if args.queued:  # (one query: a pattern may name thousands)
            queued = {j.id for j in store.jobs(states=wanted)}
            ids = [i for i in ids if i in queued]
    else:
        ids = [j.id for j in store.jobs(suite=known_suite(store, args.suite), states=wanted)]
    result = store.request_cancel(ids, queued_only=args.queued)
    daemon.wake(_home())
    counts: dict[str, int] = {}
    for v in result.values():
        counts[v] = counts.get(v, 0) + 1
    print(", ".join(f"{n} {k}" for k, n in counts.items()) or "nothing to cancel")
    return 0


def cmd_retry(args: argparse.Namespace) -> int:
    from gpusched import daemon, tiers
    from gpusched.model import JobState
    from gpusched.store import waiting_out

    store = _store()
    home = _home()
    daemon.check_env()  # before anything is queued again: the daemon this may start reads these
    daemon.check_jobs_elsewhere(home, store)  # ... and would refuse to start
    daemon.say_settings_not_taken(daemon.info(home))
    chosen: dict[str, int | None] = {}
    for job_id in _retryable(store, args.jobs):
        tier = None
        if args.tier is not None:
            srow = store.suite(job_id.split("/", 1)[0])
            assert srow is not None
            tier = tiers.tier_index(srow.suite, args.tier)
        chosen[job_id] = tier
    now = time.time()
    rows = [j for j in map(store.job, chosen) if j is not None]
    succeeded = {j.id for j in rows if j.state is JobState.SUCCEEDED}
    waiting = {j.id for j in rows if waiting_out(j.state.value, j.not_before, now)}
    for job in store.retry_many(chosen, now=now):  # all or none
        srow = store.suite(job.suite)
        name = srow.suite.tiers[job.tier].name if srow and job.tier < len(srow.suite.tiers) else job.tier
        if job.id in waiting:
            print(f"{job.id}: runs at tier {name} without waiting out its backoff")
            continue
        # a success starts over; a failure or a cancel resumes from its checkpoint (Store.run_since)
        again = job.id in succeeded and srow is not None and srow.suite.resume is not None
        print(
            f"{job.id}: queued again at tier {name}"
            + (", from the start (it had succeeded)" if again else "")
        )
    daemon.start(home, probe=_probe_spec(None))
    daemon.wake(home)
    return 0


def _retryable(store: Store, patterns: list[str]) -> list[str]:
    """The jobs ``retry`` queues again: each one named by its id (or unambiguous name), which
    must have finished or be waiting out a backoff; and, for a shell pattern (``'E1/*'``, the
    morning after a night that went wrong), the jobs it matches that failed, were cancelled
    or wait out a backoff (a full disk freed, the hub back): the ones that succeeded, are
    queued for their turn or run are left alone. A pattern that matches none is an error."""
    from gpusched.store import waiting_out

    out: list[str] = []
    for pat in patterns:
        ids = resolve_jobs(store, [pat])
        if any(ch in pat for ch in "*?["):
            now = time.time()
            rows = [j for j in map(store.job, ids) if j is not None]
            ids = [
                j.id
                for j in rows
                if j.state.value in ("failed", "cancelled") or waiting_out(j.state.value, j.not_before, now)
            ]
            if not ids:
                raise UsageError(
                    f"no failed or cancelled job, nor one waiting out a backoff, matches '{pat}':"
                    " see `gpusched status`"
                )
        out.extend(i for i in ids if i not in out)
    return out


def cmd_wait(args: argparse.Namespace) -> int:
    from gpusched.store import draining

    store = _store()
    if args.suite:
        known_suite(store, args.suite)
    elif not store.suite_names():  # (`submit ...; wait && echo ok` after a refused submit: not "ok")
        raise UsageError("no suite submitted yet: nothing to wait for (`gpusched submit --suite NAME` first)")
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    checked = [float("-inf")]

    from gpusched.views import recent_suites

    # without --suite: the suites that run while it waits (a suite submitted meanwhile joins),
    # else those `status` shows; a failure of last week's suite is not tonight's
    scope = {args.suite} if args.suite else store.active_suites() or set(recent_suites(store)[0])

    def counts() -> dict[str, int]:
        if not args.suite:
            scope.update(store.active_suites())
        c = store.counts(suites=scope)
        if (c["queued"] or c["running"]) and time.monotonic() - checked[0] >= 5:
            checked[0] = time.monotonic()
            _revive_daemon()  # waiting on a dead daemon would wait forever
        return c

    def drained(c: dict[str, int]) -> bool:
        """Nothing will run any more: jobs are left queued, none runs, and a drain holds them."""
        if c["running"] or not c["queued"]:
            return False
        return draining(store.drains_at(), time.time())

    c = counts()
    total = sum(c.values())
    if args.quiet or not sys.stderr.isatty():
        done = _wait_loop(counts, deadline, lambda c: None, drained)
    else:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            transient=False,
        ) as bar:
            task = bar.add_task(args.suite or "all jobs", total=total)

            def show(c: dict[str, int]) -> None:
                fin = c["succeeded"] + c["failed"] + c["cancelled"]
                bar.update(
                    task,
                    completed=fin,
                    total=sum(c.values()),
                    description=f"{args.suite or 'all'}: {c['running']} running, {c['queued']} queued, "
                    f"{c['failed']} failed",
                )

            done = _wait_loop(counts, deadline, show, drained)
    if done is None:
        print("gpusched: wait timed out", file=sys.stderr)
        return 124
    left = f", {done['queued']} left queued by the drain (`gpusched drain --off` runs them)"
    print(
        f"{done['succeeded']} succeeded, {done['failed']} failed, {done['cancelled']} cancelled"
        + (left if done["queued"] else "")
    )
    return 0 if done["failed"] == 0 and done["cancelled"] == 0 and done["queued"] == 0 else 1


def _revive_daemon() -> None:
    """Start the daemon if none runs (it died, or the machine rebooted): it re-adopts the
    jobs that still run and reaps those that ended meanwhile."""
    from gpusched import daemon

    home = _home()
    if daemon.info(home) is None:
        daemon.start(home, probe=_probe_spec(None))
        print("gpusched: no daemon was running; started one (it re-adopts running jobs)", file=sys.stderr)


def _wait_loop(
    counts: Callable[[], dict[str, int]],
    deadline: float | None,
    show: Callable[[dict[str, int]], None],
    drained: Callable[[dict[str, int]], bool],
) -> dict[str, int] | None:
    """The counts once every job ended, or once ``drained`` says the ones left never will
    start; None past ``deadline``."""
    while True:
        c = counts()
        show(c)
        if (c["queued"] == 0 and c["running"] == 0) or drained(c):
            return c
        if deadline is not None and time.monotonic() > deadline:
            return None
        time.sleep(0.1)
