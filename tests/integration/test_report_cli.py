"""`gpusched report` over a store filled by a REAL run: a small demo suite through the CLI
(subprocess backend, 2 fake GPUs), with a job that OOMs at tiers A and B and succeeds at C,
and a job that fails for good. One run per module; every test reads its results."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import sys
import textwrap
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpusched import memwatch, report
from gpusched.store import Store
from tests.conftest import ROOT, _stop_daemon, run_cli

PLAN = """
command: python launchers/demo_job.py --config {config}
workdir: ..
base_config: launchers/configs/demo_base.yaml
config: {max_steps: 6, step_time_s: 0.05, fake_gpu_mib: 12288, batch_size: 8, logits_to_keep: 0}
matrix:
  seed: [1, 2]
  task: [sst2]
job:
  name: "{seed}-{task}"
  task: "{task}"
  config: {seed: "{seed}", data: "{task}", output_dir: "outputs/{task}/s{seed}"}
jobs:
  - name: big
    task: mnli
    priority: 1
    config: {batch_size: 96, output_dir: outputs/mnli/big}
  - name: broken
    task: broken
    config: {fail_with: "ValueError: label column missing", output_dir: outputs/broken}
resume: {flag_key: is_keep_training}
"""


@dataclass
class Night:
    project: Path
    env: dict[str, str]
    home: Path

    def cli(self, *args: str):  # type: ignore[no-untyped-def]
        return run_cli(*args, cwd=self.project, env={**self.env, "COLUMNS": "200"})


@pytest.fixture(scope="module")
def night(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Night]:
    base = tmp_path_factory.mktemp("night")
    project, home = base / "project", base / "home"
    (project / "plans").mkdir(parents=True)
    import shutil

    shutil.copytree(ROOT / "launchers", project / "launchers")
    (project / "plans" / "t.yaml").write_text(textwrap.dedent(PLAN))
    n = Night(project=project, env={"GPUSCHED_HOME": str(home), "GPUSCHED_FAKE_GPUS": "2x24GiB"}, home=home)
    try:
        r = n.cli("submit", "--suite", "t", "--gpu-plan", "2,1", "--backend", "subprocess")
        assert r.returncode == 0, r.stderr
        w = n.cli("wait", "--suite", "t", "--timeout", "120", "--quiet")
        assert "3 succeeded, 1 failed" in w.stdout, w.stdout + w.stderr
        yield n
    finally:
        _stop_daemon(home)


@pytest.fixture(scope="module")
def rep(night: Night) -> report.SuiteReport:
    store = Store(night.home / "gpusched.db")
    try:
        return report.from_store(store, "t")
    finally:
        store.close()


def test_the_numbers_of_a_real_night(rep: report.SuiteReport) -> None:
    assert rep.states == {"succeeded": 3, "failed": 1}
    assert rep.outcomes == {"ok": 3, "oom": 2, "error": 1}
    assert rep.finished_at == {"A": 3, "C": 1}  # broken failed at A; big got through at C
    jobs = {j.id: j for j in rep.jobs}
    assert (jobs["t/big"].attempts, jobs["t/big"].tier, jobs["t/big"].path) == (
        3,
        "C",
        "A:oom > B:oom > C:ok",
    )
    assert rep.attempts_per_job == {1: 3, 3: 1}
    assert rep.gpu_hours > 0 and rep.wall_s > 0
    # the OOMs (no checkpoint yet: step 2 < save every 5) and the error are lost
    lost = {(a.job, a.n) for a in rep.attempts if a.lost}
    assert lost == {("t/big", 1), ("t/big", 2), ("t/broken", 1)}
    assert 0 < rep.lost_gpu_hours < rep.gpu_hours
    assert [(j.id, j.tier) for j in rep.failing] == [("t/broken", "A")]
    assert "label column missing" in (rep.failing[0].line or "") + (rep.failing[0].reason or "")
    assert rep.failing[0].log and Path(rep.failing[0].log).is_file()
    assert {g.gpu: g.slots for g in rep.gpus} == {0: 2, 1: 1}
    assert all(0 < g.busy_fraction <= 1 and 0 < g.occupancy <= 1 for g in rep.gpus)
    assert max(g.peak_mib or 0 for g in rep.gpus) == 9248  # big at tier C, from its runtime.json


def test_report_prints_the_summary(night: Night) -> None:
    r = night.cli("report", "--suite", "t")
    assert r.returncode == 0, r.stderr
    for needle in (
        "suite t",
        "3 succeeded",
        "2 oom",
        "finished at tier: A 3, C 1",
        "Still failing",
        "t/broken",
        "label column missing",
        "Slowest jobs (top 5)",
        "first start -> last end",
    ):
        assert needle in r.stdout, needle
    assert night.cli("report").returncode == 0  # the latest suite by default


def test_report_into_a_pipe_keeps_each_row_on_one_line(night: Night) -> None:
    """`gpusched report > morning.txt`, or into grep: no terminal and no COLUMNS, so the
    tables are as wide as their rows (they wrapped at 80 columns, a job's path over two lines)."""
    r = run_cli("report", "--suite", "t", cwd=night.project, env={**night.env, "COLUMNS": ""})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [ln for ln in lines if "t/big" in ln and "A:oom > B:oom > C:ok" in ln], r.stdout
    assert [ln for ln in lines if " lost (" in ln and "were not resumed" in ln], r.stdout
    # the part lost in the unit of the whole (it read "0.1 GPU-min used, 0.00 GPU-h lost")
    assert re.search(r"GPU-(min|h) used, \S+ GPU-\1 lost", r.stdout), r.stdout
    assert [ln for ln in lines if "t/broken" in ln and "label column missing" in ln], r.stdout


def test_csv_and_json_have_one_row_per_attempt(night: Night, tmp_path: Path) -> None:
    r = night.cli(
        "report", "--suite", "t", "--csv", str(tmp_path / "a.csv"), "--json", str(tmp_path / "a.json")
    )
    assert r.returncode == 0, r.stderr
    with open(tmp_path / "a.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 6 and list(rows[0]) == list(report.COLUMNS)
    big = sorted((r for r in rows if r["job"] == "t/big"), key=lambda r: r["attempt"])
    assert [(r["tier"], r["outcome"], r["lost"]) for r in big] == [
        ("A", "oom", "True"),
        ("B", "oom", "True"),
        ("C", "ok", "False"),
    ]
    assert all(
        float(r["duration_s"]) > 0 and r["gpu"] in ("0", "1") and Path(r["log"]).is_file() for r in rows
    )
    doc = json.loads((tmp_path / "a.json").read_text())
    assert len(doc) == 6 and {d["job"] for d in doc} == {"t/1-sst2", "t/2-sst2", "t/big", "t/broken"}
    assert next(d for d in doc if d["job"] == "t/big" and d["tier"] == "C")["peak_mib"] == 9248
    out = night.cli("report", "--suite", "t", "--csv", "-")
    assert out.returncode == 0 and len(list(csv.DictReader(io.StringIO(out.stdout)))) == 6


def test_plot_png_and_svg(night: Night, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png, svg = tmp_path / "night.png", tmp_path / "night.svg"
    assert night.cli("report", "--suite", "t", "--plot", str(png)).returncode == 0
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    r = night.cli("report", "--suite", "t", "--plot", str(svg))
    assert r.returncode == 0, r.stderr
    root = ET.parse(svg).getroot()
    assert root.tag.endswith("svg")
    text = svg.read_text()
    assert "GPU 0 · slot 2" in text and "GPU 1 · slot 1" in text  # one lane per slot of plan 2,1


def test_plot_from_plain_rows(rep: report.SuiteReport, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from gpusched import plot

    rows = report.attempt_records(rep)  # what a simulator might hand over: plain dicts
    out = plot.timeline([{**r, "start": r["start_ts"], "end": r["end_ts"]} for r in rows], tmp_path / "x.png")
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_plot_without_matplotlib_is_one_line_exit_2(
    night: Night, tmp_path: Path, monkeypatch, capsys
) -> None:  # type: ignore[no-untyped-def]
    from gpusched import cli

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    monkeypatch.setenv("GPUSCHED_HOME", night.env["GPUSCHED_HOME"])
    assert cli.main(["report", "--suite", "t", "--plot", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pip install 'gpusched[plot]'" in err
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--suite", "nope"], "no such suite"),
        (["--suite", "t", "--plot", "x.jpg"], ".png"),
        (
            ["--suite", "t", "--csv", "/proc/nowhere/night.csv"],
            "--csv /proc/nowhere/night.csv: cannot write it",
        ),
        (["--suite", "t", "--json", "/proc/night.json"], "--json /proc/night.json: cannot write it"),
        (["--suite", "t", "--csv", "-", "--json", "-"], "stdout takes one of them"),
    ],
)
def test_bad_report_requests(night: Night, args: list[str], needle: str) -> None:
    r = night.cli("report", *args)
    assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1
    if "-" in args:  # refused before any work: no rows half written to stdout
        assert r.stdout == ""


def test_simulate_without_a_plan_to_replay_asks_for_one(tmp_path: Path) -> None:
    """A suite that never ran in this queue has no plan to replay: one line, exit 2."""
    env = {"GPUSCHED_HOME": str(tmp_path / "home"), "GPUSCHED_FAKE_GPUS": "2x24GiB"}
    r = run_cli("simulate", "--suite", "demo", cwd=ROOT, env=env)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "--gpu-plan: give the plan to simulate" in r.stderr and "suite demo has not run" in r.stderr
    r = run_cli("simulate", "--suite", "demo", "--gpus", "0,1", cwd=ROOT, env=env)  # one job a GPU named
    assert r.returncode == 0 and "plan 1,1;" in r.stdout, r.stderr
    assert not (tmp_path / "home").exists()  # a what-if creates no queue, nor its folder


def test_report_with_no_suite_yet(tmp_path: Path) -> None:
    env = {"GPUSCHED_HOME": str(tmp_path / "empty")}
    r = run_cli("report", cwd=tmp_path, env={**env, "PATH": os.environ["PATH"]})
    assert r.returncode == 2 and "no suite" in r.stderr


def test_simulate_replays_the_night_with_the_figures_it_measured(night: Night, tmp_path: Path) -> None:
    """After a night, `simulate` (no --trace) replays each job with what the queue measured:
    sst2's peaks and run times, big's tier C where it ran and, at tiers A and B where it only
    OOMed, at least what the OOMs saw; `broken` never finished, so its figures are made up."""
    out = tmp_path / "night.json"
    r = night.cli("simulate", "--suite", "t", "--trace-out", str(out))  # the night's plan, 2,1
    assert r.returncode == 0, r.stderr
    assert "4 jobs on 2 simulated GPUs (2 x 24.0 GiB, as the probe sees them), plan 2,1;" in r.stdout
    assert (
        "figures: measured for 2 task(s), from 3 finished run(s) in this queue; made up for broken"
        in r.stdout
    )
    trace = {j["name"]: j["tiers"] for j in json.loads(out.read_text())["jobs"]}
    store = Store(night.home / "gpusched.db", readonly=True)
    try:
        for name in ("1-sst2", "2-sst2", "big"):
            for a in store.attempts(f"t/{name}"):
                if a.outcome == "ok":
                    assert trace[name][a.tier]["peak_mib"] == a.peak_mib
                    assert trace[name][a.tier]["duration_s"] == pytest.approx(a.ended_at - a.started_at)
                elif a.outcome == "oom" and a.peak_mib:
                    assert trace[name][a.tier]["peak_mib"] >= a.peak_mib
    finally:
        store.close()
    store = Store(night.home / "gpusched.db", readonly=True)
    try:
        peaks, _ = memwatch.records(store, ["sst2", "mnli", "broken"])
    finally:
        store.close()
    runs, tasks = sum(map(len, peaks.values())), len(peaks)
    assert runs >= 5  # sst2 twice, mnli's OOMs at A and B and its run at C
    assert (
        f"history: the scheduler starts knowing {runs} run(s) of {tasks} task(s) from this queue" in r.stdout
    )
    warm, cold = (
        json.loads(night.cli("simulate", "--suite", "t", "--gpu-plan", "2,1", "--json", *flag).stdout)[0]
        for flag in ((), ("--cold",))
    )
    assert (warm["history_runs"], cold["history_runs"]) == (runs, 0)  # in the simulated store, or not
    first = night.cli("simulate", "--suite", "t", "--gpu-plan", "2,1", "--cold")
    assert "history: none (--cold)" in first.stdout and "history: the scheduler" not in first.stdout
    made_up = night.cli("simulate", "--suite", "t", "--gpu-plan", "2,1", "--made-up")
    assert "figures: made up" in made_up.stdout and "history: the scheduler" not in made_up.stdout
    bad = night.cli(
        "simulate", "--suite", "t", "--gpu-plan", "2,1", "--trace-out", str(tmp_path / "no" / "x.json")
    )
    assert bad.returncode == 2 and "--trace-out" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
