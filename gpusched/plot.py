"""The night as a picture: a timeline (Gantt) with one lane per GPU slot, a bar per attempt
coloured by its outcome and labelled by job and tier, and the GPU memory under it.

matplotlib is the optional ``plot`` extra (``pip install 'gpusched[plot]'``) and is imported
only inside :func:`timeline` / :func:`require`, never by ``import gpusched``. The figure is
drawn on the Agg canvas without pyplot: no display, no global backend switched.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gpusched import report as report_mod
from gpusched.errors import UsageError
from gpusched.report import AttemptLine, SuiteReport

FORMATS = (".png", ".svg", ".pdf")
MISSING = "--plot needs matplotlib, which is not installed: pip install 'gpusched[plot]'"
COLORS = {
    "ok": "#43a047",
    "oom": "#e53935",
    "host_oom": "#8e24aa",
    "error": "#fb8c00",
    "timeout": "#6d4c41",
    "gpu_fault": "#000000",
    "disk_full": "#00897b",
    "network": "#fdd835",
    "lost": "#757575",
    "cancelled": "#b0bec5",
    "running": "#1e88e5",
}
LANE_IN = 0.34  # height of one slot lane, inches
MEMORY_IN = 0.65  # height of one GPU's memory panel, inches
WIDTH_IN = 12.0
LABEL_PT = 7.0


def require(path: str | Path | None = None) -> None:
    """Raise :class:`UsageError` (one line, exit 2) unless matplotlib imports and ``path``
    ends in a format we write. Call it before doing any work."""
    if path is not None and Path(path).suffix.lower() not in FORMATS:
        raise UsageError(f"--plot {path}: write a {', '.join(FORMATS)} file, e.g. --plot night.png")
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        raise UsageError(MISSING) from e


def timeline(source: SuiteReport | Iterable[Any], path: str | Path, *, title: str | None = None) -> Path:
    """Draw ``source`` (a :class:`SuiteReport`, or attempt rows :func:`report.compute` takes)
    to ``path`` (.png, .svg or .pdf); return the path."""
    require(path)
    rep = source if isinstance(source, SuiteReport) else report_mod.compute(source)
    if not rep.attempts:
        raise UsageError(f"suite {rep.suite or '?'}: no attempt has started yet, nothing to plot")
    from matplotlib.figure import Figure

    lanes = _lane_rows(rep)
    memory = _memory_series(rep)
    ratios = [LANE_IN * len(lanes) + 0.5] + [MEMORY_IN] * len(memory)
    fig = Figure(figsize=(WIDTH_IN, sum(ratios) + 1.2 + 0.3 * bool(memory)), layout="constrained")
    axes = fig.subplots(len(ratios), 1, sharex=True, height_ratios=ratios, squeeze=False)[:, 0]
    unit_s, unit = _time_unit(rep.wall_s)
    _draw_gantt(axes[0], rep, lanes, unit_s)
    if memory:
        _draw_memory(axes[1:], memory, rep, unit_s)
    axes[-1].set_xlabel(f"time since the first attempt started ({unit})")
    axes[0].set_title(title or _title(rep), loc="left", fontsize=10)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with _rc():
        fig.savefig(out, dpi=110)
    return out


# --------------------------------------------------------------------------- gantt


def _lane_rows(rep: SuiteReport) -> list[tuple[int | None, int]]:
    """(gpu, lane) from top to bottom: every slot of the plan, used or not."""
    rows: list[tuple[int | None, int]] = []
    for g in rep.gpus:
        rows.extend((g.gpu, k) for k in range(max(g.slots, g.lanes)))
    return rows


def _draw_gantt(ax: Any, rep: SuiteReport, lanes: list[tuple[int | None, int]], unit_s: float) -> None:
    from matplotlib.patches import Patch

    y_of = {key: len(lanes) - 1 - i for i, key in enumerate(lanes)}
    _shade_gpus(ax, lanes, y_of)
    x_max = max(rep.wall_s / unit_s, 1e-9)
    per_in = x_max / (WIDTH_IN - 1.6)  # data units per inch of bar (the y labels take the rest)
    for a in rep.attempts:
        y = y_of[(a.gpu, a.lane)]
        left, width = (a.start - (rep.start or 0.0)) / unit_s, a.duration_s / unit_s
        ax.barh(
            y,
            width,
            left=left,
            height=0.78,
            color=COLORS.get(a.outcome, "#9e9e9e"),
            edgecolor="white",
            linewidth=0.6,
            hatch="//" if a.outcome == "running" else None,
        )
        label = _fit_label(a, width / per_in)
        if label:
            ax.text(
                left + width / 2,
                y,
                label,
                ha="center",
                va="center",
                fontsize=LABEL_PT,
                color="black" if a.outcome in ("cancelled",) else "white",
                clip_on=True,
            )
    ax.set_yticks(range(len(lanes)), [_lane_name(g, k) for g, k in reversed(lanes)], fontsize=8)
    ax.set_ylim(-0.6, len(lanes) - 0.4)
    ax.set_xlim(0, x_max * 1.01)
    ax.grid(axis="x", color="#dddddd", linewidth=0.6)
    ax.set_axisbelow(True)
    present = [k for k in report_mod.OUTCOMES if rep.outcomes.get(k)]
    ax.legend(
        handles=[Patch(color=COLORS[k], label=f"{k} ({rep.outcomes[k]})") for k in present],
        loc="lower right",
        bbox_to_anchor=(1.0, 1.0),
        ncol=len(present),
        fontsize=8,
        frameon=False,
    )


def _shade_gpus(
    ax: Any, lanes: list[tuple[int | None, int]], y_of: dict[tuple[int | None, int], int]
) -> None:
    gpus = list(dict.fromkeys(g for g, _ in lanes))
    for i, g in enumerate(gpus):
        ys = [y_of[key] for key in lanes if key[0] == g]
        if i % 2:
            ax.axhspan(min(ys) - 0.5, max(ys) + 0.5, color="#f3f3f3", zorder=0)
        if i:
            ax.axhline(max(ys) + 0.5, color="#bbbbbb", linewidth=0.8)


def _lane_name(gpu: int | None, lane: int) -> str:
    return f"{'no GPU' if gpu is None else f'GPU {gpu}'} · slot {lane + 1}"


def _fit_label(a: AttemptLine, width_in: float) -> str:
    """``job tier`` if it fits in the bar, else the tier alone, else nothing."""
    name = a.job.split("/", 1)[-1]
    char_in = LABEL_PT * 0.62 / 72  # average glyph width of the default sans font
    for text in (f"{name} {a.tier}", a.tier):
        if (len(text) + 1) * char_in <= width_in:
            return text
    return ""


# --------------------------------------------------------------------------- memory


def _memory_series(rep: SuiteReport) -> list[tuple[int | None, str, list[float], list[float]]]:
    """Per GPU: (gpu, kind, times, GiB). ``sampled``: the daemon's samples, where they saw
    memory; else ``attempt peaks``: the sum of the peaks its running attempts reported."""
    out = []
    for g in rep.gpus:
        samples = [s for s in rep.samples if s.gpu == g.gpu and s.used_mib is not None]
        if any(s.used_mib for s in samples):
            out.append(
                (g.gpu, "sampled", [s.at for s in samples], [(s.used_mib or 0) / 1024 for s in samples])
            )
            continue
        times, gib = _peak_steps([a for a in rep.attempts if a.gpu == g.gpu])
        if times:
            out.append((g.gpu, "attempt peaks", times, gib))
    return out


def _peak_steps(attempts: list[AttemptLine]) -> tuple[list[float], list[float]]:
    deltas: dict[float, int] = {}
    for a in attempts:
        if a.peak_mib:
            deltas[a.start] = deltas.get(a.start, 0) + a.peak_mib
            deltas[a.end] = deltas.get(a.end, 0) - a.peak_mib
    times, level, cur = [], [], 0
    for t in sorted(deltas):
        cur += deltas[t]
        times.append(t)
        level.append(cur / 1024)
    return times, level


def _draw_memory(
    axes: Any, series: list[tuple[int | None, str, list[float], list[float]]], rep: SuiteReport, unit_s: float
) -> None:
    """One small panel per GPU, same scale: its memory curve, its card size, its OOMs."""
    t0 = rep.start or 0.0
    totals = {g.gpu: g.total_mib for g in rep.gpus}
    top = max([*(t / 1024 for t in totals.values() if t), *(max(v, default=0) for *_, v in series), 1.0])
    for ax, (gpu, kind, times, gib) in zip(axes, series, strict=True):
        xs = [(t - t0) / unit_s for t in times]
        style = {"color": "#1565c0", "linewidth": 1.2}
        if kind == "sampled":
            ax.plot(xs, gib, "-", marker=".", markersize=3, label="used (sampled)", **style)
        else:
            ax.plot(xs, gib, "--", drawstyle="steps-post", label="sum of attempt peaks", **style)
            ax.fill_between(xs, gib, step="post", color="#1565c0", alpha=0.08)
        total = totals.get(gpu)
        if total:
            ax.axhline(total / 1024, color="#999999", linestyle=":", linewidth=1, label="card size")
        ooms = [(a.end - t0) / unit_s for a in rep.attempts if a.gpu == gpu and a.outcome == "oom"]
        if ooms:
            ax.plot(ooms, [top * 0.98] * len(ooms), "v", color=COLORS["oom"], markersize=5, label="OOM")
        ax.set_ylim(0, top * 1.08)
        ax.set_ylabel(
            f"{'no GPU' if gpu is None else f'GPU {gpu}'}\nGiB",
            fontsize=7,
            rotation=0,
            ha="right",
            va="center",
        )
        ax.tick_params(axis="y", labelsize=7)
        ax.grid(color="#eeeeee", linewidth=0.6)
    handles: dict[str, Any] = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(lab, h)
    axes[0].legend(
        handles.values(),
        handles.keys(),
        fontsize=7,
        ncol=len(handles),
        loc="lower right",
        bbox_to_anchor=(1.0, 1.0),
        frameon=False,
        title="GPU memory",
        title_fontsize=7,
    )


# --------------------------------------------------------------------------- helpers


def _time_unit(wall_s: float) -> tuple[float, str]:
    if wall_s <= 180:
        return 1.0, "s"
    if wall_s <= 3 * 3600:
        return 60.0, "min"
    return 3600.0, "h"


def _title(rep: SuiteReport) -> str:
    from datetime import datetime

    from gpusched.report_render import duration, gpu_time

    start = rep.start or 0.0
    # a simulated night starts its clock at 0: no calendar date to show then
    started = datetime.fromtimestamp(start).strftime("%Y-%m-%d %H:%M") if start > 1e9 else f"t={start:g} s"
    return (
        f"{rep.suite or 'suite'}: {len(rep.jobs)} jobs, {len(rep.attempts)} attempts, "
        f"wall {duration(rep.wall_s)} from {started}; "
        f"{gpu_time(rep.gpu_hours)} used, {gpu_time(rep.lost_gpu_hours)} lost"
    )


def _rc() -> Any:
    import matplotlib

    # text stays text in SVG (small, searchable); no random ids, so the same night draws the same file
    return matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "gpusched"})
