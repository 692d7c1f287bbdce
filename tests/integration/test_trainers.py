"""The example trainers, run as the scheduler runs them: real subprocesses on real configs.

train_glue.py needs torch (its tests skip with a reason without it); demo_job.py must not.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
TRAIN_GLUE = REPO / "launchers" / "train_glue.py"
DEMO_JOB = REPO / "launchers" / "demo_job.py"

# small enough that one step takes milliseconds on a CPU core
TINY_MODEL = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "seq_len": 16, "vocab_size": 128}
TINY = {"model": TINY_MODEL, "train_examples": 256, "eval_examples": 32, "batch_size": 4, "log_every": 1}
STEP_LINE = re.compile(r"^step (\d+)/(\d+) loss (\d+\.\d{4}) micro_batch (\d+) accum (\d+)$", re.M)

needs_torch = pytest.mark.torch


def start_job(script: Path, tmp_path: Path, config: dict[str, Any], name: str) -> subprocess.Popen[str]:
    """Start ``script --config`` like a gpusched attempt: its own attempt dir in the env."""
    cfg_path = tmp_path / f"{name}.yaml"
    cfg_path.write_text(yaml.safe_dump(config))
    attempt = tmp_path / f"attempt-{name}"
    attempt.mkdir()
    env = {**os.environ, "GPUSCHED_ATTEMPT_DIR": str(attempt), "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)  # train_glue.py must find gpusched from a plain checkout
    return subprocess.Popen(
        [sys.executable, str(script), "--config", str(cfg_path)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str]) -> subprocess.CompletedProcess[str]:
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run_job(
    script: Path, tmp_path: Path, config: dict[str, Any], name: str = "config"
) -> subprocess.CompletedProcess[str]:
    return finish(start_job(script, tmp_path, config, name))


def runtime_json(tmp_path: Path, name: str = "config") -> dict[str, Any]:
    return json.loads((tmp_path / f"attempt-{name}" / "runtime.json").read_text())


def steps(stdout: str) -> list[tuple[int, int, str, int, int]]:
    """(step, max_steps, loss, micro_batch, accum) of every progress line."""
    return [(int(s), int(n), loss, int(b), int(g)) for s, n, loss, b, g in STEP_LINE.findall(stdout)]


def load_module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def train_glue() -> ModuleType:
    pytest.importorskip("torch", reason="train_glue.py is a torch trainer")
    return load_module(TRAIN_GLUE)


# --------------------------------------------------------------------------- train_glue


PLAIN = {**TINY, "data": "glue-tvt_mnli", "max_steps": 3, "gradient_accumulation_steps": 2}
LEVERS = {
    **PLAIN,
    "gradient_checkpointing": True,
    "logits_to_keep": 1,
    "num_data_workers": 1,
    "dataloader_prefetch_factor": 1,
}


@pytest.fixture(scope="module")
def plain_and_levers(
    train_glue: ModuleType, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    """The same short run without and with the memory levers, run side by side (torch's
    import dominates their time; two cores can share it)."""
    tmp = tmp_path_factory.mktemp("levers")
    procs = [start_job(TRAIN_GLUE, tmp, cfg, name) for cfg, name in ((PLAIN, "plain"), (LEVERS, "levers"))]
    plain, levers = (finish(p) for p in procs)
    return tmp, plain, levers


@needs_torch
def test_train_glue_trains_and_reports(plain_and_levers: Any) -> None:
    tmp, proc, _ = plain_and_levers
    assert proc.returncode == 0, proc.stderr
    assert [s[0] for s in steps(proc.stdout)] == [1, 2, 3]
    assert all(s[3:] == (4, 2) for s in steps(proc.stdout))
    assert "labels=3" in proc.stdout  # mnli
    assert re.search(r"^done: steps=3 final_loss=\d+\.\d{4} eval_acc=", proc.stdout, re.M)
    report = runtime_json(tmp, "plain")
    assert report["steps_done"] == 3 and "oom" not in report
    assert report["final_loss"] == pytest.approx(float(steps(proc.stdout)[-1][2]), abs=1e-4)


@needs_torch
def test_train_glue_memory_levers_change_memory_not_the_maths(plain_and_levers: Any) -> None:
    _, plain, levers = plain_and_levers
    assert levers.returncode == 0, levers.stderr
    assert "gradient_checkpointing=True logits_to_keep=1 num_data_workers=1" in levers.stdout
    # recomputation and a head on the last token only must give the very same losses
    assert len(steps(levers.stdout)) == 3
    assert steps(plain.stdout) == steps(levers.stdout)


@needs_torch
def test_train_glue_evaluates_in_the_tiers_micro_batch(train_glue: ModuleType, tmp_path: Path) -> None:
    # a tier that shrinks the micro-batch must shrink evaluation too: on a real H200 every tier of
    # benchmarks/gpu_oom_ladder.py trained and then ran out of memory evaluating in batches of 64
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({**TINY, "batch_size": 3, "eval_examples": 10}))
    cfg, _ = train_glue.load_config(str(tmp_path / "c.yaml"))
    trainer = train_glue.Trainer(cfg)
    seen: list[int] = []
    forward = trainer.model.forward
    trainer.model.forward = lambda ids, *a, **k: (seen.append(len(ids)), forward(ids, *a, **k))[1]
    ds = train_glue.synthetic_glue(cfg.data, cfg.seed, cfg.eval_examples, cfg.model, cfg.num_labels, "eval")
    assert 0 <= trainer.evaluate(ds) <= 1
    assert seen == [3, 3, 3, 1]


@needs_torch
def test_train_glue_oom_mid_run_then_requeue_resumes(
    train_glue: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = {**TINY, "output_dir": str(tmp_path / "out"), "save_every": 2, "max_steps": 6}
    tier0 = {**base, "simulate_oom_above_batch": 2, "simulate_oom_after_step": 3}
    first = run_job(TRAIN_GLUE, tmp_path, tier0, name="tier0")
    assert first.returncode == 86, first.stderr
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB." in first.stderr
    assert [s[0] for s in steps(first.stdout)] == [1, 2, 3]
    report = runtime_json(tmp_path, "tier0")
    assert report["oom"] is True and report["steps_done"] == 3
    assert report["oom_message"].startswith("CUDA out of memory. Tried to allocate 2.00 GiB.")
    assert (tmp_path / "out" / "checkpoint-2" / "state.pt").is_file()

    # what the scheduler does next: same effective batch at half the micro-batch, resume on.
    # In-process to save a torch start-up; the resume test below runs its resume as a subprocess.
    monkeypatch.delenv("GPUSCHED_ATTEMPT_DIR", raising=False)
    tier1 = {**tier0, "batch_size": 2, "gradient_accumulation_steps": 2, "is_keep_training": True}
    (tmp_path / "tier1.yaml").write_text(yaml.safe_dump(tier1))
    assert train_glue.main(["--config", str(tmp_path / "tier1.yaml")]) == 0
    stdout = capsys.readouterr().out
    assert f"resumed from {tmp_path / 'out' / 'checkpoint-2'} at step 2" in stdout
    assert [s[0] for s in steps(stdout)] == [3, 4, 5, 6]
    assert all(s[3:] == (2, 2) for s in steps(stdout))
    assert "done: steps=6" in stdout


@needs_torch
def test_train_glue_resumes_from_the_newest_checkpoint(
    train_glue: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "out"
    base = {**TINY, "output_dir": str(out), "save_every": 2}
    # an uninterrupted run to compare with, in the background meanwhile
    reference = start_job(TRAIN_GLUE, tmp_path, {**TINY, "max_steps": 6}, "reference")
    # the first attempt, in-process to save a torch start-up: it only has to leave checkpoints
    monkeypatch.delenv("GPUSCHED_ATTEMPT_DIR", raising=False)
    (tmp_path / "first.yaml").write_text(yaml.safe_dump({**base, "max_steps": 4}))
    assert train_glue.main(["--config", str(tmp_path / "first.yaml")]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-2", "checkpoint-4"]

    second = run_job(TRAIN_GLUE, tmp_path, {**base, "max_steps": 6, "is_keep_training": True}, "second")
    assert second.returncode == 0, second.stderr
    assert f"resumed from {out / 'checkpoint-4'} at step 4" in second.stdout
    assert [(s[0], s[1]) for s in steps(second.stdout)] == [(5, 6), (6, 6)]
    assert "done: steps=6" in second.stdout
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-4", "checkpoint-6"]  # latest 2 kept
    # model, optimizer and data position all came back: the losses are the uninterrupted ones
    ref = finish(reference)
    assert ref.returncode == 0, ref.stderr
    resumed_losses = [float(s[2]) for s in steps(second.stdout)]
    assert resumed_losses == pytest.approx([float(s[2]) for s in steps(ref.stdout)[4:]], abs=2e-4)

    # a checkpoint from another seed is refused with the reason, not silently mixed in
    (tmp_path / "other.yaml").write_text(yaml.safe_dump({**base, "seed": 1, "is_keep_training": True}))
    assert train_glue.main(["--config", str(tmp_path / "other.yaml")]) == 2
    assert "does not match" in capsys.readouterr().err


@needs_torch
def test_train_glue_rejects_a_bad_config_with_the_key(
    train_glue: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(yaml.safe_dump({**TINY, "batch_size": 0}))
    assert train_glue.main(["--config", str(cfg)]) == 2
    assert f"{cfg}: batch_size must be >= 1" in capsys.readouterr().err
    cfg.write_text(yaml.safe_dump({**TINY, "gradient_checkpointing": "maybe"}))
    assert train_glue.main(["--config", str(cfg)]) == 2
    assert "gradient_checkpointing: 'maybe' is not valid" in capsys.readouterr().err


@needs_torch
def test_train_glue_parses_every_key_it_declares(train_glue: ModuleType, tmp_path: Path) -> None:
    """A key added to TrainConfig/ModelConfig must be readable from YAML, as YAML writes it."""
    samples = {"int": 3, "int | None": 3, "float": 0.5, "float | None": 0.5, "bool": True, "str": "x"}
    samples |= {"str | None": "x", "str | bool | None": "x"}

    def values(cls: type) -> dict[str, Any]:
        return {f.name: samples[str(f.type)] for f in dataclasses.fields(cls) if f.name != "model"}

    raw = {**values(train_glue.TrainConfig), "precision": "bf16", "model": values(train_glue.ModelConfig)}
    raw["model"] |= {"hidden_size": 64, "num_heads": 2, "seq_len": 16, "vocab_size": 128}
    (tmp_path / "all.yaml").write_text(yaml.safe_dump(raw))
    cfg, ignored = train_glue.load_config(str(tmp_path / "all.yaml"))
    assert ignored == []
    assert dataclasses.asdict(cfg) == raw


@needs_torch
def test_gla_chunked_matches_the_recurrence(train_glue: ModuleType) -> None:
    import torch

    g = torch.Generator().manual_seed(0)
    b, h, t, dk, dv = 2, 3, 37, 5, 7  # t not a multiple of the chunk: padding is exercised
    q, k = torch.randn(b, h, t, dk, generator=g), torch.randn(b, h, t, dk, generator=g)
    v = torch.randn(b, h, t, dv, generator=g)
    log_a = torch.nn.functional.logsigmoid(torch.randn(b, h, t, dk, generator=g))
    state, expected = torch.zeros(b, h, dk, dv), []
    for i in range(t):  # S_t = diag(a_t) S_{t-1} + k_t^T v_t ; o_t = q_t S_t
        state = log_a[:, :, i, :, None].exp() * state + k[:, :, i, :, None] * v[:, :, i, None, :]
        expected.append((q[:, :, i, None, :] @ state).squeeze(-2))
    torch.testing.assert_close(train_glue.gla_chunked(q, k, v, log_a), torch.stack(expected, dim=2))


@needs_torch
def test_resumed_sampler_continues_the_same_data_stream(train_glue: ModuleType) -> None:
    def take(sampler: Any, n: int) -> list[int]:
        it = iter(sampler)
        return [next(it) for _ in range(n)]

    n, seed = 10, 87
    full = take(train_glue.ResumableSampler(n, seed), 35)  # three and a half epochs
    assert sorted(full[:10]) == list(range(10)) and full[:10] != full[10:20]
    for start in (0, 4, 10, 23):
        assert take(train_glue.ResumableSampler(n, seed, start), 35 - start) == full[start:]


# --------------------------------------------------------------------------- demo_job

DEMO = {"step_time_s": 0.01, "batch_size": 4, "max_steps": 6}
OOM_LINE = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total "
    "capacity of 24.00 GiB of which 180.00 MiB is free. Including non-PyTorch memory, this process "
    "has 23.80 GiB memory in use."
)


def test_demo_job_runs_checkpoints_and_reports(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = run_job(DEMO_JOB, tmp_path, {**DEMO, "gradient_accumulation_steps": 2, "output_dir": str(out)})
    assert proc.returncode == 0, proc.stderr
    assert [s[0] for s in steps(proc.stdout)] == [1, 2, 3, 4, 5, 6]
    assert all(s[3:] == (4, 2) for s in steps(proc.stdout))
    assert proc.stdout.rstrip().endswith("done: steps=6 effective_batch=8")
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-5.json", "checkpoint-6.json"]
    assert runtime_json(tmp_path) == {"peak_mib": 2048 + 300 * 4 + 1024, "steps_done": 6}


def test_demo_job_ooms_after_two_steps_when_it_does_not_fit(tmp_path: Path) -> None:
    proc = run_job(DEMO_JOB, tmp_path, {**DEMO, "batch_size": 80})  # 27072 MiB > 24576
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == OOM_LINE
    assert [s[0] for s in steps(proc.stdout)] == [1, 2]
    assert "done:" not in proc.stdout
    assert runtime_json(tmp_path) == {"steps_done": 2}  # no peak claimed: it never measured one


@pytest.mark.parametrize(
    ("levers", "peak_mib", "fits"),
    [
        ({}, 27072, False),
        ({"gradient_checkpointing": True}, 2048 + 12000 + 1024, True),
        ({"batch_size": 40}, 2048 + 12000 + 1024, True),
        ({"logits_to_keep": 1, "fake_gpu_mib": 26112}, 2048 + 24000, True),
        ({"fake_gpu_mib": 81920}, 27072, True),  # an 80 GB card
    ],
)
def test_demo_job_memory_model(tmp_path: Path, levers: dict[str, Any], peak_mib: int, fits: bool) -> None:
    proc = run_job(DEMO_JOB, tmp_path, {**DEMO, "batch_size": 80, "max_steps": 3, **levers})
    assert f"peak_mib={peak_mib} " in proc.stdout
    assert (proc.returncode == 0) is fits, proc.stderr
    assert (OOM_LINE in proc.stderr) is not fits


def test_demo_job_resumes_from_the_newest_checkpoint(tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = run_job(DEMO_JOB, tmp_path, {**DEMO, "max_steps": 7, "output_dir": str(out)}, name="first")
    assert first.returncode == 0, first.stderr
    cfg = {**DEMO, "max_steps": 12, "output_dir": str(out), "is_keep_training": True}
    second = run_job(DEMO_JOB, tmp_path, cfg, name="second")
    assert second.returncode == 0, second.stderr
    assert f"resumed from {out / 'checkpoint-7.json'} at step 7" in second.stdout
    assert [s[0] for s in steps(second.stdout)] == [8, 9, 10, 11, 12]
    # the loss curve continues where it left off: same numbers as an uninterrupted run
    whole = run_job(DEMO_JOB, tmp_path, {**DEMO, "max_steps": 12}, name="whole")
    losses = [(s[0], s[2]) for s in steps(first.stdout) + steps(second.stdout)]
    assert losses == [(s[0], s[2]) for s in steps(whole.stdout)]


def test_demo_job_fail_with_is_a_plain_error_after_one_step(tmp_path: Path) -> None:
    proc = run_job(DEMO_JOB, tmp_path, {**DEMO, "fail_with": "ValueError: label 7 out of range"})
    assert proc.returncode == 1
    assert proc.stderr.strip() == "ValueError: label 7 out of range"
    assert [s[0] for s in steps(proc.stdout)] == [1]


def test_demo_job_does_not_import_torch(tmp_path: Path) -> None:
    code = (
        "import runpy, sys\n"
        f"sys.argv = ['demo_job.py', '--config', {str(tmp_path / 'c.yaml')!r}]\n"
        "try:\n"
        f"    runpy.run_path({str(DEMO_JOB)!r}, run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0, e.code\n"
        "print('torch' in sys.modules)\n"
    )
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({**DEMO, "max_steps": 1}))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "False"
