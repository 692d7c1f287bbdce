"""The reason gpusched exists, end to end on CPU: a real torch trainer dies of a genuine
``torch.OutOfMemoryError`` and gpusched walks it down the tier ladder A -> B -> C, keeping the
effective batch and resuming from its checkpoint, while a job with a plain error is not retried.

There is no GPU here, so launchers/train_glue.py raises the real ``torch.OutOfMemoryError``
itself when its micro-batch is above ``simulate_oom_above_batch``: it stands in for the CUDA
allocator. Everything else is real: tmux/processes, the wrapper, exit.json, the daemon.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.conftest import run_cli

pytest.importorskip("torch")

PLAN = """
command: python launchers/train_glue.py --config {config}
workdir: ..
base_config: launchers/configs/gla_lora_base.yaml
config:
  model.hidden_size: 32
  model.num_layers: 1
  model.num_heads: 2
  model.seq_len: 16
  model.vocab_size: 128
  model.lora_rank: 2
  precision: fp32
  batch_size: 8
  gradient_accumulation_steps: 1
  num_data_workers: 0
  max_steps: 6
  save_every: 2
  log_every: 1
  simulate_oom_above_batch: 4     # stands in for a 24 GB card: micro-batch 8 does not fit
  simulate_oom_after_step: 2      # ... and it only shows after a checkpoint at step 2
jobs:
  - name: qnli
    config: {data: glue-tvt_qnli, seed: 87, output_dir: outputs/qnli}
  - name: typo
    config: {data: glue-tvt_sst2, seed: 87, output_dir: outputs/typo, learning_rate: "fast"}
resume: {flag_key: is_keep_training}
"""


def test_oom_requeues_down_the_ladder_and_resumes(gs_home: Path, project: Path) -> None:
    (project / "plans" / "ladder.yaml").write_text(textwrap.dedent(PLAN))
    run_cli(
        "submit", "--suite", "ladder", "--gpu-plan", "2", "--backend", "subprocess", cwd=project, check=True
    )
    w = run_cli("wait", "--suite", "ladder", "--timeout", "240", "--quiet", cwd=project, timeout=300)
    assert "1 succeeded, 1 failed" in w.stdout, w.stdout + w.stderr
    doc = json.loads(run_cli("status", "--json", cwd=project, check=True).stdout)
    jobs = {j["id"]: j for j in doc["jobs"]}

    qnli = jobs["ladder/qnli"]
    assert (qnli["state"], qnli["tier"], qnli["attempt"]) == ("succeeded", "C", 3)
    logs = project / "logs" / "ladder" / "qnli"
    attempts = sorted(p.name for p in logs.iterdir())
    assert attempts == ["1-A", "2-B", "3-C"]
    for a in ("1-A", "2-B"):
        assert "torch.OutOfMemoryError" in (logs / a / "output.log").read_text()
        assert json.loads((logs / a / "exit.json").read_text())["exit_code"] == 86  # gpusched.runtime's code
    cfg_c = (logs / "3-C" / "config.yaml").read_text()
    assert "batch_size: 4" in cfg_c and "gradient_accumulation_steps: 2" in cfg_c  # effective batch 8 kept
    assert "gradient_checkpointing: true" in cfg_c and "is_keep_training: true" in cfg_c
    out_c = (logs / "3-C" / "output.log").read_text()
    assert "resumed from" in out_c and "at step 2" in out_c
    assert "done: steps=6" in out_c

    typo = jobs["ladder/typo"]
    assert (typo["state"], typo["attempt"], typo["outcome"]) == ("failed", 1, "error")
