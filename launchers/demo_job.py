"""A torch-free stand-in trainer for the CPU demo and tests: behaves like a fine-tuning job
(progress lines, checkpoints, resume, a CUDA OOM when its memory does not fit) without
torch or a GPU, in about max_steps * step_time_s seconds.

    python launchers/demo_job.py --config CONFIG.yaml

Memory model. The job pretends its GPU peak is

    peak_mib = 2048                                          # weights, optimizer, CUDA context
             + 300 * batch_size * (0.5 if gradient_checkpointing else 1.0)   # activations
             + (0 if logits_to_keep == 1 else 1024)           # logits of every position

and that its card holds ``fake_gpu_mib`` (default 24576, a 24 GB card). When the peak does
not fit, it runs 2 steps, prints the line torch prints on CUDA OOM to stderr, and exits 1
(like a trainer that does not use gpusched.runtime). So with the defaults, batch_size 80
OOMs (27072 MiB) while batch_size 40, or gradient checkpointing, fits.

Config keys: batch_size (default 8), gradient_accumulation_steps (1), gradient_checkpointing
(false), logits_to_keep (0), num_data_workers (0, shown only), max_steps (20), step_time_s
(0.5; x1.08 with gradient checkpointing, which recomputes), seed (0), data, output_dir,
fake_gpu_mib (24576), is_keep_training (false), fail_with (a message: print it to stderr and
exit 1 after 1 step). Unknown keys are ignored.

Output: ``step i/N loss x micro_batch b accum g`` per step, ``output_dir/checkpoint-<step>.json``
every 5 steps (and at the end; the newest two kept), ``done: steps=N effective_batch=B``.
With ``$GPUSCHED_ATTEMPT_DIR`` set it keeps ``runtime.json`` there up to date with
``{"peak_mib", "steps_done"}`` (``steps_done`` only, when it is about to OOM: it never
measured a peak).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

OOM_LINE = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total "
    "capacity of 24.00 GiB of which 180.00 MiB is free. Including non-PyTorch memory, this process "
    "has 23.80 GiB memory in use."
)
OOM_AFTER_STEPS = 2
SAVE_EVERY = 5
KEEP_CHECKPOINTS = 2


def peak_mib(cfg: Mapping[str, Any]) -> int:
    """The memory model of the module docstring."""
    activations = 300 * int(cfg.get("batch_size", 8)) * (0.5 if _flag(cfg, "gradient_checkpointing") else 1.0)
    logits = 0 if int(cfg.get("logits_to_keep", 0)) == 1 else 1024
    return int(2048 + activations + logits)


def _flag(cfg: Mapping[str, Any], key: str) -> bool:
    # YAML gives a bool; a shell-made override may give the string "true"
    return str(cfg.get(key, False)).strip().lower() in {"true", "1", "yes", "on"}


def loss_at(step: int, seed: int) -> float:
    """A plausible, deterministic loss curve that depends on nothing but (step, seed), so a
    resumed run, even one with a larger max_steps, continues the very same numbers."""
    noise = random.Random(seed * 100_003 + step).uniform(-0.03, 0.03)
    return 0.25 + 0.45 * math.exp(-step / 8.0) + noise


def write_json_atomic(path: Path, data: Mapping[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, sort_keys=True) + "\n")
    os.replace(tmp, path)


def report(**values: Any) -> None:
    """Merge ``values`` into $GPUSCHED_ATTEMPT_DIR/runtime.json (the file gpusched.runtime writes)."""
    attempt_dir = os.environ.get("GPUSCHED_ATTEMPT_DIR")
    if not attempt_dir:
        return
    path = Path(attempt_dir) / "runtime.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    write_json_atomic(path, {**(data if isinstance(data, dict) else {}), **values})


def checkpoints(output_dir: Path) -> list[tuple[int, Path]]:
    """(step, file) of every checkpoint, oldest first."""
    found = []
    for f in output_dir.glob("checkpoint-*.json"):
        step = f.stem.removeprefix("checkpoint-")
        if step.isdigit():
            found.append((int(step), f))
    return sorted(found)


def save_checkpoint(output_dir: Path, step: int, loss: float) -> None:
    output_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(output_dir / f"checkpoint-{step}.json", {"step": step, "loss": loss})
    for _, old in checkpoints(output_dir)[:-KEEP_CHECKPOINTS]:
        old.unlink(missing_ok=True)


def resume_step(cfg: Mapping[str, Any], output_dir: Path | None) -> int:
    if not _flag(cfg, "is_keep_training") or output_dir is None:
        return 0
    found = checkpoints(output_dir)
    if not found:
        print(f"demo_job: no checkpoint in {output_dir}; starting at step 0", flush=True)
        return 0
    step, path = found[-1]
    print(f"resumed from {path} at step {step}", flush=True)
    return step


def run(cfg: Mapping[str, Any]) -> int:
    batch = int(cfg.get("batch_size", 8))
    accum = int(cfg.get("gradient_accumulation_steps", 1))
    max_steps = int(cfg.get("max_steps", 20))
    seed = int(cfg.get("seed", 0))
    step_time_s = float(cfg.get("step_time_s", 0.5)) * (1.08 if _flag(cfg, "gradient_checkpointing") else 1.0)
    output_dir = Path(cfg["output_dir"]) if cfg.get("output_dir") else None
    peak, card = peak_mib(cfg), int(cfg.get("fake_gpu_mib", 24576))
    fits = peak <= card
    print(
        f"demo_job: data={cfg.get('data')} seed={seed} micro_batch={batch} accum={accum} "
        f"workers={cfg.get('num_data_workers', 0)} peak_mib={peak} fake_gpu_mib={card}",
        flush=True,
    )
    step = start = resume_step(cfg, output_dir)
    while step < max_steps:
        time.sleep(step_time_s)  # the job's own "work", not a wait on anything
        step += 1
        loss = loss_at(step, seed)
        print(f"step {step}/{max_steps} loss {loss:.4f} micro_batch {batch} accum {accum}", flush=True)
        report(steps_done=step, **({"peak_mib": peak} if fits else {}))
        if cfg.get("fail_with"):  # a plain error, after one step
            print(str(cfg["fail_with"]), file=sys.stderr, flush=True)
            return 1
        if not fits and step - start >= OOM_AFTER_STEPS:
            print(OOM_LINE, file=sys.stderr, flush=True)
            return 1
        if output_dir is not None and (step % SAVE_EVERY == 0 or step == max_steps):
            save_checkpoint(output_dir, step, loss)
    print(f"done: steps={step} effective_batch={batch * accum}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="YAML config (see the module docstring)")
    args = parser.parse_args(argv)
    try:
        with open(args.config) as f:
            cfg = yaml.safe_load(f) or {}
        if not isinstance(cfg, Mapping):
            raise ValueError("top level must be a mapping")
        return run(cfg)
    except (OSError, ValueError, TypeError, yaml.YAMLError) as exc:
        print(f"demo_job: error: {args.config}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
