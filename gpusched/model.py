"""Plain records and closed enums shared by the pure core and the edges.

Everything here is data: frozen, keyword-only records (``msgspec.Struct``) with units in field names
(``free_mib``, ``started_at``), and ``StrEnum`` states whose legal moves are written down
in one table. Nothing in this module touches a clock, a file or a process.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

from msgspec import Struct, field
from msgspec.structs import replace

from gpusched.errors import IllegalTransition

MIB_PER_GIB = 1024

#: Exit code of a trainer that died of GPU out-of-memory and said so through
#: ``gpusched.runtime`` (so classification need not rely on log text alone).
OOM_EXIT_CODE = 86


class JobState(enum.StrEnum):
    """Where a job stands. ``running`` covers the whole life of an attempt, from the moment
    its slot is taken (two-phase launch) until its exit is reaped."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})

#: The only legal moves of a job. ``running -> queued`` is a requeue (OOM, lost);
#: ``terminal -> queued`` is ``gpusched retry`` / ``submit --rerun``.
TRANSITIONS: Mapping[JobState, frozenset[JobState]] = {
    JobState.QUEUED: frozenset({JobState.RUNNING, JobState.CANCELLED}),
    JobState.RUNNING: frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.QUEUED, JobState.CANCELLED}),
    JobState.SUCCEEDED: frozenset({JobState.QUEUED}),
    JobState.FAILED: frozenset({JobState.QUEUED}),
    JobState.CANCELLED: frozenset({JobState.QUEUED}),
}


def check_transition(job_id: str, old: JobState | str, new: JobState | str) -> None:
    """Raise :class:`IllegalTransition` naming the job, from and to, unless ``old -> new`` is legal."""
    old_s, new_s = JobState(old), JobState(new)
    if new_s not in TRANSITIONS[old_s]:
        raise IllegalTransition(job_id, old_s.value, new_s.value)


class AttemptState(enum.StrEnum):
    """An attempt is recorded ``launching`` (with a token) before anything starts, ``running``
    once its pane/process exists, and ``exited`` once its outcome is reaped."""

    LAUNCHING = "launching"
    RUNNING = "running"
    EXITED = "exited"


class Outcome(enum.StrEnum):
    OK = "ok"
    OOM = "oom"  # GPU memory
    HOST_OOM = "host_oom"  # host RAM (allocator message, or a SIGKILL gpusched did not send)
    ERROR = "error"
    CANCELLED = "cancelled"
    LOST = "lost"  # vanished with no exit record
    TIMEOUT = "timeout"  # stopped by gpusched for running past a suite limit (time, silence)
    GPU_FAULT = "gpu_fault"  # the card failed under the job (ECC, fell off the bus): not the job's fault
    DISK_FULL = "disk_full"  # a write failed for want of room (ENOSPC, a quota): the machine's, not the job's
    NETWORK = "network"  # its last exception was a connection that failed (a hub's 503, DNS): it passes


class StepKind(enum.StrEnum):
    DONE = "done"  # job succeeded
    REQUEUE = "requeue"  # back to queued, at ``tier``
    FAIL = "fail"  # job failed for good
    CANCEL = "cancel"  # job cancelled


# --------------------------------------------------------------------------- plan side


class BatchRule(Struct, frozen=True, kw_only=True):
    """How a tier changes the micro-batch while keeping the effective batch
    (micro-batch x gradient accumulation) the same.

    Exactly one of ``scale`` (multiply the micro-batch, e.g. 0.5) or ``micro_batch``
    (set it, e.g. 1) is given."""

    scale: float | None = None
    micro_batch: int | None = None


class Tier(Struct, frozen=True, kw_only=True):
    """One step of the conservativeness ladder, already resolved (cumulative over the
    tiers before it): what a job at this tier gets on top of its own configuration."""

    name: str
    env: Mapping[str, str] = field(default_factory=dict)
    config: Mapping[str, Any] = field(default_factory=dict)
    batch: BatchRule | None = None
    exclusive: bool = False  # run alone on its GPU
    min_free_mib: int | None = None  # placement veto: GPU must have this much free
    description: str = ""


class BatchKeys(Struct, frozen=True, kw_only=True):
    """The config keys that hold a suite's micro-batch and gradient accumulation."""

    size: str = "batch_size"
    accumulation: str = "gradient_accumulation_steps"


class ResumeSpec(Struct, frozen=True, kw_only=True):
    """How a suite's trainer resumes. When ``checkpoint_glob`` (relative to the job's
    ``output_dir`` config value, or absolute) matches a file or folder, the next attempt
    gets ``config[flag_key] = True`` and/or ``config[path_key] = <newest match>``."""

    checkpoint_glob: str = "checkpoint*"
    output_dir_key: str = "output_dir"
    flag_key: str | None = None  # e.g. is_keep_training
    path_key: str | None = None  # e.g. resume_from_checkpoint


class JobSpec(Struct, frozen=True, kw_only=True):
    """Everything needed to launch one job of a suite, independent of tier and GPU."""

    suite: str
    name: str
    task: str  # key for peak-memory prediction: siblings share it (e.g. "glue-tvt_qnli")
    config: Mapping[str, Any] = field(default_factory=dict)  # job overrides on the base config
    env: Mapping[str, str] = field(default_factory=dict)  # job env on top of the suite env
    priority: int = 0

    @property
    def id(self) -> str:
        return f"{self.suite}/{self.name}"


class RetryPolicy(Struct, frozen=True, kw_only=True):
    """Retries of plain ``error`` outcomes (opt-in; OOM uses the tier ladder instead)."""

    errors: int = 0
    backoff_s: float = 30.0


class Limits(Struct, frozen=True, kw_only=True):
    """When gpusched stops an attempt itself (SIGTERM, then SIGKILL): ``time_s`` after it
    started, once its log has not grown for ``silence_s`` (taken as hung), or once its log
    holds more than ``output_mib`` (a runaway print would fill the disk under every job).
    None: no limit."""

    time_s: float | None = None
    silence_s: float | None = None
    output_mib: int | None = None

    @property
    def any(self) -> bool:
        return self.time_s is not None or self.silence_s is not None or self.output_mib is not None


class Suite(Struct, frozen=True, kw_only=True):
    """A validated plan file: the suite-wide part shared by every job."""

    name: str
    plan_path: str
    workdir: str  # absolute; the command runs here
    logs_dir: str  # absolute; attempts go to logs_dir/<job>/<n>-<tier>/
    command: str  # shell template with {config} (and optional {job}, {tier}, {attempt_dir}, {gpu})
    base_config: str | None  # absolute path, or None
    base_config_data: Mapping[str, Any] = field(default_factory=dict)
    config: Mapping[str, Any] = field(default_factory=dict)  # suite-wide overrides
    env: Mapping[str, str] = field(default_factory=dict)
    tiers: tuple[Tier, ...] = ()
    batch_keys: BatchKeys = field(default_factory=BatchKeys)
    resume: ResumeSpec | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    limits: Limits = field(default_factory=Limits)
    jobs: tuple[JobSpec, ...] = ()
    description: str = ""
    notify: str | None = None  # sh command the daemon runs when a job fails, a suite ends (notify.py)


class GpuPlan(Struct, frozen=True, kw_only=True):
    """Per-GPU concurrency caps: ``slots[i]`` jobs at most on GPU ``gpus[i]``."""

    gpus: tuple[int, ...]
    slots: tuple[int, ...]

    def cap(self, gpu: int) -> int:
        """Slots this plan allows on ``gpu`` (0 when the plan does not use it)."""
        try:
            return self.slots[self.gpus.index(gpu)]
        except ValueError:
            return 0

    @property
    def total_slots(self) -> int:
        return sum(self.slots)

    def as_text(self) -> str:
        return ",".join(str(s) for s in self.slots)


# --------------------------------------------------------------------------- GPUs


class GpuProcess(Struct, frozen=True, kw_only=True):
    pid: int
    used_mib: int | None  # None when the driver does not say


#: Why a card that a probe finds ``lost`` is out of service (status, gpus, the event log).
GPU_LOST_WHY = "the GPU probe finds the card lost (NVML: it fell off the bus, or needs a reset)"


class GpuState(Struct, frozen=True, kw_only=True):
    """What a probe saw of one GPU at ``sampled_at``. Unknown values are ``None``: a probe
    never raises into the scheduler loop. ``lost``: the driver says the card is gone or
    must be reset (NVML's GPU_IS_LOST / RESET_REQUIRED, e.g. after an Xid 79 "fallen off the
    bus"); it answers nothing else until a person resets it, so its other values are the
    last ones known or ``None``."""

    index: int
    uuid: str | None = None
    name: str | None = None
    total_mib: int | None = None
    free_mib: int | None = None
    used_mib: int | None = None
    util_pct: int | None = None
    processes: tuple[GpuProcess, ...] = ()
    sampled_at: float = 0.0
    lost: bool = False

    def evolve(self, **changes: Any) -> GpuState:
        return replace(self, **changes)


# --------------------------------------------------------------------------- runs


class ExitRecord(Struct, frozen=True, kw_only=True):
    """What the wrapper wrote to ``exit.json`` (plus the in-job helper's report, if any)."""

    exit_code: int | None
    signal: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    peak_mib: int | None = None  # from gpusched.runtime, when the trainer used it
    steps_done: int | None = None
    oom_reported: bool = False  # the in-job helper saw a torch OOM itself


class Classification(Struct, frozen=True, kw_only=True):
    """``outcome.classify``'s answer: what happened, why, and the log line that shows it."""

    outcome: Outcome
    reason: str
    line: str | None = None  # the matching log line (OOM signature etc.)
    contention: bool = False  # OOM while another process held most of the card


class Step(Struct, frozen=True, kw_only=True):
    """``outcome.next_step``'s answer."""

    kind: StepKind
    tier: int  # the tier the job is at after the step
    reason: str
    avoid_gpu: int | None = None  # contention: place elsewhere next time
    not_before: float | None = None  # retry backoff (absolute time)


class Placement(Struct, frozen=True, kw_only=True):
    job_id: str
    gpu: int | None  # None: no GPU (slot-only machines without GPUs still get an index)
    tier: int
    reason: str


class Wait(Struct, frozen=True, kw_only=True):
    """Why a queued job was not placed this tick (shown by ``status``)."""

    job_id: str
    reason: str
