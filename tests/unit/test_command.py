"""The script a suite's command runs (gpusched.command): what submit checks is there, and what
the daemon waits for when a checkout or a rename took it away."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusched import plan
from gpusched.command import missing_program, missing_script, program_of, script_of
from gpusched.errors import PlanError


@pytest.mark.parametrize(
    ("command", "script"),
    [
        ("python launchers/train_glue.py --config {config}", "launchers/train_glue.py"),
        ("python3.11 -u -X dev -W ignore train.py --config {config}", "train.py"),
        ("/opt/conda/envs/gla/bin/python /abs/train.py --config {config}", "/abs/train.py"),
        ("CUDA_LAUNCH_BLOCKING=1 exec nohup python 'my dir/train.py' {config}", "my dir/train.py"),
        ("torchrun --nproc_per_node 1 --master_port 29501 train.py --config {config}", "train.py"),
        ("accelerate launch --config_file acc.yaml run_glue.py --config {config}", "run_glue.py"),
        ("deepspeed --num_gpus 1 train.py --deepspeed ds.json --config {config}", "train.py"),
        # no plain script: nothing is checked
        ("python -m trainer.main --config {config}", None),
        ("python -c 'import x' {config}", None),
        ("sh -c 'python train.py' {config}", None),
        ("cd sub && python train.py --config {config}", None),
        ("python $SCRIPT --config {config}", None),
        ("python {attempt_dir}/train.py --config {config}", None),
        ("python ~/train.py --config {config}", None),
        ("python train --config {config}", None),
        ("./run.sh {config}", None),
        ("python 'open quote {config}", None),
        ("", None),
    ],
)
def test_the_script_a_command_plainly_runs(command: str, script: str | None) -> None:
    assert script_of(command) == script


def test_a_script_is_missing_until_it_is_a_file(tmp_path: Path) -> None:
    cmd = "python launchers/train.py --config {config}"
    assert missing_script(cmd, str(tmp_path)) == "launchers/train.py"
    (tmp_path / "launchers" / "train.py").mkdir(parents=True)  # a folder of that name is no script
    assert missing_script(cmd, str(tmp_path)) == "launchers/train.py"
    (tmp_path / "launchers" / "train.py").rmdir()
    (tmp_path / "launchers" / "train.py").write_text("")
    assert missing_script(cmd, str(tmp_path)) is None
    assert missing_script("python -m x {config}", str(tmp_path)) is None


def test_submit_refuses_a_plan_whose_script_is_not_there_and_names_the_nearest(tmp_path: Path) -> None:
    """A typo in the script's path failed every job the moment it started: one line, and nothing queued."""
    (tmp_path / "plans").mkdir()
    (tmp_path / "launchers").mkdir()
    (tmp_path / "launchers" / "train_glue.py").write_text("")
    (tmp_path / "plans" / "E1.yaml").write_text(
        "command: python launchers/train_gleu.py --config {config}\njobs: [{name: a}]\n"
    )
    with pytest.raises(PlanError) as e:
        plan.load_suite("E1", cwd=tmp_path)
    assert str(e.value) == (
        "plans/E1.yaml: command: runs launchers/train_gleu.py, which is not a file in"
        f" {tmp_path} (the workdir) (did you mean 'launchers/train_glue.py'?);"
        " fix the path, or the workdir it is relative to"
    )
    (tmp_path / "plans" / "E1.yaml").write_text(
        "command: python /nowhere/train.py {config}\njobs: [{name: a}]\n"
    )
    with pytest.raises(
        PlanError, match=r"command: runs /nowhere/train.py, which is not a file; fix the path"
    ):
        plan.load_suite("E1", cwd=tmp_path)


@given(st.text(max_size=80))
def test_any_command_text_gives_a_script_or_none_and_never_raises(command: str) -> None:
    script = script_of(command)
    assert script is None or (script.endswith(".py") and not any(ch in script for ch in "${}~"))


@pytest.mark.parametrize(
    ("command", "program"),
    [
        ("torchrun --nproc_per_node 2 train.py {config}", "torchrun"),
        ("OMP_NUM_THREADS=4 nohup python3 train.py {config}", "python3"),
        ("./run.sh {config}", "./run.sh"),
        ("/opt/conda/envs/gla/bin/python train.py {config}", "/opt/conda/envs/gla/bin/python"),
        ("cd sub && python t.py {config}", None),
        ("source venv/bin/activate && python t.py {config}", None),
        ("if true; then python t.py {config}; fi", None),
        ("$PYTHON train.py {config}", None),
        ("(cd sub; python t.py {config})", None),
        ("{{ python t.py; }} {config}", None),
        ("env -i python t.py {config}", None),
    ],
)
def test_the_program_a_command_starts(command: str, program: str | None) -> None:
    assert program_of(command) == program


def test_a_program_that_would_not_run_is_named(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text("#!/bin/sh\n")
    (bin_dir / "torchrun").chmod(0o755)
    path = str(bin_dir)
    assert missing_program("torchrun train.py {config}", str(tmp_path), path) is None
    assert missing_program("accelerate launch t.py {config}", str(tmp_path), path) == (
        "runs accelerate, which is not on PATH"
    )
    (tmp_path / "run.sh").write_text("#!/bin/sh\n")
    assert missing_program("./run.sh {config}", str(tmp_path), path) == (
        "runs ./run.sh, which is not executable (chmod +x ./run.sh)"
    )
    (tmp_path / "run.sh").chmod(0o755)
    assert missing_program("./run.sh {config}", str(tmp_path), path) is None
    assert missing_program("./gone.sh {config}", str(tmp_path), path) == "runs ./gone.sh, which is not a file"
    assert missing_program("cd x && nothing-here {config}", str(tmp_path), path) is None  # not read


def test_submit_refuses_a_program_the_jobs_would_not_find(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`torchrun` from a shell whose environment is not activated: every job failed at once
    with `torchrun: not found`. One line, exit 2, nothing queued."""
    from gpusched import cli

    (tmp_path / "plans").mkdir()
    (tmp_path / "train.py").write_text("")
    (tmp_path / "plans" / "E1.yaml").write_text(
        "command: torchrun train.py --config {config}\njobs: [{name: a}]\n"
    )
    monkeypatch.setenv("GPUSCHED_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["submit", "--suite", "E1", "--gpu-plan", "1", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "gpusched: plans/E1.yaml: command: runs torchrun, which is not on PATH (the jobs get"
        " this shell's environment, and every one would fail at once); activate the environment that has it"
        " before you submit, or write the program's full path"
    )
    assert not (tmp_path / "home" / "gpusched.db").exists()
