"""The Slurm backend: each attempt is one ``sbatch`` job that runs the same wrapper as the
local backends, so ``exit.json`` (on the shared filesystem) stays the one source of an
attempt's result. Slurm only tells whether the job still lives, where, and in what state.

Pure parts, tested everywhere: :func:`build_sbatch_script` (golden file) and the parsers of
``scontrol show job -o``, ``squeue -t all``, the ``jobcomp/filetxt`` log and ``sacct -P``
(tests on output recorded from a real Slurm 22.05). The side effects live in
:class:`SlurmExecutor`, which calls Slurm's commands only through :func:`gpusched.proc.run`.

Observed on Slurm 22.05 (see ``scripts/slurm-ci.sh``):

* a finished job stays visible to ``scontrol``/``squeue`` for ``MinJobAge`` seconds only; then
  a single-id query exits 1 with ``Invalid job id specified`` and a multi-id ``squeue -j``
  silently leaves it out. Both mean "purged", which is normal, not an error;
* ``scontrol show job`` takes one id (``1,2`` is refused); ``squeue -j 1,2,3`` takes many, so
  one ``squeue`` call per daemon tick answers for every tracked job;
* ``squeue -o`` has no exit-code field; ``scontrol`` (``ExitCode=code:signal``), ``sacct -P``
  and ``jobcomp`` do. jobcomp writes ``0:0`` for CANCELLED and TIMEOUT jobs;
* without slurmdbd, ``sacct`` exits 1 with "Slurm accounting storage is disabled";
* with the controller down every client command takes ~9 s to fail ("Unable to contact
  slurm controller"); such a failure must never read as "the job is gone".
"""

from __future__ import annotations

import logging
import re
import shlex
import shutil
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from msgspec import Struct
from msgspec.structs import replace

from gpusched import proc
from gpusched.errors import CommandFailed, ExecutorError
from gpusched.executors import TOKEN_ENV, WRAPPER, Handle, LaunchRequest
from gpusched.home import Home
from gpusched.logs import last_line, tail

if TYPE_CHECKING:
    import subprocess

log = logging.getLogger(__name__)

#: Name of the batch script written into the attempt directory (kept for reruns by hand).
SBATCH_SCRIPT = "sbatch.sh"
#: The wrapper is copied next to it: the attempt dir is on the shared filesystem already (the
#: daemon reads exit.json there), gpusched's install directory need not be.
WRAPPER_COPY = "wrap.sh"
#: Slurm's own stdout/stderr of the batch step (the job's output goes to output.log).
SLURM_OUTPUT = "slurm-%j.out"
#: The job comment that tags a job as an attempt of gpusched: ``gpusched:<token>``.
COMMENT_PREFIX = "gpusched:"
#: ``squeue`` format parsed by :func:`parse_squeue_all`.
SQUEUE_FORMAT = "%i|%A|%T|%r|%N"
#: How much of the end of a jobcomp/filetxt log to read for a purged job (it holds every job
#: of every user of the cluster; ours ended recently).
JOBCOMP_TAIL_BYTES = 8 << 20
#: ``sacct`` fields parsed by :func:`parse_sacct`.
SACCT_FIELDS = "JobIDRaw,State,ExitCode,NodeList"

#: States after which a job never runs again (without an explicit requeue).
TERMINAL_SLURM_STATES = frozenset(
    {"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY"}
    | {"PREEMPTED", "TIMEOUT"}
)

_NO_SBATCH = "sbatch not found on PATH: install slurm-client or load the Slurm module"
_PURGED_MARK = "Invalid job id specified"
_KEY = re.compile(r"(?:^|(?<=\s))([A-Za-z][A-Za-z0-9_:/]*)=")


class SlurmJobInfo(Struct, frozen=True, kw_only=True):
    """What Slurm says about one job. ``None`` where the source does not tell
    (``squeue -o`` has no exit code; a pending job has no node)."""

    job_id: str
    state: str  # JobState as Slurm spells it: PENDING, RUNNING, COMPLETED, CANCELLED, ...
    reason: str | None = None  # Reason= (None for Slurm's "None")
    exit_code: int | None = None
    signal: int | None = None
    node: str | None = None
    restarts: int | None = None
    stdout: str | None = None  # Slurm's own output file (StdOut=, %j expanded)
    source: str = ""  # "squeue", "scontrol", "sacct" or "jobcomp"

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_SLURM_STATES


# --------------------------------------------------------------------------- builder


def build_sbatch_script(
    req: LaunchRequest,
    *,
    wrapper: Path = WRAPPER,
    gres: str | None = "gpu:1",
    partition: str | None = None,
    extra_args: Sequence[str] = (),
    time_limit: str | None = None,
) -> str:
    """The batch script of one attempt: ``#SBATCH`` options, the wrapper's environment, then
    ``exec sh WRAPPER ATTEMPT_DIR file``. Pure; raises :class:`ExecutorError` for a value that
    cannot be written safely (a path with a quote or newline, an env name that is not one).

    ``extra_args`` come last, so they override ours (``--no-requeue``, ``--gres``...); each is
    one option (``--mem=16G``); a bare value (``16G`` after ``--mem``) joins the line above.
    CUDA_VISIBLE_DEVICES is never written: Slurm's GRES allocation sets it in the job."""
    adir = _checked_path(req.attempt_dir, "attempt directory")
    opts = [
        f"--job-name={job_name(req.suite, req.job_name)}",
        f"--output={_sbatch_value(f'{adir}/{SLURM_OUTPUT}')}",
        "--open-mode=append",
        f"--chdir={_sbatch_value(_checked_path(req.workdir, 'workdir'))}",
        f"--comment={COMMENT_PREFIX}{req.token}",
        # one attempt is one run: gpusched, not Slurm, decides about reruns (a rerun in the
        # same attempt dir would race the exit.json of the run before it)
        "--no-requeue",
    ]
    if gres:
        opts.append(f"--gres={gres}")
    if partition:
        opts.append(f"--partition={partition}")
    if time_limit:
        opts.append(f"--time={time_limit}")
    opts += _join_extra_args(extra_args)
    env = {**req.env, TOKEN_ENV: req.token}
    for key in env:
        if not key.isidentifier() or key == "CUDA_VISIBLE_DEVICES":
            raise ExecutorError(f"{req.job_id}: cannot pass variable {key!r} to a Slurm job")
    lines = [
        "#!/bin/sh",
        f"# gpusched attempt of {req.job_id}; submitted with: sbatch --parsable {SBATCH_SCRIPT}",
        *(f"#SBATCH {o}" for o in opts),
        *(f"export {k}={shlex.quote(v)}" for k, v in env.items()),
        f"exec sh {shlex.quote(str(wrapper))} {shlex.quote(adir)} file",
    ]
    return "\n".join(lines) + "\n"


def job_name(suite: str, job: str) -> str:
    """``gpusched-<suite>-<job>`` with anything but letters, digits, ``._-`` made ``_``."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", f"gpusched-{suite}-{job}")[:128]


def _checked_path(p: str | Path, what: str) -> str:
    s = str(Path(p).absolute())
    if any(c in s for c in '"\n\r%\\'):
        raise ExecutorError(f"{what} {s!r}: Slurm cannot take a path with a quote, %, \\ or newline")
    return s


def _sbatch_value(v: str) -> str:
    # an #SBATCH line splits at whitespace unless the value is in double quotes
    return f'"{v}"' if re.search(r"\s", v) else v


def _join_extra_args(args: Sequence[str]) -> list[str]:
    out: list[str] = []
    for a in args:
        if "\n" in a or "\r" in a:
            raise ExecutorError(f"--sbatch-arg {a!r}: no newlines, please")
        if out and not a.startswith("-"):
            out[-1] += f" {_sbatch_value(a)}"
        else:
            out.append(a)
    return out


# --------------------------------------------------------------------------- parsers


def parse_sbatch_parsable(text: str) -> str:
    """The job id printed by ``sbatch --parsable`` (``42`` or ``42;cluster``)."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    jid = first.split(";")[0].strip()
    if not jid.isdigit():
        raise ValueError(f"sbatch --parsable printed {text.strip()!r}, not a job id")
    return jid


def parse_key_values(line: str) -> dict[str, str]:
    """``Key=value Key2=va lue`` -> dict. Values may hold spaces (paths, names); a key is a
    word followed by ``=`` at the start or after whitespace."""
    keys = list(_KEY.finditer(line))
    out: dict[str, str] = {}
    for i, m in enumerate(keys):
        end = keys[i + 1].start() if i + 1 < len(keys) else len(line)
        out[m.group(1)] = line[m.end() : end].strip()
    return out


def parse_scontrol_show_job(text: str) -> dict[str, SlurmJobInfo]:
    """``scontrol show job [-o] [ID]`` -> {raw job id: info}; one-line (``-o``) and the
    multi-line default both work. An array task is keyed by its own raw JobId."""
    infos = (_from_key_values(parse_key_values(r), "scontrol") for r in _records(text))
    return {i.job_id: i for i in infos if i is not None}


def parse_squeue_all(text: str) -> dict[str, SlurmJobInfo]:
    """``squeue -t all -h -o '%i|%A|%T|%r|%N'`` -> {raw job id (%A): info}. No exit codes."""
    out: dict[str, SlurmJobInfo] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 5 or not parts[1].isdigit():
            continue
        _shown, raw, state, reason, nodes = (p.strip() for p in parts[:5])
        out[raw] = SlurmJobInfo(
            job_id=raw, state=state, reason=_none(reason), node=_none(nodes), source="squeue"
        )
    return out


def parse_jobcomp(text: str) -> dict[str, SlurmJobInfo]:
    """A ``jobcomp/filetxt`` log -> {job id: info}; the last line of a job wins (a requeued
    run writes one line per run). Note: it records ``ExitCode=0:0`` for CANCELLED/TIMEOUT."""
    infos = (_from_key_values(parse_key_values(line), "jobcomp") for line in text.splitlines())
    return {i.job_id: i for i in infos if i is not None}


def parse_sacct(text: str) -> dict[str, SlurmJobInfo]:
    """``sacct -X -n -P -o JobIDRaw,State,ExitCode,NodeList`` -> {job id: info}. Step rows
    (``42.batch``, when ``-X`` was left out) are skipped; ``CANCELLED by 0`` reads CANCELLED."""
    out: dict[str, SlurmJobInfo] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 3 or not parts[0].isdigit() or not parts[1]:
            continue
        code, sig = _exit_pair(parts[2])
        out[parts[0]] = SlurmJobInfo(
            job_id=parts[0],
            state=parts[1].split()[0],
            exit_code=code,
            signal=sig,
            node=_none(parts[3]) if len(parts) > 3 else None,
            source="sacct",
        )
    return out


def parse_comments(text: str) -> dict[str, str]:
    """``squeue -h -o '%A|%k'`` -> {token: job id} for the jobs gpusched tagged."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        jid, _, comment = line.strip().partition("|")
        if jid.isdigit() and comment.startswith(COMMENT_PREFIX):
            out[comment[len(COMMENT_PREFIX) :]] = jid
    return out


def ping_is_up(text: str) -> bool:
    """``scontrol ping`` output -> does the (primary or a backup) controller answer?"""
    return any(line.rstrip().endswith(" is UP") for line in text.splitlines())


def is_purged(stderr: str) -> bool:
    """True when a query failed only because Slurm forgot the job (after MinJobAge)."""
    return _PURGED_MARK in stderr


def _from_key_values(kv: dict[str, str], source: str) -> SlurmJobInfo | None:
    if "JobId" not in kv or "JobState" not in kv:
        return None
    code, sig = _exit_pair(kv.get("ExitCode"))
    return SlurmJobInfo(
        job_id=kv["JobId"],
        state=kv["JobState"],
        reason=_none(kv.get("Reason")),
        exit_code=code,
        signal=sig,
        node=_none(kv.get("NodeList")),
        restarts=_int(kv.get("Restarts")),
        stdout=_none(kv.get("StdOut")),
        source=source,
    )


def _records(text: str) -> list[str]:
    records: list[str] = []
    for line in text.splitlines():
        if line.startswith("JobId="):
            records.append(line)
        elif line.strip() and records:
            records[-1] += " " + line.strip()
    return records


def _exit_pair(v: str | None) -> tuple[int | None, int | None]:
    code, _, sig = (v or "").partition(":")
    return _int(code), _int(sig)


def _int(v: str | None) -> int | None:
    try:
        return int(v) if v not in (None, "") else None
    except ValueError:
        return None


def _none(v: str | None) -> str | None:
    return None if v in (None, "", "None", "(null)", "N/A", "None assigned") else v


# --------------------------------------------------------------------------- availability


def check_available(*, timeout_s: float = 30.0) -> None:
    """Raise one-line :class:`ExecutorError` unless ``sbatch`` is on PATH and the controller
    answers ``scontrol ping`` with UP."""
    if shutil.which("sbatch") is None or shutil.which("scontrol") is None:
        raise ExecutorError(_NO_SBATCH)
    try:
        out = proc.run(["scontrol", "ping"], check=False, timeout=timeout_s)
        text = (out.stdout + out.stderr).strip()
    except (CommandFailed, ExecutorError, OSError) as e:  # timed out, vanished from PATH
        text = str(e)
    if not ping_is_up(text):
        first = text.splitlines()[0] if text else "no answer"
        raise ExecutorError(
            f"the Slurm controller does not answer (`scontrol ping`: {first}); "
            "start slurmctld, or point SLURM_CONF at the cluster's slurm.conf"
        )


# --------------------------------------------------------------------------- executor


class SlurmExecutor:
    """Attempts as sbatch jobs. Ask Slurm once per tick: :meth:`refresh` queries every
    tracked job with one ``squeue``; :meth:`alive` and :meth:`info` answer from that cache
    and refresh it themselves (one batched query) when it is older than ``max_age_s``.

    A failed query (controller down) keeps the last answer: a job is never declared gone
    because Slurm could not be asked. A job Slurm no longer knows ("Invalid job id
    specified") is not alive; its result is the attempt's own ``exit.json``."""

    name = "slurm"

    def __init__(
        self,
        home: Home | None = None,
        *,
        partition: str | None = None,
        sbatch_args: Sequence[str] = (),
        gres: str | None = "gpu:1",
        time_limit: str | None = None,
        max_age_s: float = 1.0,
        query_timeout_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.home = home
        self.partition, self.sbatch_args, self.gres = partition, tuple(sbatch_args), gres
        self.time_limit = time_limit
        self.max_age_s, self.query_timeout_s, self._clock = max_age_s, query_timeout_s, clock
        self._cache: dict[str, SlurmJobInfo | None] = {}  # None: Slurm forgot it (purged)
        self._seen_at: dict[str, float] = {}
        self._done: set[str] = set()  # ended or purged: squeue need not be asked again
        self._detailed: set[str] = set()  # ended, and its exit code was looked up
        self._config: dict[str, str] | None = None
        self.last_error: str | None = None  # why the last query failed, for `status`

    # ------------------------------------------------------------------ protocol

    def launch(self, req: LaunchRequest) -> Handle:
        """Write ``ATTEMPT_DIR/sbatch.sh`` (and a copy of the wrapper) and submit it with
        ``sbatch --parsable``; return once Slurm has the job. Suite options (``req.options``:
        ``partition``, ``sbatch_args``, ``gres``, ``time_limit``) override the executor's."""
        opts: Mapping[str, Any] = getattr(req, "options", None) or {}
        adir = Path(req.attempt_dir)
        adir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(WRAPPER, adir / WRAPPER_COPY)
        script = build_sbatch_script(
            req,
            wrapper=adir / WRAPPER_COPY,
            gres=opts.get("gres", self.gres),
            partition=opts.get("partition", self.partition),
            extra_args=[*self.sbatch_args, *opts.get("sbatch_args", ())],
            time_limit=opts.get("time_limit", self.time_limit),
        )
        path = adir / SBATCH_SCRIPT
        path.write_text(script)
        out = self._run_or_explain(["sbatch", "--parsable", str(path)], what=f"sbatch for {req.job_id}")
        jid = parse_sbatch_parsable(out)
        # tracked from now on; not "seen": the first alive()/info() asks Slurm
        self._cache[jid] = SlurmJobInfo(job_id=jid, state="PENDING", source="sbatch")
        return {"slurm_job_id": jid}

    def alive(self, handle: Handle) -> bool:
        """True while Slurm holds the job (pending, running, completing, suspended...)."""
        jid = _job_id(handle)
        if jid is None:
            return False
        self._ensure_fresh(jid)
        if jid not in self._cache:  # never answered (controller down): assume it lives
            return True
        info = self._cache[jid]
        return info is not None and not info.terminal  # None: purged

    def terminate(self, handle: Handle, *, force: bool = False) -> None:
        """``scancel`` (force: ``--signal=KILL``). Slurm sends SIGTERM to every process of the
        job and SIGKILL after KillWait either way; idempotent on ended or purged jobs."""
        jid = _job_id(handle)
        if jid is None:
            return
        cmd = ["scancel", *(["--signal=KILL"] if force else []), jid]
        self._run_or_explain(cmd, what=f"scancel of Slurm job {jid}", ok_if_purged=True)
        self._seen_at.pop(jid, None)  # its state changes now: ask again next time

    def discover(self) -> dict[str, Handle]:
        """token -> handle for each job of this user that carries a gpusched comment,
        finished ones included while Slurm still lists them."""
        out = self._run_or_explain(["squeue", "-h", "-t", "all", "--me", "-o", "%A|%k"], what="squeue --me")
        return {tok: {"slurm_job_id": jid} for tok, jid in parse_comments(out).items()}

    def release(self, handle: Handle) -> None:
        """Forget the cached state of a reaped attempt (Slurm itself needs nothing)."""
        jid = _job_id(handle)
        if jid is not None:
            for d in (self._cache, self._seen_at):
                d.pop(jid, None)
            self._done.discard(jid)
            self._detailed.discard(jid)

    # ------------------------------------------------------------------ queries

    def check_available(self) -> None:
        check_available(timeout_s=self.query_timeout_s)

    def refresh(self, handles: Iterable[Handle] = ()) -> bool:
        """Ask Slurm about every tracked job (and ``handles``) with one ``squeue``. Call once
        per daemon tick; returns False (keeping the last answers) when Slurm did not answer."""
        ids = {j for h in handles if (j := _job_id(h)) is not None}
        ids |= self._cache.keys()
        ids -= self._done
        if not ids:
            return True
        order = sorted(ids, key=int)
        res = self._query(["squeue", "-h", "-t", "all", "-j", ",".join(order), "-o", SQUEUE_FORMAT])
        if res is None or (res.returncode != 0 and not is_purged(res.stderr)):
            if res is not None:
                self.last_error = last_line(res.stderr) or f"squeue exited {res.returncode}"
            log.warning("slurm: squeue failed, keeping the last known states: %s", self.last_error)
            return False
        self.last_error = None
        rows = parse_squeue_all(res.stdout) if res.returncode == 0 else {}
        for jid in order:
            self._store(jid, rows.get(jid), keep_details=True)  # absent: purged
        return True

    def info(self, handle: Handle) -> SlurmJobInfo | None:
        """Slurm's view of the job for ``status``: id, state, reason, node; once it ended, also
        its exit code (from ``scontrol``, or, once purged, ``sacct`` or the jobcomp log).
        None when no source knows the job any more."""
        jid = _job_id(handle)
        if jid is None:
            return None
        self._ensure_fresh(jid)
        info = self._cache.get(jid)
        if jid in self._done and jid not in self._detailed:
            answered, details = self._final_info(jid)
            if answered:
                self._detailed.add(jid)
                info = self._cache[jid] = details or info
        return info

    def attach_hint(self, handle: Handle, *, log_path: Path | None = None) -> str:
        """A command that shows the attempt: a shell inside the running allocation, else
        ``tail -f`` of its log."""
        jid = _job_id(handle)
        info = self._cache.get(jid) if jid is not None else None
        if jid is not None and info is not None and info.state == "RUNNING":
            return f"srun --jobid {jid} --overlap --pty bash"
        if log_path is not None:
            return f"tail -f {shlex.quote(str(log_path))}"
        return f"scontrol show job {jid}" if jid else ""

    # ------------------------------------------------------------------ internals

    def _ensure_fresh(self, jid: str) -> None:
        if jid in self._done:
            return
        seen = self._seen_at.get(jid)
        if seen is None or self._clock() - seen > self.max_age_s:
            self.refresh([{"slurm_job_id": jid}])

    def _store(self, jid: str, info: SlurmJobInfo | None, *, keep_details: bool = False) -> None:
        old = self._cache.get(jid)
        if keep_details and info is not None and old is not None and old.state == info.state:
            # squeue has no exit code / restarts: keep what scontrol told before
            info = replace(old, reason=info.reason, node=info.node or old.node)
        self._cache[jid] = info
        self._seen_at[jid] = self._clock()
        if info is None or info.terminal:
            self._done.add(jid)

    def _final_info(self, jid: str) -> tuple[bool, SlurmJobInfo | None]:
        """(answered, details) of an ended job: scontrol while Slurm lists it, then sacct
        (where accounting is on), then the jobcomp/filetxt log (where it is readable here).
        ``answered`` is False when Slurm could not be asked: try again later."""
        res = self._query(["scontrol", "show", "job", "-o", jid])
        if res is None or (res.returncode != 0 and not is_purged(res.stderr)):
            return False, None
        if res.returncode == 0 and jid in (rows := parse_scontrol_show_job(res.stdout)):
            return True, rows[jid]
        conf = self._slurm_config()
        if conf.get("AccountingStorageType", "accounting_storage/none") != "accounting_storage/none":
            res = self._query(["sacct", "-X", "-n", "-P", "-j", jid, "-o", SACCT_FIELDS])
            if res is not None and res.returncode == 0 and jid in (rows := parse_sacct(res.stdout)):
                return True, rows[jid]
        loc = conf.get("JobCompLoc", "")
        if conf.get("JobCompType") == "jobcomp/filetxt" and loc.startswith("/"):
            return True, parse_jobcomp(tail(Path(loc), JOBCOMP_TAIL_BYTES)).get(jid)
        return True, None

    def _slurm_config(self) -> dict[str, str]:
        if self._config is None:
            res = self._query(["scontrol", "show", "config"])
            if res is None or res.returncode != 0:
                return {}
            self._config = parse_show_config(res.stdout)
        return self._config

    def _query(self, cmd: list[str]) -> subprocess.CompletedProcess[str] | None:
        """Run a read-only Slurm query; None (and ``last_error``) when it could not run."""
        try:
            return proc.run(cmd, check=False, timeout=self.query_timeout_s)
        except (CommandFailed, ExecutorError, OSError) as e:  # timed out, not on PATH
            self.last_error = f"{cmd[0]}: {e}"
            return None

    def _run_or_explain(self, cmd: list[str], *, what: str, ok_if_purged: bool = False) -> str:
        if shutil.which(cmd[0]) is None:
            raise ExecutorError(_NO_SBATCH if cmd[0] == "sbatch" else f"{cmd[0]} not found on PATH")
        try:
            res = proc.run(cmd, check=False, timeout=self.query_timeout_s)
        except CommandFailed as e:  # timed out
            raise ExecutorError(f"{what} failed: {e}") from e
        if res.returncode != 0 and not (ok_if_purged and is_purged(res.stderr)):
            raise ExecutorError(f"{what} failed: {last_line(res.stderr) or f'exit {res.returncode}'}")
        return res.stdout


def parse_show_config(text: str) -> dict[str, str]:
    """``scontrol show config`` -> {Key: value} (``Key = value`` lines)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(" = ")
        if sep and key.strip() and " " not in key.strip():
            out[key.strip()] = value.strip()
    return out


def _job_id(handle: Mapping[str, Any]) -> str | None:
    jid = handle.get("slurm_job_id")
    return str(jid) if jid is not None and str(jid).isdigit() else None
