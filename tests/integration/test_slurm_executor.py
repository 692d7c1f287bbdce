"""SlurmExecutor against a real Slurm cluster (``scripts/slurm-ci.sh up``: one node, 4 fake
GPUs as GRES). Each attempt is a real sbatch job running the real wrapper; results are read
from the attempt's exit.json, as the daemon does. Skips, saying why, when no cluster is up."""

from __future__ import annotations

import re
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
from msgspec.structs import replace

from gpusched.attempt import AttemptPaths
from gpusched.errors import ExecutorError
from gpusched.executors import Handle, LaunchRequest
from gpusched.executors import slurm as sl
from tests.helpers import retry_until

try:
    sl.check_available(timeout_s=15)
except ExecutorError as e:
    pytest.skip(f"no Slurm cluster up: run scripts/slurm-ci.sh up ({e})", allow_module_level=True)

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(180)]

OOM_LINE = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB"


def attempt(tmp_path: Path, name: str, body: str) -> LaunchRequest:
    """An attempt dir holding ``launch.sh`` (what the materializer would write)."""
    d = tmp_path / "logs" / "T" / name / "1-A"
    d.mkdir(parents=True)
    (d / "launch.sh").write_text(f"#!/bin/sh\n{body}\n")
    return LaunchRequest(
        job_id=f"T/{name}",
        suite="T",
        job_name=name,
        token=f"{name}-{uuid.uuid4().hex[:8]}",
        attempt_dir=d,
        workdir=tmp_path,
        env={"GPUSCHED_JOB_ID": f"T/{name}"},
    )


def wait_state(ex: sl.SlurmExecutor, h: Handle, *states: str, timeout: float = 60) -> sl.SlurmJobInfo:
    def reached() -> sl.SlurmJobInfo | None:
        info = ex.info(h)
        return info if info is not None and info.state in states else None

    info = retry_until(reached, timeout=timeout, interval=0.25)
    assert info is not None
    return info


def test_exit_codes_gres_and_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")  # the daemon's own must not reach the job
    ex = sl.SlurmExecutor(None)
    reqs = {
        "ok": attempt(tmp_path, "ok", 'echo "CVD=$CUDA_VISIBLE_DEVICES token=$GPUSCHED_TOKEN pwd=$(pwd)"'),
        "three": attempt(tmp_path, "three", "echo about to fail; exit 3"),
        "oom": attempt(tmp_path, "oom", f'echo step 1; echo "{OOM_LINE}" >&2; exit 1'),
    }
    handles = {k: ex.launch(r) for k, r in reqs.items()}
    assert all(re.fullmatch(r"\d+", h["slurm_job_id"]) for h in handles.values())
    assert len({h["slurm_job_id"] for h in handles.values()}) == 3
    paths = {k: AttemptPaths(r.attempt_dir) for k, r in reqs.items()}
    assert retry_until(lambda: all(p.read_exit() for p in paths.values()), timeout=60, interval=0.25)

    exits = {k: p.read_exit() for k, p in paths.items()}
    assert {k: e.exit_code if e else None for k, e in exits.items()} == {"ok": 0, "three": 3, "oom": 1}
    out = paths["ok"].output.read_text()
    m = re.search(r"CVD=(\S*) token=(\S+) pwd=(\S+)", out)
    assert m, out
    assert re.fullmatch(r"[0-3]", m.group(1)), f"CUDA_VISIBLE_DEVICES={m.group(1)!r}: not from Slurm's GRES"
    assert m.group(2) == reqs["ok"].token and m.group(3) == str(tmp_path)
    assert OOM_LINE in paths["oom"].output.read_text()  # stderr lands in output.log
    for k, r in reqs.items():
        jid = handles[k]["slurm_job_id"]
        assert (r.attempt_dir / "sbatch.sh").is_file()
        assert (r.attempt_dir / f"slurm-{jid}.out").is_file()  # Slurm's own output, in the attempt dir

    # the wrapper exits right after writing exit.json: Slurm sees the end soon
    retry_until(lambda: not any(ex.alive(h) for h in handles.values()), timeout=30, interval=0.25)
    # the wrapper exits with the job's status, so Slurm (sacct) reports what the job did
    want = {"ok": ("COMPLETED", 0), "three": ("FAILED", 3), "oom": ("FAILED", 1)}
    got = {k: ex.info(h) for k, h in handles.items()}
    assert {k: (i.state, i.exit_code) if i else None for k, i in got.items()} == want
    assert all(i is not None and i.node for i in got.values())


def test_alive_terminate_and_cancelled_state(tmp_path: Path) -> None:
    ex = sl.SlurmExecutor(None)
    req = attempt(tmp_path, "long", "echo started; sleep 300")
    h = ex.launch(req)
    assert ex.alive(h)
    wait_state(ex, h, "RUNNING")
    paths = AttemptPaths(req.attempt_dir)
    assert retry_until(lambda: "started" in paths.log_tail(), timeout=30, interval=0.25)
    assert ex.alive(h)
    assert ex.attach_hint(h) == f"srun --jobid {h['slurm_job_id']} --overlap --pty bash"
    # the hint works: a step can join the running allocation (--overlap exists in 22.05)
    r = subprocess.run(
        ["srun", "--jobid", h["slurm_job_id"], "--overlap", "hostname"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr

    ex.terminate(h)
    assert retry_until(lambda: not ex.alive(h), timeout=30, interval=0.25)
    info = wait_state(ex, h, "CANCELLED")
    assert info.terminal
    # Slurm sent SIGTERM: the wrapper still wrote the attempt's exit record
    assert retry_until(lambda: paths.read_exit(), timeout=15, interval=0.25)
    rec = paths.read_exit()
    assert rec is not None and (rec.signal == 15 or rec.exit_code == 143), rec
    ex.terminate(h)  # idempotent on an ended job
    ex.terminate(h, force=True)
    assert ex.attach_hint(h, log_path=paths.output) == f"tail -f {paths.output}"


def test_pending_job_is_alive_discoverable_and_cancellable(tmp_path: Path) -> None:
    ex = sl.SlurmExecutor(None, sbatch_args=["--hold"])  # held: stays PENDING until cancelled
    req = attempt(tmp_path, "held", "echo never runs")
    h = ex.launch(req)
    info = wait_state(ex, h, "PENDING")
    assert info.reason == "JobHeldUser" and info.node is None
    assert ex.alive(h)
    found = ex.discover()
    assert found.get(req.token) == h  # the comment carries the token: a restarted daemon re-adopts it
    ex.terminate(h, force=True)
    info = wait_state(ex, h, "CANCELLED")
    assert not ex.alive(h)
    assert not AttemptPaths(req.attempt_dir).exit.exists()  # never ran: the daemon decides (lost/cancel)


def test_requeue_is_a_new_job_with_its_own_dir(tmp_path: Path) -> None:
    ex = sl.SlurmExecutor(None)
    first = attempt(tmp_path, "again", f'echo "{OOM_LINE}"; exit 1')
    h1 = ex.launch(first)
    second_dir = first.attempt_dir.parent / "2-B"
    second_dir.mkdir()
    (second_dir / "launch.sh").write_text("#!/bin/sh\necho smaller batch; exit 0\n")
    h2 = ex.launch(replace(first, attempt_dir=second_dir, token=first.token + "-2"))
    assert h1 != h2
    p1, p2 = AttemptPaths(first.attempt_dir), AttemptPaths(second_dir)
    assert retry_until(lambda: p1.read_exit() and p2.read_exit(), timeout=60, interval=0.25)
    assert (p1.read_exit().exit_code, p2.read_exit().exit_code) == (1, 0)  # type: ignore[union-attr]


def test_unknown_job_reads_as_purged(tmp_path: Path) -> None:
    ex = sl.SlurmExecutor(None)
    h = {"slurm_job_id": "987654"}  # Slurm answers "Invalid job id specified", as after MinJobAge
    assert ex.alive(h) is False
    assert ex.last_error is None
    assert ex.info(h) is None  # not in scontrol, sacct or the jobcomp log


def test_sbatch_refusal_is_one_clear_error(tmp_path: Path) -> None:
    ex = sl.SlurmExecutor(None, gres="gpu:5")  # the node has 4
    with pytest.raises(ExecutorError, match=r"sbatch for T/big failed: .*Requested node configuration"):
        ex.launch(attempt(tmp_path, "big", "exit 0"))


def test_missing_sbatch_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert shutil.which("sbatch") is None
    with pytest.raises(ExecutorError, match=r"^sbatch not found on PATH"):
        sl.SlurmExecutor(None).launch(attempt(tmp_path, "nosbatch", "exit 0"))


def _min_job_age_s() -> int:
    r = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30)
    return int(sl.parse_show_config(r.stdout).get("MinJobAge", "300 sec").split()[0])


def test_really_purged_job(tmp_path: Path) -> None:
    """After MinJobAge Slurm forgets a job: not alive, the result is exit.json, and info()
    still finds the job in the jobcomp log. Needs a short MinJobAge to be quick."""
    age = _min_job_age_s()
    if age > 30:
        pytest.skip(f"MinJobAge={age}s: run `SLURM_CI_MINJOBAGE=10 scripts/slurm-ci.sh up` for this test")
    ex = sl.SlurmExecutor(None)
    req = attempt(tmp_path, "purged", "exit 4")
    h = ex.launch(req)
    assert retry_until(lambda: AttemptPaths(req.attempt_dir).read_exit(), timeout=60, interval=0.25)
    assert retry_until(lambda: not ex.alive(h), timeout=30, interval=0.25)

    def purged() -> bool:
        r = subprocess.run(["scontrol", "show", "job", h["slurm_job_id"]], capture_output=True, text=True)
        return r.returncode == 1 and sl.is_purged(r.stderr)

    assert retry_until(purged, timeout=age + 60, interval=1)
    ex2 = sl.SlurmExecutor(None)  # a restarted daemon: nothing cached
    assert ex2.alive(h) is False and ex2.last_error is None
    info = ex2.info(h)
    assert info is not None and (info.state, info.exit_code, info.source) == ("FAILED", 4, "jobcomp")
    assert AttemptPaths(req.attempt_dir).read_exit().exit_code == 4  # type: ignore[union-attr]
