"""The refill tick alone: what the daemon does between a job's end and the next job's start,
without the processes, the tmux server or the disk around it.

    python benchmarks/bench_tick.py [--queued 600] [--ticks 300] [--candidates 256] [--ends 1]
                                    [--before DIR] [--instructions]

The real ``Scheduler`` over a real store (SQLite on tmpfs where there is one), the fake executor
and probe: 16 one-slot 24 GiB cards, one task's jobs queued, each finished run reporting a 9 GiB
peak. Before each timed tick one running job ends; the tick reaps it, reads the queue's window
(``--candidates``), predicts, places, launches the next job and writes the waits. Prints the
median and p90 tick. ``--ends 16``: every running job ends before each tick, as in a burst of
short jobs (``bench_dispatch.py``), so the tick reaps and launches 16 and its cost over 16 is
the daemon's work a job there, without the wrappers' processes. ``--before DIR`` (another
checkout, e.g. ``git worktree add /tmp/before COMMIT``) times that tree too, in turn with this
one. ``--instructions`` adds instructions a tick under callgrind (a run with ``--ticks`` ticks
less one with a single tick, over ``--ticks - 1``; hash seed fixed): the figure to compare on a
shared machine, whose wall times move by half between runs.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import pythonpath, table

ROOT = Path(__file__).resolve().parent.parent


def ticks(queued: int, n: int, candidates: int, ends: int = 1) -> list[float]:
    """Seconds of each of ``n`` refill ticks, ``ends`` jobs ending before each (run in the
    checkout on ``sys.path``)."""
    from gpusched.executors.fake import FakeExecutor
    from gpusched.gpus.fake import FakeProbe
    from gpusched.memory import HostMemory
    from gpusched.model import GpuPlan, JobSpec, Suite, Tier
    from gpusched.scheduler import Scheduler, Settings
    from gpusched.store import Store

    scratch = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(dir=scratch) as tmp:
        now = 1000.0
        store = Store(Path(tmp) / "gs.db")
        ex = FakeExecutor(name="fake")
        sched = Scheduler(
            store,
            FakeProbe.from_spec("16x24GiB", clock=lambda: now),
            {"fake": ex},
            settings=Settings(candidates=candidates),
            on_event=lambda _: None,
            process_trees=lambda attempts: {},
            host_memory=lambda: HostMemory(available_mib=200 << 10, total_mib=256 << 10),
        )
        tiers = (Tier(name="A"), Tier(name="B"), Tier(name="C"), Tier(name="D", exclusive=True))
        jobs = tuple(JobSpec(suite="E1", name=f"{i}-qnli", task="qnli") for i in range(queued))
        Path(tmp, "train.py").touch()  # the script the command runs: launches wait while it is missing
        suite = Suite(
            name="E1",
            plan_path=f"{tmp}/E1.yaml",
            workdir=tmp,
            logs_dir=f"{tmp}/logs/E1",
            command="python train.py --config {config}",
            base_config=None,
            tiers=tiers,
            jobs=jobs,
        )
        plan = GpuPlan(gpus=tuple(range(16)), slots=(1,) * 16)
        store.submit(suite, plan, backend="fake", cwd=tmp, env_path=None, now=now)
        now += 1
        sched.tick(now)
        running = [r.token for r in ex.launched]
        out = []
        for _ in range(n):
            for _ in range(ends):
                ex.finish(running.pop(0), exit_code=0, runtime={"peak_mib": 9000})
            before = len(ex.launched)
            now += 1
            t = time.perf_counter()
            sched.tick(now)
            out.append(time.perf_counter() - t)
            running += [r.token for r in ex.launched[before:]]
        return out


def _child(tree: Path, args: argparse.Namespace, n: int, *, callgrind: bool = False) -> str:
    """This script's ``--child`` run against ``tree``; its stdout (or callgrind's count)."""
    argv = [sys.executable, __file__, "--child", f"--queued={args.queued}", f"--candidates={args.candidates}"]
    argv.append(f"--ends={args.ends}")
    argv.append(f"--ticks={n}")
    # the tree first, ahead of whatever else the path held (where the dependencies may be)
    env = {**os.environ, "PYTHONPATH": pythonpath(tree), "PYTHONHASHSEED": "0"}
    if callgrind:
        argv = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv]
    r = subprocess.run(argv, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{tree}: {r.stderr[-2000:]}")
    if not callgrind:
        return r.stdout
    found = re.search(r"Collected : (\d+)", r.stderr)
    if found is None:
        raise RuntimeError(f"no callgrind count: {r.stderr[-2000:]}")
    return found.group(1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queued", type=int, default=600)
    ap.add_argument("--ticks", type=int, default=300)
    ap.add_argument("--candidates", type=int, default=256, help="the queue's window (Settings.candidates)")
    ap.add_argument(
        "--ends", type=int, default=1, help="jobs that end before each tick (16: a burst, as in dispatch)"
    )
    ap.add_argument("--before", metavar="DIR", help="another checkout, timed in turn with this one")
    ap.add_argument("--instructions", action="store_true", help="also count instructions a tick (valgrind)")
    ap.add_argument("--runs", type=int, default=3, help="runs of each tree, in turn; the median run is shown")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(" ".join(f"{t:.9f}" for t in ticks(args.queued, args.ticks, args.candidates, args.ends)))
        return 0
    if not 1 <= args.ends <= 16:
        ap.error("--ends must be between 1 and 16 (the cards' slots)")
    if args.ticks < 2 or args.queued < 16 + args.ticks * args.ends:
        ap.error("--ticks must be at least 2, and --queued at least 16 more than --ticks x --ends")
    trees = [("this tree", ROOT)] + ([("before", Path(args.before).resolve())] if args.before else [])
    runs: dict[str, list[list[float]]] = {name: [] for name, _ in trees}
    for _ in range(args.runs):
        for name, tree in trees:
            runs[name].append([float(x) for x in _child(tree, args, args.ticks).split()])
    print(
        f"{os.cpu_count()} cores; {args.queued} queued, window {args.candidates}, {args.ticks} ticks,"
        f" {args.ends} job(s) ending before each\n"
    )
    rows = []
    for name, tree in trees:
        run = sorted(runs[name], key=statistics.median)[len(runs[name]) // 2]
        q = statistics.quantiles(run, n=10)
        row: list[object] = [name, f"{statistics.median(run) * 1e3:.2f}", f"{q[-1] * 1e3:.2f}"]
        if args.ends > 1:
            row.append(f"{statistics.median(run) * 1e6 / args.ends:.0f}")
        if args.instructions:
            many, one = (int(_child(tree, args, k, callgrind=True)) for k in (args.ticks, 1))
            row.append(f"{(many - one) / (args.ticks - 1) / 1e6:.1f}")
        rows.append(row)
    heads = ["tree", "tick p50 ms", "tick p90 ms"] + ["p50 us a job"] * (args.ends > 1)
    heads += ["M instructions a tick"] * args.instructions
    print(table(heads, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
