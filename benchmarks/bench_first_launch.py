"""From ``submit`` to the first job's launch with no daemon running: the command's interpreter
start, the plan read and queued, the daemon's start (on standby while ``submit`` works) and its
first tick. What a user waits for at the start of every night.

    python benchmarks/bench_first_launch.py [--jobs 32] [--rounds 8] [--before DIR]

Each round submits ``--jobs`` no-op jobs over 16 fake GPUs (plain processes) in a fresh
sandbox and takes the first attempt's ``launched_at`` (stamped by the daemon's tick) against
the moment ``submit`` was started, then stops the daemon. ``--before DIR`` (another checkout,
e.g. ``git worktree add /tmp/before COMMIT``) runs that tree too, in turn with this one, each
round (``PYTHONPATH``). Prints the median and the range of each tree, and, at the median, which
of the two starts the first launch waited for: the suite queued (its ``submitted_at``, as
``submit`` committed it) and the daemon running (its ``daemon.json``'s ``started_at``, written
once it has the word to go and its database open). The later of the two gates the first tick.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import ROOT, daemon_info, machine, median, pythonpath, sandbox, table


class Start(NamedTuple):
    """Seconds after ``submit`` was started: the suite queued, the daemon running, the first launch."""

    queued: float
    running: float
    first: float


def first_launch(tree: Path, jobs: int) -> Start:
    """When each step of a night's start came after starting ``submit``, one fresh sandbox."""
    with sandbox() as sb:
        sb.write_plan("noop", jobs)
        env = sb.env(GPUSCHED_FAKE_GPUS="16x24GiB", PYTHONPATH=pythonpath(tree))
        t0 = time.time()
        plan = ",".join("1" * 16)
        sb.cli("submit", "--suite", "noop", "--gpu-plan", plan, "--backend", "subprocess", env=env)
        sb.wait_all_done(jobs)
        (first,) = sb.query("SELECT MIN(launched_at) FROM attempts")[0]
        (queued,) = sb.query("SELECT MIN(submitted_at) FROM suites")[0]
        running = daemon_info(sb)["started_at"]
        sb.cli("daemon", "stop", env=env)
        return Start(float(queued) - t0, float(running) - t0, float(first) - t0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--before", type=Path, help="another checkout, timed in turn with this one")
    args = ap.parse_args(argv)
    trees = {"this tree": ROOT, **({f"before ({args.before})": args.before.resolve()} if args.before else {})}
    times: dict[str, list[Start]] = {name: [] for name in trees}
    for _ in range(args.rounds):
        for name, tree in trees.items():
            times[name].append(first_launch(tree, args.jobs))
    print(
        f"submit to the first launch: {args.jobs} no-op jobs, 16 fake GPUs, plain processes, "
        f"{args.rounds} rounds ({machine()})\n"
    )
    ms = lambda x: f"{1000 * x:.0f}"  # noqa: E731
    rows = []
    for name, starts in times.items():
        firsts = [s.first for s in starts]
        middle = median(firsts)
        mid = min(starts, key=lambda s: abs(s.first - middle))  # the median round's steps
        gate = "the daemon's start" if mid.running > mid.queued else "the suite's queueing"
        rows.append(
            [
                name,
                ms(middle),
                f"{ms(min(firsts))}-{ms(max(firsts))}",
                ms(mid.queued),
                ms(mid.running),
                gate,
            ]
        )
    heads = ["tree", "median ms", "range ms", "queued at ms", "daemon running at ms", "waited for"]
    print(table(heads, rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
