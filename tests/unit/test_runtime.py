"""gpusched.runtime: the in-job helper (report merging, the OOM guard, no torch at import)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpusched import model, runtime

REPO = Path(__file__).resolve().parents[2]


def _python(code: str, attempt_dir: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop(runtime.ATTEMPT_DIR_ENV, None)
    if attempt_dir is not None:
        env[runtime.ATTEMPT_DIR_ENV] = str(attempt_dir)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _runtime_json(d: Path) -> dict:
    return json.loads((d / "runtime.json").read_text())


@pytest.fixture
def attempt_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(runtime.ATTEMPT_DIR_ENV, str(tmp_path))
    return tmp_path


def test_oom_exit_code_is_the_models() -> None:
    assert runtime.OOM_EXIT_CODE == model.OOM_EXIT_CODE == 86


def test_import_does_not_import_torch() -> None:
    proc = _python(
        """
        import sys
        import gpusched.runtime as rt
        rt.report(steps_done=1)  # also without an attempt dir: must stay torch-free
        print(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


# --------------------------------------------------------------------------- report


def test_report_without_attempt_dir_is_a_noop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(runtime.ATTEMPT_DIR_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    assert runtime.report(steps_done=3, loss=0.5) is None
    assert list(tmp_path.iterdir()) == []


def test_report_merges_into_runtime_json(attempt_dir: Path) -> None:
    runtime.report(steps_done=3, loss=0.7)
    runtime.report(eval_acc=0.9)  # no steps_done: the previous one stays
    written = runtime.report(steps_done=5)
    assert _runtime_json(attempt_dir) == written == {"steps_done": 5, "loss": 0.7, "eval_acc": 0.9}
    assert sorted(p.name for p in attempt_dir.iterdir()) == ["runtime.json"]  # no temp files left


def test_report_replaces_an_unreadable_file(attempt_dir: Path) -> None:
    (attempt_dir / "runtime.json").write_text("{not json")
    runtime.report(steps_done=1)
    assert _runtime_json(attempt_dir) == {"steps_done": 1}


def test_report_never_raises_on_a_missing_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(runtime.ATTEMPT_DIR_ENV, str(tmp_path / "gone"))
    assert runtime.report(steps_done=1) is None
    assert "could not write" in capsys.readouterr().err


def test_report_never_raises_on_unserialisable_values(
    attempt_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runtime.report(steps_done=1)
    assert runtime.report(bad=object()) is None
    assert "could not write" in capsys.readouterr().err
    assert _runtime_json(attempt_dir) == {"steps_done": 1}  # the old report is intact
    assert sorted(p.name for p in attempt_dir.iterdir()) == ["runtime.json"]


def _fake_torch(reserved_bytes: int, initialized: bool = True) -> SimpleNamespace:
    """Only what report() asks of torch.cuda; a real CUDA peak cannot be had on CPU CI."""
    cuda = SimpleNamespace(
        is_available=lambda: True,
        is_initialized=lambda: initialized,
        max_memory_reserved=lambda: reserved_bytes,
    )
    return SimpleNamespace(cuda=cuda)


def test_report_peak_is_mib_rounded_up_and_never_goes_down(
    attempt_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(3 * 2**30 + 1))
    runtime.report(steps_done=1)
    assert _runtime_json(attempt_dir)["peak_mib"] == 3 * 1024 + 1
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(2**30))  # e.g. after reset_peak_memory_stats
    runtime.report(steps_done=2)
    assert _runtime_json(attempt_dir) == {"peak_mib": 3 * 1024 + 1, "steps_done": 2}


def test_report_leaves_peak_out_before_cuda_is_initialised(
    attempt_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(2**30, initialized=False))
    runtime.report(steps_done=1)
    assert _runtime_json(attempt_dir) == {"steps_done": 1}


# --------------------------------------------------------------------------- guard


@pytest.mark.parametrize(
    "exc_type",
    [
        pytest.param("torch.OutOfMemoryError", marks=pytest.mark.torch),
        pytest.param("torch.cuda.OutOfMemoryError", marks=pytest.mark.torch),
        "RuntimeError",  # e.g. "CUDA error: out of memory" from outside the caching allocator
    ],
)
def test_guard_turns_cuda_oom_into_exit_86(tmp_path: Path, exc_type: str) -> None:
    if exc_type.startswith("torch"):
        pytest.importorskip("torch")
    message = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has 28.25 MiB free."
    if exc_type == "RuntimeError":
        message = "CUDA error: out of memory"
    proc = _python(
        f"""
        {"import torch" if exc_type.startswith("torch") else ""}
        from gpusched import runtime
        runtime.report(steps_done=7)
        def train_step():
            raise {exc_type}({message!r})
        with runtime.guard():
            train_step()
        print("not reached")
        """,
        attempt_dir=tmp_path,
    )
    assert proc.returncode == runtime.OOM_EXIT_CODE, proc.stderr
    assert "not reached" not in proc.stdout
    assert "Traceback (most recent call last)" in proc.stderr
    assert "in train_step" in proc.stderr  # the trainer's own frames are shown
    assert message in proc.stderr
    report = _runtime_json(tmp_path)
    assert report["oom"] is True
    assert report["steps_done"] == 7  # kept from the last report
    assert report["oom_message"] == message


def test_run_returns_what_main_returns() -> None:
    assert runtime.run(lambda a, b: a + b, 1, b=2) == 3


@pytest.mark.torch
def test_run_exits_86_on_oom(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    proc = _python(
        """
        import torch
        from gpusched import runtime
        def main():
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB.")
        runtime.run(main)
        """,
        attempt_dir=tmp_path,
    )
    assert proc.returncode == 86, proc.stderr
    assert "torch.OutOfMemoryError: CUDA out of memory" in proc.stderr
    assert _runtime_json(tmp_path)["oom"] is True


@pytest.mark.parametrize(
    "exc",
    [
        ValueError("bad label"),
        RuntimeError("expected scalar type Float but found Half"),
        # host RAM, not GPU memory: a different outcome, must not look like a GPU OOM
        RuntimeError("DefaultCPUAllocator: not enough memory: you tried to allocate 8589934592 bytes."),
        MemoryError(),
    ],
)
def test_guard_lets_other_exceptions_through_unchanged(attempt_dir: Path, exc: BaseException) -> None:
    with pytest.raises(type(exc)) as caught, runtime.guard():
        raise exc
    assert caught.value is exc
    assert not (attempt_dir / "runtime.json").exists()


def test_guard_lets_system_exit_through(attempt_dir: Path) -> None:
    with pytest.raises(SystemExit) as caught, runtime.guard():
        sys.exit(3)
    assert caught.value.code == 3


@pytest.mark.torch
def test_is_cuda_oom_recognises_torch_types_without_the_text() -> None:
    torch = pytest.importorskip("torch")
    assert runtime.is_cuda_oom(torch.OutOfMemoryError("allocator said no"))
    assert runtime.is_cuda_oom(torch.cuda.OutOfMemoryError("allocator said no"))
    assert runtime.is_cuda_oom(RuntimeError("CUDA error: Out Of Memory"))
    assert not runtime.is_cuda_oom(ValueError("out of memory"))  # not an error torch raises
