"""Slot refill latency: from a job's end to the start of the next job on the same slot, as the
jobs themselves see it (each records the clock as its first and last act), p50 / p99 / max.

    python benchmarks/bench_refill.py [--jobs 500] [--slots 16] [--sleep 0.5-1.4]
                                      [--backend subprocess,tmux,tmux-job,tmux-reuse] [--gpu-processes N]

Each backend gets its own private home and daemon: ``--slots`` fake GPUs with one slot each,
jobs that sleep 0.5-1.4 s (ten durations, so that ends do not all coincide; about 17 ends a
second on 16 slots, a latency test, not a throughput one), started by the real CLI. The gap
is what the event-driven design is about: the wrapper writes exit.json and pokes the daemon's
FIFO, the daemon wakes, reaps, places and launches, the next wrapper starts its job; no
polling interval is involved, and every step of it is inside the gap. ``tmux`` runs its panes
as by default (``auto``); ``tmux-job`` and ``tmux-reuse`` with GPUSCHED_TMUX_PANES=job or reuse.
``--gpu-processes N``: the fake GPUs list a process, as a real GPU's list the jobs' own, and N
other processes sit in the process table the daemon reads to tell whose they are.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import shutil
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import (
    Sandbox,
    gpu_processes_option,
    listing_cards,
    listing_words,
    machine,
    percentile,
    sandbox,
    table,
)


def sleeps(spec: str) -> list[float]:
    """``"0.5-1.4"`` -> ten durations from 0.5 to 1.4 s."""
    lo, hi = (float(x) for x in spec.split("-"))
    return [round(lo + (hi - lo) * k / 9, 2) for k in range(10)]


#: Each job writes the clock (ns) into its attempt directory when it starts and as it ends.
COMMAND = (
    ': {config}; date +%s%N > "$GPUSCHED_ATTEMPT_DIR/t0"; sleep $BENCH_SLEEP; '
    'date +%s%N > "$GPUSCHED_ATTEMPT_DIR/t1"'
)


def gaps(sb: Sandbox) -> list[float]:
    """Seconds between each job's end and the next job's start on its GPU (one slot per GPU)."""
    rows = sb.query("SELECT gpu, dir FROM attempts WHERE state = 'exited'")
    by_gpu: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for gpu, d in rows:
        t0, t1 = (int((Path(d) / name).read_text()) / 1e9 for name in ("t0", "t1"))
        by_gpu[gpu].append((t0, t1))
    out = []
    for spans in by_gpu.values():
        spans.sort()
        out += [nxt[0] - prev[1] for prev, nxt in itertools.pairwise(spans)]
    return out


def run(backend: str, n: int, slots: int, durations: list[float], gpu_processes: int | None) -> list[float]:
    with sandbox() as sb, contextlib.ExitStack() as stack:
        sb.write_plan("refill", n, command=COMMAND, sleeps=durations)
        env = sb.env(GPUSCHED_FAKE_GPUS=f"{slots}x24GiB")
        if gpu_processes is not None:
            stack.enter_context(listing_cards(sb, env, gpu_processes, card=0))
        how, _, panes = backend.partition("-")  # tmux-job: tmux, GPUSCHED_TMUX_PANES=job
        if panes:
            env["GPUSCHED_TMUX_PANES"] = panes
        plan = ",".join("1" * slots)
        sb.cli("submit", "--suite", "refill", "--gpu-plan", plan, "--backend", how, env=env)
        sb.wait_all_done(n, poll_s=0.05)
        bad = {k: v for k, v in sb.counts().items() if k != "succeeded"}
        if bad:
            raise RuntimeError(f"{backend}: not all jobs succeeded: {bad}")
        return gaps(sb)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=500)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--sleep", default="0.5-1.4", help="job durations, MIN-MAX seconds")
    ap.add_argument("--backend", default="subprocess,tmux")
    gpu_processes_option(ap)
    args = ap.parse_args(argv)
    durations = sleeps(args.sleep)
    n = args.jobs - args.jobs % len(durations)
    rows = []
    for backend in args.backend.split(","):
        if backend.startswith("tmux") and not shutil.which("tmux"):
            rows.append([backend, "tmux not installed", "", "", "", ""])
            continue
        g = [x * 1000 for x in run(backend, n, args.slots, durations, args.gpu_processes)]
        rows.append(
            [
                backend,
                len(g),
                f"{percentile(g, 50):.1f}",
                f"{percentile(g, 90):.1f}",
                f"{percentile(g, 99):.1f}",
                f"{max(g):.1f}",
            ]
        )
    listed = listing_words(args.gpu_processes)
    print(f"Slot refill: {n} jobs of {args.sleep} s over {args.slots} slots{listed} ({machine()})\n")
    print(table(["backend", "refills", "p50 ms", "p90 ms", "p99 ms", "max ms"], rows))
    print("\naim: p50 <= 20 ms, p99 <= 100 ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
