"""JSON round-trips of the plan records stored in the database.

A submitted suite is snapshotted (the plan file may change on disk afterwards); unknown
keys from a newer writer are ignored so an older reader still opens the row.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from gpusched.model import BatchKeys, BatchRule, JobSpec, Limits, ResumeSpec, RetryPolicy, Suite, Tier


def _known(cls: type[msgspec.Struct], d: dict[str, Any]) -> dict[str, Any]:
    names = cls.__struct_fields__
    return {k: v for k, v in d.items() if k in names}


def _plain(record: msgspec.Struct) -> dict[str, Any]:
    """``record`` as JSON-ready builtins, nested records too (anything else YAML can give a
    config, such as a date, as its ``str``)."""
    d: dict[str, Any] = msgspec.to_builtins(record, enc_hook=str)
    return d


def tier_from_dict(d: dict[str, Any]) -> Tier:
    d = _known(Tier, d)
    batch = d.get("batch")
    d["batch"] = BatchRule(**_known(BatchRule, batch)) if batch else None
    return Tier(**d)


def job_to_json(job: JobSpec) -> str:
    return json.dumps(_plain(job), sort_keys=True)


def job_from_json(text: str) -> JobSpec:
    return JobSpec(**_known(JobSpec, json.loads(text)))


def suite_to_json(suite: Suite) -> str:
    """The suite's row text: a :class:`Suite`'s own fields only, without its jobs (they live in
    their own rows) or what a subclass adds (a plan's ``pairs``, one entry a job, which every
    read of the suites would parse again: 2 ms a `status` for a 10k-point matrix)."""
    d = _known(Suite, _plain(suite))
    d.pop("jobs", None)
    return json.dumps(d, sort_keys=True, default=str)


def suite_from_json(text: str) -> Suite:
    d = _known(Suite, json.loads(text))
    d["tiers"] = tuple(tier_from_dict(t) for t in d.get("tiers", ()))
    d["batch_keys"] = BatchKeys(**_known(BatchKeys, d.get("batch_keys") or {}))
    d["resume"] = ResumeSpec(**_known(ResumeSpec, d["resume"])) if d.get("resume") else None
    d["retry"] = RetryPolicy(**_known(RetryPolicy, d.get("retry") or {}))
    d["limits"] = Limits(**_known(Limits, d.get("limits") or {}))
    d["jobs"] = ()
    return Suite(**d)
