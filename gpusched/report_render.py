"""How ``gpusched report`` shows a :class:`~gpusched.report.SuiteReport`: rich tables for the
terminal, and one row per attempt as CSV or JSON for pandas. rich is imported only by
:func:`render_report`."""

from __future__ import annotations

import csv
import io
import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from gpusched.report import COLUMNS, SuiteReport, attempt_records
from gpusched.views import STATE_STYLE, gib

OUTCOME_STYLE = {
    "ok": "green",
    "oom": "bold red",
    "host_oom": "magenta",
    "error": "red",
    "timeout": "red",
    "gpu_fault": "bold magenta",
    "disk_full": "bold yellow",
    "network": "yellow",
    "lost": "yellow",
    "cancelled": "dim",
    "running": "cyan",
}
MAX_JOB_ROWS = 200


# --------------------------------------------------------------------------- files


def write_csv(rep: SuiteReport, path: str) -> int:
    """Write one row per attempt (columns :data:`~gpusched.report.COLUMNS`) to ``path``
    (``-``: stdout); return the number of rows."""
    rows = attempt_records(rep)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(COLUMNS), lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    _write(path, buf.getvalue())
    return len(rows)


def write_json(rep: SuiteReport, path: str) -> int:
    """Write one JSON object per attempt, as a list (``pandas.read_json(path)`` loads it)."""
    rows = attempt_records(rep)
    _write(path, json.dumps(rows, indent=1) + "\n")
    return len(rows)


def _write(path: str, text: str) -> None:
    if path == "-":
        sys.stdout.write(text)
        return
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


# --------------------------------------------------------------------------- terminal


def render_report(rep: SuiteReport, *, top: int = 5) -> Any:
    """A rich renderable: summary lines, GPUs, jobs, the slowest jobs, jobs still failing."""
    from rich.console import Group
    from rich.text import Text

    if not rep.attempts:
        states = ", ".join(f"{n} {s}" for s, n in rep.states.items()) or "no jobs"
        return Text(f"suite {rep.suite}: {states}; no attempt has started yet")
    parts: list[Any] = [_summary(rep), _gpu_table(rep), _job_table(rep)]
    if top > 0:
        parts.append(_slowest_table(rep, top))
    if rep.failing:
        parts.append(_failing_table(rep))
    else:
        parts.append(Text("no job is failing", style="green"))
    return Group(*parts)


def _summary(rep: SuiteReport) -> Any:
    from rich.text import Text

    t = Text()
    t.append(f"suite {rep.suite}", style="bold")
    t.append(f"  {len(rep.jobs)} jobs: ")
    _counts(t, rep.states, STATE_STYLE)
    assert rep.start is not None and rep.end is not None
    t.append(f"\nwall time {duration(rep.wall_s)}  ({_clock(rep.start)} -> {_clock(rep.end)})")
    t.append(f"\nattempts {len(rep.attempts)}: ")
    _counts(t, rep.outcomes, OUTCOME_STYLE)
    per_job = ", ".join(f"{n} job{'s' * (n != 1)} x {k}" for k, n in rep.attempts_per_job.items())
    t.append(f"   per job: {per_job}")
    if rep.finished_at:
        t.append("\nfinished at tier: " + ", ".join(f"{k} {v}" for k, v in rep.finished_at.items()))
    lost_pct = 100 * rep.lost_gpu_hours / rep.gpu_hours if rep.gpu_hours else 0.0
    t.append(f"\n{gpu_time(rep.gpu_hours)} used, ")
    t.append(
        f"{gpu_time(rep.lost_gpu_hours, like=rep.gpu_hours)} lost ({lost_pct:.0f} %)",
        style="bold red" if rep.lost_gpu_hours else "",
    )
    t.append(" to attempts that did not end ok and were not resumed", style="dim")
    return t


def _counts(t: Any, counts: dict[str, int], styles: dict[str, str]) -> None:
    items = [(k, v) for k, v in counts.items() if v]
    for i, (k, v) in enumerate(items):
        t.append(f"{v} {k}", style=styles.get(k, ""))
        if i < len(items) - 1:
            t.append(", ")


def _gpu_table(rep: SuiteReport) -> Any:
    from rich.table import Table

    t = Table(title="GPUs", title_justify="left")
    for col in ("GPU", "slots", "attempts", "busy", "slot occupancy", "util", "peak memory GiB"):
        t.add_column(col, justify="right" if col != "GPU" else "left")
    for g in rep.gpus:
        peak = "?" if g.peak_mib is None else f"{gib(g.peak_mib)}"
        if g.total_mib and g.peak_mib is not None:
            peak += f" / {gib(g.total_mib)}"
        if g.peak_source:
            peak += f" ({g.peak_source})"
        t.add_row(
            "none" if g.gpu is None else str(g.gpu),
            str(g.slots),
            str(g.attempts),
            f"{100 * g.busy_fraction:.0f} %",
            f"{100 * g.occupancy:.0f} %",
            "" if g.util_pct is None else f"{g.util_pct} %",
            peak,
        )
    return t


def _job_table(rep: SuiteReport) -> Any:
    from rich.table import Table
    from rich.text import Text

    t = Table(title=f"Jobs ({len(rep.jobs)})", title_justify="left")
    for col in ("job", "state", "attempts", "tier", "tiers: outcomes", "GPU time", "lost"):
        t.add_column(col, overflow="fold")
    for j in rep.jobs[:MAX_JOB_ROWS]:
        t.add_row(
            j.id,
            Text(j.state, style=STATE_STYLE.get(j.state, "")),
            str(j.attempts),
            j.tier or "",
            j.path,
            duration(j.gpu_s),
            duration(j.lost_s) if j.lost_s else "",
        )
    if len(rep.jobs) > MAX_JOB_ROWS:
        t.caption = f"... {len(rep.jobs) - MAX_JOB_ROWS} more jobs (use --csv or --json)"
    return t


def _slowest_table(rep: SuiteReport, top: int) -> Any:
    from rich.table import Table

    t = Table(title=f"Slowest jobs (top {top})", title_justify="left")  # (a title wraps at the table's width)
    for col in ("job", "first start -> last end", "attempts", "tier", "state"):
        t.add_column(col)
    for j in rep.slowest(top):
        t.add_row(j.id, duration(j.span_s), str(j.attempts), j.tier or "", j.state)
    return t


def _failing_table(rep: SuiteReport) -> Any:
    from rich.table import Table

    t = Table(title=f"Still failing ({len(rep.failing)})", title_justify="left", title_style="bold red")
    for col in ("job", "tier", "why", "log"):
        t.add_column(col, overflow="fold")
    for j in rep.failing:
        why = j.reason or ""
        if j.line and j.line not in why:
            why = f"{why}: {j.line}" if why else j.line
        t.add_row(j.id, j.tier or "", why, j.log or "")
    return t


def gpu_time(hours: float, *, like: float | None = None) -> str:
    """``12.3 GPU-h``, ``0.52 GPU-h``, or ``2.5 GPU-min`` below a tenth of an hour; in the
    unit ``like`` would be written in, where given (a part beside its whole)."""
    ref = hours if like is None else like
    if ref >= 10:
        return f"{hours:.1f} GPU-h"
    if ref >= 0.1 or ref == 0:
        return f"{hours:.2f} GPU-h"
    return f"{hours * 60:.1f} GPU-min"


def duration(s: float) -> str:
    """``1:02:03`` / ``2:03`` (h:mm:ss, m:ss)."""
    secs = round(s)
    h, rem = divmod(secs, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def _clock(t: float) -> str:
    return datetime.fromtimestamp(t).strftime("%a %H:%M:%S")
