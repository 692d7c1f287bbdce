"""predict.predict_peak: which source wins, and what an OOM teaches."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusched.model import Outcome
from gpusched.predict import (
    SOURCES,
    Duration,
    PeakSample,
    Prediction,
    RunSample,
    p90,
    predict_duration,
    predict_peak,
)

TASK = "glue-tvt_qnli"


def sample(
    job_id: str, peak: int | None, outcome: str = "ok", *, tier: int = 0, task: str = TASK
) -> PeakSample:
    return PeakSample(job_id=job_id, task=task, tier=tier, peak_mib=peak, outcome=outcome)


def predict(
    history: list[PeakSample], *, tier: int = 0, default: int | None = 12000, usable: int | None = None
):
    return predict_peak(TASK, "E1/s87", tier, history, default_mib=default, usable_mib=usable)


CASES = [
    pytest.param([], Prediction(mib=12000, source="default"), id="nothing-known-default"),
    pytest.param(
        [sample("E1/s87", 9000), sample("E1/s87", 9500), sample("E1/s1", 20000)],
        Prediction(mib=9500, source="job"),
        id="own-runs-max-beat-siblings",
    ),
    pytest.param(
        [sample("E1/s1", 8000), sample("E1/s2", 8800), sample("E1/s3", 8400)],
        Prediction(mib=8800, source="task"),
        id="siblings-p90-is-max-when-few",
    ),
    pytest.param(
        [sample(f"E1/s{i}", 1000 * i) for i in range(1, 21)],
        Prediction(mib=18000, source="task"),
        id="siblings-p90-of-twenty",
    ),
    pytest.param(
        [sample("E1/s87", 9000, tier=1), sample("E1/s1", 7000, task="other")],
        Prediction(mib=12000, source="default"),
        id="other-tier-and-other-task-ignored",
    ),
    pytest.param(
        [
            sample("E1/s87", 9000, "error"),
            sample("E1/s87", 9000, "cancelled"),
            sample("E1/s87", 30000, "host_oom"),
        ],
        Prediction(mib=12000, source="default"),
        id="non-memory-outcomes-ignored",
    ),
    pytest.param(
        [sample("E1/s87", None), sample("E1/s1", 8000)],
        Prediction(mib=8000, source="task"),
        id="ok-without-peak-teaches-nothing",
    ),
    pytest.param(
        [sample("E1/s87", 9000), sample("E1/s87", 11000, "oom")],
        Prediction(mib=11000, source="job"),
        id="own-oom-peak-is-a-floor-for-job",
    ),
    pytest.param(
        [sample("E1/s1", 8000), sample("E1/s87", 10000, Outcome.OOM)],
        Prediction(mib=10000, source="task"),
        id="own-oom-peak-is-a-floor-for-task",
    ),
    pytest.param(
        [sample("E1/s87", None, "oom"), sample("E1/s1", 8000, "oom")],
        Prediction(mib=22000, source="job"),
        id="own-oom-alone-means-whole-card",
    ),
    pytest.param(
        [sample("E1/s1", None, "oom")],
        Prediction(mib=22000, source="task"),
        id="sibling-oom-alone-means-whole-card",
    ),
]


@pytest.mark.parametrize(("history", "expected"), CASES)
def test_prediction_source_order(history: list[PeakSample], expected: Prediction) -> None:
    assert predict(history, usable=22000) == expected


def test_oom_without_card_size_uses_its_reported_peak_or_the_default() -> None:
    assert predict([sample("E1/s87", 15000, "oom")]) == Prediction(mib=15000, source="job")
    assert predict([sample("E1/s87", None, "oom")]) == Prediction(mib=12000, source="default")
    assert predict([sample("E1/s87", None, "oom")], default=None) == Prediction(mib=None, source="unknown")


def test_oom_peak_above_card_size_wins() -> None:
    assert predict([sample("E1/s87", 30000, "oom")], usable=22000).mib == 30000


def test_unknown_without_default() -> None:
    assert predict([], default=None) == Prediction(mib=None, source="unknown")


def test_p90_nearest_rank() -> None:
    assert p90([5]) == 5
    assert p90([3, 1, 2]) == 3
    assert p90(list(range(1, 11))) == 9
    assert p90(list(range(1, 71))) == 63


@given(
    st.lists(
        st.builds(
            PeakSample,
            job_id=st.sampled_from(["E1/s87", "E1/s1", "E1/s2"]),
            task=st.sampled_from([TASK, "other"]),
            tier=st.integers(0, 2),
            peak_mib=st.none() | st.integers(0, 80000),
            outcome=st.sampled_from(list(Outcome)),
        ),
        max_size=12,
    ),
    st.none() | st.integers(1, 80000),
)
def test_prediction_is_well_formed(history: list[PeakSample], default: int | None) -> None:
    got = predict_peak(TASK, "E1/s87", 0, history, default_mib=default, usable_mib=22000)
    assert got.source in SOURCES
    assert (got.mib is None) == (got.source == "unknown")
    own_ok = [
        s.peak_mib
        for s in history
        if s.job_id == "E1/s87"
        and s.task == TASK
        and s.tier == 0
        and s.outcome == Outcome.OK
        and s.peak_mib is not None
    ]
    if own_ok:
        assert got.source == "job" and got.mib is not None and got.mib >= max(own_ok)


# --------------------------------------------------------------------------- after an OOM, running siblings


def test_an_oom_with_a_whole_card_predicted_means_the_tier_fits_no_card() -> None:
    shared = PeakSample(job_id="E1/s1", task=TASK, tier=0, peak_mib=9000, outcome="oom", predicted_mib=10000)
    assert predict([shared], usable=21000) == Prediction(mib=21000, source="task")  # wait for a card
    alone = PeakSample(job_id="E1/s2", task=TASK, tier=0, peak_mib=20000, outcome="oom", predicted_mib=21000)
    assert predict([shared, alone], usable=21000) == Prediction(mib=21001, source="task")  # more than one


def test_a_running_sibling_that_holds_more_than_the_default_raises_it() -> None:
    assert predict_peak(TASK, "E1/s87", 0, [], default_mib=12000, running_mib=13500) == Prediction(
        mib=13500, source="default"
    )
    assert predict_peak(TASK, "E1/s87", 0, [], default_mib=12000, running_mib=9000).mib == 12000
    learned = [sample("E1/s1", 8000)]
    assert predict_peak(TASK, "E1/s87", 0, learned, default_mib=12000, running_mib=13500).mib == 8000


def test_a_settled_siblings_plateau_stands_for_the_default_until_one_of_them_finishes() -> None:
    """Below the share (a small task's siblings then share a card minutes into a night) and
    above it; never below what the sibling holds; still a guess; a finished run beats it."""

    def peak(history: list[PeakSample], running: int | None, plateau: int | None) -> Prediction:
        return predict_peak(
            TASK, "E1/s87", 0, history, default_mib=12000, running_mib=running, plateau_mib=plateau
        )

    assert peak([], 5000, 6500) == Prediction(mib=6500, source="default")
    assert peak([], 15000, 19500) == Prediction(mib=19500, source="default")
    assert peak([], 9000, 8000).mib == 9000
    assert peak([sample("E1/s1", 8000)], 5000, 6500) == Prediction(mib=8000, source="task")


# --------------------------------------------------------------------------- run time


def run(job_id: str, seconds: float, *, tier: int = 0, task: str = TASK) -> RunSample:
    return RunSample(job_id=job_id, task=task, tier=tier, seconds=seconds)


@pytest.mark.parametrize(
    ("runs", "running_s", "expected"),
    [
        pytest.param([], None, Duration(seconds=None, source="unknown"), id="nothing-known"),
        pytest.param([], 1200.0, Duration(seconds=1200.0, source="running"), id="a-sibling-runs-so-long"),
        pytest.param(
            [run("E1/s87", 100), run("E1/s87", 300), run("E1/s1", 9000)],
            None,
            Duration(seconds=200, source="job"),
            id="own-runs-mean",
        ),
        pytest.param(
            [run("E1/s1", 100), run("E1/s2", 5000), run("E1/s3", 300)],
            1e6,
            Duration(seconds=300, source="task"),
            id="siblings-median-beats-running",
        ),
        pytest.param(
            [run("E1/s1", 400, tier=1), run("E1/s2", 900, tier=3), run("E1/s3", 50, task="other")],
            None,
            Duration(seconds=400, source="task"),
            id="nearest-tier-of-the-task",
        ),
    ],
)
def test_run_time_is_learned_like_peaks(runs: list[RunSample], running_s: float | None, expected: Duration):
    assert predict_duration(TASK, "E1/s87", 0, runs, running_s=running_s) == expected


# --------------------------------------------------------------------------- TaskHistory

_JOBS = st.sampled_from(["j0", "j1", "j2", "j3"])
#: an ended attempt as the store gives it (predict.HistoryRow) but its order, which is its place
_ROW = st.tuples(
    st.just(TASK),
    _JOBS,
    st.integers(0, 2),
    st.one_of(st.none(), st.integers(0, 30_000)),
    st.sampled_from(["ok", "ok", "ok", "oom", "error"]),
    st.one_of(st.none(), st.integers(0, 30_000)),
    st.one_of(st.none(), st.floats(1.0, 9e4)),
)
#: few attempts, or enough that a tier's p90 is not simply its largest (ten or more)
_ROWS = st.one_of(st.lists(_ROW, max_size=12), st.lists(_ROW, min_size=30, max_size=80))


#: (default_mib, usable_mib, running_mib) as placement passes them
_FALLBACKS = ((9000, 20_000, None), (None, None, None), (4000, None, 12_000))


@given(_ROWS, st.randoms(use_true_random=False))
def test_a_kept_task_history_predicts_what_a_pass_over_its_samples_does(drawn, rng) -> None:  # type: ignore[no-untyped-def]
    """The daemon keeps each task's history as runs end (``TaskHistory``) instead of passing over
    every sample each tick: for any ended attempts, added one by one in their order or in any
    order, a few at a time, or read whole at once (``extend``, as the daemon's start does) or in
    two reads, it must predict exactly what ``predict_peak`` and ``predict_duration`` do over the
    same samples, and its maxima be ``peak_maxima``'s; and its peaks must be, for one read as
    ``status`` reads it (the task's peaks summed up per tier, and a few jobs' own runs), for those
    jobs."""
    from gpusched.memory import peak_maxima
    from gpusched.predict import TaskHistory

    # a run time only for a success, as the store gives one; the order is the attempt's place
    rows = [(*r[:6], r[6] if r[4] == "ok" else None, k) for k, r in enumerate(drawn)]
    samples = [
        PeakSample(job_id=j, task=t, tier=tier, peak_mib=peak, outcome=o, predicted_mib=placed)
        for t, j, tier, peak, o, placed, _, _ in rows
    ]
    runs = [
        RunSample(job_id=j, task=t, tier=tier, seconds=sec, attempt_id=k)
        for t, j, tier, _, _, _, sec, k in rows
        if sec is not None
    ]
    in_order, shuffled, few, whole, two_reads = (TaskHistory(TASK) for _ in range(5))
    for r in rows:
        in_order.add([r])
    for r in rng.sample(rows, len(rows)):
        shuffled.add([r])
    for i in range(0, len(rows), 3):
        few.add(rows[i : i + 3])
    whole.extend(rng.sample(rows, len(rows)))
    half = len(rows) // 2
    two_reads.extend(rows[half:])
    two_reads.extend(rows[:half])
    # status asks a few jobs' peaks: the task's summed up per tier, and those jobs' own runs
    asked = TaskHistory(TASK)
    asked.extend_peaks(
        (
            tier,
            rng.sample(oks := [r[3] for r in at if r[4] == "ok" and r[3] is not None], len(oks)),
            len(ooms := [r for r in at if r[4] == "oom"]),
            max((r[3] for r in ooms if r[3] is not None), default=None),
            max((r[5] for r in ooms if r[5] is not None), default=None),
        )
        for tier in range(3)
        if (at := [r for r in rows if r[2] == tier])
    )
    asked.extend_own(r for r in rows if r[1] in ("j0", "j9"))
    ok, floor = peak_maxima(samples)
    for h in (in_order, shuffled, few, whole, two_reads, asked):
        assert h.maxima() == ({t: m for (_, t), m in ok.items()}, {t: m for (_, t), m in floor.items()})
        jobs = {s.job_id for s in samples}
        assert h.jobs == (jobs & {"j0", "j9"} if h is asked else jobs)
        for job in ("j0", "j9") if h is asked else ("j0", "j1", "j9"):
            for tier in range(5):
                for default, usable, running, plateau in (
                    (9000, 20_000, None, None),
                    (None, None, None, None),
                    (4000, None, 12_000, None),
                    (9000, 20_000, 5000, 6500),
                    (None, None, 12_000, 10_000),
                ):
                    kw = {"default_mib": default, "usable_mib": usable, "running_mib": running}
                    kw["plateau_mib"] = plateau
                    assert h.peak(job, tier, **kw) == predict_peak(TASK, job, tier, samples, **kw)  # type: ignore[arg-type]
                for running_s in (None, 30.0):
                    if h is asked:  # (it knows its jobs' own run times only: status shows none)
                        break
                    assert h.duration(job, tier, running_s=running_s) == predict_duration(
                        TASK, job, tier, runs, running_s=running_s
                    )
