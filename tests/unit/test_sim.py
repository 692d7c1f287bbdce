"""gpusched.sim drives the real Scheduler with a fake clock, fake GPUs and the fake executor:
deterministic for a seed, OOMs written so outcome.classify sees them, memory-aware placement
beating slot-only placement on OOMs, and no deadlock whatever the trace."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpusched import cli, outcome, sim
from gpusched.model import MIB_PER_GIB, ExitRecord, GpuPlan, Outcome

GIB = MIB_PER_GIB
PLAN = GpuPlan(gpus=(0, 1), slots=(2, 2))
CARDS = [24 * GIB, 24 * GIB]


def small_trace(seeds: int = 5) -> sim.Trace:
    """Three tasks on two 24 GiB cards, two jobs per card: two big ones cannot share a card
    at tier A; a small one fits beside anything."""
    tasks = {"big": (14 * GIB, 1800), "mid": (11.5 * GIB, 1500), "small": (5 * GIB, 1200)}
    jobs = [
        sim.TraceJob(name=f"{s}-{t}", task=t, tiers=sim.ladder_profiles(int(p), d, 90))
        for s in range(seeds)
        for t, (p, d) in tasks.items()
    ]
    return sim.Trace(jobs=tuple(jobs), noise=0.02)


@pytest.fixture(scope="module")
def results() -> dict[str, sim.SimResult]:
    trace = small_trace()
    return {p: sim.simulate(trace, PLAN, CARDS, policy=p, seed=3) for p in ("slots", "gpusched")}


def test_memory_aware_placement_crashes_less_than_slot_only_and_never_after_learning(
    results: dict[str, sim.SimResult],
) -> None:
    aware, slots = results["gpusched"], results["slots"]
    assert aware.finished and aware.succeeded == 15 and aware.failed == 0
    assert slots.finished and slots.succeeded == 15
    assert aware.oom_count < slots.oom_count
    assert aware.learned_colocated_ooms == 0
    assert aware.gpu_hours_lost < slots.gpu_hours_lost


def test_a_simulation_is_deterministic_for_a_seed(results: dict[str, sim.SimResult]) -> None:
    again = sim.simulate(small_trace(), PLAN, CARDS, policy="gpusched", seed=3)
    assert again.as_dict() == results["gpusched"].as_dict()


def _attempts(db: Path, suite: str) -> list[tuple[str, int, int, str | None, str | None]]:
    """(task, attempt number, tier, prediction source, outcome) of one suite's attempts."""
    from gpusched.store import Store

    store = Store(db)
    try:
        rows = store.db.execute(
            "SELECT j.task, a.n, a.tier, a.prediction_source, a.outcome FROM attempts a"
            " JOIN jobs j ON j.id = a.job_id WHERE j.suite = ? ORDER BY a.id",
            (suite,),
        ).fetchall()
        return [tuple(r) for r in rows]
    finally:
        store.close()


def test_a_second_night_starts_with_the_peaks_the_first_one_learned(tmp_path: Path) -> None:
    def night(prior: int, workdir: Path) -> sim.SimResult:
        workdir.mkdir()
        policy = sim.policies(PLAN)["gpusched"]
        return sim.Simulation(
            trace=small_trace(), plan=PLAN, totals_mib=CARDS, policy=policy, seed=3, prior_nights=prior
        ).run(workdir)

    first, second = night(0, tmp_path / "first"), night(1, tmp_path / "second")
    cold = _attempts(tmp_path / "first" / "sim.db", "sim")
    assert [src for _, n, _, src, _ in cold[:3]] == ["default"] * 3  # a first night guesses, then learns
    db = tmp_path / "second" / "sim.db"
    learned = {(task, tier) for task, _, tier, _, result in _attempts(db, "sim-prior-1") if result == "ok"}
    warm = _attempts(db, "sim")
    known = [src for task, n, tier, src, _ in warm if n == 1 and (task, tier) in learned]
    assert len(known) >= 10 and set(known) <= {"job", "task"}  # known from the earlier night's history
    assert first.oom_count >= 1 and second.oom_count == 0  # its tasks were learned: no crash
    assert second.finished and (second.jobs, second.succeeded, second.failed) == (15, 15, 0)


def test_a_second_night_s_result_counts_that_night_alone() -> None:
    trace = small_trace()
    first = sim.simulate(trace, PLAN, CARDS, policy="gpusched", seed=3)
    second = sim.simulate(trace, PLAN, CARDS, policy="gpusched", seed=3, prior_nights=1)
    assert second.attempts == 15 and second.succeeded == 15  # not the 30+ attempts of two nights
    assert second.lower_bound_s == first.lower_bound_s
    # its clock starts at its own submit: about one night long, not two
    assert 0.8 * first.makespan_s < second.makespan_s < 1.3 * first.makespan_s
    rep = second.report
    assert {j.id.split("/")[0] for j in rep.jobs} == {"sim"} and len(rep.jobs) == 15
    assert rep.wall_s == pytest.approx(second.makespan_s)
    assert rep.start >= first.makespan_s * 0.8  # after the earlier night, on the same clock
    assert 0.3 < second.mem_util < 1.0
    again = sim.simulate(trace, PLAN, CARDS, policy="gpusched", seed=3, prior_nights=1)
    assert again.as_dict() == second.as_dict()  # deterministic too


def _records(db: Path, tasks: list[str]) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
    from gpusched import memwatch
    from gpusched.store import Store

    store = Store(db)
    try:
        peaks, runs = memwatch.records(store, tasks)
        return dict(peaks), dict(runs)
    finally:
        store.close()


def test_a_night_replayed_from_a_queue_s_history_starts_knowing_what_that_queue_measured(
    tmp_path: Path,
) -> None:
    trace = small_trace()
    tasks = sorted({j.task for j in trace.jobs})
    policy = sim.policies(PLAN)["gpusched"]
    (tmp_path / "real").mkdir()
    (tmp_path / "whatif").mkdir()
    # a night "the queue measured" (here a simulated one: what counts is the store it leaves)
    first = sim.Simulation(trace=trace, plan=PLAN, totals_mib=CARDS, policy=policy, seed=3).run(
        tmp_path / "real"
    )
    peaks, runs = _records(tmp_path / "real" / "sim.db", tasks)
    assert first.oom_count >= 1 and any(p.outcome == "oom" for ps in peaks.values() for p in ps)
    warm = sim.Simulation(
        trace=trace, plan=PLAN, totals_mib=CARDS, policy=policy, seed=3, history=(peaks, runs)
    ).run(tmp_path / "whatif")
    db = tmp_path / "whatif" / "sim.db"

    def samples(
        p: dict[str, list[Any]], r: dict[str, list[Any]], suite: str = "sim"
    ) -> list[tuple[Any, ...]]:
        def of(xs: dict[str, list[Any]]) -> list[Any]:
            return [x for v in xs.values() for x in v if x.job_id.startswith(suite + "/")]

        took = sorted((x.task, x.tier, round(x.seconds, 3)) for x in of(r))
        return sorted((x.task, x.tier, x.peak_mib, str(x.outcome)) for x in of(p)) + took

    # the store the night ran in holds the same runs (peaks, outcomes, run times), as a suite of their own
    assert samples(*_records(db, tasks), suite="sim-history") == samples(peaks, runs)
    learned = {(x.task, x.tier) for xs in runs.values() for x in xs}
    firsts = [(task, tier, src) for task, n, tier, src, _ in _attempts(db, "sim") if n == 1]
    known = [src for task, tier, src in firsts if (task, tier) in learned]
    assert len(known) >= 10 and set(known) == {"task"}  # predicted from the queue's runs of the task
    assert warm.oom_count == 0 and warm.learned_colocated_ooms == 0
    assert warm.finished and (warm.attempts, warm.succeeded) == (15, 15)  # the night alone
    assert warm.history_runs == sum(map(len, peaks.values())) and first.history_runs == 0
    cold = sim.simulate(trace, PLAN, CARDS, policy="gpusched", seed=3)
    assert cold.as_dict() == first.as_dict()  # without history: a first night, as before
    empty = sim.simulate(trace, PLAN, CARDS, policy="gpusched", seed=3, history=({}, {}))
    assert empty.as_dict() == first.as_dict()  # a queue that ran none of its tasks: the same


def test_the_simulated_oom_is_a_real_oom_to_classify() -> None:
    tail = sim.oom_log(24 * GIB, 20, 512, 11 * GIB, [(40001, 12 * GIB)])
    c = outcome.classify(ExitRecord(exit_code=1), tail, cancel_requested=False)
    assert c.outcome is Outcome.OOM and c.contention  # the other process held half the card
    assert c.line and c.line.startswith("torch.OutOfMemoryError: CUDA out of memory")


def test_it_never_deadlocks_on_jobs_that_fit_nowhere_and_cards_taken_by_outsiders() -> None:
    huge = sim.TraceJob(
        name="0-huge",
        task="huge",
        tiers=tuple(sim.TierProfile(peak_mib=30 * GIB, duration_s=600) for _ in range(4)),
    )
    fine = sim.TraceJob(name="1-fine", task="fine", tiers=sim.ladder_profiles(6 * GIB, 600, 60))
    outsiders = (sim.Outsider(gpu=0, mib=20 * GIB, end_s=3600), sim.Outsider(gpu=1, mib=21 * GIB, end_s=1800))
    r = sim.simulate(
        sim.Trace(jobs=(huge, fine), outsiders=outsiders), PLAN, CARDS, policy="gpusched", seed=1
    )
    assert r.finished  # nothing waits for ever
    assert (r.succeeded, r.failed) == (1, 1)  # the one that fits no card at any tier failed at its last tier


@pytest.mark.parametrize(
    ("arrives_s", "policy", "arrival"), [(120.0, "gpusched", True), (0.0, "slots", False)]
)
def test_an_oom_that_an_outsider_s_later_arrival_caused_is_not_counted_as_placement_s(
    arrives_s: float, policy: str, arrival: bool
) -> None:
    """Someone's 16 GiB process arriving on the card while our 10 GiB job grows kills the job:
    no placement could have seen it coming, so it is not a co-located OOM after learning. The
    same process there before the job started (and a policy blind to it) is placement's."""
    job = sim.TraceJob(name="0-t", task="t", tiers=sim.ladder_profiles(10 * GIB, 1800, 300))
    late = sim.Outsider(gpu=0, mib=16 * GIB, start_s=arrives_s, end_s=7200)
    r = sim.simulate(sim.Trace(jobs=(job,), outsiders=(late,), noise=0.0), PLAN, CARDS, policy=policy, seed=1)
    assert r.finished and r.succeeded == 1
    assert [(o.gpu, o.colocated, o.arrival) for o in r.ooms] == [(0, True, arrival)]
    assert r.arrival_ooms == int(arrival) and r.as_dict()["arrival_ooms"] == int(arrival)
    # the scheduler sees the newcomer too: the job runs again at its own tier, not one down
    assert [a.tier for a in r.report.attempts] == (["A", "A"] if arrival else ["A", "B"])


def test_co_located_ooms_after_learning_leave_out_those_an_arrival_caused() -> None:
    def oom(arrival: bool) -> sim.OomEvent:
        return sim.OomEvent(
            at_s=60.0,
            job_id="s/0-t",
            tier="A",
            gpu=0,
            colocated=True,
            learned=True,
            arrival=arrival,
            prediction_source="task",
            lost_s=60.0,
        )

    r = sim.SimResult(
        policy="gpusched",
        label="gpusched",
        jobs=2,
        gpus=1,
        slots=2,
        makespan_s=1.0,
        lower_bound_s=1.0,
        succeeded=2,
        failed=0,
        attempts=4,
        ooms=(oom(True), oom(False)),
        gpu_hours_lost=0.0,
        mem_util=0.5,
        tiers={},
    )
    assert (r.colocated_ooms, r.learned_colocated_ooms, r.arrival_ooms) == (2, 1, 1)


def test_lower_bound_takes_each_job_at_its_fastest_fitting_tier() -> None:
    job = sim.TraceJob(
        name="j",
        task="t",
        tiers=(
            sim.TierProfile(peak_mib=30 * GIB, duration_s=100),
            sim.TierProfile(peak_mib=20 * GIB, duration_s=200),
        ),
    )
    trace = sim.Trace(jobs=(job,) * 4)
    assert sim.lower_bound_s(trace, PLAN, CARDS) == pytest.approx(
        max(4 * 200 / 4, 4 * 20 * GIB * 200 / (48 * GIB))
    )


def test_simulate_command_uses_a_temporary_queue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("GPUSCHED_HOME", str(home))
    trace = {
        "jobs": [{"name": f"{i}-t", "task": "t", "peak_mib": 9000, "duration_s": 900} for i in range(4)],
        "outsiders": [{"gpu": 1, "mib": 4000, "start_s": 0, "end_s": 600}],
    }
    (tmp_path / "trace.json").write_text(json.dumps(trace))
    plan = Path(__file__).resolve().parents[2] / "plans" / "demo.yaml"
    code = cli.main(
        [
            "simulate",
            "--suite",
            str(plan),
            "--gpu-plan",
            "2,2",
            "--fake-gpus",
            "2x24GiB",
            "--trace",
            str(tmp_path / "trace.json"),
            "--policy",
            "all",
            "--json",
        ]
    )
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["policy"] for r in out] == list(sim.POLICIES) and all(r["succeeded"] == 4 for r in out)
    assert not home.exists()  # never the user's queue
    assert cli.main(["simulate", "--suite", str(plan), "--gpu-plan", "2,2", "--policy", "nope"]) == 2


def test_baselines_run_jobs_in_the_order_given_at_the_tier_given() -> None:
    from gpusched.model import Tier
    from gpusched.placement import GpuSlotView, QueuedJob, assign

    tiers = (Tier(name="A"), Tier(name="B"))
    jobs = [
        QueuedJob(
            job_id=f"j{i}",
            seq=i,
            tier=0,
            tiers=tiers,
            allowed={0: 1},
            predicted_s=s,
            chain_s=c,
            fallback=((1, 1),),
        )
        for i, (s, c) in enumerate([(60.0, None), (60.0, 7200.0)])
    ]
    card = [GpuSlotView(index=0)]
    assert [p.job_id for p in assign(jobs, card).placements] == ["j1"]  # gpusched: longest first
    assert [p.job_id for p in sim.fifo_assign(jobs, card, headroom_frac=0.1).placements] == ["j0"]
    assert sim.plain(jobs[1]) == QueuedJob(job_id="j1", seq=1, tier=0, tiers=tiers, allowed={0: 1})


def test_the_baselines_leave_waiting_jobs_in_the_scheduler_s_queue_order() -> None:
    """The scheduler reads an assign's waits in ``placement.job_order`` (its holds, its count
    of overtaken jobs); a baseline places plain copies (FIFO) and must hand them back in it."""
    from gpusched import placement
    from gpusched.model import Tier

    plan = GpuPlan(gpus=(0, 1), slots=(1, 1))
    jobs = [
        placement.QueuedJob(
            job_id=f"j{seq}",
            seq=seq,
            tier=0,
            tiers=(Tier(name="A"),),
            allowed={0: 1, 1: 1},
            predicted_mib=4 * MIB_PER_GIB,
            predicted_s=float(seq * 600),  # the longest (the last submitted) first
        )
        for seq in range(1, 7)
    ]
    views = [
        placement.GpuSlotView(index=g, free_mib=24 * MIB_PER_GIB, total_mib=24 * MIB_PER_GIB) for g in (0, 1)
    ]
    for name, policy in sim.policies(plan).items():
        decision = (policy.assign or placement.assign)(jobs, views, headroom_frac=0.1)
        by_id = {j.job_id: j for j in jobs}
        waits = [by_id[w.job_id] for w in decision.waits]
        assert len(waits) == 4, name
        assert waits == sorted(waits, key=placement.job_order), name


def test_a_trace_written_by_trace_to_json_reads_back_as_the_same_trace(tmp_path: Path) -> None:
    """``benchmarks/placement.py --trace-out`` writes a trace for ``gpusched simulate --trace``.
    An outsider that never leaves is written ending at 1e18 s, which YAML (the reader) takes
    for text unless read as a number: it must come back as the same trace, numbers as numbers."""
    import math

    trace = sim.Trace(
        jobs=sim.synthetic_trace([("1-qnli", "qnli"), ("2-mnli", "mnli")], seed=3).jobs,
        outsiders=(sim.Outsider(gpu=1, mib=8000, start_s=60.0), sim.Outsider(gpu=0, mib=300, end_s=7200.0)),
        noise=0.05,
    )
    path = tmp_path / "trace.json"
    path.write_text(sim.trace_to_json(trace))
    back = sim.load_trace(path)
    assert back.outsiders[0].end_s == 1e18 and isinstance(back.outsiders[0].end_s, float)
    assert back == sim.Trace(
        jobs=trace.jobs,
        outsiders=(sim.Outsider(gpu=1, mib=8000, start_s=60.0, end_s=1e18), trace.outsiders[1]),
        noise=0.05,
    )
    assert math.isinf(trace.outsiders[0].end_s)  # the trace itself is not changed
    path.write_text('{"jobs": [{"name": "a", "tiers": [{"peak_mib": "lots", "duration_s": 60}]}]}')
    with pytest.raises(ValueError):
        sim.load_trace(path)  # not a number: an error the CLI turns into one line


def test_the_pairs_of_a_night_account_for_every_card_hour(results: dict[str, sim.SimResult]) -> None:
    """``benchmarks/placement.py --pairs``: what ran together, alone, or nothing, on each card
    from the night's start to its end, adds up to the cards times the makespan; two big jobs,
    which cannot share a card at tier A, are never shown together there."""
    pair_mix = _placement_benchmark().pair_mix

    night = results["gpusched"]
    pairs, alone, idle = pair_mix(night)
    total = sum(pairs.values()) + sum(alone.values()) + idle
    assert total == pytest.approx(len(CARDS) * night.makespan_s / 3600, rel=1e-6)
    run_h = sum(a.end - a.start for a in night.report.attempts) / 3600  # two a card at most here
    assert 2 * sum(pairs.values()) + sum(alone.values()) == pytest.approx(run_h, rel=1e-6)
    assert pairs and "big-A + big-A" not in pairs and idle >= 0
    assert all(" + " in kind and kind.count("-") >= 2 for kind in pairs)


@pytest.mark.parametrize(
    ("util", "plan", "makespan_s", "bound_s"),
    [
        (0.0, (2,), 3600, 3600),  # sharing free: two at once finish as one would
        (0.8, (2,), 3600 * 1.6, 3600 * 1.6),  # each wants 80 % of the card: 160 %, each 1.6x slower
        (0.4, (2,), 3600, 3600),  # 80 % asked: both fit in the card's time
        (0.8, (1,), 7200, 7200),  # one after the other
    ],
)
def test_jobs_that_keep_their_card_busy_slow_each_other_down(
    util: float, plan: tuple[int, ...], makespan_s: float, bound_s: float
) -> None:
    """Two hour-long 6 GiB jobs on one 24 GiB card: how much sharing costs is what each keeps
    the card busy alone (``util``), so "two a card or one?" has an answer that is not always
    "two"."""
    prof = sim.TierProfile(peak_mib=6 * GIB, duration_s=3600, ramp_s=60, util=util)
    trace = sim.Trace(
        jobs=tuple(sim.TraceJob(name=f"j{i}", task="t", tiers=(prof,) * 4) for i in range(2)), noise=0.0
    )
    r = sim.simulate(trace, GpuPlan(gpus=(0,), slots=plan), (24 * GIB,))
    assert r.succeeded == 2 and r.oom_count == 0
    assert r.makespan_s == pytest.approx(makespan_s, abs=30)
    assert r.lower_bound_s == pytest.approx(bound_s)  # the card's busy time bounds it too


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("jobs: [\n", "t.yaml:2:1: not valid YAML"),
        ("[1, 2]\n", "not a trace: Expected `object`, got `array`; a trace is a mapping with a list under"),
        ("jobs:\n  - {name: a, duration_s: 60}\n", "job a has no peak_mib: give each job tiers, or peak_mib"),
        ("jobs:\n  - {peak_mib: 9000, duration_s: 60}\n", "missing required field `name` - at `$.jobs[0]`"),
        # where a key was mistyped or a figure is no number, the message says which, and where
        ("jobs:\n  - {name: a, peak_mib: 9000, duration: 60}\n", "unknown field `duration` - at `$.jobs[0]`"),
        (
            "jobs: [{name: a, tiers: [{peak_mib: lots, duration_s: 9}]}]",
            "got `str` - at `$.jobs[0].tiers[0].peak_mib`",
        ),
        (
            "jobs: [{name: a, peak_mib: 1, duration_s: 2}]\noutsiders: [{gpu: 0, mb: 5}]",
            "`mb` - at `$.outsiders[0]`",
        ),
        ("jobs: 5\n", "Expected `array`, got `int` - at `$.jobs`"),
        ("jobs:\n  - {name: a/b, peak_mib: 9000, duration_s: 60}\n", "job name 'a/b': use letters, digits"),
        ("jobs:\n" + "  - {name: a, peak_mib: 9000, duration_s: 60}\n" * 2, "job name 'a' is given twice"),
        # 90 for 90 % would make every job 90x slower without a word (JSON: YAML reads it too)
        (
            json.dumps({"jobs": [{"name": "a", "peak_mib": 9000, "duration_s": 900, "util": 90}]}),
            "job a: util 90 is not a share of a card between 0 and 1",
        ),
    ],
)
def test_a_trace_that_is_not_one_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, said: str
) -> None:
    """``simulate --trace``: malformed YAML, a job without a figure it needs, a job's name that
    cannot name a folder, or one given twice, a util that is no share of a card, a key that is
    none of a trace's or a figure that is no number: one line saying which and where, exit 2,
    no traceback (not Python's words: "'list' object has no attribute 'get'")."""
    trace = tmp_path / "t.yaml"
    trace.write_text(text)
    plan = Path(__file__).resolve().parents[2] / "plans" / "demo.yaml"
    argv = [
        "simulate",
        "--suite",
        str(plan),
        "--gpu-plan",
        "1",
        "--fake-gpus",
        "1x24GiB",
        "--trace",
        str(trace),
    ]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"gpusched: --trace {trace}") and said in err[0], err


def test_the_placement_benchmark_simulates_the_plan_it_is_given(capsys: pytest.CaptureFixture[str]) -> None:
    """``benchmarks/placement.py --gpu-plan 2,2,2,2,1,1,1``: the night runs on those caps (11
    slots, not the default 14); a plan that does not give each of the 7 cards a count is refused
    in one line, exit 2."""
    main = _placement_benchmark().main

    assert main(["--seed", "4", "--policy", "static", "--gpu-plan", "2,2,2,2,1,1,1", "--json"]) == 0
    (night,) = json.loads(capsys.readouterr().out)
    assert night["slots"] == 11 and night["succeeded"] == 120
    for bad in ("2,2", "2,2,2,2,1,1,x", "2,2,2,2,1,1,-1"):
        with pytest.raises(SystemExit) as refused:
            main(["--gpu-plan", bad])
        assert refused.value.code == 2
        said = capsys.readouterr().err.splitlines()[-1]
        assert said.endswith(f"--gpu-plan {bad!r}: give 7 slot counts, one per card, e.g. 2,2,2,2,1,1,1")


def _placement_benchmark() -> Any:
    """``benchmarks/placement.py`` as a module (the benchmarks are scripts, not a package)."""
    import importlib
    import sys

    where = str(Path(__file__).resolve().parents[2] / "benchmarks")
    if where not in sys.path:
        sys.path.insert(0, where)
    return importlib.import_module("placement")


def test_trace_out_to_stdout_is_refused_not_written_as_a_file_named_dash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--trace-out -`` wrote the trace to a file named ``-`` in the current folder, where
    ``report --csv -`` means stdout; stdout carries simulate's results, so it is refused in one
    line, exit 2, before the night is simulated."""
    monkeypatch.chdir(tmp_path)
    plan = Path(__file__).resolve().parents[2] / "plans" / "demo.yaml"
    argv = ["simulate", "--suite", str(plan), "--gpu-plan", "1", "--fake-gpus", "1x24GiB", "--trace-out", "-"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--trace-out -: give a file's name" in err[0], err
    assert not (tmp_path / "-").exists()
