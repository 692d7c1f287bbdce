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
from pathlib import Path

import pytest

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
    # (rep.ok: no kept entry stale, none lost; and the daemons did keep some, or stale proves nothing)
    assert rep.entries_kept > 0 and rep.entries_kept + rep.entries_due == 50, rep.text()
