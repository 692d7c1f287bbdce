"""Real-GPU check of the OOM ladder: a small E1 suite on a real CUDA card, each job capped to
a 24 GiB "card" with torch.cuda.set_per_process_memory_fraction (train_glue's
``gpu_memory_gib``), sized so tier A truly runs out of memory. Every job must end
``succeeded`` at a tier below A, each OOM a genuine CUDA allocator error.

    python benchmarks/gpu_oom_ladder.py [--jobs 4] [--card-gib 24] [--gpu-plan 2] [--steps 20]

Needs a machine with an NVIDIA GPU, torch with CUDA, and this project installed
(``pip install -e .``). Uses a private GPUSCHED_HOME; never touches your queue. On a machine
without a GPU: one line, exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PLAN = """
command: {python} {root}/launchers/train_glue.py --config {{config}}
workdir: {work}
base_config: {root}/launchers/configs/gla_lora_base.yaml
config:
  gpu_memory_gib: {card_gib}
  model.hidden_size: 2048
  model.num_layers: 12
  model.num_heads: 16
  model.seq_len: 2048
  model.vocab_size: 32000
  model.lora_rank: 16
  batch_size: 32           # tier A: logits over every position of 32 x 2048 tokens -> OOM at 24 GiB
  gradient_accumulation_steps: 1
  num_data_workers: 2
  precision: bf16
  max_steps: {steps}
  save_every: {every}
  log_every: {every}
matrix:
  seed: {seeds}
  task: [glue-tvt_qnli, glue-tvt_sst2]
job:
  name: "{{seed}}-{{task}}"
  task: "{{task}}"
  config: {{seed: "{{seed}}", data: "{{task}}", output_dir: "outputs/{{task}}/seed{{seed}}"}}
resume: {{flag_key: is_keep_training}}
"""


def cli(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpusched", *args],
        env=env,
        cwd=cwd,
        text=True,
        capture_output=True,
        timeout=3600,
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=4, help="jobs (2 tasks x jobs/2 seeds)")
    ap.add_argument("--card-gib", type=float, default=24.0)
    ap.add_argument("--gpu-plan", default="2")
    ap.add_argument("--steps", type=int, default=20, help="optimizer steps a job runs")
    ap.add_argument("--timeout", type=float, default=1800)
    args = ap.parse_args()
    if args.steps < 1:
        ap.error(f"--steps {args.steps}: a job must run at least 1 optimizer step")  # one line, exit 2
    work = Path(tempfile.mkdtemp(prefix="gpusched-oom-ladder-"))
    (work / "plans").mkdir()
    seeds = list(range(87, 87 + max(1, args.jobs // 2)))
    (work / "plans" / "ladder.yaml").write_text(
        textwrap.dedent(
            PLAN.format(
                python=sys.executable,
                root=ROOT,
                work=work,
                steps=args.steps,
                every=min(5, args.steps),
                card_gib=args.card_gib,
                seeds=seeds,
            )
        )
    )
    env = {**os.environ, "GPUSCHED_HOME": str(work / "home")}
    env.pop("GPUSCHED_FAKE_GPUS", None)
    probe = json.loads(cli("gpus", "--json", env=env, cwd=work).stdout)
    if not probe["gpus"]:
        print(f"gpu_oom_ladder: no GPU to test on ({probe['notice']})")
        shutil.rmtree(work)
        return 2
    t0 = time.time()
    r = cli(
        "submit",
        "--suite",
        "ladder",
        "--gpu-plan",
        args.gpu_plan,
        "--backend",
        "subprocess",
        env=env,
        cwd=work,
    )
    print(r.stdout + r.stderr)
    if r.returncode:
        return r.returncode
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `timeout` too leaves no job behind
    try:
        w = cli("wait", "--suite", "ladder", "--timeout", str(args.timeout), "--quiet", env=env, cwd=work)
        doc = json.loads(cli("status", "--json", env=env, cwd=work).stdout)
    finally:  # jobs still running would hold the card: cancel them, then stop the daemon
        cli("cancel", "--suite", "ladder", env=env, cwd=work)
        cli("daemon", "stop", env=env, cwd=work)
    print(f"{'job':28} {'state':10} {'tier':4} {'attempts':8} outcomes (peak MiB)")
    ok = True
    for j in doc["jobs"]:
        job_dir = work / "logs" / "ladder" / j["name"]
        attempts = sorted(job_dir.iterdir()) if job_dir.is_dir() else []  # never started: none
        outcomes = []
        for a in attempts:
            exit_doc = json.loads((a / "exit.json").read_text()) if (a / "exit.json").exists() else {}
            rt = json.loads((a / "runtime.json").read_text()) if (a / "runtime.json").exists() else {}
            outcomes.append(f"{a.name}:{exit_doc.get('exit_code')}({rt.get('peak_mib', '?')})")
        print(f"{j['id']:28} {j['state']:10} {j['tier']:4} {j['attempt']:<8} {' '.join(outcomes)}")
        ok &= j["state"] == "succeeded" and j["tier"] != "A"
    print(f"gpus: {json.dumps(doc['gpus'])}")
    print(
        f"wall {time.time() - t0:.0f} s; wait exit {w.returncode}; "
        f"{'PASS: every job succeeded below tier A' if ok else 'FAIL'}; logs in {work}/logs"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
