"""JSON round-trips of the plan records stored in the database.

A submitted suite is snapshotted (the plan file may change on disk afterwards); unknown
keys from a newer writer are ignored so an older reader still opens the row.
"""

from __future__ import annotations

import json
from dataclasses import asdict, fields
from typing import Any

from gpusched.model import BatchKeys, BatchRule, JobSpec, ResumeSpec, RetryPolicy, Suite, Tier


def _known(cls: type, d: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in d.items() if k in names}


def tier_from_dict(d: dict[str, Any]) -> Tier:
    d = _known(Tier, d)
    batch = d.get("batch")
    d["batch"] = BatchRule(**_known(BatchRule, batch)) if batch else None
    return Tier(**d)


def job_to_json(job: JobSpec) -> str:
    return json.dumps(asdict(job), sort_keys=True, default=str)


def job_from_json(text: str) -> JobSpec:
    return JobSpec(**_known(JobSpec, json.loads(text)))


def suite_to_json(suite: Suite) -> str:
    d = asdict(suite)
    d.pop("jobs", None)  # jobs live in their own rows
    return json.dumps(d, sort_keys=True, default=str)


def suite_from_json(text: str) -> Suite:
    d = _known(Suite, json.loads(text))
    d["tiers"] = tuple(tier_from_dict(t) for t in d.get("tiers", ()))
    d["batch_keys"] = BatchKeys(**_known(BatchKeys, d.get("batch_keys") or {}))
    d["resume"] = ResumeSpec(**_known(ResumeSpec, d["resume"])) if d.get("resume") else None
    d["retry"] = RetryPolicy(**_known(RetryPolicy, d.get("retry") or {}))
    d["jobs"] = ()
    return Suite(**d)
