"""A job's ``status --json`` entry, as SQL: built by SQLite from the job's row, its newest attempt
and its suite's tiers, and kept written for the ended jobs.

A queued or running job's entry changes with the clock (a backoff's end, a running job's run
time) and with what status predicts, so ``status`` builds it at every call
(:func:`gpusched.status_rows.job_entries`). An ended job's does not: the database keeps it in
``ended_entries``. Triggers (:data:`TRIGGERS`) take an entry away in the transaction that makes
it stale (the job ends, is retried, its attempt or its suite changes) and mark the job due; the
daemon writes the due entries (:data:`KEEP`, :meth:`gpusched.store.Store.write_entries`) when a
tick launched nothing, ~12 us an entry in a batch on 2 cores. ``status --json`` then reads one
text column an ended job instead of building 27 keys from three tables (10,000 ended jobs: ~15 ms
instead of ~50 on 2 cores), and builds the rest itself. Whatever writes to the database (an
older daemon, a fix by hand in ``sqlite3``) fires the same triggers, so a kept entry is never
stale; at worst one is missing and status builds it.

SQL text only: :mod:`gpusched.store` installs the triggers and writes, :mod:`gpusched.status_rows`
reads.
"""

from __future__ import annotations

from collections.abc import Sequence

#: A job's tier past its suite's last (a plan that lost tiers): the last one's row (its ``idx`` -1),
#: looked up only then (coalesce stops at the first value); the tier of its own index is a key lookup.
_LAST_TIER = "FROM temp.shown_tier l WHERE l.suite = j.suite AND l.idx = -1"

#: The keys of a ``status --json`` job entry (views.py documents them), in order, each with the
#: SQL that builds it from a job and its newest attempt (``a``), the tier names of its suite
#: (``t``) and, for a queued job, its group's prediction (``p``). ``last_line``, ``quiet_s`` and
#: ``suspended`` (a running job's last log line, how long ago its log last grew, and its
#: stopped processes) are filled in by the caller; ``slurm`` carries a Slurm attempt's job
#: id. A job's tier past its suite's last (a plan that lost tiers) shows the last one's name.
ENTRY_FIELDS: dict[str, str] = {
    "id": "j.id",
    "suite": "j.suite",
    "name": "j.name",
    "state": "j.state",
    "tier": f"coalesce(t.name, (SELECT name {_LAST_TIER}), CAST(j.tier AS TEXT))",
    "tier_index": "j.tier",
    "attempt": "j.attempts",
    "gpu": "a.gpu",
    "outcome": "j.outcome",
    # a queued job that waits out a backoff (a retried error, a full disk, the network) says until
    # when: "requeued ... in 300 s" does not say from when (the clock is the machine's, as Python's)
    "reason": "CASE WHEN j.state = 'queued' THEN coalesce(nullif(j.wait_reason, ''), j.reason)"
    " || CASE WHEN j.not_before > :now"
    " THEN ' (waits until ' || strftime('%H:%M:%S', j.not_before, 'unixepoch', 'localtime') || ')'"
    " ELSE '' END ELSE j.reason END",
    "line": "j.line",
    "log": "a.dir || '/output.log'",
    "runtime_s": "CASE WHEN j.state != 'queued' AND a.started_at"
    " THEN round(coalesce(a.ended_at, :now) - a.started_at, 1) END",
    "started_at": "a.started_at",
    "ended_at": "j.ended_at",
    "predicted_mib": "CASE WHEN p.suite IS NULL THEN a.predicted_mib ELSE p.mib END",
    "prediction_source": "CASE WHEN p.suite IS NULL THEN a.prediction_source ELSE p.source END",
    "peak_mib": "a.peak_mib",
    # json('true') is a constant SQLite computes once per query, not a parse per job
    "cancel_requested": "CASE WHEN j.cancel_requested THEN json('true') ELSE json('false') END",
    "backend_handle": "json(a.handle)",
    "tiers": f"coalesce(t.n, (SELECT n {_LAST_TIER}), 1)",
    "start_tier": "p.start_tier",
    "last_line": "NULL",
    "quiet_s": "NULL",
    "suspended": "NULL",
    # why gpusched is stopping a running job at a suite limit (a lookup for running jobs only)
    "stopping": "CASE WHEN j.state = 'running'"
    " THEN (SELECT s.reason FROM stops s WHERE s.attempt_id = a.id) END",
    "slurm": "CASE WHEN json_extract(a.handle, '$.slurm_job_id') IS NOT NULL"
    " THEN json_object('job_id', json_extract(a.handle, '$.slurm_job_id')) END",
}
#: The entry keys that come from a queued job's predicted kind: without them no prediction is made.
PREDICTION_FIELDS = frozenset({"predicted_mib", "prediction_source", "start_tier"})
#: The entry keys read from the suite's tiers (``t``).
TIER_FIELDS = frozenset({"tier", "tiers"})

#: The states a job ends in: its entry no longer changes with the clock or a prediction.
ENDED_STATES = ("succeeded", "failed", "cancelled")
#: :data:`ENDED_STATES` as an SQL list, for ``state IN {ENDED}``.
ENDED = "(" + ", ".join(f"'{s}'" for s in ENDED_STATES) + ")"

_SUITE = "FROM suites s WHERE s.name = j.suite"
_TIERS = "json_array_length(s.spec, '$.tiers')"

#: :data:`ENTRY_FIELDS` as they are for an ended job, where a trigger writes them: what is the
#: same for every ended job written out (no prediction, the run time of the attempt's own end),
#: and the tiers read from the suite's row itself (a trigger cannot read status's temp tables).
#: Every other key's SQL is :data:`ENTRY_FIELDS`' own (tests/unit/test_entries.py holds both to
#: the same entries).
ENDED_FIELDS: dict[str, str] = {
    **ENTRY_FIELDS,
    "tier": f"coalesce((SELECT json_extract(s.spec, '$.tiers[' || j.tier || '].name') {_SUITE}),"
    f" (SELECT CASE WHEN {_TIERS} > 0 THEN json_extract(s.spec, '$.tiers[' || ({_TIERS} - 1) || '].name')"
    f" END {_SUITE}), CAST(j.tier AS TEXT))",
    "reason": "j.reason",
    "runtime_s": "CASE WHEN a.started_at THEN round(a.ended_at - a.started_at, 1) END",
    "predicted_mib": "a.predicted_mib",
    "prediction_source": "a.prediction_source",
    "tiers": f"coalesce(nullif((SELECT {_TIERS} {_SUITE}), 0), 1)",
    "start_tier": "NULL",
}


def entry_object(fields: Sequence[str], sql: dict[str, str] = ENTRY_FIELDS) -> str:
    """SQLite's json_object of ``fields`` (keys of ``sql``), in that order."""
    return "json_object(" + ", ".join(f"'{k}', {sql[k]}" for k in fields) + ")"


#: The ended jobs' entries as the database keeps them: every ended job ``j`` (by ``seq``) with its
#: entry (``+j.state``: the jobs asked of are found by ``seq``, not among every ended job by the
#: state's index, a walk that would grow with the store), but for those status must build at
#: every call: a job whose newest attempt has not
#: ended (none should be ended then; a later change to that attempt would fire no trigger), or
#: started and never recorded an end (its run time is the clock's), and one whose tier is below
#: 0 or whose handle or suite is not JSON (one bad row must not stop every other's write).
KEEP = (
    f"SELECT j.seq, {entry_object(list(ENDED_FIELDS), ENDED_FIELDS)} FROM jobs j"
    " LEFT JOIN attempts a ON a.job_id = j.id AND a.n = j.attempts"
    f" WHERE +j.state IN {ENDED} AND j.tier >= 0 AND (a.state IS NULL OR a.state = 'exited')"
    " AND (coalesce(a.started_at, 0) = 0 OR a.ended_at IS NOT NULL)"
    " AND json_valid(coalesce(a.handle, 'null'))"
    f" AND json_valid(coalesce((SELECT s.spec {_SUITE}), '{{}}'))"
)


#: What the daemon runs to write the due entries up to a job (``?``: its ``seq``): the jobs come
#: from ``entries_due`` by rowid, the cost that of the entries written (:data:`KEEP`).
WRITE_DUE = (
    f"INSERT OR REPLACE INTO ended_entries (seq, entry) {KEEP}"
    " AND j.seq IN (SELECT seq FROM entries_due WHERE seq <= ?)"
)


def _ended(row: str) -> str:
    """Whether ``row`` (``NEW``, ``OLD``) is an ended job's, as a trigger's WHEN asks it: not with
    ``IN (...)``, whose list SQLite builds into a table again each time a trigger fires (72,000
    instructions a row, the same again as the update itself, where the WHEN said no)."""
    return "(" + " OR ".join(f"{row}.state = '{s}'" for s in ENDED_STATES) + ")"


def _tiers(spec: str) -> str:
    """A suite's tiers (names and all) as JSON text, NULL where its spec is not JSON."""
    return f"CASE WHEN json_valid({spec}) THEN json_extract({spec}, '$.tiers') END"


#: The columns of a job (``j``) and of its attempt (``a``) that an ended job's entry reads, or that
#: decide whether it is kept: the triggers fire on updates of these only. A statement that sets
#: none (the waits the daemon writes for hundreds of queued jobs a tick) runs no trigger program
#: at all, where even one whose WHEN says no costs SQLite a program's setup for each row.
JOB_COLUMNS = ("state", "tier", "attempts", "outcome", "reason", "line", "ended_at", "cancel_requested")
ATTEMPT_COLUMNS: tuple[str, ...] = ("state", "gpu", "dir", "started_at", "ended_at", "peak_mib", "handle")
ATTEMPT_COLUMNS += ("predicted_mib", "prediction_source")

#: The triggers that keep ``ended_entries`` true, by name, as ``sqlite_master`` keeps them. Each
#: deletes the entries it makes stale and marks those jobs due (``entries_due``), for the daemon
#: to write again (:meth:`gpusched.store.Store.write_entries`) when it is not busy launching: a
#: job that ends, or changes once ended (a retry takes its entry away); a change to an ended
#: attempt (a peak recorded late, a handle); a suite submitted again with other tiers (before the
#: row is replaced: the old one's are still there to compare, and the entries are written after,
#: from the new). Their
#: bodies stay this small on purpose: SQLite sets up a trigger's whole program each time it
#: fires, and a body that wrote the entry itself cost the daemon ~430,000 instructions a job
#: that ended (a burst's tick 14 % longer).
TRIGGERS: dict[str, str] = {
    "ended_entry_job": f"CREATE TRIGGER ended_entry_job AFTER UPDATE OF {', '.join(JOB_COLUMNS)} ON jobs"
    f" WHEN {_ended('NEW')} OR {_ended('OLD')}"
    " BEGIN DELETE FROM ended_entries WHERE seq = NEW.seq;"
    " INSERT OR IGNORE INTO entries_due (seq) VALUES (NEW.seq); END",
    "ended_entry_attempt": f"CREATE TRIGGER ended_entry_attempt AFTER UPDATE OF {', '.join(ATTEMPT_COLUMNS)}"
    " ON attempts"
    " WHEN OLD.state = 'exited'"
    " BEGIN DELETE FROM ended_entries WHERE seq = (SELECT seq FROM jobs WHERE id = NEW.job_id);"
    " INSERT OR IGNORE INTO entries_due (seq) SELECT seq FROM jobs WHERE id = NEW.job_id; END",
    "ended_entry_suite": "CREATE TRIGGER ended_entry_suite BEFORE INSERT ON suites"
    f" WHEN {_tiers('NEW.spec')} IS NOT (SELECT {_tiers('spec')} FROM suites WHERE name = NEW.name)"
    " BEGIN DELETE FROM ended_entries WHERE seq IN (SELECT seq FROM jobs WHERE suite = NEW.name);"
    " INSERT OR IGNORE INTO entries_due (seq)"
    f" SELECT seq FROM jobs WHERE suite = NEW.name AND state IN {ENDED}; END",
}

#: What the kept entries were written by, as the database records it (``meta``, key
#: ``entries``): status reads them only where it is this gpusched's (else it builds every entry
#: itself), and a read-write open that finds another puts in these triggers and marks every
#: ended job due (:meth:`gpusched.store.Store._renew_entries`).
DEFINITION = ";\n".join([KEEP, *TRIGGERS.values()])
