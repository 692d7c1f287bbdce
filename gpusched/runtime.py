"""Optional in-job helper for torch trainers: a distinct exit code for GPU OOM, and a report.

Use it inside the training script that gpusched launches::

    from gpusched import runtime

    def main() -> None:
        for step in range(start, max_steps):
            ...
            runtime.report(steps_done=step + 1)

    if __name__ == "__main__":
        runtime.run(main)          # or: with runtime.guard(): main()

What a caller can rely on:

- Importing this module never imports torch. Only objects from an already-imported torch
  are looked at, so a torch-free job may call :func:`report` without paying for torch.
- :func:`report` merges its keywords into ``$GPUSCHED_ATTEMPT_DIR/runtime.json`` with an
  atomic replace (the scheduler never reads half a file). Without that variable (the job
  runs outside gpusched) it does nothing. It never raises because of the file: a report
  must not kill a training run.
- :func:`guard` turns an uncaught CUDA out-of-memory error into a printed traceback, a
  ``runtime.json`` with ``"oom": true``, and exit code :data:`OOM_EXIT_CODE` (86), so the
  scheduler classifies the exit as OOM without relying on log text. Every other exception
  passes through unchanged.

The file written is read back by :meth:`gpusched.attempt.AttemptPaths.read_runtime`.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from gpusched.model import OOM_EXIT_CODE

__all__ = ["ATTEMPT_DIR_ENV", "OOM_EXIT_CODE", "guard", "is_cuda_oom", "report", "run"]

#: Set by gpusched in every job's environment: the attempt directory of this launch.
ATTEMPT_DIR_ENV = "GPUSCHED_ATTEMPT_DIR"
RUNTIME_FILE = "runtime.json"  # the name gpusched.attempt.AttemptPaths.runtime spells
_MIB = 1024 * 1024

T = TypeVar("T")


def report(*, steps_done: int | None = None, **extra: Any) -> dict[str, Any] | None:
    """Merge ``steps_done`` (when given) and ``extra`` into ``runtime.json``; return what was written.

    ``peak_mib`` is added when torch is in use and CUDA is initialised: the largest of
    ``torch.cuda.max_memory_reserved()`` (current device, in MiB, rounded up) and any
    ``peak_mib`` already in the file, so the figure never goes down within an attempt.
    Values in ``extra`` must be JSON-serialisable. Returns None, writing nothing, when
    ``$GPUSCHED_ATTEMPT_DIR`` is unset or the file cannot be written (a warning goes to
    stderr in the latter case).
    """
    path = _runtime_path()
    if path is None:
        return None
    data = _read(path)
    if steps_done is not None:
        data["steps_done"] = int(steps_done)
    data.update(extra)
    peak = _cuda_peak_mib()
    if peak is not None:
        data["peak_mib"] = max(peak, _as_int(data.get("peak_mib")) or 0)
    try:
        _write_atomic(path, data)
    except (OSError, TypeError, ValueError) as exc:
        print(f"[gpusched] runtime.report: could not write {path}: {exc}", file=sys.stderr)
        return None
    return data


@contextmanager
def guard() -> Iterator[None]:
    """Exit with :data:`OOM_EXIT_CODE` when the body dies of a CUDA out-of-memory error.

    On OOM: the traceback is printed to stderr (the job's log keeps the usual
    ``torch.OutOfMemoryError: CUDA out of memory...`` line), ``runtime.json`` gets
    ``oom: true``, ``oom_message`` (first line of the error), ``peak_mib`` when known, and
    keeps the last ``steps_done`` reported, then ``SystemExit(OOM_EXIT_CODE)`` is raised.
    Any other exception, and ``SystemExit``/``KeyboardInterrupt``, propagate unchanged.
    """
    try:
        yield
    except Exception as exc:
        if not is_cuda_oom(exc):
            raise
        traceback.print_exception(exc, file=sys.stderr)
        first_line = (str(exc).strip().splitlines() or [""])[0]
        report(oom=True, oom_message=first_line[:500])
        # "[gpusched]" lines are skipped when the scheduler looks for a job's last line,
        # so the torch message above stays the one it shows.
        print(f"[gpusched] CUDA out of memory: exiting with code {OOM_EXIT_CODE}", file=sys.stderr)
        sys.stderr.flush()
        sys.exit(OOM_EXIT_CODE)


def run(main: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call ``main(*args, **kwargs)`` under :func:`guard` and return its result."""
    with guard():
        return main(*args, **kwargs)


def is_cuda_oom(exc: BaseException) -> bool:
    """True for ``torch.OutOfMemoryError`` / ``torch.cuda.OutOfMemoryError`` and for a
    ``RuntimeError`` whose message says "out of memory" (e.g. ``CUDA error: out of memory``
    raised outside the caching allocator). Host-RAM failures ("DefaultCPUAllocator: can't
    allocate memory") do not match: they are a different outcome."""
    torch = sys.modules.get("torch")
    if torch is not None:
        oom_types = tuple(
            t
            for t in (getattr(torch, "OutOfMemoryError", None), _cuda_attr(torch, "OutOfMemoryError"))
            if isinstance(t, type)
        )
        if oom_types and isinstance(exc, oom_types):
            return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


# --------------------------------------------------------------------------- helpers


def _runtime_path() -> Path | None:
    attempt_dir = os.environ.get(ATTEMPT_DIR_ENV)
    return Path(attempt_dir) / RUNTIME_FILE if attempt_dir else None


def _read(path: Path) -> dict[str, Any]:
    """The current report, or {} when absent or unreadable (a torn file cannot happen, but
    a hand-edited one can)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_atomic(path: Path, data: dict[str, Any]) -> None:
    text = json.dumps(data, sort_keys=True) + "\n"  # serialise first: a bad value leaves no temp file
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _cuda_peak_mib() -> int | None:
    """Peak reserved memory of the current CUDA device, or None when torch is not imported
    or CUDA was never initialised (asking then would create a CUDA context for nothing)."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is None:
        return None
    try:
        if not (cuda.is_available() and cuda.is_initialized()):
            return None
        return -(-int(cuda.max_memory_reserved()) // _MIB)
    except Exception:  # a broken driver must not turn a report into a crash
        return None


def _cuda_attr(torch: Any, name: str) -> Any:
    return getattr(getattr(torch, "cuda", None), name, None)


def _as_int(v: Any) -> int | None:
    try:
        return None if v is None else int(v)
    except (TypeError, ValueError):
        return None
