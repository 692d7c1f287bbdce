"""The reads behind ``status``: the queued jobs' kinds and each job's ``status --json``
entry, built by SQLite (:func:`job_entries`). Functions of an open :class:`~gpusched.store.Store`;
only :mod:`gpusched.views` calls them.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from gpusched.entries import ENTRY_FIELDS, PREDICTION_FIELDS, TIER_FIELDS, entry_object
from gpusched.errors import StoreError
from gpusched.store import suite_filter

if TYPE_CHECKING:
    from gpusched.store import Store

#: A queued job's kind, as status asks the scheduler's prediction of it: a job with a history
#: of its own by its id; one that never ran by its suite, task and tier (fields joined by the
#: unit separator), its task left out when no job of that task has run anywhere: such a task
#: has no history to predict from, so all such predict alike, and a suite whose jobs are each
#: their own task (a plan without ``task:``) asks once per tier, not once per job
#: (views.queued_predictions). Computed per group of queued jobs (:func:`queued_kinds`), not
#: per job: the entries join their group's prediction by its columns (:data:`Group`).
_KIND = (
    "CASE WHEN j.attempts > 0 THEN j.id ELSE j.suite || char(31)"
    " || (CASE WHEN j.task IN (SELECT task FROM jobs WHERE attempts > 0) THEN j.task ELSE '' END)"
    " || char(31) || j.tier END"
)

#: The queued jobs' CTE is read by both halves of the kinds' query: inlined into each (a walk of an
#: index) rather than copied into a temporary table first, where SQLite takes the hint (3.35+).
_NOT_MATERIALIZED = "NOT MATERIALIZED " if sqlite3.sqlite_version_info >= (3, 35) else ""

#: A group of queued jobs that share a prediction: suite, task, tier, and the job's id for a job
#: that ran (its own group), ``''`` for all that never did; then the group's kind (:data:`_KIND`).
Group = tuple[str, str, int, str, str]
#: A group's prediction as the entries join it: the group's first four fields, then the predicted
#: MiB, its source and the tier its jobs would start at.
PredictedGroup = tuple[str, str, int, str, int | None, str, str]


def _entry(fields: Sequence[str]) -> str:
    """SQLite's json_object of ``fields`` (keys of :data:`ENTRY_FIELDS`), in that order."""
    return entry_object(fields)


def queued_kinds(
    store: Store, *, suites: Collection[str] | None = None, limit: int | None = None
) -> tuple[dict[str, str], list[Group]]:
    """The kinds (:data:`_KIND`) of the queued jobs (of ``suites``; the first ``limit`` of
    them in submission order), each with the id of its first queued job standing for it,
    and the groups of those jobs (:data:`Group`) with their kinds."""
    where, args = suite_filter(suites)
    where = "state = 'queued'" + (f" AND {where}" if where else "")
    order = "" if limit is None else f" ORDER BY seq LIMIT {int(limit)}"
    # The jobs that never ran come one row per suite, task and tier (a walk of the jobs_kinds
    # index, no sort of the queue), with the kind and id of the group's first job; groups
    # whose kind leaves the task out (it never ran) share it. A job that ran is its own group.
    sql = (
        f"WITH q AS {_NOT_MATERIALIZED}(SELECT * FROM jobs WHERE {where}{order})"
        f" SELECT {_KIND}, j.id, MIN(j.seq), j.suite, j.task, j.tier, '' FROM q j WHERE j.attempts = 0"
        " GROUP BY j.suite, j.task, j.tier"
        " UNION ALL SELECT j.id, j.id, j.seq, j.suite, j.task, j.tier, j.id FROM q j WHERE j.attempts > 0"
    )
    first: dict[str, tuple[int, str]] = {}
    groups: list[Group] = []
    for kind, job_id, seq, *group in store.db.execute(sql, args):
        if kind not in first or seq < first[kind][0]:
            first[kind] = (seq, job_id)
        groups.append((*group, kind))
    return {kind: job_id for kind, (_, job_id) in first.items()}, groups


def show_tiers(store: Store, *, suites: Collection[str] | None = None) -> None:
    """Fill the tiers table the entries join (``temp.shown_tier``: each suite's tiers' names,
    by index, and the last one's again at index -1) with the suites' (of ``suites``), read
    from each suite's row by SQLite: a store of 250 suites is not decoded into records for
    their names (15 ms of every `status` there). Once per status, before :func:`job_entries`."""
    db = store.db  # (a temp table lives in this connection's own temp database: read-only too)
    db.execute(
        "CREATE TEMP TABLE IF NOT EXISTS shown_tier"
        " (suite TEXT, idx INTEGER, name TEXT, n INT, PRIMARY KEY (suite, idx)) WITHOUT ROWID"
    )
    db.execute("DELETE FROM temp.shown_tier")
    where, args = suite_filter(suites, column="s.name")
    with _json1():
        db.execute(
            "INSERT INTO temp.shown_tier SELECT s.name, t.key, json_extract(t.value, '$.name'),"
            " json_array_length(s.spec, '$.tiers') FROM suites s, json_each(s.spec, '$.tiers') t"
            + (f" WHERE {where}" if where else ""),
            args,
        )
    db.execute("INSERT INTO temp.shown_tier SELECT suite, -1, name, n FROM temp.shown_tier WHERE idx = n - 1")


@contextmanager
def _json1() -> Iterator[None]:
    """One line for an SQLite without its JSON functions, which status needs."""
    try:
        yield
    except sqlite3.OperationalError as e:  # an SQLite built without JSON1, before 3.38 made it standard
        if "no such function" not in str(e) and "no such table: json_each" not in str(e):
            raise
        raise StoreError(
            f"status needs SQLite's JSON functions, which the SQLite {sqlite3.sqlite_version} that "
            f"Python uses here lacks ({e}): use a Python linked with SQLite 3.38 or later"
        ) from e


def job_entries(
    store: Store,
    *,
    now: float,
    predictions: Iterable[PredictedGroup],
    suites: Collection[str] | None = None,
    state: str | None = None,
    limit: int | None = None,
    fields: Sequence[str] = tuple(ENTRY_FIELDS),
    kept: bool = False,
) -> list[tuple[str, str | None, str]]:
    """``(state, id, entry)`` per job (of ``suites``, in ``state``; the first ``limit``), in
    submission order (``id`` for running jobs only: the caller completes their entries),
    ``entry`` being the job's ``status --json`` entry as JSON text (its ``fields``,
    :data:`ENTRY_FIELDS`), built by SQLite: a 10k-job store lists in the time one query
    takes, with no Python object per field. The tiers' names come from :func:`show_tiers`,
    called first; ``predictions`` gives each group of queued jobs its prediction
    (:data:`PredictedGroup`). ``kept``: the store keeps every ended job's entry as this gpusched
    writes it (:attr:`Store.entries_kept <gpusched.store.Store.entries_kept>`); then an ended
    job's whole entry is read as it was kept, not built again."""
    db = store.db
    db.execute(
        "CREATE TEMP TABLE IF NOT EXISTS shown_prediction (suite TEXT, task TEXT, tier INTEGER, id TEXT,"
        " mib INTEGER, source TEXT, start_tier TEXT, PRIMARY KEY (suite, task, tier, id)) WITHOUT ROWID"
    )
    db.execute("DELETE FROM temp.shown_prediction")
    db.executemany("INSERT INTO temp.shown_prediction VALUES (?, ?, ?, ?, ?, ?, ?)", predictions)
    # the newest attempt is number j.attempts: begin_attempt counts it and inserts it in one
    # transaction (a lookup in attempts(job_id, n), no MAX subquery per job)
    # (SQLite leaves out the attempts join where no field reads it; the temp tables' joins are
    # left out here where no field reads them: ~13 ms of 10k jobs even unread)
    joins = " LEFT JOIN attempts a ON a.job_id = j.id AND a.n = j.attempts"
    if TIER_FIELDS.intersection(fields):
        joins += " LEFT JOIN temp.shown_tier t ON t.suite = j.suite AND t.idx = j.tier"
    if PREDICTION_FIELDS.intersection(fields):
        # by columns: a kind built per job (a string, and whether its task ran) cost 2x
        joins += (
            " LEFT JOIN temp.shown_prediction p ON j.state = 'queued' AND p.suite = j.suite"
            " AND p.task = j.task AND p.tier = j.tier"
            " AND p.id = (CASE WHEN j.attempts > 0 THEN j.id ELSE '' END)"
        )
    entry = _entry(fields)
    if kept and tuple(fields) == tuple(ENTRY_FIELDS) and state not in ("queued", "running"):
        # the kept entry (a rowid lookup) where there is one; else built in a subquery of this
        # job's own, which SQLite runs only then: joins in the outer query cost each job
        built = f"(SELECT {entry} FROM (SELECT 1){joins})"
        entry = f"coalesce((SELECT e.entry FROM ended_entries e WHERE e.seq = j.seq), {built})"
        joins = ""
    sql = f"SELECT j.state, CASE WHEN j.state = 'running' THEN j.id END, {entry} FROM jobs j{joins}"
    where, args = [], dict[str, Any](now=now)
    if suites is not None:
        named = {f"suite{i}": name for i, name in enumerate(sorted(suites))}
        # (+: not by the suite's index: each state's first rows come from the state's index,
        # where a suite of 10k jobs would be read whole for each state)
        where.append(f"+j.suite IN ({', '.join(':' + k for k in named)})")
        args.update(named)
    if state is not None:
        where.append("j.state = :state")
        args["state"] = state
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += " ORDER BY j.seq"
    if limit is not None:
        sql += f" LIMIT {int(limit)}"
    cur = db.cursor()
    cur.row_factory = None  # tuples: a sqlite3.Row looks each column up by name
    with _json1():
        return cur.execute(sql, args).fetchall()
