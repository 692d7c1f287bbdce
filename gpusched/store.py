"""The durable queue: one SQLite file (WAL) per user.

Every state transition is one short transaction, so a daemon killed at any instant leaves
the store at a transition boundary. Readers (``status`` in other shells) never block the
daemon and never see a half-done submit. The schema carries a version; an old file is
migrated forward on open, a newer one is refused with a clear message.

The schema text is :mod:`gpusched.schema`; the row records are :mod:`gpusched.records`
(imported here, so ``from gpusched.store import JobRow`` works); the reads behind
``status`` are :mod:`gpusched.status_rows`.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import sqlite3
import sys
import time
from array import array
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gpusched import codec
from gpusched.entries import DEFINITION, ENDED, TRIGGERS, WRITE_DUE
from gpusched.errors import GpuschedError, StoreError, UsageError
from gpusched.model import (
    Classification,
    ExitRecord,
    GpuPlan,
    JobSpec,
    JobState,
    Outcome,
    Step,
    StepKind,
    Suite,
    check_transition,
)
from gpusched.records import (
    AttemptRow,
    Ending,
    GpuOut,
    JobRow,
    NewAttempt,
    SubmitResult,
    SuiteActivity,
    SuiteRow,
    gpu_plan_of,
)
from gpusched.schema import ADDED_TABLES, INDEXES, RETIRED_INDEXES, SCHEMA, SCHEMA_VERSION

ACTIVE_STATES = (JobState.QUEUED.value, JobState.RUNNING.value)
#: The flag ``gpusched drain`` sets: from when (epoch seconds) no new job is launched.
DRAIN_FLAG = "draining"


def draining(drains_at: float | None, now: float) -> bool:
    """Whether a drain (:meth:`Store.drains_at`: now, or ``--at`` a time already come) holds at ``now``."""
    return drains_at is not None and now >= drains_at


def suite_filter(suites: Collection[str] | None, column: str = "suite") -> tuple[str, list[str]]:
    """SQL that keeps the rows of ``suites`` (none when it is None) and its arguments. Not by
    an index on the suite (``+``): the jobs' state indexes hold the suite too, so counts and
    the queue's rows come from them, where a suite index would read each of a suite's jobs."""
    if suites is None:
        return "", []
    names = sorted(suites)
    return f"+{column} IN ({','.join('?' * len(names))})", names


#: The oldest SQLite the store's statements run on: UPSERT (``ON CONFLICT ... DO UPDATE``) came in
#: 3.24 (2018). A Python built against an older system library (pyenv on RHEL/CentOS 7) is
#: refused in one line when the store opens, not with a syntax error in the middle of a tick.
MIN_SQLITE = (3, 24, 0)


def check_sqlite() -> None:
    """Raise :class:`StoreError` when the SQLite this Python uses is older than :data:`MIN_SQLITE`,
    or was built without its JSON functions (standard since 3.38, an option before): the daemon
    reads the history a prediction needs and a suite's ``notify:`` with them, ``status`` its
    entries. Refused when the store opens, not with "no such function" in the middle of a night."""
    version = sqlite3.sqlite_version_info
    if version < MIN_SQLITE:
        have, need = ".".join(map(str, version)), ".".join(map(str, MIN_SQLITE))
        raise StoreError(
            f"gpusched needs SQLite {need} or later, but this Python ({sys.executable}) uses SQLite "
            f"{have}: use a Python linked with a newer one (python.org, conda and uv builds bundle one)"
        )
    if not _json_functions():
        raise StoreError(
            f"gpusched needs SQLite's JSON functions, which the SQLite {sqlite3.sqlite_version} this Python"
            f" ({sys.executable}) uses was built without: use a Python linked with SQLite 3.38 or later"
            " (python.org, conda and uv builds bundle one)"
        )


@functools.cache
def _json_functions() -> bool:
    """Whether this Python's SQLite has its JSON functions (asked once a process)."""
    db = sqlite3.connect(":memory:")
    try:
        db.execute("SELECT json_valid('[]'), (SELECT COUNT(*) FROM json_each('[1]'))")
    except sqlite3.OperationalError:  # "no such function: json_valid"
        return False
    finally:
        db.close()
    return True


def _unreadable(path: Path, e: sqlite3.Error) -> str:
    """One line for a state database that SQLite cannot use; for a damaged file, what to do."""
    said = f"cannot read the state database {path}: {e}"
    if isinstance(e, sqlite3.DatabaseError) and not isinstance(e, sqlite3.OperationalError):
        # "file is not a database", "database disk image is malformed"
        said += (
            f"; move it aside (mv {path} {path}.damaged) and gpusched starts a new one"
            " (each attempt's config, log and exit record stay in its logs/ folder)"
        )
    return said


def waiting_out(state: str, not_before: float | None, now: float) -> bool:
    """A job in ``state`` is queued and waits out a backoff at ``now`` (a retried error, a full
    disk, the network: its ``not_before`` still ahead)."""
    return state == "queued" and not_before is not None and not_before > now


def in_chunks(db: sqlite3.Connection | sqlite3.Cursor, sql: str, keys: Sequence[Any]) -> Iterator[Any]:
    """The rows of ``sql``, whose one ``{}`` takes the placeholders of ``keys``, 500 keys a query:
    an SQLite before 3.32 takes at most 999 parameters a statement."""
    for i in range(0, len(keys), 500):
        chunk = keys[i : i + 500]
        yield from db.execute(sql.format(",".join("?" * len(chunk))), chunk)


def _ended_args(e: Ending, now: float) -> tuple[Any, ...]:
    """The arguments of :meth:`Store.finish_attempts`'s update of an ended attempt."""
    x = e.exit
    peak = x.peak_mib if x else None  # the larger of runtime.json's and the sampled peak
    return (
        (x.ended_at if x and x.ended_at else now),
        x.started_at if x else None,
        x.exit_code if x else None,
        x.signal if x else None,
        e.result.outcome.value,
        e.result.reason,
        e.result.line,
        peak,
        peak,
        e.attempt_id,
    )


class Store:
    """A connection to the state database. Cheap to open; one per process/thread."""

    def __init__(self, path: Path | str, *, readonly: bool = False, timeout_s: float = 30.0) -> None:
        check_sqlite()
        self.path = Path(path)
        try:
            if readonly:
                uri = f"file:{self.path}?mode=ro"
                self.db = sqlite3.connect(uri, uri=True, timeout=timeout_s, isolation_level=None)
            else:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fresh = not self.path.exists()
                self.db = sqlite3.connect(self.path, timeout=timeout_s, isolation_level=None)
                if fresh:  # private to the user (SQLite gives -wal/-shm the same mode)
                    os.chmod(self.path, 0o600)
        except sqlite3.Error as e:
            raise StoreError(f"cannot open the state database {self.path}: {e}") from e
        self.db.row_factory = sqlite3.Row
        # the attempts this connection ended, in order, and how many of its transactions rolled
        # back: what lets memwatch.History read a new run's peak instead of the whole history
        self.exited = array("q")  # 8 bytes an attempt: a million cost 8 MB
        self.rollbacks = 0
        self._live: dict[tuple[Any, ...], AttemptRow] = {}  # the last read of live_attempts, by row
        try:
            self.db.execute(f"PRAGMA busy_timeout = {int(timeout_s * 1000)}")
            if not readonly:
                self._init_schema()
            else:
                self._check_version()
        except sqlite3.Error as e:  # not a database, a damaged one, a disk that fails
            self.db.close()
            raise StoreError(_unreadable(self.path, e)) from e

    # ------------------------------------------------------------------ plumbing

    def _init_schema(self) -> None:
        self.db.execute("PRAGMA journal_mode = WAL")
        self.db.execute("PRAGMA synchronous = NORMAL")
        self._renew_indexes()
        # executescript() issues its own COMMIT, so it runs outside our transaction helper;
        # every statement is idempotent (IF NOT EXISTS), so concurrent openers are harmless.
        self.db.executescript(SCHEMA)
        self._renew_entries()
        with self.tx():
            row = self.db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            if row is None:
                self.db.execute(
                    "INSERT INTO meta(key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
                )
            elif int(row["value"]) > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path} was written by a newer gpusched (schema {row['value']} > "
                    f"{SCHEMA_VERSION}): upgrade gpusched, or point GPUSCHED_HOME elsewhere"
                )

    def _renew_indexes(self) -> None:
        """Bring an older gpusched's indexes to this one's (:data:`~gpusched.schema.INDEXES`):
        one defined otherwise is made again, a retired one dropped, in one transaction, so that
        no other connection's query finds the queue without its index meanwhile. A database
        already up to date costs one read of ``sqlite_master``."""

        def stale() -> list[str]:
            q = "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL"
            return [n for n, sql in self.db.execute(q) if n in RETIRED_INDEXES or INDEXES.get(n, sql) != sql]

        if not stale():
            return
        with self.tx():
            for name in stale():  # (again: another opener may have renewed them meanwhile)
                self.db.execute(f"DROP INDEX IF EXISTS {name}")
                if name in INDEXES:
                    self.db.execute(INDEXES[name])

    def _entries_by(self) -> str | None:
        """What wrote the ended jobs' kept entries (:data:`~gpusched.entries.DEFINITION`)."""
        row = self.db.execute("SELECT value FROM meta WHERE key = 'entries'").fetchone()
        return None if row is None else str(row[0])

    def _renew_entries(self) -> None:
        """Bring the triggers that keep the ended jobs' ``status --json`` entries to this
        gpusched's (:data:`~gpusched.entries.TRIGGERS`) where the database says they are another
        gpusched's (or none), in one transaction: no entry of another definition is left, and
        every ended job is due (:meth:`write_entries`). A database already up to date costs one
        lookup in ``meta``."""
        if self._entries_by() == DEFINITION:
            return
        with self.tx():
            if self._entries_by() == DEFINITION:  # (another opener renewed them meanwhile)
                return
            q = "SELECT name FROM sqlite_master WHERE type = 'trigger' AND name LIKE 'ended_entry%'"
            for (name,) in self.db.execute(q).fetchall():
                self.db.execute(f"DROP TRIGGER {name}")
            for sql in TRIGGERS.values():
                self.db.execute(sql)
            self.db.execute("DELETE FROM ended_entries")
            self.db.execute("DELETE FROM entries_due")
            self.db.execute(f"INSERT INTO entries_due (seq) SELECT seq FROM jobs WHERE state IN {ENDED}")
            self.db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('entries', ?)", (DEFINITION,))

    @functools.cached_property
    def entries_kept(self) -> bool:
        """Whether ``ended_entries`` holds ended jobs' entries as this gpusched writes them (the
        database's are this gpusched's, :meth:`_renew_entries`): status then reads those as
        they are and builds only the rest."""
        return self._entries_by() == DEFINITION

    def write_entries(self, limit: int | None = 512) -> int:
        """Write the due entries (the first ``limit`` of them, by job; ``None``: all) into
        ``ended_entries``, in one transaction; returns how many were due. Nothing is written
        where the database's entries are another gpusched's. The daemon calls it after a tick
        that launched nothing, and at least every :data:`gpusched.daemon.ENTRIES_S`: ~12 us an
        entry on 2 cores."""
        if self.db.execute("SELECT 1 FROM entries_due LIMIT 1").fetchone() is None:
            return 0  # (an idle daemon asks every second: a read, not a write transaction)
        with self.tx():
            if self._entries_by() != DEFINITION:
                return 0
            take = "" if limit is None else f" ORDER BY seq LIMIT {int(limit)}"
            (n, last) = self.db.execute(
                f"SELECT COUNT(*), MAX(seq) FROM (SELECT seq FROM entries_due{take})"
            ).fetchone()
            if n:
                self.db.execute(WRITE_DUE, (last,))
                self.db.execute("DELETE FROM entries_due WHERE seq <= ?", (last,))
        return int(n)

    def _check_version(self) -> None:
        row = self.db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row is not None and int(row["value"]) > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path} was written by a newer gpusched (schema {row['value']}): upgrade gpusched"
            )
        have = {r[0] for r in self.db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        for name, cols in ADDED_TABLES.items():
            if name not in have:  # an older gpusched's database: read as empty
                self.db.execute(f"CREATE TEMP TABLE IF NOT EXISTS {name} {cols}")

    def note_changed_jobs(self) -> None:
        """From now on, list the jobs this connection changes (inserts, updates, deletes: by
        ``seq``) for :meth:`changed_jobs`. Temp triggers fire for this connection's own writes
        only; another connection's commit shows as ``PRAGMA data_version`` moving. A rolled
        back change leaves no entry, as it leaves no change."""
        self.db.execute("CREATE TEMP TABLE IF NOT EXISTS jobs_changed(seq INTEGER PRIMARY KEY)")
        for event, row in (("INSERT", "NEW"), ("UPDATE", "NEW"), ("DELETE", "OLD")):
            self.db.execute(
                f"CREATE TEMP TRIGGER IF NOT EXISTS jobs_changed_{event.lower()} AFTER {event} ON main.jobs"
                f" BEGIN INSERT OR IGNORE INTO jobs_changed(seq) VALUES ({row}.seq); END"
            )

    def changed_jobs(self) -> set[int]:
        """The ``seq`` of each job this connection changed since the last call (see
        :meth:`note_changed_jobs`), forgotten as they are returned."""
        seqs = {seq for (seq,) in self.db.execute("SELECT seq FROM temp.jobs_changed")}
        if seqs:
            self.db.execute("DELETE FROM temp.jobs_changed")
        return seqs

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One short write transaction (BEGIN IMMEDIATE: writers queue up instead of
        failing half-way with 'database is locked'). Inside another one it is a savepoint:
        what it changed is undone when it raises, and the outer transaction goes on. So the
        daemon commits a tick's launches (or reaps) together, one commit instead of one per
        job, while each job's change still happens whole or not at all."""
        if self.db.in_transaction:
            self.db.execute("SAVEPOINT job")
            try:
                yield self.db
            except BaseException:
                self.rollbacks += 1
                self.db.execute("ROLLBACK TO job")
                self.db.execute("RELEASE job")
                raise
            else:
                self.db.execute("RELEASE job")
            return
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.rollbacks += 1
            self.db.execute("ROLLBACK")
            raise
        else:
            self.db.execute("COMMIT")

    def close(self) -> None:
        self.db.close()

    def _event(self, now: float, job_id: str | None, kind: str, message: str) -> None:
        self.db.execute(
            "INSERT INTO events(at, job_id, kind, message) VALUES (?, ?, ?, ?)", (now, job_id, kind, message)
        )

    def _move(self, job: Mapping[str, Any], new: JobState, now: float, **cols: Any) -> None:
        """Move ``job`` to ``new`` (checked against the transition table), setting ``cols``."""
        sql, args = self._move_sql(job, new, now, cols)
        if self.db.execute(sql, args).rowcount != 1:  # moved meanwhile: the caller's view is stale
            raise UsageError(f"job {job['id']} changed state meanwhile; try again")

    @staticmethod
    def _move_sql(
        job: Mapping[str, Any], new: JobState, now: float, cols: Mapping[str, Any]
    ) -> tuple[str, tuple[Any, ...]]:
        """The statement and arguments that move ``job`` (``id`` and ``state``) to ``new``,
        checked against the transition table, setting ``cols``; its last two arguments are
        the job's id and its state as read (the move happens only from that state)."""
        job_id, old = job["id"], job["state"]
        check_transition(job_id, old, new)
        sets = "".join(f", {k} = ?" for k in cols)
        sql = f"UPDATE jobs SET state = ?, updated_at = ?{sets} WHERE id = ? AND state = ?"
        return sql, (new.value, now, *cols.values(), job_id, str(old))

    # ------------------------------------------------------------------ submit

    def submit(
        self,
        suite: Suite,
        plan: GpuPlan,
        *,
        backend: str,
        cwd: str,
        env_path: str | None,
        options: dict[str, Any] | None = None,
        rerun: bool = False,
        now: float | None = None,
    ) -> SubmitResult:
        """Enqueue every job of ``suite`` in ONE transaction: either all of them are queued
        (or deliberately skipped) or nothing changes. Jobs already running or finished are left
        alone (finished ones are queued again only with ``rerun``); a job still queued takes
        the plan as submitted now (an edited plan's config, env, priority), as the suite's
        settings do: nothing of it has started."""
        now = time.time() if now is None else now
        queued, requeued, skipped, updated = [], [], [], []
        with self.tx():
            plan_before, backend_before, moved_from = self._upsert_suite(
                suite, plan, backend=backend, cwd=cwd, env_path=env_path, options=options, now=now
            )
            existing = {
                r["id"]: r
                for r in self.db.execute(
                    "SELECT id, state, task, spec, priority FROM jobs WHERE suite = ?", (suite.name,)
                )
            }
            fresh = []
            for job in suite.jobs:
                row = existing.get(job.id)
                if row is None:
                    fresh.append(job)
                    queued.append(job.id)
                elif rerun and JobState(row["state"]).terminal:
                    self._requeue_finished(
                        row, job, tier=0, now=now, why="resubmitted with --rerun", fresh=True
                    )
                    requeued.append(job.id)
                else:
                    skipped.append((job.id, row["state"]))
                    if row["state"] == JobState.QUEUED.value and self._update_queued(row, job, now):
                        updated.append(job.id)
            self._insert_jobs(fresh, now)
            self._event(
                now,
                None,
                "submit",
                f"{suite.name}: {len(queued)} queued, {len(requeued)} requeued, {len(updated)} updated",
            )
        return SubmitResult(
            queued=tuple(queued),
            requeued=tuple(requeued),
            skipped=tuple(skipped),
            updated=tuple(updated),
            plan_before=plan_before,
            backend_before=backend_before,
            moved_from=moved_from,
        )

    def _update_queued(self, row: sqlite3.Row, job: JobSpec, now: float) -> bool:
        """Give a queued job its spec as the plan has it now; True when that changed it."""
        spec = codec.job_to_json(job)
        if (row["spec"], row["task"], row["priority"]) == (spec, job.task, job.priority):
            return False
        self.db.execute(
            "UPDATE jobs SET spec = ?, task = ?, priority = ?, updated_at = ?"
            " WHERE id = ? AND state = 'queued'",
            (spec, job.task, job.priority, now, job.id),
        )
        self._event(now, job.id, "updated", "the plan submitted again changed it")
        return True

    def _upsert_suite(
        self,
        suite: Suite,
        plan: GpuPlan,
        *,
        backend: str,
        cwd: str,
        env_path: str | None,
        options: dict[str, Any] | None,
        now: float,
    ) -> tuple[str | None, str | None, str | None]:
        """Record the suite (a new submit's plan, GPUs, tiers and backend replace the old ones
        for its queued jobs). Returns the GPU plan it had, as "1,1 on GPUs 0,1", and its backend,
        each when this changes it, and the directory it was submitted from, when this one is
        another."""
        old = self.db.execute(
            "SELECT cwd, gpus, slots, backend FROM suites WHERE name = ?", (suite.name,)
        ).fetchone()
        if old is not None and old["cwd"] != cwd:
            active = self.db.execute(
                "SELECT COUNT(*) FROM jobs WHERE suite = ? AND state IN (?, ?)", (suite.name, *ACTIVE_STATES)
            ).fetchone()[0]
            if active:
                raise UsageError(
                    f"suite {suite.name} is already active from {old['cwd']} ({active} jobs): "
                    f"submit this one under another name with --name"
                )
        self.db.execute(
            "INSERT OR REPLACE INTO suites(name, plan_path, cwd, backend, gpus, slots, spec, env_path,"
            " options, submitted_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                suite.name,
                suite.plan_path,
                cwd,
                backend,
                json.dumps(list(plan.gpus)),
                json.dumps(list(plan.slots)),
                codec.suite_to_json(suite),
                env_path,
                json.dumps(options or {}),
                now,
            ),
        )
        if old is None:
            return None, None, None
        moved_from = old["cwd"] if old["cwd"] != cwd else None
        backend_before = old["backend"] if old["backend"] != backend else None
        gpus, slots = json.loads(old["gpus"]), json.loads(old["slots"])
        if (gpus, slots) == (list(plan.gpus), list(plan.slots)):
            return None, backend_before, moved_from
        return f"{','.join(map(str, slots))} on GPUs {','.join(map(str, gpus))}", backend_before, moved_from

    def _insert_jobs(self, jobs: Sequence[JobSpec], now: float) -> None:
        """Queue new jobs, each with its "queued" event: two statements for all of them (one
        a job cost a 1,000-job submit 20 ms more, which the night's first launch waits for)."""
        self.db.executemany(
            "INSERT INTO jobs(id, suite, name, task, spec, priority, state, created_at, updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?, 'queued', ?, ?)",
            [(j.id, j.suite, j.name, j.task, codec.job_to_json(j), j.priority, now, now) for j in jobs],
        )
        self.db.executemany(
            "INSERT INTO events(at, job_id, kind, message) VALUES (?, ?, 'queued', 'submitted')",
            [(now, j.id) for j in jobs],
        )

    def _requeue_finished(
        self, row: sqlite3.Row, job: JobSpec | None, *, tier: int, now: float, why: str, fresh: bool
    ) -> None:
        """Queue a finished job again; ``fresh``: as a new run (:meth:`run_since`)."""
        check_transition(row["id"], row["state"], JobState.QUEUED)
        if fresh:
            self.db.execute("INSERT OR REPLACE INTO fresh_starts(job_id, at) VALUES (?, ?)", (row["id"], now))
        spec = {"spec": codec.job_to_json(job)} if job is not None else {}
        sets = ", ".join(f"{k} = ?" for k in spec)
        self.db.execute(
            "UPDATE jobs SET state = 'queued', tier = ?, errors = 0, lost = 0, outcome = NULL, reason = ?,"
            " line = NULL, wait_reason = NULL, avoid_gpu = NULL, not_before = NULL, cancel_requested = 0,"
            f" ended_at = NULL, updated_at = ?{', ' + sets if sets else ''} WHERE id = ?",
            (tier, why, now, *spec.values(), row["id"]),
        )
        self._event(now, row["id"], "queued", why)

    # ------------------------------------------------------------------ reads

    def run_since(self, job: JobRow) -> float:
        """When the run the job is in began: its submit, or its last start over (``submit
        --rerun``, a retry of a success). Its attempts resume only from checkpoints written
        since (:func:`gpusched.attempt.find_checkpoint`); OOM requeues and a retry of a
        failure or a cancel stay in the run and continue it."""
        row = self.db.execute("SELECT at FROM fresh_starts WHERE job_id = ?", (job.id,)).fetchone()
        return max(job.created_at, row[0]) if row else job.created_at

    def suite(self, name: str) -> SuiteRow | None:
        r = self.db.execute("SELECT * FROM suites WHERE name = ?", (name,)).fetchone()
        return SuiteRow.from_row(r) if r else None

    def suites(self) -> list[SuiteRow]:
        return [SuiteRow.from_row(r) for r in self.db.execute("SELECT * FROM suites ORDER BY submitted_at")]

    def gpu_plans(self, suites: Collection[str] | None = None) -> dict[str, GpuPlan]:
        """The GPU plan of each suite (of ``suites``, when given), by name (no spec decoded)."""
        where, args = suite_filter(suites, column="name")
        q = "SELECT name, gpus, slots FROM suites" + (f" WHERE {where}" if where else "")
        return {name: gpu_plan_of(gpus, slots) for name, gpus, slots in self.db.execute(q, args)}

    def submitted_at(self, names: Sequence[str]) -> dict[str, float]:
        """When each of the suites ``names`` that exist was last submitted, by name."""
        return dict(in_chunks(self.db, "SELECT name, submitted_at FROM suites WHERE name IN ({})", names))

    def suite_names(self) -> list[str]:
        """The suites' names, oldest submission first (no suite decoded)."""
        return [name for (name,) in self.db.execute("SELECT name FROM suites ORDER BY submitted_at")]

    def backends(self) -> set[str]:
        """The backends the suites were submitted with (no suite's spec decoded)."""
        return {r[0] for r in self.db.execute("SELECT DISTINCT backend FROM suites")}

    def job(self, job_id: str) -> JobRow | None:
        r = self.db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return JobRow.from_row(r) if r else None

    def jobs_by_id(self, ids: Collection[str]) -> dict[str, JobRow]:
        """The jobs of ``ids`` that exist, by id (one query, 500 ids at a time)."""
        q = "SELECT * FROM jobs WHERE id IN ({})"
        return {r["id"]: JobRow.from_row(r) for r in in_chunks(self.db, q, list(dict.fromkeys(ids)))}

    def jobs(
        self, *, suite: str | None = None, states: Iterable[str] | None = None, limit: int | None = None
    ) -> list[JobRow]:
        sql, args = "SELECT * FROM jobs", []
        where = []
        if suite is not None:
            where.append("suite = ?")
            args.append(suite)
        if states is not None:
            st = [str(s) for s in states]
            where.append(f"state IN ({','.join('?' * len(st))})")
            args.extend(st)
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY seq"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return [JobRow.from_row(r) for r in self.db.execute(sql, args)]

    def active_suites(self, *, suites: Collection[str] | None = None) -> set[str]:
        """Names of the suites (of ``suites`` only, when given) with queued or running jobs."""
        return set(self.suites_with(ACTIVE_STATES, suites=suites))

    def suites_with(self, states: Collection[str], *, suites: Collection[str] | None = None) -> list[str]:
        """Names of the suites (of ``suites`` only, when given) with a job in one of ``states``,
        by name: an index lookup a suite and state (``jobs_state_suite``), not a walk of the
        jobs (``SELECT DISTINCT`` visited every one: 0.7 ms of each tick with 10k queued)."""
        where, args = suite_filter(suites, column="s.name")
        marks = ",".join("?" * len(states))
        sql = (
            f"SELECT s.name FROM suites s WHERE EXISTS"
            f" (SELECT 1 FROM jobs j WHERE j.state IN ({marks}) AND j.suite = s.name)"
            f"{' AND ' + where if where else ''} ORDER BY s.name"
        )
        return [name for (name,) in self.db.execute(sql, [*states, *args])]

    def counts(self, *, suites: Collection[str] | None = None) -> dict[str, int]:
        """Jobs per state (all states present, zeros included), of ``suites`` when given."""
        where, args = suite_filter(suites)
        sql = "SELECT state, COUNT(*) AS n FROM jobs" + (f" WHERE {where}" if where else "")
        out = {s.value: 0 for s in JobState}
        for r in self.db.execute(sql + " GROUP BY state", args):
            out[r["state"]] = r["n"]
        return out

    def suite_activity(self) -> list[SuiteActivity]:
        """Per suite: whether a job of it is queued or running, and when its last job ended
        (when it was submitted, none having ended), oldest first; ``counts`` left empty. A few
        index lookups a suite, whatever its number of jobs."""
        of_suite = "FROM jobs j WHERE j.suite = s.name"
        sql = (
            f"SELECT s.name, EXISTS (SELECT 1 {of_suite} AND j.ended_at IS NULL),"
            f" COALESCE((SELECT MAX(j.ended_at) {of_suite}), s.submitted_at) FROM suites s"
        )
        seen = [SuiteActivity(name, bool(active), last) for name, active, last in self.db.execute(sql)]
        return sorted(seen, key=lambda a: (a.last, a.name))

    def attempt_spans(self) -> list[tuple[int, str, int, int, float, float | None, bool]]:
        """``(attempt id, task, tier, gpu, started_at, ended_at, ok)`` of every attempt that
        started on a GPU (``ended_at`` None while it runs), for :mod:`gpusched.sharing`."""
        sql = (
            "SELECT a.id, j.task, a.tier, a.gpu, a.started_at, a.ended_at, a.outcome = 'ok' FROM attempts a"
            " JOIN jobs j ON j.id = a.job_id WHERE a.gpu IS NOT NULL AND a.started_at IS NOT NULL"
        )
        return [(r[0], r[1], r[2], r[3], r[4], r[5], bool(r[6])) for r in self.db.execute(sql)]

    def gpu_utils(self, gpu: int, start: float, end: float) -> list[int]:
        """The utilisation samples (%) of ``gpu`` taken from ``start`` to ``end``."""
        sql = "SELECT util_pct FROM gpu_samples WHERE at BETWEEN ? AND ? AND gpu = ? AND util_pct IS NOT NULL"
        return [r[0] for r in self.db.execute(sql, (start, end, gpu))]

    def events_after(
        self, event_id: int, kinds: Collection[str]
    ) -> list[tuple[int, str | None, str, str, str | None]]:
        """``(id, job_id, kind, message, outcome)`` of the events after ``event_id`` of these
        ``kinds``, in order (a walk of the newest rows: ids only grow). ``outcome``: the job's
        latest, which a ``requeue`` event was written with (None for events of no job)."""
        marks = ",".join("?" * len(kinds))
        sql = (
            "SELECT e.id, e.job_id, e.kind, e.message, j.outcome"
            " FROM events e LEFT JOIN jobs j ON j.id = e.job_id"
            f" WHERE e.id > ? AND e.kind IN ({marks}) ORDER BY e.id"
        )
        return [(r[0], r[1], r[2], r[3], r[4]) for r in self.db.execute(sql, (event_id, *kinds))]

    def last_event_id(self) -> int:
        return self.db.execute("SELECT COALESCE(MAX(id), 0) FROM events").fetchone()[0]

    def notify_target(self, name: str) -> tuple[str, str, str | None] | None:
        """The plan's ``notify:`` command of suite ``name``, its workdir and the saved
        environment of the shell that submitted it; None when the plan has none."""
        r = self.db.execute(
            "SELECT json_extract(spec, '$.notify'), json_extract(spec, '$.workdir'), env_path FROM suites"
            " WHERE name = ?",
            (name,),
        ).fetchone()
        return (r[0], r[1], r[2]) if r is not None and r[0] else None

    def suite_ended(self, name: str) -> bool:
        """Whether ``name`` has jobs and none of them is queued or running (an index lookup)."""
        q = "SELECT EXISTS (SELECT 1 FROM jobs WHERE suite = ?), EXISTS (SELECT 1 FROM jobs WHERE suite = ?"
        has, open_ = self.db.execute(q + " AND ended_at IS NULL)", (name, name)).fetchone()
        return bool(has) and not open_

    def counts_by_suite(self, suites: Collection[str]) -> dict[str, dict[str, int]]:
        """The jobs of each of ``suites`` per state (only states it has): a range of the
        ``jobs_state_suite`` index per state and suite, so a few suites cost their own jobs,
        not a walk of every job in the store."""
        states, names = [s.value for s in JobState], sorted(suites)
        out: dict[str, dict[str, int]] = {name: {} for name in names}
        if not names:
            return out
        sql = (
            f"SELECT suite, state, COUNT(*) FROM jobs WHERE state IN ({','.join('?' * len(states))})"
            f" AND suite IN ({','.join('?' * len(names))}) GROUP BY state, suite"
        )
        for suite, state, n in self.db.execute(sql, [*states, *names]):
            out[suite][state] = n
        return out

    def attempt(self, attempt_id: int) -> AttemptRow | None:
        r = self.db.execute("SELECT * FROM attempts WHERE id = ?", (attempt_id,)).fetchone()
        return AttemptRow.from_row(r) if r else None

    def attempts(self, job_id: str) -> list[AttemptRow]:
        q = "SELECT * FROM attempts WHERE job_id = ? ORDER BY n"
        return [AttemptRow.from_row(r) for r in self.db.execute(q, (job_id,))]

    def live_attempts(self) -> list[AttemptRow]:
        """Attempts launching or running (what holds a slot). The daemon reads them every tick:
        a row as it was at the last read is not decoded again (its handle's JSON, its state), so
        a refill among fourteen jobs that run for hours decodes the one that moved."""
        q = "SELECT * FROM attempts WHERE state IN ('launching', 'running') ORDER BY id"
        seen: dict[tuple[Any, ...], AttemptRow] = {}
        for r in self.db.execute(q):
            row = tuple(r)
            seen[row] = self._live.get(row) or AttemptRow.from_row(r)
        self._live = seen
        return list(seen.values())

    def live_elsewhere(self, host: str) -> list[tuple[str, str]]:
        """(job id, machine) of the attempts running or launching that were started as a
        process or pane of another machine than ``host`` (their handle's ``host``)."""
        q = (
            "SELECT job_id, json_extract(handle, '$.host') AS h FROM attempts"
            " WHERE state IN ('launching', 'running') AND h IS NOT NULL AND h != ? ORDER BY id"
        )
        return [(job_id, h) for job_id, h in self.db.execute(q, (host,))]

    def forget_host(self, gone: str, host: str, *, now: float | None = None) -> int:
        """Take the attempts ``gone`` started (a machine or container that no longer exists) as
        this machine's, ``host``: the daemon here then adopts each one it finds running and
        requeues the rest as lost. Returns how many."""
        now = time.time() if now is None else now
        with self.tx():
            jobs = [j for j, h in self.live_elsewhere(host) if h == gone]
            self.db.execute(
                "UPDATE attempts SET handle = json_set(handle, '$.host', ?) WHERE state IN"
                " ('launching', 'running') AND json_extract(handle, '$.host') = ?",
                (host, gone),
            )
            for job_id in jobs:
                why = f"its attempt on {gone}: that machine is gone, said the user"
                self._event(now, job_id, "forgotten", why)
        return len(jobs)

    def attempts_by_token(self, tokens: Collection[str]) -> list[AttemptRow]:
        """The attempts whose launch token is one of ``tokens`` (the token column is unique)."""
        rows = in_chunks(self.db, "SELECT * FROM attempts WHERE token IN ({})", sorted(tokens))
        return sorted((AttemptRow.from_row(r) for r in rows), key=lambda a: a.id)

    def all_attempts(self, *, suite: str | None = None) -> list[AttemptRow]:
        if suite is None:
            rows = self.db.execute("SELECT * FROM attempts ORDER BY id")
        else:
            rows = self.db.execute(
                "SELECT a.* FROM attempts a JOIN jobs j ON j.id = a.job_id WHERE j.suite = ? ORDER BY a.id",
                (suite,),
            )
        return [AttemptRow.from_row(r) for r in rows]

    def events(self, job_id: str | None = None, *, limit: int = 50) -> list[sqlite3.Row]:
        if job_id is None:
            q, args = "SELECT * FROM events ORDER BY id DESC LIMIT ?", (limit,)
        else:
            q, args = "SELECT * FROM events WHERE job_id = ? ORDER BY id DESC LIMIT ?", (job_id, limit)  # type: ignore[assignment]
        return list(reversed(self.db.execute(q, args).fetchall()))

    # ------------------------------------------------------------------ launch (two-phase)

    def begin_attempt(self, a: NewAttempt, *, now: float) -> int:
        """Phase 1 of one launch (:meth:`begin_attempts`); raises why the job cannot take it."""
        (began,) = self.begin_attempts([a], now=now)
        if isinstance(began, GpuschedError):
            raise began
        return began

    def begin_attempts(self, news: Sequence[NewAttempt], *, now: float) -> list[int | GpuschedError]:
        """Phase 1 of a tick's launches: take their slots. Each job moves queued -> running and
        its attempt is recorded ``launching`` with its token, BEFORE anything is started; all
        in one savepoint, a statement for all of them at each step (not five a job: a burst of
        short jobs begins 16 at a time). Returns, per attempt in order, its id, or why its job
        cannot take it (gone, or no longer queued: cancelled by a client since the tick read
        the queue), which leaves the others' as they are."""
        refused: dict[int, GpuschedError] = {}  # by the attempt's place in ``news``
        taken: dict[str, tuple[NewAttempt, int, str]] = {}  # job id -> (attempt, its n, the job's state)
        with self.tx():
            q = "SELECT id, state, attempts FROM jobs WHERE id IN ({})"
            rows = {
                job_id: (state, n) for job_id, state, n in in_chunks(self.db, q, [a.job_id for a in news])
            }
            for i, a in enumerate(news):
                row = rows.get(a.job_id)
                if row is None:
                    refused[i] = UsageError(f"no job {a.job_id}")
                    continue
                old = JobState.RUNNING if a.job_id in taken else row[0]  # (twice in a batch: it runs)
                try:
                    check_transition(a.job_id, old, JobState.RUNNING)
                except GpuschedError as e:
                    refused[i] = e
                    continue
                taken[a.job_id] = (a, row[1] + 1, row[0])
            moved = self.db.executemany(
                "UPDATE jobs SET state = 'running', updated_at = ?, attempts = ?, tier = ?,"
                " wait_reason = NULL WHERE id = ? AND state = ?",
                [(now, n, a.tier, a.job_id, old) for a, n, old in taken.values()],
            )
            if moved.rowcount != len(taken):  # (cannot be, under the write lock: never a half-done begin)
                raise UsageError("a job changed state meanwhile; try again")
            self.db.executemany(
                "INSERT INTO attempts(job_id, n, tier, tier_name, gpu, gpu_uuid, backend, dir, token, state,"
                " placement_reason, predicted_mib, prediction_source, launched_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'launching', ?, ?, ?, ?)",
                [
                    (
                        a.job_id,
                        n,
                        a.tier,
                        a.tier_name,
                        a.gpu,
                        a.gpu_uuid,
                        a.backend,
                        a.dir,
                        a.token,
                        a.placement_reason,
                        a.predicted_mib,
                        a.prediction_source,
                        now,
                    )
                    for a, n, _ in taken.values()
                ],
            )
            self.db.executemany(
                "INSERT INTO events(at, job_id, kind, message) VALUES (?, ?, 'launch', ?)",
                [
                    (
                        now,
                        a.job_id,
                        f"attempt {n} at tier {a.tier_name} on"
                        f" {'no GPU' if a.gpu is None else f'GPU {a.gpu}'}: {a.placement_reason}",
                    )
                    for a, n, _ in taken.values()
                ],
            )
            q = "SELECT token, id FROM attempts WHERE token IN ({})"
            made = dict(in_chunks(self.db, q, [a.token for a, _, _ in taken.values()]))
        return [refused[i] if i in refused else made[a.token] for i, a in enumerate(news)]

    def mark_running(self, attempt_id: int, handle: dict[str, Any], *, now: float) -> None:
        """Phase 2: the pane/process exists."""
        self.mark_running_many([(attempt_id, handle)], now=now)

    def mark_running_many(self, started: Sequence[tuple[int, dict[str, Any]]], *, now: float) -> None:
        """Phase 2 of a tick's launches: their panes/processes exist (one statement for all)."""
        with self.tx():
            self.db.executemany(
                "UPDATE attempts SET state = 'running', handle = ?, started_at = COALESCE(started_at, ?)"
                " WHERE id = ? AND state = 'launching'",
                [(json.dumps(handle), now, attempt_id) for attempt_id, handle in started],
            )

    def set_handle(self, attempt_id: int, handle: dict[str, Any]) -> None:
        with self.tx():
            self.db.execute("UPDATE attempts SET handle = ? WHERE id = ?", (json.dumps(handle), attempt_id))

    def finish_attempt(
        self,
        attempt_id: int,
        *,
        exit: ExitRecord | None,
        result: Classification,
        step: Step,
        now: float,
        count_lost: bool = True,
        job: JobRow | None = None,
    ) -> None:
        """Record one attempt's end and move its job per ``step``, in one transaction
        (:meth:`finish_attempts`, whose :class:`Ending` says what the arguments mean)."""
        ending = Ending(
            attempt_id=attempt_id, exit=exit, result=result, step=step, job=job, count_lost=count_lost
        )
        self.finish_attempts([ending], now=now)

    def finish_attempts(self, ends: Sequence[Ending], *, now: float) -> list[bool]:
        """Record a tick's reaps: each attempt's end, and its job moved per its step, all in
        one savepoint, a statement for all of them at each step (not six a reap: a burst of
        short jobs ends 16 at a time). An attempt recorded ended already is left as it is (a
        restarted daemon may see it twice). Returns, per ending in order, whether it was
        recorded here. A job's move still checks that its state is the one read (its
        ``job``, or read here); a job that moved meanwhile undoes the whole batch."""
        if not ends:
            return []
        with self.tx():
            q = "SELECT id FROM attempts WHERE state != 'exited' AND id IN ({})"
            still = {i for (i,) in in_chunks(self.db, q, [e.attempt_id for e in ends])}
            recorded = []
            for e in ends:  # (an attempt twice in a batch ends once)
                recorded.append(e.attempt_id in still)
                still.discard(e.attempt_id)
            todo = [e for e, ok in zip(ends, recorded, strict=True) if ok]
            if not todo:
                return recorded
            self.db.executemany(
                "UPDATE attempts SET state = 'exited', ended_at = ?, started_at = COALESCE(?, started_at),"
                " exit_code = ?, signal = ?, outcome = ?, reason = ?, line = ?,"
                " peak_mib = COALESCE(MAX(?, peak_mib), ?, peak_mib) WHERE id = ?",
                [_ended_args(e, now) for e in todo],
            )
            q = (
                "SELECT a.id, j.id, j.state, j.errors, j.lost FROM attempts a JOIN jobs j ON j.id = a.job_id"
                " WHERE a.id IN ({})"
            )
            unread = [e.attempt_id for e in todo if e.job is None]
            read = {aid: tuple(rest) for aid, *rest in in_chunks(self.db, q, unread)}
            jobs: dict[str, dict[str, Any]] = {}  # by id, as the batch's moves leave them
            moves, events = [], []
            for e in todo:
                j = e.job
                job_id, state, errors, lost = (
                    (j.id, j.state.value, j.errors, j.lost) if j is not None else read[e.attempt_id]
                )
                row = jobs.setdefault(job_id, {"id": job_id, "state": state, "errors": errors, "lost": lost})
                moves.append(self._step_move(row, e.result, e.step, now, count_lost=e.count_lost))
                events.append((now, job_id, e.step.kind.value, e.step.reason))
            self._move_many(moves)
            self.db.executemany("INSERT INTO events(at, job_id, kind, message) VALUES (?, ?, ?, ?)", events)
        self.exited.extend(e.attempt_id for e in todo)
        return recorded

    @staticmethod
    def _step_move(
        job: dict[str, Any], result: Classification, step: Step, now: float, *, count_lost: bool = True
    ) -> tuple[str, tuple[Any, ...]]:
        """The move of ``job`` (``id``, ``state``, ``errors``, ``lost``) that ``step`` makes after
        ``result``, as :meth:`_move_sql` gives it; ``job`` is changed to what it leaves."""
        cols: dict[str, Any] = {
            "outcome": result.outcome.value,
            "reason": step.reason,
            "line": result.line,
            "tier": step.tier,
        }
        if result.outcome.value in ("error", "timeout"):  # both spend the suite's retry.errors
            cols["errors"] = job["errors"] = job["errors"] + 1
        if result.outcome.value == "lost" and count_lost:
            cols["lost"] = job["lost"] = job["lost"] + 1
        if step.kind is StepKind.REQUEUE:
            new = JobState.QUEUED
            cols.update(avoid_gpu=step.avoid_gpu, not_before=step.not_before)
        else:
            new = {
                StepKind.DONE: JobState.SUCCEEDED,
                StepKind.FAIL: JobState.FAILED,
                StepKind.CANCEL: JobState.CANCELLED,
            }[step.kind]
            cols.update(ended_at=now, cancel_requested=0)
        move = Store._move_sql(job, new, now, cols)
        job["state"] = new.value
        return move

    def _move_many(self, moves: Sequence[tuple[str, tuple[Any, ...]]]) -> None:
        """Run ``moves`` (:meth:`_move_sql`) in order, each run of one statement as one
        ``executemany``; a job that moved meanwhile raises (the caller's view is stale)."""
        for sql, run in itertools.groupby(moves, key=lambda m: m[0]):
            args = [a for _, a in run]
            if self.db.executemany(sql, args).rowcount != len(args):
                raise UsageError("a job changed state meanwhile; try again")

    def set_peak(self, attempt_id: int, peak_mib: int) -> None:
        """Raise an attempt's recorded peak (the daemon samples per-process memory)."""
        self.db.execute(
            "UPDATE attempts SET peak_mib = MAX(COALESCE(peak_mib, 0), ?) WHERE id = ?",
            (peak_mib, attempt_id),
        )

    def add_gpu_pids(self, attempt_id: int, pids: Collection[int]) -> None:
        """Record processes the daemon saw on an attempt's card (see :meth:`exited_gpu_pids`)."""
        self.db.executemany(
            "INSERT OR IGNORE INTO gpu_pids (pid, attempt_id) VALUES (?, ?)", [(p, attempt_id) for p in pids]
        )

    def exited_gpu_pids(
        self, pids: Collection[int], *, since: float
    ) -> list[tuple[AttemptRow, frozenset[int]]]:
        """The attempts still running, or ended at ``since`` or later, that had one of ``pids``
        on their card, each with those of ``pids`` it had: a process that exited stays listed by
        the driver while its memory is released, from before its attempt is reaped to after.
        Ended ones only when recent: a pid is reused in time (a running attempt's too, over
        hours, which is why `status` asks only for processes that have exited)."""
        seen: dict[int, set[int]] = {}  # attempt id -> its pids among ``pids`` (a card's few)
        q = (
            "SELECT g.attempt_id, g.pid FROM gpu_pids g JOIN attempts a ON a.id = g.attempt_id"
            f" WHERE g.pid IN ({','.join('?' * len(pids))}) AND (a.ended_at IS NULL OR a.ended_at >= ?)"
        )
        for aid, pid in self.db.execute(q, (*pids, since)):
            seen.setdefault(aid, set()).add(pid)
        return [(a, frozenset(seen[aid])) for aid in sorted(seen) if (a := self.attempt(aid)) is not None]

    def set_settled(self, attempt_id: int, mib: int | None) -> None:
        """Record what an attempt held when it stopped growing (None: forget it, it was a pause)."""
        if mib is None:
            self.db.execute("DELETE FROM settles WHERE attempt_id = ?", (attempt_id,))
        else:
            self.db.execute(
                "INSERT OR REPLACE INTO settles (attempt_id, mib) VALUES (?, ?)", (attempt_id, mib)
            )

    def add_arrival(self, attempt_id: int, pids: Collection[int], mib: int) -> None:
        """Record that ``attempt_id`` ran out of memory after someone else's processes ``pids``
        (``mib`` in all) came onto its card: the memory history leaves it out."""
        self.db.execute(
            "INSERT OR REPLACE INTO arrivals (attempt_id, mib, pids) VALUES (?, ?, ?)",
            (attempt_id, mib, json.dumps(sorted(pids))),
        )

    def settled(self, attempt_id: int) -> int | None:
        row = self.db.execute("SELECT mib FROM settles WHERE attempt_id = ?", (attempt_id,)).fetchone()
        return None if row is None else int(row[0])

    def step_up(self, at_most: float) -> float | None:
        """The most a successful attempt's peak exceeded what it held when it first settled, as
        a ratio (peak / settled); ratios over ``at_most`` are left out. None without any."""
        row = self.db.execute(
            "SELECT MAX(CAST(a.peak_mib AS REAL) / s.mib) FROM settles s"
            " JOIN attempts a ON a.id = s.attempt_id"
            " WHERE a.outcome = 'ok' AND s.mib > 0 AND a.peak_mib <= ? * s.mib",
            (at_most,),
        ).fetchone()
        return None if row is None or row[0] is None else float(row[0])

    def note(self, job_id: str | None, kind: str, message: str, *, now: float) -> None:
        """Record an event that changes no state (a warning the user should see)."""
        with self.tx():
            self._event(now, job_id, kind, message)

    # ------------------------------------------------------------------ flags

    def drains_at(self) -> float | None:
        """From when no new job is launched (``gpusched drain``, now or ``--at`` a time): the
        :data:`DRAIN_FLAG`'s epoch seconds; None while no drain is asked for. A flag of a
        gpusched before ``--at`` (``"1"``) reads as long past."""
        value = self.flag(DRAIN_FLAG)
        if value is None:
            return None
        try:
            return float(value)
        except ValueError:
            return 0.0

    def flag(self, key: str) -> str | None:
        r = self.db.execute("SELECT value FROM meta WHERE key = ?", (f"flag:{key}",)).fetchone()
        return r["value"] if r else None

    def set_flag(self, key: str, value: str | None) -> None:
        with self.tx():
            if value is None:
                self.db.execute("DELETE FROM meta WHERE key = ?", (f"flag:{key}",))
            else:
                self.db.execute(
                    "INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (f"flag:{key}", value)
                )

    # ------------------------------------------------------------------ user requests

    def request_cancel(
        self, job_ids: Sequence[str], *, now: float | None = None, queued_only: bool = False
    ) -> dict[str, str]:
        """Cancel: queued jobs end at once; running ones are flagged for the daemon to stop
        (with ``queued_only``, left to finish: 'started meanwhile', where one was launched since
        the caller looked). Returns job id -> what happened ('cancelled', 'stopping', or
        'already <state>')."""
        now = time.time() if now is None else now
        out: dict[str, str] = {}
        with self.tx():
            for job_id in job_ids:
                row = self.db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
                if row is None:
                    continue
                state = JobState(row["state"])
                if state is JobState.QUEUED:
                    self._move(
                        row,
                        JobState.CANCELLED,
                        now,
                        ended_at=now,
                        outcome="cancelled",
                        reason="cancelled by user",
                    )
                    self._event(now, job_id, "cancel", "cancelled while queued")
                    out[job_id] = "cancelled"
                elif state is JobState.RUNNING and queued_only:
                    out[job_id] = "started meanwhile, left to finish"
                elif state is JobState.RUNNING:
                    self.db.execute(
                        "UPDATE jobs SET cancel_requested = 1, updated_at = ? WHERE id = ?", (now, job_id)
                    )
                    self._event(now, job_id, "cancel", "cancel requested while running")
                    out[job_id] = "stopping"
                else:
                    out[job_id] = f"already {state.value}"
        return out

    def cancel_requested(self) -> list[str]:
        return [
            r["id"]
            for r in self.db.execute("SELECT id FROM jobs WHERE state = 'running' AND cancel_requested = 1")
        ]

    def stop_attempt(self, attempt_id: int, job_id: str, reason: str, *, now: float) -> None:
        """Record that gpusched stops this attempt at a suite limit, and why (the first
        reason stays)."""
        with self.tx():
            cur = self.db.execute(
                "INSERT OR IGNORE INTO stops (attempt_id, reason, at) VALUES (?, ?, ?)",
                (attempt_id, reason, now),
            )
            if cur.rowcount:
                self._event(now, job_id, "stop", reason)

    def stops(self) -> dict[int, tuple[str, float]]:
        """The live attempts being stopped at a limit: attempt id -> (why, since when)."""
        q = (
            "SELECT s.attempt_id, s.reason, s.at FROM stops s JOIN attempts a ON a.id = s.attempt_id"
            " WHERE a.state IN ('launching', 'running')"  # (attempts_state's words: that index, not a scan)
        )
        return {r[0]: (r[1], r[2]) for r in self.db.execute(q)}

    def gpu_fault(self, gpu: int, job_id: str, why: str, *, now: float, out_after: int) -> bool:
        """Count a fault of ``gpu`` under ``job_id``; at ``out_after`` in a row the GPU goes out
        of service. True when this fault took it out."""
        with self.tx():
            self.db.execute(
                "INSERT INTO gpu_faults (gpu, faults, last_job, last_why, last_at) VALUES (?, 1, ?, ?, ?)"
                " ON CONFLICT (gpu) DO UPDATE SET faults = faults + 1, last_job = excluded.last_job,"
                " last_why = excluded.last_why, last_at = excluded.last_at",
                (gpu, job_id, why, now),
            )
            cur = self.db.execute(
                "UPDATE gpu_faults SET out_since = ? WHERE gpu = ? AND faults >= ? AND out_since IS NULL",
                (now, gpu, out_after),
            )
            if cur.rowcount:
                self._event(now, job_id, "gpu_out", f"GPU {gpu} out of service: {why}")
            return bool(cur.rowcount)

    def gpu_lost(self, gpu: int, why: str, *, now: float) -> bool:
        """Take ``gpu`` out of service at once: the probe finds it lost. Its faults under jobs
        so far are kept; no job is named (``last_job`` ''). True when it was in service."""
        with self.tx():
            cur = self.db.execute(
                "INSERT INTO gpu_faults (gpu, faults, last_job, last_why, last_at, out_since)"
                " VALUES (?, 0, '', ?, ?, ?) ON CONFLICT (gpu) DO UPDATE SET last_job = '',"
                " last_why = excluded.last_why, last_at = excluded.last_at, out_since = excluded.out_since"
                " WHERE out_since IS NULL",
                (gpu, why, now, now),
            )
            if cur.rowcount:
                self._event(now, None, "gpu_out", f"GPU {gpu} out of service: {why}")
            return bool(cur.rowcount)

    def gpus_ok(self, gpus: Collection[int]) -> None:
        """Jobs succeeded on ``gpus``: their faults so far were not in a row (an out-of-service
        GPU stays out: only a person brings it back)."""
        if gpus:  # (a machine's cards: never near SQLite's limit of parameters)
            marks = ",".join("?" * len(gpus))
            self.db.execute(
                f"DELETE FROM gpu_faults WHERE out_since IS NULL AND gpu IN ({marks})", sorted(gpus)
            )

    def count_outcomes(self, job_id: str, outcome: Outcome) -> int:
        """How many of the job's attempts since it was last queued by a person (its submit, a
        ``retry``, a ``--rerun``) ended ``outcome``: a retry after it gave up counts anew."""
        q = (
            "SELECT COUNT(*) FROM attempts WHERE job_id = ? AND outcome = ? AND launched_at >="
            " coalesce((SELECT max(at) FROM events WHERE job_id = ? AND kind = 'queued'), 0)"
        )
        return int(self.db.execute(q, (job_id, outcome.value, job_id)).fetchone()[0])

    def gpus_out(self) -> dict[int, GpuOut]:
        """The GPUs out of service, by index."""
        q = "SELECT * FROM gpu_faults WHERE out_since IS NOT NULL ORDER BY gpu"
        return {
            r["gpu"]: GpuOut(
                since=r["out_since"], faults=r["faults"], job_id=r["last_job"], why=r["last_why"]
            )
            for r in self.db.execute(q)
        }

    def enable_gpus(self, gpus: Sequence[int] | None) -> list[int]:
        """Put GPUs back in service (None: all) and forget their faults; the ones that were out."""
        with self.tx():
            out = sorted(self.gpus_out())
            back = out if gpus is None else [g for g in out if g in gpus]
            if gpus is None:
                self.db.execute("DELETE FROM gpu_faults")
            else:
                self.db.executemany("DELETE FROM gpu_faults WHERE gpu = ?", [(g,) for g in gpus])
            for g in back:
                self._event(time.time(), None, "gpu_in", f"GPU {g} back in service")
            return back

    def retry(self, job_id: str, *, tier: int | None, now: float | None = None) -> JobRow:
        """Queue a failed/cancelled/succeeded job again (at ``tier``, default: where it ended)."""
        return self.retry_many({job_id: tier}, now=now)[0]

    def retry_many(self, tiers: Mapping[str, int | None], *, now: float | None = None) -> list[JobRow]:
        """Queue finished jobs again, each at its tier (None: where it ended), and cut short the
        wait of queued ones that wait out a backoff (:func:`waiting_out`: the disk freed, the
        hub back), all or none: a job that is unknown, running, or queued without such a wait
        raises :class:`UsageError` and nothing changes."""
        now = time.time() if now is None else now
        with self.tx():
            for job_id, tier in tiers.items():
                row = self.db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
                if row is None:
                    raise UsageError(f"no job {job_id}: see `gpusched status` for job ids")
                if waiting_out(row["state"], row["not_before"], now):
                    t = row["tier"] if tier is None else tier
                    self.db.execute(
                        "UPDATE jobs SET not_before = NULL, tier = ?, updated_at = ? WHERE id = ?",
                        (t, now, job_id),
                    )
                    self._event(
                        now, job_id, "queued", f"retried by user at tier index {t}: its wait cut short"
                    )
                    continue
                if not JobState(row["state"]).terminal:
                    state = row["state"]
                    raise UsageError(
                        f"job {job_id} is {state}: only finished jobs, and queued ones waiting out a"
                        " backoff, can be retried (none was)"
                    )
                t = row["tier"] if tier is None else tier
                again = row["state"] == JobState.SUCCEEDED.value  # a failure or a cancel continues
                why = f"retried by user at tier index {t}" + (", from the start" if again else "")
                self._requeue_finished(row, None, tier=t, now=now, why=why, fresh=again)
        jobs = [self.job(job_id) for job_id in tiers]
        return [j for j in jobs if j is not None]

    def set_waits(self, waits: dict[str, str]) -> None:
        """Store why queued jobs wait; writes only reasons that changed."""
        if not waits:
            return
        with self.tx():
            self.db.executemany(
                "UPDATE jobs SET wait_reason = ? WHERE id = ? AND state = 'queued'"
                " AND (wait_reason IS NOT ?)",
                [(why, job_id, why) for job_id, why in waits.items()],
            )

    def record_samples(
        self,
        at: float,
        samples: Sequence[tuple[int, int | None, int | None, int | None]],
        *,
        keep_s: float = 7 * 86400,
    ) -> None:
        """Append GPU samples (gpu, used_mib, total_mib, util_pct) and drop ones older than ``keep_s``."""
        with self.tx():
            self.db.executemany(
                "INSERT INTO gpu_samples(at, gpu, used_mib, total_mib, util_pct) VALUES (?, ?, ?, ?, ?)",
                [(at, *s) for s in samples],
            )
            self.db.execute("DELETE FROM gpu_samples WHERE at < ?", (at - keep_s,))

    def gpu_samples(self, since: float = 0.0) -> list[sqlite3.Row]:
        return self.db.execute("SELECT * FROM gpu_samples WHERE at >= ? ORDER BY at", (since,)).fetchall()
