"""Scale: a 10,000-job suite of no-ops through the scheduler; its memory and the cost of a
tick must not grow with the number of finished jobs.

    python benchmarks/bench_scale.py [--jobs 10000] [--slots 16] [--backend subprocess] [--no-peaks]

Each job reports a peak of GPU memory (it writes ``runtime.json`` as ``gpusched.runtime`` does
in a training job), as every job on a GPU has one: the scheduler predicts from those peaks, so
history is part of what must not grow. ``--no-peaks``: jobs that report none (what this
benchmark measured before stop 25, blind to that history).

Runs the daemon's own loop body in this process -- ``Scheduler.tick(now)``, then sleep on the
wake FIFO that the wrappers poke -- with the real store, real executor and real wrappers, so
each tick can be timed. At 1k, 5k and 10k finished jobs it reports the process's RSS and,
over the ticks since the previous checkpoint, the median tick and the tick time per launch;
and how many of its children are zombies (ended wrappers nobody waited for).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _harness import machine, median, sandbox, table


def main(argv: list[str] | None = None) -> int:
    import logging

    import psutil

    from gpusched import flags, plan
    from gpusched.attempt import write_env_snapshot
    from gpusched.daemon import _Executors, _open_fifo, _wait
    from gpusched.gpus.select import make_probe
    from gpusched.home import Home
    from gpusched.scheduler import Scheduler, Settings
    from gpusched.store import Store

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--backend", default="subprocess")
    ap.add_argument("--no-peaks", action="store_true", help="jobs report no GPU memory peak")
    args = ap.parse_args(argv)
    checkpoints = sorted({min(1000, args.jobs), min(5000, args.jobs), args.jobs})
    logging.basicConfig(level=logging.WARNING)
    me = psutil.Process()
    rows = []
    with sandbox() as sb:
        # a peak of 9 GiB in runtime.json ("{" and "}" as octal escapes: the plan's command is a template)
        report = '; printf \'\\173"peak_mib": 9216\\175\\n\' >"$GPUSCHED_ATTEMPT_DIR/runtime.json"'
        sb.write_plan("scale", args.jobs, command="true {config}" + ("" if args.no_peaks else report))
        home = Home(sb.home).ensure()
        os.environ["GPUSCHED_HOME"] = str(home.root)
        store = Store(home.db)
        suite = plan.load_suite("scale", cwd=sb.project)
        gplan = flags.parse_gpu_plan(",".join("1" * args.slots), gpus=None, detected=args.slots)
        env_path = home.suite_env("scale")
        write_env_snapshot(env_path, dict(os.environ))
        store.submit(suite, gplan, backend=args.backend, cwd=str(sb.project), env_path=str(env_path))
        fifo = _open_fifo(home.wake)
        sched = Scheduler(
            store,
            make_probe(f"fake:{args.slots}x24GiB"),
            _Executors(home),
            settings=Settings(wake_path=str(home.wake)),
        )
        rss0 = me.memory_info().rss / 2**20
        finished, ticks, t_start = 0, [], time.time()
        window_start = 0
        while finished < args.jobs:
            t0 = time.perf_counter()
            report = sched.tick(time.time())
            ticks.append((time.perf_counter() - t0, len(report.launched)))
            finished += len(report.reaped)
            while checkpoints and finished >= checkpoints[0]:
                window = ticks[window_start:]
                launched = sum(n for _, n in window)
                zombies = sum(1 for c in me.children() if c.status() == psutil.STATUS_ZOMBIE)
                rows.append(
                    [
                        f"{checkpoints.pop(0):,}",
                        f"{me.memory_info().rss / 2**20:.0f}",
                        zombies,
                        f"{median([t for t, _ in window]) * 1000:.1f}",
                        f"{sum(t for t, _ in window) * 1000 / max(1, launched):.2f}",
                        len(window),
                    ]
                )
                window_start = len(ticks)
            _wait(fifo, 1.0)
        wall = time.time() - t_start
        bad = {k: v for k, v in sb.counts().items() if k != "succeeded"}
        if bad:
            raise RuntimeError(f"not all jobs succeeded: {bad}")
        os.close(fifo)
        store.close()
    peaks = "no peaks reported" if args.no_peaks else "each reports a 9 GiB peak"
    print(
        f"Scale: {args.jobs:,} no-op jobs ({peaks}) over {args.slots} slots, backend {args.backend}, "
        f"{wall:.0f} s ({args.jobs / wall:.0f} jobs/s); RSS at start {rss0:.0f} MiB ({machine()})\n"
    )
    headers = ["finished", "RSS MiB", "zombies", "median tick ms", "tick ms per launch", "ticks in window"]
    print(table(headers, rows))
    print("\naim: flat rows (nothing grows with the number of finished jobs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
