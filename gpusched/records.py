"""The store's row records: frozen structs built from SQLite rows (``from_row``), and
what the scheduler hands the store (:class:`NewAttempt`, :class:`Ending`).

:mod:`gpusched.store` imports them, so ``from gpusched.store import JobRow`` keeps working.
"""

from __future__ import annotations

import json
import sqlite3
from functools import cached_property
from typing import Any

from msgspec import Struct

from gpusched import codec
from gpusched.model import AttemptState, Classification, ExitRecord, GpuPlan, JobSpec, JobState, Step, Suite


class SuiteActivity(Struct):
    """Whether a suite has jobs queued or running, when its last job ended (epoch seconds),
    and, where asked for, its jobs per state (:meth:`Store.suite_activity`)."""

    name: str
    active: bool
    last: float
    counts: dict[str, int] = {}


def gpu_plan_of(gpus: str, slots: str) -> GpuPlan:
    """A suite's GPU plan from its row's ``gpus`` and ``slots`` columns (JSON lists)."""
    return GpuPlan(gpus=tuple(json.loads(gpus)), slots=tuple(json.loads(slots)))


class SuiteRow(Struct, frozen=True, kw_only=True):
    name: str
    plan_path: str
    cwd: str
    backend: str
    gpu_plan: GpuPlan
    suite: Suite
    env_path: str | None
    options: dict[str, Any]
    submitted_at: float

    @classmethod
    def from_row(cls, r: sqlite3.Row) -> SuiteRow:
        return cls(
            name=r["name"],
            plan_path=r["plan_path"],
            cwd=r["cwd"],
            backend=r["backend"],
            gpu_plan=gpu_plan_of(r["gpus"], r["slots"]),
            suite=codec.suite_from_json(r["spec"]),
            env_path=r["env_path"],
            options=json.loads(r["options"] or "{}"),
            submitted_at=r["submitted_at"],
        )


class JobRow(Struct, frozen=True, kw_only=True, dict=True):  # dict: the cached spec
    seq: int
    id: str
    suite: str
    name: str
    task: str
    spec_json: str  # decoded on first use of ``spec`` (a tick and status never need it)
    priority: int
    state: JobState
    tier: int
    attempts: int
    errors: int
    lost: int
    outcome: str | None
    reason: str | None
    line: str | None
    wait_reason: str | None
    avoid_gpu: int | None
    not_before: float | None
    cancel_requested: bool
    created_at: float
    updated_at: float
    ended_at: float | None

    @cached_property
    def spec(self) -> JobSpec:
        """The job as submitted (JSON-decoded once, on first use)."""
        return codec.job_from_json(self.spec_json)

    @classmethod
    def from_row(cls, r: sqlite3.Row) -> JobRow:
        d = _as_dict(r)
        d["spec_json"] = d.pop("spec")
        d["state"] = JobState(d["state"])
        d["cancel_requested"] = bool(d["cancel_requested"])
        return cls(**d)


class AttemptRow(Struct, frozen=True, kw_only=True):
    id: int
    job_id: str
    n: int
    tier: int
    tier_name: str
    gpu: int | None
    gpu_uuid: str | None
    backend: str
    dir: str
    token: str
    state: AttemptState
    handle: dict[str, Any] | None
    placement_reason: str | None
    predicted_mib: int | None
    prediction_source: str | None
    launched_at: float
    started_at: float | None
    ended_at: float | None
    exit_code: int | None
    signal: int | None
    outcome: str | None
    reason: str | None
    line: str | None
    peak_mib: int | None

    @classmethod
    def from_row(cls, r: sqlite3.Row) -> AttemptRow:
        d = _as_dict(r)
        d["state"] = AttemptState(d["state"])
        d["handle"] = json.loads(d["handle"]) if d["handle"] else None
        return cls(**d)


class SubmitResult(Struct, frozen=True, kw_only=True):
    queued: tuple[str, ...]
    requeued: tuple[str, ...]  # finished jobs queued again (--rerun)
    skipped: tuple[tuple[str, str], ...]  # (job id, its state) not queued anew
    updated: tuple[str, ...] = ()  # of those, queued jobs whose spec the plan submitted now changed
    #: the suite's GPU plan before this submit, as "1,1 on GPUs 0,1", when this one changed it
    plan_before: str | None = None
    #: the suite's backend before this submit, when this one changed it
    backend_before: str | None = None
    #: the directory the suite was last submitted from, when this submit came from another one
    #: (its finished jobs ran there, and their logs are there)
    moved_from: str | None = None


class NewAttempt(Struct, frozen=True, kw_only=True):
    """What the scheduler decided to launch; recorded before anything starts."""

    job_id: str
    tier: int
    tier_name: str
    gpu: int | None
    gpu_uuid: str | None
    backend: str
    dir: str
    token: str
    placement_reason: str
    predicted_mib: int | None = None
    prediction_source: str | None = None


class Ending(Struct, frozen=True, kw_only=True):
    """How an attempt ended and where its job goes next, as the scheduler decided; recorded
    by :meth:`Store.finish_attempts`. ``job``: the attempt's job as the caller read it (a
    tick's reaps read their jobs in one query), else read there. ``count_lost=False``: a
    ``lost`` outcome does not count towards the job's losses (an attempt that provably never
    started)."""

    attempt_id: int
    exit: ExitRecord | None
    result: Classification
    step: Step
    job: JobRow | None = None
    count_lost: bool = True


class GpuOut(Struct, frozen=True, kw_only=True):
    """A GPU out of service: since when, after how many faults in a row, the last one's job
    and why."""

    since: float
    faults: int
    job_id: str
    why: str


def _as_dict(r: sqlite3.Row) -> dict[str, Any]:
    """``dict(r)``, three times faster: ``dict(r)`` looks every column up by name (a scan
    of the names), zip pairs them by position (``status`` reads 10k rows)."""
    return dict(zip(r.keys(), r, strict=True))
