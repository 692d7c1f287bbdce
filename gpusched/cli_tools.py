"""``gpusched`` commands beside the queue: gpus, drain, daemon; simulate and report.

Heavy modules (rich, matplotlib, the simulator) are imported by the commands that need them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
from gpusched.errors import UsageError

if TYPE_CHECKING:  # annotations only: the CLI imports its heavy modules lazily
    from gpusched.home import Home
    from gpusched.model import Suite


def cmd_gpus(args: argparse.Namespace) -> int:
    import msgspec
    from msgspec.structs import asdict

    from gpusched.gpus.select import make_probe

    if args.enable is not None:
        if args.json or args.fake_gpus:  # (each was ignored: --enable says what it did, in words)
            option = "--json" if args.json else "--fake-gpus"
            raise UsageError(
                f"{option} does not go with --enable: enable first, then `gpusched gpus {option}`"
            )
        return _enable_gpus(args.enable)
    seen = _home().db.exists()  # (looking at the GPUs creates no database)
    out = {i: asdict(o) for i, o in _store(readonly=True).gpus_out().items()} if seen else {}
    from gpusched import daemon

    # --fake-gpus, else the probe the running daemon places with (it may run on fake GPUs)
    probe = make_probe(_probe_spec(args.fake_gpus) or daemon_probe_spec(daemon.info(_home())))
    snap = probe.snapshot()
    if args.json:
        doc = {"probe": probe.name, "notice": probe.notice(), "gpus": snap, "out_of_service": out}
        print(json.dumps(msgspec.to_builtins(doc)))
        return 0
    if probe.notice():
        print(probe.notice())
    from gpusched.model import GPU_LOST_WHY
    from gpusched.views import gib, out_cause

    for g in snap:
        if g.lost:
            print(f"GPU {g.index}  {g.name or '?'}  {g.uuid or '?'}  LOST: {GPU_LOST_WHY}")
            continue
        print(
            f"GPU {g.index}  {g.name or '?'}  {g.uuid or '?'}  "
            f"{gib(g.used_mib)}/{gib(g.total_mib)} GiB used  "
            f"{gib(g.free_mib)} GiB free  util {'?' if g.util_pct is None else g.util_pct}%  "
            f"{len(g.processes)} processes"
        )
    for i, o in out.items():
        print(f"GPU {i} is out of service {out_cause(o)}: `gpusched gpus --enable {i}` once it is fixed")
    return 0


def _enable_gpus(text: str) -> int:
    from gpusched import daemon

    wanted: list[int] | None = None
    if text.strip() != "all":
        try:
            wanted = [int(part) for part in text.split(",")]
        except ValueError:
            raise UsageError(
                f"--enable {text!r}: give GPU indices separated by commas (3 or 1,3) or all"
            ) from None
        if any(g < 0 for g in wanted):
            raise UsageError(f"--enable {text!r}: GPU indices are 0 or more")
    store = _store()
    back = store.enable_gpus(wanted)
    daemon.wake(_home())
    for g in back:
        print(f"GPU {g} is back in service: jobs are placed on it again")
    missed = [g for g in wanted or () if g not in back]
    if missed:  # (a typo: say which are out, so that 7 for 1 shows)
        left = sorted(store.gpus_out())
        named, listed = ", ".join(map(str, left)), ",".join(map(str, left))
        also = f"GPU {named} {'is' if len(left) == 1 else 'are'}: `gpusched gpus --enable {listed}`"
        for g in missed:
            print(f"GPU {g} was not out of service ({also if left else 'none is'})")
    if wanted is None and not back:
        print("no GPU was out of service")
    return 0


def cmd_drain(args: argparse.Namespace) -> int:
    import time

    from gpusched import daemon
    from gpusched.store import DRAIN_FLAG, draining

    now = time.time()
    at = None if args.at is None else next_time_of_day(args.at, now)  # (refused before the store opens)
    store = _store()
    before = store.drains_at()
    store.set_flag(DRAIN_FLAG, None if args.off else repr(now if at is None else at))
    daemon.wake(_home())
    if args.off:
        print("launches resumed")
    elif at is None:
        print("draining: running jobs finish, nothing new starts (`gpusched drain --off` resumes)")
    else:
        when = time.strftime("%a %H:%M", time.localtime(at))
        until = "; until then launches go on" if draining(before, now) else ""
        print(
            f"drains at {when}: no new launches from then, running jobs finish{until} (`drain --off` cancels)"
        )
    return 0


def next_time_of_day(text: str, now: float) -> float:
    """The next moment (epoch seconds, after ``now``) the local clock reads ``text`` (``07:30``,
    24-hour); :class:`UsageError` for anything else."""
    import time

    hours, sep, minutes = text.strip().partition(":")
    if not (sep and hours.isdigit() and minutes.isdigit() and len(minutes) == 2):
        hours = minutes = "x"
    if not (hours.isdigit() and int(hours) < 24 and int(minutes) < 60):
        raise UsageError(f"--at {text}: not a time of day like 07:30 (24-hour, this machine's clock)")
    t = time.localtime(now)
    day = (t.tm_year, t.tm_mon, t.tm_mday)
    at = time.mktime((*day, int(hours), int(minutes), 0, 0, 0, -1))
    if at <= now:  # today's is past: tomorrow's (mktime carries the 32nd into the next month)
        at = time.mktime((*day[:2], day[2] + 1, int(hours), int(minutes), 0, 0, 0, -1))
    return at


def cmd_simulate(args: argparse.Namespace) -> int:
    """Replay ``--suite`` (its tiers, its job names and tasks) through the real scheduler in
    :mod:`gpusched.sim`: a temporary store, never the user's queue."""
    from gpusched import flags, plan, sim
    from gpusched.gpus.fake import parse_fake_spec

    if args.trace_out == "-":  # (it wrote a file named "-" in the current folder)
        raise UsageError(
            "--trace-out -: give a file's name, e.g. --trace-out night.json (stdout has the results)"
        )
    suite = plan.load_suite(args.suite, cwd=Path.cwd())
    gpus = flags.parse_gpus(args.gpus, detected=None)
    plan_text = args.gpu_plan
    if plan_text is None and gpus is not None:
        plan_text = ",".join("1" for _ in gpus)  # as submit: one job a GPU named
    elif plan_text is None:
        row = submitted_suite(suite.name)
        ran = row.gpu_plan if row is not None and row.backend != "slurm" else None
        if ran is None:
            raise UsageError(
                f"--gpu-plan: give the plan to simulate, e.g. --gpu-plan 2,2,2,2 (suite {suite.name} has not "
                "run in this queue, so there is no plan of its to replay)"
            )
        plan_text, gpus = ran.as_text(), ran.gpus
    entries = len([e for e in plan_text.split(",") if e.strip()])
    needed = max(gpus or (entries - 1,)) + 1
    if args.fake_gpus:
        totals, cards = parse_fake_spec(args.fake_gpus, source="--fake-gpus"), "as --fake-gpus gives them"
    else:
        totals, cards = _probed_cards(needed)
    gplan = flags.parse_gpu_plan(plan_text, gpus=gpus, detected=len(totals))
    names = sim.POLICIES if args.policy == "all" else (args.policy,)
    if any(n not in sim.POLICIES for n in names):
        raise UsageError(f"--policy {args.policy}: use one of {', '.join(sim.POLICIES)}, or all")
    given = _load_trace(args.trace, sim) if args.trace else None
    history = _queue_history(args, {j.task for j in (given or suite).jobs})
    trace, figures = (given, None) if given else _history_trace(args, suite, list(totals), history)
    warm = None if args.cold or args.made_up else history
    if args.trace_out:
        try:
            Path(args.trace_out).write_text(sim.trace_to_json(trace) + "\n")
        except OSError as e:
            raise UsageError(f"--trace-out {args.trace_out}: cannot write it ({e.strerror})") from e
    if args.plot:
        from gpusched import plot

        plot.require(args.plot)  # before the run: a missing matplotlib is one line, not wasted work
    results = [
        sim.simulate(trace, gplan, totals, policy=n, suite=suite, seed=args.seed, history=warm) for n in names
    ]
    if args.plot:
        try:
            plot.timeline(results[0].report, args.plot, title=f"{suite.name}, simulated ({results[0].label})")
        except OSError as e:  # a folder that cannot be made, a read-only disk, a full one
            raise UsageError(
                f"--plot {args.plot}: cannot write it ({e.strerror or e}); give another path"
            ) from None
    if args.json:
        print(json.dumps([r.as_dict() for r in results]))
        return 0
    first = results[0]
    print(
        f"{suite.name}: {first.jobs} jobs on {len(totals)} simulated GPUs ({_sizes(totals)}, {cards}), "
        f"plan {gplan.as_text()}; lower bound {first.lower_bound_s / 3600:.2f} h"
    )
    if figures:
        print(figures)
    if first.history_runs:
        print(
            f"history: the scheduler starts knowing {first.history_runs} run(s) of {len(history[0])} task(s)"
            " from this queue,"
            " as it would tonight (--cold: as on a first night)"
        )
    elif args.cold:
        print("history: none (--cold): every peak and run time unknown at the start, as on a first night")
    print(sim.format_table(results))
    return 0


def _probed_cards(needed: int) -> tuple[tuple[int, ...], str]:
    """The simulated cards where ``--fake-gpus`` does not give them: those the GPU probe sees
    (the running daemon's), so that a night of 80 GiB cards is not replayed on 24 GiB ones;
    ``needed`` cards of 24 GiB where it sees none. With where they came from."""
    from gpusched import daemon
    from gpusched.gpus.select import make_probe
    from gpusched.home import Home

    seen = make_probe(daemon_probe_spec(daemon.info(Home.from_env()))).snapshot()  # (creating nothing)
    if seen:
        cards = tuple(g.total_mib or 24 << 10 for g in sorted(seen, key=lambda g: g.index))
        return cards, "as the probe sees them"
    return (24 << 10,) * needed, "no GPU seen: --fake-gpus to change"


def _sizes(totals: tuple[int, ...]) -> str:
    """``(24576, 24576, 81920)`` -> "2 x 24 GiB, 1 x 80 GiB"."""
    from itertools import groupby

    from gpusched.views import gib

    return ", ".join(f"{len(list(run))} x {gib(mib)} GiB" for mib, run in groupby(totals))


def _load_trace(path: str, sim: Any) -> Any:
    try:
        trace = sim.load_trace(path)
    except ValueError as e:  # (what is wrong, and where: `$.jobs[0].peak_mib`)
        raise UsageError(f"--trace {path}: not a trace: {e}; see `gpusched simulate --help`") from e
    if not trace.jobs:
        raise UsageError(f"--trace {path}: no jobs; give a list under 'jobs:'")
    return trace


def _queue_history(args: argparse.Namespace, tasks: set[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """What this queue measured of ``tasks`` (``memwatch.records``: peak samples and run
    times by task), none with ``--made-up`` or where there is no queue. The queue is only
    read, never created: a what-if leaves no queue behind."""
    from gpusched.home import Home

    db = Home.from_env().db
    if args.made_up or not db.exists():
        return {}, {}
    from gpusched import memwatch
    from gpusched.store import Store

    store = Store(db, readonly=True)
    try:
        return memwatch.records(store, sorted(tasks))
    finally:
        store.close()


def _history_trace(
    args: argparse.Namespace, suite: Suite, totals: list[int], history: tuple[dict[str, Any], dict[str, Any]]
) -> tuple[Any, str]:
    """The trace of each job's figures as the queue measured them, and where they came from
    (one line)."""
    from gpusched import memory, whatif
    from gpusched.gpus.fake import FakeProbe
    from gpusched.placement import DEFAULT_HEADROOM_FRAC

    peaks, runs = history
    utils, slow = _queue_sharing(args)
    # how long each measured run would have taken with its card to itself
    runs = {t: [_alone(r, slow) for r in rs] for t, rs in runs.items()}
    jobs = [(j.id, j.name, j.task) for j in suite.jobs]
    # a job placed alone on an empty card is placed with that card's room, as placement sees it
    rooms = memory.rooms(FakeProbe(totals).snapshot(), {}, DEFAULT_HEADROOM_FRAC)
    made = whatif.trace_from_history(
        jobs,
        len(suite.tiers),
        peaks,
        runs,
        seed=args.seed,
        card_mib=max(totals),
        whole_mib=min(rooms.values()),
        utils=utils,
    )
    return made.trace, f"{made.summary()}\n{made.sharing()}"


def _alone(run: Any, slow: dict[int, float]) -> Any:
    from msgspec.structs import replace

    return replace(run, seconds=run.seconds / slow.get(run.attempt_id, 1.0))


def _queue_sharing(args: argparse.Namespace) -> tuple[dict[tuple[str, int], float], dict[int, float]]:
    """What sharing a card cost in this queue (:mod:`gpusched.sharing`): per (task, tier) the
    share of its card a run alone kept busy, and per successful attempt how many times longer
    than alone it ran; nothing with ``--made-up`` or without a queue."""
    from gpusched.home import Home

    db = Home.from_env().db
    if args.made_up or not db.exists():
        return {}, {}
    from gpusched import sharing
    from gpusched.store import Store

    store = Store(db, readonly=True)
    try:
        spans = [sharing.Span(*row) for row in store.attempt_spans()]
        utils = sharing.alone_utils(spans, store.gpu_utils)  # (only the samples of runs alone)
    finally:
        store.close()
    return utils, sharing.slowdowns(spans, utils)


def cmd_daemon(args: argparse.Namespace) -> int:
    from gpusched import daemon
    from gpusched.home import Home

    # on standby, the state directory is made once told to go: a refused submit leaves none
    home = Home.from_env() if args.action == "run" and args.standby else _home()
    probe = args.probe or _probe_spec(args.fake_gpus)
    if args.forget_host and args.action != "start":
        raise UsageError("--forget-host goes with `gpusched daemon start`")
    if (args.probe or args.fake_gpus) and args.action in ("stop", "status"):  # (it names no daemon)
        option = "--probe" if args.probe else "--fake-gpus"
        raise UsageError(f"{option} goes with `gpusched daemon start`: `daemon {args.action}` takes none")
    if args.forget_host:
        _forget_host(home, args.forget_host)
    if args.action == "run":
        return daemon.run(home, probe_spec=probe, standby=args.standby)
    if args.action == "start":
        running = daemon.info(home)
        refuse_another_probe(running, probe, probe_source(args.fake_gpus, args.probe))
        daemon.say_settings_not_taken(running)
        if home.db.exists():  # the daemon would refuse: say it here, in one line
            store = _store(readonly=True)
            try:
                daemon.check_jobs_elsewhere(home, store)
            finally:
                store.close()
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


def _forget_host(home: Home, gone: str) -> None:
    """``daemon start --forget-host HOST``: HOST's jobs recorded running become this machine's;
    the daemon adopts each one it finds running here and requeues the rest as lost."""
    from gpusched.home import this_host
    from gpusched.store import Store

    if gone == this_host():
        raise UsageError(f"--forget-host {gone}: that is this machine; its jobs are looked after here")
    n = 0
    if home.db.exists():
        store = Store(home.db)
        try:
            n = store.forget_host(gone, this_host())
        finally:
            store.close()
    if not n:
        raise UsageError(f"--forget-host {gone}: no job of this queue is recorded running on {gone}")
    print(
        f"{n} job{'s' * (n != 1)} recorded running on {gone}: taken as this machine's"
        " (the daemon requeues each one it does not find running here)"
    )


# --------------------------------------------------------------------------- report


def cmd_report(args: argparse.Namespace) -> int:
    from gpusched import report, report_render

    if args.csv == "-" and args.json == "-":  # (the two would run together on stdout, neither readable)
        raise UsageError("--csv - and --json -: stdout takes one of them; write the other to a file")
    if args.plot:
        from gpusched import plot

        plot.require(args.plot)  # before any work: a missing extra is one line, exit 2
    store = _store()
    if args.suite is not None:
        name = known_suite(store, args.suite)
    elif names := store.suite_names():
        name = names[-1]
    else:
        raise UsageError("no suite submitted yet: nothing to report")
    rep = report.from_store(store, name)
    to_stdout = "-" in (args.csv, args.json)
    if not to_stdout:
        from rich.console import Console

        shown = report_render.render_report(rep, top=args.top)
        width, _ = terminal()
        if width is None:  # into a pipe or a file: as wide as its tables, one line a row
            width = Console(width=10_000).measure(shown).maximum
        Console(width=width).print(shown)
    done = []
    for flag, path, write in (
        ("--csv", args.csv, lambda p: f"{p} ({report_render.write_csv(rep, p)} attempts)"),
        ("--json", args.json, lambda p: f"{p} ({report_render.write_json(rep, p)} attempts)"),
        ("--plot", args.plot, lambda p: str(plot.timeline(rep, p))),
    ):
        if not path:
            continue
        try:
            done.append(write(path))
        except OSError as e:  # a folder that cannot be made, a read-only disk, a full one
            raise UsageError(
                f"{flag} {path}: cannot write it ({e.strerror or e}); give another path"
            ) from None
    done = [d for d in done if not d.startswith("- ")]
    if done:
        print("wrote " + ", ".join(done), file=sys.stderr if to_stdout else sys.stdout)
    return 0
