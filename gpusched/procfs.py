"""What /proc says of processes: a process's state, its start (which, with its pid, names it
across PID reuse) and its environment; the whole process table in one pass, from which a
group's stopped members and the trees below our wrappers (whose a GPU's processes are) come.
Reads only: no subprocess, no logging, no psutil where there is a /proc, so that ``status``
and the daemon's look at the cards ask without importing what :mod:`gpusched.proc` needs to
run and signal processes (which imports what it needs from here)."""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterable, Mapping

#: Two start times closer than this name the same process. ``/proc`` gives a start in clock
#: ticks after boot, and the kernel's boot time is whole seconds (up to 1 s off); a wrapper's
#: own clock reading comes a little after its fork, later still under load. A PID reused
#: within 3 s of the recorded start is far rarer than either error.
SAME_START_S = 3.0

#: Every attempt's processes carry its launch token under this name (all backends): how a
#: process that left its attempt's group or tree is still known as its.
TOKEN_ENV = "GPUSCHED_TOKEN"

_CLK_TCK = os.sysconf("SC_CLK_TCK")
_HAVE_PROC = os.path.isdir("/proc/self")
_boot_time: float | None = None


def _boot() -> float:
    """When this machine booted (epoch seconds): ``btime`` of /proc/stat, which is what psutil
    reads on Linux, without importing psutil at a daemon's first launch; elsewhere psutil's."""
    global _boot_time
    if _boot_time is None:
        try:
            with open("/proc/stat", "rb") as f:
                _boot_time = next(float(line.split()[1]) for line in f if line.startswith(b"btime "))
        except (OSError, StopIteration, IndexError, ValueError):
            import psutil

            _boot_time = psutil.boot_time()
    return _boot_time


def _read(path: str) -> bytes:
    """A /proc file of one short line, in one read: without a Python file object, half the
    cost of ``open().read()`` (a scan of the process table makes hundreds)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)


def _stat(pid: int) -> tuple[str, float] | None:
    """(state letter, start time) of ``pid`` from /proc/PID/stat; None when no such entry.
    One small read: microseconds, which is why ``alive`` checks need no psutil."""
    try:
        data = _read(f"/proc/{int(pid)}/stat")
    except (OSError, ValueError):
        return None if _HAVE_PROC else _stat_psutil(pid)
    rest = data[data.rfind(b")") + 2 :].split()  # the name (field 2) may contain spaces
    return rest[0].decode(), _boot() + int(rest[19]) / _CLK_TCK


def _stat_psutil(pid: int) -> tuple[str, float] | None:  # pragma: no cover - no /proc
    import psutil

    try:
        p = psutil.Process(pid)
        with p.oneshot():
            state = "Z" if p.status() == psutil.STATUS_ZOMBIE else "R"
            return state, p.create_time()
    except psutil.Error:
        return None


def started_at(pid: int, *, zombies: bool = False) -> float | None:
    """Start time (epoch seconds) of the running process ``pid``; None when there is none
    (gone, or a zombie: it has exited; ``zombies=True`` answers for those too, e.g. to
    record a just-spawned child that has already ended)."""
    st = _stat(pid)
    if st is None or (st[0] in ("Z", "X") and not zombies):
        return None
    return st[1]


#: A process as :func:`table` reads it: pid, parent's pid, process group, state letter, name.
Entry = tuple[int, int, int, str, str]


def table() -> list[Entry]:
    """Every process (zombies too) from ONE scan of /proc: one read of /proc/PID/stat each, no
    Python object but a tuple per process. psutil's ``process_iter`` built a Process per pid and
    read each one's files through it: 3-4x the CPU, which the daemon paid every second on a GPU
    whose driver lists processes (the jobs' own), in proportion to every process on the machine.
    [] where there is no /proc (:func:`process_trees` then asks psutil)."""
    if not _HAVE_PROC:
        return []
    out: list[Entry] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            data = _read(f"/proc/{entry}/stat")
        except OSError:
            continue  # gone meanwhile
        close = data.rfind(b")")  # the name (field 2) may hold spaces and parentheses
        state, ppid, pgrp = data[close + 2 :].split(b" ", 3)[:3]
        name = data[data.find(b"(") + 1 : close].decode(errors="replace")
        out.append((int(entry), int(ppid), int(pgrp), state.decode(), name))
    return out


def environ_value(pid: int, key: str) -> str | None:
    """``key``'s value in the environment process ``pid`` was started with; None when it is
    not set there or cannot be read (the process is gone or another user's, or no /proc)."""
    env = _environ(pid) if _HAVE_PROC else None
    prefix = f"{key}=".encode()
    for item in (env or b"").split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix) :].decode(errors="replace")
    return None


def _environ(pid: int) -> bytes | None:
    """/proc/PID/environ (NUL-separated ``KEY=value``), None when gone or another user's."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read()
    except OSError:
        return None


def in_groups(
    groups: Collection[int], read_table: Callable[[], list[Entry]] = table
) -> dict[int, list[tuple[int, str, str]]]:
    """``pgid -> [(pid, state letter, name), ...]``: every process (zombies too) of each of the
    process groups ``groups``, from ONE scan (``read_table``: :func:`table`, or a read already
    made). Groups with no process are left out; {} where there is no /proc."""
    if not groups:
        return {}
    found: dict[int, list[tuple[int, str, str]]] = {}
    for pid, _, pgrp, state, name in read_table():
        if pgrp in groups:
            found.setdefault(pgrp, []).append((pid, state, name))
    return found


def stopped_in_groups(
    groups: Mapping[int, float | None], read_table: Callable[[], list[Entry]] = table
) -> dict[int, list[tuple[int, str]]]:
    """``leader -> [(pid, name), ...]``: the processes of each process group (its leader's pid
    -> the leader's recorded start, None: unchecked) that are stopped (state ``T``: a SIGSTOP,
    a Ctrl-Z), from one scan (:func:`in_groups`). A group whose leader's pid now names another
    process (its start differs) is not ours and is left out. Only groups with a stopped member
    are returned. A process being traced (``t``: a debugger, py-spy) is not stopped in this
    sense."""
    stopped = {
        leader: [(pid, name) for pid, state, name in members if state == "T"]
        for leader, members in in_groups(groups, read_table).items()
    }
    return {
        leader: members
        for leader, members in stopped.items()
        if members
        and (
            (started := groups[leader]) is None
            or (now := started_at(leader, zombies=True)) is None
            or abs(now - started) <= SAME_START_S
        )
    }


def process_trees(
    roots: Iterable[int], read_table: Callable[[], list[Entry]] = table
) -> dict[int, frozenset[int]]:
    """``root -> {root and every process below it}`` for each live root, from ONE scan of the
    process table (``read_table``: :func:`table`, or a read already made), not one scan per
    root. A root that is gone is left out."""
    children: dict[int, list[int]] = {}
    alive: set[int] = set()
    for pid, ppid, *_ in read_table() if _HAVE_PROC else _table_psutil():
        alive.add(pid)
        children.setdefault(ppid, []).append(pid)
    out: dict[int, frozenset[int]] = {}
    for root in roots:
        if root not in alive:
            continue
        seen, stack = {root}, [root]
        while stack:
            for child in children.get(stack.pop(), ()):
                if child not in seen:
                    seen.add(child)
                    stack.append(child)
        out[root] = frozenset(seen)
    return out


def _table_psutil() -> list[tuple[int, int]]:  # pragma: no cover - no /proc
    """(pid, parent's pid) of every process, through psutil, where there is no /proc."""
    import psutil

    return [(p.pid, ppid) for p in psutil.process_iter(["ppid"]) if (ppid := p.info.get("ppid")) is not None]
