"""The scheduler daemon: one per user (a file lock), started by ``submit``, stoppable.

It sleeps on a FIFO (``Home.wake``): the wrapper of every job pokes it when the job ends,
and clients poke it after a submit or cancel, so a freed slot is refilled in milliseconds
without polling. Without pokes it still ticks every ``interval_s`` to sample GPUs.

Stopping the daemon leaves jobs running; a new daemon re-adopts them (``Scheduler.reconcile``).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import stat
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpusched.errors import DaemonError, UsageError
from gpusched.home import Home, this_host
from gpusched.logs import last_line, logger, tail

if TYPE_CHECKING:
    from gpusched.store import Store

log = logger(__name__)  # logging is imported on first use (status logs nothing)

#: Seconds between SIGTERM and SIGKILL when a running job is cancelled (tests set it low).
CANCEL_GRACE_ENV = "GPUSCHED_CANCEL_GRACE_S"
#: How much daemon.log says: a logging level's name (INFO by default, DEBUG for more).
LOG_ENV = "GPUSCHED_LOG"
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_LOCK_WAIT_S = 2.0
#: The ended jobs' ``status --json`` entries that their triggers marked due (gpusched.entries) are
#: written after a tick that launched nothing, and at least this often in a night that launches
#: at every tick: a burst of short jobs is not slowed for them (status builds what is not written).
ENTRIES_S = 5.0


# --------------------------------------------------------------------------- clients


def info(home: Home) -> dict[str, Any] | None:
    """The running daemon's info (pid, started_at, probe, ...), or None when none runs."""
    if not _locked(home.lock):
        return None
    try:
        return json.loads(home.daemon_info.read_text())
    except (OSError, ValueError):
        return {"pid": None}


#: another machine's daemon that published its GPUs this recently (it does every second) runs
OTHER_HOST_LIVE_S = 60.0


def check_machine(home: Home, *, now: float | None = None, holding_lock: bool = False) -> None:
    """UsageError, before anything is read or written, when a daemon of another machine runs
    on this state directory: it lies on a disk both share (a home directory over NFS). One
    queue cannot be run from two machines: SQLite's WAL needs its readers and writers on one
    machine, and each daemon would take the other's jobs for lost and run them again.
    ``holding_lock``: the caller is a daemon that took the lock (it would see itself)."""
    try:
        doc = json.loads(home.daemon_info.read_text())
    except (OSError, ValueError):
        return
    host = doc.get("host") if isinstance(doc, dict) else None
    if not isinstance(host, str) or host == this_host() or _runs_here(doc):
        return
    from gpusched.gpus.published import published_at

    now = time.time() if now is None else now
    seen = published_at(home) or float(doc.get("started_at") or 0.0)
    if now - seen < OTHER_HOST_LIVE_S or (not holding_lock and _locked(home.lock)):
        raise UsageError(_shared(home, f"is in use by gpusched's daemon on {host}"))


def _runs_here(doc: dict[str, Any]) -> bool:
    """True when the daemon ``doc`` describes is a process of this machine (renamed since it
    started): its pid runs here, started when it says (it writes the time after its imports)."""
    from gpusched import proc

    pid, started = doc.get("pid"), doc.get("started_at")
    if not isinstance(pid, int) or not isinstance(started, (int, float)):
        return False
    began = proc.started_at(pid)
    return began is not None and 0.0 <= started - began < 30.0


def check_jobs_elsewhere(home: Home, store: Store) -> None:
    """UsageError when jobs of this queue were started on another machine and are still
    recorded running: a daemon here would find no such process and run them again."""
    elsewhere = store.live_elsewhere(this_host())
    if not elsewhere:
        return
    host = elsewhere[0][1]
    jobs = [j for j, h in elsewhere if h == host]
    named = ", ".join(jobs[:3]) + (f" and {len(jobs) - 3} more" if len(jobs) > 3 else "")
    raise UsageError(
        _shared(home, f"has {len(jobs)} job{'s' * (len(jobs) != 1)} running on {host} ({named})")
        + f"; if {host} is gone for good (a container since replaced), `gpusched daemon start"
        f" --forget-host {host}` takes them as this machine's (those not running here run again)"
    )


def _shared(home: Home, what: str) -> str:
    return (
        f"{home.root} {what}: a queue belongs to one machine, and this state directory lies on a disk"
        f" that machine shares with this one ({this_host()}). Give this machine its own: export"
        f" GPUSCHED_HOME={home.root.parent / (home.root.name + '-' + this_host())}"
    )


def _take_lock(path: Path, timeout_s: float) -> int | None:
    """Take ``path``, the daemon's lock: an exclusive ``flock`` held for as long as the
    descriptor returned stays open (the kernel lets it go when the daemon dies, however it
    dies), trying for up to ``timeout_s``; None when another process holds it.

    Not the filelock package, which did the same for the daemon until its newer releases
    imported asyncio (15-20 ms before a night's first launch) and installed a process-wide
    audit hook that ran on every file the daemon opened and every job it started."""
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                return None
            time.sleep(0.01)


def _locked(path: Path) -> bool:
    """True while some process holds ``path``, the daemon's lock (:func:`_take_lock`)."""
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # never created: no daemon ever ran here
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # released by the close below
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def wake(home: Home) -> None:
    """Make the daemon tick now. Never blocks; a no-op when no daemon listens."""
    try:
        fd = os.open(home.wake, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # ENXIO: nobody reads; ENOENT: never started
        return
    try:
        os.write(fd, b"x")
    except OSError:
        pass
    finally:
        os.close(fd)


def start(home: Home, *, probe: str | None = None, timeout_s: float = 15.0) -> dict[str, Any]:
    """Start a detached daemon unless one runs; return its info once it is ready."""
    check_env()
    current = info(home)
    if current is not None:
        return current
    return Starting(home, probe=probe).go(timeout_s=timeout_s)


def prestart(home: Home, *, probe: str | None = None) -> Starting | None:
    """A daemon started ahead of need (see :class:`Starting`), or None when one runs."""
    return None if info(home) is not None else Starting(home, probe=probe)


class Starting:
    """A daemon process started on standby (``daemon run --standby``): it starts its
    interpreter and imports what it runs with, then waits on its stdin holding nothing (no
    lock, no database, nothing written). :meth:`go` lets it run; :meth:`cancel`, or the end
    of the process that started it, makes it exit without a trace.

    ``submit`` starts one first thing, before the CLI is imported (:mod:`gpusched.entry`), so
    that the daemon's start (~0.15 s on a 16-core machine) overlaps the submit's own start,
    reading and queueing the suite instead of following them, and a refused submit still
    leaves no daemon behind, nor anything in the state directory (not even the directory, on
    a first night): until told to go, the daemon writes to a file with no name
    (:func:`_nameless_file`), and then appends what it wrote there to daemon.log. Whoever
    tells it to go checks the environment it will read first (:func:`check_env`:
    :func:`start`, and ``submit`` before it queues anything)."""

    def __init__(self, home: Home, *, probe: str | None = None) -> None:
        argv = [sys.executable, "-m", "gpusched", "daemon", "run", "--standby"]
        if probe:
            argv += ["--probe", probe]
        from gpusched import proc

        self.home = home
        self.probe = probe
        self._early = _nameless_file()
        told, self._go = os.pipe()
        try:
            self.child = proc.spawn(argv, stdin=told, stdout=self._early, stderr=self._early)
        except BaseException:
            os.close(self._go)
            os.close(self._early)
            raise
        finally:
            os.close(told)

    def go(self, *, timeout_s: float = 15.0) -> dict[str, Any]:
        """Let the daemon run; return its info once it is ready. When another daemon started
        meanwhile (a submit beside this one), this one exits and that one's info is returned."""
        early, self._early = self._early, -1
        try:
            return self._go_and_wait(early, timeout_s)
        finally:
            os.close(early)

    def _go_and_wait(self, early: int, timeout_s: float) -> dict[str, Any]:
        current = info(self.home)
        if current is not None:
            self.cancel()
            return current
        with contextlib.suppress(OSError):  # it died already: the loop below says so
            os.write(self._go, b"g")
        self.cancel()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            current = info(self.home)
            # Ours once it says so: between taking the lock and rewriting daemon.json, a daemon
            # replacing one killed with -9 shows that one's "ready" file. Another daemon's, when
            # ours lost the race for the lock to it (and exited).
            if current is not None and current.get("ready"):
                ours = current.get("pid") == self.child.pid
                if ours or self.child.poll() is not None:
                    return current
            elif current is None and self.child.poll() is not None:
                break  # it exited before it was ready, and no other daemon runs
            time.sleep(0.005)
        log_path = self.home.daemon_log
        words = _read_from_start(early)  # what it said on standby, not in daemon.log (yet)
        said = last_line(words.decode(errors="replace"))
        if self.child.returncode is None:
            raise DaemonError(
                f"the daemon did not start within {timeout_s:.0f} s"
                + (f" ({said})" if said else "")
                + f": see {log_path}"
            )
        if words:  # it died before it wrote to daemon.log: they go there
            with contextlib.suppress(OSError, UsageError):
                self.home.ensure()
                with open(log_path, "ab") as out:
                    out.write(words)
        else:
            said = last_line(tail(log_path, 4096))  # its own last words: it appended them as it exited
        raise DaemonError(
            f"the daemon exited with code {self.child.returncode} as it started"
            + (f" ({said})" if said else "")
            + f": see {log_path}"
        )

    def cancel(self) -> None:
        """Close the daemon's stdin: on standby, it exits (a no-op once it runs)."""
        if self._go >= 0:
            os.close(self._go)
            self._go = -1
        if self._early >= 0:  # (never told to go: what it wrote goes with it)
            os.close(self._early)
            self._early = -1


def _nameless_file() -> int:
    """A file with no name in the temporary folder, read-write: where a daemon on standby
    writes (:class:`Starting`), which goes when the last process that has it closes it. Where
    no temporary folder takes one, /dev/null (the daemon's words before the word to go are
    then lost, not the submit)."""
    for folder in dict.fromkeys((os.environ.get("TMPDIR") or "/tmp", "/tmp")):
        try:
            return os.open(folder, os.O_TMPFILE | os.O_RDWR, 0o600)
        except OSError:  # a file system without O_TMPFILE: a file of its own, its name removed at once
            path = os.path.join(folder, f".gpusched-standby-{os.getpid()}-{time.monotonic_ns()}")
            with contextlib.suppress(OSError):
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
                os.unlink(path)
                return fd
    return os.open(os.devnull, os.O_RDWR)


def _read_from_start(fd: int) -> bytes:
    chunks, at = [], 0
    while chunk := os.pread(fd, 65536, at):
        chunks.append(chunk)
        at += len(chunk)
    return b"".join(chunks)


def _write_to_log(path: Path) -> None:
    """Told to go, a daemon on standby writes to daemon.log from now on (its stdout and
    stderr), after what it wrote before, copied from its nameless file (:class:`Starting`),
    which is then emptied: what that file still holds when the daemon dies as it starts
    never reached daemon.log, and the submit appends it there."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        with contextlib.suppress(OSError):  # (the file is the submit's: it may be anything)
            if words := _read_from_start(1):
                os.write(fd, words)
            os.ftruncate(1, 0)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    finally:
        os.close(fd)


def stop(home: Home, *, timeout_s: float = 15.0) -> bool:
    """Stop the daemon (jobs keep running). True if one was stopped."""
    current = info(home)
    if current is None:
        return False
    pid = current.get("pid")
    if pid:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if info(home) is None:
            return True
        time.sleep(0.02)
    raise DaemonError(f"the daemon (pid {pid}) did not stop within {timeout_s:.0f} s")


# --------------------------------------------------------------------------- the daemon


class _Executors(Mapping[str, Any]):
    """Backends made on first use (Slurm is imported only when a suite asks for it)."""

    def __init__(self, home: Home) -> None:
        self.home = home
        self._made: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self._made:
            from gpusched.executors.select import make_executor

            self._made[name] = make_executor(name, self.home)
        return self._made[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._made)

    def __len__(self) -> int:
        return len(self._made)

    def preload(self, names: list[str]) -> None:
        for n in names:
            try:
                self[n]
            except Exception as e:
                log.warning("backend %s unavailable: %s", n, e)


def _open_fifo(path: Path) -> int:
    if path.exists() and not stat.S_ISFIFO(path.stat().st_mode):
        path.unlink()
    if not path.exists():
        os.mkfifo(path, 0o600)
    # O_RDWR: the FIFO always has a writer (us), so select() never spins on EOF
    return os.open(path, os.O_RDWR | os.O_NONBLOCK)


def run(
    home: Home,
    *,
    probe_spec: str | None = None,
    interval_s: float = 1.0,
    sample_s: float = 10.0,
    standby: bool = False,
) -> int:
    """The daemon's main loop (``gpusched daemon run``); returns the exit code. ``standby``:
    first wait for the word to go on stdin (see :class:`Starting`)."""
    from gpusched.executors import select as _executors  # noqa: F401  (imported before the word)
    from gpusched.gpus import published
    from gpusched.gpus.select import make_probe
    from gpusched.memwatch import OomKills
    from gpusched.notify import Notifier
    from gpusched.scheduler import Scheduler, Settings
    from gpusched.store import Store

    _first_tick_imports()
    probe = make_probe(probe_spec)  # (before the word: initialising NVML takes a while)
    if standby and not _told_to_go():
        return 0
    home.ensure()
    if standby:
        _write_to_log(home.daemon_log)
    # not at once: a client's info() holds the lock for an instant while it looks
    lock = _take_lock(home.lock, _LOCK_WAIT_S)
    if lock is None:
        print("gpusched: a daemon already runs for this user", file=sys.stderr)
        return 0
    store = None
    try:  # (the lock may be this machine's alone: an NFS mounted with local locks)
        check_machine(home, holding_lock=True)
        store = Store(home.db)
        check_jobs_elsewhere(home, store)
    except UsageError as e:
        print(f"gpusched: {e}", file=sys.stderr)
        if store is not None:
            store.close()
        os.close(lock)  # (which releases it)
        return 2
    # a daemon killed with -9 leaves its daemon.json: replace it before anyone reads its pid
    _write_info(home, {"pid": os.getpid(), "host": this_host(), "started_at": time.time(), "ready": False})
    import logging

    # two lines a job in a burst of short ones: a record without the caller's frame (a walk
    # up the stack), thread or process names, none of which the format shows
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    raw_level, bad_level = os.environ.get(LOG_ENV, "").strip() or "INFO", None
    try:
        level = _parse_log_level(raw_level)
    except ValueError:  # (a daemon started without check_env: said once it can log)
        level, bad_level = "INFO", raw_level
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if bad_level is not None:
        log.warning(
            "%s=%r is not a logging level (%s); using INFO", LOG_ENV, bad_level, ", ".join(_LOG_LEVELS)
        )
    stopping = False

    def _stop(signum: int, _frame: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # survive the user's logout
    # A daemon started from inside a job (a job that submits jobs) must not pass that job's
    # token on to the tmux server it starts: cancelling the job would take the server along.
    os.environ.pop("GPUSCHED_TOKEN", None)
    fifo = _open_fifo(home.wake)
    # a SIGTERM ends the wait between ticks at once (a full FIFO already wakes it: no warning)
    signal.set_wakeup_fd(fifo, warn_on_full_buffer=False)
    executors = _Executors(home)
    executors.preload(sorted(store.backends()))
    settings = Settings(wake_path=str(home.wake), cancel_grace_s=_cancel_grace_s())
    kills = OomKills(since=time.time())  # the kernel's OOM kills from now on: not before
    sched = Scheduler(store, probe, executors, settings=settings, monotonic=time.monotonic, oom_kills=kills)
    info_doc = {
        "pid": os.getpid(),
        "host": this_host(),
        "started_at": time.time(),
        "probe": probe.name,
        "probe_spec": probe_spec,
        "probe_notice": probe.notice(),
        "settings": env_settings(),  # (as it read them: submit says when its own differ)
        "ready": False,
    }
    _write_info(home, info_doc)
    try:
        for note in sched.reconcile(time.time()):
            log.info("reconcile: %s", note)
    except Exception:  # what is left `launching` is reconciled again by the next tick
        log.exception("reconcile failed; the ticks will retry")
    _write_info(home, {**info_doc, "ready": True})
    log.info(
        "daemon %s ready (probe %s, cancel grace %.1f s)", os.getpid(), probe.name, settings.cancel_grace_s
    )
    notifier = Notifier(store, home)
    last_sample = last_published = last_entries = 0.0
    failures = 0
    try:
        while not stopping:
            now = time.time()
            try:
                report = sched.tick(now)
                failures = 0
            except Exception:
                # Never die of one bad tick (a full disk, a locked database, a backend
                # hiccup): every transition is its own transaction, so the store is at a
                # boundary; back off and tick again. Jobs keep running meanwhile.
                failures += 1
                log.exception("tick failed (%d in a row); retrying", failures)
                _wait(fifo, min(30.0, 0.5 * 2 ** min(failures, 6)))
                continue
            try:
                notifier.check()
            except Exception:  # telling the user is a nicety; never let it stop scheduling
                log.exception("notify: could not read what happened")
            if not report.launched or now - last_entries >= ENTRIES_S:
                try:
                    store.write_entries()
                except Exception:  # status builds what is not written: never stop scheduling for it
                    log.exception("could not write the ended jobs' status entries; status builds them")
                last_entries = now
            if now - last_published >= interval_s:
                _publish(home, sched.last_snapshot, probe.notice(), now)
                last_published = now
            if now - last_sample >= sample_s:
                _sample(store, sched, now)
                last_sample = now
            _wait(fifo, interval_s)
    finally:
        log.info("daemon %s stopping; running jobs keep running", os.getpid())
        with contextlib.suppress(OSError):
            home.daemon_info.unlink()
        with contextlib.suppress(OSError):
            published.path(home).unlink()
        signal.set_wakeup_fd(-1)
        os.close(fifo)
        store.close()
        os.close(lock)  # (which releases it)
    return 0


def _first_tick_imports() -> None:
    """Import what the first tick would otherwise import as it launches: yaml (each attempt's
    config.yaml). On standby that is done while ``submit`` still reads the plan, not between
    its word and the first launch (20-70 ms of the night's first start on a 16-core machine,
    measured with py-spy, psutil then included). psutil is not needed before the first
    launch (the host's memory and boot time are read from /proc): it comes once a tick
    attributes GPU processes to jobs, or a cancel walks a process tree."""
    import yaml  # noqa: F401

    from gpusched import attempt, tiers  # noqa: F401


def _told_to_go() -> bool:
    """On standby: block until stdin says go (b"g") or ends (the process that started this
    one gave up or died), then read /dev/null instead, as a daemon does."""
    try:
        word = os.read(0, 1)
    except OSError:
        word = b""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return word == b"g"


def _cancel_grace_s() -> float:
    """SIGTERM -> SIGKILL grace of a cancel: ``GPUSCHED_CANCEL_GRACE_S`` (seconds), else the
    default of :class:`~gpusched.scheduler.Settings`."""
    from gpusched.scheduler import Settings

    raw = os.environ.get(CANCEL_GRACE_ENV, "").strip()
    if raw:
        try:
            return _parse_grace(raw)
        except ValueError:
            log.warning("%s=%r is not a number of seconds >= 0; using the default", CANCEL_GRACE_ENV, raw)
    return Settings().cancel_grace_s


def _parse_log_level(raw: str) -> str:
    """``GPUSCHED_LOG``: a logging level's name, in any case."""
    level = raw.strip().upper()
    if level not in _LOG_LEVELS:
        raise ValueError(raw)
    return level


def _parse_grace(raw: str) -> float:
    value = float(raw)
    if not value >= 0:  # negative, or NaN
        raise ValueError(raw)
    return value


#: What a daemon reads from its environment: the variable, the function that parses it (imported
#: only where the variable is set: ``submit`` imports nothing for the settings left alone, ~25 ms
#: of its start on 2 cores), what it takes, and what the daemon does without it (as that function
#: reads it). A test keeps the names those modules read, and the defaults theirs.
ENV_SETTINGS = (
    (
        "GPUSCHED_HOST_MIN_FREE",
        "gpusched.memory:parse_host_min",
        "like 4GiB, 10%, 4GiB,10% or 0 (off)",
        "4GiB,10%",
    ),
    ("GPUSCHED_DISK_MIN_FREE", "gpusched.disk:parse_disk_min", "like 1GiB, 5%, 1GiB,5% or 0 (off)", "1GiB"),
    (CANCEL_GRACE_ENV, "gpusched.daemon:_parse_grace", "a number of seconds >= 0", "10"),
    (
        "GPUSCHED_RUNNER",
        "gpusched.executors.subprocess:parse_runner",
        "1 or 0 (0: each plain process's wrapper started on its own)",
        "1",
    ),
    (
        "GPUSCHED_TMUX_PANES",
        "gpusched.executors.tmux_reuse:parse_panes",
        "auto, reuse or job (job: a tmux window for each job)",
        "auto",
    ),
    (LOG_ENV, "gpusched.daemon:_parse_log_level", f"a logging level ({', '.join(_LOG_LEVELS)})", "INFO"),
)


def _parser(where: str) -> Callable[[str], Any]:
    import importlib

    module, _, function = where.partition(":")
    return getattr(importlib.import_module(module), function)


def check_env() -> None:
    """Refuse, in one line, a setting in the environment that a daemon started from here
    would read: ``submit`` and ``daemon start`` call this before they change anything, so a
    typo is not found hours later as a default quietly used."""
    from gpusched.errors import UsageError

    for name, where, expected, _ in ENV_SETTINGS:
        raw = os.environ.get(name, "").strip()
        if not raw:
            continue
        try:
            _parser(where)(raw)
        except ValueError:
            raise UsageError(f"{name}={raw!r} in the environment: not {expected}; fix or unset it") from None


def env_settings() -> dict[str, str]:
    """The settings of :data:`ENV_SETTINGS` this process's environment gives (the daemon records
    its own in daemon.json: :func:`settings_not_taken`)."""
    return {name: raw for name, *_ in ENV_SETTINGS if (raw := os.environ.get(name, "").strip())}


def say_settings_not_taken(running: dict[str, Any] | None) -> None:
    """:func:`settings_not_taken`'s line, on stderr, where there is one (``submit``, ``retry`` and
    ``daemon start`` beside a daemon that runs)."""
    if (note := settings_not_taken(running)) is not None:
        print(f"gpusched: {note}", file=sys.stderr)


def settings_not_taken(running: dict[str, Any] | None) -> str | None:
    """One line when this environment gives a setting (checked: :func:`check_env`) that the
    daemon already running does not have: it read its settings as it started, so the value
    here would be quietly ignored until it starts again. None when every one agrees, when no
    daemon runs, or when it is one that does not record them."""
    theirs = running.get("settings") if running else None
    if not isinstance(theirs, dict):
        return None
    differ = []
    for name, where, _, default in ENV_SETTINGS:
        mine = os.environ.get(name, "").strip()
        if not mine:
            continue
        used = str(theirs.get(name) or default)
        parse = _parser(where)
        try:
            value = parse(used)
        except ValueError:  # (a daemon started without check_env: it logged it and took the default)
            used, value = default, parse(default)
        if parse(mine) != value:
            differ.append(f"{name}={used}{'' if name in theirs else ' (its default)'}, not {mine} as here")
    if not differ:
        return None
    assert running is not None
    return (
        f"note: the daemon already running (pid {running.get('pid')}) has {'; '.join(differ)}: a daemon"
        " reads these as it starts; for them to apply, `gpusched daemon stop` (its jobs keep running)"
        " and run this again"
    )


def _wait(fifo: int, timeout_s: float) -> None:
    """Sleep until poked or ``timeout_s`` passes; swallow every pending poke."""
    try:
        ready, _, _ = select.select([fifo], [], [], timeout_s)
    except InterruptedError:
        return
    if ready:
        with contextlib.suppress(BlockingIOError):
            while os.read(fifo, 65536):
                pass


def _sample(store: Any, sched: Any, now: float) -> None:
    """Record GPU memory/utilisation for reports (bounded table)."""
    gpus = sched.last_snapshot
    if not gpus:
        return
    try:
        store.record_samples(now, [(g.index, g.used_mib, g.total_mib, g.util_pct) for g in gpus])
    except Exception:  # samples are a nicety; never let them stop scheduling
        log.exception("could not record GPU samples")


def _publish(home: Home, gpus: list[Any], notice: str | None, now: float) -> None:
    """Publish the snapshot this tick placed with, for clients: ``status`` shows it instead of
    probing the GPUs itself (initialising NVML costs a client more than the rest of a status)."""
    from gpusched.gpus import published

    try:
        published.publish(home, gpus, notice=notice, now=now)
    except Exception:  # a nicety for clients; never let it stop scheduling
        log.exception("could not publish the GPU snapshot")


def _write_info(home: Home, doc: dict[str, Any]) -> None:
    tmp = home.daemon_info.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, home.daemon_info)
