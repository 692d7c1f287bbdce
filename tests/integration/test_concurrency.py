"""Concurrent clients: 8 processes submit a 50-job suite each at the same instant on a fresh
state home (so they also race to create the database and start the daemon), while
`status --json` runs in a loop and a `cancel` lands in the middle. 400 jobs, and every
command must succeed: no "database is locked", no traceback, nothing lost, nothing run twice.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

from gpusched.store import Store

SUITES = 8
JOBS = 50


def _cli(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "gpusched", *args],
        cwd=cwd,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


@pytest.mark.timeout(150)
def test_eight_clients_submit_400_jobs_at_once_while_status_and_cancel_run(
    gs_home: Path, project: Path, tmp_path: Path
) -> None:
    launches = tmp_path / "launches.txt"
    launches.touch()
    body = f'echo "$GPUSCHED_JOB_ID" >> {launches}'
    for s in range(SUITES):
        doc = {
            "command": f"sh -c '{body}' job {{config}}",
            "jobs": [{"name": f"j{i:02d}"} for i in range(JOBS)],
        }
        (project / "plans" / f"c{s}.yaml").write_text(yaml.safe_dump(doc))
    env = {**os.environ, "GPUSCHED_FAKE_GPUS": "4x24GiB"}
    failures: list[str] = []
    done = threading.Event()
    statuses = {"n": 0}

    def check(name: str, p: subprocess.Popen[str]) -> str:
        out, err = p.communicate(timeout=120)
        if p.returncode != 0 or err.strip():
            failures.append(f"{name}: exit {p.returncode}: {err.strip()[-500:]}")
        return out

    def status_loop() -> None:
        while not done.is_set():
            out = check("status", _cli("status", "--json", cwd=project, env=env))
            try:
                json.loads(out)
            except ValueError:
                failures.append(f"status printed no JSON: {out[:200]!r}")
            statuses["n"] += 1

    watcher = threading.Thread(target=status_loop)
    watcher.start()
    try:
        submits = {
            s: _cli(
                "submit",
                "--suite",
                f"c{s}",
                "--gpu-plan",
                "2,2,2,2",
                "--backend",
                "subprocess",
                cwd=project,
                env=env,
            )
            for s in range(SUITES)
        }
        check("submit c7", submits.pop(7))
        cancel = _cli("cancel", "--suite", "c7", cwd=project, env=env)  # while the other submits still run
        for s, p in submits.items():
            check(f"submit c{s}", p)
        check("cancel c7", cancel)
        store = Store(gs_home / "gpusched.db")
        deadline = time.monotonic() + 100
        while time.monotonic() < deadline:
            c = store.counts()
            if c["queued"] == 0 and c["running"] == 0:
                break
            time.sleep(0.1)
        # at least three statuses, the first begun with the submits (a loaded machine may
        # queue all 400 jobs within two of them)
        deadline = time.monotonic() + 60
        while statuses["n"] < 3 and not failures and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        done.set()
        watcher.join()

    assert failures == [], "\n".join(failures)
    assert statuses["n"] >= 3
    jobs = store.jobs()
    assert len(jobs) == SUITES * JOBS
    started = Counter(launches.read_text().split())
    assert max(started.values(), default=0) == 1, [j for j, n in started.items() if n > 1]
    for j in jobs:
        oks = sum(a.outcome == "ok" for a in store.attempts(j.id))
        if j.suite == "c7":  # cancelled while queued, or ran before the cancel landed
            assert j.state.value in ("cancelled", "succeeded"), j
            assert started[j.id] == oks == (j.state.value == "succeeded") or j.state.value == "cancelled"
        else:
            assert j.state.value == "succeeded" and oks == 1 and started[j.id] == 1, j
    assert sum(j.state.value == "succeeded" for j in jobs) >= (SUITES - 1) * JOBS
    assert store.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
