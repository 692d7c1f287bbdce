"""Shared fixtures: every test gets its own private GPUSCHED_HOME (state dir, tmux socket,
daemon), so tests never touch a user's real queue and never see each other's jobs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parent.parent

# CI (.ci/run sets HYPOTHESIS_PROFILE=ci) runs each property test on the same examples every time,
# drawn from the test itself, so that a red run is the change's and not the draw's. Local runs draw
# new examples every time: that is how counterexamples get found (stop 59 found two, each pinned
# since as an @example); `--hypothesis-seed=N` replays a draw.
settings.register_profile("ci", derandomize=True, database=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture
def gs_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private GPUSCHED_HOME; stops its daemon and tmux server afterwards."""
    home = tmp_path / "home"
    monkeypatch.setenv("GPUSCHED_HOME", str(home))
    monkeypatch.delenv("GPUSCHED_FAKE_GPUS", raising=False)
    monkeypatch.delenv("TMUX", raising=False)
    yield home
    _stop_daemon(home)
    sock = home / "tmux.sock"
    if sock.exists() and shutil.which("tmux"):
        subprocess.run(["tmux", "-S", str(sock), "kill-server"], capture_output=True, check=False)


def _stop_daemon(home: Path) -> None:
    env = {**os.environ, "GPUSCHED_HOME": str(home)}
    subprocess.run(
        [sys.executable, "-m", "gpusched", "daemon", "stop"],
        env=env,
        capture_output=True,
        check=False,
        timeout=60,
    )


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A scratch project directory with the shipped plans/ and launchers/ (as a user has)."""
    d = tmp_path / "project"
    d.mkdir()
    shutil.copytree(ROOT / "plans", d / "plans")
    shutil.copytree(ROOT / "launchers", d / "launchers")
    return d


@pytest.fixture
def cli(gs_home: Path):  # type: ignore[no-untyped-def]
    """``cli("status", "--json", cwd=...)`` runs the real CLI in a subprocess, as a user would."""
    return run_cli


def run_cli(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120, check: bool = False
) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a subprocess with the current (test) environment, reading
    /dev/null: as from a script, also where pytest runs in a terminal."""
    full_env = {**os.environ, **(env or {})}
    r = subprocess.run(
        [sys.executable, "-m", "gpusched", *args],
        cwd=cwd,
        env=full_env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and r.returncode != 0:
        raise AssertionError(f"gpusched {' '.join(args)} -> {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r
