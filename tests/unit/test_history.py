"""``memwatch.History``: the daemon's runs' peaks and run times, read whole once and then kept up
to date from the attempts it ends. What a tick predicts from must be what a fresh read of the
store says, whatever happened in between; and a tick must not read the whole history again."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import msgspec
import pytest

from gpusched import memory, memwatch, predict
from gpusched.model import Classification, ExitRecord, Outcome, Step, StepKind
from gpusched.store import Store
from tests.unit.test_store import make_suite, new_attempt, start, submit

OK = Classification(outcome=Outcome.OK, reason="exit 0")
OOM = Classification(outcome=Outcome.OOM, reason="CUDA out of memory")
ERROR = Classification(outcome=Outcome.ERROR, reason="exit 1")
DONE = Step(kind=StepKind.DONE, tier=0, reason="succeeded")
FAILED = Step(kind=StepKind.FAIL, tier=1, reason="failed")
AGAIN = Step(kind=StepKind.REQUEUE, tier=1, reason="requeued one tier down")


def end(store: Store, job_id: str, token: str, peak_mib: int, *, oom: bool = False, at: float = 10.0) -> int:
    """One attempt of ``job_id``, started at 1 s and ended at ``at`` with ``peak_mib``."""
    aid = start(store, job_id, token=token)
    store.mark_running(aid, {"pid": 1}, now=1.0)
    rec = ExitRecord(exit_code=1 if oom else 0, peak_mib=peak_mib, started_at=1.0, ended_at=at)
    store.finish_attempt(aid, exit=rec, result=OOM if oom else OK, step=AGAIN if oom else DONE, now=at)
    return aid


JOBS = ("E1/j0", "E1/j1", "E1/j2", "E2/j0", "E2/j1")


def same_as_fresh(
    history: memwatch.History, store: Store, tasks: list[str], asked: tuple[str, ...] | None = None
) -> bool:
    """What ``history`` predicts for every job (of ``asked``, what it was made for) and tier of
    ``tasks`` is what a pass over the store's records predicts (``predict_peak``,
    ``predict_duration``), and its maxima theirs."""
    kept = history.read(set(tasks))
    peaks, runs = memwatch.records(store, tasks)
    assert set(kept) == {t for t in tasks if peaks.get(t)}
    for task in tasks:
        h = kept.get(task) or predict.TaskHistory(task)
        assert h.jobs == {s.job_id for s in peaks.get(task, []) if asked is None or s.job_id in asked}
        for job in JOBS if asked is None else asked:
            for tier in (0, 1, 2):
                kw = {"default_mib": 4000, "usable_mib": 20_000}
                assert h.peak(job, tier, **kw) == predict.predict_peak(
                    task, job, tier, peaks.get(task, []), **kw
                )
                if asked is None:  # (a history for a few jobs' peaks knows their own run times only)
                    assert h.duration(job, tier) == predict.predict_duration(
                        task, job, tier, runs.get(task, [])
                    )
    assert history.maxima(set(tasks)) == memory.peak_maxima(s for ss in peaks.values() for s in ss)
    return True


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(tmp_path / "gs.db")
    submit(s, make_suite(n=6))
    return s


def test_the_kept_history_predicts_what_a_fresh_read_does_after_every_end(store: Store) -> None:
    history = memwatch.History(store)
    assert history.read({"t"}) == {}
    end(store, "E1/j0", "a", 9000, oom=True)  # an OOM: a peak, no run time
    end(store, "E1/j1", "b", 8000, at=20.0)
    assert same_as_fresh(history, store, ["t"])
    end(store, "E1/j0", "c", 7000, at=30.0)  # j0 again, after j1's attempt
    end(store, "E1/j2", "d", 7500, at=40.0)
    assert same_as_fresh(history, store, ["t"])
    h = history.read({"t"})["t"]
    assert h.peak("E1/j9", 0, default_mib=None) == predict.Prediction(mib=8000, source="task")
    assert h.peak("E1/j0", 0, default_mib=None) == predict.Prediction(
        mib=9000, source="job"
    )  # its OOM's floor
    assert h.duration("E1/j1", 0).seconds == 19.0 and h.duration("E1/j9", 0).seconds == 29.0
    assert history.maxima({"t"}) == ({("t", 0): 8000}, {("t", 0): 9000})
    assert history.maxima({"u"}) == ({}, {})


def test_a_tick_reads_the_runs_that_ended_not_the_whole_history(store: Store) -> None:
    history = memwatch.History(store)
    for k in range(4):
        end(store, f"E1/j{k}", f"t{k}", 8000 + k)
    history.read({"t"})
    seen: list[str] = []
    store.db.set_trace_callback(seen.append)
    end(store, "E1/j4", "t4", 9000)
    del seen[:]
    assert history.read({"t"})["t"].peak("E1/j4", 0, default_mib=None).mib == 9000
    reads = [q for q in seen if "FROM attempts a JOIN jobs j" in q]
    assert len(reads) == 1 and "a.id IN (" in reads[0] and "j.task IN" not in reads[0], reads
    del seen[:]
    history.read({"t"})  # nothing ended since: no read at all
    assert not [q for q in seen if "FROM attempts a JOIN jobs j" in q]
    store.db.set_trace_callback(None)
    assert same_as_fresh(history, store, ["t"])


def test_a_history_read_whole_is_one_query_however_many_tasks_it_asks_for(store: Store) -> None:
    """A plan without ``task:`` makes each job its own task, and the predictions of a 10k-job
    queue ask for every one: read 500 names a query, each query walked every run of the store
    again. The names go to SQLite in one JSON array, and a tick's reaps are matched to the tasks
    read so far in Python, not by a list of every name."""
    end(store, "E1/j0", "a", 8000)
    end(store, "E1/j1", "b", 8200)
    many = {"t", *(f"task{k}" for k in range(1200))}  # (only "t" has runs)
    history = memwatch.History(store)
    seen: list[str] = []
    store.db.set_trace_callback(seen.append)
    kept = history.read(many)
    assert len([q for q in seen if "FROM attempts a JOIN jobs j" in q]) == 1, seen
    assert set(kept) == {"t"} and kept["t"].jobs == {"E1/j0", "E1/j1"}
    end(store, "E1/j2", "c", 8400)
    del seen[:]
    assert history.read(many)["t"].jobs == {"E1/j0", "E1/j1", "E1/j2"}
    (read,) = [q for q in seen if "FROM attempts a JOIN jobs j" in q]
    assert len(read) < 1500, read  # the reaped attempt's id, not 1,201 task names
    store.db.set_trace_callback(None)
    assert same_as_fresh(history, store, ["t", "task7"])


def test_another_connections_commit_or_a_rollback_makes_it_read_again(store: Store, tmp_path: Path) -> None:
    history = memwatch.History(store)
    end(store, "E1/j0", "a", 8000)
    history.read({"t"})
    other = Store(tmp_path / "gs.db")  # a client, or a daemon before a restart: its ends are not in .exited
    end(other, "E1/j1", "b", 8500)
    other.close()
    assert same_as_fresh(history, store, ["t"]) and history.read({"t"})["t"].jobs == {"E1/j0", "E1/j1"}
    aid = start(store, "E1/j2", token="c")
    with pytest.raises(sqlite3.IntegrityError), store.tx():  # the end is undone with its transaction
        store.finish_attempt(aid, exit=ExitRecord(exit_code=0, peak_mib=1), result=OK, step=DONE, now=5.0)
        assert "E1/j2" in history.read({"t"})["t"].jobs  # read before the undo
        store.db.execute("INSERT INTO jobs(id) VALUES ('E1/j0')")  # fails: the whole transaction goes
    assert same_as_fresh(history, store, ["t"]) and history.read({"t"})["t"].jobs == {"E1/j0", "E1/j1"}


def test_a_task_asked_for_later_is_read_whole_once(store: Store) -> None:
    suite = make_suite("E2", n=2)
    submit(store, suite)
    with store.tx():
        store.db.execute("UPDATE jobs SET task = 'u' WHERE suite = 'E2'")
    history = memwatch.History(store)
    end(store, "E1/j0", "a", 8000)
    end(store, "E2/j0", "b", 6000)
    assert same_as_fresh(history, store, ["t"])
    end(store, "E2/j1", "c", 6100)  # of a task not read yet: ends before it is asked for
    assert same_as_fresh(history, store, ["t", "u"])
    assert history.read({"u"})["u"].jobs == {"E2/j0", "E2/j1"}


def test_a_history_for_a_few_jobs_peaks_predicts_for_them_what_a_whole_read_does(store: Store) -> None:
    """``status`` asks the peaks of the few jobs standing for the queue's kinds, and shows no run
    time: it reads each task's peaks summed up per tier by SQLite (a row a tier, where a store of
    10,000 runs gave 10,000 rows) and only those jobs' own runs, and must predict for them what
    the daemon's whole read predicts: their own runs first, the task's p90 of every success, its
    OOMs and what they were placed with, someone else's crash left out."""
    submit(store, make_suite("E2", n=14))
    end(store, "E1/j0", "a", 9000, oom=True)  # E1/j0: an OOM of its own
    for k in range(1, 6):
        end(store, f"E1/j{k}", f"e{k}", 6000 + 700 * k, at=10.0 + k)
    for k in range(11):  # with E1's, 15 successes: the p90 is not the largest
        end(store, f"E2/j{k}", f"f{k}", 9000 - 50 * k, at=30.0 - k)
    crashed = end(store, "E2/j11", "x", 30_000, oom=True)
    store.add_arrival(crashed, [4242], 20_000)  # an outsider came onto the card: not its need
    # tier 1, where nothing succeeded: E1/j0's second OOM, placed with 4 GiB, beside an error
    # that reported a peak and was placed with more than a card (neither is a success, and only
    # the OOM's placement says whether the tier fits a card); tier 2: an error with a peak alone
    for job, token, tier, placed, result in (
        ("E1/j0", "oom1", 1, 4000, OOM),
        ("E2/j12", "err1", 1, 25_000, ERROR),
        ("E2/j13", "err2", 2, 25_000, ERROR),
    ):
        at = msgspec.structs.replace(new_attempt(job, token), tier=tier, tier_name="ABC"[tier])
        aid = store.begin_attempt(at, now=40.0)
        store.mark_running(aid, {"pid": 1}, now=40.0)
        store.db.execute("UPDATE attempts SET predicted_mib = ? WHERE id = ?", (placed, aid))
        rec = ExitRecord(
            exit_code=1, peak_mib=9500 if result is OOM else 50_000, started_at=40.0, ended_at=50.0
        )
        store.finish_attempt(aid, exit=rec, result=result, step=FAILED, now=50.0)
    for asked in (("E1/j0", "E2/j11"), ("E1/j2", "E2/j12"), ("E2/j99",), JOBS):
        history = memwatch.History(store, jobs=asked)
        seen: list[str] = []
        store.db.set_trace_callback(seen.append)
        assert "E2/j11" not in history.read({"t"})["t"].jobs  # its only run was the crash
        store.db.set_trace_callback(None)
        assert same_as_fresh(history, store, ["t"], asked)
        reads = [q for q in seen if "FROM attempts a JOIN jobs j" in q]
        assert len(reads) == 2 and "a.job_id IN (" in reads[0], reads  # the jobs' own runs, then
        assert "group_concat(" in reads[1] and "GROUP BY j.task, a.tier" in reads[1], reads  # the peaks
