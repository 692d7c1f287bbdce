"""The report's numbers on hand-made rows: lanes, busy fraction, occupancy, lost GPU-hours,
peaks, tiers finished at; and the layering (no matplotlib/rich at import)."""

from __future__ import annotations

import csv
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusched import report
from gpusched.report import Attempt, Job, Sample, assign_lanes, compute, union_s

T0 = 1_700_000_000.0
ROOT = Path(__file__).resolve().parents[2]


def att(
    job: str, n: int, tier: str, gpu: int | None, start: float, end: float | None, outcome: str | None, **kw
) -> Attempt:  # type: ignore[no-untyped-def]
    return Attempt(
        job=job,
        n=n,
        tier=tier,
        gpu=gpu,
        start=T0 + start,
        end=None if end is None else T0 + end,
        outcome=outcome,
        **kw,
    )


# A night on two GPUs, plan 2,1 (GPU 0 has two slots), 1 hour of wall time:
#   big:   A oom 0-600 on GPU 0, B oom 600-1200 on GPU 0, C ok 1200-3600 on GPU 0
#   small: A ok 0-1800 on GPU 0 (second slot), then nothing
#   bad:   A error 0-300 on GPU 1 -> failed
#   res:   A lost 300-900 on GPU 1, resumed by B ok 900-2400 on GPU 1
NIGHT = [
    att("S/big", 1, "A", 0, 0, 600, "oom"),
    att("S/big", 2, "B", 0, 600, 1200, "oom"),
    att("S/big", 3, "C", 0, 1200, 3600, "ok", peak_mib=20000),
    att("S/small", 1, "A", 0, 0, 1800, "ok", peak_mib=3000),
    att(
        "S/bad", 1, "A", 1, 0, 300, "error", reason="exited 1", line="ValueError: no labels", log="/l/bad.log"
    ),
    att("S/res", 1, "A", 1, 300, 900, "lost"),
    att("S/res", 2, "B", 1, 900, 2400, "ok", resumed=True, peak_mib=8000),
]
JOBS = [
    Job(id="S/big", state="succeeded"),
    Job(id="S/small", state="succeeded"),
    Job(id="S/bad", state="failed", reason="error: exited 1", line="ValueError: no labels"),
    Job(id="S/res", state="succeeded"),
    Job(id="S/never", state="cancelled"),
]


@pytest.fixture
def rep() -> report.SuiteReport:
    samples = [
        Sample(at=T0 + 100, gpu=1, used_mib=9000, total_mib=24576),
        Sample(at=T0 + 9999, gpu=1, used_mib=1),
    ]
    return compute(NIGHT, jobs=JOBS, samples=samples, slots={0: 2, 1: 1}, suite="S")


def test_counts_tiers_and_wall(rep: report.SuiteReport) -> None:
    assert rep.wall_s == 3600
    assert rep.states == {"succeeded": 3, "failed": 1, "cancelled": 1}
    assert rep.outcomes == {"ok": 3, "oom": 2, "error": 1, "lost": 1}
    assert rep.finished_at == {"A": 2, "B": 1, "C": 1}  # bad failed at A, small ok at A
    assert rep.attempts_per_job == {0: 1, 1: 2, 2: 1, 3: 1}
    jobs = {j.id: j for j in rep.jobs}
    assert jobs["S/big"].path == "A:oom > B:oom > C:ok" and jobs["S/big"].tier == "C"
    assert jobs["S/big"].span_s == 3600 and jobs["S/never"].attempts == 0
    assert [j.id for j in rep.slowest(2)] == ["S/big", "S/res"]
    assert [(j.id, j.log, j.line) for j in rep.failing] == [("S/bad", "/l/bad.log", "ValueError: no labels")]


def test_gpu_hours_and_lost_hours(rep: report.SuiteReport) -> None:
    used_s = 600 + 600 + 2400 + 1800 + 300 + 600 + 1500
    assert rep.gpu_hours == pytest.approx(used_s / 3600)
    # the two OOMs and the error are lost; the lost attempt of res was resumed by its next one
    assert rep.lost_gpu_hours == pytest.approx((600 + 600 + 300) / 3600)
    assert [a.lost for a in rep.attempts if a.job == "S/res"] == [False, False]


def test_busy_fraction_occupancy_and_peak(rep: report.SuiteReport) -> None:
    g0, g1 = rep.gpus
    assert (g0.gpu, g0.slots, g0.lanes, g0.attempts) == (0, 2, 2, 4)
    assert g0.busy_fraction == pytest.approx(1.0)
    assert g0.occupancy == pytest.approx((3600 + 1800) / (2 * 3600))
    assert g1.busy_fraction == pytest.approx(2400 / 3600)
    assert g1.occupancy == pytest.approx(2400 / 3600)
    assert (g0.peak_mib, g0.peak_source) == (20000, "attempt")
    assert (g1.peak_mib, g1.peak_source, g1.total_mib) == (
        9000,
        "sampled",
        24576,
    )  # sample outside the night ignored


def test_util_is_the_cards_while_it_ran_the_suite_and_each_attempts_while_it_ran() -> None:
    """The seeds' "half-empty GPU" is two numbers of one card: compute near 100 % with memory
    at a third, or compute idling (jobs waiting on their data). A GPU's util is the mean of
    the daemon's samples taken while it ran one of the suite's attempts, not while it idled;
    an attempt's, those taken on its GPU while it ran; none taken there, none shown."""
    from gpusched.report_render import render_report

    def at(t: float, gpu: int, util: int | None) -> Sample:
        return Sample(at=T0 + t, gpu=gpu, used_mib=1000, util_pct=util)

    samples = [
        at(100, 1, 40),  # bad runs (0-300)
        at(450, 1, 90),  # res's first attempt (300-900)
        at(1000, 1, 80),  # res's second (900-2400)
        at(2000, 1, None),  # a read that failed
        at(3000, 1, 0),  # GPU 1 idle after 2400: not its util
        at(500, 0, 99),
        at(2000, 0, 97),
    ]
    rep = compute(NIGHT, jobs=JOBS, samples=samples, slots={0: 2, 1: 1}, suite="S")
    assert [(g.gpu, g.util_pct) for g in rep.gpus] == [(0, 98), (1, 70)]  # (40 + 90 + 80) / 3
    by = {(a.job, a.n): a.util_pct for a in rep.attempts}
    assert (by[("S/bad", 1)], by[("S/res", 1)], by[("S/res", 2)]) == (40, 90, 80)
    assert (by[("S/big", 1)], by[("S/big", 3)], by[("S/small", 1)]) == (99, 97, 99)  # small: 0-1800
    assert by[("S/big", 2)] is None  # 600-1200 on GPU 0: no sample taken then
    assert {d["job"]: d["util_pct"] for d in report.attempt_records(rep) if d["attempt"] == 2}["S/res"] == 80
    from rich.console import Console

    console = Console(width=160, record=True)
    console.print(render_report(rep, top=3))
    gpu_rows = [ln for ln in console.export_text().splitlines() if ln.startswith(("│ 0 ", "│ 1 "))]
    assert ["98 %" in gpu_rows[0], "70 %" in gpu_rows[1]] == [True, True]
    assert compute(NIGHT, jobs=JOBS, suite="S").gpus[0].util_pct is None  # no samples: no util


def test_lanes_on_a_gpu_never_overlap(rep: report.SuiteReport) -> None:
    small = next(a for a in rep.attempts if a.job == "S/small")
    big = [a.lane for a in rep.attempts if a.job == "S/big"]
    assert small.lane != big[0] and len(set(big)) == 1  # big's attempts follow each other in one lane


def test_a_running_attempt_counts_up_to_now_and_is_not_lost() -> None:
    rows = [att("S/a", 1, "A", 0, 0, 100, "oom"), att("S/a", 2, "B", 0, 100, None, None)]
    r = compute(rows, now=T0 + 400)
    assert r.wall_s == 400 and r.outcomes == {"oom": 1, "running": 1}
    assert r.gpu_hours == pytest.approx(400 / 3600) and r.lost_gpu_hours == pytest.approx(100 / 3600)
    assert r.states == {"running": 1} and r.finished_at == {}


def test_rows_as_plain_mappings_and_store_like_objects() -> None:
    rows = [
        {
            "job_id": "S/x",
            "n": 1,
            "tier_name": "A",
            "gpu": 0,
            "launched_at": T0,
            "started_at": T0 + 1,
            "ended_at": T0 + 11,
            "outcome": "ok",
            "peak_mib": 100,
            "dir": "/l/S/x/1-A",
        },
        {"job": "S/y", "attempt": 1, "tier": "B", "gpu": 0, "start": T0, "end": T0 + 5, "outcome": "oom"},
    ]
    r = compute(rows)
    x, y = sorted(r.attempts, key=lambda a: a.job)
    assert (x.start, x.duration_s, x.log, x.tier) == (T0 + 1, 10, "/l/S/x/1-A/output.log", "A")
    assert (y.tier, y.lost, y.lane) == ("B", True, 0) and x.lane == 1
    assert {j.id: j.state for j in r.jobs} == {"S/y": "failed", "S/x": "succeeded"}


def test_empty_report() -> None:
    r = compute([], jobs=[Job(id="S/q", state="queued")])
    assert (r.wall_s, r.gpu_hours, r.attempts, r.gpus, r.start) == (0.0, 0.0, (), (), None)


def test_attempt_records_have_the_columns(rep: report.SuiteReport, tmp_path: Path) -> None:
    from gpusched.report_render import write_csv, write_json

    assert write_csv(rep, str(tmp_path / "a.csv")) == len(NIGHT)
    with open(tmp_path / "a.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == list(report.COLUMNS) and len(rows) == len(NIGHT)
    write_json(rep, str(tmp_path / "a.json"))
    doc = json.loads((tmp_path / "a.json").read_text())
    assert len(doc) == len(NIGHT) and all(list(d) == list(report.COLUMNS) for d in doc)
    bad = next(d for d in doc if d["job"] == "S/bad")
    assert (bad["outcome"], bad["duration_s"], bad["lost"], bad["gpu"], bad["log"]) == (
        "error",
        300,
        True,
        1,
        "/l/bad.log",
    )
    assert bad["start"].startswith("2023-11-14T22:13:20") and bad["end_ts"] == T0 + 300


def test_render_report_mentions_the_numbers(rep: report.SuiteReport) -> None:
    from rich.console import Console

    from gpusched.report_render import render_report

    console = Console(width=160, record=True)
    console.print(render_report(rep, top=3))
    text = console.export_text()
    for needle in (
        "3 succeeded",
        "2 oom",
        "finished at tier: A 2, B 1, C 1",
        "2.17 GPU-h used",
        "0.42 GPU-h lost",
        "Still failing",
        "ValueError: no labels",
        "/l/bad.log",
        "75 %",
    ):
        assert needle in text, needle


# --------------------------------------------------------------------------- properties

intervals = st.lists(
    st.tuples(st.integers(0, 100), st.integers(1, 50)).map(lambda t: (float(t[0]), float(t[0] + t[1]))),
    max_size=30,
)


def test_gpu_time_writes_a_part_in_the_unit_of_its_whole() -> None:
    """The summary's "used, lost" pair read "0.1 GPU-min used, 0.00 GPU-h lost": the lost
    part is now written in the unit of what was used."""
    from gpusched.report_render import gpu_time

    assert (gpu_time(0.002), gpu_time(0.0), gpu_time(0.5), gpu_time(12.0)) == (
        "0.1 GPU-min",
        "0.00 GPU-h",
        "0.50 GPU-h",
        "12.0 GPU-h",
    )
    assert gpu_time(0.0, like=0.002) == "0.0 GPU-min"
    assert gpu_time(0.05, like=2.0) == "0.05 GPU-h"


@given(intervals)
def test_lanes_are_disjoint_and_as_few_as_the_peak_overlap(iv: list[tuple[float, float]]) -> None:
    lanes = assign_lanes(iv)
    for k in set(lanes):
        mine = sorted(i for i, lane in zip(iv, lanes, strict=True) if lane == k)
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(mine))
    peak = max((sum(s <= t < e for s, e in iv) for t, _ in iv), default=0)
    assert len(set(lanes)) == (max(peak, 1) if iv else 0)


@given(intervals)
def test_union_is_bounded_by_span_and_sum(iv: list[tuple[float, float]]) -> None:
    u = union_s(iv)
    assert u <= sum(e - s for s, e in iv) + 1e-9
    if iv:
        assert u <= max(e for _, e in iv) - min(s for s, _ in iv) + 1e-9


# --------------------------------------------------------------------------- layering


def test_report_and_status_do_not_import_matplotlib_or_rich(tmp_path: Path) -> None:
    code = (
        "import sys, gpusched, gpusched.report, gpusched.report_render, gpusched.plot, gpusched.cli\n"
        "assert 'matplotlib' not in sys.modules and 'rich' not in sys.modules, sorted(sys.modules)\n"
        "from gpusched.cli import main\n"
        "main(['status'])\n"
        "assert 'matplotlib' not in sys.modules\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "GPUSCHED_FAKE_GPUS"}
    env["GPUSCHED_HOME"] = str(tmp_path / "home")
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
