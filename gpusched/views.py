"""What ``status`` shows: one plain document (stable JSON keys) and its text rendering.

:func:`status` is built from the store and a probe snapshot; its job entries are JSON text
that SQLite builds (:func:`status_rows.job_entries`), which ``status --json`` prints as they come
(:meth:`Status.text`): it lists 10k jobs in the time of one query.
``format_status`` turns it into boxed tables with plain string formatting, no rich: a
``status`` costs little more than the interpreter's start.
"""

from __future__ import annotations

import functools
import json
import os
import time
import unicodedata
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any, TextIO

from msgspec.structs import asdict, replace

from gpusched import memory, memwatch, procfs, status_rows
from gpusched.disk import LAUNCH_WAIT_FLAG
from gpusched.model import GpuState
from gpusched.placement import DEFAULT_HEADROOM_FRAC
from gpusched.store import AttemptRow, Store, SuiteActivity, SuiteRow, draining

QUIET_SHOWN_S = 600  # a running job whose log has not grown this long says so in the table
MAX_TABLE_JOBS = 40  # rows of the plain table: running and failed first; the rest is summed up by state
TABLE_ORDER = ("running", "failed", "queued", "cancelled", "succeeded")  # what a person looks for first


#: Plain ``status`` shows the suites with jobs queued or running and those whose last job ended
#: within this long before the queue's newest activity (now, while anything runs; else the last
#: end): last night's suite is there in the morning, or after a weekend, and last month's failures
#: are not.
RECENT_S = 24 * 3600
#: The earlier suites the line under the table names (the rest it counts).
EARLIER_NAMED = 4


def recent_suites(
    store: Store, *, now: float | None = None, states: Collection[str] | None = None
) -> tuple[list[str], list[SuiteActivity]]:
    """The suites plain ``status`` shows (:data:`RECENT_S`), oldest first, and the others with
    jobs (in ``states``, when given), newest first, the first :data:`EARLIER_NAMED` with their
    jobs per state (the line under the table names only those): a few index lookups a suite,
    not a count of every job that months of suites left in the store."""
    seen = store.suite_activity()
    if not seen:
        return [], []
    newest = (time.time() if now is None else now) if any(a.active for a in seen) else seen[-1].last
    shown = [a.name for a in seen if a.active or a.last >= newest - RECENT_S]
    older = [a for a in reversed(seen) if a.name not in shown]
    if older:
        having = set(store.suites_with(states or TABLE_ORDER, suites=[a.name for a in older]))
        older = [a for a in older if a.name in having]
    counts = store.counts_by_suite([a.name for a in older[:EARLIER_NAMED]]) if older else {}
    return shown, [replace(a, counts=counts.get(a.name, {})) for a in older]


def gib(mib: int | None) -> str:
    return "?" if mib is None else f"{mib / 1024:.1f}"


_PIECE = 512  # entries written at a time (~200 KiB)


class Status:
    """The status document: ``head`` (every key but ``jobs``) and each job's entry as the
    JSON text SQLite wrote (:func:`status_rows.job_entries`), from which :meth:`doc` builds plain
    data and :meth:`text` the ``status --json`` output."""

    def __init__(self, head: dict[str, Any], entries: list[str]) -> None:
        self.head, self.entries = head, entries

    def doc(self) -> dict[str, Any]:
        """Plain data (``head`` and ``jobs``); keys of ``gpus`` and ``jobs`` entries are stable."""
        return {**self.head, "jobs": [json.loads(e) for e in self.entries]}

    def text(self) -> str:
        """``json.dumps(self.doc())``, the entries spliced in as they are: 10k of them never
        become Python objects."""
        return "".join(self._pieces())

    def write(self, out: TextIO) -> None:
        """:meth:`text` and a newline, written to ``out`` a piece at a time: 10k entries (4 MB)
        are not copied into one string, then into a bigger one, then into its bytes."""
        for piece in self._pieces():
            out.write(piece)
        out.write("\n")

    def _pieces(self) -> Iterator[str]:
        head = json.dumps(self.head, default=str)
        yield f'{head[:-1]}, "jobs": ['
        for i in range(0, len(self.entries), _PIECE):
            yield (", " if i else "") + ", ".join(self.entries[i : i + _PIECE])
        yield "]}"


#: A kind's prediction as status shows it: predicted MiB, its source, the tier it would start at.
ShownPrediction = tuple[int | None, str, str]
#: Completes the entries of running jobs (parsed, changed in place) before they are shown.
RunningHook = Callable[[list[dict[str, Any]]], None]


def status(
    store: Store,
    gpus: list[GpuState],
    *,
    daemon: dict[str, Any] | None,
    suites: Collection[str] | None = None,
    notice: str | None = None,
    now: float | None = None,
    trees: memwatch.TreesFn | None = None,
    host: memory.HostMemory | None = None,
    table_rows: int | None = None,
    running: RunningHook | None = None,
    fields: Sequence[str] | None = None,
    states: Collection[str] | None = None,
) -> Status:
    """The whole status. ``jobs`` lists every job in submission order, or with ``table_rows``
    only that many, the ones the table shows first (running, failed, queued, cancelled,
    succeeded; at most ``table_rows`` read per state): then the cost does not grow with the
    store. ``trees`` and ``host`` replace the real process table and host RAM (tests);
    ``running`` completes the entries of running jobs (the CLI adds the Slurm state of Slurm
    attempts). ``fields`` (keys of :data:`status_rows.ENTRY_FIELDS`, valid ones) narrows each
    job entry to those keys, in that order; without a prediction among them, queued jobs'
    predictions are not made at all. ``states``: only jobs in these, listed state by state
    in the table's order; ``suites``: only the jobs of these (and only their ``counts``)."""
    now = time.time() if now is None else now
    # No suite is decoded whole but those the queued jobs' predictions ask for: a store keeps
    # every suite ever submitted, and 250 of them cost 15 ms to decode (the GPU plans and the
    # tiers' names are read from their own columns, and by SQLite from each suite's row).
    suite_of = functools.cache(store.suite)
    status_rows.show_tiers(store, suites=suites)
    keys = tuple(status_rows.ENTRY_FIELDS) if fields is None else tuple(fields)
    predict = bool(status_rows.PREDICTION_FIELDS.intersection(keys))
    rows: list[tuple[str, str | None, str]] = []
    order = (None,) if table_rows is None and states is None else TABLE_ORDER
    for state in [s for s in order if states is None or s in states]:
        limit = None if table_rows is None else table_rows - len(rows)
        if limit == 0:
            break
        predicted: list[status_rows.PredictedGroup] = []
        if predict and state in (None, "queued"):
            kinds, groups = status_rows.queued_kinds(store, suites=suites, limit=limit)
            by_kind = queued_predictions(store, kinds, suite_of, gpus, now=now)
            predicted = [(*g[:4], *by_kind[g[4]]) for g in groups if g[4] in by_kind]
        rows += status_rows.job_entries(
            store,
            now=now,
            predictions=predicted,
            suites=suites,
            state=state,
            limit=limit,
            fields=keys,
            kept=store.entries_kept,
        )
    live = store.live_attempts()
    running_on = Counter(a.gpu for a in live if a.gpu is not None)
    active = store.active_suites(suites=suites)
    slots: dict[int, int] = {}  # the plans of the suites at work (of those shown when none is)
    for plan in store.gpu_plans(active or suites).values():
        for g, n in zip(plan.gpus, plan.slots, strict=True):
            slots[g] = max(slots.get(g, 0), n)
    read_table = functools.cache(procfs.table)  # the process table, read once if at all
    att = attribution(gpus, live, trees, store=store, now=now, read_table=read_table)
    gdocs = []
    out = store.gpus_out()
    indices = sorted({g.index for g in gpus} | set(slots) | set(out))
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
                "out_of_service": asdict(out[i]) if i in out else None,
                "lost": bool(gpu and gpu.lost),  # the driver finds the card gone (GPU_IS_LOST)
                "processes": [
                    _process_doc(att, i, p.pid, p.used_mib) for p in (gpu.processes if gpu else ())
                ],
            }
        )
    drains_at = store.drains_at()
    head = {
        "daemon": daemon,
        "notice": notice,
        "counts": store.counts(suites=suites),
        "draining": draining(drains_at, now),
        "drains_at": None if draining(drains_at, now) else drains_at,  # a drain --at still to come
        "host": host_doc(store, host, now=now),
        "launch_wait": store.flag(LAUNCH_WAIT_FLAG) if daemon else None,  # the daemon's, while it runs
        "gpus": gdocs,
    }
    if fields is not None and any(state == "running" for state, _, _ in rows):
        # a running job's entry is completed from keys that may not be among ``fields``
        full = status_rows.job_entries(store, now=now, predictions=(), suites=suites, state="running")
        narrowed = {
            job_id: _entry_text({k: d[k] for k in keys})
            for (_, job_id, _), d in zip(
                full, map(json.loads, _complete_running(full, running, now, read_table)), strict=True
            )
        }
        entries = [
            narrowed[job_id]
            if state == "running" and job_id in narrowed  # (one that ended in between keeps its row)
            else entry
            for state, job_id, entry in rows
        ]
    else:
        entries = _complete_running(rows, running, now, read_table)
    return Status(head, entries)


def _complete_running(
    rows: list[tuple[str, str | None, str]],
    running: RunningHook | None,
    now: float,
    read_table: Callable[[], list[procfs.Entry]],
) -> list[str]:
    """The entries (every key), those of running jobs (parsed, completed, written again)
    given the last line of their log and how long ago it last grew, what ``running`` adds,
    and their stopped processes (from ``read_table``)."""
    entries = [entry for _, _, entry in rows]
    at = [i for i, (state, _, _) in enumerate(rows) if state == "running"]
    docs = [json.loads(entries[i]) for i in at]
    for d in docs:
        if d["log"] is not None:
            d["last_line"] = _last_line(os.path.dirname(d["log"]))
            d["quiet_s"] = _quiet_s(d["log"], now)
    _add_suspended(docs, read_table)
    if running is not None and docs:
        running(docs)
    for i, d in zip(at, docs, strict=True):
        entries[i] = _entry_text(d)
    return entries


def _entry_text(d: dict[str, Any]) -> str:
    """A completed entry written as SQLite writes every other one (no spaces, characters as they
    are), so that ``status --json | grep '"state":"running"'`` finds the running jobs too."""
    return json.dumps(d, separators=(",", ":"), ensure_ascii=False)


def _add_suspended(docs: list[dict[str, Any]], read_table: Callable[[], list[procfs.Entry]]) -> None:
    """``suspended`` of the running jobs whose processes run on this machine: the stopped
    processes of each one's group (``[]`` when none is), from one scan of the process table.
    A job someone stopped (``kill -STOP``, a Ctrl-Z where the shell stops it) holds its slot
    and its GPU memory while it neither runs nor prints; only its silence would show it."""
    from gpusched.home import this_host

    here = this_host()
    local = {
        i: (h["pid"], h.get("pid_started_at"))
        for i, d in enumerate(docs)
        if isinstance(h := d.get("backend_handle"), dict) and h.get("host") == here and h.get("pid")
    }
    if not local:
        return
    stopped = procfs.stopped_in_groups(dict(local.values()), read_table)
    for i, (pid, _) in local.items():
        docs[i]["suspended"] = [{"pid": p, "name": name} for p, name in stopped.get(pid, ())]


def _quiet_s(log: str, now: float) -> float | None:
    """Seconds since the job's log last grew; None before its wrapper made the log (a Slurm
    job still pending)."""
    try:
        return round(max(0.0, now - os.stat(log).st_mtime), 1)
    except OSError:
        return None


def _last_line(adir: str) -> str:
    from pathlib import Path

    from gpusched.attempt import AttemptPaths

    return AttemptPaths(Path(adir)).last_line()[:200]


def attribution(
    gpus: list[GpuState],
    live: list[AttemptRow],
    trees: memwatch.TreesFn | None,
    store: Store | None = None,
    now: float | None = None,
    read_table: Callable[[], list[procfs.Entry]] | None = None,
) -> memory.Attribution:
    """Which GPU processes belong to which running job: its wrapper and everything below it.
    With ``store``, a process below none of them is still ours when it carries one of our
    attempts' tokens or exited from one (see :func:`_strays`): a running job's process that
    exited before the job was reaped, or an ended one's while its memory is released. The
    daemon counts those as ours, and `status` must not show them as someone else's.
    ``read_table``: the process table as this status reads it (once, for this and the stopped
    processes alike)."""
    if not any(g.processes for g in gpus):
        return memory.attribute(gpus, [])
    pids = trees(live) if trees is not None else memwatch.attempt_trees(live, read_table)
    mine = {a.id: _wrapper(a) | pids.get(a.id, frozenset()) for a in live}
    ended: list[memory.Tree] = []
    if store is not None:
        known = set().union(*mine.values())
        unknown = {p.pid for g in gpus for p in g.processes if p.pid not in known}
        for a, strays in _strays(store, unknown, time.time() if now is None else now) if unknown else ():
            if a.id in mine:
                mine[a.id] |= strays
            else:
                ended.append(memwatch.ending_tree(a, strays))
    trees_of = [memory.Tree(attempt_id=a.id, job_id=a.job_id, gpu=a.gpu, pids=mine[a.id]) for a in live]
    return memory.attribute(gpus, [*trees_of, *ended])


def _strays(store: Store, pids: set[int], now: float) -> list[tuple[AttemptRow, frozenset[int]]]:
    """Our attempts that ``pids`` belong to, each with its own of them. A live process carries
    its attempt's token in its environment (one read of /proc/PID/environ per process that no
    running job holds; someone else's fails at once). One that has exited (no such process, or
    a zombie), but that the driver still lists while it releases the memory, is found among the
    processes the daemon saw on an attempt's card, for attempts still running or ended in the
    last :data:`memory.RELEASE_S`. A live process without a token is someone else's, even where
    its pid was once one of ours: pids are reused, and a job runs for hours."""
    by_token: dict[str, set[int]] = {}
    for pid in pids:
        token = procfs.environ_value(pid, procfs.TOKEN_ENV)
        if token:
            by_token.setdefault(token, set()).add(pid)
    found = [(a, frozenset(by_token[a.token])) for a in store.attempts_by_token(by_token)] if by_token else []
    if gone := {pid for pid in pids.difference(*by_token.values()) if procfs.started_at(pid) is None}:
        found += store.exited_gpu_pids(gone, since=now - memory.RELEASE_S)
    return found


def _wrapper(a: AttemptRow) -> frozenset[int]:
    pid = (a.handle or {}).get("pid")
    return frozenset({int(pid)}) if pid else frozenset()


def _process_doc(att: memory.Attribution, gpu: int, pid: int, used_mib: int | None) -> dict[str, Any]:
    owner = att.owner(gpu, pid)
    job = owner.job_id if owner else None
    return {"pid": pid, "used_mib": used_mib, "ours": owner is not None, "job": job}


def queued_predictions(
    store: Store,
    stand_in: dict[str, str],
    suite_of: Callable[[str], SuiteRow | None],
    gpus: list[GpuState],
    *,
    now: float,
) -> dict[str, ShownPrediction]:
    """The prediction (and start tier) the scheduler would place queued jobs with, by kind
    (:func:`status_rows.queued_kinds`, which names a job standing for each kind).

    A job that never ran has no history of its own, so all such jobs of one suite, task and
    tier get the same prediction (:func:`memwatch.demands` shares it too): one of them stands
    for the rest, and a queue of 10k costs a few demands, not 10k. ``now``: what running jobs
    tell (their plateaus, what they hold, how long they have run) counts, as for the daemon."""
    if not stand_in:
        return {}
    jobs = [j for j in map(store.job, stand_in.values()) if j is not None]
    empty = memory.rooms(gpus, {}, DEFAULT_HEADROOM_FRAC)
    demand = memwatch.demands(
        store,
        jobs,
        suite_of,
        gpus,
        empty,
        headroom_frac=DEFAULT_HEADROOM_FRAC,
        now=now,
        step_up=store.step_up(memory.MAX_STEP_UP),
    )
    out: dict[str, ShownPrediction] = {}
    for kind, job_id in stand_in.items():
        dm = demand.get(job_id)
        if dm is not None:
            pred = dm.prediction()
            out[kind] = (pred.mib, pred.source, dm.view.tiers[dm.view.tier].name)
    return out


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


# --------------------------------------------------------------------------- text


#: Styles by state (rich style names: ``report`` renders with rich; ``status`` maps them to ANSI).
STATE_STYLE = {
    "queued": "yellow",
    "running": "cyan",
    "succeeded": "green",
    "failed": "bold red",
    "cancelled": "magenta",
}
_SGR = {
    "bold": "1",
    "dim": "2",
    "italic": "3",
    "red": "31",
    "green": "32",
    "yellow": "33",
    "magenta": "35",
    "cyan": "36",
}


#: The fewest columns the free-text column of a status table is folded to before a word of
#: another column is cut.
FOLDED_MIN = 6


def format_status(
    doc: dict[str, Any],
    *,
    width: int | None = 80,
    color: bool = False,
    max_jobs: int | None = MAX_TABLE_JOBS,
    states: Collection[str] | None = None,
    earlier: Sequence[SuiteActivity] = (),
    ascii_only: bool = False,
) -> str:
    """The status as text for a terminal ``width`` columns wide (None: as wide as the tables
    are, one line a row): daemon line, GPU table, job table, with ANSI colours when ``color``,
    and a line summing up the ``earlier`` suites that ``doc`` leaves out. ``ascii_only``: the
    tables boxed in ASCII, for an output that cannot write the box-drawing characters.
    Tables that do not fit shrink their widest columns first and wrap their cells; a job's id
    is cut last, so that it can still be copied into ``attach`` or ``logs``."""

    def paint(text: str, style: str) -> str:
        if not color or not text or not style:
            return text
        return f"\x1b[{';'.join(_SGR[w] for w in style.split())}m{text}\x1b[0m"

    box = BOXES[ascii_only]
    out: list[str] = []
    d = doc["daemon"]
    if d:
        head = paint(f"daemon pid {d.get('pid')}  probe {d.get('probe')}", "bold")
        if isinstance(settings := d.get("settings"), dict) and settings:  # what its environment set
            head += "  " + " ".join(f"{k}={v}" for k, v in sorted(settings.items()))
        if d.get("stalled_s"):
            since = f"no scheduling step has finished for {d['stalled_s']} s"
            head += paint(f"  STALLED: {since} ({d.get('stalled_why')})", "bold red")
    else:
        head = paint("daemon not running", "bold red")
        c = doc["counts"]
        if left := [f"{c[k]} {k}" for k in ("running", "queued") if c.get(k)]:
            # after a reboot or a kill -9: "running" is what the store last knew
            head += (
                f": the {' and '.join(left)} shown wait for it (nothing is launched, nothing that"
                " ended is reaped); `gpusched daemon start`"
            )
        else:
            head += "  (it starts with `gpusched submit`, or `gpusched daemon start`)"
    if doc.get("draining"):
        head += paint("  DRAINING: no new launches (`gpusched drain --off` resumes)", "bold yellow")
    elif doc.get("drains_at"):
        when = time.strftime("%a %H:%M", time.localtime(doc["drains_at"]))
        head += paint(f"  DRAINS AT {when}: no new launches from then (`drain --off` cancels)", "yellow")
    out.append(head)
    out.append("  ".join(f"{k} {v}" for k, v in doc["counts"].items()))
    if doc.get("notice"):
        out.append(paint(_clean(doc["notice"]), "dim"))
    if (doc.get("host") or {}).get("wait"):
        out.append(paint(f"launches wait: {doc['host']['wait']}", "bold yellow"))
    if doc.get("launch_wait"):
        out.append(paint(f"launches wait: {_clean(doc['launch_wait'])}", "bold yellow"))
    for g in doc["gpus"]:
        if g.get("out_of_service"):
            o = g["out_of_service"]
            at = time.strftime("%H:%M:%S", time.localtime(o["since"]))
            line = (
                f"GPU {g['index']} OUT OF SERVICE since {at}, {out_cause(o)}: no job is placed there; "
                f"`gpusched gpus --enable {g['index']}` once it is fixed"
            )
            out.append(paint(line, "bold red"))
    if doc["gpus"]:
        heads = ["GPU", "memory used / total GiB", "free GiB", "util", "slots", "outside processes"]
        out += _table("GPUs", heads, [_gpu_cells(g) for g in doc["gpus"]], width, paint, box=box)
    counts = {k: n for k, n in doc["counts"].items() if states is None or k in states}
    total = sum(counts.values())
    shown = _pick_rows(doc["jobs"], max_jobs)
    heads = ["job", "state", "GPU", "tier", "attempt", "runtime", "memory GiB", "outcome / why / last line"]
    title = f"Jobs ({total})" if states is None else f"Jobs ({total} {', '.join(states)})"
    older = _earlier(earlier, states)
    if shown:
        out += _table(title, heads, [_job_cells(j) for j in shown], width, paint, fold_last=0, box=box)
    elif states is not None:
        out.append(f"no {' or '.join(states)} jobs" + (" in the last day" if older else ""))
    elif not earlier:
        out.append("no jobs yet: `gpusched submit --suite NAME` queues the jobs of plans/NAME.yaml")
    if len(shown) < total:
        out.append(paint(f"... {_hidden(counts, shown)} (use --all, --state STATE or --suite)", "dim"))
    if older:
        out.append(paint(older, "dim"))
    return "\n".join(out)


def _earlier(earlier: Sequence[SuiteActivity], states: Collection[str] | None) -> str:
    """``"earlier suites, not shown (the last ended Nov 24): old (3 failed), demo (6
    succeeded); --suite NAME or --all"``: the older suites (:func:`recent_suites`, with jobs
    in ``states``), newest first, at most :data:`EARLIER_NAMED` of them by name, each with its
    jobs by state; ``""`` when there are none."""
    if not earlier:
        return ""
    names = []
    for a in earlier[:EARLIER_NAMED]:
        n = {s: a.counts[s] for s in TABLE_ORDER if a.counts.get(s) and (states is None or s in states)}
        names.append(f"{a.name} ({', '.join(f'{k} {s}' for s, k in n.items())})")
    if len(earlier) > EARLIER_NAMED:
        names.append(f"{len(earlier) - EARLIER_NAMED} more")
    when = time.strftime("%b %d", time.localtime(earlier[0].last))
    return f"earlier suites, not shown (the last ended {when}): {', '.join(names)}; --suite NAME or --all"


def out_cause(o: dict[str, Any]) -> str:
    """Why a GPU is out of service, in words that follow "out of service": its faults in a
    row under jobs and the last one, or (no job to blame) what the probe found."""
    if not o.get("job_id"):
        return f"because {_clean(o['why'])}"
    return f"after {o['faults']} faults in a row (last: {o['job_id']}: {_clean(o['why'])})"


def _gpu_cells(g: dict[str, Any]) -> list[tuple[str, str]]:
    """A GPU's row: (text, style) per column."""
    outsiders = [p for p in g["processes"] if not p["ours"]]
    cells = (
        str(g["index"]),
        f"LOST / {gib(g['total_mib'])}" if g.get("lost") else f"{gib(g['used_mib'])} / {gib(g['total_mib'])}",
        gib(g["free_mib"]),
        "?" if g["util_pct"] is None else f"{g['util_pct']}%",
        f"{g['running']}/{g['slots']}",
        ", ".join(f"pid {p['pid']} {gib(p['used_mib'])} GiB" for p in outsiders),
    )
    return [(c, "") for c in cells]


def _job_cells(j: dict[str, Any]) -> list[tuple[str, str]]:
    """A job's row: (text, style) per column; the state is coloured."""
    why = j.get("last_line") if j["state"] == "running" else (j.get("reason") or "")
    if j["state"] == "running" and j.get("stopping"):
        why = f"stopping: {j['stopping']}"
    elif j["state"] == "running" and j.get("suspended"):
        pids = ", ".join(f"pid {p['pid']} ({p['name']})" for p in j["suspended"])
        group = (j.get("backend_handle") or {}).get("pid")
        why = f"suspended: {pids} stopped by a signal; kill -CONT -- -{group} resumes it"
    elif j["state"] == "running" and (j.get("quiet_s") or 0) >= QUIET_SHOWN_S:
        why = f"(no output for {int(j['quiet_s'] // 60)} min) {why or ''}"
    if j["state"] == "failed" and j.get("line") and j["line"] not in (j.get("reason") or ""):
        why = f"{j.get('reason')}: {j['line']}"  # (a reason that is the line itself says it once)
    tag = f"[{j['outcome']}] " if j.get("outcome") and j["state"] != "running" else ""
    tier = f"{j['tier']} ({j['tier_index'] + 1}/{j['tiers']})" if j.get("tiers", 1) > 1 else f"{j['tier']}"
    return [
        (j["id"], ""),
        (
            j["state"] + (" (stopping)" if j.get("cancel_requested") or j.get("stopping") else ""),
            STATE_STYLE.get(j["state"], ""),
        ),
        ("" if j["gpu"] is None or j["state"] == "queued" else str(j["gpu"]), ""),  # where it ran last
        (tier, ""),
        (f"{j['attempt']}" if j["attempt"] else "", ""),
        (_dur(j.get("runtime_s")), ""),
        (memory_cell(j), ""),
        (tag + (why or ""), ""),
    ]


#: A table's box: the top rule, the head's bar, the rule under the head, the body's bar and the
#: bottom rule (each rule: left, fill, between columns, right).
Box = tuple[tuple[str, str, str, str], str, tuple[str, str, str, str], str, tuple[str, str, str, str]]
#: The boxes, by whether the output can write only ASCII: rich's heavy head and light body, or
#: its ASCII look-alike.
BOXES: dict[bool, Box] = {
    False: (("┏", "━", "┳", "┓"), "┃", ("┡", "━", "╇", "┩"), "│", ("└", "─", "┴", "┘")),
    True: (("+", "-", "+", "+"), "|", ("+", "=", "+", "+"), "|", ("+", "-", "+", "+")),
}


def _table(
    title: str,
    heads: Sequence[str],
    rows: list[list[tuple[str, str]]],
    width: int | None,
    paint: Any,
    *,
    fold_last: int | None = None,
    box: Box = BOXES[False],
) -> list[str]:
    """A titled table boxed as rich draws one (heavy head, light body; ``box``), as lines, at
    most ``width`` columns wide (None: as wide as its cells)."""
    heads = [_clean(h) for h in heads]
    rows = [[(_clean(text), style) for text, style in row] for row in rows]
    columns = list(zip(heads, *([t for t, _ in r] for r in rows), strict=True))
    widths = [max(_cell_len(t) for t in col) for col in columns]
    if width is not None:
        _shrink(widths, columns, width, fold_last)

    def line(cells: Sequence[tuple[str, str]], bar: str, *, bottom: bool = False) -> list[str]:
        """One row, as many lines as its tallest cell; cells at the top (``bottom``: at the bottom)."""
        wrapped = [_wrap(text, w) for (text, _), w in zip(cells, widths, strict=True)]
        height = max(len(p) for p in wrapped)
        if bottom:
            wrapped = [[""] * (height - len(p)) + p for p in wrapped]
        return [
            f"{bar} "
            + f" {bar} ".join(
                paint(part[k], style) + " " * (w - _cell_len(part[k])) if k < len(part) else " " * w
                for part, (_, style), w in zip(wrapped, cells, widths, strict=True)
            )
            + f" {bar}"
            for k in range(height)
        ]

    def rule(left: str, fill: str, mid: str, right: str) -> str:
        return left + mid.join(fill * (w + 2) for w in widths) + right

    top, head_bar, under_head, bar, bottom = box
    lines = [paint(title, "italic"), rule(*top)]
    lines += line([(h, "bold") for h in heads], head_bar, bottom=True)
    lines.append(rule(*under_head))
    for row in rows:
        lines += line(row, bar)
    lines.append(rule(*bottom))
    return lines


def _shrink(widths: list[int], columns: list[tuple[str, ...]], width: int, fold_last: int | None) -> None:
    """Narrow ``widths`` (of ``columns``' texts) until the table fits ``width``. The widest
    column gives way first, down to its longest word ("succeeded" is not cut in two while a
    long reason can wrap). Only when that is not enough are words folded: the last column's
    (the free text: a reason, a log line) down to :data:`FOLDED_MIN` columns, then the widest
    column's, and column ``fold_last`` (a job's id) only once no other can give."""
    room = max(len(widths), width - 3 * len(widths) - 1)  # each column has a border and a space each side
    words = [max(max((_cell_len(w) for w in t.split()), default=0) for t in col) for col in columns]
    last = len(widths) - 1
    while sum(widths) > room and max(widths) > 1:
        above = [i for i, w in enumerate(widths) if w > words[i]]
        if above:
            i = max(above, key=lambda k: widths[k])
        elif widths[last] > FOLDED_MIN and last != fold_last:
            i = last
        else:
            others = [k for k, w in enumerate(widths) if w > 1 and k != fold_last]
            i = max(others, key=lambda k: widths[k]) if others else (fold_last or 0)
        widths[i] -= 1


def _clean(text: str) -> str:
    """``text`` without control characters (a log line's ``\\r`` or colour codes), whitespace
    as spaces: one cell stays one cell."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else " " if c.isspace() else "" for c in text)


def _char_width(c: str) -> int:
    if unicodedata.combining(c):
        return 0
    return 2 if unicodedata.east_asian_width(c) in ("W", "F") else 1


def _cell_len(text: str) -> int:
    """Terminal columns of ``text`` (East Asian wide characters take two)."""
    return len(text) if text.isascii() else sum(map(_char_width, text))


def _wrap(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width`` columns, broken between words; a word longer
    than a line is folded."""
    if _cell_len(text) <= width:
        return [text]
    lines: list[str] = []
    cur, cur_len = "", -1  # -1: nothing on the line yet
    for word in text.split():
        n = _cell_len(word)
        if cur_len >= 0 and cur_len + 1 + n <= width:
            cur, cur_len = f"{cur} {word}", cur_len + 1 + n
            continue
        if cur_len >= 0:
            lines.append(cur)
        while n > width:
            head, word = _fold(word, width)
            lines.append(head)
            n = _cell_len(word)
        cur, cur_len = word, n
    if cur_len >= 0:
        lines.append(cur)
    return lines or [""]


def _fold(word: str, width: int) -> tuple[str, str]:
    """The first ``width`` columns of ``word`` (at least one character), and the rest."""
    used = 0
    for i, c in enumerate(word):
        used += _char_width(c)
        if used > width:
            return word[: max(i, 1)], word[max(i, 1) :]
    return word, ""


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


def _pick_rows(jobs: list[dict[str, Any]], n: int | None) -> list[dict[str, Any]]:
    """Running and failed jobs first, then queued, then the rest, up to ``n`` rows (None: all)."""
    order = {state: k for k, state in enumerate(TABLE_ORDER)}
    ranked = sorted(jobs, key=lambda j: order.get(j["state"], 9))  # (stable: in submission order within)
    return ranked if n is None else ranked[:n]


def _dur(s: float | None) -> str:
    if s is None:
        return ""
    s = int(s)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"
