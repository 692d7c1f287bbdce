"""The path a user walks, through the real CLI: submit -> daemon -> tmux panes / processes ->
wait -> status --json, logs, cancel, attach; and bad input refused with one line, exit 2.

Real tmux server (private socket under the test's GPUSCHED_HOME), real processes, real
SQLite file. The jobs are launchers/demo_job.py (torch-free) with short steps.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from gpusched import proc
from gpusched.home import Home
from tests.conftest import run_cli
from tests.helpers import retry_until

FAKE = {"GPUSCHED_FAKE_GPUS": "2x24GiB"}

PLAN = """
command: python launchers/demo_job.py --config {config}
workdir: ..
base_config: launchers/configs/demo_base.yaml
config: {max_steps: 6, step_time_s: 0.05, fake_gpu_mib: 12288, batch_size: 8, logits_to_keep: 0}
matrix:
  seed: [1, 2]
  task: [sst2, qnli]
job:
  name: "{seed}-{task}"
  task: "{task}"
  config: {seed: "{seed}", data: "{task}", output_dir: "outputs/{task}/s{seed}"}
jobs:
  - name: big
    task: mnli
    config: {batch_size: 96, output_dir: outputs/mnli/big}
  - name: broken
    task: broken
    config: {fail_with: "ValueError: label column missing", output_dir: outputs/broken}
resume: {flag_key: is_keep_training}
"""


def write_plan(project: Path, name: str, text: str) -> Path:
    p = project / "plans" / f"{name}.yaml"
    p.write_text(textwrap.dedent(text))
    return p


def status(project: Path, *extra: str) -> dict:  # type: ignore[type-arg]
    r = run_cli("status", "--json", *extra, cwd=project, check=True)
    return json.loads(r.stdout)


def by_id(doc: dict) -> dict:  # type: ignore[type-arg]
    return {j["id"]: j for j in doc["jobs"]}


@pytest.mark.parametrize("backend", ["tmux", "tmux-job", "subprocess"])
def test_submit_wait_status_logs(gs_home: Path, project: Path, backend: str) -> None:
    if backend.startswith("tmux") and not shutil.which("tmux"):
        pytest.skip("tmux not installed")
    write_plan(project, "t", PLAN)
    # tmux: by default a pane whose job succeeded in seconds runs the next; tmux-job: a window for each
    env = {**FAKE, "GPUSCHED_TMUX_PANES": "job"} if backend == "tmux-job" else FAKE
    reused, backend = backend == "tmux", backend.removesuffix("-job")
    r = run_cli("submit", "--suite", "t", "--gpu-plan", "2,1", "--backend", backend, cwd=project, env=env)
    assert r.returncode == 0, r.stderr
    assert "queued 6 jobs" in r.stdout
    w = run_cli("wait", "--suite", "t", "--timeout", "120", "--quiet", cwd=project)
    assert w.returncode == 1, w.stdout + w.stderr  # one job fails on purpose
    assert "5 succeeded, 1 failed" in w.stdout
    jobs = by_id(status(project))
    assert {j["state"] for i, j in jobs.items() if i != "t/broken"} == {"succeeded"}
    big = jobs["t/big"]
    assert (big["tier"], big["attempt"], big["outcome"]) == ("C", 3, "ok")  # A and B OOMed
    broken = jobs["t/broken"]
    assert broken["state"] == "failed" and broken["attempt"] == 1 and broken["outcome"] == "error"
    assert "label column missing" in (broken["reason"] + (broken["line"] or ""))
    for j in jobs.values():
        assert set(j) >= {"id", "suite", "state", "tier", "attempt", "gpu", "outcome", "reason", "log"}
        assert Path(j["log"]).is_file()
    # the same effective batch at tier C: micro-batch halved, accumulation doubled
    cfg = (project / "logs" / "t" / "big" / "3-C" / "config.yaml").read_text()
    assert "batch_size: 48" in cfg and "gradient_accumulation_steps: 2" in cfg
    logs = run_cli("logs", "t/big", "--attempt", "1", cwd=project)
    assert logs.returncode == 0 and "CUDA out of memory" in logs.stdout + logs.stderr
    done = run_cli("logs", "1-sst2", cwd=project)  # a bare name works when unambiguous
    assert "done: steps=6" in done.stdout
    # once it has nothing left to launch, the daemon writes every ended job's entry into the store,
    # and status reads those instead of building them: the same entries
    db = sqlite3.connect(f"file:{Home(gs_home).db}?mode=ro", uri=True)
    retry_until(lambda: db.execute("SELECT COUNT(*) FROM ended_entries").fetchone()[0] == len(jobs))
    assert db.execute("SELECT COUNT(*) FROM entries_due").fetchone()[0] == 0
    db.close()
    assert by_id(status(project)) == jobs
    if reused:  # 8 attempts of seconds, 3 at a time: no more windows than that were opened
        sock = str(Home(gs_home).tmux_socket)
        shown = subprocess.run(["tmux", "-S", sock, "list-windows", "-a"], capture_output=True, text=True)
        assert 1 <= len(shown.stdout.splitlines()) <= 3

        def dead() -> list[str]:  # the suite has nothing left to run: no pane waits for a job
            argv = ["tmux", "-S", sock, "list-panes", "-a", "-F", "#{pane_dead}"]
            return subprocess.run(argv, capture_output=True, text=True).stdout.split()

        retry_until(lambda: set(dead()) == {"1"})


def test_a_suite_run_again_after_its_state_directory_was_deleted_runs_anew_beside_the_old_logs(
    gs_home: Path, project: Path
) -> None:
    """``rm -rf ~/.local/state/gpusched`` to start afresh leaves the project's logs/. The new
    queue's attempt 1 must not be the old ``1-A/``: its exit.json made every job "succeed" as
    soon as it started (a negative runtime, last run's outcome) while it still ran."""
    write_plan(
        project,
        "r",
        """
        command: sh -c 'echo "run by $GPUSCHED_HOME"' job {config}
        jobs: [{name: a, config: {output_dir: out/a}}, {name: b, config: {output_dir: out/b}}]
        resume: {flag_key: is_keep_training}
        """,
    )
    submit = ("submit", "--suite", "r", "--gpu-plan", "2", "--backend", "subprocess")
    run_cli(*submit, cwd=project, env=FAKE, check=True)
    run_cli("wait", "--suite", "r", "--timeout", "60", "--quiet", cwd=project, check=True)
    run_cli("daemon", "stop", cwd=project, check=True)
    shutil.rmtree(gs_home)
    gs_home.mkdir()
    dry = run_cli(*submit, "--dry-run", cwd=project, env=FAKE, check=True)
    again = run_cli(*submit, cwd=project, env=FAKE, check=True)
    logs = project / "logs" / "r"
    assert f"2 of these jobs already have log folders in {logs}" in dry.stdout
    assert f"2 of these jobs already have log folders in {logs}" in again.stdout
    assert "as 1-A~2/ beside 1-A/; they start over, not from that queue's checkpoints" in again.stdout
    run_cli("wait", "--suite", "r", "--timeout", "60", "--quiet", cwd=project, check=True)
    for job in status(project)["jobs"]:
        assert job["log"] == str(logs / job["name"] / "1-A~2" / "output.log")
        assert job["runtime_s"] >= 0
        assert Path(job["log"]).read_text() == f"run by {gs_home}\n"
        assert (logs / job["name"] / "1-A" / "output.log").read_text() == f"run by {gs_home}\n"
    other = project.parent / "other"  # the same suite name from another project: it ran here
    shutil.copytree(project / "plans", other / "plans")
    moved = run_cli(*submit, cwd=other, env=FAKE, check=True)
    assert "queued 0 jobs" in moved.stdout and "left as they are: 2 succeeded" in moved.stdout
    assert f"suite last submitted from {project}: the jobs left as they are ran there" in moved.stdout


def test_submit_rerun_trains_again_instead_of_resuming_from_the_last_runs_checkpoint(
    gs_home: Path, project: Path
) -> None:
    """``resume:`` is for a job's own run (an OOM requeue, a retry after a crash). A rerun that
    resumed from the finished run's last checkpoint ended at once, "succeeded", on the old
    weights: with an edited plan, the edit never trained."""
    write_plan(
        project,
        "rr",
        """
        command: python launchers/demo_job.py --config {config}
        workdir: ..
        base_config: launchers/configs/demo_base.yaml
        config: {max_steps: 4, step_time_s: 0.01, fake_gpu_mib: 12288, batch_size: 8, logits_to_keep: 0}
        jobs: [{name: a, config: {output_dir: outputs/rr/a}}]
        resume: {flag_key: is_keep_training}
        """,
    )
    submit = ("submit", "--suite", "rr", "--gpu-plan", "1", "--backend", "subprocess")
    run_cli(*submit, cwd=project, env=FAKE, check=True)
    run_cli("wait", "--suite", "rr", "--timeout", "60", "--quiet", cwd=project, check=True)
    for ck in (project / "outputs" / "rr" / "a").iterdir():  # as if the run were last night's
        os.utime(ck, (ck.stat().st_mtime - 3600, ck.stat().st_mtime - 3600))
    run_cli(*submit, "--rerun", cwd=project, env=FAKE, check=True)
    run_cli("wait", "--suite", "rr", "--timeout", "60", "--quiet", cwd=project, check=True)
    log = run_cli("logs", "rr/a", cwd=project, check=True).stdout
    assert "step 1/4" in log and "resumed" not in log
    cfg = (project / "logs" / "rr" / "a" / "2-A" / "config.yaml").read_text()
    assert "is_keep_training" not in cfg and "# not resumed from" in cfg
    retry = run_cli("retry", "rr/a", cwd=project, check=True)
    assert retry.stdout == "rr/a: queued again at tier A, from the start (it had succeeded)\n"


def test_the_plans_notify_command_hears_of_a_failed_job_and_of_the_suites_end(
    gs_home: Path, project: Path
) -> None:
    """A plan's ``notify:`` runs, from the daemon, for the job that failed for good and once
    for the suite's end, with the notice in variables (the reason's quotes and colons intact),
    in the workdir and the submitting shell's environment; a job that walked down the OOM
    ladder to success is no news."""
    notify = r"""
notify: |
  printf '%s|%s|%s|%s|%s\n' "$GPUSCHED_EVENT" "$GPUSCHED_SUITE" "$GPUSCHED_JOB_ID" "$GPUSCHED_MESSAGE" \
    "$LAB_TOPIC" >> notices.txt
"""
    write_plan(project, "t", PLAN + notify)
    env = {**FAKE, "LAB_TOPIC": "gpus-of-lab-7"}
    r = run_cli(
        "submit", "--suite", "t", "--gpu-plan", "2,1", "--backend", "subprocess", cwd=project, env=env
    )
    assert r.returncode == 0, r.stderr
    assert run_cli("wait", "--suite", "t", "--timeout", "120", "--quiet", cwd=project).returncode == 1
    notices = project / "notices.txt"

    def both() -> list[str]:
        lines = notices.read_text().splitlines() if notices.exists() else []
        return lines if len(lines) >= 2 else []

    failed, done = retry_until(both, timeout=30)
    event, suite, job, message, topic = failed.split("|")
    assert (event, suite, job, topic) == ("failed", "t", "t/broken", "gpus-of-lab-7")
    assert message.startswith("t/broken failed: ") and "ValueError: label column missing" in message
    assert done == "done|t||t done: 5 succeeded, 1 failed|gpus-of-lab-7"
    logged = Home.from_env().notify_log.read_text()
    assert "failed t: t/broken failed: " in logged and "done t: t done: 5 succeeded, 1 failed" in logged


def follow_while_queued(project: Path, suite: str, *then: str, timeout: float) -> tuple[int, str, str]:
    """`logs -f SUITE/big` started while the job waits queued (launches drained), then the
    command ``then`` run; its exit code, standard output and standard error once it returns."""
    write_plan(project, suite, PLAN)
    run_cli("drain", cwd=project, check=True)
    run_cli(
        "submit", "--suite", suite, "--only", "big", "--gpu-plan", "1", "--backend", "subprocess",
        cwd=project, env=FAKE, check=True,
    )  # fmt: skip
    follow = subprocess.Popen(
        [sys.executable, "-m", "gpusched", "logs", "-f", f"{suite}/big"],
        cwd=project,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert follow.stderr is not None
        assert follow.stderr.readline() == f"==> {suite}/big is queued: waiting for its first attempt <==\n"
        run_cli(*then, cwd=project, check=True)
        out, err = follow.communicate(timeout=timeout)
    finally:
        follow.kill()
        run_cli("drain", "--off", cwd=project)
    return follow.returncode, out, err


def test_logs_follow_waits_for_a_queued_job_and_follows_it_through_its_requeues(
    gs_home: Path, project: Path
) -> None:
    """`logs -f` right after submit: the job is still queued (here: draining), so it waits;
    then it shows each attempt as it runs, A and B out of memory, C to the end, and returns
    once the job has succeeded."""
    code, out, err = follow_while_queued(project, "fo", "drain", "--off", timeout=120)
    assert code == 0, err
    said = [ln for ln in err.splitlines() if ln.startswith("==> ")]
    heads = [
        re.search(r"\((attempt \d, tier \w+)(?:, (\w+): .*)?\) <==$", ln) for ln in said if "output.log" in ln
    ]
    assert [h and h[1] for h in heads] == ["attempt 1, tier A", "attempt 2, tier B", "attempt 3, tier C"], err
    # each attempt's end is told: in a line once it ended while followed, or in its header when it
    # had ended before `logs -f` got to it (a busy machine runs the 0.3 s attempts faster than that)
    ended = {int(m[1]): m[2] for ln in said if (m := re.match(r"==> attempt (\d) ended: (\w+): ", ln))}
    ended |= {n: h[2] for n, h in enumerate(heads, start=1) if h and h[2]}
    assert ended == {1: "oom", 2: "oom", 3: "ok"}, err
    assert out.count("CUDA out of memory") == 2 and "done: steps=6" in out
    assert said[-1].startswith("==> fo/big succeeded")  # the job's end, after its last attempt's


def test_logs_follow_of_a_job_cancelled_before_it_started_says_so(gs_home: Path, project: Path) -> None:
    code, out, err = follow_while_queued(project, "fc", "cancel", "fc/big", timeout=60)
    assert code == 0 and out == ""
    assert err.startswith("==> fc/big cancelled"), err  # not a silent return, as if the log were empty


def test_cancel_a_running_job_and_a_queued_one(gs_home: Path, project: Path) -> None:
    write_plan(project, "slow", PLAN.replace("step_time_s: 0.05", "step_time_s: 5"))
    run_cli(
        "submit",
        "--suite",
        "slow",
        "--gpu-plan",
        "1",
        "--backend",
        "subprocess",
        cwd=project,
        env=FAKE,
        check=True,
    )
    retry_until(lambda: any(j["state"] == "running" for j in status(project)["jobs"]), timeout=30)
    running = next(j["id"] for j in status(project)["jobs"] if j["state"] == "running")
    # --queued: the ones not started end, the running one is left to finish
    r = run_cli("cancel", "--suite", "slow", "--queued", cwd=project)
    assert r.returncode == 0 and r.stdout.strip() == "5 cancelled", r.stdout
    assert [j["id"] for j in status(project, "--state", "running")["jobs"]] == [running]
    assert not by_id(status(project))[running]["cancel_requested"]
    run_cli("retry", "slow/*", cwd=project, check=True)  # (the five queued again)
    # --suite with a job named: that job of the suite (it cancelled the whole suite)
    one = next(j for j in status(project)["jobs"] if j["state"] == "queued")
    r = run_cli("cancel", "--suite", "slow", one["name"], cwd=project)
    assert r.returncode == 0 and r.stdout.strip() == "1 cancelled", r.stdout
    assert sum(j["state"] == "queued" for j in status(project)["jobs"]) == 4
    r = run_cli("cancel", "--suite", "slow", cwd=project)
    assert r.returncode == 0 and "1 stopping" in r.stdout and "4 cancelled" in r.stdout
    retry_until(lambda: by_id(status(project))[running]["state"] == "cancelled", timeout=30)
    assert all(j["state"] == "cancelled" for j in status(project)["jobs"])
    w = run_cli("wait", "--suite", "slow", "--quiet", cwd=project)
    assert w.returncode == 1


def test_cancel_stops_a_helper_that_left_the_jobs_process_group(gs_home: Path, project: Path) -> None:
    """A job that starts a daemonising helper (setsid): the helper is out of the job's
    process group, yet cancel stops it too, and only then is the job cancelled."""
    (project / "plans" / "esc.yaml").write_text(
        "command: ': {config}; sh helper.sh; sleep 300'\njobs: [{name: one, task: t}]\n"
    )
    # the helper: a daemonising child (new session, stdio let go) that records its pid
    (project / "helper.sh").write_text(
        "setsid sh -c 'echo $$ > \"$GPUSCHED_ATTEMPT_DIR/helper.pid\"; exec sleep 300'"
        " </dev/null >/dev/null 2>&1 &\n"
        'while [ ! -s "$GPUSCHED_ATTEMPT_DIR/helper.pid" ]; do sleep 0.05; done\n'
    )
    run_cli(
        "submit",
        "--suite",
        "esc",
        "--gpu-plan",
        "1",
        "--backend",
        "subprocess",
        cwd=project,
        env=FAKE,
        check=True,
    )
    pid_file = retry_until(lambda: next(project.glob("logs/esc/one/*/helper.pid"), None), timeout=30)
    pid = int(retry_until(lambda: pid_file.read_text().strip(), timeout=10))
    assert os.getpgid(pid) != os.getpgid(int((pid_file.parent / "pid").read_text().split()[0]))
    run_cli("cancel", "esc/one", cwd=project, check=True)
    retry_until(lambda: by_id(status(project))["esc/one"]["state"] == "cancelled", timeout=30)
    assert proc.started_at(pid) is None  # gone (or a zombie nobody has reaped yet)


@pytest.mark.skipif(not shutil.which("tmux"), reason="tmux not installed")
def test_a_daemon_started_from_inside_a_job_does_not_lend_it_the_tmux_server(
    gs_home: Path, project: Path
) -> None:
    """A job that submits jobs starts the daemon with its own GPUSCHED_TOKEN in the
    environment. The tmux server that daemon starts must not carry it: cancel finds a job's
    processes by that token, and would take the server (and every pane) along."""
    write_plan(project, "inner", PLAN)
    inside_a_job = {**FAKE, "GPUSCHED_TOKEN": "outer-job-token"}
    run_cli(
        "submit", "--suite", "inner", "--only", "1-sst2", "--gpu-plan", "1", "--backend", "tmux",
        cwd=project, env=inside_a_job, check=True,
    )  # fmt: skip
    run_cli("wait", "--suite", "inner", "--quiet", "--timeout", "60", cwd=project)
    sock = str(Home(gs_home).tmux_socket)
    server = int(
        subprocess.run(["tmux", "-S", sock, "display", "-p", "#{pid}"], capture_output=True, text=True).stdout
    )
    assert server not in proc.carrying("GPUSCHED_TOKEN", "outer-job-token")
    assert b"GPUSCHED_TOKEN=outer-job-token" not in Path(f"/proc/{server}/environ").read_bytes()


@pytest.mark.skipif(not shutil.which("tmux"), reason="tmux not installed")
def test_attach_lands_in_the_jobs_live_pane(gs_home: Path, project: Path, tmp_path: Path) -> None:
    write_plan(project, "att", PLAN.replace("step_time_s: 0.05", "step_time_s: 2"))
    run_cli(
        "submit",
        "--suite",
        "att",
        "--only",
        "1-sst2",
        "--gpu-plan",
        "1",
        "--backend",
        "tmux",
        cwd=project,
        env=FAKE,
        check=True,
    )
    retry_until(lambda: by_id(status(project))["att/1-sst2"]["state"] == "running", timeout=30)
    # from a script (no terminal): one line that says so, not tmux's "open terminal failed"
    r = run_cli("attach", "att/1-sst2", cwd=project)
    assert r.returncode == 2 and "attach needs a terminal" in r.stderr and "logs -f att/1-sst2" in r.stderr
    # a user's own terminal: an outer tmux server in which we type `gpusched attach`
    outer = ["tmux", "-S", str(tmp_path / "outer.sock")]
    env_cmd = f"GPUSCHED_HOME={gs_home} python -m gpusched attach att/1-sst2"
    subprocess.run(
        [*outer, "new-session", "-d", "-x", "120", "-y", "40", "-c", str(project), env_cmd], check=True
    )
    try:

        def screen() -> str:
            return subprocess.run([*outer, "capture-pane", "-p"], capture_output=True, text=True).stdout

        retry_until(lambda: "micro_batch 8" in screen(), timeout=30)
    finally:
        subprocess.run([*outer, "kill-server"], capture_output=True)
    run_cli("cancel", "att/1-sst2", cwd=project, check=True)


@pytest.mark.skipif(not shutil.which("tmux"), reason="tmux not installed")
def test_attach_to_a_closed_pane_says_where_the_output_is(gs_home: Path, project: Path) -> None:
    """An ended job's window is closed once newer ones push it out (or its tmux server went
    away): attach says so and names the command that shows the output, instead of tmux's
    "can't find pane"."""
    write_plan(project, "gone", PLAN)
    run_cli(
        "submit", "--suite", "gone", "--only", "1-sst2", "--gpu-plan", "1", "--backend", "tmux",
        cwd=project, env=FAKE, check=True,
    )  # fmt: skip
    run_cli("wait", "--suite", "gone", "--quiet", "--timeout", "60", cwd=project)
    subprocess.run(["tmux", "-S", str(Home(gs_home).tmux_socket), "kill-server"], capture_output=True)
    r = run_cli("attach", "gone/1-sst2", cwd=project)
    assert r.returncode == 2, r.stderr
    assert "no longer on gpusched's tmux server" in r.stderr and "gpusched logs gone/1-sst2" in r.stderr


def test_attach_without_a_pane_says_what_to_do(gs_home: Path, project: Path) -> None:
    write_plan(project, "sp", PLAN)
    run_cli(
        "submit",
        "--suite",
        "sp",
        "--only",
        "1-sst2",
        "--gpu-plan",
        "1",
        "--backend",
        "subprocess",
        cwd=project,
        env=FAKE,
        check=True,
    )
    run_cli("wait", "--suite", "sp", "--quiet", "--timeout", "60", cwd=project)
    r = run_cli("attach", "sp/1-sst2", cwd=project)
    assert r.returncode == 2 and "gpusched logs -f sp/1-sst2" in r.stderr


BAD_INPUTS = [
    (["--suite", "nope"], "nope.yaml: file not found"),
    (["--suite", "t", "--gpu-plan", "2,x"], "--gpu-plan"),
    (["--suite", "t", "--gpu-plan", "2,2,2", "--gpus", "0,1"], "--gpu-plan"),
    (["--suite", "t", "--gpu-plan", "1,1,1"], "GPU"),  # the fake probe sees 2 GPUs
    (["--suite", "t", "--gpu-plan", "1", "--gpus", "7"], "--gpus"),
    (["--suite", "t", "--gpu-plan", "1", "--pairs", "9:nope"], "--pairs"),
    (["--suite", "t", "--gpu-plan", "1", "--backend", "tmuxx"], "--backend"),
    (["--suite", "t", "--gpu-plan", "1", "--partition", "gpu"], "--partition: for Slurm only"),
    (
        ["--suite", "t", "--backend", "subprocess", "--sbatch-arg=--mem=4G", "--max-queued", "5"],
        "leave them out",
    ),
    (["--suite", "malformed", "--gpu-plan", "1"], "malformed.yaml"),
    (["--suite", "unknown_key", "--gpu-plan", "1"], "comand"),
    (["--suite", "no_base", "--gpu-plan", "1"], "base_config"),
    (["--suite", "bad_name", "--gpu-plan", "1"], "bad name"),
]


@pytest.mark.parametrize(("args", "needle"), BAD_INPUTS, ids=[" ".join(a) for a, _ in BAD_INPUTS])
def test_bad_input_is_one_clear_line_exit_2_and_nothing_enqueued(
    gs_home: Path, project: Path, args: list[str], needle: str
) -> None:
    write_plan(project, "t", PLAN)
    write_plan(project, "malformed", "command: [unclosed\n")
    write_plan(project, "unknown_key", "comand: python x.py --config {config}\n")
    write_plan(project, "no_base", "command: python x.py --config {config}\nbase_config: missing.yaml\n")
    write_plan(
        project, "bad_name", "command: python x.py --config {config}\njobs:\n  - name: 'bad name; rm -rf ~'\n"
    )
    r = run_cli("submit", *args, cwd=project, env=FAKE)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert needle in lines[0], lines[0]
    assert status(project)["jobs"] == []
    # the daemon it started on standby, before it read the plan, is gone without a trace
    retry_until(lambda: not proc.carrying("GPUSCHED_HOME", str(gs_home)), timeout=10)
    assert run_cli("daemon", "status", cwd=project).returncode == 3


def test_submit_checks_the_gpus_against_the_running_daemons_probe(gs_home: Path, project: Path) -> None:
    """A daemon placing on 2 fake GPUs runs; a submit from a shell without GPUSCHED_FAKE_GPUS
    plans for those two (it probed NVML itself: no GPU, so --gpus 1-2 went through and jobs
    were placed on a GPU 2 that does not exist, and a plan-less submit was refused)."""
    write_plan(project, "t", PLAN)
    run_cli("daemon", "start", "--fake-gpus", "2x24GiB", cwd=project, check=True)
    r = run_cli("submit", "--suite", "t", "--gpus", "1-2", cwd=project)
    assert r.returncode == 2 and "GPU 2 does not exist: this machine has 2 GPUs (0-1)" in r.stderr, r.stderr
    r = run_cli("submit", "--suite", "t", "--dry-run", cwd=project, check=True)
    assert "plan 1,1 on GPUs 0,1" in r.stdout, r.stdout
    # other GPUs asked for than the daemon's: refused, one line (the daemon's would be the ones used)
    for args, env, fix in (
        (("daemon", "start", "--fake-gpus", "4x80GiB"), {}, "leave --fake-gpus out"),
        (("submit", "--suite", "t", "--fake-gpus", "4x80GiB"), {}, "leave --fake-gpus out"),
        (("submit", "--suite", "t"), {"GPUSCHED_FAKE_GPUS": "4x80GiB"}, "unset GPUSCHED_FAKE_GPUS"),
    ):
        r = run_cli(*args, cwd=project, env=env)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert "places jobs with probe 'fake:2x24GiB', not 'fake:4x80GiB'" in r.stderr and fix in r.stderr
    run_cli("daemon", "start", "--fake-gpus", "2x24GiB", cwd=project, check=True)  # the same: fine
    assert status(project)["jobs"] == []


def test_a_repeated_submit_keeps_the_nights_plan_and_a_new_plan_replaces_it(
    gs_home: Path, project: Path
) -> None:
    """During a suite's night, `submit` again without --gpu-plan or --backend keeps its plan and
    backend (it put the night back to one job a GPU, in tmux); with --gpu-plan it replaces the
    plan for the queued jobs and says which it replaced. A finished suite starts from the defaults."""
    write_plan(
        project,
        "t",
        "command: sleep 60; echo {config}\nmatrix: {seed: [1, 2, 3, 4, 5, 6]}\njob: {name: 's{seed}'}\n",
    )

    def submit(*extra: str) -> dict:  # type: ignore[type-arg]
        return json.loads(
            run_cli("submit", "--suite", "t", "--json", *extra, cwd=project, env=FAKE, check=True).stdout
        )

    submit("--gpu-plan", "2,1", "--backend", "subprocess")
    again = submit()
    said = run_cli("submit", "--suite", "t", cwd=project, env=FAKE, check=True).stdout
    assert "the plan the suite runs with, kept (--gpu-plan or --gpus to change it)" in said, said
    assert (again["gpu_plan"], again["backend"], again["plan_before"], again["queued"]) == (
        "2,1",
        "subprocess",
        None,
        [],
    )
    narrower = submit("--gpu-plan", "1,0")
    assert (narrower["plan_before"], narrower["backend"]) == ("2,1 on GPUs 0,1", "subprocess")
    assert again["backend_before"] is None and narrower["backend_before"] is None
    # another --backend replaces it for the queued jobs, and says which it replaced
    to_tmux = ("submit", "--suite", "t", "--backend", "tmux", "--dry-run")
    dry = run_cli(*to_tmux, cwd=project, env=FAKE, check=True)
    assert (
        "  backend would change from subprocess: queued jobs are launched with this one from then;"
        " running ones stay where they are"
    ) in dry.stdout.splitlines()
    # seeds 5 and 6 taken out of the plan, 7 added: the queued 5 and 6 would still run, and
    # submit says so; --dry-run says what it would do without doing it
    write_plan(
        project,
        "t",
        "command: sleep 60; echo {config}\nmatrix: {seed: [1, 2, 3, 4, 7]}\njob: {name: 's{seed}'}\n",
    )
    dry = run_cli("submit", "--suite", "t", "--dry-run", cwd=project, env=FAKE, check=True).stdout
    assert dry.splitlines()[:2] == [
        "t: would queue 1 job, plan 1,0 on GPUs 0,1, backend subprocess, tiers A -> B -> C -> D",
        "  t/s7",
    ], dry
    assert "no longer in the plan and would still run" in dry
    assert "t/s7" not in by_id(status(project))  # nothing queued by the dry run
    queued = [
        j["id"] for j in status(project)["jobs"] if j["state"] == "queued" and j["id"] in ("t/s5", "t/s6")
    ]
    assert queued and submit()["not_in_plan"] == queued
    run_cli("cancel", "--suite", "t", cwd=project, check=True)
    assert run_cli("wait", "--suite", "t", "--quiet", "--timeout", "60", cwd=project).returncode == 1
    fresh = json.loads(
        run_cli("submit", "--suite", "t", "--dry-run", "--json", cwd=project, env=FAKE, check=True).stdout
    )
    assert fresh["gpu_plan"] == "1,1"


def test_a_daemon_on_standby_holds_nothing_and_ends_unless_told_to_go(gs_home: Path) -> None:
    """`submit` starts the daemon before it reads the plan (its start overlaps the submit's own
    work): until told to go it has taken no lock, opened no database and written nothing (on a
    first night, not even the state directory), and it exits when let go; told to go, it is
    the daemon, ready, with that same pid, and writes to daemon.log."""
    from gpusched import daemon

    home = Home(gs_home)
    standby = daemon.Starting(home, probe="fake:1x24GiB")
    assert daemon.info(home) is None and not gs_home.exists()
    standby.cancel()
    assert standby.child.wait() == 0
    assert daemon.info(home) is None and not gs_home.exists()

    ready = daemon.Starting(home, probe="fake:1x24GiB").go()
    assert ready["ready"] and ready["probe"] == "fake"
    assert daemon.info(home) == ready
    retry_until(lambda: f"daemon {ready['pid']} ready" in home.daemon_log.read_text())
    # a second one, started beside a daemon that runs, steps aside for it
    beside = daemon.Starting(home, probe="fake:1x24GiB")
    assert beside.go()["pid"] == ready["pid"]
    assert beside.child.wait() == 0 and daemon.info(home)["pid"] == ready["pid"]  # type: ignore[index]


def standbys(home: Path, probe: str) -> list[int]:
    """Pids of the daemons for ``home`` started (on standby) for ``probe``."""
    import psutil

    found = []
    for p in psutil.process_iter(["cmdline", "environ"]):
        argv, env = p.info["cmdline"] or [], p.info["environ"] or {}
        if "--standby" in argv and probe in argv and env.get("GPUSCHED_HOME") == str(home):
            found.append(p.pid)
    return found


def test_submit_starts_its_daemon_before_the_cli_is_imported_and_only_when_it_will_want_one(
    gs_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`gpusched.entry` reads just enough of the arguments: a submit (after any global
    options), for the GPUs of --fake-gpus or GPUSCHED_FAKE_GPUS; not a dry run, --help, or
    any other command. What it starts exits when let go."""
    from gpusched.entry import standby_for

    monkeypatch.setenv("GPUSCHED_FAKE_GPUS", "2x24GiB")
    for argv in (["status"], ["submit", "--suite", "s", "--dry-run"], ["submit", "-h"], ["daemon", "start"]):
        assert standby_for(argv) is None, argv
    for argv, probe in (
        (["submit", "--suite", "s"], "fake:2x24GiB"),
        (["-v", "submit", "--suite", "s", "--fake-gpus", "3x24GiB"], "fake:3x24GiB"),
        (["submit", "--fake-gpus=1x80GiB", "--suite", "s"], "fake:1x80GiB"),
    ):
        early = standby_for(argv)
        assert early is not None and early.probe == probe, argv
        early.cancel()
        assert early.child.wait() == 0
    assert not (gs_home / "daemon.json").exists() and not (gs_home / "gpusched.db").exists()


def test_a_daemon_started_early_for_other_gpus_than_submit_settles_on_is_replaced(
    gs_home: Path, project: Path
) -> None:
    """argparse, not the early look at the arguments, decides: `--fake 3x24GiB` (an
    abbreviation argparse accepts) beside GPUSCHED_FAKE_GPUS=2x24GiB runs the night on the
    three GPUs, and the daemon started for the two exits."""
    write_plan(project, "ab", 'command: "true {config}"\njobs: [{name: a}]\n')
    r = run_cli(
        "submit", "--suite", "ab", "--fake", "3x24GiB", "--gpu-plan", "1,1,1", "--backend", "subprocess",
        cwd=project, env=FAKE, check=True,
    )  # fmt: skip
    assert "queued 1 job" in r.stdout
    info = json.loads((gs_home / "daemon.json").read_text())
    assert info["probe_spec"] == "fake:3x24GiB" and standbys(gs_home, "fake:3x24GiB") == [info["pid"]]
    retry_until(lambda: not standbys(gs_home, "fake:2x24GiB"), timeout=10)
    run_cli("wait", "--suite", "ab", "--quiet", "--timeout", "60", cwd=project, check=True)


def test_the_daemon_lock_has_one_holder_and_goes_with_its_process(tmp_path: Path) -> None:
    """One daemon per state directory: the lock is taken by one process at a time, a second
    taker gives up after its wait, and the lock goes with the process that held it, however
    it ended (here: SIGKILL), so the next daemon can start."""
    import time

    from gpusched import daemon

    path = tmp_path / "daemon.lock"
    fd = daemon._take_lock(path, 0)
    assert fd is not None and daemon._locked(path)
    t0 = time.monotonic()
    assert daemon._take_lock(path, 0.05) is None and time.monotonic() - t0 >= 0.05
    os.close(fd)
    assert not daemon._locked(path)
    code = (
        "import sys, pathlib\nfrom gpusched import daemon\n"
        "print(daemon._take_lock(pathlib.Path(sys.argv[1]), 5) is not None, flush=True)\nsys.stdin.read()\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "True"
        assert daemon._locked(path) and daemon._take_lock(path, 0) is None
    finally:
        holder.kill()
        holder.wait()
    fd = daemon._take_lock(path, 5)
    assert fd is not None
    os.close(fd)


def test_the_daemon_starts_without_asyncio_or_psutil(gs_home: Path) -> None:
    """What the daemon imports before its first launch is on the path of a night's first job:
    nothing that pulls in asyncio (15-20 ms; the filelock package did, with an audit hook
    that then ran on every file the daemon opened), nor psutil (10-20 ms: the first tick
    reads the host's memory and boot time from /proc)."""
    standby = ["daemon", "run", "--standby", "--probe", "fake:1x24GiB"]
    r = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "gpusched", *standby],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "GPUSCHED_HOME": str(gs_home)},
    )
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stderr.splitlines() if "|" in line]
    imported = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in lines}
    assert {"gpusched", "yaml"} <= imported  # (what the first tick needs: imported on standby)
    assert not imported & {"asyncio", "filelock", "psutil"}


def test_a_submit_that_queues_nothing_leaves_no_daemon(gs_home: Path, project: Path) -> None:
    """Everything already succeeded: a repeated submit queues nothing and starts no daemon
    (the one it had on standby exits)."""
    write_plan(project, "sp", PLAN)
    args = ("submit", "--suite", "sp", "--only", "1-sst2", "--gpu-plan", "1", "--backend", "subprocess")
    run_cli(*args, cwd=project, env=FAKE, check=True)
    run_cli("wait", "--suite", "sp", "--quiet", "--timeout", "60", cwd=project, check=True)
    run_cli("daemon", "stop", cwd=project, check=True)
    r = run_cli(*args, cwd=project, env=FAKE, check=True)
    assert "left as they are: 1 succeeded" in r.stdout
    assert run_cli("daemon", "status", cwd=project).returncode == 3
    retry_until(lambda: not proc.carrying("GPUSCHED_HOME", str(gs_home)), timeout=10)


def test_a_daemon_that_dies_as_it_starts_is_reported_at_once_with_its_last_words(gs_home: Path) -> None:
    """Not after the 15 s start timeout: the moment it has exited with no daemon running, with
    the line it left in daemon.log."""
    import time

    from gpusched import daemon
    from gpusched.errors import DaemonError

    t0 = time.monotonic()
    with pytest.raises(DaemonError) as e:
        daemon.Starting(Home(gs_home), probe="bogus:1").go(timeout_s=60)
    assert time.monotonic() - t0 < 30
    assert "exited with code 2 as it started (gpusched: GPU probe 'bogus:1' is not known" in str(e.value)
    assert daemon.info(Home(gs_home)) is None
    # (it died on standby, before it wrote to daemon.log: the submit put its words there)
    assert "gpusched: GPU probe 'bogus:1' is not known" in Home(gs_home).daemon_log.read_text()


def test_a_daemon_that_hangs_as_it_starts_is_reported_with_what_it_said_on_standby(gs_home: Path) -> None:
    """One stuck before it took the word to go (in NVML's initialisation, say) has written
    nothing to daemon.log yet: its last line on standby is in the report instead."""
    import signal

    from gpusched import daemon
    from gpusched.errors import DaemonError

    standby = daemon.Starting.__new__(daemon.Starting)  # its process: one that never takes the word
    standby.home, standby.probe = Home(gs_home), None
    standby._early = daemon._nameless_file()
    os.write(standby._early, b"gpusched: NVML is slow to answer\n")
    told, standby._go = os.pipe()
    standby.child = proc.spawn(["sleep", "30"], stdin=told)
    os.close(told)
    try:
        with pytest.raises(DaemonError) as e:
            standby.go(timeout_s=0.2)
        assert str(e.value) == (
            "the daemon did not start within 0 s (gpusched: NVML is slow to answer): "
            f"see {gs_home / 'daemon.log'}"
        )
    finally:
        os.kill(standby.child.pid, signal.SIGKILL)
        standby.child.wait()


def test_a_refused_first_submit_leaves_no_state_directory(gs_home: Path, project: Path) -> None:
    """The daemon it started on standby wrote nothing there: a typo on a first night leaves no
    trace to find later."""
    r = run_cli("submit", "--suite", "nosuch", "--gpu-plan", "1", cwd=project, env=FAKE)
    assert r.returncode == 2 and "plans/nosuch.yaml: file not found" in r.stderr
    assert not gs_home.exists()
    retry_until(lambda: not proc.carrying("GPUSCHED_HOME", str(gs_home)), timeout=10)


def test_submit_does_not_take_the_folders_its_daemon_just_made_for_another_queues(
    gs_home: Path, project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A running daemon launches a suite's first jobs as soon as the submit's commit lands, before
    the submit prints its summary. The summary said those jobs "already have log folders ... from
    a queue gpusched no longer knows" of the folders this queue had just made: the folders are
    read before anything is queued."""
    from gpusched import cli
    from gpusched.store import Store

    write_plan(project, "q", 'command: "true {config}"\njobs: [{name: a}, {name: b}]\n')
    real = Store.submit

    def submit_and_launch(self: Store, suite: Any, *args: Any, **kwargs: Any) -> Any:
        result = real(self, suite, *args, **kwargs)
        for job_id in result.queued:  # as the daemon's first tick does, at once
            (Path(suite.logs_dir) / job_id.partition("/")[2] / "1-A").mkdir(parents=True)
        return result

    monkeypatch.setattr(Store, "submit", submit_and_launch)
    monkeypatch.chdir(project)
    monkeypatch.setenv("GPUSCHED_FAKE_GPUS", "2x24GiB")
    assert cli.main(["submit", "--suite", "q", "--gpu-plan", "2", "--backend", "subprocess"]) == 0
    out = capsys.readouterr().out
    assert "q: queued 2 jobs" in out and "already have log folders" not in out


def test_the_standby_daemon_s_file_has_no_name_even_where_tmpdir_is_wrong(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What a standby daemon writes before the word to go lies in no folder (a refused submit
    leaves nothing anywhere), and a TMPDIR that does not exist does not refuse the submit."""
    from gpusched import daemon

    for tmpdir in ("/tmp", "/nonexistent/gpusched-test"):
        monkeypatch.setenv("TMPDIR", tmpdir)
        fd = daemon._nameless_file()
        try:
            assert os.fstat(fd).st_nlink == 0
            os.write(fd, b"words\n")
            assert daemon._read_from_start(fd) == b"words\n"
        finally:
            os.close(fd)
