"""The state database's schema: its version and the tables (SQL text only).

:class:`gpusched.store.Store` creates them on open (every statement is idempotent) and
refuses a file written under a newer :data:`SCHEMA_VERSION`.
"""

from __future__ import annotations

import re

SCHEMA_VERSION = 1

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS suites (
    name TEXT PRIMARY KEY,
    plan_path TEXT NOT NULL,
    cwd TEXT NOT NULL,
    backend TEXT NOT NULL,
    gpus TEXT NOT NULL,            -- json list of GPU indices of the gpu-plan
    slots TEXT NOT NULL,           -- json list of per-GPU caps, same order
    spec TEXT NOT NULL,            -- json Suite (without jobs)
    env_path TEXT,                 -- the submitting shell's environment (sh, 0600)
    options TEXT NOT NULL DEFAULT '{}',  -- backend options (partition, sbatch args, ...)
    submitted_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,   -- submission order (FIFO)
    id TEXT NOT NULL UNIQUE,                 -- suite/name
    suite TEXT NOT NULL,
    name TEXT NOT NULL,
    task TEXT NOT NULL,
    spec TEXT NOT NULL,                      -- json JobSpec
    priority INTEGER NOT NULL DEFAULT 0,
    state TEXT NOT NULL,
    tier INTEGER NOT NULL DEFAULT 0,
    attempts INTEGER NOT NULL DEFAULT 0,
    errors INTEGER NOT NULL DEFAULT 0,       -- plain-error attempts (for opt-in retries)
    lost INTEGER NOT NULL DEFAULT 0,
    outcome TEXT,                            -- last attempt's outcome
    reason TEXT,                             -- why the job is where it is
    line TEXT,                               -- the log line behind the last outcome
    wait_reason TEXT,                        -- why a queued job is not placed yet
    avoid_gpu INTEGER,
    not_before REAL,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    ended_at REAL
);
-- The queue's own indexes hold the queued jobs only (partial: WHERE state = 'queued'): a job
-- enters them when queued and leaves them when launched, and its later moves (running, its end)
-- touch none of them, nor do a night's thousands of finished jobs make them longer. A query uses
-- one only when its WHERE says state = 'queued' in those words. Each still leads with the state,
-- so that the planner, which has no statistics, ranks them as it did when they held every job.
-- the queued jobs in submission order (by seq, the rowid)
CREATE INDEX IF NOT EXISTS jobs_queued ON jobs(state) WHERE state = 'queued';
-- a tick's candidates, in order
CREATE INDEX IF NOT EXISTS jobs_queue ON jobs(state, priority DESC, seq) WHERE state = 'queued';
-- when the next not_before comes (a MIN a tick reads), without walking a long queue
CREATE INDEX IF NOT EXISTS jobs_not_before ON jobs(state, not_before) WHERE state = 'queued';
-- the queued jobs' kinds (status's predictions) by suite, task and tier, without sorting the queue
CREATE INDEX IF NOT EXISTS jobs_kinds ON jobs(state, attempts, suite, task, tier, seq) WHERE state = 'queued';
-- a state's jobs, and which suites have jobs in a state (a tick asks which have some queued: a
-- lookup a suite, not a walk of the queue)
CREATE INDEX IF NOT EXISTS jobs_state_suite ON jobs(state, suite);
CREATE INDEX IF NOT EXISTS jobs_suite ON jobs(suite, seq);
-- which suites plain status shows: whether one has a job not ended (ended_at is NULL exactly
-- while a job is queued or running) and when its last job ended, without reading its jobs (not
-- the state too: the daemon would rewrite the entry at each of a job's moves, not at its end)
CREATE INDEX IF NOT EXISTS jobs_ended ON jobs(suite, ended_at);
CREATE TABLE IF NOT EXISTS attempts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL REFERENCES jobs(id),
    n INTEGER NOT NULL,                      -- 1-based attempt number of the job
    tier INTEGER NOT NULL,
    tier_name TEXT NOT NULL,
    gpu INTEGER,
    gpu_uuid TEXT,
    backend TEXT NOT NULL,
    dir TEXT NOT NULL,
    token TEXT NOT NULL UNIQUE,
    state TEXT NOT NULL,
    handle TEXT,                             -- json executor handle
    placement_reason TEXT,
    predicted_mib INTEGER,
    prediction_source TEXT,
    launched_at REAL NOT NULL,
    started_at REAL,
    ended_at REAL,
    exit_code INTEGER,
    signal INTEGER,
    outcome TEXT,
    reason TEXT,
    line TEXT,
    peak_mib INTEGER,
    UNIQUE(job_id, n)
);
-- the attempts that hold a slot (launching, running), and no other: an attempt leaves it at its end
CREATE INDEX IF NOT EXISTS attempts_state ON attempts(state) WHERE state IN ('launching', 'running');
-- the attempts that say something about memory: memwatch's history reads only these, however many
-- attempts ended without a peak
CREATE INDEX IF NOT EXISTS attempts_peaks ON attempts(job_id) WHERE peak_mib IS NOT NULL OR outcome = 'oom';
-- what an attempt held when it first stopped growing: its plateau, before later peaks such as
-- evaluation's. A finished attempt's peak over it is how much a job still grows after it looks
-- settled, which a running job whose peak is still a guess is held to (memwatch.MemoryWatch)
CREATE TABLE IF NOT EXISTS settles (
    attempt_id INTEGER PRIMARY KEY REFERENCES attempts(id),
    mib INTEGER NOT NULL
);
-- attempts that ran out of memory after someone else's processes came onto their card while
-- they ran and took more than placement's headroom: such an OOM says nothing of what the job
-- needs, so memwatch's history leaves it out, and the job ran again at the same tier
CREATE TABLE IF NOT EXISTS arrivals (
    attempt_id INTEGER PRIMARY KEY REFERENCES attempts(id),
    mib INTEGER NOT NULL,          -- what the newcomers held
    pids TEXT NOT NULL             -- json list of their pids
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    job_id TEXT,
    kind TEXT NOT NULL,
    message TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_job ON events(job_id);
CREATE TABLE IF NOT EXISTS gpu_samples (
    at REAL NOT NULL,
    gpu INTEGER NOT NULL,
    used_mib INTEGER,
    total_mib INTEGER,
    util_pct INTEGER
);
CREATE INDEX IF NOT EXISTS gpu_samples_at ON gpu_samples(at);
"""

#: Tables added since schema 1 (the version did not change: a database without them gains them
#: on its next read-write open). A read-only open of such a database (``status`` beside an
#: older daemon) gets each as an empty TEMP table of the same shape: SQLite resolves a name to
#: the temp schema before the main one, so the readers need no second path.
ADDED_TABLES: dict[str, str] = {
    # attempts gpusched is stopping at a suite limit (limits.time, limits.silence), and why:
    # kept in the database so that a daemon restarted between the SIGTERM and the reap still
    # reaps the attempt as a timeout, not as the error its signal would look like
    "stops": """(
        attempt_id INTEGER PRIMARY KEY REFERENCES attempts(id),
        reason TEXT NOT NULL,
        at REAL NOT NULL
    )""",
    # GPUs that failed under jobs (outcome gpu_fault): faults in a row (a success there starts
    # the count again) and, once there were too many, since when the GPU is out of service: no
    # job is placed on it until `gpusched gpus --enable` deletes its row
    "gpu_faults": """(
        gpu INTEGER PRIMARY KEY,
        faults INTEGER NOT NULL,
        last_job TEXT NOT NULL,
        last_why TEXT NOT NULL,
        last_at REAL NOT NULL,
        out_since REAL
    )""",
    # jobs queued again to start over (`submit --rerun`, a retry of a success), and when: the
    # run a job is in began then, else when it was submitted. A checkpoint older than its run is
    # another run's, never resumed from (a retry of a failed or cancelled job continues its run)
    "fresh_starts": """(
        job_id TEXT PRIMARY KEY,
        at REAL NOT NULL
    ) WITHOUT ROWID""",
    # the processes the daemon saw on an attempt's card: how `status` still knows them as the
    # attempt's once they have exited while the driver still lists them, releasing their memory
    # (no /proc entry is left to read by then); keyed by pid, the lookup
    "gpu_pids": """(
        pid INTEGER NOT NULL,
        attempt_id INTEGER NOT NULL REFERENCES attempts(id),
        PRIMARY KEY (pid, attempt_id)
    ) WITHOUT ROWID""",
    # each ended job's `status --json` entry, as SQLite wrote it, and the ended jobs whose entry is
    # still to be written (gpusched.entries: triggers keep both true, the daemon writes the due)
    "ended_entries": """(
        seq INTEGER PRIMARY KEY REFERENCES jobs(seq),
        entry TEXT NOT NULL
    )""",
    "entries_due": "(seq INTEGER PRIMARY KEY REFERENCES jobs(seq))",
}

SCHEMA += "".join(f"CREATE TABLE IF NOT EXISTS {name} {cols};\n" for name, cols in ADDED_TABLES.items())

#: Each index of :data:`SCHEMA` as SQLite keeps its definition (``sqlite_master.sql``): an
#: older database whose index of the same name says otherwise has it made again on open.
INDEXES: dict[str, str] = {
    name: f"CREATE INDEX {name} {rest}"
    for name, rest in re.findall(r"^CREATE INDEX IF NOT EXISTS (\w+) (ON [^;]*);", SCHEMA, re.MULTILINE)
}

#: Indexes an older gpusched made that this one does without: dropped on open. ``jobs_state``
#: (every job by state) went when the queue's indexes became the queued jobs' only; a state's
#: jobs are found through ``jobs_state_suite``. ``attempts_job`` was the index SQLite already
#: keeps for ``UNIQUE(job_id, n)``, written twice at every launch.
RETIRED_INDEXES = ("jobs_state", "attempts_job")
