"""Chaos: 50 short jobs while the daemon is killed with SIGKILL ten times at seeded random
moments and brought back (alternately `gpusched daemon start` and a repeated `submit`).
Every job must end exactly once: succeeded, exactly one successful attempt, started exactly
once by its own account (each job appends its id to a shared file), nothing counted lost.
And `status --json` stays true: no kept entry of an ended job is stale, however the kills fell
between a job's end and its entry's write, and every entry still owed is marked due.

The driver is benchmarks/soak.py (the same run at a larger scale prints its figures).
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpusched import status_rows
from gpusched.store import Store

ROOT = Path(__file__).resolve().parents[2]


def _soak():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("gpusched_soak", ROOT / "benchmarks" / "soak.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "backend",
    [
        "subprocess",
        pytest.param("tmux", marks=pytest.mark.skipif(not shutil.which("tmux"), reason="no tmux")),
        pytest.param("tmux-job", marks=pytest.mark.skipif(not shutil.which("tmux"), reason="no tmux")),
    ],
)
def test_every_job_ends_exactly_once_while_the_daemon_is_killed(tmp_path: Path, backend: str) -> None:
    soak = _soak()
    chaos = soak.Chaos(tmp_path, backend=backend)
    try:
        rep = chaos.run(jobs=50, kills=10, seed=11, nap_s=0.5, timeout_s=90)  # long enough for 10 kills
    finally:
        subprocess.run(
            [sys.executable, "-m", "gpusched", "daemon", "stop"], env=chaos.env, capture_output=True
        )
        if backend.startswith("tmux"):
            subprocess.run(["tmux", "-S", str(chaos.home / "tmux.sock"), "kill-server"], capture_output=True)
    print(rep.text())
    assert rep.kills == 10 and rep.restarts == 10
    assert rep.ok, rep.text()
    assert rep.attempts >= 50
    _entries_are_true(chaos.home / "gpusched.db", jobs=50)


def _entries_are_true(db: Path, *, jobs: int) -> None:
    """What the killed daemons kept is what status builds, job for job, and what they owe is
    due: one more write (the next daemon's) keeps every ended job's entry, all still equal."""
    store = Store(db)
    try:
        for _ in range(2):
            status_rows.show_tiers(store)
            now = time.time()
            built = [e for _, _, e in status_rows.job_entries(store, now=now, predictions=())]
            read = [e for _, _, e in status_rows.job_entries(store, now=now, predictions=(), kept=True)]
            assert read == built
            store.write_entries(limit=None)
        assert store.db.execute("SELECT COUNT(*) FROM ended_entries").fetchone()[0] == jobs
    finally:
        store.close()
