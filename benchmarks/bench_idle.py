"""Idle overhead: the daemon's CPU while 14 jobs run (sleeping) and nothing else happens,
with the GPU probe sampled every second, as on a real night.

    python benchmarks/bench_idle.py [--seconds 60] [--jobs 14] [--queued 0] [--backend subprocess]
                                    [--gpu-processes N] [--real-gpus]

Reads the daemon's user+system CPU time (psutil) at the start and end of the window and
reports it as a share of one core. ``--queued N`` adds N jobs that wait behind the running
ones (a long queue must not make an idle daemon busy either). ``--gpu-processes N``: the fake
GPUs list a process, as a real GPU's driver lists the jobs' own (fake GPUs list none, so
without it the daemon never reads the process table to tell whose they are), and N other
processes (sleeping, as most of a GPU box's are) sit in the process table it reads each second.
``--real-gpus``: the machine's own GPUs through NVML (a lent GPU machine), the jobs all on the
first card, each holding a CUDA context through torch, so the driver lists them and the daemon
reads the real cards and tells the real processes apart every second; the fake cards cannot say
what NVML's calls cost.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import (
    Sandbox,
    daemon_pid,
    gpu_processes_option,
    listing_cards,
    listing_words,
    machine,
    sandbox,
    table,
)

#: A job that holds a CUDA context and sleeps (``--real-gpus``): the driver lists its process.
CUDA_JOB = (
    'python3 -c \'import time, torch; torch.zeros(1, device="cuda"); torch.cuda.synchronize();'
    " time.sleep(3600)' # {config}"
)


def listed_processes(sb: Sandbox, env: dict[str, str]) -> list[dict[str, object]]:
    """The processes the first card's driver lists, as ``status --json`` shows them."""
    doc = json.loads(sb.cli("status", "--json", env=env).stdout)
    return list(doc["gpus"][0]["processes"]) if doc["gpus"] else []


def measure(
    seconds: float,
    running: int,
    queued: int,
    backend: str,
    gpu_processes: int | None = None,
    real_gpus: bool = False,
) -> tuple[float, float, float, int]:
    """(cpu % of one core, CPU ms per second, RSS MiB) of the daemon over ``seconds``, and how
    many processes the first card's driver listed (``real_gpus`` only; else 0);
    ``gpu_processes``: GPUs that list a process, beside that many other processes;
    ``real_gpus``: the machine's own cards, the jobs on the first, each holding a CUDA context."""
    import psutil

    with sandbox() as sb, contextlib.ExitStack() as stack:
        n = running + queued
        sb.write_plan("idle", n, command=CUDA_JOB if real_gpus else ": {config}; sleep 3600")
        env = sb.env() if real_gpus else sb.env(GPUSCHED_FAKE_GPUS="16x24GiB")
        if gpu_processes is not None:
            stack.enter_context(listing_cards(sb, env, gpu_processes, card=15))
        gpus: list[str] = []
        if real_gpus:
            plan, gpus = str(running), ["--gpus", "0"]  # every job on card 0, as many slots as jobs
        elif running < 16:
            plan = ",".join("1" * running) + ",0" * (16 - running)
        else:
            plan = ",".join("1" * 16)
        sb.cli("submit", "--suite", "idle", "--gpu-plan", plan, *gpus, "--backend", backend, env=env)
        deadline = time.monotonic() + 60
        while sb.counts().get("running", 0) < running:
            if time.monotonic() > deadline:
                raise TimeoutError(f"jobs did not start: {sb.counts()}")
            time.sleep(0.1)
        listed = 0
        while real_gpus and (listed := len(listed_processes(sb, env))) < running:  # their CUDA contexts
            if time.monotonic() > deadline:  # (a driver in another PID namespace lists none: measured as is)
                break
            time.sleep(0.5)
        time.sleep(2.0)  # let the launches' own work settle
        p = psutil.Process(daemon_pid(sb))
        c0, t0 = p.cpu_times(), time.monotonic()
        time.sleep(seconds)
        c1, t1 = p.cpu_times(), time.monotonic()
        rss = p.memory_info().rss / 2**20
        cpu_s = (c1.user - c0.user) + (c1.system - c0.system)
        sb.cli("cancel", "--suite", "idle", env=env, check=False)
        return 100 * cpu_s / (t1 - t0), 1000 * cpu_s / (t1 - t0), rss, listed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--jobs", type=int, default=14, help="running jobs (at most 16)")
    ap.add_argument("--queued", type=int, default=0, help="jobs waiting behind them")
    ap.add_argument("--backend", default="subprocess")
    gpu_processes_option(ap)
    ap.add_argument(
        "--real-gpus",
        action="store_true",
        help="this machine's GPUs through NVML, the jobs on the first, each holding a CUDA context",
    )
    args = ap.parse_args(argv)
    if args.real_gpus and args.gpu_processes is not None:
        ap.error("--gpu-processes fakes what --real-gpus reads from the driver: give one of them")
    if args.real_gpus:
        import pynvml

        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            ap.error(f"--real-gpus needs an NVIDIA GPU, and NVML finds none here ({e})")
    rows = []
    for queued in sorted({0, args.queued}):
        pct, ms, rss, on_card = measure(
            args.seconds, min(args.jobs, 16), queued, args.backend, args.gpu_processes, args.real_gpus
        )
        jobs = f"{args.jobs} running, {queued} queued" + (
            f" ({on_card} listed by the driver)" if args.real_gpus else ""
        )
        rows.append([jobs, f"{pct:.2f} %", f"{ms:.1f}", f"{rss:.0f}"])
    listed = listing_words(args.gpu_processes)
    if args.real_gpus:
        listed += ", this machine's GPUs through NVML, each job holding a CUDA context on the first"
    print(
        f"Idle daemon over {args.seconds:.0f} s, GPU probe sampled at 1 Hz, backend {args.backend}{listed} "
        f"({machine()})\n"
    )
    print(table(["jobs", "CPU (of one core)", "CPU ms per s", "RSS MiB"], rows))
    print("\naim: < 1 % of a core")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
