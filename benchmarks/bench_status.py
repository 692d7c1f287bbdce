"""Status latency with a big store: ``gpusched status --json`` and plain ``gpusched status``,
wall time of the whole command (interpreter start included), median of several runs (the
commands taking turns).

    python benchmarks/bench_status.py [--jobs 10000] [--older 40] [--past-suites 1] [--runs 7]
                                      [--peaks] [--before DIR] [--keep] [--instructions]

The store is filled in-process (``Store.submit`` of one suite, then attempts through the
store's own transitions): most jobs queued, some succeeded, some failed (with an attempt
each), 14 running; beside them, ``--older`` jobs of a suite that ended three days earlier,
which plain ``status`` leaves out and names in one line; ``--past-suites K``: K such suites
(a store that kept many nights of suites: ``--jobs 200 --past-suites 245`` is 10,000 jobs in
246 suites, as a few months of 40-job nights leave it). ``--peaks``: every ended run reports
its peak GPU memory, as on a GPU, so the queued jobs' predictions read that history (the
suites' jobs are all one task: its whole history). The ended jobs' entries are then written
into the store as a daemon writes them within seconds of each end (gpusched.entries), and
status reads those rather than build them. No daemon runs; the probe is 16
fake GPUs, but for one more row of the plain ``status`` with the real NVML probe (what a
user's command loads; on a machine without a GPU it finds no driver and says so). ``--fields
id,state`` is the JSON a script that needs only those keys asks for. ``python -c pass`` and
``gpusched --version`` are timed too, as the floor any command pays. Besides wall time, the
table gives the command's own CPU time (user + system), steadier on a shared machine;
``--instructions`` adds each command's instruction count under valgrind's callgrind (one
more run each, ~50x slower, with a fixed hash seed): the same from run to run within ~1 %,
however busy the machine, so a change of a few percent shows.

Two rows ("no .pth files") run ``python -S`` with this interpreter's own ``sys.path`` (its
site-packages, and this checkout first) on ``PYTHONPATH``: the same modules, without the
``.pth`` files the interpreter runs at every start. On the VM the README's figures come from,
one of those is the sandbox's own (``_sandboxing_egress_ca.pth``, which imports certifi to
patch its CA bundle): ~30 ms of ``python -c pass``'s ~45 that no user's machine pays. What a
user's own ``.pth`` files cost depends on what they installed; the two rows set it apart.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import Sandbox, machine, median, sandbox, table


def fill(
    sb: Sandbox,
    n: int,
    *,
    succeeded: int,
    failed: int,
    running: int,
    name: str = "big",
    ago_s: float = 0.0,
    peaks: bool = False,
) -> None:
    """``n`` jobs of suite ``name``, with attempts for the first ``succeeded + failed + running``,
    submitted, run and ended as if ``ago_s`` seconds ago; ``peaks``: each ended run reports its
    peak GPU memory, as a run on a GPU does."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from gpusched import flags, plan
    from gpusched.home import this_host
    from gpusched.model import Classification, ExitRecord, Outcome, Step, StepKind
    from gpusched.store import NewAttempt, Store

    sb.write_plan(name, n, command="python train.py --config {config}")
    (sb.project / "train.py").touch()  # the script the command runs, which submit looks for
    suite = plan.load_suite(name, cwd=sb.project)
    sb.home.mkdir(parents=True, exist_ok=True)
    store = Store(sb.db)
    gplan = flags.parse_gpu_plan(",".join("1" * 16), gpus=None, detected=16)
    now = time.time() - ago_s
    store.submit(suite, gplan, backend="subprocess", cwd=str(sb.project), env_path=None, now=now - 900)
    ok = Classification(outcome=Outcome.OK, reason="exit 0")
    err = Classification(outcome=Outcome.ERROR, reason="exit 1", line="ValueError: bad label")
    for k, job in enumerate(suite.jobs[: succeeded + failed + running]):
        d = sb.project / "logs" / name / job.name / "1-A"
        d.mkdir(parents=True)
        (d / "output.log").write_text(f"step 10/100 loss 1.{k}\n")
        aid = store.begin_attempt(
            NewAttempt(
                job_id=job.id,
                tier=0,
                tier_name="A",
                gpu=k % 16,
                gpu_uuid=None,
                backend="subprocess",
                dir=str(d),
                token=f"{name}{k:015d}",
                placement_reason="bench",
                predicted_mib=4096,
                prediction_source="default",
            ),
            now=now - 600 + k * 0.01,
        )
        # this machine's, as a user's are: status scans the process table for stopped ones
        handle = {"pid": 1, "pid_started_at": 0.0, "host": this_host()}
        store.mark_running(aid, handle, now=now - 600 + k * 0.01)
        if k < succeeded + failed:
            bad = k >= succeeded
            rec = ExitRecord(
                exit_code=1 if bad else 0,
                started_at=now - 600 + k * 0.01,
                ended_at=now - 300,
                peak_mib=9000 + k % 500 if peaks else None,
            )
            store.finish_attempt(
                aid,
                exit=rec,
                result=err if bad else ok,
                step=Step(kind=StepKind.FAIL if bad else StepKind.DONE, tier=0, reason="bench"),
                now=now - 300,
            )
    # what the daemon does once a tick launched nothing (every 5 s at the least): an ended job's
    # status entry is in the store seconds after it ended (the fill is always this checkout's)
    store.write_entries(limit=None)
    store.close()


def timed_run(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float, str]:
    """Wall time and CPU time (user + system) of one run, and its output. CPU time is what the
    command itself spent: on a shared machine wall time also counts the waits for a core."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise RuntimeError(f"{argv} -> {r.returncode}: {r.stderr}")
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, r.stdout


def instructions(argv: list[str], env: dict[str, str], cwd: Path) -> int:
    """Instructions the command executes (callgrind's ``Collected``), hash seed fixed."""
    cg = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
    seeded = {**env, "PYTHONHASHSEED": "0"}
    r = subprocess.run([*cg, *argv], env=seeded, cwd=cwd, capture_output=True, text=True)
    found = re.search(r"Collected : (\d+)", r.stderr)
    if r.returncode != 0 or not found:
        raise RuntimeError(f"callgrind {argv} -> {r.returncode}: {r.stderr[-2000:]}")
    return int(found.group(1))


def without_pth_path() -> str:
    """``PYTHONPATH`` for ``python -S``: this checkout, then every folder of this interpreter's
    ``sys.path`` (where ``site`` put its site-packages and what their ``.pth`` files added),
    but this script's."""
    here = Path(__file__).resolve().parent
    folders = [p for p in sys.path if p and p != str(here) and Path(p).is_dir()]
    return ":".join(dict.fromkeys([str(here.parent), *folders]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument(
        "--older",
        type=int,
        default=40,
        help="jobs of a second suite, ended three days before the first: plain status leaves it out",
    )
    ap.add_argument(
        "--past-suites",
        type=int,
        default=1,
        help="how many suites of --older jobs each, all ended three days before the first",
    )
    ap.add_argument(
        "--peaks",
        action="store_true",
        help="every ended run reports its peak GPU memory, as on a GPU: the queued jobs' predictions"
        " then read that history (of one task: the suites' jobs are all of it)",
    )
    ap.add_argument(
        "--before",
        metavar="DIR",
        help="another checkout of gpusched (e.g. `git worktree add /tmp/before COMMIT`): its commands are"
        " timed too, in the same rounds and on the same store",
    )
    ap.add_argument(
        "--keep",
        action="store_true",
        help="keep the filled store and print its GPUSCHED_HOME and project folder (to profile against)",
    )
    ap.add_argument(
        "--instructions",
        action="store_true",
        help="also count each command's instructions under callgrind (needs valgrind)",
    )
    args = ap.parse_args(argv)
    with sandbox(keep=args.keep) as sb:
        t0 = time.perf_counter()
        if args.older:
            n = args.older
            for i in range(args.past_suites):
                name = "lastweek" + (str(i) if i else "")
                ago = 3 * 86400 + i
                fill(sb, n, succeeded=n - 2, failed=2, running=0, name=name, ago_s=ago, peaks=args.peaks)
        fill(sb, args.jobs, succeeded=args.jobs // 5, failed=args.jobs // 50, running=14, peaks=args.peaks)
        fill_s = time.perf_counter() - t0
        env = sb.env(GPUSCHED_FAKE_GPUS="16x24GiB", COLUMNS="160")
        real = {k: v for k, v in env.items() if k != "GPUSCHED_FAKE_GPUS"}
        gs = [sys.executable, "-m", "gpusched"]
        bare, gs_bare = {**env, "PYTHONPATH": without_pth_path()}, [sys.executable, "-S", "-m", "gpusched"]
        commands: dict[str, tuple[list[str], dict[str, str]]] = {
            "python -c pass (floor)": ([sys.executable, "-c", "pass"], env),
            "gpusched --version": ([*gs, "--version"], env),
            "gpusched status --json": ([*gs, "status", "--json"], env),
            "gpusched status --fields id,state": ([*gs, "status", "--fields", "id,state"], env),
            "gpusched status": ([*gs, "status"], env),
            "gpusched status, NVML probe": ([*gs, "status"], real),
            "python -S -c pass (floor, no .pth files)": ([sys.executable, "-S", "-c", "pass"], bare),
            "gpusched status --json, no .pth files": ([*gs_bare, "status", "--json"], bare),
            "gpusched status, no .pth files": ([*gs_bare, "status"], bare),
        }
        if args.before:  # first on PYTHONPATH: before the installed (or editable) gpusched, and
            # before the checkout a bare machine puts there, whose other folders (its wheels) stay
            path = [str(Path(args.before).resolve()), *filter(None, [env.get("PYTHONPATH")])]
            old = {**env, "PYTHONPATH": os.pathsep.join(path)}
            for label in ("gpusched --version", "gpusched status --json", "gpusched status"):
                commands[f"{label} (before)"] = (commands[label][0], old)
            real_old = {**real, "PYTHONPATH": old["PYTHONPATH"]}
            commands["gpusched status, NVML probe (before)"] = (commands["gpusched status"][0], real_old)
        walls: dict[str, list[float]] = {label: [] for label in commands}
        cpus: dict[str, list[float]] = {label: [] for label in commands}
        outs: dict[str, str] = {}
        for _ in range(args.runs):  # round robin: a burst of load elsewhere hits every command alike
            for label, (cmd, cmd_env) in commands.items():
                wall, cpu, outs[label] = timed_run(cmd, cmd_env, sb.project)
                walls[label].append(wall)
                cpus[label].append(cpu)
        rows = []
        for label, out in outs.items():
            lines = len(out.splitlines())
            size = f"{len(out) / 1024:.0f} KiB, {lines} line{'s' * (lines != 1)}" if out else ""
            rows.append(
                [label, f"{median(walls[label]) * 1000:.0f}", f"{median(cpus[label]) * 1000:.0f}", size]
            )
            if args.instructions:
                cmd, cmd_env = commands[label]
                rows[-1].append(f"{instructions(cmd, cmd_env, sb.project) / 1e6:.0f}")
    print(
        f"Status with {args.jobs} jobs in the store (and {args.older} of each of {args.past_suites} suite(s)"
        f" ended three days earlier{'; every ended run with a peak' if args.peaks else ''};"
        f" filled in {fill_s:.1f} s), median of {args.runs} runs "
        f"({machine()})\n"
    )
    heads = ["command", "wall ms", "cpu ms", "output"] + ["M instructions"] * args.instructions
    print(table(heads, rows))
    print("\naim: <= 150 ms; the plain table stays readable (rows capped, the rest summarised)")
    if args.keep:
        print(f"\nkept: GPUSCHED_HOME={sb.home} GPUSCHED_FAKE_GPUS=16x24GiB, run from {sb.project}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
