"""The attempt directory: the contract between the scheduler, the wrapper and the user.

::

    logs/<suite>/<job>/<n>-<tier>/
      config.yaml   base config + job overrides + tier overrides, with a header of what was injected
      env.json      the injected variables only
      command.txt   the exact command line
      launch.sh     what the wrapper runs: the submitting shell's env, the injected env, cd, exec
      output.log    stdout + stderr, as the pane showed it
      pid           "PID STARTED_AT" of the wrapper, written before the job starts
      exit.json     written atomically by the wrapper when the job ends
      runtime.json  optional: peak memory / steps / OOM, written by gpusched.runtime inside the job

:class:`AttemptPaths` owns every one of these paths; nothing else spells them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpusched.model import ExitRecord


@dataclass(frozen=True)
class AttemptPaths:
    dir: Path

    @classmethod
    def for_attempt(cls, logs_dir: str | Path, job_name: str, n: int, tier_name: str) -> AttemptPaths:
        return cls(Path(logs_dir) / job_name / f"{n}-{tier_name}")

    @property
    def config(self) -> Path:
        return self.dir / "config.yaml"

    @property
    def env(self) -> Path:
        return self.dir / "env.json"

    @property
    def command(self) -> Path:
        return self.dir / "command.txt"

    @property
    def launch(self) -> Path:
        return self.dir / "launch.sh"

    @property
    def output(self) -> Path:
        return self.dir / "output.log"

    @property
    def pid(self) -> Path:
        return self.dir / "pid"

    @property
    def exit(self) -> Path:
        return self.dir / "exit.json"

    @property
    def runtime(self) -> Path:
        return self.dir / "runtime.json"

    # ------------------------------------------------------------------ readers

    def read_pid(self) -> tuple[int, float] | None:
        """(pid, started_at) of the wrapper, or None before it started."""
        try:
            pid, started = self.pid.read_text().split()
            return int(pid), float(started)
        except (OSError, ValueError):
            return None

    def read_runtime(self) -> dict[str, Any]:
        return _read_json(self.runtime) or {}

    def read_exit(self) -> ExitRecord | None:
        """The exit record, merged with the in-job helper's report; None while running
        (or when the wrapper died before it could write one)."""
        raw = _read_json(self.exit)
        if raw is None:
            return None
        rt = self.read_runtime()
        return ExitRecord(
            exit_code=_int(raw.get("exit_code")),
            signal=_int(raw.get("signal")),
            started_at=_float(raw.get("started_at")),
            ended_at=_float(raw.get("ended_at")),
            peak_mib=_int(rt.get("peak_mib")),
            steps_done=_int(rt.get("steps_done")),
            oom_reported=bool(rt.get("oom", False)),
        )

    def log_tail(self, max_bytes: int = 16384) -> str:
        """The last ``max_bytes`` of output.log, decoded leniently ('' when absent)."""
        try:
            with open(self.output, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - max_bytes))
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def last_line(self) -> str:
        for line in reversed(self.log_tail(4096).splitlines()):
            line = line.strip()
            if line and not line.startswith("[gpusched]"):
                return line
        return ""


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _int(v: Any) -> int | None:
    try:
        return None if v is None else int(v)
    except (TypeError, ValueError):
        return None


def _float(v: Any) -> float | None:
    try:
        return None if v is None else float(v)
    except (TypeError, ValueError):
        return None
