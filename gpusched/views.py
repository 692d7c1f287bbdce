"""What ``status`` shows: one plain document (stable JSON keys) and its rich rendering.

``status_doc`` is plain data built from the store and a probe snapshot; ``render_status``
turns it into rich tables. rich is imported only by the renderers, so ``status --json``
stays fast.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

from gpusched import memory, memwatch
from gpusched.attempt import AttemptPaths
from gpusched.model import GpuState, JobState
from gpusched.placement import DEFAULT_HEADROOM_FRAC
from gpusched.store import AttemptRow, JobRow, Store, SuiteRow

MAX_TABLE_JOBS = 40  # rows of the plain table: running and failed first; the rest is summed up by state


def gib(mib: int | None) -> str:
    return "?" if mib is None else f"{mib / 1024:.1f}"


def job_doc(job: JobRow, last: AttemptRow | None, *, now: float, with_line: bool = True) -> dict[str, Any]:
    runtime_s = None
    if last is not None and last.started_at:
        runtime_s = (
            round((last.ended_at or now) - last.started_at, 1) if job.state is not JobState.QUEUED else None
        )
    log_path = str(AttemptPaths(Path(last.dir)).output) if last else None
    doc: dict[str, Any] = {
        "id": job.id,
        "suite": job.suite,
        "name": job.name,
        "state": job.state.value,
        "tier": last.tier_name if last and last.tier == job.tier else None,
        "tier_index": job.tier,
        "attempt": job.attempts,
        "gpu": last.gpu if last and job.state is JobState.RUNNING else (last.gpu if last else None),
        "outcome": job.outcome,
        "reason": job.wait_reason if job.state is JobState.QUEUED and job.wait_reason else job.reason,
        "line": job.line,
        "log": log_path,
        "runtime_s": runtime_s,
        "started_at": last.started_at if last else None,
        "ended_at": job.ended_at,
        "predicted_mib": last.predicted_mib if last else None,
        "prediction_source": last.prediction_source if last else None,
        "peak_mib": last.peak_mib if last else None,
        "cancel_requested": job.cancel_requested,
        "backend_handle": last.handle if last else None,
    }
    if with_line and job.state is JobState.RUNNING and last is not None:
        doc["last_line"] = AttemptPaths(Path(last.dir)).last_line()[:200]
    return doc


def tier_names(suites: dict[str, SuiteRow], job: JobRow) -> tuple[str, int]:
    s = suites.get(job.suite)
    if s is None or not s.suite.tiers:
        return (str(job.tier), 1)
    t = min(job.tier, len(s.suite.tiers) - 1)
    return (s.suite.tiers[t].name, len(s.suite.tiers))


def status_doc(
    store: Store,
    gpus: list[GpuState],
    *,
    daemon: dict[str, Any] | None,
    suite: str | None = None,
    notice: str | None = None,
    now: float | None = None,
    job_limit: int | None = None,
    trees: memwatch.TreesFn | None = None,
    host: memory.HostMemory | None = None,
    table_rows: int | None = None,
) -> dict[str, Any]:
    """The whole status as plain data. Keys of ``gpus`` and ``jobs`` entries are stable.
    ``jobs`` lists every job in submission order, or with ``table_rows`` only that many, the
    ones the table shows first (:meth:`Store.jobs_first`): then the cost does not grow with
    the store. ``trees`` and ``host`` replace the real process table and host RAM (tests)."""
    now = time.time() if now is None else now
    suites = {s.name: s for s in store.suites()}
    if table_rows is None:
        jobs = store.jobs(suite=suite, limit=job_limit)
    else:
        jobs = store.jobs_first(suite=suite, limit=table_rows)
    last = store.last_attempts([j.id for j in jobs if j.attempts])
    live = store.live_attempts()
    running_on = Counter(a.gpu for a in live if a.gpu is not None)
    active = store.active_suites(suite=suite) or set(suites)
    slots: dict[int, int] = {}
    for s in suites.values():
        if s.name in active:
            for g, n in zip(s.gpu_plan.gpus, s.gpu_plan.slots, strict=True):
                slots[g] = max(slots.get(g, 0), n)
    att = attribution(gpus, live, trees)
    gdocs = []
    indices = sorted({g.index for g in gpus} | set(slots))
    by_index = {g.index: g for g in gpus}
    for i in indices:
        gpu = by_index.get(i)
        gdocs.append(
            {
                "index": i,
                "uuid": gpu.uuid if gpu else None,
                "name": gpu.name if gpu else None,
                "total_mib": gpu.total_mib if gpu else None,
                "free_mib": gpu.free_mib if gpu else None,
                "used_mib": gpu.used_mib if gpu else None,
                "util_pct": gpu.util_pct if gpu else None,
                "slots": slots.get(i, 0),
                "running": running_on[i],
                "outside_mib": att.outside_mib.get(i, 0) if gpu else None,  # held by processes not ours
                "processes": [
                    _process_doc(att, i, p.pid, p.used_mib) for p in (gpu.processes if gpu else ())
                ],
            }
        )
    jdocs = []
    for j in jobs:
        d = job_doc(j, last.get(j.id), now=now)
        name, n = tier_names(suites, j)
        d["tier"] = name
        d["tiers"] = n
        d["start_tier"] = None
        jdocs.append(d)
    _queued_predictions(store, jobs, jdocs, suites, gpus, att)
    return {
        "daemon": daemon,
        "notice": notice,
        "counts": store.counts(suite=suite),
        "draining": bool(store.flag("draining")),
        "host": host_doc(store, host, now=now),
        "gpus": gdocs,
        "jobs": jdocs,
    }


def attribution(
    gpus: list[GpuState], live: list[AttemptRow], trees: memwatch.TreesFn | None
) -> memory.Attribution:
    """Which GPU processes belong to which running job: its wrapper and everything below it."""
    if not any(g.processes for g in gpus):
        return memory.attribute(gpus, [])
    pids = (trees or memwatch.attempt_trees)(live)
    trees_of = [
        memory.Tree(
            attempt_id=a.id, job_id=a.job_id, gpu=a.gpu, pids=_wrapper(a) | pids.get(a.id, frozenset())
        )
        for a in live
    ]
    return memory.attribute(gpus, trees_of)


def _wrapper(a: AttemptRow) -> frozenset[int]:
    pid = (a.handle or {}).get("pid")
    return frozenset({int(pid)}) if pid else frozenset()


def _process_doc(att: memory.Attribution, gpu: int, pid: int, used_mib: int | None) -> dict[str, Any]:
    owner = att.owner(gpu, pid)
    job = owner.job_id if owner else None
    return {"pid": pid, "used_mib": used_mib, "ours": owner is not None, "job": job}


def _queued_predictions(
    store: Store,
    jobs: list[JobRow],
    jdocs: list[dict[str, Any]],
    suites: dict[str, SuiteRow],
    gpus: list[GpuState],
    att: memory.Attribution,
) -> None:
    """Queued jobs get the prediction (and start tier) the scheduler would place them with."""
    queued = [j for j in jobs if j.state is JobState.QUEUED]
    if not queued:
        return
    empty = memory.rooms(gpus, {}, DEFAULT_HEADROOM_FRAC)
    demand = memwatch.demands(store, queued, suites.get, gpus, empty, headroom_frac=DEFAULT_HEADROOM_FRAC)
    for d in jdocs:
        dm = demand.get(d["id"])
        if dm is None:
            continue
        pred = dm.prediction()
        d["predicted_mib"], d["prediction_source"] = pred.mib, pred.source
        d["start_tier"] = dm.view.tiers[dm.view.tier].name


def host_doc(store: Store, host: memory.HostMemory | None, *, now: float) -> dict[str, Any]:
    """Host RAM as launches see it: available, the minimum, and why launches wait (or None)."""
    host = host or memwatch.host_memory()
    limit = memwatch.host_limit_from_env()
    hold = memwatch.host_hold(store)
    return {
        "available_mib": host.available_mib,
        "total_mib": host.total_mib,
        "min_available_mib": memory.host_min_mib(host.total_mib, limit),
        "held_after_oom_of": hold[1] if hold else None,
        "wait": memory.host_wait(host, limit, oom_hold=hold, now=now),
    }


# --------------------------------------------------------------------------- rich


STATE_STYLE = {
    "queued": "yellow",
    "running": "cyan",
    "succeeded": "green",
    "failed": "bold red",
    "cancelled": "magenta",
}


def render_status(doc: dict[str, Any], *, max_jobs: int = MAX_TABLE_JOBS) -> Any:
    """A rich renderable: daemon line, GPU table, job table."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    parts: list[Any] = []
    d = doc["daemon"]
    head = Text()
    if d:
        head.append(f"daemon pid {d.get('pid')}  probe {d.get('probe')}", style="bold")
    else:
        head.append("daemon not running", style="bold red")
        head.append("  (it starts with `gpusched submit`, or `gpusched daemon start`)")
    if doc.get("draining"):
        head.append("  DRAINING: no new launches (`gpusched drain --off` resumes)", style="bold yellow")
    c = doc["counts"]
    head.append("\n" + "  ".join(f"{k} {v}" for k, v in c.items()))
    parts.append(head)
    if doc.get("notice"):
        parts.append(Text(doc["notice"], style="dim"))
    if (doc.get("host") or {}).get("wait"):
        parts.append(Text(f"launches wait: {doc['host']['wait']}", style="bold yellow"))
    if doc["gpus"]:
        gt = Table(title="GPUs", title_justify="left", expand=False)
        for col in ("GPU", "memory used / total GiB", "free GiB", "util", "slots", "outside processes"):
            gt.add_column(col)
        for g in doc["gpus"]:
            outsiders = [p for p in g["processes"] if not p["ours"]]
            gt.add_row(
                str(g["index"]),
                f"{gib(g['used_mib'])} / {gib(g['total_mib'])}",
                gib(g["free_mib"]),
                "?" if g["util_pct"] is None else f"{g['util_pct']}%",
                f"{g['running']}/{g['slots']}",
                ", ".join(f"pid {p['pid']} {gib(p['used_mib'])} GiB" for p in outsiders) or "",
            )
        parts.append(gt)
    jobs = doc["jobs"]
    total = sum(doc["counts"].values())
    jt = Table(title=f"Jobs ({total})", title_justify="left")
    cols = ("job", "state", "GPU", "tier", "attempt", "runtime", "memory GiB", "outcome / why / last line")
    for col in cols:
        jt.add_column(col, overflow="fold")
    shown = _pick_rows(jobs, max_jobs)
    for j in shown:
        why = j.get("last_line") if j["state"] == "running" else (j.get("reason") or "")
        if j["state"] in ("failed",) and j.get("line"):
            why = f"{j.get('reason')}: {j['line']}"
        jt.add_row(
            j["id"],
            Text(
                j["state"] + (" (stopping)" if j.get("cancel_requested") else ""),
                style=STATE_STYLE.get(j["state"], ""),
            ),
            "" if j["gpu"] is None or j["state"] != "running" else str(j["gpu"]),
            f"{j['tier']} ({j['tier_index'] + 1}/{j['tiers']})" if j.get("tiers", 1) > 1 else f"{j['tier']}",
            f"{j['attempt']}" if j["attempt"] else "",
            _dur(j.get("runtime_s")),
            memory_cell(j),
            Text(
                (f"[{j['outcome']}] " if j.get("outcome") and j["state"] != "running" else "") + (why or "")
            ),
        )
    parts.append(jt)
    if len(shown) < total:
        parts.append(Text(f"... {_hidden(doc['counts'], shown)} (use --json or --suite)", style="dim"))
    return Group(*parts)


def _hidden(counts: dict[str, int], shown: list[dict[str, Any]]) -> str:
    """``"7786 more jobs: 7772 queued, 14 succeeded"``: what the table leaves out, by state."""
    seen = Counter(j["state"] for j in shown)
    left = {state: n - seen[state] for state, n in counts.items() if n > seen[state]}
    return f"{sum(left.values())} more jobs: " + ", ".join(f"{n} {state}" for state, n in left.items())


def memory_cell(j: dict[str, Any]) -> str:
    """``"~9.0 task"`` (queued: the prediction and its source), ``"8.1/~9.0 task"`` (running:
    peak so far / prediction), ``"8.1"`` (ended: its peak)."""
    pred, peak = j.get("predicted_mib"), j.get("peak_mib")
    guess = f"~{gib(pred)} {j.get('prediction_source') or ''}".strip() if pred is not None else ""
    if j["state"] == "queued":
        start = j.get("start_tier")
        return guess + (f" at {start}" if start and start != j.get("tier") else "")
    if j["state"] == "running":
        return f"{gib(peak)}/{guess}" if peak is not None and guess else guess
    return gib(peak) if peak is not None else ""


def _pick_rows(jobs: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """Running and failed jobs first, then queued, then the rest, up to ``n`` rows."""
    order = {"running": 0, "failed": 1, "queued": 2, "cancelled": 3, "succeeded": 4}
    return sorted(jobs, key=lambda j: order.get(j["state"], 9))[:n] if len(jobs) > n else jobs


def _dur(s: float | None) -> str:
    if s is None:
        return ""
    s = int(s)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"
