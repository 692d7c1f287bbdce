"""The script a suite's command runs (gpusched.command): what submit checks is there, and what
the daemon waits for when a checkout or a rename took it away."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusched import plan
from gpusched.command import missing_script, script_of
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
