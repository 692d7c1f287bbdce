"""Where the daemon's time goes while it dispatches a burst of no-op jobs: the real daemon
(``gpusched daemon run``) under py-spy, the real backend, one ``submit``; then a table of the
functions by the share of samples they were on the stack for (inclusive) and at its top (own).

    python benchmarks/profile_dispatch.py [--jobs 2000] [--slots 16] [--backend subprocess]
                                          [--rate 500] [--raw FILE] [--top 40]

py-spy samples the daemon ``--rate`` times a second (on CPU only: a daemon waiting in
``select`` for a job to end is not counted). ``bench_tick.py --ends 16`` is the same tick without
the processes, on the same machine: the two side by side say what the processes cost the tick.
Needs ``py-spy`` on PATH (``pip install py-spy``) and the right to trace a child (root, or
``ptrace_scope`` 0 or 1).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import machine, sandbox, table
from bench_dispatch import _ticks


def frames(raw: Path) -> tuple[int, Counter[str], Counter[str]]:
    """(samples, inclusive, own) from py-spy's raw (collapsed) output: one line per stack,
    ``frame;frame;... COUNT``, a frame ``function (path:line)``, counted once a stack."""
    total, incl, own = 0, Counter[str](), Counter[str]()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        total += n
        names = [_name(f) for f in stack.split(";")]
        for name in set(names):
            incl[name] += n
        own[names[-1]] += n
    return total, incl, own


def _name(frame: str) -> str:
    """``tick (gpusched/scheduler.py:186)`` -> ``tick (scheduler.py)``."""
    func, _, where = frame.partition(" (")
    return f"{func} ({where.rsplit(':', 1)[0].rsplit('/', 1)[-1]})" if where else func


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--backend", default="subprocess")
    ap.add_argument("--rate", type=int, default=500)
    ap.add_argument("--raw", type=Path, help="keep py-spy's raw stacks in this file")
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args(argv)
    spy = shutil.which("py-spy")
    if spy is None:
        print("profile_dispatch: py-spy is not on PATH (pip install py-spy)", file=sys.stderr)
        return 2
    with sandbox() as sb:
        sb.write_plan("noop", args.jobs)
        env = sb.env(GPUSCHED_FAKE_GPUS=f"{args.slots}x24GiB")
        raw = args.raw or sb.root / "daemon.raw"
        daemon = [sys.executable, "-m", "gpusched", "daemon", "run"]
        rec = [spy, "record", "-r", str(args.rate), "-f", "raw", "-o", str(raw), "--", *daemon]
        log = open(sb.root / "daemon.log", "w+")  # noqa: SIM115  (a pipe would fill with its log and stop it)
        spied = subprocess.Popen(rec, env=env, cwd=sb.project, stdout=log, stderr=subprocess.STDOUT)
        info = sb.home / "daemon.json"
        deadline = time.monotonic() + 60
        while not (info.exists() and json.loads(info.read_text() or "{}").get("ready")):
            if spied.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                print(f"profile_dispatch: the daemon did not start: {log.read()[-2000:]}", file=sys.stderr)
                return 1
            time.sleep(0.01)
        t0 = time.time()
        plan = ",".join("1" * args.slots)
        sb.cli("submit", "--suite", "noop", "--gpu-plan", plan, "--backend", args.backend, env=env)
        wall = sb.wait_all_done(args.jobs) - t0
        timeline = _ticks(sb, t0)
        sb.cli("daemon", "stop", env=env, check=False)
        spied.wait(timeout=120)
        log.close()
        total, incl, own = frames(raw)
    print(
        f"Daemon profile: {args.jobs} no-op jobs over {args.slots} slots, {args.backend} backend, "
        f"{wall:.2f} s ({machine()}); {total} samples at {args.rate}/s"
    )
    print(f"{timeline}\n")
    rows = [
        [name, f"{100 * n / total:.1f}", f"{100 * own[name] / total:.1f}"] for name, n in incl.most_common()
    ]
    rows = [
        r
        for r in rows
        if not r[0].startswith(("<module>", "_run_", "main (cli", "cmd_daemon", "run (daemon"))
    ]
    print(table(["function (file)", "% on the stack", "% own"], rows[: args.top]))
    print("\nown time, the most:")
    print(
        table(["function (file)", "% own"], [[k, f"{100 * v / total:.1f}"] for k, v in own.most_common(15)])
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
