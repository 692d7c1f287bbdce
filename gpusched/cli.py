"""``gpusched`` command line: parse, call the functions that do the work, render.

Every :class:`GpuschedError` becomes one line on stderr and exit code 2 (a traceback only
with ``-v``). Heavy modules (rich, NVML, libtmux) are imported by the commands that need them.
"""

from __future__ import annotations

import argparse
import fnmatch
import functools
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from gpusched import __version__
from gpusched.errors import GpuschedError, UsageError, did_you_mean

if TYPE_CHECKING:  # annotations only: the CLI imports its heavy modules lazily
    from collections.abc import Callable

    from gpusched.attempt import AttemptPaths
    from gpusched.gpus import Probe
    from gpusched.home import Home
    from gpusched.model import GpuPlan, GpuState, Suite
    from gpusched.store import JobRow, Store


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except GpuschedError as e:
        if args.verbose:
            raise
        print(f"gpusched: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `gpusched status | head`
        return 0


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line + exit 2, as for every other bad input
        self.exit(2, f"gpusched: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="gpusched", description="Run a suite of GPU jobs: slots per GPU, OOM-aware requeue, tmux panes."
    )
    p.add_argument("--version", action="version", version=f"gpusched {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(parser_class=_Parser, metavar="COMMAND")

    s = sub.add_parser("submit", help="queue a suite's jobs and start the daemon")
    s.add_argument("--suite", required=True, help="plans/NAME.yaml (by NAME), or a path to a plan file")
    s.add_argument("--gpu-plan", help="max concurrent jobs per GPU, e.g. 2,2,2,2,1,1,1 (default: 1 per GPU)")
    s.add_argument("--gpus", help="GPU indices the plan refers to, e.g. 0,1,2 or 4-6 (default 0..n-1)")
    s.add_argument("--pairs", help='select matrix jobs, e.g. "87:glue-tvt_qnli,88:glue-tvt_sst2"')
    s.add_argument("--only", help="select jobs by name pattern, e.g. '87-*,88-glue-tvt_rte'")
    s.add_argument("--name", help="submit under another suite name")
    s.add_argument("--backend", help="tmux (default when installed), subprocess, or slurm")
    s.add_argument("--fake-gpus", help="pretend GPUs for demos/tests, e.g. 4x24GiB (or GPUSCHED_FAKE_GPUS)")
    s.add_argument("--rerun", action="store_true", help="queue jobs that already finished again")
    s.add_argument("--dry-run", action="store_true", help="validate and show what would be queued")
    s.add_argument("--partition", help="Slurm partition (--backend slurm)")
    s.add_argument("--sbatch-arg", action="append", default=[], help="extra sbatch argument (repeatable)")
    s.add_argument(
        "--max-queued", type=int, help="Slurm: at most this many of the suite's jobs submitted at once"
    )
    s.add_argument("--json", action="store_true", help="print what was queued as JSON")
    s.set_defaults(func=cmd_submit)

    s = sub.add_parser("status", help="GPUs and jobs at a glance")
    s.add_argument("--suite")
    s.add_argument("--json", action="store_true", help="machine-readable, stable keys")
    s.add_argument("--watch", action="store_true", help="live dashboard until Ctrl-C")
    s.add_argument("--interval", type=float, default=1.0, help=argparse.SUPPRESS)
    s.set_defaults(func=cmd_status)

    s = sub.add_parser("attach", help="attach to a job's live tmux pane")
    s.add_argument("job")
    s.set_defaults(func=cmd_attach)

    s = sub.add_parser("logs", help="a job's output")
    s.add_argument("job")
    s.add_argument("-f", "--follow", action="store_true")
    s.add_argument("-n", "--lines", type=int, default=50)
    s.add_argument("--attempt", type=int, help="attempt number (default: the latest)")
    s.set_defaults(func=cmd_logs)

    s = sub.add_parser("cancel", help="cancel jobs (queued ones at once, running ones by SIGTERM)")
    s.add_argument("jobs", nargs="*", help="job ids or patterns, e.g. E1/87-glue-tvt_qnli or 'E1/88-*'")
    s.add_argument("--suite", help="cancel every unfinished job of a suite")
    s.set_defaults(func=cmd_cancel)

    s = sub.add_parser("retry", help="run a finished job again")
    s.add_argument("jobs", nargs="+")
    s.add_argument("--tier", help="tier name or index to start at (default: where it ended)")
    s.set_defaults(func=cmd_retry)

    s = sub.add_parser("wait", help="wait for a suite to finish; exit 0 if all succeeded, 1 otherwise")
    s.add_argument("--suite")
    s.add_argument("--timeout", type=float, help="give up after this many seconds (exit 124)")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=cmd_wait)

    s = sub.add_parser("gpus", help="what the GPU probe sees")
    s.add_argument("--json", action="store_true")
    s.add_argument("--fake-gpus")
    s.set_defaults(func=cmd_gpus)

    s = sub.add_parser("drain", help="stop new launches; running jobs finish (--off resumes)")
    s.add_argument("--off", action="store_true")
    s.set_defaults(func=cmd_drain)

    s = sub.add_parser("daemon", help="start, stop or inspect the scheduler daemon")
    s.add_argument("action", choices=["start", "stop", "status", "run"])
    s.add_argument("--probe", help="nvml, none, or fake:4x24GiB")
    s.add_argument("--fake-gpus", help="same as --probe fake:SPEC")
    s.set_defaults(func=cmd_daemon)

    s = sub.add_parser("simulate", help="replay a suite in the simulator (temporary queue, fake clock, GPUs)")
    s.add_argument("--suite", required=True, help="plans/NAME.yaml (by NAME) or a path: its tiers and jobs")
    s.add_argument("--gpu-plan", required=True, help="max concurrent jobs per GPU, e.g. 2,2,2,2,1,1,1")
    s.add_argument("--gpus", help="GPU indices the plan refers to (default 0..n-1)")
    s.add_argument("--fake-gpus", help="the simulated cards, e.g. 7x24GiB (default: 24 GiB each)")
    s.add_argument(
        "--trace",
        help='JSON/YAML: {"jobs": [{"name", "task", "peak_mib", "duration_s",'
        ' "ramp_s"} or with "tiers": [{"peak_mib", "duration_s", "ramp_s"}, ...]], "outsiders":'
        ' [{"gpu", "mib", "start_s", "end_s"}], "noise": 0.03} (default: a synthetic trace'
        " of the suite jobs)",
    )
    s.add_argument("--policy", default="gpusched", help="gpusched (default), slots, ts, static, or all")
    s.add_argument("--seed", type=int, default=0, help="noise of the runs (and of the synthetic trace)")
    s.add_argument("--json", action="store_true", help="machine-readable results")
    s.add_argument(
        "--plot",
        help="timeline of the (first) policy's simulated night, .png/.svg/.pdf,"
        " as `gpusched report --plot` draws a real one",
    )
    s.set_defaults(func=cmd_simulate)

    s = sub.add_parser("report", help="the morning after: a suite's jobs, GPUs, GPU-hours; CSV/JSON/timeline")
    s.add_argument("--suite", help="suite name (default: the most recently submitted)")
    s.add_argument("--csv", metavar="FILE", help="one row per attempt ('-': stdout)")
    s.add_argument("--json", metavar="FILE", help="one object per attempt, as a list ('-': stdout)")
    s.add_argument("--plot", metavar="FILE", help="timeline .png/.svg/.pdf (pip install 'gpusched[plot]')")
    s.add_argument("--top", type=int, default=5, help="how many of the slowest jobs to list (default 5)")
    s.set_defaults(func=cmd_report)
    return p


# --------------------------------------------------------------------------- helpers


def _home() -> Home:
    from gpusched.home import Home  # a dataclass: not imported for --version or --help

    return Home.from_env().ensure()


def _store(*, readonly: bool = False) -> Store:
    """The state database; ``readonly`` (commands that only look) opens it without taking the
    write lock, so that they never wait behind the daemon's transactions."""
    from gpusched.store import Store

    home = _home()
    if readonly and home.db.exists():
        return Store(home.db, readonly=True)
    return Store(home.db)  # created (or migrated) here


def _probe_spec(fake: str | None) -> str | None:
    fake = fake or os.environ.get("GPUSCHED_FAKE_GPUS")
    return f"fake:{fake}" if fake else None


def resolve_jobs(store: Store, patterns: list[str]) -> list[str]:
    """Job ids for ids, bare names (when unambiguous) or shell patterns; unknown -> UsageError."""
    ids = [r["id"] for r in store.db.execute("SELECT id FROM jobs ORDER BY seq")]
    out: list[str] = []
    for pat in patterns:
        if pat in ids:
            out.append(pat)
            continue
        hits = [i for i in ids if fnmatch.fnmatchcase(i, pat) or fnmatch.fnmatchcase(i.split("/", 1)[1], pat)]
        if not hits:
            raise UsageError(f"no job matches '{pat}'{did_you_mean(pat, ids)}: see `gpusched status`")
        if len(hits) > 1 and not any(ch in pat for ch in "*?["):
            raise UsageError(f"'{pat}' is ambiguous ({', '.join(hits[:3])}...): give the full id SUITE/NAME")
        out.extend(h for h in hits if h not in out)
    return out


# --------------------------------------------------------------------------- submit


def cmd_submit(args: argparse.Namespace) -> int:
    from gpusched import daemon, flags, plan
    from gpusched.attempt import write_env_snapshot
    from gpusched.executors.select import check_backend, default_backend
    from gpusched.gpus.select import make_probe

    cwd = Path.cwd()
    home = _home()
    probe_spec = _probe_spec(args.fake_gpus)
    suite = plan.load_suite(args.suite, cwd=cwd, name=args.name)
    suite = flags.select_jobs(suite, pairs=args.pairs, only=args.only)
    backend = check_backend(args.backend or default_backend())
    detected = None
    if backend != "slurm":
        gpus_seen = make_probe(probe_spec).snapshot()
        detected = len(gpus_seen) if gpus_seen else None
    gpus = flags.parse_gpus(args.gpus, detected=detected)
    if args.gpu_plan is None:
        if backend == "slurm":
            gpu_plan_text, gpus = "1", (0,)  # placeholder: Slurm places jobs
        elif gpus is None and detected is None:
            raise UsageError(
                "no GPU found to plan for: give --gpu-plan (e.g. --gpu-plan 2 runs two jobs at a time), "
                "or --fake-gpus 4x24GiB for a demo"
            )
        else:
            gpu_plan_text = ",".join("1" for _ in (gpus or range(detected or 0)))
    else:
        gpu_plan_text = args.gpu_plan
    gplan = flags.parse_gpu_plan(gpu_plan_text, gpus=gpus, detected=detected)
    options: dict[str, Any] = {}
    if backend == "slurm":
        options = {
            "partition": args.partition,
            "sbatch_args": list(args.sbatch_arg),
            "max_queued": args.max_queued,
        }
        if args.gpu_plan or args.gpus:
            print(
                "gpusched: note: --gpu-plan/--gpus do not apply on Slurm (Slurm places jobs); "
                "--max-queued caps how many are submitted at once",
                file=sys.stderr,
            )
    if args.dry_run:
        return _print_dry_run(suite, gplan, backend, args.json)
    env_path = home.suite_env(suite.name)
    from gpusched.store import Store

    store = Store(home.db)
    write_env_snapshot(env_path, dict(os.environ))
    result = store.submit(
        suite, gplan, backend=backend, cwd=str(cwd), env_path=str(env_path), options=options, rerun=args.rerun
    )
    # a repeated submit also brings back a daemon that died while the suite had work left
    unfinished = any(st in ("queued", "running") for _, st in result.skipped)
    wanted = result.queued or result.requeued or unfinished
    info = daemon.start(home, probe=probe_spec) if wanted else daemon.info(home)
    daemon.wake(home)
    if args.json:
        print(
            json.dumps(
                {
                    "suite": suite.name,
                    "queued": list(result.queued),
                    "requeued": list(result.requeued),
                    "skipped": [list(s) for s in result.skipped],
                    "gpu_plan": gplan.as_text(),
                    "gpus": list(gplan.gpus),
                    "backend": backend,
                }
            )
        )
        return 0
    n = len(result.queued) + len(result.requeued)
    print(
        f"{suite.name}: queued {n} job{'s' * (n != 1)} on GPUs {','.join(map(str, gplan.gpus))} "
        f"with plan {gplan.as_text()} ({gplan.total_slots} slots), backend {backend}"
    )
    if result.skipped:
        states: dict[str, int] = {}
        for _, st in result.skipped:
            states[st] = states.get(st, 0) + 1
        desc = ", ".join(f"{v} {k}" for k, v in states.items())
        print(f"  left as they are: {desc} (use --rerun to queue finished jobs again)")
    if info and info.get("probe_notice"):
        print(f"  {info['probe_notice']}")
    print(f"  logs: {suite.logs_dir}/<job>/<attempt>-<tier>/output.log   watch: gpusched status --watch")
    return 0


def _print_dry_run(suite: Suite, gplan: GpuPlan, backend: str, as_json: bool) -> int:
    names = [j.name for j in suite.jobs]
    if as_json:
        print(
            json.dumps({"suite": suite.name, "jobs": names, "gpu_plan": gplan.as_text(), "backend": backend})
        )
    else:
        print(
            f"{suite.name}: would queue {len(names)} jobs, plan {gplan.as_text()} on GPUs "
            f"{','.join(map(str, gplan.gpus))}, backend {backend}, tiers "
            + " -> ".join(t.name for t in suite.tiers)
        )
        for n in names:
            print(f"  {suite.name}/{n}")
    return 0


# --------------------------------------------------------------------------- status


def _status_sources(args: argparse.Namespace) -> tuple[list[GpuState], dict[str, Any]]:
    """The GPUs to show and the arguments of ``views.status`` that come from outside the
    store: the daemon, the probe's notice, the suite asked for and the Slurm details."""
    from gpusched import daemon
    from gpusched.gpus import published

    home = _home()
    info = daemon.info(home)
    # the GPUs the daemon schedules on, as it last saw them; without a fresh snapshot, a probe of our own
    seen = published.read(home, now=time.time()) if info else None
    if seen is None:
        probe = _probe(_daemon_probe_spec(info))
        seen = probe.snapshot(), probe.notice()
    gpus, notice = seen
    return gpus, {"daemon": info, "suite": args.suite, "notice": notice, "running": _add_slurm_details}


def _status_doc(args: argparse.Namespace, store: Store, table_rows: int | None = None) -> dict[str, Any]:
    from gpusched.views import status

    gpus, kwargs = _status_sources(args)
    return status(store, gpus, table_rows=table_rows, **kwargs).doc()


@functools.cache
def _probe(spec: str | None) -> Probe:
    """One probe per process and spec (``status --watch`` asks every second)."""
    from gpusched.gpus.select import make_probe

    return make_probe(spec)


def _add_slurm_details(running: list[dict[str, Any]]) -> None:
    """The Slurm state, node and reason of running Slurm attempts (one batched query)."""
    jobs = [j for j in running if j["slurm"]]
    if not jobs:
        return
    from gpusched.executors.slurm import SlurmExecutor

    ex = SlurmExecutor(_home())
    ex.refresh([j["backend_handle"] for j in jobs])
    for j in jobs:
        info = ex.info(j["backend_handle"])
        if info is not None:
            j["slurm"].update(state=info.state, node=info.node, reason=info.reason)


def _daemon_probe_spec(info: dict[str, Any] | None) -> str | None:
    """Show the GPUs the daemon schedules on (fake ones included)."""
    if info and info.get("probe_spec"):
        return str(info["probe_spec"])
    return _probe_spec(None)


def cmd_status(args: argparse.Namespace) -> int:
    store = _store(readonly=True)
    if args.json:
        from gpusched.views import status

        gpus, kwargs = _status_sources(args)
        print(status(store, gpus, **kwargs).text())
        return 0
    from gpusched.views import MAX_TABLE_JOBS, format_status

    rows = MAX_TABLE_JOBS  # read only the rows the table shows: a 10k-job store costs what 40 jobs cost
    width, color = _terminal()
    if not args.watch:
        print(format_status(_status_doc(args, store, table_rows=rows), width=width, color=color))
        return 0
    while True:  # a dashboard: the screen redrawn every --interval seconds until Ctrl-C
        text = format_status(_status_doc(args, store, rows), width=width, color=color)
        sys.stdout.write(("\x1b[H\x1b[2J" if sys.stdout.isatty() else "\n") + text + "\n")
        sys.stdout.flush()
        time.sleep(args.interval)
        width, _ = _terminal()


def _terminal() -> tuple[int, bool]:
    """Columns to lay tables out in and whether to colour, as rich decides them: ``COLUMNS``,
    else the terminal's width, else 80; colour on a terminal unless ``NO_COLOR`` or
    ``TERM=dumb``, or always with ``FORCE_COLOR``."""
    tty = sys.stdout.isatty()
    try:
        width = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        try:
            width = os.get_terminal_size(sys.stdout.fileno()).columns if tty else 80
        except (OSError, ValueError):
            width = 80
    env = os.environ
    color = bool(env.get("FORCE_COLOR")) or (tty and not env.get("NO_COLOR") and env.get("TERM") != "dumb")
    return max(width, 20), color


# --------------------------------------------------------------------------- jobs


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
            f"{job.id}'s pane is no longer on gpusched's tmux server (the newest {KEEP_WINDOWS} "
            f"windows of ended jobs are kept): use `gpusched logs {job.id}`"
        )
    argv = tmux.attach_argv(a.handle)
    env = {k: v for k, v in os.environ.items() if k != "TMUX"}
    os.execvpe(argv[0], argv, env)
    return 0  # not reached


def cmd_logs(args: argparse.Namespace) -> int:
    from gpusched.attempt import AttemptPaths

    store = _store()
    job = _one_job(store, args.job)
    attempts = store.attempts(job.id)
    if not attempts:
        raise UsageError(f"{job.id} has not started yet: no log")
    if args.attempt is not None:
        match = [a for a in attempts if a.n == args.attempt]
        if not match:
            raise UsageError(f"{job.id} has attempts 1..{len(attempts)}: no attempt {args.attempt}")
        a = match[0]
    else:
        a = attempts[-1]
    paths = AttemptPaths(Path(a.dir))
    print(
        f"==> {paths.output} (attempt {a.n}, tier {a.tier_name}"
        + (f", {a.outcome}: {a.reason}" if a.outcome else "")
        + ") <==",
        file=sys.stderr,
    )
    if a.line:
        print(f"==> matching line: {a.line}", file=sys.stderr)
    text = paths.log_tail(1 << 20)
    lines = text.splitlines()[-args.lines :] if args.lines > 0 else text.splitlines()
    for line in lines:
        print(line)
    if args.follow:
        return _follow(store, job.id, a.id, paths)
    return 0


def _follow(store: Store, job_id: str, attempt_id: int, paths: AttemptPaths) -> int:
    try:
        f = open(paths.output, "rb")  # noqa: SIM115 (closed by the `with` below)
    except OSError:
        return 0
    with f:
        f.seek(0, os.SEEK_END)
        while True:
            chunk = f.read(65536)
            if chunk:
                sys.stdout.write(chunk.decode("utf-8", "replace"))
                sys.stdout.flush()
                continue
            row = store.attempt(attempt_id)
            if row is not None and row.state.value == "exited":
                rest = f.read()
                sys.stdout.write(rest.decode("utf-8", "replace"))
                return 0
            time.sleep(0.2)


def cmd_cancel(args: argparse.Namespace) -> int:
    from gpusched import daemon

    store = _store()
    if args.suite:
        if store.suite(args.suite) is None:
            names = [s.name for s in store.suites()]
            raise UsageError(f"--suite {args.suite}: no such suite{did_you_mean(args.suite, names)}")
        ids = [j.id for j in store.jobs(suite=args.suite, states=["queued", "running"])]
    elif args.jobs:
        ids = resolve_jobs(store, args.jobs)
    else:
        raise UsageError("cancel what? name jobs (E1/87-glue-tvt_qnli, 'E1/88-*') or --suite NAME")
    result = store.request_cancel(ids)
    daemon.wake(_home())
    counts: dict[str, int] = {}
    for v in result.values():
        counts[v] = counts.get(v, 0) + 1
    print(", ".join(f"{n} {k}" for k, n in counts.items()) or "nothing to cancel")
    return 0


def cmd_retry(args: argparse.Namespace) -> int:
    from gpusched import daemon, tiers

    store = _store()
    home = _home()
    for job_id in resolve_jobs(store, args.jobs):
        tier = None
        if args.tier is not None:
            srow = store.suite(job_id.split("/", 1)[0])
            assert srow is not None
            tier = tiers.tier_index(srow.suite, args.tier)
        job = store.retry(job_id, tier=tier)
        print(f"{job.id}: queued again at tier index {job.tier}")
    daemon.start(home, probe=_probe_spec(None))
    daemon.wake(home)
    return 0


def cmd_wait(args: argparse.Namespace) -> int:
    store = _store()
    if args.suite and store.suite(args.suite) is None:
        names = [s.name for s in store.suites()]
        raise UsageError(f"--suite {args.suite}: no such suite{did_you_mean(args.suite, names)}")
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    checked = [float("-inf")]

    def counts() -> dict[str, int]:
        c = store.counts(suite=args.suite)
        if (c["queued"] or c["running"]) and time.monotonic() - checked[0] >= 5:
            checked[0] = time.monotonic()
            _revive_daemon()  # waiting on a dead daemon would wait forever
        return c

    c = counts()
    total = sum(c.values())
    if args.quiet or not sys.stderr.isatty():
        done = _wait_loop(counts, deadline, lambda c: None)
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

            done = _wait_loop(counts, deadline, show)
    if done is None:
        print("gpusched: wait timed out", file=sys.stderr)
        return 124
    print(f"{done['succeeded']} succeeded, {done['failed']} failed, {done['cancelled']} cancelled")
    return 0 if done["failed"] == 0 and done["cancelled"] == 0 else 1


def _revive_daemon() -> None:
    """Start the daemon if none runs (it died, or the machine rebooted): it re-adopts the
    jobs that still run and reaps those that ended meanwhile."""
    from gpusched import daemon

    home = _home()
    if daemon.info(home) is None:
        daemon.start(home, probe=_probe_spec(None))
        print("gpusched: no daemon was running; started one (it re-adopts running jobs)", file=sys.stderr)


def _wait_loop(
    counts: Callable[[], dict[str, int]], deadline: float | None, show: Callable[[dict[str, int]], None]
) -> dict[str, int] | None:
    while True:
        c = counts()
        show(c)
        if c["queued"] == 0 and c["running"] == 0:
            return c
        if deadline is not None and time.monotonic() > deadline:
            return None
        time.sleep(0.1)


def cmd_gpus(args: argparse.Namespace) -> int:
    from gpusched.gpus.select import make_probe

    probe = make_probe(_probe_spec(args.fake_gpus))
    snap = probe.snapshot()
    if args.json:
        from dataclasses import asdict

        print(json.dumps({"probe": probe.name, "notice": probe.notice(), "gpus": [asdict(g) for g in snap]}))
        return 0
    if probe.notice():
        print(probe.notice())
    for g in snap:
        from gpusched.views import gib

        print(
            f"GPU {g.index}  {g.name or '?'}  {g.uuid or '?'}  "
            f"{gib(g.used_mib)}/{gib(g.total_mib)} GiB used  "
            f"{gib(g.free_mib)} GiB free  util {'?' if g.util_pct is None else g.util_pct}%  "
            f"{len(g.processes)} processes"
        )
    return 0


def cmd_drain(args: argparse.Namespace) -> int:
    from gpusched import daemon

    store = _store()
    store.set_flag("draining", None if args.off else "1")
    daemon.wake(_home())
    print(
        "launches resumed"
        if args.off
        else "draining: running jobs finish, nothing new starts (`gpusched drain --off` resumes)"
    )
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    """Replay ``--suite`` (its tiers, its job names and tasks) through the real scheduler in
    :mod:`gpusched.sim`: a temporary store, never the user's queue."""
    from gpusched import flags, plan, sim
    from gpusched.gpus.fake import parse_fake_spec

    suite = plan.load_suite(args.suite, cwd=Path.cwd())
    entries = len([e for e in args.gpu_plan.split(",") if e.strip()])
    gpus = flags.parse_gpus(args.gpus, detected=None)
    cards = f"{max(gpus or (entries - 1,)) + 1}x24GiB"
    totals = parse_fake_spec(args.fake_gpus or cards, source="--fake-gpus")
    gplan = flags.parse_gpu_plan(args.gpu_plan, gpus=gpus, detected=len(totals))
    names = sim.POLICIES if args.policy == "all" else (args.policy,)
    if any(n not in sim.POLICIES for n in names):
        raise UsageError(f"--policy {args.policy}: use one of {', '.join(sim.POLICIES)}, or all")
    trace = _trace(args, suite, sim)
    if args.plot:
        from gpusched import plot

        plot.require(args.plot)  # before the run: a missing matplotlib is one line, not wasted work
    results = [sim.simulate(trace, gplan, totals, policy=n, suite=suite, seed=args.seed) for n in names]
    if args.plot:
        plot.timeline(results[0].report, args.plot, title=f"{suite.name}, simulated ({results[0].label})")
    if args.json:
        print(json.dumps([r.as_dict() for r in results]))
        return 0
    first = results[0]
    print(
        f"{suite.name}: {first.jobs} jobs on {len(totals)} simulated GPUs, plan {gplan.as_text()}; "
        f"lower bound {first.lower_bound_s / 3600:.2f} h"
    )
    print(sim.format_table(results))
    return 0


def _trace(args: argparse.Namespace, suite: Suite, sim: Any) -> Any:
    if not args.trace:
        jobs = [(j.name, j.task) for j in suite.jobs]
        return sim.synthetic_trace(jobs, seed=args.seed, tiers=len(suite.tiers))
    try:
        trace = sim.load_trace(args.trace)
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
        raise UsageError(f"--trace {args.trace}: not a trace ({e}); see `gpusched simulate --help`") from e
    if not trace.jobs:
        raise UsageError(f"--trace {args.trace}: no jobs; give a list under 'jobs:'")
    return trace


def cmd_daemon(args: argparse.Namespace) -> int:
    from gpusched import daemon

    home = _home()
    probe = args.probe or _probe_spec(args.fake_gpus)
    if args.action == "run":
        return daemon.run(home, probe_spec=probe)
    if args.action == "start":
        info = daemon.start(home, probe=probe)
        print(f"daemon running (pid {info.get('pid')}, probe {info.get('probe')})")
        return 0
    if args.action == "stop":
        print("daemon stopped; jobs keep running" if daemon.stop(home) else "no daemon was running")
        return 0
    current = daemon.info(home)
    if current is None:
        print("no daemon running")
        return 3
    print(json.dumps(current))
    return 0


# --------------------------------------------------------------------------- report


def cmd_report(args: argparse.Namespace) -> int:
    from gpusched import report, report_render

    if args.plot:
        from gpusched import plot

        plot.require(args.plot)  # before any work: a missing extra is one line, exit 2
    store = _store()
    names = [s.name for s in store.suites()]
    if args.suite is None and not names:
        raise UsageError("no suite submitted yet: nothing to report")
    name = args.suite or names[-1]
    if name not in names:
        raise UsageError(f"--suite {name}: no such suite{did_you_mean(name, names)}")
    rep = report.from_store(store, name)
    to_stdout = "-" in (args.csv, args.json)
    if not to_stdout:
        from rich.console import Console

        Console().print(report_render.render_report(rep, top=args.top))
    done = []
    if args.csv:
        done.append(f"{args.csv} ({report_render.write_csv(rep, args.csv)} attempts)")
    if args.json:
        done.append(f"{args.json} ({report_render.write_json(rep, args.json)} attempts)")
    if args.plot:
        done.append(str(plot.timeline(rep, args.plot)))
    done = [d for d in done if not d.startswith("- ")]
    if done:
        print("wrote " + ", ".join(done), file=sys.stderr if to_stdout else sys.stdout)
    return 0
