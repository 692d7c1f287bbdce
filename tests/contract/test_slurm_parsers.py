"""The Slurm backend's pure parts, everywhere (no cluster needed): the sbatch script against a
golden file, and the parsers against output recorded from a real Slurm 22.05 cluster
(``tests/data/slurm/record.sh`` says how). Then the executor's bookkeeping (refresh, purge,
controller down) driven by the same recordings through a fake ``proc.run``.

Recorded jobs: 1 ok (gpu:1, comment gpusched:tok-ok), 2 exit 1, 3 exit 3, 4 torch OOM line +
exit 1, 5 kill -9 itself, 6 long (cancelled while running), 7 gpu:4 (pending, cancelled),
8 array 0-1 (task 0 is raw id 10, task 1 keeps 8 and exits 3), 9 output path with a space."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gpusched.errors import ExecutorError
from gpusched.executors import LaunchRequest
from gpusched.executors import slurm as sl

DATA = Path(__file__).resolve().parent.parent / "data" / "slurm"
GOLDEN = DATA / "sbatch_golden.sh"


def fixture(name: str) -> str:
    return (DATA / name).read_text()


def answer(name: str) -> tuple[str, int]:
    """A recorded error answer: (text, rc) from a file ending in ``rc=N``."""
    text, _, rc = fixture(name).rpartition("rc=")
    return text, int(rc)


def request(**kw: object) -> LaunchRequest:
    base: dict[str, object] = dict(
        job_id="E1/87-glue-tvt_qnli",
        suite="E1",
        job_name="87-glue-tvt_qnli",
        token="t0k3n-87",
        attempt_dir=Path("/shared/logs/E1/87-glue-tvt_qnli/1-A"),
        workdir=Path("/shared/project"),
        env={"GPUSCHED_JOB_ID": "E1/87-glue-tvt_qnli", "GPUSCHED_WAKE": "/home/u/.local/state/gpusched/wake"},
    )
    base.update(kw)
    return LaunchRequest(**base)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- builder


def golden_script() -> str:
    return sl.build_sbatch_script(
        request(env={"GPUSCHED_JOB_ID": "E1/87-glue-tvt_qnli", "NOTE": "it's got spaces & $dollars"}),
        wrapper=Path("/opt/gpusched/wrap.sh"),
        gres="gpu:1",
        partition="gpu",
        extra_args=["--mem=16G", "--qos", "high"],
        time_limit="02:00:00",
    )


def test_sbatch_script_matches_golden_file() -> None:
    text = golden_script()
    if os.environ.get("GPUSCHED_REGEN_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), "run with GPUSCHED_REGEN_GOLDEN=1 to accept a deliberate change"


@pytest.mark.skipif(shutil.which("sh") is None, reason="no sh")
def test_sbatch_script_is_valid_sh_and_exports_env_verbatim(tmp_path: Path) -> None:
    text = golden_script().replace("exec sh ", "echo ")  # run the env part, not the wrapper
    script = tmp_path / "s.sh"
    script.write_text(text + 'printf "%s|%s\\n" "$NOTE" "$GPUSCHED_TOKEN"\n')
    out = subprocess.run(["sh", str(script)], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == [
        "/opt/gpusched/wrap.sh /shared/logs/E1/87-glue-tvt_qnli/1-A file",
        "it's got spaces & $dollars|t0k3n-87",
    ]


def test_sbatch_script_options() -> None:
    text = sl.build_sbatch_script(
        request(job_name="a b/c:d", attempt_dir=Path("/x/with space/1-A")), gres=None, extra_args=["--gpus=1"]
    )
    lines = text.splitlines()
    assert "#SBATCH --job-name=gpusched-E1-a_b_c_d" in lines
    assert '#SBATCH --output="/x/with space/1-A/slurm-%j.out"' in lines  # quotes keep the #SBATCH line whole
    assert "#SBATCH --open-mode=append" in lines
    assert "#SBATCH --comment=gpusched:t0k3n-87" in lines
    assert not any("--gres" in ln or "--partition" in ln or "--time" in ln for ln in lines)
    assert "#SBATCH --gpus=1" in lines
    assert "CUDA_VISIBLE_DEVICES" not in text  # Slurm's GRES allocation sets it
    assert lines[-1].startswith("exec sh ") and lines[-1].endswith(" '/x/with space/1-A' file")


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"attempt_dir": Path("/logs/100%/1-A")}, "cannot take a path"),
        ({"workdir": Path('/a"b')}, "cannot take a path"),
        ({"env": {"CUDA_VISIBLE_DEVICES": "0"}}, "CUDA_VISIBLE_DEVICES"),
        ({"env": {"NOT-A-NAME": "1"}}, "NOT-A-NAME"),
    ],
)
def test_sbatch_script_refuses_what_it_cannot_write(kw: dict[str, object], message: str) -> None:
    with pytest.raises(ExecutorError, match=message):
        sl.build_sbatch_script(request(**kw))


def test_sbatch_extra_arg_values_join_their_option() -> None:
    text = sl.build_sbatch_script(request(), extra_args=["--mem", "16G", "--constraint=a100"])
    assert "#SBATCH --mem 16G" in text.splitlines()
    assert text.index("--no-requeue") < text.index("--mem 16G")  # extras come last: they win


def test_parse_sbatch_parsable() -> None:
    assert sl.parse_sbatch_parsable("42\n") == "42"
    assert sl.parse_sbatch_parsable("42;cluster\n") == "42"
    with pytest.raises(ValueError):
        sl.parse_sbatch_parsable("sbatch: error: Batch job submission failed\n")


# --------------------------------------------------------------------------- parsers


def test_scontrol_show_job_finished_jobs() -> None:
    jobs = sl.parse_scontrol_show_job(fixture("scontrol_show_job_done.txt"))
    assert set(jobs) == {str(i) for i in range(1, 11)}
    got = {j: (i.state, i.exit_code, i.signal, i.reason) for j, i in jobs.items()}
    assert got["1"] == ("COMPLETED", 0, 0, None)
    assert got["2"] == ("FAILED", 1, 0, "NonZeroExitCode")
    assert got["3"] == ("FAILED", 3, 0, "NonZeroExitCode")
    assert got["4"] == ("FAILED", 1, 0, "NonZeroExitCode")  # OOM is only in the log text
    assert got["5"] == ("FAILED", 0, 9, "JobLaunchFailure")  # killed by signal 9
    assert got["6"] == ("CANCELLED", 0, 15, None)
    assert got["7"] == ("CANCELLED", 0, 0, "Resources")  # cancelled while pending
    assert got["8"] == ("FAILED", 3, 0, "NonZeroExitCode")  # array task 1 keeps the array id
    assert got["10"][:2] == ("COMPLETED", 0)  # array task 0 got its own raw id
    assert jobs["1"].node == "vm" and jobs["7"].node is None
    assert jobs["1"].restarts == 0
    assert jobs["9"].stdout is not None and jobs["9"].stdout.endswith("/dir with space/s-9.out")
    assert all(i.terminal for i in jobs.values())


def test_scontrol_show_job_live_jobs() -> None:
    jobs = sl.parse_scontrol_show_job(fixture("scontrol_show_job_live.txt"))
    assert jobs["1"].state == "RUNNING" and not jobs["1"].terminal
    assert (jobs["7"].state, jobs["7"].reason, jobs["7"].node) == ("PENDING", "Resources", None)
    assert (jobs["9"].state, jobs["9"].reason) == ("PENDING", "Priority")


def test_scontrol_show_job_multiline_reads_like_one_line() -> None:
    multi = sl.parse_scontrol_show_job(fixture("scontrol_show_job_multiline.txt"))
    one = sl.parse_scontrol_show_job(fixture("scontrol_show_job_live.txt"))
    assert multi == {"6": one["6"]}


def test_key_values_keep_spaces_inside_values() -> None:
    line = next(ln for ln in fixture("scontrol_show_job_done.txt").splitlines() if ln.startswith("JobId=9 "))
    kv = sl.parse_key_values(line)
    assert kv["JobName"] == "name with space"
    assert kv["TRES"] == "cpu=1,mem=256M,node=1,billing=1"
    assert kv["AllocNode:Sid"].startswith("localhost:")


def test_squeue_all() -> None:
    live = sl.parse_squeue_all(fixture("squeue_all_live.txt"))
    done = sl.parse_squeue_all(fixture("squeue_all_done.txt"))
    assert set(live) == set(done) == {str(i) for i in range(1, 11)}  # keyed by raw id (%A)
    assert (live["7"].state, live["7"].reason, live["7"].node) == ("PENDING", "Resources", None)
    assert (live["1"].state, live["1"].node) == ("RUNNING", "vm")
    assert done["5"].state == "FAILED" and done["10"].state == "COMPLETED"
    assert all(i.exit_code is None for i in done.values())  # squeue -o has no exit code


def test_jobcomp_last_line_wins() -> None:
    text = fixture("jobcomp.txt")
    jobs = sl.parse_jobcomp(text)
    assert (jobs["2"].state, jobs["2"].exit_code) == ("FAILED", 1)
    assert (jobs["5"].exit_code, jobs["5"].signal) == (0, 9)
    assert (jobs["6"].state, jobs["6"].exit_code, jobs["6"].signal) == ("CANCELLED", 0, 0)  # 0:0, not 0:15
    assert jobs["7"].node is None
    # a requeued job writes a line per run, the first with JobState=PENDING: the last one wins
    line2 = next(ln for ln in text.splitlines() if ln.startswith("JobId=2 "))
    requeued = line2.replace("JobState=FAILED", "JobState=PENDING") + "\n" + text
    assert sl.parse_jobcomp(requeued)["2"].state == "FAILED"
    assert (
        sl.parse_jobcomp(text + line2.replace("JobState=FAILED", "JobState=PENDING"))["2"].state == "PENDING"
    )


def test_sacct() -> None:
    jobs = sl.parse_sacct(fixture("sacct.txt"))
    assert set(jobs) == {str(i) for i in range(1, 11)}
    assert (jobs["3"].state, jobs["3"].exit_code, jobs["3"].signal) == ("FAILED", 3, 0)
    assert (jobs["6"].state, jobs["6"].node) == ("CANCELLED", "vm")  # "CANCELLED by 0"
    assert jobs["7"].node is None  # "None assigned"
    assert sl.parse_sacct(fixture("sacct_steps.txt")) == jobs  # step rows (6.batch) are skipped


def test_sacct_without_accounting_is_an_error_not_data() -> None:
    text, rc = answer("sacct_disabled.txt")
    assert rc == 1 and "accounting storage is disabled" in text
    assert sl.parse_sacct(text) == {}


def test_purged_answers() -> None:
    for name in ("scontrol_purged.txt", "squeue_purged_one.txt"):
        text, rc = answer(name)
        assert rc == 1 and sl.is_purged(text)
    text, rc = answer("squeue_purged_many.txt")  # several ids: the purged ones are just left out
    assert rc == 0 and sl.parse_squeue_all(text) == {}
    text, rc = answer("squeue_ctld_down.txt")
    assert rc == 1 and not sl.is_purged(text)  # a controller that does not answer forgot nothing


def test_ping() -> None:
    assert sl.ping_is_up(answer("scontrol_ping_up.txt")[0])
    assert not sl.ping_is_up(answer("scontrol_ping_down.txt")[0])


def test_comments_map_tokens_to_jobs() -> None:
    assert sl.parse_comments(fixture("squeue_comments.txt")) == {
        "tok-ok": "1",
        "tok-long": "6",
        "tok-pend": "7",
    }


def test_show_config() -> None:
    conf = sl.parse_show_config(fixture("scontrol_show_config.txt"))
    assert conf["JobCompType"] == "jobcomp/filetxt"
    assert conf["AccountingStorageType"] == "accounting_storage/none"
    assert conf["MinJobAge"] == "3600 sec"


# --------------------------------------------------------------------------- executor logic


class FakeSlurm:
    """Replays recorded answers for the commands the executor runs; records the calls."""

    def __init__(self, answers: dict[str, tuple[str, int]]) -> None:
        self.answers = answers
        self.calls: list[list[str]] = []

    def __call__(self, cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(cmd))
        key = " ".join(cmd[:3])
        text, rc = self.answers[key]
        out, err = (text, "") if rc == 0 else ("", text)
        return subprocess.CompletedProcess(cmd, rc, out, err)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeSlurm:
    f = FakeSlurm({})
    monkeypatch.setattr(sl.proc, "run", f)
    return f


def executor(now: list[float]) -> sl.SlurmExecutor:
    return sl.SlurmExecutor(None, max_age_s=1.0, clock=lambda: now[0])


def handles(*ids: int) -> list[dict[str, str]]:
    return [{"slurm_job_id": str(i)} for i in ids]


def test_one_squeue_answers_every_alive_call_of_a_tick(fake: FakeSlurm) -> None:
    now = [100.0]
    ex = executor(now)
    fake.answers["squeue -h -t"] = (fixture("squeue_all_live.txt"), 0)
    assert ex.refresh(handles(1, 2, 7, 9)) is True
    assert [ex.alive(h) for h in handles(1, 2, 7, 9)] == [True] * 4
    assert len(fake.calls) == 1 and fake.calls[0][5] == "1,2,7,9"
    info = ex.info(handles(7)[0])
    assert info is not None and (info.state, info.reason) == ("PENDING", "Resources")
    assert len(fake.calls) == 1  # still fresh
    now[0] += 2  # next tick: the first alive() asks again, for all of them at once
    fake.answers["squeue -h -t"] = (fixture("squeue_all_done.txt"), 0)
    assert ex.alive(handles(1)[0]) is False
    assert [ex.alive(h) for h in handles(2, 7, 9)] == [False] * 3
    assert len(fake.calls) == 2
    now[0] += 2  # ended jobs are never asked about again
    assert ex.refresh() is True and len(fake.calls) == 2


def test_finished_job_details_come_from_scontrol(fake: FakeSlurm) -> None:
    ex = executor([0.0])
    fake.answers["squeue -h -t"] = (fixture("squeue_all_done.txt"), 0)
    line = next(ln for ln in fixture("scontrol_show_job_done.txt").splitlines() if ln.startswith("JobId=5 "))
    fake.answers["scontrol show job"] = (line + "\n", 0)
    info = ex.info(handles(5)[0])
    assert info is not None and (info.state, info.exit_code, info.signal, info.source) == (
        "FAILED",
        0,
        9,
        "scontrol",
    )
    assert ex.info(handles(5)[0]) == info and len(fake.calls) == 2  # looked up once


def test_purged_job_is_not_alive_and_falls_back_to_jobcomp(fake: FakeSlurm, tmp_path: Path) -> None:
    ex = executor([0.0])
    fake.answers["squeue -h -t"] = answer("squeue_purged_one.txt")
    fake.answers["scontrol show job"] = answer("scontrol_purged.txt")
    jobcomp = tmp_path / "jobcomp.txt"
    jobcomp.write_text(fixture("jobcomp.txt"))
    conf = fixture("scontrol_show_config.txt").replace("/tmp/slurm-ci/jobcomp.txt", str(jobcomp))
    fake.answers["scontrol show config"] = (conf, 0)
    assert ex.alive(handles(2)[0]) is False  # "Invalid job id specified": purged, not an error
    assert ex.last_error is None
    info = ex.info(handles(2)[0])
    assert info is not None and (info.state, info.exit_code, info.source) == ("FAILED", 1, "jobcomp")
    assert not any(c[0] == "sacct" for c in fake.calls)  # accounting_storage/none: sacct not tried


def test_purged_job_falls_back_to_sacct_where_accounting_exists(fake: FakeSlurm) -> None:
    ex = executor([0.0])
    fake.answers["squeue -h -t"] = answer("squeue_purged_many.txt")
    fake.answers["scontrol show job"] = answer("scontrol_purged.txt")
    conf = fixture("scontrol_show_config.txt").replace(
        "accounting_storage/none", "accounting_storage/slurmdbd"
    )
    fake.answers["scontrol show config"] = (conf.replace("jobcomp/filetxt", "jobcomp/none"), 0)
    fake.answers["sacct -X -n"] = (fixture("sacct.txt"), 0)
    assert [ex.alive(h) for h in handles(3, 6)] == [False, False]
    info = ex.info(handles(6)[0])
    assert info is not None and (info.state, info.source) == ("CANCELLED", "sacct")


def test_controller_down_never_reads_as_gone(fake: FakeSlurm) -> None:
    now = [0.0]
    ex = executor(now)
    fake.answers["squeue -h -t"] = answer("squeue_ctld_down.txt")
    assert ex.alive(handles(1)[0]) is True  # never answered: assume it lives
    assert ex.last_error is not None and "Unable to contact" in ex.last_error
    fake.answers["squeue -h -t"] = (fixture("squeue_all_live.txt"), 0)
    now[0] += 2
    assert ex.alive(handles(1)[0]) is True
    fake.answers["squeue -h -t"] = answer("squeue_ctld_down.txt")
    now[0] += 2
    assert ex.refresh() is False
    assert ex.alive(handles(1)[0]) is True  # the last answer stands
    assert ex.info(handles(1)[0]) is not None


def test_handles_of_other_backends_are_not_alive(fake: FakeSlurm) -> None:
    ex = executor([0.0])
    assert ex.alive({"pid": 123, "pid_started_at": 1.0}) is False
    assert ex.info({"pid": 123}) is None
    assert fake.calls == []


def test_check_available_without_sbatch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(
        ExecutorError, match="sbatch not found on PATH: install slurm-client or load the Slurm module"
    ):
        sl.check_available()


def test_check_available_with_controller_down(monkeypatch: pytest.MonkeyPatch, fake: FakeSlurm) -> None:
    monkeypatch.setattr(sl.shutil, "which", lambda name: f"/usr/bin/{name}")
    fake.answers["scontrol ping"] = answer("scontrol_ping_down.txt")
    with pytest.raises(ExecutorError, match=r"controller does not answer .*is DOWN"):
        sl.check_available()
    fake.answers["scontrol ping"] = answer("scontrol_ping_up.txt")
    sl.check_available()


def test_jobcomp_fallback_reads_only_the_end_of_a_big_log(
    fake: FakeSlurm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = fixture("jobcomp.txt").splitlines(keepends=True)  # job 6 first, job 9 last
    jobcomp = tmp_path / "jobcomp.txt"
    jobcomp.write_text("".join(lines))
    monkeypatch.setattr(sl, "JOBCOMP_TAIL_BYTES", len(lines[-1]) + 10)  # the last line and a bit
    fake.answers["squeue -h -t"] = answer("squeue_purged_many.txt")
    fake.answers["scontrol show job"] = answer("scontrol_purged.txt")
    conf = fixture("scontrol_show_config.txt").replace("/tmp/slurm-ci/jobcomp.txt", str(jobcomp))
    fake.answers["scontrol show config"] = (conf, 0)
    ex = executor([0.0])
    assert ex.info(handles(6)[0]) is None  # beyond the tail: unknown, not a half-parsed line
    info = ex.info(handles(9)[0])
    assert info is not None and info.state == "COMPLETED"
