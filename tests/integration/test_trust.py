"""The promises a user leaves running overnight on, through the real CLI: jobs outlive the
daemon (stopped or killed) and a new daemon re-adopts them; `drain` stops new launches; a job
that ignores SIGTERM is SIGKILLed after the grace period; the tmux server killed from outside
loses nothing; the state directory is private; override values reach the job verbatim and
never reach a shell; bad input is one line and exit 2.

Jobs wait on a file the test creates (a "go" signal) instead of sleeping a guessed time.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpusched import proc
from gpusched.attempt import AttemptPaths
from gpusched.store import Store
from tests.conftest import run_cli
from tests.helpers import retry_until

FAKE = {"GPUSCHED_FAKE_GPUS": "2x24GiB"}
needs_tmux = pytest.mark.skipif(not shutil.which("tmux"), reason="tmux not installed")
BACKENDS = ["subprocess", pytest.param("tmux", marks=needs_tmux)]


def write_plan(project: Path, name: str, script: str, jobs: list[str], **extra: Any) -> None:
    """A plan whose jobs run ``sh -c SCRIPT`` (with $GO, $LAUNCHES set) and log their start."""
    body = 'echo "$GPUSCHED_JOB_ID" >> "$LAUNCHES"; ' + script
    doc = {
        "command": "sh -c " + _sq(body) + " job {config}",
        "env": {"LAUNCHES": str(project / "launches.txt"), "GO": str(project / "go")},
        "jobs": [{"name": j} for j in jobs],
        **extra,
    }
    (project / "plans" / f"{name}.yaml").write_text(yaml.safe_dump(doc))


def _sq(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


WAIT_FOR_GO = 'while [ ! -e "$GO" ]; do sleep 0.05; done'


def store(home: Path) -> Store:
    return Store(home / "gpusched.db")


def states(home: Path, suite: str) -> dict[str, str]:
    return {j.name: j.state.value for j in store(home).jobs(suite=suite)}


def launches(project: Path) -> list[str]:
    f = project / "launches.txt"
    return sorted(f.read_text().split()) if f.exists() else []


def wrapper_pid(home: Path, job_id: str) -> tuple[int, float]:
    a = store(home).attempts(job_id)[-1]
    return retry_until(AttemptPaths(Path(a.dir)).read_pid, timeout=10)


def daemon_pid(home: Path) -> int:
    return int(json.loads((home / "daemon.json").read_text())["pid"])


def dead(pid: int) -> bool:
    return proc.started_at(pid) is None


def submit_on_one_slot(project: Path, suite: str) -> None:
    """Queue ``suite`` on one fake GPU, one slot, as plain processes."""
    argv = ("submit", "--suite", suite, "--gpu-plan", "1", "--backend", "subprocess")
    run_cli(*argv, cwd=project, env=FAKE, check=True)


# --------------------------------------------------------------------------- jobs outlive the daemon


@pytest.mark.parametrize("how", ["stop", "kill -9"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_jobs_outlive_the_daemon_and_a_new_daemon_re_adopts_them(
    gs_home: Path, project: Path, backend: str, how: str
) -> None:
    write_plan(project, "night", WAIT_FOR_GO, ["a", "b"])
    run_cli(
        "submit",
        "--suite",
        "night",
        "--gpu-plan",
        "1,1",
        "--backend",
        backend,
        cwd=project,
        env=FAKE,
        check=True,
    )
    retry_until(lambda: launches(project) == ["night/a", "night/b"], timeout=30)
    wrappers = [wrapper_pid(gs_home, f"night/{j}") for j in "ab"]
    if how == "stop":
        r = run_cli("daemon", "stop", cwd=project, check=True)
        assert "jobs keep running" in r.stdout
    else:
        pid = daemon_pid(gs_home)
        os.kill(pid, signal.SIGKILL)
        retry_until(lambda: dead(pid), timeout=10)
        # its tmux control client goes with it: left attached, it kept the server from ever exiting
        retry_until(lambda: not control_clients(gs_home), timeout=10)
    assert run_cli("daemon", "status", cwd=project).returncode == 3  # no daemon
    assert all(proc.is_alive(pid, started) for pid, started in wrappers)  # the jobs still run
    if how == "stop":  # they end while no daemon runs: the next one reaps them from exit.json
        (project / "go").touch()
        for a in (store(gs_home).attempts(f"night/{j}")[-1] for j in "ab"):
            retry_until(AttemptPaths(Path(a.dir)).read_exit, timeout=20)
        run_cli("daemon", "start", cwd=project, env=FAKE, check=True)
    else:  # a new daemon re-adopts them while they run
        run_cli("daemon", "start", cwd=project, env=FAKE, check=True)
        log = (gs_home / "daemon.log").read_text()
        # a pane is found by its token; a runner's wrapper shows none, and is known by its handle
        said = "re-adopted" if backend == "tmux" else "still running"
        assert f"reconcile: night/a: {said}" in log and f"reconcile: night/b: {said}" in log
        (project / "go").touch()
    retry_until(lambda: states(gs_home, "night") == {"a": "succeeded", "b": "succeeded"}, timeout=30)
    assert launches(project) == ["night/a", "night/b"]  # each ran exactly once
    assert [len(store(gs_home).attempts(f"night/{j}")) for j in "ab"] == [1, 1]
    if backend == "tmux":  # `tmux kill-server` (safe, the README says) ends the server, whatever died
        run_cli("daemon", "stop", cwd=project, check=True)
        sock = str(gs_home / "tmux.sock")
        subprocess.run(["tmux", "-S", sock, "kill-server"], capture_output=True)  # (it may be gone already)

        def server_gone() -> bool:
            said = subprocess.run(["tmux", "-S", sock, "ls"], capture_output=True, text=True).stderr
            return "no server running" in said or "error connecting" in said

        retry_until(server_gone, timeout=10)  # not "server exited unexpectedly", for good


def control_clients(home: Path) -> list[int]:
    """The tmux control-mode clients attached to ``home``'s tmux server."""
    import psutil

    sock = str(home / "tmux.sock")
    out = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        cmd = p.info["cmdline"] or []
        if sock in cmd and "-C" in cmd and p.info["status"] != psutil.STATUS_ZOMBIE:
            out.append(p.info["pid"])
    return out


def test_a_stop_ends_the_daemon_at_once_not_after_its_tick_s_wait(gs_home: Path, project: Path) -> None:
    """Between ticks the daemon waits for a job's end or its next timed tick (every second);
    a SIGTERM ends that wait at once, so `gpusched daemon stop` does not wait out the rest
    of it (here a daemon that ticks once a minute: it would take the stop's 15 s and fail).
    The job it runs runs on, and the next daemon finds it."""
    write_plan(project, "s", WAIT_FOR_GO, ["a"])
    run = (
        "import sys; from gpusched import daemon; from gpusched.home import Home;"
        " sys.exit(daemon.run(Home.from_env(), probe_spec='fake:2x24GiB', interval_s=60))"
    )
    with open(gs_home.parent / "daemon.out", "wb") as out:
        argv = [sys.executable, "-c", run]
        daemon = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    retry_until(lambda: '"ready": true' in (_text(gs_home / "daemon.json") or ""), timeout=30)
    submit_on_one_slot(project, "s")
    pid, _ = wrapper_pid(gs_home, "s/a")
    retry_until(lambda: states(gs_home, "s") == {"a": "running"})
    run_cli("daemon", "stop", cwd=project, check=True)
    assert daemon.wait(timeout=30) == 0
    assert not dead(pid)
    (project / "go").touch()
    run_cli("wait", "--suite", "s", cwd=project, env=FAKE, check=True)  # (a new daemon: it ends there)
    assert states(gs_home, "s") == {"a": "succeeded"} and launches(project) == ["s/a"]


def test_a_state_directory_another_machines_daemon_runs_on_is_refused_in_one_line(
    gs_home: Path, project: Path
) -> None:
    """A home directory shared over NFS puts two machines' gpusched on one state directory:
    one SQLite database in WAL mode written from both, each daemon taking the other's jobs
    for lost. While another machine's daemon publishes its GPUs there, every command stops."""
    write_plan(project, "n", "true", ["a"])
    gs_home.mkdir()
    now = time.time()
    (gs_home / "daemon.json").write_text(json.dumps({"pid": 1, "host": "box-b", "started_at": now - 600}))
    (gs_home / "gpus.json").write_text(json.dumps({"at": now - 1, "notice": None, "gpus": []}))
    for argv in (("status",), ("submit", "--suite", "n", "--backend", "subprocess"), ("daemon", "stop")):
        r = run_cli(*argv, cwd=project, env=FAKE)
        assert r.returncode == 2 and r.stdout == "", (argv, r.stdout, r.stderr)
        line = r.stderr.strip()
        assert "\n" not in line and f"{gs_home} is in use by gpusched's daemon on box-b" in line
        assert f"export GPUSCHED_HOME={gs_home.parent / (gs_home.name + '-' + os.uname().nodename)}" in line
    assert not (gs_home / "gpusched.db").exists()  # nothing was queued
    (gs_home / "gpus.json").write_text(json.dumps({"at": now - 3600, "notice": None, "gpus": []}))
    assert run_cli("status", cwd=project).returncode == 0  # that daemon is long gone
    # a daemon of this machine, renamed since it started, is not another machine's
    submit_on_one_slot(project, "n")
    doc = json.loads((gs_home / "daemon.json").read_text())
    (gs_home / "daemon.json").write_text(json.dumps({**doc, "host": "old-name"}))
    assert run_cli("wait", "--suite", "n", "--timeout", "30", cwd=project).returncode == 0


def test_jobs_running_on_another_machine_are_never_taken_for_lost_here(gs_home: Path, project: Path) -> None:
    """The state directory's last daemon ran on another machine and its jobs run there still:
    a daemon here would find no such process and run them a second time. It does not start
    (nor does a submit queue anything) until told that machine is gone."""
    write_plan(project, "n", WAIT_FOR_GO, ["a"])
    submit_on_one_slot(project, "n")
    retry_until(lambda: launches(project) == ["n/a"], timeout=30)
    pid, _ = wrapper_pid(gs_home, "n/a")
    run_cli("daemon", "stop", cwd=project, check=True)
    a = store(gs_home).attempts("n/a")[-1]
    assert a.handle is not None and a.handle["host"] == os.uname().nodename
    with store(gs_home).tx() as db:  # as if it had been started on box-b
        db.execute("UPDATE attempts SET handle = json_set(handle, '$.host', 'box-b') WHERE id = ?", (a.id,))
    proc.signal_group(pid, signal.SIGKILL)  # ... and box-b is gone with it
    retry_until(lambda: dead(pid), timeout=10)
    write_plan(project, "m", "true", ["x"])
    for argv in (("daemon", "start"), ("submit", "--suite", "m", "--backend", "subprocess")):
        r = run_cli(*argv, cwd=project, env=FAKE)
        assert r.returncode == 2, (argv, r.stdout, r.stderr)
        assert "has 1 job running on box-b (n/a)" in r.stderr and "--forget-host box-b" in r.stderr
    assert states(gs_home, "n") == {"a": "running"} and states(gs_home, "m") == {}
    assert run_cli("daemon", "status", cwd=project).returncode == 3  # no daemon started
    r = run_cli("daemon", "start", "--forget-host", "box-b", cwd=project, env=FAKE, check=True)
    assert r.stdout.startswith("1 job recorded running on box-b: taken as this machine's")
    (project / "go").touch()
    retry_until(lambda: states(gs_home, "n") == {"a": "succeeded"}, timeout=30)
    assert [x.outcome for x in store(gs_home).attempts("n/a")] == ["lost", "ok"]


def test_forget_host_misused_is_one_line_and_starts_nothing(gs_home: Path, project: Path) -> None:
    for argv, said in (
        (("daemon", "stop", "--forget-host", "box-b"), "--forget-host goes with `gpusched daemon start`"),
        (("daemon", "start", "--forget-host", os.uname().nodename), "that is this machine"),
        (("daemon", "start", "--forget-host", "box-b"), "no job of this queue is recorded running on box-b"),
    ):
        r = run_cli(*argv, cwd=project, env=FAKE)
        assert r.returncode == 2 and r.stdout == "" and said in r.stderr, (argv, r.stdout, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1
    assert run_cli("daemon", "status", cwd=project).returncode == 3
    assert not (gs_home / "gpusched.db").exists()


def test_the_same_plan_under_another_name_may_not_share_output_dirs_with_a_running_suite(
    gs_home: Path, project: Path
) -> None:
    """``submit --name E1b`` of the plan that runs as E1: each job's twin writes the same
    output dir, and an OOM requeue of one resumes from the other's newest checkpoint."""
    write_plan(project, "n", WAIT_FOR_GO, ["a", "b"], resume={"flag_key": "is_keep_training"})
    doc = yaml.safe_load((project / "plans" / "n.yaml").read_text())
    doc["jobs"] = [{"name": j, "config": {"output_dir": f"out/{j}"}} for j in ("a", "b")]
    (project / "plans" / "n.yaml").write_text(yaml.safe_dump(doc))
    submit_on_one_slot(project, "n")
    twin = ("submit", "--suite", "n", "--name", "n2", "--backend", "subprocess")
    r = run_cli(*twin, cwd=project, env=FAKE)
    assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr
    line = r.stderr.strip()
    assert "\n" not in line and f"job 'a' would keep its checkpoints in {project / 'out' / 'a'}" in line
    assert "as n/a (running) does" in line and "give suite n2 output dirs of its own" in line
    assert states(gs_home, "n2") == {}
    (project / "go").touch()
    retry_until(lambda: states(gs_home, "n") == {"a": "succeeded", "b": "succeeded"}, timeout=30)
    run_cli(*twin, cwd=project, env=FAKE, check=True)  # one after the other is fine


def test_a_second_suite_runs_on_its_own_card_beside_a_long_queue_of_the_first(
    gs_home: Path, project: Path
) -> None:
    """300 jobs of one suite may use GPU 0 only; another suite's jobs GPU 1 only. They used
    to wait behind the first suite's queue with GPU 1 idle."""
    write_plan(project, "big", WAIT_FOR_GO, [f"j{i}" for i in range(300)])
    write_plan(project, "small", "true", ["a", "b"])
    for suite, plan in (("big", "1,0"), ("small", "0,1")):
        argv = ("submit", "--suite", suite, "--gpu-plan", plan, "--backend", "subprocess")
        run_cli(*argv, cwd=project, env=FAKE, check=True)
    r = run_cli("wait", "--suite", "small", "--timeout", "30", cwd=project)
    assert r.returncode == 0, r.stdout + r.stderr
    assert states(gs_home, "big")["j0"] == "running" and launches(project).count("big/j1") == 0
    run_cli("cancel", "big/*", cwd=project, check=True)


def test_drain_stops_new_launches_and_running_jobs_finish(gs_home: Path, project: Path) -> None:
    write_plan(project, "dr", WAIT_FOR_GO, ["a", "b"])
    run_cli(
        "submit",
        "--suite",
        "dr",
        "--gpu-plan",
        "1",
        "--backend",
        "subprocess",
        cwd=project,
        env=FAKE,
        check=True,
    )
    retry_until(lambda: launches(project) == ["dr/a"], timeout=30)
    r = run_cli("drain", cwd=project, check=True)
    assert "draining" in r.stdout
    (project / "go").touch()
    # the tick that reaps `a` would launch `b` into the freed slot, were it not draining
    retry_until(lambda: states(gs_home, "dr")["a"] == "succeeded", timeout=30)
    assert states(gs_home, "dr")["b"] == "queued" and launches(project) == ["dr/a"]
    # nothing runs and the drain holds the rest: `wait` says so now, not at its timeout
    r = run_cli("wait", "--suite", "dr", "--timeout", "60", cwd=project)
    assert r.returncode == 1, r.stderr
    assert r.stdout.strip() == (
        "1 succeeded, 0 failed, 0 cancelled, 1 left queued by the drain (`gpusched drain --off` runs them)"
    )
    r = run_cli("drain", "--off", cwd=project, check=True)
    assert "resumed" in r.stdout
    retry_until(lambda: states(gs_home, "dr")["b"] == "succeeded", timeout=30)
    assert launches(project) == ["dr/a", "dr/b"]


def test_drain_at_a_time_of_day_is_kept_shown_and_cancelled(gs_home: Path, project: Path) -> None:
    """`drain --at 07:30` keeps the next 07:30 in the queue, status shows it to come (plain and
    JSON), `--off` cancels it; a time that is no time of day is one line and exit 2."""
    import time

    r = run_cli("drain", "--at", "07:30", cwd=project, check=True)
    assert r.stdout.startswith("drains at ") and "07:30: no new launches from then" in r.stdout
    doc = json.loads(run_cli("status", "--json", cwd=project, check=True).stdout)
    at = time.localtime(doc["drains_at"])
    assert doc["draining"] is False and (at.tm_hour, at.tm_min) == (7, 30)
    assert 0 < doc["drains_at"] - time.time() <= 25 * 3600  # (a night the clocks go back is 25 h)
    assert f"DRAINS AT {time.strftime('%a', at)} 07:30" in run_cli("status", cwd=project, check=True).stdout
    run_cli("drain", "--off", cwd=project, check=True)
    doc = json.loads(run_cli("status", "--json", cwd=project, check=True).stdout)
    assert doc["draining"] is False and doc["drains_at"] is None
    for bad in ("25:00", "7.30", "07:60", "7:5", "noon"):
        r = run_cli("drain", "--at", bad, cwd=project)
        assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
        assert f"--at {bad}: not a time of day like 07:30" in r.stderr
    assert run_cli("drain", "--at", "07:30", "--off", cwd=project).returncode == 2  # one or the other
    run_cli("drain", cwd=project, check=True)  # draining now: a later --at lets launches go on till then
    assert "; until then launches go on" in run_cli("drain", "--at", "07:30", cwd=project, check=True).stdout


def test_a_disk_too_full_for_the_night_holds_launches_and_status_says_where(
    gs_home: Path, project: Path
) -> None:
    """The real statvfs of the suite's logs directory, under a floor no disk meets: the jobs
    wait queued (none fails), status says which directory and why; with room, they run."""
    write_plan(project, "disk", "true", ["a", "b"])
    submit = ["submit", "--suite", "disk", "--gpu-plan", "1,1", "--backend", "subprocess"]
    run_cli(*submit, cwd=project, env={**FAKE, "GPUSCHED_DISK_MIN_FREE": "1000000000GiB"}, check=True)

    def waiting() -> dict[str, Any]:
        doc = json.loads(run_cli("status", "--json", cwd=project, check=True).stdout)
        assert doc["launch_wait"], doc
        return doc

    doc = retry_until(waiting, timeout=30)
    logs = project / "logs" / "disk"
    assert doc["launch_wait"].startswith(f"disk low: {logs} has ")
    assert doc["launch_wait"].endswith("free, launches wait for 1000000000.0 GiB")
    assert [(j["state"], j["reason"]) for j in doc["jobs"]] == [("queued", doc["launch_wait"])] * 2
    text = run_cli("status", cwd=project, env={"COLUMNS": "200"}, check=True).stdout
    assert f"launches wait: disk low: {logs}" in text
    assert launches(project) == []

    run_cli("daemon", "stop", cwd=project, check=True)  # space freed (the floor lifted): start again
    run_cli("daemon", "start", cwd=project, env=FAKE, check=True)
    assert run_cli("wait", "--suite", "disk", cwd=project, timeout=60).returncode == 0
    assert launches(project) == ["disk/a", "disk/b"]
    assert json.loads(run_cli("status", "--json", cwd=project, check=True).stdout)["launch_wait"] is None


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("GPUSCHED_DISK_MIN_FREE", "lots"),
        ("GPUSCHED_HOST_MIN_FREE", "4 gigs"),
        ("GPUSCHED_CANCEL_GRACE_S", "-1"),
        ("GPUSCHED_RUNNER", "fast"),
        ("GPUSCHED_TMUX_PANES", "slot"),
        ("GPUSCHED_LOG", "verbose"),
    ],
)
def test_a_bad_setting_in_the_environment_is_refused_before_anything_is_queued(
    gs_home: Path, project: Path, name: str, value: str
) -> None:
    write_plan(project, "env", "true", ["a"])
    args = ["submit", "--suite", "env", "--gpu-plan", "1", "--backend", "subprocess"]
    r = run_cli(*args, cwd=project, env={**FAKE, name: value})
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith(f"gpusched: {name}={value!r} in the environment: not "), lines[0]
    assert not (gs_home / "gpusched.db").exists() or store(gs_home).jobs() == []
    assert not (gs_home / "daemon.json").exists()
    # the daemon `submit` started on standby before it read the environment is gone too
    retry_until(lambda: not proc.carrying("GPUSCHED_HOME", str(gs_home)), timeout=10)


def test_a_setting_the_running_daemon_does_not_have_is_named_not_quietly_ignored(
    gs_home: Path, project: Path
) -> None:
    """A daemon reads its settings as it starts: a submit beside one that runs, with another
    value in its environment, queues as asked and says, in one line, which of them the daemon
    has and how to change it. The same value spelled otherwise, or the default itself, says
    nothing; the daemon's own show in `status` and `daemon status`."""
    write_plan(project, "env", "true", ["a"])
    args = ["submit", "--suite", "env", "--gpu-plan", "1", "--backend", "subprocess"]
    run_cli(*args, cwd=project, env={**FAKE, "GPUSCHED_TMUX_PANES": "reuse"}, check=True)
    info = json.loads(run_cli("daemon", "status", cwd=project, check=True).stdout)
    assert info["settings"] == {"GPUSCHED_TMUX_PANES": "reuse"}
    assert "GPUSCHED_TMUX_PANES=reuse" in run_cli("status", cwd=project, check=True).stdout.splitlines()[0]

    other = {**FAKE, "GPUSCHED_TMUX_PANES": "job", "GPUSCHED_CANCEL_GRACE_S": "30"}
    r = run_cli(*args, cwd=project, env=other)
    assert r.returncode == 0 and "queued 0 jobs" in r.stdout  # (a was already queued or done)
    assert r.stderr.strip().splitlines() == [
        f"gpusched: note: the daemon already running (pid {info['pid']}) has GPUSCHED_CANCEL_GRACE_S=10"
        " (its default), not 30 as here; GPUSCHED_TMUX_PANES=reuse, not job as here: a daemon reads these"
        " as it starts; for them to apply, `gpusched daemon stop` (its jobs keep running) and run this again"
    ]
    same = {**FAKE, "GPUSCHED_TMUX_PANES": " Reuse ", "GPUSCHED_CANCEL_GRACE_S": "10.0"}
    assert run_cli(*args, cwd=project, env=same, check=True).stderr == ""
    r = run_cli("daemon", "start", cwd=project, env={"GPUSCHED_RUNNER": "0"}, check=True)
    assert "has GPUSCHED_RUNNER=1 (its default), not 0 as here" in r.stderr


def test_a_daemon_that_recorded_no_settings_gets_no_note(monkeypatch: pytest.MonkeyPatch) -> None:
    """One started by a gpusched before daemon.json kept its settings: what it read is not
    known, so nothing is claimed about it; nor with no daemon at all."""
    from gpusched import daemon

    monkeypatch.setenv("GPUSCHED_TMUX_PANES", "job")
    assert daemon.settings_not_taken({"pid": 1, "ready": True}) is None
    assert daemon.settings_not_taken(None) is None
    assert daemon.settings_not_taken({"pid": 1, "settings": {"GPUSCHED_TMUX_PANES": "job"}}) is None
    note = daemon.settings_not_taken({"pid": 1, "settings": {}})
    assert note is not None and "GPUSCHED_TMUX_PANES=auto (its default), not job as here" in note
    # one started by hand with a value it does not take (`daemon run` checks none) took the default
    note = daemon.settings_not_taken({"pid": 1, "settings": {"GPUSCHED_TMUX_PANES": "slot"}})
    assert note is not None and "GPUSCHED_TMUX_PANES=auto, not job as here" in note


def test_retry_a_pattern_queues_again_what_failed_and_nothing_half_way(gs_home: Path, project: Path) -> None:
    """The morning after: `retry 'r/*'` takes the failed and cancelled jobs the pattern
    matches, not the ones that succeeded or still run; a retry that names a job not finished
    is refused whole, in one line, with nothing queued."""
    script = 'case "$GPUSCHED_JOB" in bad*) exit 1;; slow) ' + WAIT_FOR_GO + ";; esac"
    write_plan(project, "r", script, ["ok", "bad1", "bad2", "slow"])
    submit = ["submit", "--suite", "r", "--gpu-plan", "2,2", "--backend", "subprocess"]
    run_cli(*submit, cwd=project, env=FAKE, check=True)
    want = {"ok": "succeeded", "bad1": "failed", "bad2": "failed", "slow": "running"}
    try:
        retry_until(lambda: states(gs_home, "r") == want, timeout=30)

        r = run_cli("retry", "r/ok", "r/slow", cwd=project)
        assert r.returncode == 2 and r.stderr.strip().splitlines() == [
            "gpusched: job r/slow is running: only finished jobs, and queued ones waiting out a backoff,"
            " can be retried (none was)"
        ]
        assert states(gs_home, "r") == want  # r/ok was not queued again either

        r = run_cli("retry", "r/*", cwd=project, check=True)
        assert r.stdout.splitlines() == ["r/bad1: queued again at tier A", "r/bad2: queued again at tier A"]
        retry_until(lambda: launches(project).count("r/bad2") == 2, timeout=30)
        retry_until(lambda: states(gs_home, "r") == want, timeout=30)
        assert launches(project).count("r/ok") == 1

        r = run_cli("retry", "r/ok*", cwd=project)
        assert (
            r.returncode == 2
            and "no failed or cancelled job, nor one waiting out a backoff, matches" in r.stderr
        )
    finally:
        (project / "go").touch()  # the slow job ends, whatever was asserted
    retry_until(lambda: states(gs_home, "r")["slow"] == "succeeded", timeout=30)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_hung_job_is_stopped_at_its_silence_limit_and_the_queue_goes_on(
    gs_home: Path, project: Path, backend: str
) -> None:
    """A job that prints nothing (a deadlock, a prompt waiting for input) holds its slot until
    `limits.silence`, then fails as a timeout; a job that keeps printing runs on; the slot is
    refilled. Real wrapper, real log file mtimes, the real daemon's clock."""
    talk = 'while [ ! -e "$GO" ]; do echo step; sleep 0.1; done'
    script = f'case "$GPUSCHED_JOB_ID" in */hung) exec sleep 300;; esac; {talk}'
    write_plan(project, "quiet", script, ["hung", "talks", "next"], limits={"silence": 2})
    submit = ["submit", "--suite", "quiet", "--gpu-plan", "1,1", "--backend", backend]
    run_cli(*submit, cwd=project, env=FAKE, check=True)
    retry_until(lambda: states(gs_home, "quiet")["hung"] == "failed", timeout=60)
    hung = store(gs_home).job("quiet/hung")
    assert hung is not None and hung.outcome == "timeout"
    assert hung.reason == "printed nothing for 2s, taken as hung (limits.silence)"
    retry_until(lambda: launches(project) == ["quiet/hung", "quiet/next", "quiet/talks"], timeout=30)
    assert states(gs_home, "quiet")["talks"] == "running"  # it spoke every 0.1 s: never judged hung
    (project / "go").touch()
    assert run_cli("wait", "--suite", "quiet", cwd=project, timeout=60).returncode == 1  # one failed
    assert states(gs_home, "quiet") == {"hung": "failed", "talks": "succeeded", "next": "succeeded"}
    assert dead(wrapper_pid(gs_home, "quiet/hung")[0])


def test_a_runaway_log_is_stopped_at_its_output_limit_and_the_job_beside_it_runs_on(
    gs_home: Path, project: Path
) -> None:
    """A job that prints 64 KiB lines without end (a warning in a tight loop) is stopped once its
    output.log passes `limits.output` and fails as a timeout; the job beside it, printing a line
    now and then, runs on and succeeds. Real wrapper, real log, the real daemon's ticks."""
    runaway = "s=x; for _ in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16; do s=$s$s; done; "
    runaway += 'while :; do printf "%s\\n" "$s"; sleep 0.02; done'
    script = f'case "$GPUSCHED_JOB_ID" in */runaway) {runaway};; esac; echo step; {WAIT_FOR_GO}'
    write_plan(project, "loud", script, ["runaway", "calm"], limits={"output": "1MiB"})
    run_cli(
        "submit", "--suite", "loud", "--gpu-plan", "1,1", "--backend", "subprocess", cwd=project, env=FAKE
    )
    retry_until(lambda: states(gs_home, "loud")["runaway"] == "failed", timeout=60)
    job = store(gs_home).job("loud/runaway")
    assert job is not None and job.outcome == "timeout"
    said = r"wrote \d+\.\d MiB to its output\.log, more than its limit of 1\.0 MiB \(limits\.output\)"
    assert re.fullmatch(said, job.reason), job.reason
    log = Path(store(gs_home).attempts("loud/runaway")[-1].dir) / "output.log"
    assert log.stat().st_size > 1 << 20
    assert states(gs_home, "loud")["calm"] == "running"
    (project / "go").touch()
    assert run_cli("wait", "--suite", "loud", cwd=project, timeout=60).returncode == 1  # one failed
    assert states(gs_home, "loud") == {"runaway": "failed", "calm": "succeeded"}


def test_a_broken_gpu_goes_out_of_service_and_does_not_take_the_queue_down(
    gs_home: Path, project: Path
) -> None:
    """GPU 1 fails every job placed on it with an uncorrectable ECC error. Without a rule its
    slot frees fastest and it would fail most of the queue; now after two faults in a row it
    is out of service, every job succeeds on GPU 0, and `gpus --enable` brings it back."""
    ecc = "RuntimeError: CUDA error: uncorrectable ECC error encountered"
    script = f'if [ "$CUDA_VISIBLE_DEVICES" = 1 ]; then echo "{ecc}" >&2; exit 1; fi'
    write_plan(project, "ecc", script, [f"j{i}" for i in range(6)])
    run_cli("submit", "--suite", "ecc", "--gpu-plan", "1,1", "--backend", "subprocess", cwd=project, env=FAKE)
    assert run_cli("wait", "--suite", "ecc", cwd=project, timeout=90).returncode == 0  # all succeeded
    doc = json.loads(run_cli("status", "--json", cwd=project, check=True).stdout)
    out = {g["index"]: g["out_of_service"] for g in doc["gpus"]}
    assert out[0] is None and out[1]["faults"] == 2
    assert out[1]["why"] == f"the GPU hit an uncorrectable ECC error: {ecc}"
    jobs = store(gs_home).jobs(suite="ecc")
    attempts = [a for j in jobs for a in store(gs_home).attempts(j.id)]
    assert sum(a.outcome == "gpu_fault" for a in attempts) == 2 and all(j.errors == 0 for j in jobs)
    text = run_cli("status", cwd=project, env={"COLUMNS": "300"}, check=True).stdout
    assert "GPU 1 OUT OF SERVICE since" in text
    listed = run_cli("gpus", cwd=project, env=FAKE, check=True).stdout
    assert "GPU 1 is out of service after 2 faults in a row" in listed
    # without --fake-gpus, `gpus` looks through the running daemon's probe (it said "no GPU")
    assert run_cli("gpus", cwd=project, check=True).stdout == listed

    bad = run_cli("gpus", "--enable", "one", cwd=project)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--enable 'one'" in bad.stderr
    # a typo (3 for 1) does nothing, and says which GPU is out of service
    typo = run_cli("gpus", "--enable", "3", cwd=project, check=True)
    assert typo.stdout == "GPU 3 was not out of service (GPU 1 is: `gpusched gpus --enable 1`)\n"
    r = run_cli("gpus", "--enable", "1,3", cwd=project, check=True)
    assert r.stdout.splitlines() == [
        "GPU 1 is back in service: jobs are placed on it again",
        "GPU 3 was not out of service (none is)",
    ]
    assert store(gs_home).gpus_out() == {}


def test_a_card_that_falls_off_the_bus_is_out_of_service_before_any_job_fails_on_it(
    gs_home: Path, project: Path, tmp_path: Path
) -> None:
    """The daemon's probe finds GPU 1 lost (as NVML reports GPU_IS_LOST): it goes out of
    service at once, no job is ever placed there, the queue runs on GPU 0, and `status` and
    `gpus` say why."""
    state = tmp_path / "gpu-state.json"
    state.write_text(json.dumps({"1": {"lost": True}}))
    env = {**FAKE, "GPUSCHED_FAKE_GPU_STATE": str(state)}
    write_plan(project, "bus", 'echo "gpu=$CUDA_VISIBLE_DEVICES"', [f"j{i}" for i in range(4)])
    run_cli("submit", "--suite", "bus", "--gpu-plan", "1,1", "--backend", "subprocess", cwd=project, env=env)
    assert run_cli("wait", "--suite", "bus", cwd=project, timeout=90).returncode == 0
    jobs = store(gs_home).jobs(suite="bus")
    assert {a.gpu for j in jobs for a in store(gs_home).attempts(j.id)} == {0}
    doc = json.loads(run_cli("status", "--json", cwd=project, check=True).stdout)
    gpu1 = next(g for g in doc["gpus"] if g["index"] == 1)
    assert gpu1["lost"] is True
    assert gpu1["out_of_service"]["why"].startswith("the GPU probe finds the card lost")
    text = run_cli("status", cwd=project, env={"COLUMNS": "300"}, check=True).stdout
    assert "GPU 1 OUT OF SERVICE since" in text and "finds the card lost" in text
    listed = run_cli("gpus", cwd=project, env=env, check=True).stdout
    assert "LOST: the GPU probe finds the card lost" in listed
    assert "GPU 1 is out of service because the GPU probe finds the card lost" in listed


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_job_hung_on_a_card_that_falls_off_the_bus_is_stopped_and_runs_again_on_another(
    gs_home: Path, project: Path, tmp_path: Path, backend: str
) -> None:
    """A job whose card is lost mid-run hangs there (as CUDA calls on a card off the bus do):
    the daemon stops its process group and reruns it on the other card, uncharged, instead of
    leaving it to hold its slot until morning."""
    state = tmp_path / "gpu-state.json"
    state.write_text("{}")
    env = {**FAKE, "GPUSCHED_FAKE_GPU_STATE": str(state)}
    script = 'echo $$ > "$GPUSCHED_ATTEMPT_DIR/job.pid"; if [ "$GPUSCHED_GPU" = 1 ]; then sleep 300; fi'
    write_plan(project, "bus", script, ["a", "b"])
    run_cli("submit", "--suite", "bus", "--gpu-plan", "1,1", "--backend", backend, cwd=project, env=env)
    hung = retry_until(
        lambda: next((a for a in store(gs_home).live_attempts() if a.gpu == 1), None), timeout=30
    )
    hung_pid = int(retry_until(lambda: _text(Path(hung.dir) / "job.pid"), timeout=30))
    state.write_text(json.dumps({"1": {"lost": True}}))
    assert run_cli("wait", "--suite", "bus", cwd=project, timeout=90).returncode == 0
    assert dead(hung_pid)
    attempts = store(gs_home).attempts(hung.job_id)
    assert [(a.gpu, a.outcome) for a in attempts] == [(1, "gpu_fault"), (0, "ok")]
    assert attempts[0].reason == "its GPU 1 was lost while it ran (stopped)"
    assert f"{hung.job_id}: SIGTERM sent (its GPU 1 is lost)" in (gs_home / "daemon.log").read_text()


@pytest.mark.parametrize("backend", BACKENDS)
def test_cancel_sigkills_a_job_that_ignores_sigterm_after_the_grace_period(
    gs_home: Path, project: Path, backend: str
) -> None:
    script = 'trap "" TERM HUP INT; echo $$ > "$GPUSCHED_ATTEMPT_DIR/job.pid"; sleep 300'
    write_plan(project, "stubborn", script, ["a"])
    env = {**FAKE, "GPUSCHED_CANCEL_GRACE_S": "1"}
    run_cli(
        "submit",
        "--suite",
        "stubborn",
        "--gpu-plan",
        "1",
        "--backend",
        backend,
        cwd=project,
        env=env,
        check=True,
    )
    a = retry_until(lambda: (store(gs_home).attempts("stubborn/a") or [None])[-1], timeout=30)
    job_pid = int(retry_until(lambda: _text(Path(a.dir) / "job.pid"), timeout=30))
    t0 = time.monotonic()
    r = run_cli("cancel", "stubborn/a", cwd=project, check=True)
    assert "1 stopping" in r.stdout
    retry_until(lambda: states(gs_home, "stubborn")["a"] == "cancelled", timeout=30)
    assert time.monotonic() - t0 >= 0.9  # SIGTERM first, SIGKILL only after the grace period
    assert dead(job_pid)
    assert "SIGKILL sent to its process group" in (gs_home / "daemon.log").read_text()


def test_a_sigkill_from_outside_is_not_put_down_to_the_kernel_oom_killer(
    gs_home: Path, project: Path
) -> None:
    """A job killed by SIGKILL while the kernel's count of OOM kills (/proc/vmstat) stood still
    was not the kernel OOM killer's: the reason says so, and names who else sends one."""
    from gpusched.memwatch import kernel_oom_kills
    from gpusched.outcome import SIGKILL_NOT_KERNEL, SIGKILL_REASON

    write_plan(project, "killed", "kill -9 $$", ["a"], tiers=[{"name": "A"}])
    before = kernel_oom_kills()
    submit_on_one_slot(project, "killed")
    assert run_cli("wait", "--suite", "killed", "--timeout", "60", "--quiet", cwd=project).returncode == 1
    after = kernel_oom_kills()
    a = store(gs_home).attempts("killed/a")[-1]
    assert (a.outcome, a.signal) == ("host_oom", 9)
    if before is not None and before == after:  # the kernel killed nothing while the job ran
        assert a.reason == SIGKILL_NOT_KERNEL
    else:  # no count here, or the kernel killed something meanwhile: it may have been this job
        assert a.reason in (SIGKILL_REASON, SIGKILL_NOT_KERNEL) and (
            before is not None or a.reason == SIGKILL_REASON
        )


def test_a_job_whose_save_found_the_disk_full_waits_to_run_again_and_says_until_when(
    gs_home: Path, project: Path
) -> None:
    write_plan(project, "full", 'echo "OSError: [Errno 28] No space left on device" >&2; exit 1', ["a"])
    submit_on_one_slot(project, "full")
    retry_until(lambda: [a.outcome for a in store(gs_home).attempts("full/a")] == ["disk_full"], timeout=30)
    job = json.loads(run_cli("status", "--json", cwd=project, check=True).stdout)["jobs"][0]
    assert (job["state"], job["outcome"], job["tier"]) == ("queued", "disk_full", "A")
    assert job["reason"].startswith("the disk filled up, requeued at tier A in 300 s (1 of 3; not counted")
    assert "(waits until " in job["reason"] and store(gs_home).job("full/a").errors == 0  # type: ignore[union-attr]
    # the disk freed before the five minutes are up: `retry` runs it now (here it fills up again)
    r = run_cli("retry", "full/*", cwd=project, check=True)
    assert r.stdout == "full/a: runs at tier A without waiting out its backoff\n"
    retry_until(
        lambda: len(store(gs_home).attempts("full/a")) == 2 and store(gs_home).job("full/a").not_before,
        timeout=30,
    )
    # (a person's retry counts the job's full disks anew)
    assert "in 300 s (1 of 3;" in (store(gs_home).job("full/a").reason or "")  # type: ignore[union-attr]
    run_cli("cancel", "full/a", cwd=project, check=True)


def _text(p: Path) -> str | None:
    try:
        return p.read_text().strip() or None
    except OSError:
        return None


@needs_tmux
@pytest.mark.parametrize("panes", ["job", "auto"])
def test_tmux_server_killed_from_outside_loses_nothing(gs_home: Path, project: Path, panes: str) -> None:
    """Killing the private tmux server closes the panes' terminals, not the jobs: they run on
    and report through exit.json; the next launch starts a new server. In a reused pane too:
    its loop outlives the hang-up while its job runs (it would hang the job up as it died)."""
    write_plan(project, "tx", WAIT_FOR_GO, ["a", "b", "c"])
    env = {**FAKE, "GPUSCHED_TMUX_PANES": panes}
    run_cli(
        "submit", "--suite", "tx", "--gpu-plan", "1", "--backend", "tmux", cwd=project, env=env, check=True
    )
    retry_until(lambda: launches(project) == ["tx/a"], timeout=30)
    sock = str(gs_home / "tmux.sock")
    server = int(
        subprocess.run(
            ["tmux", "-S", sock, "display", "-p", "#{pid}"], capture_output=True, text=True, check=True
        ).stdout
    )
    os.kill(server, signal.SIGKILL)
    retry_until(lambda: dead(server), timeout=10)
    assert proc.is_alive(*wrapper_pid(gs_home, "tx/a"))  # the job outlived its terminal
    (project / "go").touch()
    retry_until(lambda: set(states(gs_home, "tx").values()) == {"succeeded"}, timeout=60)
    assert launches(project) == ["tx/a", "tx/b", "tx/c"]
    assert [a.outcome for a in store(gs_home).attempts("tx/a")] == ["ok"]
    ls = subprocess.run(["tmux", "-S", sock, "list-sessions"], capture_output=True, text=True)
    assert ls.returncode == 0 and "tx" in ls.stdout  # a new server holds the later panes


# --------------------------------------------------------------------------- privacy, injection


@needs_tmux
def test_state_dir_socket_fifo_and_env_snapshot_are_private(gs_home: Path, project: Path) -> None:
    write_plan(project, "priv", "exit 0", ["a"])
    old = os.umask(0o022)
    try:
        run_cli(
            "submit",
            "--suite",
            "priv",
            "--gpu-plan",
            "1",
            "--backend",
            "tmux",
            cwd=project,
            env=FAKE,
            check=True,
        )
    finally:
        os.umask(old)
    retry_until(lambda: states(gs_home, "priv")["a"] == "succeeded", timeout=30)

    def mode(p: Path) -> int:
        return stat.S_IMODE(p.stat().st_mode)

    assert mode(gs_home) == 0o700 and mode(gs_home / "env") == 0o700
    assert mode(gs_home / "env" / "priv.sh") == 0o600  # the submitting shell's env: may hold tokens
    assert mode(gs_home / "wake") == 0o600 and stat.S_ISFIFO((gs_home / "wake").stat().st_mode)
    assert mode(gs_home / "tmux.sock") & 0o077 == 0
    assert mode(gs_home / "gpusched.db") == 0o600  # the queue: commands, env values, paths
    assert all(mode(p) & 0o077 == 0 or p.parent == gs_home for p in gs_home.rglob("*"))


EVIL = {
    "subst": "$(touch {pwn}/subst)",
    "backtick": "`touch {pwn}/backtick`",
    "quote_break": "'; touch {pwn}/quote; echo '",
    "dquote_break": '"; touch {pwn}/dquote; echo "',
    "semicolon": "x; touch {pwn}/semicolon",
    "newline": "x\ntouch {pwn}/newline",
    "mixed": "a\"b'c\\d|e&f>g<h*?[ ]{{x}}",
    "unicode": "日本語 ünïcödé ✓",
}

DUMP = """
import json, os, sys, yaml
cfg = yaml.safe_load(open(sys.argv[1]))
seen = {"config": {k: cfg.get(k) for k in json.loads(os.environ["KEYS"])}, "env": os.environ["EVIL_ENV"],
        "matrix": cfg.get("tag")}
open(os.path.join(os.environ["GPUSCHED_ATTEMPT_DIR"], "seen.json"), "w").write(json.dumps(seen))
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_override_values_reach_the_job_verbatim_and_never_run(
    gs_home: Path, project: Path, tmp_path: Path, backend: str
) -> None:
    pwn = tmp_path / "pwned"
    pwn.mkdir()
    values = {k: v.format(pwn=pwn) for k, v in EVIL.items()}
    env_value = f"$(touch {pwn}/env) `touch {pwn}/env2` '; touch {pwn}/env3"
    matrix_value = f"$(touch {pwn}/matrix)"
    (project / "dump.py").write_text(textwrap.dedent(DUMP))
    doc = {
        "command": "python dump.py {config}",
        "env": {"KEYS": json.dumps(sorted(values)), "EVIL_ENV": env_value},
        "config": values,
        "matrix": {"tag": [matrix_value]},
        "job": {"name": "only", "config": {"tag": "{tag}"}},
    }
    (project / "plans" / "inj.yaml").write_text(yaml.safe_dump(doc, allow_unicode=True))
    run_cli(
        "submit", "--suite", "inj", "--gpu-plan", "1", "--backend", backend, cwd=project, env=FAKE, check=True
    )
    retry_until(lambda: states(gs_home, "inj")["only"] in ("succeeded", "failed"), timeout=60)
    a = store(gs_home).attempts("inj/only")[-1]
    assert states(gs_home, "inj")["only"] == "succeeded", (Path(a.dir) / "output.log").read_text()
    seen = json.loads((Path(a.dir) / "seen.json").read_text())
    assert seen == {"config": values, "env": env_value, "matrix": matrix_value}
    assert list(pwn.iterdir()) == []  # nothing executed anywhere
    assert not list(project.glob("*/subst")) and not (project / "subst").exists()


BAD = [
    ({"jobs": [{"name": "two words"}]}, [], "job name"),
    ({"jobs": [{"name": "it's"}]}, [], "job name"),
    ({"jobs": [{"name": "$(touch x)"}]}, [], "job name"),
    ({"jobs": [{"name": "a;b"}]}, [], "job name"),
    ({"jobs": [{"name": "line\nbreak"}]}, [], "job name"),
    ({"jobs": [{"name": "ünï"}]}, [], "job name"),
    ({"jobs": [{"name": "ok"}], "matrix": 5}, [], "matrix"),
    ({"jobs": [{"name": "ok"}], "config": [1, 2]}, [], "config"),
    ({"jobs": [{"name": "ok"}], "tiers": [{"name": "A", "exclusiv": True}]}, [], "exclusiv"),
    ({"matrix": {f"v{i}": list(range(40)) for i in range(5)}}, [], "more than"),
    ({"jobs": [{"name": "ok"}]}, ["--gpus", "0,x\ny"], "--gpus"),
    ({"jobs": [{"name": "ok"}]}, ["--gpu-plan", "²"], "--gpu-plan"),
    ({"jobs": [{"name": "ok"}]}, ["--gpu-plan", "1;rm -rf x"], "--gpu-plan"),
    ({"jobs": [{"name": "ok"}]}, ["--only", "nope*"], "--only"),
    ({"jobs": [{"name": "ok"}], "command": "python y.py --config {config}"}, [], "runs y.py, which is not"),
]


@pytest.mark.parametrize(("doc", "flags", "needle"), BAD, ids=[n + str(i) for i, (_, _, n) in enumerate(BAD)])
def test_bad_input_is_one_line_exit_2_and_nothing_enqueued(
    gs_home: Path, project: Path, doc: dict[str, Any], flags: list[str], needle: str
) -> None:
    full = {"command": "python x.py --config {config}", **doc}
    (project / "x.py").touch()
    (project / "plans" / "bad.yaml").write_text(yaml.safe_dump(full, allow_unicode=True))
    args = ["submit", "--suite", "bad", "--backend", "subprocess", *flags]
    if "--gpu-plan" not in flags:
        args += ["--gpu-plan", "1"]
    r = run_cli(*args, cwd=project, env=FAKE)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert needle in lines[0], lines[0]
    assert not (gs_home / "gpusched.db").exists() or store(gs_home).jobs() == []


def test_wait_brings_back_a_daemon_that_died(gs_home: Path, project: Path) -> None:
    write_plan(project, "orphan", WAIT_FOR_GO, ["a", "b"])
    run_cli(
        "submit",
        "--suite",
        "orphan",
        "--gpu-plan",
        "1",
        "--backend",
        "subprocess",
        cwd=project,
        env=FAKE,
        check=True,
    )
    retry_until(lambda: launches(project) == ["orphan/a"], timeout=30)
    pid = daemon_pid(gs_home)
    os.kill(pid, signal.SIGKILL)
    retry_until(lambda: dead(pid), timeout=10)
    (project / "go").touch()
    w = run_cli("wait", "--suite", "orphan", "--quiet", "--timeout", "60", cwd=project, env=FAKE)
    assert w.returncode == 0, w.stdout + w.stderr
    assert "no daemon was running; started one" in w.stderr
    assert launches(project) == ["orphan/a", "orphan/b"]
