"""``gpusched`` command line: parse, call the functions that do the work, render.

Every :class:`GpuschedError` becomes one line on stderr and exit code 2 (a traceback only
with ``-v``). Heavy modules (rich, NVML, libtmux) are imported by the commands that need them.
Here: ``main``, the parser, submit and status; the commands on jobs are in :mod:`gpusched.cli_jobs`,
gpus/drain/daemon/simulate/report in :mod:`gpusched.cli_tools`, what they share in
:mod:`gpusched.cli_common`.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import functools
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from gpusched import __version__
from gpusched.cli_common import (
    _home,
    _probe_spec,
    _store,
    daemon_probe_spec,
    known_suite,
    probe_source,
    refuse_another_probe,
    submitted_suite,
    terminal,
)
from gpusched.cli_jobs import cmd_attach, cmd_cancel, cmd_logs, cmd_retry, cmd_wait
from gpusched.cli_tools import cmd_daemon, cmd_drain, cmd_gpus, cmd_report, cmd_simulate
from gpusched.errors import GpuschedError, UsageError

if TYPE_CHECKING:  # annotations only: the CLI imports its heavy modules lazily
    from gpusched.daemon import Starting
    from gpusched.gpus import Probe
    from gpusched.home import Home
    from gpusched.model import GpuPlan, GpuState, Suite
    from gpusched.records import SubmitResult
    from gpusched.store import Store


def main(argv: list[str] | None = None, *, early: Starting | None = None) -> int:
    """The CLI. ``early``: the daemon :mod:`gpusched.entry` started on standby for a ``submit``."""
    argv = sys.argv[1:] if argv is None else argv
    named = next((a for a in argv if not a.startswith("-")), None)  # the global options take no value
    parser = build_parser(named if named in COMMANDS else None)
    args = parser.parse_args(argv)
    args.early_daemon = early
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    _import_msgspec_alone()  # (after the parse: --version and --help need none of it)
    _stdout_for(args)
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


def _stdout_for(args: argparse.Namespace) -> None:
    """stdout where its encoding cannot write every character (a Latin-1 or ASCII locale,
    ``PYTHONIOENCODING=ascii``) while a job's line or log holds one (a progress bar's ``█``):
    JSON and CSV go out as UTF-8 all the same, as JSON is exchanged (RFC 8259); text shows
    such a character as ``?``. Either way, no traceback."""
    out = sys.stdout
    try:
        if codecs.lookup(out.encoding).name == "utf-8":
            return
        json_, csv = getattr(args, "json", None), getattr(args, "csv", None)
        machine = json_ is True or "-" in (json_, csv) or getattr(args, "fields", None) is not None
        out.reconfigure(**({"encoding": "utf-8"} if machine else {"errors": "replace"}))  # type: ignore[union-attr]
    except (AttributeError, LookupError, TypeError, ValueError):
        pass  # not a stream of the interpreter's own (a test's capture): left as it is


def _writes(text: str) -> bool:
    """Whether stdout's encoding can write ``text``."""
    try:
        text.encode(sys.stdout.encoding or "utf-8")
    except (LookupError, UnicodeEncodeError):
        return False
    return True


def _at_least(low: float, kind: type[int] | type[float]) -> Callable[[str], Any]:
    """An argparse type: a number (whole for ``int``) of at least ``low``; argparse words a
    refusal "argument --top: '-2' is not a whole number >= 0"."""
    what = f"{'a whole number' if kind is int else 'a number'} >= {low:g}"

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not value >= low:  # (nan is not)
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
        return value

    return parse


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line + exit 2, as for every other bad input
        self.exit(2, f"gpusched: {message} (see `{self.prog} --help`)\n")


#: The commands, in the order ``--help`` lists them.
COMMANDS = (
    "submit",
    "status",
    "attach",
    "logs",
    "cancel",
    "retry",
    "wait",
    "gpus",
    "drain",
    "daemon",
    "simulate",
    "report",
)


def _import_msgspec_alone() -> None:
    """Import msgspec (every command's records) without typing_extensions, which msgspec takes
    when installed (torch installs it) and which imports ``inspect``: ~7 ms of every command,
    `status` and the daemon's start included. Without it msgspec uses ``typing``'s own
    ``get_type_hints``, ``Required`` and ``NotRequired``, which on Python 3.11+ are the same;
    gpusched's records use ``typing`` only. The block lasts for msgspec's import alone, and only
    in gpusched's own processes (never in a job's, which may import gpusched.runtime)."""
    if "msgspec" in sys.modules or "typing_extensions" in sys.modules:
        return
    sys.modules["typing_extensions"] = None  # type: ignore[assignment]  # (an import of it fails)
    try:
        import msgspec  # noqa: F401
    finally:
        del sys.modules["typing_extensions"]


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The CLI's parser; with ``command``, only that command's subparser (what :func:`main`
    builds when the arguments name one: all twelve cost ~8 ms, a sixth of a `status`)."""

    def want(name: str) -> bool:
        return command is None or name == command

    p = _Parser(
        prog="gpusched", description="Run a suite of GPU jobs: slots per GPU, OOM-aware requeue, tmux panes."
    )
    p.add_argument("--version", action="version", version=f"gpusched {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(parser_class=_Parser, metavar="COMMAND")

    if want("submit"):
        s = sub.add_parser("submit", help="queue a suite's jobs and start the daemon")
        s.add_argument("--suite", required=True, help="plans/NAME.yaml (by NAME), or a path to a plan file")
        s.add_argument(
            "--gpu-plan", help="max concurrent jobs per GPU, e.g. 2,2,2,2,1,1,1 (default: 1 per GPU)"
        )
        s.add_argument("--gpus", help="GPU indices the plan refers to, e.g. 0,1,2 or 4-6 (default 0..n-1)")
        s.add_argument("--pairs", help='select matrix jobs, e.g. "87:glue-tvt_qnli,88:glue-tvt_sst2"')
        s.add_argument("--only", help="select jobs by name pattern, e.g. '87-*,88-glue-tvt_rte'")
        s.add_argument("--name", help="submit under another suite name")
        s.add_argument("--backend", help="tmux (default when installed), subprocess, or slurm")
        s.add_argument(
            "--fake-gpus", help="pretend GPUs for demos/tests, e.g. 4x24GiB (or GPUSCHED_FAKE_GPUS)"
        )
        s.add_argument("--rerun", action="store_true", help="queue jobs that already finished again")
        s.add_argument("--dry-run", action="store_true", help="validate and show what would be queued")
        s.add_argument("--partition", help="Slurm partition (--backend slurm)")
        s.add_argument("--sbatch-arg", action="append", default=[], help="extra sbatch argument (repeatable)")
        s.add_argument(
            "--max-queued",
            type=_at_least(1, int),
            help="Slurm: at most this many of the suite's jobs submitted at once",
        )
        s.add_argument("--json", action="store_true", help="print what was queued as JSON")
        s.set_defaults(func=cmd_submit)

    if want("status"):
        s = sub.add_parser("status", help="GPUs and jobs at a glance")
        s.add_argument("--suite", help="only this suite's jobs, however long ago it ran")
        s.add_argument("--json", action="store_true", help="machine-readable, stable keys")
        s.add_argument(
            "--fields",
            metavar="KEY,...",
            help="JSON with only these keys in each job entry (implies --json), e.g. id,state,peak_mib",
        )
        s.add_argument(
            "--state",
            metavar="STATE,...",
            help="only jobs in these states, e.g. failed or queued,running",
        )
        s.add_argument(
            "--all",
            action="store_true",
            help="every job of every suite in the table (else 40, running and failed first, of the suites"
            " active or ended in the last day of work)",
        )
        s.add_argument(
            "--watch",
            action="store_true",
            help="live dashboard until Ctrl-C; with --json or --fields, a document a line every second",
        )
        s.add_argument("--interval", type=_at_least(0.1, float), default=1.0, help=argparse.SUPPRESS)
        s.set_defaults(func=cmd_status)

    if want("attach"):
        s = sub.add_parser("attach", help="attach to a job's live tmux pane")
        s.add_argument("job")
        s.set_defaults(func=cmd_attach)

    if want("logs"):
        s = sub.add_parser("logs", help="a job's output")
        s.add_argument("job")
        s.add_argument("-f", "--follow", action="store_true")
        s.add_argument("-n", "--lines", type=_at_least(0, int), default=50, help="the last N lines (0: all)")
        s.add_argument("--attempt", type=int, help="attempt number (default: the latest)")
        s.set_defaults(func=cmd_logs)

    if want("cancel"):
        s = sub.add_parser("cancel", help="cancel jobs (queued ones at once, running ones by SIGTERM)")
        s.add_argument("jobs", nargs="*", help="job ids or patterns, e.g. E1/87-glue-tvt_qnli or 'E1/88-*'")
        s.add_argument("--suite", help="every unfinished job of a suite (with jobs named: those of it)")
        s.add_argument(
            "--queued", action="store_true", help="only those not started yet: the running ones finish"
        )
        s.set_defaults(func=cmd_cancel)

    if want("retry"):
        s = sub.add_parser("retry", help="run finished jobs again ('E1/*': the failed and cancelled ones)")
        s.add_argument(
            "jobs",
            nargs="+",
            help="job ids or names; a pattern ('E1/*') takes the matching jobs that failed or were cancelled",
        )
        s.add_argument("--tier", help="tier name or index to start at (default: where it ended)")
        s.set_defaults(func=cmd_retry)

    if want("wait"):
        s = sub.add_parser("wait", help="wait for a suite to finish; exit 0 if all succeeded, 1 otherwise")
        s.add_argument("--suite", help="the suite to wait for (default: the suites that run meanwhile)")
        s.add_argument(
            "--timeout", type=_at_least(0, float), help="give up after this many seconds (exit 124)"
        )
        s.add_argument("--quiet", action="store_true", help="no progress bar")
        s.set_defaults(func=cmd_wait)

    if want("gpus"):
        s = sub.add_parser(
            "gpus", help="what the GPU probe sees (the running daemon's), and which GPUs are out of service"
        )
        s.add_argument("--json", action="store_true")
        s.add_argument("--fake-gpus", help="pretend GPUs, e.g. 4x24GiB (default: the daemon's probe)")
        s.add_argument(
            "--enable",
            metavar="GPUS",
            help="put GPUs taken out of service after repeated faults back in service: 3, 1,3 or all",
        )
        s.set_defaults(func=cmd_gpus)

    if want("drain"):
        s = sub.add_parser("drain", help="stop new launches; running jobs finish (--off resumes)")
        when = s.add_mutually_exclusive_group()
        when.add_argument("--off", action="store_true", help="launch again (or cancel a drain --at)")
        when.add_argument("--at", metavar="HH:MM", help="from the next time the clock reads this, e.g. 07:30")
        s.set_defaults(func=cmd_drain)

    if want("daemon"):
        s = sub.add_parser("daemon", help="start, stop or inspect the scheduler daemon")
        s.add_argument("action", choices=["start", "stop", "status", "run"])
        s.add_argument("--probe", help="nvml, none, or fake:4x24GiB")
        s.add_argument("--fake-gpus", help="same as --probe fake:SPEC")
        s.add_argument("--standby", action="store_true", help=argparse.SUPPRESS)  # see daemon.Starting
        s.add_argument(
            "--forget-host",
            metavar="HOST",
            help="with start: take the jobs recorded running on HOST, a machine or container that no"
            " longer exists, as this machine's (those not running here are counted lost and run again)",
        )
        s.set_defaults(func=cmd_daemon)

    if want("simulate"):
        s = sub.add_parser(
            "simulate", help="replay a suite in the simulator (temporary queue, fake clock, GPUs)"
        )
        s.add_argument(
            "--suite", required=True, help="plans/NAME.yaml (by NAME) or a path: its tiers and jobs"
        )
        s.add_argument(
            "--gpu-plan",
            help="max concurrent jobs per GPU, e.g. 2,2,2,2,1,1,1 (default: the suite's last plan here)",
        )
        s.add_argument("--gpus", help="GPU indices the plan refers to (default 0..n-1)")
        s.add_argument(
            "--fake-gpus",
            help="the simulated cards, e.g. 7x24GiB (default: the cards the probe sees, else 24 GiB each)",
        )
        s.add_argument(
            "--trace",
            help='JSON/YAML: {"jobs": [{"name", "task", "peak_mib", "duration_s",'
            ' "ramp_s", "util"} or with "tiers": [{"peak_mib", "duration_s", "ramp_s", "util"}, ...]],'
            ' "outsiders": [{"gpu", "mib", "start_s", "end_s"}], "noise": 0.03} ("util": the share of'
            " its card a run keeps busy alone, 0-1; default: each task's peaks, run times and util as"
            " this queue measured them, made up for tasks with no finished run)",
        )
        s.add_argument(
            "--made-up",
            action="store_true",
            help="made-up figures for every task, even measured ones (and no history: see --cold)",
        )
        s.add_argument(
            "--cold",
            action="store_true",
            help="start the scheduler knowing nothing, as on a first night (default: knowing the runs"
            " this queue measured of the suite's tasks, as it would tonight)",
        )
        s.add_argument(
            "--trace-out", help="also write the trace replayed (JSON: edit it, give it to --trace)"
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

    if want("report"):
        s = sub.add_parser(
            "report", help="the morning after: a suite's jobs, GPUs, GPU-hours; CSV/JSON/timeline"
        )
        s.add_argument("--suite", help="suite name (default: the most recently submitted)")
        s.add_argument("--csv", metavar="FILE", help="one row per attempt ('-': stdout)")
        s.add_argument("--json", metavar="FILE", help="one object per attempt, as a list ('-': stdout)")
        s.add_argument(
            "--plot", metavar="FILE", help="timeline .png/.svg/.pdf (pip install 'gpusched[plot]')"
        )
        s.add_argument(
            "--top",
            type=_at_least(0, int),
            default=5,
            help="how many of the slowest jobs to list (default 5)",
        )
        s.set_defaults(func=cmd_report)
    return p


# --------------------------------------------------------------------------- submit


def cmd_submit(args: argparse.Namespace) -> int:
    from gpusched import daemon
    from gpusched.home import Home

    cwd = Path.cwd()
    home = Home.from_env()  # (made only once the suite is queued: a refused submit leaves no trace)
    daemon.check_machine(home)
    daemon.check_env()  # before anything is queued: the daemon this may start reads these
    probe_spec = _probe_spec(args.fake_gpus)
    running = daemon.info(home)
    refuse_another_probe(running, probe_spec, probe_source(args.fake_gpus))
    daemon.say_settings_not_taken(running)
    # the GPUs the jobs will be placed on: --fake-gpus, else those of the running daemon's probe
    placed_by = probe_spec or daemon_probe_spec(running)
    starting = _standby(args, home, probe_spec, running)
    try:
        return _submit(args, cwd, home, probe_spec, placed_by, starting)
    finally:
        if starting is not None:
            starting.cancel()


def _standby(
    args: argparse.Namespace, home: Home, probe_spec: str | None, running: dict[str, Any] | None
) -> Starting | None:
    """The daemon on standby for this submit, when no daemon runs: its start overlaps reading
    and queueing the suite, and it exits unseen should the submit be refused or queue nothing.
    The one :mod:`gpusched.entry` started before the CLI was imported, unless it guessed the
    GPUs wrong (argparse read ``--fake-gpus`` otherwise) or a daemon started meanwhile; else
    one started now. None for a dry run."""
    from gpusched import daemon

    early = args.early_daemon
    if early is not None and (args.dry_run or running is not None or early.probe != probe_spec):
        early.cancel()
        early = None
    if args.dry_run:
        return None
    return early or daemon.prestart(home, probe=probe_spec)


def _submit(
    args: argparse.Namespace,
    cwd: Path,
    home: Home,
    probe_spec: str | None,
    placed_by: str | None,
    starting: Starting | None,
) -> int:
    from gpusched import daemon, flags, plan
    from gpusched.attempt import write_env_snapshot
    from gpusched.cli_common import check_backend, default_backend
    from gpusched.gpus.select import make_probe

    whole = plan.load_suite(args.suite, cwd=cwd, name=args.name)
    _refuse_missing_program(whole, cwd)
    suite = flags.select_jobs(whole, pairs=args.pairs, only=args.only)
    before = submitted_suite(suite.name, only_active=True)  # what a flag left out stays as it was
    backend = check_backend(args.backend or (before.backend if before else None) or default_backend())
    given = {"--partition": args.partition, "--sbatch-arg": args.sbatch_arg, "--max-queued": args.max_queued}
    slurm_only = [option for option, value in given.items() if value]
    if slurm_only and backend != "slurm":  # (meant for a cluster: the night would run here instead)
        raise UsageError(
            f"{', '.join(slurm_only)}: for Slurm only, and this submit runs on {backend}: "
            "add --backend slurm, or leave " + ("them" if len(slurm_only) > 1 else "it") + " out"
        )
    detected = None
    if backend != "slurm":
        gpus_seen = make_probe(placed_by).snapshot()
        detected = len(gpus_seen) if gpus_seen else None
    gpus = flags.parse_gpus(args.gpus, detected=detected)
    if args.gpu_plan is None:
        if backend == "slurm":
            gpu_plan_text, gpus = "1", (0,)  # placeholder: Slurm places jobs
        elif before is not None and gpus is None and before.backend != "slurm":
            gpu_plan_text, gpus = before.gpu_plan.as_text(), before.gpu_plan.gpus
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
        kept = before.options if before is not None and before.backend == "slurm" else {}
        options = {  # each one not given again stays as the night has it
            "partition": args.partition or kept.get("partition"),
            "sbatch_args": list(args.sbatch_arg) or list(kept.get("sbatch_args") or ()),
            "max_queued": args.max_queued or kept.get("max_queued"),
        }
        if args.gpu_plan or args.gpus:
            print(
                "gpusched: note: --gpu-plan/--gpus do not apply on Slurm (Slurm places jobs); "
                "--max-queued caps how many are submitted at once",
                file=sys.stderr,
            )
    plan_kept = before is not None and args.gpu_plan is None and args.gpus is None and backend != "slurm"
    if args.dry_run:
        return _print_dry_run(args, home, cwd, whole, suite, gplan, backend, options, kept=plan_kept)
    env_path = home.suite_env(suite.name)
    from gpusched.store import Store

    store = Store(home.ensure().db)
    daemon.check_jobs_elsewhere(home, store)  # the daemon would refuse to start: queue nothing
    _refuse_shared_output_dirs(store, suite)
    write_env_snapshot(env_path, dict(os.environ))
    earlier = _log_folders(suite)  # before anything is queued: a daemon may launch at the commit
    result = store.submit(
        suite, gplan, backend=backend, cwd=str(cwd), env_path=str(env_path), options=options, rerun=args.rerun
    )
    dropped = _not_in_plan(store, whole)
    # a repeated submit also brings back a daemon that died while the suite had work left
    unfinished = any(st in ("queued", "running") for _, st in result.skipped)
    wanted = result.queued or result.requeued or unfinished
    if not wanted:
        info = daemon.info(home)
    elif starting is not None:
        info = starting.go()
    else:
        info = daemon.start(home, probe=probe_spec)
    daemon.wake(home)
    if args.json:
        print(json.dumps(_submit_doc(suite, gplan, backend, result, dropped)))
        return 0
    n = len(result.queued) + len(result.requeued)
    slots = gplan.total_slots
    print(
        f"{suite.name}: queued {n} job{'s' * (n != 1)} on GPUs {','.join(map(str, gplan.gpus))} "
        f"with plan {gplan.as_text()} ({slots} slot{'s' * (slots != 1)}), backend {backend}"
    )
    _print_changes(result, dropped, dry=False, kept=plan_kept)
    _print_earlier_logs(suite, result.queued, earlier)
    if info and info.get("probe_notice"):
        print(f"  {info['probe_notice']}")
    print(f"  logs: {suite.logs_dir}/<job>/<attempt>-<tier>/output.log   watch: gpusched status --watch")
    return 0


def _refuse_missing_program(suite: Suite, cwd: Path) -> None:
    """UsageError when the program the suite's command starts would not run for its jobs:
    ``torchrun`` from a shell whose environment is not activated, a typo (``pyhton``), a
    ``./run.sh`` not executable. Every job would fail at once with ``not found``. The jobs get
    this shell's environment, so its PATH is theirs (unless the plan sets PATH itself)."""
    from gpusched.command import missing_program
    from gpusched.plan import _display

    if "PATH" in suite.env:  # the plan's own PATH, as the jobs' shell will read it: not known here
        return
    why = missing_program(suite.command, suite.workdir, os.environ.get("PATH", os.defpath))
    if why is not None:
        where = _display(Path(suite.plan_path), cwd)
        raise UsageError(
            f"{where}: command: {why} (the jobs get this shell's environment, and every one would"
            " fail at once); activate the environment that has it before you submit, or write the"
            " program's full path"
        )


def _refuse_shared_output_dirs(store: Store, suite: Suite) -> None:
    """UsageError when a job of ``suite`` would keep its checkpoints in the output dir of a
    job of another suite still queued or running (the same plan submitted again under
    ``--name``, say): each would resume from the other's checkpoints."""
    from gpusched import plan
    from gpusched.store import ACTIVE_STATES

    mine = plan.output_dirs(suite, suite.jobs)
    if not mine:
        return
    for name in sorted(store.active_suites() - {suite.name}):  # (not every suite the store kept)
        row = store.suite(name)
        if row is None or row.suite.resume is None:
            continue
        active = {j.name: j for j in store.jobs(suite=row.name, states=ACTIVE_STATES)}
        theirs = plan.output_dirs(row.suite, (j.spec for j in active.values()))
        for d in sorted(mine.keys() & theirs.keys()):
            other = active[theirs[d]]
            raise UsageError(
                f"{suite.plan_path}: job {mine[d]!r} would keep its checkpoints in {d}, as {other.id}"
                f" ({other.state.value}) does: each would resume from the other's; give suite"
                f" {suite.name} output dirs of its own (e.g. outputs/{suite.name}/...)"
            )


def _log_folders(suite: Suite) -> set[str]:
    """The folders in the suite's logs directory (one listdir; none when it is not there)."""
    try:
        return set(os.listdir(suite.logs_dir))
    except OSError:
        return set()


def _print_earlier_logs(suite: Suite, queued: tuple[str, ...], there: set[str]) -> None:
    """One line when jobs new to this queue already had log folders (``there``, read before
    they were queued: a running daemon makes theirs as soon as the queue's commit lands):
    another queue's (its state directory deleted, or another GPUSCHED_HOME). Their attempts
    go beside the old ones (AttemptPaths.for_attempt), which are left as they are."""
    k = sum(1 for job_id in queued if job_id.partition("/")[2] in there)
    if k:
        first = f"1-{suite.tiers[0].name}"
        print(
            f"  {k} of these jobs already {'have' if k != 1 else 'has'} log folders in {suite.logs_dir},"
            " from a queue gpusched no longer knows (a deleted state directory, another GPUSCHED_HOME):"
            f" left as they are; new attempts go beside them, as {first}~2/ beside {first}/"
            + ("; they start over, not from that queue's checkpoints" if suite.resume else "")
        )


def _not_in_plan(store: Store, whole: Suite) -> list[str]:
    """The suite's queued jobs that ``whole`` (its plan as submitted now) no longer has: from an
    earlier version of the plan, they still run unless cancelled."""
    planned = {j.id for j in whole.jobs}
    return [
        job_id
        for (job_id,) in store.db.execute(
            "SELECT id FROM jobs WHERE suite = ? AND state = 'queued' ORDER BY seq", (whole.name,)
        )
        if job_id not in planned
    ]


def _submit_doc(
    suite: Suite, gplan: GpuPlan, backend: str, result: SubmitResult, dropped: list[str]
) -> dict[str, Any]:
    return {
        "suite": suite.name,
        "queued": list(result.queued),
        "requeued": list(result.requeued),
        "skipped": [list(s) for s in result.skipped],
        "updated": list(result.updated),
        "not_in_plan": dropped,
        "plan_before": result.plan_before,
        "backend_before": result.backend_before,
        "moved_from": result.moved_from,
        "gpu_plan": gplan.as_text(),
        "gpus": list(gplan.gpus),
        "backend": backend,
    }


def _print_changes(result: SubmitResult, dropped: list[str], *, dry: bool, kept: bool = False) -> None:
    """What a submit did (or, ``dry``, would do) to a suite already in the queue; ``kept``: its
    plan was the suite's, no --gpu-plan or --gpus given."""
    if kept:
        print("  the plan the suite runs with, kept (--gpu-plan or --gpus to change it)")
    if result.skipped:
        states: dict[str, int] = {}
        for _, st in result.skipped:
            states[st] = states.get(st, 0) + 1
        desc = ", ".join(f"{v} {k}" for k, v in states.items())
        hint = " (use --rerun to queue finished jobs again)" if states.keys() - {"queued", "running"} else ""
        print(f"  left as they are: {desc}{hint}")
    if result.updated:
        k = len(result.updated)
        verb = "would take" if dry else "take" if k != 1 else "takes"
        print(f"  {k} queued job{'s' * (k != 1)} {verb} the plan's edits (config, env, priority)")
    if dropped:
        k = len(dropped)
        named = ", ".join(dropped[:3]) + (f" and {k - 3} more (`submit --json` lists them)" if k > 3 else "")
        print(
            f"  {k} queued job{'s are' if k != 1 else ' is'} no longer in the plan and "
            f"{'would' if dry else 'will'} still run: {named}; "
            f"`gpusched cancel` drops {'them' if k != 1 else 'it'}"
        )
    if result.moved_from is not None and result.skipped:
        print(
            f"  suite last submitted from {result.moved_from}: the jobs left as they are ran there"
            " (their logs are there); --rerun runs them again from here, --name NAME queues this plan"
            " as a suite of its own"
        )
    if result.plan_before is not None:
        print(
            f"  plan {'would change' if dry else 'changed'} from {result.plan_before}: queued jobs are placed"
            f" by this one from {'then' if dry else 'now'}; running ones stay where they are"
        )
    if result.backend_before is not None:
        print(
            f"  backend {'would change' if dry else 'changed'} from {result.backend_before}: queued jobs are"
            f" launched with this one from {'then' if dry else 'now'}; running ones stay where they are"
        )


class _Undo(Exception):
    """Raised to roll a dry run's submit back."""


def _would_submit(
    home: Home,
    whole: Suite,
    suite: Suite,
    gplan: GpuPlan,
    backend: str,
    cwd: Path,
    options: dict[str, Any],
    rerun: bool,
) -> tuple[SubmitResult, list[str]] | None:
    """What ``submit`` would do to a suite already in the queue (None: it is not, so every job
    would be queued): the submit itself, in a transaction rolled back."""
    if not home.db.exists():
        return None
    from gpusched.store import Store

    store = Store(home.db)
    try:
        if store.suite(suite.name) is None:
            return None
        seen: tuple[SubmitResult, list[str]] | None = None
        with contextlib.suppress(_Undo), store.tx():
            result = store.submit(
                suite, gplan, backend=backend, cwd=str(cwd), env_path=None, options=options, rerun=rerun
            )
            seen = result, _not_in_plan(store, whole)
            raise _Undo
        return seen
    finally:
        store.close()


def _print_dry_run(
    args: argparse.Namespace,
    home: Home,
    cwd: Path,
    whole: Suite,
    suite: Suite,
    gplan: GpuPlan,
    backend: str,
    options: dict[str, Any],
    *,
    kept: bool,
) -> int:
    seen = _would_submit(home, whole, suite, gplan, backend, cwd, options, args.rerun)
    names = [j.name for j in suite.jobs]
    if args.json:
        doc = {"suite": suite.name, "jobs": names, "gpu_plan": gplan.as_text(), "backend": backend}
        print(json.dumps({**doc, **(_submit_doc(suite, gplan, backend, *seen) if seen else {})}))
        return 0
    new = [*seen[0].queued, *seen[0].requeued] if seen else [f"{suite.name}/{n}" for n in names]
    print(
        f"{suite.name}: would queue {len(new)} job{'s' * (len(new) != 1)}, plan {gplan.as_text()} on GPUs "
        f"{','.join(map(str, gplan.gpus))}, backend {backend}, tiers "
        + " -> ".join(t.name for t in suite.tiers)
    )
    for job_id in new:
        print(f"  {job_id}")
    if seen:
        _print_changes(*seen, dry=True, kept=kept)
    _print_earlier_logs(suite, seen[0].queued if seen else tuple(new), _log_folders(suite))
    return 0


# --------------------------------------------------------------------------- status


def _status_sources(
    args: argparse.Namespace, states: list[str] | None = None
) -> tuple[list[GpuState], dict[str, Any]]:
    """The GPUs to show and the arguments of ``views.status`` that come from outside the
    store: the daemon, the probe's notice, the suite and ``states`` asked for and the Slurm
    details."""
    from gpusched import daemon
    from gpusched.gpus import published

    home = _home()
    info = daemon.info(home)
    # the GPUs the daemon schedules on, as it last saw them; without a fresh snapshot, a probe of our own
    now = time.time()
    seen = published.read(home, now=now) if info else None
    if seen is None:
        probe = _probe(daemon_probe_spec(info))
        seen = probe.snapshot(), probe.notice()
        if info:
            info = _with_stall(home, info, now)
    gpus, notice = seen
    return gpus, {
        "daemon": info,
        "suites": [args.suite] if args.suite else None,
        "notice": notice,
        "running": _add_slurm_details,
        "states": states,
    }


#: A daemon that has not finished a tick for this long is stalled (a tick takes milliseconds;
#: failing ones are retried at most 30 s apart, and a locked database is waited on 30 s).
STALLED_AFTER_S = 60.0


def _with_stall(home: Home, info: dict[str, Any], now: float) -> dict[str, Any]:
    """``info`` with ``stalled_s`` (and ``stalled_why``) when the daemon runs but has not
    finished a tick for :data:`STALLED_AFTER_S`: ended jobs are not reaped and nothing new
    starts. The commonest cause is a full disk under the state directory (the daemon cannot
    even log then), so that is checked and named."""
    from gpusched import disk
    from gpusched.gpus import published

    started = info.get("started_at")
    if not info.get("ready") or not isinstance(started, (int, float)):
        return info
    since = max(started, published.published_at(home) or 0.0)  # a snapshot may be an earlier daemon's
    if now - since < STALLED_AFTER_S:
        return info
    free = disk.disk_free(str(home.root))
    if free.free_mib is not None and free.free_mib < 16:
        why = f"the disk of {home.root} is full ({free.free_mib} MiB free): free some space"
    else:
        why = f"see {home.daemon_log}"
    return {**info, "stalled_s": round(now - since), "stalled_why": why}


def _status_doc(
    args: argparse.Namespace,
    store: Store,
    table_rows: int | None = None,
    states: list[str] | None = None,
    suites: list[str] | None = None,
) -> dict[str, Any]:
    from gpusched.views import status

    gpus, kwargs = _status_sources(args, states)
    if suites is not None:
        kwargs["suites"] = suites
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


def cmd_status(args: argparse.Namespace) -> int:
    fields = _entry_fields(args.fields) if args.fields is not None else None
    states = _states(args.state) if args.state is not None else None
    store = _store(readonly=True)
    if args.suite:
        known_suite(store, args.suite)
    if args.json or fields is not None:
        from gpusched.views import status

        while True:  # --watch: a document a line (JSON Lines) every --interval seconds until Ctrl-C
            gpus, kwargs = _status_sources(args, states)
            status(store, gpus, fields=fields, **kwargs).write(sys.stdout)
            if not args.watch:
                return 0
            sys.stdout.flush()  # (a pipe's reader gets each document as it is written)
            time.sleep(args.interval)
    from gpusched.views import MAX_TABLE_JOBS, format_status, recent_suites

    # read only the rows the table shows: a 10k-job store costs what 40 jobs cost
    rows = None if args.all else MAX_TABLE_JOBS

    def show() -> str:
        # the table: the suites of the last day of work, unless --suite or --all says otherwise
        suites, earlier = (None, []) if args.suite or args.all else recent_suites(store, states=states)
        doc = _status_doc(args, store, rows, states, suites if earlier else None)
        return format_status(
            doc,
            max_jobs=rows,
            states=states,
            earlier=earlier,
            width=width,
            color=color,
            ascii_only=ascii_only,
        )

    width, color = terminal()
    ascii_only = not _writes("┏━┃│")
    if not args.watch:
        print(show())
        return 0
    while True:  # a dashboard: the screen redrawn every --interval seconds until Ctrl-C
        text = show()
        sys.stdout.write(("\x1b[H\x1b[2J" if sys.stdout.isatty() else "\n") + text + "\n")
        sys.stdout.flush()
        time.sleep(args.interval)
        width, _ = terminal()


def _states(text: str) -> list[str]:
    """``--state failed,queued``: job states, each a real one."""
    from gpusched.model import JobState

    return _listed(text, "--state", [s.value for s in JobState], "state")


def _entry_fields(text: str) -> list[str]:
    """``--fields id,state``: job entry keys, each known, in the order given."""
    from gpusched.status_rows import ENTRY_FIELDS

    return _listed(text, "--fields", list(ENTRY_FIELDS), "key")


def _listed(text: str, option: str, known: list[str], what: str) -> list[str]:
    """The names ``status OPTION a,b`` lists, each one of ``known`` (else one line naming the
    nearest), in the order given, a name given twice once."""
    from gpusched.errors import did_you_mean

    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise UsageError(f"status {option}: no {what} given; the {what}s are {', '.join(known)}")
    for n in names:
        if n not in known:
            hint = did_you_mean(n, known) or f"; the {what}s are {', '.join(known)}"
            raise UsageError(f"status {option}: no job {what} '{n}'{hint}")
    return list(dict.fromkeys(names))
