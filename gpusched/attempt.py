"""The attempt directory: the contract between the scheduler, the wrapper and the user.

::

    logs/<suite>/<job>/<n>-<tier>/     (<n>-<tier>~2/ when another queue left one of that name)
      config.yaml   base config + job overrides + tier overrides, with a header of what was injected
      launch.sh     what the wrapper runs: the submitting shell's env, then the injected env
                    (one `export` per variable), cd, and the exact command line, shell-quoted
      output.log    stdout + stderr, as the pane showed it
      pid           the wrapper's PID, written before the job starts (mtime: the start time)
      exit.json     exit code and signal, written by the wrapper when the job ends (mtime: the end time)
      runtime.json  optional: peak memory / steps / OOM, written by gpusched.runtime inside the job
      .output.pipe  in a tmux pane, while the attempt runs: the FIFO through which the wrapper's
                    tee takes the job's output to the pane and output.log (made by the tmux
                    executor, removed once the attempt is reaped; hidden, so a `tail -f *` or
                    `cat *` of the folder never reads from it and takes output from the log)

:class:`AttemptPaths` owns every one of these paths; nothing else spells them.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from pathlib import Path
from typing import Any

from msgspec import Struct

from gpusched.logs import plain
from gpusched.model import ExitRecord


class AttemptPaths(Struct, frozen=True):
    #: The attempt's folder. The daemon's hot path passes the text the store keeps and joins
    #: names onto it with ``os.path``: a ``Path`` built, joined and turned back into text for
    #: each file of each attempt was a tenth of a dispatch tick on Python 3.12.
    dir: str | Path

    @classmethod
    def for_attempt(cls, logs_dir: str | Path, job_name: str, n: int, tier_name: str) -> AttemptPaths:
        """A new attempt's directory: ``<n>-<tier>`` in the job's log folder or, when that
        name is taken, ``<n>-<tier>~2`` (``~3``, ...; ``~`` is in no tier name). Attempt
        numbers never repeat within one queue, so a directory already there is another
        queue's: the state directory was deleted, or another ``GPUSCHED_HOME`` writes the same
        logs. Its exit.json and pid would pass for this attempt's (the daemon would reap a job
        that has just started, with that run's outcome, and start the next beside it) and its
        output.log would take this one's output; it is left as it is. One stat a launch;
        :func:`materialize` makes the directory only if it still does not exist."""
        base = os.path.join(logs_dir, job_name, f"{n}-{tier_name}")
        path, k = base, 1
        while os.path.lexists(path):
            k += 1
            path = f"{base}~{k}"
        return cls(path)

    @property
    def config(self) -> Path:
        return Path(self.dir, CONFIG)

    @property
    def launch(self) -> Path:
        return Path(self.dir, LAUNCH)

    @property
    def output(self) -> Path:
        return Path(self.dir, OUTPUT)

    @property
    def pid(self) -> Path:
        return Path(self.dir, PID)

    @property
    def exit(self) -> Path:
        return Path(self.dir, EXIT)

    @property
    def runtime(self) -> Path:
        return Path(self.dir, RUNTIME)

    @property
    def pipe(self) -> Path:
        return Path(self.dir, PIPE)

    def make_pipe(self) -> None:
        """Make the folder's :data:`PIPE` FIFO (kept if there). Where the filesystem has no
        FIFOs there is none, and the wrapper tees through a pipeline of its own."""
        with contextlib.suppress(OSError):
            os.mkfifo(self.file(PIPE), 0o600)

    def drop_pipe(self) -> None:
        """Remove the folder's :data:`PIPE`, if any: once the attempt is reaped, nothing reads
        or writes it again. Never raises (a launch that failed may have no folder at all)."""
        with contextlib.suppress(OSError):
            os.unlink(self.file(PIPE))

    def file(self, name: str) -> str:
        """The path of one of the files above (:data:`OUTPUT`...) as text: no ``Path`` built."""
        return os.path.join(self.dir, name)

    # ------------------------------------------------------------------ readers

    def read_pid(self) -> tuple[int, float] | None:
        """(pid, started_at) of the wrapper, or None before it started. The start time is the
        pid file's mtime (a wrapper of gpusched 0.1 wrote it after the pid)."""
        pid = self.file(PID)
        try:
            with open(pid, "rb") as f:
                fields = f.read().split()
            return int(fields[0]), float(fields[1]) if len(fields) > 1 else os.stat(pid).st_mtime
        except (OSError, ValueError, IndexError):
            return None

    def output_seen(self) -> tuple[float | None, int]:
        """(when output.log last grew, its size in bytes) from one stat: (None, 0) before the
        job wrote anything."""
        try:
            st = os.stat(self.file(OUTPUT))
        except OSError:
            return None, 0
        return st.st_mtime, st.st_size

    def read_runtime(self) -> dict[str, Any]:
        return _read_json(self.file(RUNTIME)) or {}

    def read_exit(self) -> ExitRecord | None:
        """The exit record, merged with the in-job helper's report; None while running
        (or when the wrapper died before it could write one)."""
        raw, written = _read_json_at(self.file(EXIT))
        if raw is None:
            return None
        rt = self.read_runtime()
        started, ended = raw.get("started_at"), raw.get("ended_at")
        if ended is None:  # the wrapper leaves the times to the kernel: the files' mtimes
            ended = written
            started = started if started is not None else _mtime(self.file(PID))
        return ExitRecord(
            exit_code=_int(raw.get("exit_code")),
            signal=_int(raw.get("signal")),
            started_at=_float(started),
            ended_at=_float(ended),
            peak_mib=_int(rt.get("peak_mib")),
            steps_done=_int(rt.get("steps_done")),
            oom_reported=bool(rt.get("oom", False)),
        )

    def log_tail(self, max_bytes: int = 16384) -> str:
        """The last ``max_bytes`` of output.log, decoded leniently ('' when absent)."""
        try:
            with open(self.file(OUTPUT), "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - max_bytes))
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def last_line(self) -> str:
        for line in reversed(plain(self.log_tail(4096)).splitlines()):
            line = line.strip()
            if line and not line.startswith("[gpusched]"):
                return line
        return ""


#: The attempt directory's files (see the module's docstring).
CONFIG, LAUNCH, OUTPUT, PID, EXIT, RUNTIME, PIPE = (
    "config.yaml",
    "launch.sh",
    "output.log",
    "pid",
    "exit.json",
    "runtime.json",
    ".output.pipe",
)


def _read_json(path: str | Path) -> dict[str, Any] | None:
    return _read_json_at(path)[0]


def _read_json_at(path: str | Path) -> tuple[dict[str, Any] | None, float | None]:
    """A small JSON file's object and its mtime; (None, None) when it is missing, unreadable or
    not a whole object. The daemon reads every ended job's exit.json, so one open, read and
    fstat, without a file object's layers (half the time of ``open``'s, then a ``stat``)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None, None
    try:
        data = b""
        while chunk := os.read(fd, 65536):
            data += chunk
        mtime = os.fstat(fd).st_mtime
        obj = json.loads(data)  # bytes: json detects UTF-8 itself
    except (OSError, ValueError):
        return None, None
    finally:
        os.close(fd)
    return (obj, mtime) if isinstance(obj, dict) else (None, None)


def _mtime(path: str | Path) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


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


# --------------------------------------------------------------------------- materialize

#: Variables of the submitting shell that must not leak into a job: they describe that
#: shell or terminal, or are set per attempt by gpusched itself.
_NOT_INHERITED = frozenset(
    {
        "TMUX",
        "TMUX_PANE",
        "PWD",
        "OLDPWD",
        "SHLVL",
        "_",
        "COLUMNS",
        "LINES",
        "TERM_SESSION_ID",
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "SSH_AUTH_SOCK",
        "SSH_AGENT_PID",
        "GPU_DEVICE_ORDINAL",
        "ROCR_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
    }
)
#: ... nor anything describing a Slurm allocation the user submitted from (salloc/srun).
_NOT_INHERITED_PREFIXES = ("GPUSCHED_", "SLURM_", "SBATCH_", "SRUN_", "SALLOC_")


def write_env_snapshot(path: Path, environ: dict[str, str]) -> None:
    """Save the submitting shell's environment as a sourceable sh file, private to the user
    (it may hold tokens). Jobs start from it, so they see the same PATH/conda env."""
    import shlex

    lines = ["# the environment of the shell that ran `gpusched submit`"]
    for k in sorted(environ):
        if k in _NOT_INHERITED or k.startswith(_NOT_INHERITED_PREFIXES) or not k.isidentifier():
            continue
        lines.append(f"export {k}={shlex.quote(environ[k])}")
    _atomic_write(path, "\n".join(lines) + "\n", mode=0o600)


#: How much older than the run's start a checkpoint of it may look: the kernel stamps files with
#: a clock that lags ``time.time()`` by up to a tick (4-10 ms).
CLOCK_SLACK_S = 0.1


def find_checkpoint(
    workdir: Path, output_dir: str | None, pattern: str, *, since: float | None = None
) -> tuple[str | None, str | None]:
    """(the newest file/folder matching ``pattern`` under the job's output dir written since
    ``since``, the newest one written before), each None when there is none. One from before
    the job's run began is another run's: resuming from it would end a rerun at once on last
    run's weights, or continue them under an edited config."""
    if not output_dir:
        return None, None
    base = Path(output_dir) if Path(output_dir).is_absolute() else workdir / output_dir
    try:
        matches = list(base.glob(pattern))
    except (OSError, ValueError):
        return None, None
    found = [(t, p.name, p) for p in matches if (t := _mtime(p)) is not None]  # (one rotated away meanwhile)
    cut = -math.inf if since is None else since - CLOCK_SLACK_S
    mine = max((f for f in found if f[0] >= cut), default=None)
    earlier = max((f for f in found if f[0] < cut), default=None)
    return (str(mine[2]) if mine else None), (str(earlier[2]) if earlier else None)


def materialize(
    paths: AttemptPaths,
    *,
    suite: Any,
    job: Any,
    tier_index: int,
    attempt_n: int,
    gpu: int | None,
    gpu_uuid: str | None,
    backend: str,
    env_file: str | None,
    run_since: float | None = None,
) -> str:
    """Write config.yaml and launch.sh for one attempt; return the command line. Every value
    reaching the shell is quoted (job names, overrides, paths). The injected variables and
    the command are launch.sh's last lines, after the ``_INJECTED`` and ``_COMMAND`` comments.
    ``run_since``: when the job's run began (:meth:`~gpusched.store.Store.run_since`); an
    older checkpoint is not resumed from."""
    import shlex

    import yaml

    from gpusched import tiers

    checkpoint = passed_over = withheld = None
    if suite.resume is not None:
        cfg0 = tiers.resolve(suite, job, tier_index).config
        out_dir = tiers.get_path(cfg0, tiers.split_key(suite.resume.output_dir_key))
        checkpoint, passed_over = find_checkpoint(
            Path(suite.workdir), out_dir, suite.resume.checkpoint_glob, since=run_since
        )
        if checkpoint and passed_over and suite.resume.path_key is None:
            # only the flag: the trainer picks the checkpoint itself, by step number as a rule
            # (transformers' get_last_checkpoint), and an earlier run's may have the higher one
            checkpoint, withheld = None, checkpoint
    resolved = tiers.resolve(suite, job, tier_index, checkpoint=checkpoint)
    tier = suite.tiers[tier_index]
    adir = os.fspath(paths.dir)  # text, each path spelled once: a launch is on the hot path
    config = os.path.join(adir, CONFIG)
    try:  # never an existing directory (AttemptPaths.for_attempt): its files are another run's
        os.mkdir(adir)
    except FileNotFoundError:  # the job's first attempt: its folder too
        os.makedirs(os.path.dirname(adir), exist_ok=True)
        os.mkdir(adir)

    header = [
        f"# materialized by gpusched for {job.id}, attempt {attempt_n}, tier {tier.name}",
        f"# base: {suite.base_config or '(none)'}",
        *(f"# injected: {n}" for n in resolved.notes),
    ]
    if passed_over is not None:
        began = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run_since))
        header.append(f"# not resumed from {passed_over}: older than this run of the job (began {began})")
    if withheld is not None:
        header.append(
            f"# not resumed from {withheld}: beside {passed_over}, the trainer might take that one for the"
            " newest (with resume.path_key gpusched names the checkpoint to resume from)"
        )
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml's when built with it: ~10x faster
    body = yaml.dump(dict(resolved.config), Dumper=dumper, sort_keys=False, allow_unicode=True)
    _write_fresh(config, "\n".join(header) + "\n" + body)

    env = dict(resolved.env)
    if backend != "slurm":  # on Slurm the allocation (GRES) sets CUDA_VISIBLE_DEVICES
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = _visible(gpu, gpu_uuid)
    env.update(
        GPUSCHED_JOB_ID=job.id,
        GPUSCHED_SUITE=job.suite,
        GPUSCHED_JOB=job.name,
        GPUSCHED_ATTEMPT=str(attempt_n),
        GPUSCHED_TIER=tier.name,
        GPUSCHED_ATTEMPT_DIR=adir,
        GPUSCHED_GPU="" if gpu is None else str(gpu),
    )

    fields = {
        "config": config,
        "job": job.name,
        "suite": job.suite,
        "tier": tier.name,
        "attempt_dir": adir,
        "gpu": "" if gpu is None else str(gpu),
    }
    command = suite.command.format_map({k: shlex.quote(v) for k, v in fields.items()})

    lines = [
        "#!/bin/sh",
        f"# gpusched: {job.id} attempt {attempt_n}, tier {tier.name}, "
        + (f"GPU {gpu}" if gpu is not None else "no GPU"),
    ]
    if env_file:
        lines.append(f"[ -r {shlex.quote(env_file)} ] && . {shlex.quote(env_file)}")
    lines.append(_INJECTED)
    lines += [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    lines += [f"cd {shlex.quote(suite.workdir)} || exit 126", _COMMAND, command]
    _write_fresh(os.path.join(adir, LAUNCH), "\n".join(lines) + "\n", mode=0o700)
    return command


_INJECTED = "# injected by gpusched (tier, GPU, attempt):"
_COMMAND = "# the command:"


def _visible(gpu: int | None, uuid: str | None) -> str:
    """CUDA_VISIBLE_DEVICES for a GPU: its UUID when NVML gave a real one (so NVML's and
    CUDA's numbering can never disagree), else its index; '' hides every GPU."""
    if uuid and uuid.startswith(("GPU-", "MIG-")) and "fake" not in uuid:
        return uuid
    return "" if gpu is None else str(gpu)


def _write_fresh(path: str, text: str, *, mode: int = 0o644) -> None:
    """Write a file of a new attempt directory in place. No temp file + rename (a quarter of
    a launch's cost): nothing reads these files before the wrapper starts, and a launch cut
    short is never started (a restarted daemon gives the job a new attempt directory)."""
    data = text.encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)
        while data:
            data = data[os.write(fd, data) :]
    finally:
        os.close(fd)


def _atomic_write(path: Path, text: str, *, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
