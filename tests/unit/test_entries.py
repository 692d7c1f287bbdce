"""The ended jobs' ``status --json`` entries the store keeps (gpusched.entries): whatever happens to
a job, its attempts or its suite, the kept entry is the one status would build at that moment,
or there is none and status builds it; and keeping them costs the daemon's hot path nothing that
grows with what it writes."""

from __future__ import annotations

import re
from pathlib import Path

from msgspec.structs import replace

from gpusched import entries, status_rows
from gpusched.model import GpuPlan, Tier
from gpusched.store import Store
from tests.unit.test_memory_scheduler import GIB, Box, oom_tail
from tests.unit.test_status import mixed_suite


def built_and_read(store: Store, now: float) -> tuple[list[str], list[str]]:
    """Every job's entry as status builds it and as status reads it where one is kept."""
    status_rows.show_tiers(store)
    built = status_rows.job_entries(store, now=now, predictions=())
    read = status_rows.job_entries(store, now=now, predictions=(), kept=True)
    return [e for _, _, e in built], [e for _, _, e in read]


def kept(store: Store) -> dict[int, str]:
    return dict(store.db.execute("SELECT seq, entry FROM ended_entries").fetchall())


def ended_seqs(store: Store) -> set[int]:
    return {j.seq for j in store.jobs() if j.state.value in ("succeeded", "failed", "cancelled")}


def night(tmp_path: Path) -> Box:
    """Three cards and 18 jobs: one succeeded, one OOMed (queued again at tier B with a history),
    one failed with its line, one cancelled while queued, the next three running."""
    box = Box(tmp_path, GpuPlan(gpus=(0, 1, 2), slots=(1, 1, 1)), cards="3x24GiB")
    box.submit(mixed_suite(tmp_path))
    box.tick()
    box.ex.finish(box.ex.token_of("E1/0-qnli"), exit_code=0, runtime={"peak_mib": 9 * GIB})
    box.ex.finish(
        box.ex.token_of("E1/0-sst2"), exit_code=1, output=oom_tail(23.5), runtime={"peak_mib": 23 * GIB}
    )
    box.ex.finish(box.ex.token_of("E1/0-rte"), exit_code=1, output="ValueError: label column missing\n")
    box.store.request_cancel(["E1/5-rte"])
    box.tick()
    return box


def test_every_kept_entry_is_the_one_status_builds_whatever_happened_since(tmp_path: Path) -> None:
    box = night(tmp_path)
    store = box.store
    assert store.entries_kept
    assert store.write_entries() == 3  # the ends marked them due; the daemon writes them
    assert set(kept(store)) == ended_seqs(store) and len(kept(store)) == 3
    built, read = built_and_read(store, box.now)
    assert read == built

    # after the ends: a late peak, a Slurm handle, a retry, a suite submitted again with other tiers
    qnli = box.attempt("E1/0-qnli")
    store.set_peak(qnli.id, 11 * 1024)
    store.set_handle(box.attempt("E1/0-rte").id, {"slurm_job_id": 4242, "host": "n1"})
    store.retry("E1/5-rte", tier=None, now=box.now)  # cancelled -> queued: its entry goes at once
    assert kept(store) == {}  # the other two wait to be written again: status builds them meanwhile
    built, read = built_and_read(store, box.now)
    assert read == built
    store.write_entries()
    built, read = built_and_read(store, box.now)
    assert read == built and len(kept(store)) == 2
    rte = next(e for e in read if '"id":"E1/0-rte"' in e)
    assert '"slurm":{"job_id":4242}' in rte and '"peak_mib":11264' in next(e for e in read if "0-qnli" in e)

    suite = mixed_suite(tmp_path)
    again = {"backend": "fake", "cwd": str(tmp_path), "env_path": None}
    store.submit(suite, box.plan, **again)  # type: ignore[arg-type]
    assert len(kept(store)) == 2  # submitted again as it was: its entries stay
    store.submit(replace(suite, tiers=(Tier(name="small"),)), box.plan, **again)  # type: ignore[arg-type]
    assert kept(store) == {}  # other tiers: written again from the new ones
    store.write_entries()
    built, read = built_and_read(store, box.now)
    assert read == built and '"tier":"small"' in next(e for e in read if "0-qnli" in e)

    # an ended job whose attempt lost its end: its run time is the clock's, so it is never kept
    store.db.execute(
        "UPDATE attempts SET started_at = ?, ended_at = NULL WHERE id = ?", (box.now - 5, qnli.id)
    )
    store.write_entries()
    assert qnli.job_id not in "".join(kept(store).values())
    built, read = built_and_read(store, box.now + 60)
    assert read == built


def test_status_reads_the_kept_text_as_it_is(tmp_path: Path) -> None:
    """Not a second build that happens to agree: what ``ended_entries`` holds is what status
    shows, and only for the ended jobs."""
    box = night(tmp_path)
    box.store.write_entries()
    box.store.db.execute("UPDATE ended_entries SET entry = json_object('kept', seq)")
    jobs = box.status()["jobs"]
    assert sorted(j["kept"] for j in jobs if "kept" in j) == sorted(ended_seqs(box.store))
    assert sum("kept" not in j for j in jobs) == 15  # queued and running: built


def test_a_store_no_gpusched_with_kept_entries_wrote_is_read_as_before_and_caught_up(tmp_path: Path) -> None:
    """An older gpusched's database (no triggers, no tables): status opened read-only builds every
    entry; the next read-write open puts the triggers in and marks every ended job due."""
    box = night(tmp_path)
    box.store.write_entries()
    db = box.store.db
    for name in entries.TRIGGERS:
        db.execute(f"DROP TRIGGER {name}")
    db.execute("DROP TABLE ended_entries")
    db.execute("DROP TABLE entries_due")
    db.execute("DELETE FROM meta WHERE key = 'entries'")
    path = box.store.path

    old = Store(path, readonly=True)
    assert not old.entries_kept
    built, read = built_and_read(old, box.now)
    assert read == built and len(built) == 18
    old.close()

    renewed = Store(path)
    assert renewed.entries_kept and kept(renewed) == {}
    assert renewed.write_entries() == 3
    assert set(kept(renewed)) == ended_seqs(renewed)
    built, read = built_and_read(renewed, box.now)
    assert read == built


def test_entries_another_gpusched_wrote_are_neither_read_nor_written(tmp_path: Path) -> None:
    box = night(tmp_path)
    store = box.store
    store.write_entries()
    store.db.execute("UPDATE meta SET value = 'a newer gpusched' WHERE key = 'entries'")
    store.db.execute("UPDATE ended_entries SET entry = '{}'")  # as another definition wrote them
    reader = Store(store.path, readonly=True)
    assert not reader.entries_kept
    built, _ = built_and_read(reader, box.now)
    assert "{}" not in built  # built, not read
    store.db.execute("INSERT INTO entries_due SELECT seq FROM jobs")
    assert store.write_entries() == 0 and set(kept(store).values()) == {"{}"}
    # this gpusched's next read-write open takes the database back and starts again
    again = Store(store.path)
    assert again.entries_kept and kept(again) == {} and again.write_entries() == 3


def test_an_ended_entry_is_built_from_what_does_not_move_and_its_triggers_see_every_column_it_reads() -> None:
    """A key whose SQL reads the clock, the prediction or status's temp tables must say what it is
    for an ended job (ENDED_FIELDS); and a column an ended entry reads that the triggers do not
    watch would leave a kept entry stale when it changes."""
    moving = re.compile(r":now|\bp\.|\bt\.|temp\.")
    for key, sql in entries.ENTRY_FIELDS.items():
        if moving.search(sql):
            assert entries.ENDED_FIELDS[key] != sql, key
    assert list(entries.ENDED_FIELDS) == list(entries.ENTRY_FIELDS)
    assert not any(moving.search(sql) for sql in entries.ENDED_FIELDS.values())
    never_change = {"seq", "id", "suite", "name"}
    assert set(re.findall(r"\bj\.(\w+)", entries.KEEP)) <= set(entries.JOB_COLUMNS) | never_change
    assert set(re.findall(r"\ba\.(\w+)", entries.KEEP)) <= set(entries.ATTEMPT_COLUMNS) | {
        "id",
        "job_id",
        "n",
    }


def test_the_waits_a_tick_writes_run_no_trigger_and_a_move_builds_no_list(tmp_path: Path) -> None:
    """The daemon writes the waits of up to 256 queued jobs a tick and moves 16 jobs a tick in a
    burst: the waits must compile no trigger program (SQLite sets one up for every row, even where
    its WHEN says no), and the moves' WHEN no ``IN (...)`` list (built again at each firing)."""
    store = Store(tmp_path / "gs.db")

    def ops(sql: str) -> list[str]:
        return [row[1] for row in store.db.execute("EXPLAIN " + sql, [None] * sql.count("?"))]

    assert "Program" not in ops("UPDATE jobs SET wait_reason = ? WHERE id = ? AND state = 'queued'")
    assert "Program" in ops("UPDATE jobs SET state = ?, updated_at = ? WHERE id = ? AND state = ?")
    for sql in entries.TRIGGERS.values():
        assert " IN (" not in sql.split(" BEGIN ")[0], sql


def test_writing_the_due_entries_reads_those_jobs_not_every_ended_one(tmp_path: Path) -> None:
    """The daemon writes a few entries at a time: each write must look the due jobs up by
    ``seq``, not walk every ended job the store holds (a cost that grew with months of nights)."""
    store = Store(tmp_path / "gs.db")
    select = entries.WRITE_DUE[entries.WRITE_DUE.index("SELECT") :]
    plan = [row[3] for row in store.db.execute("EXPLAIN QUERY PLAN " + select, (1,))]
    assert any(d.startswith("SEARCH j USING INTEGER PRIMARY KEY") for d in plan), plan
    assert not any("jobs_state" in d for d in plan), plan


def test_an_entry_that_cannot_be_built_is_left_to_status_and_the_others_are_written(tmp_path: Path) -> None:
    """One ended attempt whose handle is not JSON (a hand edit) must not keep every other entry
    from being written: the writer leaves that one out."""
    box = night(tmp_path)
    store = box.store
    store.db.execute("UPDATE attempts SET handle = 'not json' WHERE job_id = 'E1/0-qnli'")
    assert store.write_entries() == 3
    seq = {j.id: j.seq for j in store.jobs()}
    assert set(kept(store)) == {seq["E1/0-rte"], seq["E1/5-rte"]}
