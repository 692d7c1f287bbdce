"""``gpusched status``: the rows it shows are the store's records, queued jobs get the
prediction the scheduler would use, the text table fits the terminal, and the command stays
light (no rich, yaml, psutil or NVML on its path)."""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from msgspec.structs import replace

from gpusched import memwatch, status_rows
from gpusched.attempt import AttemptPaths
from gpusched.model import GpuPlan, JobSpec, Suite
from gpusched.placement import DEFAULT_HEADROOM_FRAC
from gpusched.views import _wrap, format_status, status
from tests.unit.test_memory_scheduler import GIB, TIERS, Box, make_suite, oom_tail

ROOT = Path(__file__).resolve().parent.parent.parent
#: The keys of a ``status --json`` job entry, as the README lists them: scripts rely on them.
JOB_KEYS = (
    "id", "suite", "name", "state", "tier", "tier_index", "attempt", "gpu", "outcome", "reason", "line",
    "log", "runtime_s", "started_at", "ended_at", "predicted_mib", "prediction_source", "peak_mib",
    "cancel_requested", "backend_handle", "tiers", "start_tier", "last_line", "quiet_s", "suspended",
    "stopping", "slurm",
)  # fmt: skip


def mixed_suite(tmp: Path) -> Suite:
    """Jobs of three tasks, interleaved: some will run, OOM and come back, most stay queued."""
    names = [(f"{i}-{task}", task) for i in range(6) for task in ("qnli", "sst2", "rte")]
    (tmp / "train.py").touch()  # the script its command runs: launches wait while it is missing
    return Suite(
        name="E1",
        plan_path=str(tmp / "E1.yaml"),
        workdir=str(tmp),
        logs_dir=str(tmp / "logs" / "E1"),
        command="python train.py --config {config}",
        base_config=None,
        tiers=TIERS,
        jobs=tuple(JobSpec(suite="E1", name=n, task=t) for n, t in names),
    )


def busy_box(tmp_path: Path) -> Box:
    """Three cards: one job succeeded, one OOMed and is queued again with a history of its
    own, one running, the rest queued (draining: nothing new starts)."""
    box = Box(tmp_path, GpuPlan(gpus=(0, 1, 2), slots=(1, 1, 1)), cards="3x24GiB")
    box.submit(mixed_suite(tmp_path))
    box.tick()
    box.store.set_flag("draining", "1")
    box.ex.finish(box.ex.token_of("E1/0-qnli"), exit_code=0, runtime={"peak_mib": 9 * GIB})
    box.ex.finish(
        box.ex.token_of("E1/0-sst2"), exit_code=1, output=oom_tail(23.5), runtime={"peak_mib": 23 * GIB}
    )
    box.tick()
    return box


def test_each_job_is_its_record_and_its_newest_attempt(tmp_path: Path) -> None:
    box = busy_box(tmp_path)
    box.store.request_cancel(["E1/0-rte"])  # running: asked to stop, not stopped yet
    docs = {d["id"]: d for d in box.status()["jobs"]}
    jobs = box.store.jobs()
    assert [j.id for j in jobs if j.cancel_requested] == ["E1/0-rte"]
    assert list(docs) == [j.id for j in jobs]  # submission order
    for job in jobs:
        d = docs[job.id]
        attempts = box.store.attempts(job.id)
        last = attempts[-1] if attempts else None
        assert (d["state"], d["attempt"], d["tier_index"], d["outcome"]) == (
            job.state.value,
            job.attempts,
            job.tier,
            job.outcome,
        )
        assert d["log"] == (str(AttemptPaths(Path(last.dir)).output) if last else None)
        assert d["gpu"] == (last.gpu if last else None)
        assert d["started_at"] == (last.started_at if last else None)
        assert d["peak_mib"] == (last.peak_mib if last else None)
        assert d["backend_handle"] == (last.handle if last else None)
        assert d["cancel_requested"] is job.cancel_requested
        assert d["tier"] == TIERS[job.tier].name and d["tiers"] == len(TIERS)
        if job.state.value == "running":
            assert "last_line" in d and d["runtime_s"] is not None
    assert json.loads(json.dumps(docs)) == docs  # plain data


def test_status_json_is_the_status_document_as_text(tmp_path: Path) -> None:
    """``status --json`` splices the entries SQLite wrote into the rest of the document: the
    text must parse to what Status.doc gives (every key, in order, for every kind of job), and
    every entry has the same keys, null where they do not apply."""
    box = busy_box(tmp_path)
    (Path(box.attempt("E1/0-rte").dir) / "output.log").write_text("step 3/9\nstep 4/9 loss 0.5\n")
    args = {"daemon": None, "now": box.now, "trees": box._trees, "host": box.host}
    text = status(box.store, box.probe.snapshot(), **args).text()  # type: ignore[arg-type]
    doc = box.status()
    assert list(json.loads(text)) == list(doc) and json.loads(text) == doc
    states = {j["state"] for j in doc["jobs"]}
    assert {"queued", "running", "succeeded"} <= states
    assert {tuple(j) for j in doc["jobs"]} == {JOB_KEYS}  # the same keys, in the same order, for all
    running = next(j for j in doc["jobs"] if j["id"] == "E1/0-rte")
    assert running["last_line"] == "step 4/9 loss 0.5" and running["slurm"] is None
    assert all(j["last_line"] is None for j in doc["jobs"] if j["state"] != "running")


def test_every_entry_is_written_alike_so_a_grep_finds_the_running_jobs_too(tmp_path: Path) -> None:
    """``status --json | grep '"state":"running"'`` finds the running jobs as it finds the others:
    their entries, completed in Python, are written as SQLite writes the rest (no spaces,
    characters as they are), with ``--fields`` too."""
    box = busy_box(tmp_path)
    (Path(box.attempt("E1/0-rte").dir) / "output.log").write_text("step 4/9 loss 0.5 ✓\n")
    args = {"daemon": None, "now": box.now, "trees": box._trees, "host": box.host}
    for fields in (None, ("id", "state", "last_line")):
        text = status(box.store, box.probe.snapshot(), fields=fields, **args).text()  # type: ignore[arg-type]
        jobs = json.loads(text)["jobs"]
        assert "running" in {j["state"] for j in jobs}
        for state in {j["state"] for j in jobs}:
            assert text.count(f'"state":"{state}"') == sum(j["state"] == state for j in jobs), (fields, state)
        assert '"last_line":"step 4/9 loss 0.5 ✓"' in text


def test_a_job_that_waits_out_a_backoff_says_until_when(tmp_path: Path) -> None:
    """A job requeued after a wait (a retried error, a full disk, the network) said "in 300 s",
    and nobody reading status later knew from when: its reason now says until when, in the
    table and in the JSON."""
    from gpusched.views import format_status

    box = busy_box(tmp_path)
    with box.store.tx():
        box.store.db.execute("UPDATE jobs SET not_before = ? WHERE id = 'E1/3-rte'", (box.now + 300,))
        box.store.db.execute("UPDATE jobs SET not_before = ? WHERE id = 'E1/4-rte'", (box.now - 1,))
    jobs = {j["id"]: j for j in box.status()["jobs"]}
    until = time.strftime("%H:%M:%S", time.localtime(box.now + 300))
    assert jobs["E1/3-rte"]["reason"].endswith(f" (waits until {until})")
    assert "waits until" not in (jobs["E1/4-rte"]["reason"] or "")  # its wait is over
    row = next(ln for ln in format_status(box.status(), width=250).splitlines() if "E1/3-rte" in ln)
    assert f"(waits until {until})" in row


def test_a_coloured_progress_bar_is_shown_as_the_text_it_draws(tmp_path: Path) -> None:
    """A trainer's coloured logger and its progress bar (colours, ``\\r`` redraws, a window
    title, a hyperlink) write terminal controls into output.log: ``status`` shows what the
    pane showed, the last redraw, not ``[1;31m`` remnants or the whole bar's history."""
    box = busy_box(tmp_path)
    bar = "".join(f"\r\x1b[32mEpoch 1:\x1b[0m {i}/200 \x1b[K" for i in range(80))
    log = f"\x1b]0;train\x07\x1b[1;31mWARN\x1b[0m \x1b]8;;http://wandb\x1b\\run\x1b]8;;\x1b\\\n{bar}"
    (Path(box.attempt("E1/0-rte").dir) / "output.log").write_text(log)
    running = next(j for j in box.status()["jobs"] if j["id"] == "E1/0-rte")
    assert running["last_line"] == "Epoch 1: 79/200"
    (Path(box.attempt("E1/0-rte").dir) / "output.log").write_text(log.split("\n")[0] + "\n\n")
    running = next(j for j in box.status()["jobs"] if j["id"] == "E1/0-rte")
    assert running["last_line"] == "WARN run"


def test_a_tier_past_the_suites_last_shows_the_last_ones_name(tmp_path: Path) -> None:
    """A job whose tier index is past its suite's tiers (a plan re-submitted with fewer)
    shows the last tier's name and its own index."""
    box = busy_box(tmp_path)
    with box.store.tx():
        box.store.db.execute("UPDATE jobs SET tier = 9 WHERE id = 'E1/3-rte'")
    job = next(j for j in box.status()["jobs"] if j["id"] == "E1/3-rte")
    assert (job["tier"], job["tier_index"], job["tiers"]) == (TIERS[-1].name, 9, len(TIERS))


def test_suites_that_ended_are_not_decoded_yet_their_jobs_show_their_own_tiers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store keeps every suite ever submitted: status reads their GPU plans and tier names
    from their rows without decoding them (15 ms a status with 250 suites); only a suite
    whose queued jobs are predicted is. Each job still shows its own suite's tier names."""
    from gpusched import codec
    from gpusched.model import Tier

    box = busy_box(tmp_path)
    for i in range(30):
        ladder = (Tier(name=f"x{i}"), Tier(name=f"y{i}"))
        old = replace(mixed_suite(tmp_path), name=f"old{i}", tiers=ladder)
        box.submit(replace(old, jobs=tuple(replace(j, suite=old.name) for j in old.jobs[:2])))
        box.store.request_cancel([f"old{i}/0-qnli", f"old{i}/0-sst2"])
    box.store.db.execute("UPDATE jobs SET tier = 1 WHERE id = 'old7/0-sst2'")
    decoded: list[str] = []
    real = codec.suite_from_json
    monkeypatch.setattr(codec, "suite_from_json", lambda text: decoded.append(text) or real(text))
    jobs = {j["id"]: j for j in box.status()["jobs"]}
    assert len(decoded) == 1  # E1, whose queued jobs are predicted
    assert (jobs["old7/0-sst2"]["tier"], jobs["old7/0-sst2"]["tiers"]) == ("y7", 2)
    assert (jobs["old29/0-qnli"]["tier"], jobs["old29/0-qnli"]["state"]) == ("x29", "cancelled")
    assert jobs["E1/5-rte"]["tier"] == TIERS[0].name and jobs["E1/5-rte"]["tiers"] == len(TIERS)


def test_with_no_suite_at_work_the_cards_slots_are_those_of_the_suites_shown(tmp_path: Path) -> None:
    """The GPU table's slots come from the plans of the suites at work; in the morning, when
    none is, from the suites the table shows (the last night's), not every plan ever given."""
    box = Box(tmp_path, GpuPlan(gpus=(0, 1, 2), slots=(1, 1, 1)), cards="3x24GiB")
    box.submit(mixed_suite(tmp_path))
    old = replace(mixed_suite(tmp_path), name="old")
    old = replace(old, jobs=tuple(replace(j, suite="old") for j in old.jobs[:1]))
    box.store.submit(
        old, GpuPlan(gpus=(0, 1, 2), slots=(3, 3, 3)), backend="fake", cwd=str(tmp_path), env_path=None
    )
    args = {"daemon": None, "now": box.now, "trees": box._trees, "host": box.host}
    at_work = status(box.store, box.probe.snapshot(), suites=["E1"], **args).doc()
    assert [g["slots"] for g in at_work["gpus"]] == [1, 1, 1]
    box.store.request_cancel([j.id for j in box.store.jobs()])
    shown = status(box.store, box.probe.snapshot(), suites=["E1"], **args).doc()
    assert [g["slots"] for g in shown["gpus"]] == [1, 1, 1]
    every = status(box.store, box.probe.snapshot(), **args).doc()
    assert [g["slots"] for g in every["gpus"]] == [3, 3, 3]


def test_an_sqlite_without_json_each_is_the_same_clear_error() -> None:
    """The tiers' names are read with json_each, a table-valued function of the same JSON1."""
    import sqlite3

    from gpusched.errors import StoreError

    needs = r"JSON functions.*no such table: json_each.*SQLite 3\.38"
    with pytest.raises(StoreError, match=needs), status_rows._json1():
        raise sqlite3.OperationalError("no such table: json_each")
    with pytest.raises(sqlite3.OperationalError, match="disk I/O error"), status_rows._json1():
        raise sqlite3.OperationalError("disk I/O error")


FIELD_SETS = [
    ("id", "state"),
    ("state", "id", "last_line", "runtime_s"),  # a running job's entry is completed, then narrowed
    ("predicted_mib", "prediction_source", "start_tier", "id"),
    ("tier", "tiers", "slurm", "reason"),
    tuple(reversed(JOB_KEYS)),
]


@pytest.mark.parametrize("fields", FIELD_SETS, ids=[",".join(f[:4]) for f in FIELD_SETS])
def test_fields_narrow_each_entry_to_those_keys_of_the_full_one(
    tmp_path: Path, fields: tuple[str, ...]
) -> None:
    """``status --fields``: each job entry has the keys asked for, in that order, with the
    values the full entry has (predictions, a running job's last line and runtime included);
    the rest of the document is the same."""
    box = busy_box(tmp_path)
    (Path(box.attempt("E1/0-rte").dir) / "output.log").write_text("step 4/9 loss 0.5\n")
    args = {"daemon": None, "now": box.now, "trees": box._trees, "host": box.host}
    full = json.loads(status(box.store, box.probe.snapshot(), **args).text())  # type: ignore[arg-type]
    narrow = json.loads(status(box.store, box.probe.snapshot(), fields=fields, **args).text())  # type: ignore[arg-type]
    assert [list(j) for j in narrow["jobs"]] == [list(fields)] * len(full["jobs"])
    assert narrow["jobs"] == [{k: j[k] for k in fields} for j in full["jobs"]]
    assert {k: v for k, v in narrow.items() if k != "jobs"} == {k: v for k, v in full.items() if k != "jobs"}
    running = next(j for j in full["jobs"] if j["state"] == "running")
    assert running["last_line"] == "step 4/9 loss 0.5" and running["runtime_s"] is not None
    assert any(j["predicted_mib"] for j in full["jobs"] if j["state"] == "queued")


def test_fields_on_the_command_line(tmp_path: Path) -> None:
    """``--fields`` implies ``--json``; a key that is no job key is one line naming the
    likely one (or all of them), exit 2."""
    box = busy_box(tmp_path)
    box.store.close()
    (tmp_path / "home").mkdir()
    (tmp_path / "gs.db").rename(tmp_path / "home" / "gpusched.db")
    env = {k: v for k, v in os.environ.items() if k != "GPUSCHED_FAKE_GPUS"}
    env.update(GPUSCHED_HOME=str(tmp_path / "home"), GPUSCHED_FAKE_GPUS="3x24GiB")

    def gs(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "gpusched", "status", *args]
        return subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)

    ok = gs("--fields", "id, state,id")
    assert ok.returncode == 0, ok.stderr
    assert {tuple(j) for j in json.loads(ok.stdout)["jobs"]} == {("id", "state")}
    for bad, needle in (
        ("id,stat", "no job key 'stat' (did you mean 'state'?)"),
        ("zzz", "the keys are id, suite"),
    ):
        r = gs("--fields", bad)
        assert r.returncode == 2 and r.stdout == "" and needle in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def _watching(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[str], Path]:
    """``gpusched status --watch --interval 0.1 ARGS`` on :func:`busy_box`'s store, running,
    its output in a pipe; and the store's path."""
    box = busy_box(tmp_path)
    box.store.close()
    (tmp_path / "home").mkdir()
    db = tmp_path / "home" / "gpusched.db"
    (tmp_path / "gs.db").rename(db)
    env = {k: v for k, v in os.environ.items() if k != "GPUSCHED_FAKE_GPUS"}
    env.update(GPUSCHED_HOME=str(tmp_path / "home"), GPUSCHED_FAKE_GPUS="3x24GiB")
    argv = [sys.executable, "-m", "gpusched", "status", "--watch", "--interval", "0.1", *args]
    return subprocess.Popen(
        argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ), db


def _interrupted(proc: subprocess.Popen[str]) -> tuple[int, str]:
    """Ctrl-C to a running ``status --watch``: its exit code and what it wrote to stderr."""
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


def test_json_watch_writes_a_document_a_line_read_afresh_until_ctrl_c(tmp_path: Path) -> None:
    """``status --json --watch``: a status document a line (JSON Lines) every ``--interval``,
    each read from the store afresh, so a script that follows the queue (``| jq``) sees a
    change without running status again; Ctrl-C ends it with 130 and no traceback. (--watch
    beside --json was ignored before: one document, then exit.)"""
    from gpusched.store import Store

    proc, db = _watching(tmp_path, "--json")

    def rte() -> dict[str, Any]:
        """E1/0-rte's entry in the next document."""
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, "status --json --watch ended by itself"
        return next(j for j in json.loads(line)["jobs"] if j["id"] == "E1/0-rte")

    try:
        assert rte()["cancel_requested"] is False  # running, not asked to stop
        store = Store(db)
        store.request_cancel(["E1/0-rte"])
        store.close()
        documents = 1
        while not rte()["cancel_requested"]:  # a later document shows it
            documents += 1
            assert documents < 600, "status --json --watch never showed the cancel asked of E1/0-rte"
    finally:
        code, err = _interrupted(proc)
    assert code == 130 and "Traceback" not in err, err


def test_watch_redraws_the_table_until_ctrl_c(tmp_path: Path) -> None:
    """The plain ``--watch`` into a pipe: the table again every ``--interval``, each after a
    blank line; Ctrl-C ends it with 130 and no traceback."""
    proc, _ = _watching(tmp_path)
    try:
        assert proc.stdout is not None
        frames = 0
        while frames < 3:
            line = proc.stdout.readline()
            assert line, "status --watch ended by itself"
            frames += line.startswith("Jobs (")  # (each table's title)
    finally:
        code, err = _interrupted(proc)
    assert code == 130 and "Traceback" not in err, err


def test_a_slurm_attempt_shows_its_slurm_job_and_running_ones_what_the_cli_adds(tmp_path: Path) -> None:
    from gpusched.model import Classification, ExitRecord, Outcome, Step, StepKind
    from gpusched.store import NewAttempt, Store
    from gpusched.views import status

    store = Store(tmp_path / "db.sqlite")
    suite = mixed_suite(tmp_path)
    store.submit(suite, GpuPlan(gpus=(0,), slots=(2,)), backend="slurm", cwd=str(tmp_path), env_path=None)
    for k, job in enumerate(suite.jobs[:2]):
        new = NewAttempt(
            job_id=job.id, tier=0, tier_name="A", gpu=0, gpu_uuid=None, backend="slurm",
            dir=str(tmp_path / job.name), token=f"t{k}", placement_reason="test",
        )  # fmt: skip
        aid = store.begin_attempt(new, now=1.0)
        store.mark_running(aid, {"slurm_job_id": 40 + k}, now=2.0)
    done = ExitRecord(exit_code=0, started_at=2.0, ended_at=5.0)
    ok = Classification(outcome=Outcome.OK, reason="exit 0")
    store.finish_attempt(
        aid, exit=done, result=ok, step=Step(kind=StepKind.DONE, tier=0, reason="ok"), now=5.0
    )

    def add_state(running: list[dict]) -> None:  # type: ignore[type-arg]
        for j in running:
            j["slurm"]["state"] = "RUNNING"

    doc = status(store, [], daemon=None, now=10.0, running=add_state).doc()
    jobs = {j["id"]: j for j in doc["jobs"]}
    assert jobs[suite.jobs[0].id]["slurm"] == {"job_id": 40, "state": "RUNNING"}
    assert jobs[suite.jobs[0].id]["runtime_s"] == 8.0
    assert jobs[suite.jobs[1].id]["slurm"] == {"job_id": 41}  # ended: not asked of Slurm
    assert jobs[suite.jobs[1].id]["runtime_s"] == 3.0
    assert jobs[suite.jobs[2].id]["slurm"] is None


def test_a_running_job_someone_stopped_is_shown_suspended_until_it_goes_on(tmp_path: Path) -> None:
    """A job stopped by a signal (``kill -STOP``) neither runs nor prints but holds its slot and
    its memory: status names its stopped processes and how to resume them, instead of a quiet
    job that looks hung. Real processes: a group of this machine's, stopped and continued;
    a job on another machine is not looked for here."""
    import signal

    from gpusched.home import this_host
    from gpusched.store import NewAttempt, Store

    store = Store(tmp_path / "db.sqlite")
    suite = mixed_suite(tmp_path)
    store.submit(
        suite, GpuPlan(gpus=(0,), slots=(2,)), backend="subprocess", cwd=str(tmp_path), env_path=None
    )
    job = subprocess.Popen(["sleep", "60"], start_new_session=True)  # leads its own group, as a wrapper does
    try:
        handles = [
            {"pid": job.pid, "pid_started_at": time.time(), "token": "t0", "host": this_host()},
            {"pid": job.pid, "pid_started_at": time.time(), "token": "t1", "host": "another-box"},
        ]
        for k, handle in enumerate(handles):
            new = NewAttempt(
                job_id=suite.jobs[k].id, tier=0, tier_name="A", gpu=0, gpu_uuid=None, backend="subprocess",
                dir=str(tmp_path / suite.jobs[k].name), token=f"t{k}", placement_reason="test",
            )  # fmt: skip
            store.mark_running(store.begin_attempt(new, now=1.0), handle, now=2.0)

        def shown() -> tuple[dict[str, Any], dict[str, Any], str]:
            doc = status(store, [], daemon=None).doc()
            jobs = {j["id"]: j for j in doc["jobs"]}
            return jobs[suite.jobs[0].id], jobs[suite.jobs[1].id], format_status(doc, width=None)

        here, there, _ = shown()
        assert here["suspended"] == [] and there["suspended"] is None
        job.send_signal(signal.SIGSTOP)
        assert os.WIFSTOPPED(os.waitpid(job.pid, os.WUNTRACED)[1])  # stopped now, not soon
        here, there, text = shown()
        assert here["suspended"] == [{"pid": job.pid, "name": "sleep"}] and there["suspended"] is None
        assert (
            f"suspended: pid {job.pid} (sleep) stopped by a signal; kill -CONT -- -{job.pid} resumes it"
            in text
        )
        assert text.count("suspended:") == 1
        job.send_signal(signal.SIGCONT)
        assert os.WIFCONTINUED(os.waitpid(job.pid, os.WCONTINUED)[1])
        here, _, text = shown()
        assert here["suspended"] == [] and "suspended" not in text
        assert status(store, [], daemon=None, fields=("id", "suspended")).doc()["jobs"][0] == {
            "id": suite.jobs[0].id,
            "suspended": [],
        }
    finally:
        job.kill()
        job.wait()


def test_queued_jobs_get_the_prediction_demands_gives_each_of_them(tmp_path: Path) -> None:
    """status asks about one job per kind (suite, task, tier, the task left out while no job
    of it has run; or the job itself once it has a history); every queued job must still show
    what memwatch.demands says of it alone."""
    box = busy_box(tmp_path)
    names = [f"solo-{i}" for i in range(5)]  # a plan without task: each job is its own task
    solo = replace(
        mixed_suite(tmp_path), name="solo", jobs=tuple(JobSpec(suite="solo", name=n, task=n) for n in names)
    )
    box.submit(replace(solo, jobs=(*solo.jobs, JobSpec(suite="solo", name="q", task="qnli"))))
    # the five untried tasks ask once; qnli ran
    assert len(status_rows.queued_kinds(box.store, suites=["solo"])[0]) == 2
    doc = box.status()
    queued = [j for j in box.store.jobs() if j.state.value == "queued"]
    assert any(j.attempts for j in queued) and len({j.task for j in queued}) == 3 + 5
    suites = {s.name: s for s in box.store.suites()}
    gpus = box.probe.snapshot()
    from gpusched import memory

    rooms = memory.rooms(gpus, {}, DEFAULT_HEADROOM_FRAC)
    want = memwatch.demands(box.store, queued, suites.get, gpus, rooms, headroom_frac=DEFAULT_HEADROOM_FRAC)
    shown = {d["id"]: d for d in doc["jobs"] if d["state"] == "queued"}
    assert set(shown) == set(want)
    for job_id, dm in want.items():
        pred = dm.prediction()
        got = shown[job_id]
        assert (got["predicted_mib"], got["prediction_source"], got["start_tier"]) == (
            pred.mib,
            pred.source,
            dm.view.tiers[dm.view.tier].name,
        ), job_id


def test_the_table_shows_where_an_ended_job_ran_and_no_card_for_a_queued_one(tmp_path: Path) -> None:
    box = busy_box(tmp_path)  # 0-qnli succeeded on a card, 0-sst2 OOMed there and waits again
    lines = format_status(box.status(), width=200).splitlines()
    rows = {ln.split("│")[1].strip(): ln.split("│") for ln in lines if ln.startswith("│ E1/")}
    ran = {a.job_id: str(a.gpu) for a in box.store.all_attempts()}
    assert rows["E1/0-qnli"][2].strip() == "succeeded" and rows["E1/0-qnli"][3].strip() == ran["E1/0-qnli"]
    assert rows["E1/0-rte"][2].strip() == "running" and rows["E1/0-rte"][3].strip() == ran["E1/0-rte"]
    assert rows["E1/0-sst2"][2].strip() == "queued" and rows["E1/0-sst2"][3].strip() == ""


def test_without_a_daemon_the_jobs_it_would_look_after_are_named_on_the_first_line(tmp_path: Path) -> None:
    """After a reboot (or a daemon killed), status still shows jobs "running": the first line
    says that nothing is looking after them, and how to bring it back."""
    box = busy_box(tmp_path)
    head = format_status(box.status(), width=200).splitlines()[0]
    c = box.status()["counts"]
    assert head.startswith(  # (busy_box drains too: its notice follows)
        f"daemon not running: the {c['running']} running and {c['queued']} queued shown wait for it"
        " (nothing is launched, nothing that ended is reaped); `gpusched daemon start`  DRAINING"
    )
    for job in box.store.jobs():
        box.store.request_cancel([job.id])
    box.tick()
    box.tick()
    box.store.set_flag("draining", None)
    head = format_status(box.status(), width=200).splitlines()[0]
    assert head == "daemon not running  (it starts with `gpusched submit`, or `gpusched daemon start`)"


def test_the_table_fits_the_terminal_and_keeps_every_word(tmp_path: Path) -> None:
    box = busy_box(tmp_path)
    doc = box.status()
    doc["jobs"][0]["reason"] = "a\rb\x1b[31m red\tword and averyveryveryverylongwordthatmustbefolded"
    for width in (200, 100, 60):
        text = format_status(doc, width=width)
        assert all(len(ln) <= width for ln in text.splitlines() if ln[:1] in "┏┃┡│└")
        assert "\x1b" not in text and "\r" not in text  # a log line's control codes never reach the terminal
    wide = format_status(doc, width=200)
    assert "│ E1/0-qnli " in wide and "[ok] a b[31m red word and averyveryvery" in wide
    assert "\x1b[" in format_status(doc, width=100, color=True)
    # at 82 columns the long reason column gives way before a job id is cut in two
    assert "│ E1/0-qnli " in format_status(doc, width=82)
    assert _wrap("one two three", 7) == ["one two", "three"]
    assert _wrap("abcdefghij", 4) == ["abcd", "efgh", "ij"]
    assert _wrap("數據集 ok", 4) == ["數據", "集", "ok"]  # wide characters take two columns


def test_a_failed_jobs_line_is_shown_once(tmp_path: Path) -> None:
    """A failure's matching line follows its reason, unless the reason is that line (a shell's
    "not found"), which was shown twice."""
    doc = busy_box(tmp_path).status()
    said = "launch.sh: no_such_trainer: not found"
    doc["jobs"][0].update(state="failed", outcome="error", reason=said, line=said)
    doc["jobs"][1].update(state="failed", outcome="error", reason="exited 1", line="ValueError: bad lr")
    text = format_status(doc, width=None)
    assert text.count(said) == 1 and "[error] exited 1: ValueError: bad lr" in text


@pytest.mark.parametrize(("columns", "width"), [(0, 80), (120, 120), (12, 20)])
def test_a_terminal_of_no_size_lays_the_tables_out_in_80_columns(
    monkeypatch: pytest.MonkeyPatch, columns: int, width: int
) -> None:
    """A terminal that says it has 0 columns (`script`, some consoles and editors' shells) got
    tables 20 columns wide, every word on a line of its own; it now gets 80, as Python's
    ``shutil.get_terminal_size`` falls back to. A terminal's own width is kept (20 at the least)."""
    from gpusched import cli_common

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

        def fileno(self) -> int:
            return 1

    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr(sys, "stdout", Tty())
    monkeypatch.setattr(os, "get_terminal_size", lambda fd: os.terminal_size((columns, 0)))
    assert cli_common.terminal()[0] == width


def test_a_narrow_terminal_cuts_every_other_column_before_a_job_id(tmp_path: Path) -> None:
    """A job's id is what a user copies into ``attach`` and ``logs``: at 60 columns every
    column is down to its longest word and words must be cut, the free text's first, the id's
    never while another column can give."""
    doc = busy_box(tmp_path).status()
    for width in (80, 70, 60):
        lines = format_status(doc, width=width).splitlines()
        cells = [ln.split("│")[1].strip() for ln in lines if ln.startswith("│ E1/")]
        assert sorted(cells) == sorted(j["id"] for j in doc["jobs"]), width
        assert all(len(ln) <= width for ln in lines if ln[:1] in "┏┃┡│└")


def test_an_output_that_cannot_write_a_jobs_characters_gets_utf8_json_and_an_ascii_table(
    tmp_path: Path,
) -> None:
    """Where stdout's encoding cannot write a character a job's log holds (a Latin-1 or ASCII
    locale, ``PYTHONIOENCODING=ascii``; a tqdm bar's ``█``): ``status --json`` still writes the
    JSON, as UTF-8; the table is boxed in ASCII and shows such a character as ``?``; ``logs``
    likewise. Never a traceback."""
    box = busy_box(tmp_path)
    (Path(box.attempt("E1/0-rte").dir) / "output.log").write_text("step 4/9 ██▌ grün\n", encoding="utf-8")
    box.store.close()
    (tmp_path / "home").mkdir()
    (tmp_path / "gs.db").rename(tmp_path / "home" / "gpusched.db")
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "GPUSCHED_FAKE_GPUS")}
    env.update(GPUSCHED_HOME=str(tmp_path / "home"), PYTHONIOENCODING="ascii")

    def gs(*args: str) -> str:
        argv = [sys.executable, "-m", "gpusched", *args]
        r = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, timeout=60)
        assert r.returncode == 0 and b"Traceback" not in r.stderr, (args, r.stderr.decode(errors="replace"))
        return r.stdout.decode("utf-8")

    for args in (("status", "--json"), ("status", "--fields", "id,last_line")):
        jobs = {j["id"]: j for j in json.loads(gs(*args))["jobs"]}
        assert jobs["E1/0-rte"]["last_line"] == "step 4/9 ██▌ grün", args
    table = gs("status")
    assert table.isascii() and "| E1/0-rte " in table and "step 4/9 ??? gr?n" in table
    assert "\n+===" in table  # the rule under the head, as rich's ASCII box draws it
    logs = gs("logs", "E1/0-rte")
    assert logs.isascii() and "step 4/9 ??? gr?n" in logs


def test_status_into_a_pipe_keeps_each_job_on_one_line(tmp_path: Path) -> None:
    """``gpusched status | grep qnli`` finds the job's whole row: out of a terminal and
    without COLUMNS the tables are as wide as their cells."""
    box = busy_box(tmp_path)
    box.store.close()
    (tmp_path / "home").mkdir()
    (tmp_path / "gs.db").rename(tmp_path / "home" / "gpusched.db")
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "GPUSCHED_FAKE_GPUS")}
    env["GPUSCHED_HOME"] = str(tmp_path / "home")
    r = subprocess.run(
        [sys.executable, "-m", "gpusched", "status"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    rows = [ln for ln in r.stdout.splitlines() if ln.startswith("│")]
    assert len(rows) == 3 + 18 and max(map(len, rows)) > 80  # one line a row, wider than rich's 80
    assert next(ln for ln in rows if "E1/0-qnli" in ln).split("│")[2].strip() == "succeeded"


def test_state_picks_the_jobs_shown_and_all_lifts_the_tables_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``status --state queued`` shows only those (the table otherwise shows 40 jobs, running
    and failed first, and sums the rest up); ``--all`` lists every one; the JSON narrows alike."""
    from gpusched import cli, views

    box = busy_box(tmp_path)  # 1 succeeded, 1 running, 16 queued
    box.store.close()
    (tmp_path / "home").mkdir()
    (tmp_path / "gs.db").rename(tmp_path / "home" / "gpusched.db")
    monkeypatch.setenv("GPUSCHED_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setattr(views, "MAX_TABLE_JOBS", 5)

    def rows(*argv: str) -> list[str]:
        assert cli.main(["status", *argv]) == 0
        out = capsys.readouterr().out
        return [ln.split("│")[2].strip() for ln in out.splitlines() if ln.startswith("│ E1/")]

    assert rows() == ["running", "queued", "queued", "queued", "queued"]  # capped, running first
    assert rows("--state", "queued") == ["queued"] * 5
    assert rows("--state", "succeeded,running") == ["running", "succeeded"]
    assert sorted(rows("--all")) == sorted(["succeeded", "running"] + ["queued"] * 16)
    assert rows("--all", "--state", "queued") == ["queued"] * 16
    assert cli.main(["status", "--state", "queued"]) == 0
    assert "... 11 more jobs: 11 queued (use --all" in capsys.readouterr().out
    assert cli.main(["status", "--json", "--state", "succeeded,failed"]) == 0
    assert [j["id"] for j in json.loads(capsys.readouterr().out)["jobs"]] == ["E1/0-qnli"]
    assert cli.main(["status", "--state", "failed,cancelled"]) == 0
    out = capsys.readouterr().out
    assert "no failed or cancelled jobs" in out and "┃ job" not in out  # a line, not an empty table


def test_status_of_a_new_queue_says_how_to_start_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpusched import cli

    monkeypatch.setenv("GPUSCHED_HOME", str(tmp_path / "home"))
    assert cli.main(["status"]) == 0
    out = capsys.readouterr().out
    assert "no jobs yet: `gpusched submit --suite NAME`" in out and "┃ job" not in out


def test_wait_with_nothing_submitted_says_so_and_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``gpusched submit ...; gpusched wait && echo done``: where the submit was refused, wait
    found no suite, counted 0 succeeded and exited 0 ("all succeeded"); it now says there is
    nothing to wait for, exit 2."""
    from gpusched import cli

    monkeypatch.setenv("GPUSCHED_HOME", str(tmp_path / "home"))
    assert cli.main(["wait", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no suite submitted yet: nothing to wait for" in err[0], err


BAD_OPTIONS = [
    (["logs", "E1/0-qnli", "-n", "-3"], "argument -n/--lines: '-3' is not a whole number >= 0"),
    (["report", "--top", "-2"], "argument --top: '-2' is not a whole number >= 0"),
    (["wait", "--timeout", "-5"], "argument --timeout: '-5' is not a number >= 0"),
    (["status", "--watch", "--interval", "-1"], "argument --interval: '-1' is not a number >= 0.1"),
    (
        ["submit", "--suite", "E1", "--max-queued", "0"],
        "argument --max-queued: '0' is not a whole number >= 1",
    ),
    (["status", "--suite", "E1x"], "--suite E1x: no such suite (did you mean 'E1'?)"),
    (["status", "--state", "runing"], "status --state: no job state 'runing' (did you mean 'running'?)"),
    (["status", "--json", "--state", ","], "status --state: no state given; the states are queued,"),
    (["status", "--json", "--suite", "E1x"], "--suite E1x: no such suite (did you mean 'E1'?)"),
    (["wait", "--suite", "E1x"], "--suite E1x: no such suite (did you mean 'E1'?)"),
    (["cancel", "--suite", "E1x"], "--suite E1x: no such suite (did you mean 'E1'?)"),
    (["logs", "E1"], "'E1' is a suite, not a job: name one of its jobs (E1/0-qnli, ...), or all of"),
    (["retry", "E1"], "'E1' is a suite, not a job"),
    (["daemon", "stop", "--probe", "nvml"], "--probe goes with `gpusched daemon start`: `daemon stop` takes"),
    (["daemon", "status", "--fake-gpus", "2x24GiB"], "--fake-gpus goes with `gpusched daemon start`"),
    (
        ["gpus", "--enable", "0", "--json"],
        "--json does not go with --enable: enable first, then `gpusched gpus",
    ),
]


@pytest.mark.parametrize(("argv", "said"), BAD_OPTIONS)
def test_a_bad_number_or_suite_is_one_line_and_exit_2(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    said: str,
) -> None:
    """A negative count or timeout was taken (a negative --interval ended `status --watch` in
    a traceback; --max-queued 0 silently meant 100), and `status --suite` with a typo showed an
    empty table: each is now refused in one line, before anything is read or changed."""
    from gpusched import cli

    box = busy_box(tmp_path)
    box.store.close()
    (tmp_path / "home").mkdir()
    (tmp_path / "gs.db").rename(tmp_path / "home" / "gpusched.db")
    monkeypatch.setenv("GPUSCHED_HOME", str(tmp_path / "home"))
    try:
        code = cli.main(argv)
    except SystemExit as e:  # argparse's refusal
        code = e.code
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and said in err, err


@pytest.mark.parametrize("argv", [["status"], ["submit", "--suite", "demo", "--gpu-plan", "1"], ["gpus"]])
def test_a_state_home_that_cannot_be_made_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    """GPUSCHED_HOME naming a file (or a folder under one) was a traceback from every command
    (through the command's entry point, which for `submit` tries to start the daemon first)."""
    from gpusched import entry

    (tmp_path / "a-file").write_text("x")
    monkeypatch.setenv("GPUSCHED_HOME", str(tmp_path / "a-file" / "home"))
    monkeypatch.setenv("GPUSCHED_FAKE_GPUS", "1x24GiB")
    monkeypatch.chdir(ROOT)
    assert entry.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"gpusched: cannot make gpusched's state directory {tmp_path / 'a-file' / 'home'} (Not a directory): "
        "point GPUSCHED_HOME at a folder you can write"
    )


@pytest.mark.parametrize("probe", ["fake", "fake, listing processes", "nvml"])
def test_status_loads_no_heavy_module(tmp_path: Path, probe: str) -> None:
    """Plain and --json status: no rich, yaml, psutil, tmux, asyncio or torch imported; NVML
    only on the real probe's path (what a user runs), and tenacity not even there: NVML's
    retries import it only once a read has failed. Nor typing_extensions (with ``inspect``),
    which msgspec takes when it is installed, as it is here. Where the cards list processes,
    as a real GPU's do, telling ours from someone else's reads the process table from /proc,
    without psutil or the module that runs commands (its logging)."""
    box = busy_box(tmp_path)
    box.store.close()  # the last connection: the WAL is folded into the file
    (tmp_path / "home").mkdir()
    (tmp_path / "gs.db").rename(tmp_path / "home" / "gpusched.db")
    code = (
        "import sys\n"
        "from gpusched.cli import main\n"
        "for argv in (['status'], ['status', '--json']):\n"
        "    assert main(argv) == 0\n"
        "heavy = {'rich', 'yaml', 'psutil', 'pynvml', 'libtmux', 'asyncio', 'tenacity', 'torch'}\n"
        "heavy |= {'difflib', 'logging'}  # did-you-mean for an error; the loggers on first use\n"
        "heavy |= {'typing_extensions', 'inspect'}  # (msgspec's, when installed: 7 ms)\n"
        "print('LOADED', sorted(heavy & {m.split('.')[0] for m in sys.modules}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("GPUSCHED_FAKE_GPUS", "NO_COLOR")}
    env.update(GPUSCHED_HOME=str(tmp_path / "home"), COLUMNS="120")
    if probe.startswith("fake"):
        env["GPUSCHED_FAKE_GPUS"] = "2x24GiB"
    if probe == "fake, listing processes":
        listed = {"0": {"used_mib": 1024, "processes": [{"pid": os.getpid(), "used_mib": 1024}]}}
        (tmp_path / "cards.json").write_text(json.dumps(listed))
        env["GPUSCHED_FAKE_GPU_STATE"] = str(tmp_path / "cards.json")
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    assert "Jobs (18)" in r.stdout and '"jobs": [' in r.stdout
    assert r.stdout.splitlines()[-1] == ("LOADED ['pynvml']" if probe == "nvml" else "LOADED []")
    if probe == "fake, listing processes":
        assert "outside processes" in r.stdout and f"{os.getpid()}" in r.stdout


def test_status_shows_the_snapshot_the_daemon_published_while_it_is_fresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a daemon running, status reads its GPU snapshot instead of probing (NVML) itself;
    a stale one (a daemon stuck in failing ticks) is not shown: status probes again."""
    from gpusched import cli, daemon
    from gpusched.gpus import published
    from gpusched.home import Home
    from gpusched.model import GpuProcess, GpuState

    monkeypatch.setenv("GPUSCHED_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GPUSCHED_FAKE_GPUS", "1x24GiB")
    home = Home.from_env().ensure()
    monkeypatch.setattr(daemon, "info", lambda home: {"pid": 1, "probe": "nvml", "probe_spec": None})
    card = GpuState(index=0, name="H100", total_mib=80 * GIB, processes=(GpuProcess(pid=7, used_mib=GIB),))
    args = cli.build_parser().parse_args(["status"])
    store = cli._store()
    cli._probe.cache_clear()  # made once per process: not one made by an earlier test
    published.publish(home, [card], notice=None, now=time.time())
    assert published.read(home, now=time.time()) == ([card], None)
    gpus = cli._status_doc(args, store)["gpus"]
    assert [(g["name"], g["total_mib"], g["processes"][0]["pid"]) for g in gpus] == [("H100", 80 * GIB, 7)]
    published.publish(home, [card], notice=None, now=time.time() - 60)
    assert [g["name"] for g in cli._status_doc(args, store)["gpus"]] == ["Fake GPU"]
    published.path(home).write_text("{not json")
    assert published.read(home, now=time.time()) is None


def test_a_command_parses_alike_with_or_without_the_other_commands_built() -> None:
    """main() builds only the named command's subparser (all twelve cost ~8 ms a command):
    the list of commands is the parser's, and each parses as the full parser parses it."""
    from gpusched import cli

    full = cli.build_parser()
    choices = next(a for a in full._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert tuple(choices) == cli.COMMANDS
    samples = {"attach": ["E1/a"], "logs": ["E1/a", "-n", "3"], "retry": ["E1/a"], "daemon": ["status"]}
    for name in cli.COMMANDS:
        argv = [name, *samples.get(name, ["--suite", "E1"] if name in ("submit", "simulate") else [])]
        if name == "simulate":
            argv += ["--gpu-plan", "1"]
        assert vars(cli.build_parser(name).parse_args(argv)) == vars(full.parse_args(argv)), name


def test_status_answers_while_the_daemon_holds_the_write_lock(tmp_path: Path) -> None:
    """status only reads: it must not queue behind a write transaction (a busy daemon's)."""
    from gpusched.store import Store

    home = tmp_path / "home"
    writer = Store(home / "gpusched.db")
    writer.db.execute("BEGIN IMMEDIATE")
    try:
        env = {k: v for k, v in os.environ.items() if k != "GPUSCHED_FAKE_GPUS"}
        env.update(GPUSCHED_HOME=str(home), GPUSCHED_FAKE_GPUS="1x24GiB")
        for argv in (["status"], ["status", "--json"]):
            r = subprocess.run(
                [sys.executable, "-m", "gpusched", *argv], env=env, capture_output=True, text=True, timeout=20
            )
            assert r.returncode == 0, r.stderr
    finally:
        writer.db.execute("ROLLBACK")
        writer.close()


def test_an_sqlite_without_json_functions_is_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The entries are SQLite's json_object: where the SQLite Python links lacks it, status
    says so and what to use, instead of a traceback."""
    from gpusched.errors import StoreError
    from gpusched.views import status

    box = busy_box(tmp_path)
    entry = status_rows._entry
    monkeypatch.setattr(
        status_rows, "_entry", lambda fields: entry(fields).replace("json_object(", "json_object_x(", 1)
    )
    with pytest.raises(StoreError, match=r"JSON functions.*no such function: json_object_x.*SQLite 3\.38"):
        status(box.store, [], daemon=None)


def test_status_is_the_same_on_an_sqlite_that_does_not_take_the_inlining_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite before 3.35 (Debian 11's 3.34) has no ``NOT MATERIALIZED``: there the queued jobs'
    kinds are read without the hint, and status shows the same document."""
    box = busy_box(tmp_path)
    with_hint = box.status()
    assert status_rows._NOT_MATERIALIZED == "NOT MATERIALIZED "  # this SQLite takes it
    seen: list[str] = []
    box.store.db.set_trace_callback(seen.append)
    monkeypatch.setattr(status_rows, "_NOT_MATERIALIZED", "")
    assert box.status() == with_hint
    kinds = [q for q in seen if q.startswith("WITH q AS")]
    assert kinds and not any("MATERIALIZED" in q for q in kinds)


def test_why_launches_wait_for_the_machine_is_shown_while_the_daemon_runs(tmp_path: Path) -> None:
    """The daemon's word (a disk low, a pause after a failed launch) is one line above the
    tables; a daemon that is not running says nothing of launches, so a stale word is hidden."""
    from gpusched.disk import LAUNCH_WAIT_FLAG

    box = Box(tmp_path, GpuPlan(gpus=(0,), slots=(1,)), cards="1x24GiB")
    box.submit(mixed_suite(tmp_path))
    why = "disk low: /data/logs/E1 has 0.4 GiB free, launches wait for 1.0 GiB"
    box.store.set_flag(LAUNCH_WAIT_FLAG, why)
    running = status(box.store, box.probe.snapshot(), daemon={"pid": 1, "probe": "fake"}, host=box.host)
    assert running.doc()["launch_wait"] == why
    assert f"launches wait: {why}" in format_status(running.doc(), width=200).splitlines()[:4]
    stopped = box.status()  # daemon=None
    assert stopped["launch_wait"] is None
    assert "launches wait" not in format_status(stopped, width=200)


def test_a_daemon_that_stopped_finishing_ticks_is_shown_as_stalled(tmp_path: Path) -> None:
    """A daemon alive (it holds its lock) whose last tick that worked was 5 min ago: ended
    jobs are not reaped, nothing starts, and status says so on its first line instead of
    showing a queue that merely looks slow. Through the real CLI, in a subprocess."""
    import fcntl

    from gpusched.home import Home

    home = Home(tmp_path / "home").ensure()
    now = time.time()
    home.daemon_info.write_text(
        json.dumps(
            {
                "pid": os.getpid(),
                "started_at": now - 600,
                "probe": "fake",
                "probe_spec": "fake:1x24GiB",
                "ready": True,
            }
        )
    )
    (home.root / "gpus.json").write_text(json.dumps({"at": now - 300, "notice": None, "gpus": []}))
    env = {**os.environ, "GPUSCHED_HOME": str(home.root), "COLUMNS": "200"}
    lock = os.open(home.lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # as the daemon holds it
        run = [sys.executable, "-m", "gpusched", "status"]
        doc = json.loads(
            subprocess.run([*run, "--json"], env=env, capture_output=True, text=True, check=True).stdout
        )
        text = subprocess.run(run, env=env, capture_output=True, text=True, check=True).stdout
        (home.root / "gpus.json").write_text(json.dumps({"at": time.time(), "notice": None, "gpus": []}))
        fresh = json.loads(
            subprocess.run([*run, "--json"], env=env, capture_output=True, text=True, check=True).stdout
        )
        (home.root / "gpus.json").write_text(json.dumps({"at": now - 300, "notice": None, "gpus": []}))
        info = json.loads(home.daemon_info.read_text())
        home.daemon_info.write_text(json.dumps({**info, "started_at": time.time()}))  # a new daemon
        restarted = json.loads(
            subprocess.run([*run, "--json"], env=env, capture_output=True, text=True, check=True).stdout
        )
    finally:
        os.close(lock)
    assert 299 <= doc["daemon"]["stalled_s"] <= 330
    assert doc["daemon"]["stalled_why"] == f"see {home.daemon_log}"
    assert "STALLED: no scheduling step has finished for" in text.splitlines()[0]
    assert "stalled_s" not in fresh["daemon"]  # it ticked again
    assert "stalled_s" not in restarted["daemon"]  # the old snapshot is an earlier daemon's


def test_logs_counts_lines_as_tail_does() -> None:
    """`logs -n N` takes the last N newline-ended lines: a progress bar's carriage returns
    stay inside their line (they were each taken for a line, so -n 50 showed one bar)."""
    from gpusched.cli_jobs import _last_lines

    assert _last_lines(b"a\nb\nc\n", 2) == b"b\nc\n"
    assert _last_lines(b"a\nb\nc", 2) == b"b\nc"  # a line still being written counts
    assert _last_lines(b"a\nstep 1\rstep 2\rstep 3\n", 1) == b"step 1\rstep 2\rstep 3\n"
    assert _last_lines(b"a\nb\n", 5) == _last_lines(b"a\nb\n", 0) == b"a\nb\n"


DAY = 24 * 3600.0


def two_nights(tmp_path: Path) -> Box:
    """``old``: a suite of three days ago, one job failed and one succeeded; ``E1`` tonight:
    one job succeeded, one running, one queued (one GPU, one slot)."""
    box = Box(tmp_path, GpuPlan(gpus=(0,), slots=(1,)), cards="1x24GiB")
    old = replace(make_suite(tmp_path, 2), name="old")
    box.submit(replace(old, jobs=tuple(replace(j, suite="old") for j in old.jobs)))
    box.tick()
    box.ex.finish(box.ex.token_of("old/0-qnli"), exit_code=1, output="ValueError: bad column\n")
    box.tick()
    box.ex.finish(box.ex.token_of("old/1-qnli"), exit_code=0)
    box.tick()
    box.now += 3 * DAY
    box.submit(make_suite(tmp_path, 3))
    box.tick()
    box.ex.finish(box.ex.token_of("E1/0-qnli"), exit_code=0)
    box.tick()
    return box


def test_plain_status_shows_the_last_day_of_work_and_names_the_older_suites(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Last week's failures do not sit above tonight's queue in ``status`` forever (they came
    second, before the queued jobs, and pushed them out of the 40 rows): the table shows the
    suites queued, running or ended within a day of the newest activity, counts only them, and
    names the others in one line; ``--suite`` and ``--all`` show them, ``--json`` lists all."""
    from gpusched import cli

    box = two_nights(tmp_path)
    assert [j.state.value for j in box.store.jobs(suite="old")] == ["failed", "succeeded"]
    box.store.close()
    (tmp_path / "home").mkdir()
    (tmp_path / "gs.db").rename(tmp_path / "home" / "gpusched.db")
    monkeypatch.setenv("GPUSCHED_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("COLUMNS", "200")

    def shown(*argv: str) -> tuple[list[str], list[str]]:
        assert cli.main(["status", *argv]) == 0
        lines = capsys.readouterr().out.splitlines()
        return [ln.split("│")[1].strip() for ln in lines if ln.startswith(("│ E1/", "│ old/"))], lines

    jobs, lines = shown()
    assert jobs == ["E1/1-qnli", "E1/2-qnli", "E1/0-qnli"]  # running, queued, succeeded
    assert "queued 1  running 1  succeeded 1  failed 0  cancelled 0" in lines
    assert lines[-1].startswith("earlier suites, not shown (the last ended ")
    assert lines[-1].endswith("): old (1 failed, 1 succeeded); --suite NAME or --all")
    assert shown("--suite", "old")[0] == ["old/0-qnli", "old/1-qnli"]
    assert shown("--all")[0] == ["E1/1-qnli", "old/0-qnli", "E1/2-qnli", "old/1-qnli", "E1/0-qnli"]
    jobs, lines = shown("--state", "failed")
    assert jobs == [] and lines[-1].endswith("): old (1 failed); --suite NAME or --all")
    assert not shown("--state", "queued")[1][-1].startswith("earlier")  # old has none queued
    assert cli.main(["status", "--json"]) == 0  # scripts get every job, as before
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["jobs"]) == 5 and doc["counts"]["failed"] == 1


def test_the_last_day_of_work_is_counted_back_from_the_newest_activity(tmp_path: Path) -> None:
    """Nothing queued or running: the suites whose last job ended within a day of the last
    one to end (a Monday's `status` still shows Saturday's night); while one runs, a day back
    from now. The store answers from its indexes, so this is checked on a real one."""
    from gpusched.store import Store
    from gpusched.views import recent_suites

    store = Store(tmp_path / "gs.db")
    plan = GpuPlan(gpus=(0,), slots=(1,))
    now = 10 * DAY

    def night(name: str, *, ended: float | None, states: tuple[str, ...]) -> None:
        suite = replace(make_suite(tmp_path, len(states)), name=name)
        suite = replace(suite, jobs=tuple(replace(j, suite=name) for j in suite.jobs))
        store.submit(suite, plan, backend="fake", cwd=str(tmp_path), env_path=None, now=now - 20 * DAY)
        for job, state in zip(suite.jobs, states, strict=True):
            end = None if state in ("queued", "running") else ended
            store.db.execute("UPDATE jobs SET state = ?, ended_at = ? WHERE id = ?", (state, end, job.id))
        store.db.commit()

    night("week", ended=now - 7 * DAY, states=("failed", "failed"))
    night("fri", ended=now - 2 * DAY - 19 * 3600, states=("succeeded",))  # 19 h before sat's end
    night("sat", ended=now - 2 * DAY, states=("succeeded", "failed"))
    shown, earlier = recent_suites(store, now=now)
    assert (shown, [(a.name, a.counts) for a in earlier]) == (["fri", "sat"], [("week", {"failed": 2})])
    night("E1", ended=now - 600, states=("succeeded", "running", "queued"))
    shown, earlier = recent_suites(store, now=now)
    assert shown == ["E1"] and [a.name for a in earlier] == ["sat", "fri", "week"]
    assert earlier[0].counts == {"succeeded": 1, "failed": 1}
    assert recent_suites(Store(tmp_path / "empty.db"), now=now) == ([], [])


def test_the_line_under_the_table_names_four_earlier_suites_and_counts_the_rest(tmp_path: Path) -> None:
    """Months of suites stay in the store: the table's last line names the four newest of
    those it leaves out, with their jobs by state, and counts the others; with ``--state``,
    only the suites with jobs in those states. Counted from the store's indexes (a real one)."""
    from gpusched.store import Store
    from gpusched.views import recent_suites

    store = Store(tmp_path / "gs.db")
    now = 100 * DAY
    for i, states in enumerate(["ff", "s", "sc", "s", "fs", "c", "s"]):
        name = f"n{i}"
        suite = replace(make_suite(tmp_path, len(states)), name=name)
        suite = replace(suite, jobs=tuple(replace(j, suite=name) for j in suite.jobs))
        store.submit(suite, GpuPlan(gpus=(0,), slots=(1,)), backend="fake", cwd=str(tmp_path), env_path=None)
        full = {"f": "failed", "s": "succeeded", "c": "cancelled"}
        for job, state in zip(suite.jobs, states, strict=True):
            q = "UPDATE jobs SET state = ?, ended_at = ? WHERE id = ?"
            store.db.execute(q, (full[state], now - (20 - i) * DAY, job.id))
        store.db.commit()
    store.submit(
        replace(mixed_suite(tmp_path)),
        GpuPlan(gpus=(0,), slots=(1,)),
        backend="fake",
        cwd="/p",
        env_path=None,
    )

    def line(states: list[str] | None) -> str:
        shown, earlier = recent_suites(store, now=now, states=states)
        assert shown == ["E1"]
        doc = {"daemon": None, "notice": None, "counts": {}, "gpus": [], "jobs": [], "host": {}}
        return format_status(doc, earlier=earlier, states=states, width=200).splitlines()[-1]

    assert line(None).endswith(
        ": n6 (1 succeeded), n5 (1 cancelled), n4 (1 failed, 1 succeeded), n3 (1 succeeded), 3 more;"
        " --suite NAME or --all"
    )
    assert line(["failed"]).endswith(": n4 (1 failed), n0 (2 failed); --suite NAME or --all")


def test_wait_without_a_suite_judges_the_suites_that_ran_not_last_weeks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``gpusched wait`` (no ``--suite``) after tonight's suite succeeded exits 0 and counts
    tonight's jobs: it used to count every job in the queue, so one failure in a suite of
    last week made every later ``submit ... && gpusched wait`` exit 1."""
    from gpusched import cli

    box = two_nights(tmp_path)
    for job_id in ("E1/1-qnli", "E1/2-qnli"):
        box.ex.finish(box.ex.token_of(job_id), exit_code=0)
        box.tick()
    box.store.close()
    (tmp_path / "home").mkdir()
    (tmp_path / "gs.db").rename(tmp_path / "home" / "gpusched.db")
    monkeypatch.setenv("GPUSCHED_HOME", str(tmp_path / "home"))
    assert cli.main(["wait", "--quiet"]) == 0
    assert capsys.readouterr().out == "3 succeeded, 0 failed, 0 cancelled\n"
    assert cli.main(["wait", "--quiet", "--suite", "old"]) == 1


def test_next_time_of_day_is_today_while_ahead_else_tomorrow_across_a_month() -> None:
    import time

    from gpusched.cli_tools import next_time_of_day
    from gpusched.errors import UsageError

    six = time.mktime((2026, 11, 30, 6, 0, 0, 0, 0, -1))  # a Monday, 06:00 here
    assert time.localtime(next_time_of_day("07:30", six))[:5] == (2026, 11, 30, 7, 30)
    assert time.localtime(next_time_of_day("05:00", six))[:5] == (2026, 12, 1, 5, 0)
    assert time.localtime(next_time_of_day("06:00", six))[:5] == (2026, 12, 1, 6, 0)  # now is not ahead
    assert time.localtime(next_time_of_day(" 0:05 ", six))[:5] == (2026, 12, 1, 0, 5)
    for bad in ("24:00", "7.30", "07:60", "7:5", "07:30pm", "", ":30"):
        with pytest.raises(UsageError, match="not a time of day like 07:30"):
            next_time_of_day(bad, six)
