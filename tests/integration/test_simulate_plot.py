"""`gpusched simulate --plot`: the "what if" night drawn like a real one (`report --plot`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_cli

pytest.importorskip("matplotlib")


def test_simulate_draws_the_same_timeline_as_report(gs_home: Path, project: Path, tmp_path: Path) -> None:
    out = tmp_path / "whatif.png"
    r = run_cli("simulate", "--suite", "E1", "--gpu-plan", "2,2,2,2,1,1,1", "--plot", str(out), cwd=project)
    assert r.returncode == 0, r.stderr
    assert "gpusched memory-aware" in r.stdout
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert (
        not (gs_home / "gpusched.db").exists() or "E1" not in run_cli("status", "--json", cwd=project).stdout
    )


def test_simulate_plot_with_a_bad_extension_is_one_line(gs_home: Path, project: Path, tmp_path: Path) -> None:
    r = run_cli(
        "simulate", "--suite", "E1", "--gpu-plan", "2", "--plot", str(tmp_path / "x.gif"), cwd=project
    )
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_simulate_plot_to_a_path_that_cannot_be_written_is_one_line(
    gs_home: Path, project: Path, tmp_path: Path
) -> None:
    """A folder that is a file (or a read-only or full disk): one line naming the path, exit 2,
    as `report --plot` says it; not a traceback after the night was simulated."""
    (tmp_path / "a-file").write_text("")
    out = tmp_path / "a-file" / "whatif.png"
    r = run_cli("simulate", "--suite", "E1", "--gpu-plan", "2", "--plot", str(out), cwd=project)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"gpusched: --plot {out}: cannot write it") and "give another path" in line
