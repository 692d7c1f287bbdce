"""The same plan on a real Slurm cluster (scripts/slurm-ci.sh up): one sbatch job per attempt,
an OOM at tier A requeued as a NEW sbatch job at tier B, a plain error not retried, a
cancel reaching scancel, and CUDA_VISIBLE_DEVICES coming from Slurm's GRES."""

from __future__ import annotations

import json
import re
import shutil
import textwrap
from pathlib import Path

import pytest

from gpusched.errors import GpuschedError
from gpusched.store import Store
from tests.conftest import run_cli
from tests.helpers import retry_until

pytestmark = pytest.mark.slurm


def _cluster_problem() -> str | None:
    if not shutil.which("sbatch"):
        return "sbatch not on PATH"
    from gpusched.executors.slurm import check_available

    try:
        check_available()
    except GpuschedError as e:
        return str(e)
    return None


_problem = _cluster_problem()
if _problem:
    pytest.skip(f"no Slurm cluster up: run scripts/slurm-ci.sh up ({_problem})", allow_module_level=True)

PLAN = """
command: echo "CVD=$CUDA_VISIBLE_DEVICES" && python launchers/demo_job.py --config {config}
workdir: ..
base_config: launchers/configs/demo_base.yaml
config: {max_steps: 4, step_time_s: 0.05, fake_gpu_mib: 12288, batch_size: 8, logits_to_keep: 0}
jobs:
  - name: big
    config: {batch_size: 40, output_dir: outputs/big}      # 2048 + 12000 + 1024 > 12288: OOM at A
  - name: broken
    config: {fail_with: "KeyError: 'label'", output_dir: outputs/broken}
  - name: slow
    config: {step_time_s: 30, output_dir: outputs/slow}
tiers:
  - name: A
  - name: B
    batch: {scale: 0.5}
"""


def status(project: Path) -> dict:  # type: ignore[type-arg]
    return {
        j["id"]: j for j in json.loads(run_cli("status", "--json", cwd=project, check=True).stdout)["jobs"]
    }


def test_suite_on_slurm_oom_requeue_error_cancel(gs_home: Path, project: Path) -> None:
    (project / "plans" / "sl.yaml").write_text(textwrap.dedent(PLAN))
    run_cli("submit", "--suite", "sl", "--backend", "slurm", "--max-queued", "50", cwd=project, check=True)
    retry_until(lambda: status(project)["sl/slow"]["state"] == "running", timeout=60)
    # submitted again during the night without its flags: still on Slurm, its --max-queued kept
    again = json.loads(run_cli("submit", "--suite", "sl", "--json", cwd=project, check=True).stdout)
    assert (again["backend"], again["queued"]) == ("slurm", [])
    store = Store(gs_home / "gpusched.db", readonly=True)
    row = store.suite("sl")
    store.close()
    assert row is not None and row.options["max_queued"] == 50
    slow = retry_until(
        lambda: (
            (status(project)["sl/slow"]["slurm"] or {}).get("state") == "RUNNING"
            and status(project)["sl/slow"]
        ),
        timeout=60,
    )
    assert slow["slurm"]["job_id"] and slow["slurm"]["node"]
    assert all(j["attempt"] >= 1 for j in status(project).values())  # Slurm places them, all at once
    att = run_cli("attach", "sl/slow", cwd=project)
    assert att.returncode == 2 and "srun --jobid" in att.stderr
    retry_until(
        lambda: (
            (project / "logs/sl/slow/1-A/output.log").exists()
            and "step" in (project / "logs/sl/slow/1-A/output.log").read_text()
        ),
        timeout=60,
    )
    run_cli("cancel", "sl/slow", cwd=project, check=True)
    w = run_cli("wait", "--suite", "sl", "--timeout", "150", "--quiet", cwd=project, timeout=200)
    assert w.returncode == 1, w.stdout + w.stderr
    jobs = status(project)
    assert {k: v["state"] for k, v in jobs.items()} == {
        "sl/big": "succeeded",
        "sl/broken": "failed",
        "sl/slow": "cancelled",
    }
    big = jobs["sl/big"]
    assert (big["tier"], big["attempt"]) == ("B", 2)
    logs = project / "logs" / "sl" / "big"
    ids = [
        (logs / a / "sbatch.sh").exists() and next((logs / a).glob("slurm-*.out")).name
        for a in ("1-A", "2-B")
    ]
    assert ids[0] != ids[1]  # tier B ran as a new sbatch job
    assert "CUDA out of memory" in (logs / "1-A" / "output.log").read_text()
    out_b = (logs / "2-B" / "output.log").read_text()
    assert re.search(r"^CVD=[0-3]$", out_b, re.M), out_b  # set by Slurm's GRES, not by gpusched
    assert jobs["sl/broken"]["attempt"] == 1 and "KeyError" in (jobs["sl/broken"]["reason"] or "")
    assert jobs["sl/big"]["backend_handle"]["slurm_job_id"]
