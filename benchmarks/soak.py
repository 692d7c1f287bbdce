"""Soak: a suite of short jobs while the daemon is killed with SIGKILL again and again.

    python benchmarks/soak.py                      # 300 jobs, 30 kills (about 2-4 minutes on 2 cores)
    python benchmarks/soak.py --jobs 50 --kills 5  # what tests/integration/test_chaos.py runs

Drives gpusched as a user does: the real CLI in subprocesses, the real daemon, detached
processes (``--backend subprocess``; ``--backend tmux``, its panes as by default, and ``tmux-job``
or ``tmux-reuse``, GPUSCHED_TMUX_PANES=job or reuse, work too), the real
SQLite file, in a private GPUSCHED_HOME under a scratch directory that is deleted afterwards. Each job appends
its id to one shared file when it starts, so launches are counted from the jobs' own side
effects, not from what the store says. The daemon is killed at moments picked by a seeded
RNG (after a random number of launches, plus a random few milliseconds) and brought back
alternately by ``gpusched daemon start`` and by submitting the suite again.

Prints: jobs, kills, lost (attempts counted lost), duplicated (jobs that started more than
once), never ran, wrong final states, and what became of ``status --json``'s kept entries
(gpusched.entries): how many the daemons kept, how many are still due, how many differ from
what status builds (stale) and how many ended jobs have neither (lost); exit 0 only when lost,
duplicated, never ran, wrong final states, stale and lost entries are all 0.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

SUITE = "chaos"


@dataclass
class Report:
    jobs: int
    kills: int = 0
    restarts: int = 0
    seconds: float = 0.0
    lost: int = 0  # attempts counted lost (their command may have run)
    interrupted: int = 0  # launches interrupted before they started (requeued, not counted)
    duplicated: list[str] = field(default_factory=list)  # started more than once
    never_ran: list[str] = field(default_factory=list)
    wrong_final: list[str] = field(default_factory=list)  # not succeeded with exactly one ok attempt
    attempts: int = 0
    entries_kept: int = 0  # ended jobs' status --json entries the daemons kept
    entries_due: int = 0  # ended jobs whose entry is still to be written
    entries_stale: list[str] = field(default_factory=list)  # kept, but not what status builds
    entries_lost: list[str] = field(default_factory=list)  # ended, neither kept nor due

    @property
    def ok(self) -> bool:
        return not (
            self.lost
            or self.duplicated
            or self.never_ran
            or self.wrong_final
            or self.entries_stale
            or self.entries_lost
        )

    def text(self) -> str:
        return "\n".join(
            [
                f"jobs              {self.jobs}",
                f"kills             {self.kills}  (daemon SIGKILLed; restarts: {self.restarts})",
                f"attempts          {self.attempts}  ({self.interrupted} never started, requeued)",
                f"lost              {self.lost}",
                f"duplicated        {len(self.duplicated)}  {' '.join(self.duplicated[:5])}",
                f"never ran         {len(self.never_ran)}  {' '.join(self.never_ran[:5])}",
                f"wrong final state {len(self.wrong_final)}  {' '.join(self.wrong_final[:5])}",
                f"status entries    {self.entries_kept} kept, {self.entries_due} due,"
                f" {len(self.entries_stale)} stale, {len(self.entries_lost)} lost"
                f"  {' '.join((self.entries_stale + self.entries_lost)[:5])}",
                f"wall time         {self.seconds:.1f} s",
            ]
        )


def write_plan(project: Path, jobs: int, launches: Path, nap_s: float, gate: Path) -> None:
    """``jobs`` jobs named j000..; each appends $GPUSCHED_JOB_ID to ``launches``, then naps;
    the last one then waits for ``gate`` to exist, so that the suite cannot end before the
    last kill, however fast its other jobs run."""
    width = len(str(jobs - 1))
    last = f"{SUITE}/j{jobs - 1:0{width}d}"
    gated = shlex.quote(str(gate))
    wait = f'if [ "$GPUSCHED_JOB_ID" = {last} ]; then while [ ! -e {gated} ]; do sleep 0.05; done; fi'
    body = f'echo "$GPUSCHED_JOB_ID" >> {shlex.quote(str(launches))}; sleep {nap_s}; {wait}'
    plan = [
        "description: soak - every job records its own start",
        f"command: {json.dumps(f'sh -c {shlex.quote(body)} job {{config}}')}",
        "jobs:",
        *(f"  - name: j{i:0{width}d}" for i in range(jobs)),
    ]
    (project / "plans").mkdir(parents=True, exist_ok=True)
    (project / "plans" / f"{SUITE}.yaml").write_text("\n".join(plan) + "\n")


class Chaos:
    """One soak run in ``root`` (a private home and project)."""

    def __init__(self, root: Path, *, backend: str = "subprocess", gpus: int = 4, slots: int = 2) -> None:
        self.root = root
        self.home = root / "home"
        self.project = root / "project"
        self.launches = root / "launches.txt"
        self.gate = root / "gate"  # the last job ends once this exists: after the last kill
        self.backend, _, panes = backend.partition("-")  # tmux-job: tmux, GPUSCHED_TMUX_PANES=job
        self.plan = ",".join([str(slots)] * gpus)
        self.env = {k: v for k, v in os.environ.items() if k not in ("TMUX", "GPUSCHED_TMUX_PANES")}
        self.env.update(GPUSCHED_HOME=str(self.home), GPUSCHED_FAKE_GPUS=f"{gpus}x24GiB")
        if panes:
            self.env["GPUSCHED_TMUX_PANES"] = panes

    # ------------------------------------------------------------------ plumbing

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(
            [sys.executable, "-m", "gpusched", *args],
            cwd=self.project,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if r.returncode != 0:
            raise RuntimeError(f"gpusched {' '.join(args)} -> {r.returncode}: {r.stderr.strip()}")
        return r

    def submit(self) -> None:
        self.cli("submit", "--suite", SUITE, "--gpu-plan", self.plan, "--backend", self.backend)

    def started(self) -> int:
        try:
            return len(self.launches.read_text().split())
        except OSError:
            return 0

    def daemon_pid(self) -> int | None:
        """The running daemon's pid (checked: a live `gpusched daemon run`), else None."""
        try:
            pid = int(json.loads((self.home / "daemon.json").read_text())["pid"])
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return pid if b"daemon" in cmdline and b"run" in cmdline else None

    def counts(self) -> Counter[str]:
        with sqlite3.connect(f"file:{self.home / 'gpusched.db'}?mode=ro", uri=True, timeout=30) as db:
            return Counter(dict(db.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetchall()))

    # ------------------------------------------------------------------ the run

    def run(self, *, jobs: int, kills: int, seed: int, nap_s: float = 0.2, timeout_s: float = 300) -> Report:
        rng = random.Random(seed)
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        write_plan(self.project, jobs, self.launches, nap_s, self.gate)
        rep = Report(jobs=jobs)
        self.submit()
        # kill after these many launches (spread over the run), each plus a few random ms
        # (within the first 80 % of launches; the last job waits for the gate, so every kill
        # finds work left to do)
        points = sorted(rng.sample(range(1, max(2, jobs * 4 // 5)), min(kills, max(1, jobs * 4 // 5 - 1))))
        for i, point in enumerate(points):
            while self.started() < point and time.monotonic() < deadline:
                time.sleep(0.005)
            time.sleep(rng.uniform(0, 0.05))
            pid = self.daemon_pid()
            if pid is None:
                c = self.counts()
                if c["queued"] + c["running"]:
                    raise RuntimeError(f"no daemon, yet {c['queued']} jobs queued, {c['running']} running")
                break  # the suite is done: nothing left to disturb
            os.kill(pid, signal.SIGKILL)
            rep.kills += 1
            while Path(f"/proc/{pid}").exists() and _not_zombie(pid):
                time.sleep(0.005)
            if i % 2:
                self.submit()  # resubmitting is harmless and brings the daemon back
            else:
                self.cli("daemon", "start")
            c = self.counts()
            if self.daemon_pid() is None and c["queued"] + c["running"]:
                raise RuntimeError(f"the daemon did not come back after kill {rep.kills}")
            rep.restarts += 1
        self.gate.touch()
        while time.monotonic() < deadline:
            c = self.counts()
            if c["queued"] == 0 and c["running"] == 0:
                break
            time.sleep(0.05)
        rep.seconds = time.monotonic() - t0
        self.cli("daemon", "stop")
        self.check(rep)
        return rep

    def check(self, rep: Report) -> None:
        launched = Counter(line.split("/", 1)[1] for line in self.launches.read_text().split())
        with sqlite3.connect(f"file:{self.home / 'gpusched.db'}?mode=ro", uri=True, timeout=30) as db:
            jobs = db.execute(
                "SELECT name, state, lost FROM jobs WHERE suite = ? ORDER BY seq", (SUITE,)
            ).fetchall()
            attempts = db.execute(
                "SELECT j.name, a.outcome, a.reason FROM attempts a JOIN jobs j ON j.id = a.job_id"
                " WHERE j.suite = ?",
                (SUITE,),
            ).fetchall()
        ok_attempts = Counter(name for name, outcome, _ in attempts if outcome == "ok")
        rep.attempts = len(attempts)
        rep.interrupted = sum(
            1 for _, o, r in attempts if o == "lost" and (r or "").startswith("never started")
        )
        rep.lost = sum(lost for _, _, lost in jobs)
        for name, state, _ in jobs:
            if launched[name] > 1:
                rep.duplicated.append(name)
            if launched[name] == 0:
                rep.never_ran.append(name)
            if state != "succeeded" or ok_attempts[name] != 1:
                rep.wrong_final.append(f"{name}:{state}")
        if len(jobs) != rep.jobs:
            rep.wrong_final.append(f"{len(jobs)} jobs in the store, {rep.jobs} submitted")
        self.check_entries(rep)

    def check_entries(self, rep: Report) -> None:
        """``status --json``'s kept entries after the kills: each one what status builds for its
        job, text for text, and every ended job's either kept or marked due (triggers mark it in
        the transaction that ends the job; a daemon writes it later, or the next one does)."""
        from gpusched import status_rows
        from gpusched.entries import ENDED
        from gpusched.store import Store

        store = Store(self.home / "gpusched.db", readonly=True)
        try:
            if not store.entries_kept:  # (status would read none of them: nothing to compare)
                rep.entries_lost.append("(the store's entries are not this gpusched's)")
                return
            status_rows.show_tiers(store)
            now = time.time()
            built = status_rows.job_entries(store, now=now, predictions=())
            read = status_rows.job_entries(store, now=now, predictions=(), kept=True)
            pairs = zip(built, read, strict=True)
            rep.entries_stale = [json.loads(b)["id"] for (_, _, b), (_, _, r) in pairs if b != r]
            db = store.db
            rep.entries_kept = db.execute("SELECT COUNT(*) FROM ended_entries").fetchone()[0]
            rep.entries_due = db.execute("SELECT COUNT(*) FROM entries_due").fetchone()[0]
            rep.entries_lost = [
                row[0]
                for row in db.execute(
                    f"SELECT id FROM jobs j WHERE state IN {ENDED}"
                    " AND NOT EXISTS (SELECT 1 FROM ended_entries e WHERE e.seq = j.seq)"
                    " AND NOT EXISTS (SELECT 1 FROM entries_due d WHERE d.seq = j.seq)"
                )
            ]
        finally:
            store.close()


def _not_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=300)
    ap.add_argument("--kills", type=int, default=30)
    ap.add_argument("--seed", type=int, default=20261121)
    ap.add_argument("--nap", type=float, default=0.2, help="seconds each job sleeps")
    ap.add_argument(
        "--backend", default="subprocess", choices=["subprocess", "tmux", "tmux-job", "tmux-reuse"]
    )
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory and print its path")
    args = ap.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="gpusched-soak-"))
    chaos = Chaos(root, backend=args.backend)
    try:
        rep = chaos.run(
            jobs=args.jobs, kills=args.kills, seed=args.seed, nap_s=args.nap, timeout_s=args.timeout
        )
    finally:
        if args.backend.startswith("tmux"):
            subprocess.run(["tmux", "-S", str(chaos.home / "tmux.sock"), "kill-server"], capture_output=True)
        if not args.keep:
            import shutil

            shutil.rmtree(root, ignore_errors=True)
    print(
        f"soak: seed {args.seed}, backend {args.backend}, {args.nap} s per job"
        + (f", kept {root}" * args.keep)
    )
    print(rep.text())
    return 0 if rep.ok else 1


if __name__ == "__main__":
    sys.exit(main())
