"""Shared plumbing of the benchmarks: a private GPUSCHED_HOME and project, the real CLI,
a no-op plan, polling the store, and a plain-text table.

Every benchmark drives gpusched as a user does (the installed CLI in subprocesses, the real
daemon, real tmux or processes, the real SQLite file) in a scratch directory it deletes
afterwards; nothing touches the user's own queue.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PYCACHE = os.path.join(tempfile.gettempdir(), "gpusched-bench-pycache")


@dataclass(frozen=True)
class Sandbox:
    """A private state home and project folder; ``env`` points the CLI at them."""

    root: Path

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def project(self) -> Path:
        return self.root / "project"

    @property
    def db(self) -> Path:
        return self.home / "gpusched.db"

    def env(self, **extra: str) -> dict[str, str]:
        """The CLI's environment: this one, pointed at the sandbox, and with bytecode caching
        on (in a cache of its own, not in the checkout), as for an installed gpusched: with
        PYTHONDONTWRITEBYTECODE every command would compile the package first."""
        dropped = ("TMUX", "GPUSCHED_FAKE_GPUS", "GPUSCHED_TMUX_PANES")
        env = {k: v for k, v in bytecode_env().items() if k not in dropped}
        return {**env, "GPUSCHED_HOME": str(self.home), **extra}

    def cli(
        self, *args: str, env: dict[str, str] | None = None, check: bool = True, timeout: float = 600
    ) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(
            [sys.executable, "-m", "gpusched", *args],
            cwd=self.project,
            env=env or self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and r.returncode != 0:
            raise RuntimeError(f"gpusched {' '.join(args)} -> {r.returncode}\n{r.stdout}\n{r.stderr}")
        return r

    def write_plan(
        self, name: str, n_jobs: int, command: str = "true {config}", sleeps: Sequence[float] = ()
    ) -> str:
        """A suite of ``n_jobs`` jobs, one tier. ``sleeps``: each job gets one of these in
        ``$BENCH_SLEEP`` (round robin), e.g. for ``command: ': {config}; sleep $BENCH_SLEEP'``."""
        plans = self.project / "plans"
        plans.mkdir(parents=True, exist_ok=True)
        matrix = f"i: [{', '.join(str(i) for i in range(n_jobs // max(1, len(sleeps))))}]"
        job = 'job: {name: "j{i}", task: "noop"}'
        if sleeps:
            matrix += f", d: [{', '.join(json.dumps(str(d)) for d in sleeps)}]"
            job = 'job: {name: "j{i}-{d}", task: "noop", env: {BENCH_SLEEP: "{d}"}}'
        body = (
            f"command: {json.dumps(command)}\n"
            "workdir: ..\n"
            f"matrix: {{{matrix}}}\n"
            f"{job}\n"
            "tiers: [{name: A}]\n"
        )
        (plans / f"{name}.yaml").write_text(body)
        return name

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        """Rows of ``sql`` read straight from the sandbox's database, read-only (no interpreter
        start, no gpusched in between)."""
        db = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=30)
        try:
            return db.execute(sql).fetchall()
        finally:
            db.close()

    def counts(self) -> dict[str, int]:
        """Jobs per state ({} while the database cannot be read yet)."""
        try:
            return dict(self.query("SELECT state, COUNT(*) FROM jobs GROUP BY state"))
        except sqlite3.Error:
            return {}

    def wait_all_done(self, n: int, *, timeout_s: float = 600, poll_s: float = 0.005) -> float:
        """Block until ``n`` jobs ended; return the wall clock (time.time()) when seen.

        Light on the machine it measures: one read-only connection, kept open, asks SQLite
        every ``poll_s`` whether anyone committed since (``PRAGMA data_version``, no file is
        opened) and counts the jobs only then. Opening the database and counting at every
        poll, as this did before stop 39, cost the harness itself 0.19 s of CPU in a
        1,000-job dispatch on 2 cores, against 0.105 s now."""
        deadline = time.monotonic() + timeout_s
        db, seen = None, None
        try:
            while time.monotonic() < deadline:
                if db is None and self.db.exists():
                    db = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=30)
                if db is not None:
                    (version,) = db.execute("PRAGMA data_version").fetchone()
                    if version != seen:
                        seen = version
                        with contextlib.suppress(sqlite3.Error):  # (the schema may not be there yet)
                            c = db.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetchall()
                            if sum(k for s, k in c if s not in ("queued", "running")) >= n:
                                return time.time()
                time.sleep(poll_s)
        finally:
            if db is not None:
                db.close()
        raise TimeoutError(f"jobs not done within {timeout_s} s: {self.counts()}")

    def stop(self, *, cancel: bool = True) -> None:
        """Cancel what still runs (a benchmark cut short leaves its jobs), let the daemon end it
        (for at most 30 s), then stop the daemon and the tmux server. ``cancel=False``: leave the
        jobs as they are (a kept sandbox, whose store is looked at afterwards)."""
        left = self.counts() if cancel and self.db.exists() else {}
        if left.get("running", 0) or left.get("queued", 0):
            with contextlib.suppress(Exception):
                self.cli("cancel", "*", check=False, timeout=60)
                deadline = time.monotonic() + 30
                while self.counts().get("running", 0) and time.monotonic() < deadline:
                    time.sleep(0.1)
        with contextlib.suppress(Exception):
            self.cli("daemon", "stop", check=False, timeout=60)
        sock = self.home / "tmux.sock"
        if sock.exists() and shutil.which("tmux"):
            subprocess.run(["tmux", "-S", str(sock), "kill-server"], capture_output=True, check=False)


def bytecode_env() -> dict[str, str]:
    """This environment with bytecode caching on, in the benchmarks' own cache directory."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPYCACHEPREFIX": PYCACHE}


#: Imported once under :func:`bytecode_env` before anything is timed: every gpusched module, and
#: what its commands and the daemon import only when they need it. The cache is the benchmarks'
#: own, so without this the first run on a fresh machine compiled asyncio (filelock imports it),
#: psutil and yaml from source inside the daemon's first tick: 0.6 s of a 3 s run on 16 cores.
_WARM = (
    "import compileall, importlib, pkgutil, gpusched\n"
    "compileall.compile_dir(gpusched.__path__[0], quiet=1)\n"
    "for m in pkgutil.walk_packages(gpusched.__path__, 'gpusched.'):\n"
    "    try: m.name.endswith('__main__') or importlib.import_module(m.name)\n"
    "    except Exception: pass\n"
    "for m in ('filelock', 'psutil', 'yaml', 'libtmux', 'rich.console', 'rich.table', 'tenacity',"
    " 'pynvml'):\n"
    "    try: importlib.import_module(m)\n"
    "    except Exception: pass\n"
)


def warm_bytecode() -> None:
    """Compile what the CLI and the daemon will import into that cache, so that no timed
    command pays for compiling it (an installed package, and the standard library, come with
    their bytecode; a cache of the benchmarks' own starts empty). Once a process."""
    global _warmed
    if not _warmed:
        subprocess.run([sys.executable, "-c", _WARM], env=bytecode_env(), check=True)
        _warmed = True


_warmed = False


@contextlib.contextmanager
def sandbox(keep: bool = False) -> Iterator[Sandbox]:
    warm_bytecode()
    warn_unjournaled()
    root = Path(tempfile.mkdtemp(prefix="gpusched-bench-"))
    sb = Sandbox(root)
    sb.project.mkdir(parents=True)
    # a `timeout` that cuts a benchmark short (gpu_machine.sh's parts) sends SIGTERM: end as on
    # an error, so that its daemon and jobs go too instead of loading the parts after it
    previous = signal.signal(signal.SIGTERM, _exit_on_term)
    try:
        yield sb
    finally:
        signal.signal(signal.SIGTERM, previous)
        sb.stop(cancel=not keep)  # (kept: the store as the benchmark left it, for commands timed by hand)
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


def _exit_on_term(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def listing_cards(sb: Sandbox, env: dict[str, str], others: int, card: int) -> Iterator[None]:
    """Fake GPUs whose card ``card`` lists a process (pid 1, someone else's), as a real GPU's
    driver lists processes (fake GPUs list none, so without this the daemon never reads the
    process table to tell whose they are), and ``others`` more processes (sleeping, as most of
    a GPU box's hundreds are) on the machine while the block runs; ``env`` gains the setting."""
    state = sb.root / "gpu_state.json"
    state.write_text(json.dumps({str(card): {"used_mib": 500, "processes": [{"pid": 1, "used_mib": 500}]}}))
    env["GPUSCHED_FAKE_GPU_STATE"] = str(state)
    with contextlib.ExitStack() as stack:
        for _ in range(others):
            sleeper = subprocess.Popen(["sleep", "3600"])
            stack.callback(sleeper.wait)
            stack.callback(sleeper.kill)
        yield


def gpu_processes_option(ap: argparse.ArgumentParser) -> None:
    """``--gpu-processes N``: run with :func:`listing_cards`."""
    ap.add_argument(
        "--gpu-processes",
        type=int,
        metavar="N",
        help="the GPUs list a process (as a real GPU's do), and N other processes run on the machine",
    )


def listing_words(gpu_processes: int | None) -> str:
    """What a table's heading says of ``--gpu-processes``."""
    if gpu_processes is None:
        return ""
    return f", the GPUs listing a process, {gpu_processes} other processes on the machine"


def pythonpath(tree: Path) -> str:
    """``PYTHONPATH`` for the CLI of the checkout ``tree``: it first, then this one's (where a
    bare machine keeps gpusched's dependencies)."""
    return os.pathsep.join([str(tree), *filter(None, [os.environ.get("PYTHONPATH")])])


def daemon_info(sb: Sandbox) -> dict[str, Any]:
    """The sandbox's running daemon's ``daemon.json`` (its pid, when it started, ...)."""
    info: dict[str, Any] = json.loads((sb.home / "daemon.json").read_text())
    return info


def daemon_pid(sb: Sandbox) -> int:
    return int(daemon_info(sb)["pid"])


def percentile(xs: Sequence[float], q: float) -> float:
    """Nearest-rank percentile, ``q`` in 0..100."""
    s = sorted(xs)
    if not s:
        return float("nan")
    k = max(0, min(len(s) - 1, int(-(-q * len(s) // 100)) - 1))
    return s[k]


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def busy_s() -> float:
    """The machine's CPU time so far, all cores and processes (``/proc/stat``: every state but
    idle and iowait), in core-seconds; ``nan`` where there is no ``/proc/stat``."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return float("nan")
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Took:
    """What one run of a tool took: wall seconds, and the machine's CPU core-seconds meanwhile
    (the tool's processes, its jobs', a tmux server's; and whatever else ran, little on an
    idle machine)."""

    wall_s: float
    cpu_s: float


class Span:
    """Started at its creation; :meth:`took` gives the wall time and the machine's CPU time
    since (100 ticks a second: ±0.01 core-s)."""

    def __init__(self) -> None:
        self.t0, self.cpu0 = time.time(), busy_s()

    def took(self, until: float | None = None) -> Took:
        """Since the start, up to ``until`` (a ``time.time()`` taken just before) or now."""
        cpu = busy_s()
        return Took((time.time() if until is None else until) - self.t0, cpu - self.cpu0)


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub-flavoured markdown table (pastes straight into benchmarks/README.md)."""
    cells = [[str(c) for c in headers], *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |"  # noqa: E731
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(cells[0]), sep, *(line(r) for r in cells[1:])])


def machine() -> str:
    """The machine and the filesystem the sandboxes are made on, for a table's heading."""
    import platform

    return (
        f"{os.cpu_count()} cores, {platform.machine()}, Linux {platform.release()}, "
        f"Python {platform.python_version()}, sandbox on {filesystem(tempfile.gettempdir())}"
    )


def filesystem(path: str) -> str:
    """What ``path`` is stored on: the mount point, its type, and for ext4 whether it keeps a
    journal, e.g. ``/tmp (ext4, no journal)``.

    It matters to every row that writes files: on ext4 *without* a journal, creating an inode
    scans past each one deleted in the last minutes (ext4 holds them back until their inode
    table block is surely on disk: ``recently_deleted`` in ``fs/ext4/ialloc.c``), so a sandbox
    made right after another was deleted costs 1-8 ms per job's seven inodes instead of ~0.5,
    and a row measures what ran before it. ``mkfs.ext4`` makes a journal by default; a
    journal-less root is a thing of VMs and containers, and says so in every table."""
    real = os.path.realpath(path)
    best = ("/", "?", "?")
    with contextlib.suppress(OSError), open("/proc/mounts") as f:
        for line in f:
            dev, mnt, kind = line.split()[:3]
            mnt = mnt.replace("\\040", " ")
            inside = real == mnt or real.startswith(mnt.rstrip("/") + "/")
            if inside and len(mnt) >= len(best[0]):
                best = (mnt, kind, dev)
    mnt, kind, dev = best
    if kind == "ext4":
        task = Path("/sys/fs/ext4", os.path.basename(os.path.realpath(dev)), "journal_task")
        with contextlib.suppress(OSError):
            kind += ", no journal" if task.read_text().strip() == "<none>" else ", journaled"
    return f"{mnt} ({kind})"


@functools.cache
def warn_unjournaled() -> None:
    """One line on stderr, once, when the sandboxes go to an ext4 without a journal (see
    :func:`filesystem`): its file costs are not a user's disk's."""
    where = filesystem(tempfile.gettempdir())
    if "no journal" in where:
        print(
            f"note: the sandboxes go to {where}: creating files there costs what was deleted in "
            "the last minutes; for a user's disk, point TMPDIR at a journaled filesystem "
            "(see benchmarks/README.md)",
            file=sys.stderr,
        )
