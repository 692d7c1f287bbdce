"""Dispatch throughput: N no-op jobs over 16 slots, wall time from the first
submit to every job done, for gpusched (subprocess and tmux backends) beside task-spooler,
GNU parallel and simple-gpu-scheduler, in one run on one machine.

    python benchmarks/bench_dispatch.py [--jobs 1000] [--slots 16] [--repeat 1] [--only tmux,tsp]

gpusched runs the real CLI (``submit`` starts its daemon, as for a user) with 16 fake GPUs
and ``--gpu-plan 1,1,...``; every job is ``true <its config.yaml>``, with its attempt
directory, config, log and exit.json written as for a real job. The others run ``true``.
A tool that is not installed is reported as such, not failed.

Every row starts cold (gpusched's ``submit`` starts its daemon, the first ``tsp`` its server)
except the two "warm" rows, whose daemon or server was started before the clock, as both stay
up between a user's nights: their "vs tsp" is against each other.

Two "floor" rows run gpusched's own per-job work without its scheduler (the same attempt
directories and wrapper, started by the same executors, refilled on the same FIFO pokes, but
no SQLite, placement or ticks): the gap between a floor and gpusched's row is the scheduler's
cost, and the floor itself is what the attempt-directory contract costs on this machine.

Besides the wall time, each row gives the machine's CPU over the run (``/proc/stat``: every
process, the tool's and its jobs', while the run lasted), a job's share of it, and how many
cores were busy on average. Where two tools spend the same CPU a job, the one that keeps more
cores busy finishes first; on a machine with few cores, one that spends more CPU cannot. For
gpusched the log line also splits it: the daemon's own, and its wrappers' (or the tmux
server's and its panes').
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import Sandbox, Span, Took, daemon_pid, machine, median, sandbox, table


def gpusched(backend: str, *, warm: bool = False, **extra: str) -> Callable[[int, int], Took]:
    """gpusched's row; ``warm``: its daemon started (``daemon start``) before the clock, as it
    runs on every night after a user's first (it stays up until ``daemon stop``)."""

    def run(n: int, slots: int) -> Took:
        with sandbox() as sb:
            sb.write_plan("noop", n)
            env = sb.env(GPUSCHED_FAKE_GPUS=f"{slots}x24GiB", **extra)
            if warm:
                sb.cli("daemon", "start", env=env)
            span = Span()
            plan = ",".join("1" * slots)
            sb.cli("submit", "--suite", "noop", "--gpu-plan", plan, "--backend", backend, env=env)
            took = span.took(sb.wait_all_done(n))
            bad = {k: v for k, v in sb.counts().items() if k != "succeeded"}
            if bad:
                raise RuntimeError(f"gpusched {backend}: not all jobs succeeded: {bad}")
            print(f"    gpusched ({backend}): {_ticks(sb, span.t0)}; {_cpu(sb, n, backend)}", file=sys.stderr)
            return took

    return run


def _cpu(sb: Sandbox, n: int, backend: str) -> str:
    """The CPU a job of the daemon and of what ran the jobs, from the kernel's count for each
        process (psutil's ``cpu_times``: its own user and system time, and its reaped children's).
        Plain processes: the wrappers are the runner's children (the daemon's own where no runner
        started them), so the runner's own time and its children's are given. tmux: the panes are
        the tmux server's, so its own time and its children's are given (with reused panes, the loops
    still running and their reaped wrappers' too). Read once every job is
        done: the daemon's start and first imports are in its figure."""
    import psutil

    def times(pid: int) -> tuple[float, float]:
        t = psutil.Process(pid).cpu_times()
        return t.user + t.system, t.children_user + t.children_system

    ms = lambda s: f"{1000 * s / n:.2f} ms"  # noqa: E731
    try:
        daemon = daemon_pid(sb)
        own, children = times(daemon)
        if backend != "tmux":
            runners = [p.pid for p in psutil.Process(daemon).children() if _is_runner(p)]
            if not runners:
                return f"CPU a job: daemon {ms(own)}, its wrappers {ms(children)}"
            runner, wrappers = times(runners[0])
            return f"CPU a job: daemon {ms(own)}, runner {ms(runner)}, its wrappers {ms(wrappers)}"
        sock = str(sb.home / "tmux.sock")
        pid = subprocess.run(["tmux", "-S", sock, "display", "-p", "#{pid}"], capture_output=True, text=True)
        server, panes = times(int(pid.stdout))
        for loop in psutil.Process(int(pid.stdout)).children():  # reused panes' loops still run
            panes += sum(times(loop.pid))
        return f"CPU a job: daemon {ms(own)}, tmux server {ms(server)}, its panes {ms(panes)}"
    except (OSError, ValueError, KeyError, psutil.Error):
        return "CPU not read"


def _is_runner(p: object) -> bool:
    import psutil

    try:
        return any(a.endswith("/runner.sh") for a in p.cmdline())  # type: ignore[attr-defined]
    except psutil.Error:  # (a wrapper of its own, ended, unreaped: GPUSCHED_RUNNER=0)
        return False


def _ticks(sb: Sandbox, t0: float) -> str:
    """When the first tick launched (after ``submit`` began at ``t0``: its own start and the
    daemon's), how many ticks launched the jobs, how many each, and how long a tick took (a
    tick stamps its launches with its own clock): few large ticks spread a tick's fixed cost
    thin, many small ones do not."""
    from collections import Counter

    per_tick = Counter(at for (at,) in sb.query("SELECT launched_at FROM attempts"))
    sizes = sorted(per_tick.values())
    starts = sorted(per_tick)
    periods = sorted(b - a for a, b in itertools.pairwise(starts))
    period = f", {1000 * periods[len(periods) // 2]:.1f} ms a tick at the median" if periods else ""
    return (
        f"first launch {starts[0] - t0:.3f} s after submit; {sum(sizes)} attempts launched in"
        f" {len(sizes)} ticks ({sizes[len(sizes) // 2]} a tick at the median, {sizes[0]}-{sizes[-1]}{period})"
    )


def floor(backend: str) -> Callable[[int, int], Took]:
    """gpusched's per-job work without its scheduler: each job's attempt directory written by
    ``attempt.materialize`` and started by the backend's own executor (``launch_many``), at
    most ``slots`` at a time, refilled as the wrappers poke a FIFO, just as the daemon is
    woken. No SQLite, no placement, no ticks: what the attempt directory and the wrapper
    cost on this machine, the part of gpusched's time no scheduling work can take away."""

    def run(n: int, slots: int) -> Took:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        import select

        from gpusched import attempt, plan, proc
        from gpusched.executors import LaunchRequest, launch_many
        from gpusched.executors.select import make_executor
        from gpusched.home import Home

        with sandbox() as sb:
            sb.write_plan("noop", n)
            home = Home(sb.home).ensure()
            wake = str(sb.root / "wake")
            os.mkfifo(wake)
            fd = os.open(wake, os.O_RDWR | os.O_NONBLOCK)
            span = Span()
            suite = plan.load_suite("noop", cwd=sb.project)
            ex = make_executor(backend, home)
            queue, running = list(suite.jobs), {}
            free = list(range(slots))
            while queue or running:
                proc.reap()
                for d in [d for d in running if os.path.exists(os.path.join(d, "exit.json"))]:
                    free.append(running.pop(d))
                reqs = []
                while queue and free:
                    job, gpu = queue.pop(0), free.pop()
                    paths = attempt.AttemptPaths.for_attempt(suite.logs_dir, job.name, 1, "A")
                    attempt.materialize(
                        paths, suite=suite, job=job, tier_index=0, attempt_n=1, gpu=gpu,
                        gpu_uuid=None, backend=backend, env_file=None,
                    )  # fmt: skip
                    running[paths.dir] = gpu
                    reqs.append(
                        LaunchRequest(
                            job_id=job.id,
                            suite=suite.name,
                            job_name=job.name,
                            token=f"{gpu}-{job.name}",
                            attempt_dir=paths.dir,
                            workdir=Path(suite.workdir),
                            env={"GPUSCHED_WAKE": wake},
                        )
                    )
                bad = [h for h in launch_many(ex, reqs) if isinstance(h, Exception)]
                if bad:
                    raise RuntimeError(f"floor ({backend}): {bad[0]}")
                if running and select.select([fd], [], [], 1.0)[0]:
                    with contextlib.suppress(BlockingIOError):
                        os.read(fd, 4096)  # the pokes since the last look: one read takes them all
            took = span.took()
            os.close(fd)
            return took

    return run


def tmux_alone(n: int, slots: int) -> Took:
    """A tmux window per job and nothing else: ``new-window 'true; echo >FIFO'``, a tick's
    windows in one tmux exec, at most ``slots`` open, refilled on the FIFO's pokes (one byte a
    job). No attempt directory, no wrapper, no log, no scheduler; each window closes when its
    job ends. What any tool that gives each job a tmux pane pays on this machine: the floor
    under gpusched's tmux row."""
    import select

    with sandbox() as sb:
        wake = str(sb.root / "wake")
        os.mkfifo(wake)
        fd = os.open(wake, os.O_RDWR | os.O_NONBLOCK)
        tm = ["tmux", "-S", str(sb.root / "tmux.sock"), "-f", "/dev/null"]
        env = {k: v for k, v in os.environ.items() if k != "TMUX"}
        subprocess.run([*tm, "new-session", "-d", "-s", "b", "sleep 3600"], env=env, check=True)
        try:
            span = Span()
            started = ended = 0
            while ended < n:
                k = min(slots - (started - ended), n - started)
                if k:
                    argv = list(tm)
                    for _ in range(k):
                        argv += ["new-window", "-d", "-t", "b:", f"true; echo >{wake}", ";"]
                    subprocess.run(argv[:-1], env=env, check=True, capture_output=True)
                    started += k
                if select.select([fd], [], [], 1.0)[0]:
                    with contextlib.suppress(BlockingIOError):
                        ended += len(os.read(fd, 65536))
            return span.took()
        finally:
            os.close(fd)
            subprocess.run([*tm, "kill-server"], env=env, capture_output=True, check=False)


def _tsp_binary() -> str | None:
    for name in ("tsp", "ts"):
        path = shutil.which(name)
        if path and "spooler" in subprocess.run([path, "-h"], capture_output=True, text=True).stdout.lower():
            return path
    return shutil.which("tsp")


def tsp(n: int, slots: int, *, warm: bool = False) -> Took:
    """task-spooler's row: its server started inside the clock (the first ``tsp`` call starts
    it), or, ``warm``, before it."""
    binary = _tsp_binary()
    with sandbox() as sb:
        env = {
            **os.environ,
            "TS_SOCKET": str(sb.root / "ts.sock"),
            "TMPDIR": str(sb.root),
            "TS_MAXFINISHED": str(n + 10),
        }
        try:
            if warm:
                subprocess.run([binary, "-S", str(slots)], env=env, check=True, capture_output=True)
            span = Span()
            subprocess.run([binary, "-S", str(slots)], env=env, check=True, capture_output=True)
            loop = f'i=0; while [ $i -lt {n} ]; do "$0" true >/dev/null; i=$((i+1)); done'
            subprocess.run(["sh", "-c", loop, binary], env=env, check=True)
            while True:
                out = subprocess.run([binary, "-l"], env=env, capture_output=True, text=True).stdout
                if sum(" finished " in line for line in out.splitlines()) >= n:
                    return span.took()
                time.sleep(0.005)
        finally:
            subprocess.run([binary, "-K"], env=env, capture_output=True, check=False)


def parallel(n: int, slots: int) -> Took:
    span = Span()
    subprocess.run(
        ["parallel", f"-j{slots}", "true"],
        input="\n".join(map(str, range(n))) + "\n",
        text=True,
        check=True,
        capture_output=True,
    )
    return span.took()


def simple_gpu_scheduler(n: int, slots: int) -> Took:
    argv = [sys.executable, "-m", "simple_gpu_scheduler.scheduler", "--gpus", *map(str, range(slots))]
    span = Span()
    subprocess.run(argv, input="true\n" * n, text=True, check=True, capture_output=True)
    return span.took()


TOOLS: dict[str, tuple[Callable[[int, int], Took], Callable[[], bool]]] = {
    "gpusched (subprocess)": (gpusched("subprocess"), lambda: True),
    "gpusched (tmux)": (gpusched("tmux"), lambda: bool(shutil.which("tmux"))),
    "gpusched (tmux, a window per job)": (
        gpusched("tmux", GPUSCHED_TMUX_PANES="job"),
        lambda: bool(shutil.which("tmux")),
    ),
    "floor: gpusched's files + wrapper, no scheduler (subprocess)": (floor("subprocess"), lambda: True),
    "floor: gpusched's files + wrapper, no scheduler (tmux)": (
        floor("tmux"),
        lambda: bool(shutil.which("tmux")),
    ),
    "floor: a tmux window per job, nothing else": (tmux_alone, lambda: bool(shutil.which("tmux"))),
    "task-spooler (tsp -S 16)": (tsp, lambda: _tsp_binary() is not None),
    "warm: gpusched (subprocess), its daemon already running": (
        gpusched("subprocess", warm=True),
        lambda: True,
    ),
    "warm: task-spooler, its server already running": (
        functools.partial(tsp, warm=True),
        lambda: _tsp_binary() is not None,
    ),
    "GNU parallel -j16": (parallel, lambda: bool(shutil.which("parallel"))),
    "simple-gpu-scheduler": (simple_gpu_scheduler, lambda: _has_module("simple_gpu_scheduler")),
}


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=1, help="rounds of every tool in turn; the median is shown")
    ap.add_argument("--only", help="comma-separated substrings of tool names to run")
    args = ap.parse_args(argv)
    results: dict[str, Took | str] = {}
    chosen: dict[str, Callable[[int, int], Took]] = {}
    for name, (fn, available) in TOOLS.items():
        if args.only and not any(s.strip() and s.strip() in name for s in args.only.split(",")):
            continue
        if available():
            chosen[name] = fn
        else:
            results[name] = "not installed"
    # Round by round, every tool once a round: a slow minute of a shared machine then slows one
    # run of each tool, not all of one tool's runs (single runs move by a quarter on some VMs).
    runs: dict[str, list[Took]] = {name: [] for name in chosen}
    for _ in range(args.repeat):
        for name, fn in chosen.items():
            runs[name].append(fn(args.jobs, args.slots))
    for name, took in runs.items():
        results[name] = Took(median([t.wall_s for t in took]), median([t.cpu_s for t in took]))
        walls = ", ".join(f"{t.wall_s:.2f}" for t in took)
        print(f"  {name}: {walls} s; CPU {', '.join(f'{t.cpu_s:.2f}' for t in took)} core-s", file=sys.stderr)
    results = {name: results[name] for name in TOOLS if name in results}  # the table in TOOLS' order
    ref = {k: v.wall_s for k, v in results.items() if isinstance(v, Took)}
    tsp_cold = next((v for k, v in ref.items() if k.startswith("task-spooler")), None)
    tsp_warm = next((v for k, v in ref.items() if k.startswith("warm: task-spooler")), None)
    par_t = next((v for k, v in ref.items() if k.startswith("GNU parallel")), None)
    rows = []
    for name, took in results.items():
        if isinstance(took, str):
            rows.append([name, took, "", "", "", "", ""])
            continue
        t = took.wall_s
        tsp_t = tsp_warm if name.startswith("warm:") else tsp_cold  # (warm against warm)
        rows.append(
            [
                name,
                f"{t:.2f}",
                f"{args.jobs / t:.0f}",
                f"{t / tsp_t:.2f}x" if tsp_t else "",
                f"{t / par_t:.2f}x" if par_t else "",
                f"{1000 * took.cpu_s / args.jobs:.2f}",
                f"{took.cpu_s / t:.2f}",
            ]
        )
    print(f"Dispatch: {args.jobs} no-op jobs over {args.slots} slots ({machine()})\n")
    print(table(["tool", "wall s", "jobs/s", "vs tsp", "vs parallel", "CPU ms a job", "cores busy"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
