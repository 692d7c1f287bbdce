"""What sharing a card cost, from the queue's runs: how much of its card a task keeps busy
(its runs that had the card alone), and how much longer than alone each run took beside
others, by the simulator's model run backwards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpusched import sharing, sim, whatif
from gpusched.model import GpuPlan, JobSpec
from gpusched.predict import PeakSample, RunSample
from gpusched.sharing import Span

GIB = 1024


def test_a_task_s_use_of_its_card_comes_from_its_runs_that_had_it_alone() -> None:
    spans = [
        Span(1, "qnli", 0, 0, 0.0, 100.0, True),  # alone on GPU 0
        Span(2, "qnli", 0, 0, 200.0, 400.0, True),  # with 3 on GPU 0 from 300
        Span(3, "rte", 0, 0, 300.0, 500.0, True),
        Span(4, "rte", 0, 1, 0.0, 100.0, False),  # alone but failed: not a measure
        Span(5, "sst2", 0, 1, 200.0, 205.0, True),  # alone, no sample taken while it ran
    ]
    samples = [(50.0, 0, 90), (60.0, 0, 70), (250.0, 0, 10), (350.0, 0, 100), (50.0, 1, 99)]

    def utils_in(gpu: int, start: float, end: float) -> list[int]:
        return [u for at, g, u in samples if g == gpu and start <= at <= end]

    assert sharing.alone_utils(spans, utils_in) == {("qnli", 0): pytest.approx(0.8)}


def test_a_run_beside_others_took_longer_than_alone_by_what_the_card_was_asked_for() -> None:
    utils = {("qnli", 0): 0.8, ("rte", 0): 0.6}
    spans = [
        Span(1, "qnli", 0, 0, 0.0, 100.0, True),  # alone for 50 s, then beside rte (1.4)
        Span(2, "rte", 0, 0, 50.0, 200.0, True),
        Span(3, "qnli", 0, 1, 0.0, 100.0, True),  # beside a task never measured: free
        Span(4, "cola", 0, 1, 0.0, None, False),
    ]
    slow = sharing.slowdowns(spans, utils)
    assert slow[1] == pytest.approx((50 * 1.0 + 50 * 1.4) / 100)
    assert slow[2] == pytest.approx((50 * 1.4 + 100 * 1.0) / 150)
    assert slow[3] == pytest.approx(1.0) and 4 not in slow


def test_the_replayed_night_knows_what_sharing_cost_and_two_a_card_is_no_longer_free() -> None:
    """A task measured at 90 % of its card alone: replayed two a card, each runs 1.8x longer,
    so the night takes as long as one a card, where before it seemed to take half."""
    jobs = [(f"E1/{i}-qnli", f"{i}-qnli", "qnli") for i in range(4)]
    peaks = {"qnli": [PeakSample(job_id="E1/0-qnli", task="qnli", tier=0, peak_mib=6 * GIB, outcome="ok")]}
    runs = {"qnli": [RunSample(job_id="E1/0-qnli", task="qnli", tier=0, seconds=3600.0)]}
    plan = GpuPlan(gpus=(0, 1), slots=(2, 2))

    def night(utils: dict[tuple[str, int], float]) -> float:
        made = whatif.trace_from_history(jobs, 4, peaks, runs, utils=utils)
        trace = sim.Trace(jobs=made.trace.jobs, noise=0.0)
        return sim.simulate(trace, plan, (24 * GIB, 24 * GIB)).makespan_s

    made = whatif.trace_from_history(jobs, 4, peaks, runs, utils={("qnli", 0): 0.9})
    assert {p.util for j in made.trace.jobs for p in j.tiers} == {0.9}  # every tier: the nearest known
    told = "sharing a card: a run alone kept it busy qnli 90 % (jobs wanting over 100 % of a card run slower)"
    assert made.sharing() == told
    blind = whatif.trace_from_history(jobs, 4, {}, {}, utils={("qnli", 0): 0.9})
    assert blind.sharing() == "sharing a card: free (made-up figures have no utilisation)"
    assert night({}) == pytest.approx(3600, abs=60)
    assert night({("qnli", 0): 0.9}) == pytest.approx(3600 * 1.8, abs=60)


def test_simulate_reads_what_sharing_cost_from_the_queue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command's path: a qnli run that had GPU 0 alone at 90 % (the daemon's samples), so
    the replayed qnli jobs want 90 % of a card; the tasks never run share for free."""
    from msgspec.structs import replace

    from gpusched import cli
    from tests.unit.test_memory_scheduler import Box, make_suite

    box = Box(tmp_path, GpuPlan(gpus=(0,), slots=(1,)), cards="1x24GiB")
    box.submit(
        replace(make_suite(tmp_path, 1), name="past", jobs=(JobSpec(suite="past", name="a", task="qnli"),))
    )
    box.tick()
    start = box.now
    box.ex.finish(
        box.ex.token_of("past/a"),
        exit_code=0,
        started_at=start,
        ended_at=start + 600,
        runtime={"peak_mib": 6 * GIB},
    )
    box.now += 600
    box.tick()
    for k in range(1, 6):
        box.store.record_samples(start + 100 * k, [(0, 6 * GIB, 24 * GIB, 90)], keep_s=1e12)
    box.store.close()
    (tmp_path / "home").mkdir()
    (tmp_path / "gs.db").rename(tmp_path / "home" / "gpusched.db")
    monkeypatch.setenv("GPUSCHED_HOME", str(tmp_path / "home"))
    plan = Path(__file__).resolve().parents[2] / "plans" / "demo.yaml"
    out = tmp_path / "night.json"
    argv = [
        "simulate",
        "--suite",
        str(plan),
        "--gpu-plan",
        "2",
        "--fake-gpus",
        "1x24GiB",
        "--trace-out",
        str(out),
    ]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    said = "sharing a card: a run alone kept it busy qnli 90 % (jobs wanting over 100 % of a card run slower)"
    said += "; free for mnli, sst2"
    assert said in printed.splitlines(), printed
    utils = {j["task"]: {t["util"] for t in j["tiers"]} for j in json.loads(out.read_text())["jobs"]}
    assert utils == {"qnli": {0.9}, "sst2": {0.0}, "mnli": {0.0}}
