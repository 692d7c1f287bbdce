"""Room on disk, and the launch failures that are the machine's fault, not the job's.

A night's checkpoints fill disks. Without this, a full disk fails the queue: every launch
that cannot write its attempt directory counts as lost, and three losses fail a job, so
forty jobs are dead in a minute and stay dead after the space is freed. Instead:

* **Launches wait while a suite's disk is low.** Before placing, the scheduler reads
  ``statvfs`` of each waiting suite's logs directory and working directory (a few
  microseconds each). Below ``GPUSCHED_DISK_MIN_FREE`` (default 1 GiB, or a share: ``5%``,
  ``1GiB,5%`` (the smaller), ``0`` for off), or with almost no inodes left, that suite's jobs
  wait, and ``status`` says which directory, how much is free and how much launches need.
* **A launch that fails for want of a resource is not the job's failure.** An ``OSError``
  such as ``ENOSPC``, ``EDQUOT``, ``EROFS``, ``EMFILE`` or ``EAGAIN`` while writing the
  attempt directory or starting the wrapper requeues the job at the same tier without
  counting a loss, and pauses every launch (10 s, doubling to 5 min while it keeps failing);
  ``status`` says why and until when.

Pure functions over plain values, except :func:`disk_free` (one ``statvfs``).
"""

from __future__ import annotations

import errno
import os

from msgspec import Struct

from gpusched.logs import logger
from gpusched.memory import floor_mib, parse_host_min
from gpusched.placement import gib

log = logger(__name__)

DISK_MIN_ENV = "GPUSCHED_DISK_MIN_FREE"  # e.g. "1GiB", "5%", "1GiB,5%", "0" (off)
#: Fewer free inodes than this is a full disk too: creating a file fails with ENOSPC.
MIN_FREE_INODES = 1000

#: ``OSError`` numbers that say the machine ran short of something (space, quota, file
#: handles, processes, memory) or refuses writes, not that the job is broken: such a launch
#: failure requeues the job uncharged and pauses launches.
MACHINE_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EMFILE, errno.ENFILE, errno.EAGAIN, errno.ENOMEM}
)
PAUSE_FIRST_S = 10.0
PAUSE_MAX_S = 300.0
#: The store flag that says why launches wait for the machine now (a disk low, a pause after
#: a machine failure), written by the scheduler when it changes, shown by ``status``.
LAUNCH_WAIT_FLAG = "launch_wait"


class DiskFree(Struct, frozen=True, kw_only=True):
    """What ``statvfs`` says of the filesystem holding ``path`` (None: could not be read)."""

    path: str
    free_mib: int | None
    total_mib: int | None
    free_inodes: int | None  # None also where the filesystem does not count inodes (btrfs)
    missing: bool = False  # the path itself is not there: the figures are its nearest parent's


class DiskLimit(Struct, frozen=True, kw_only=True):
    """Launches wait while free space is below ``min_mib`` or ``min_frac`` of the
    filesystem, whichever is *smaller* (as for host RAM); 0 disables either."""

    min_mib: int = 1024
    min_frac: float = 0.0


def disk_free(path: str) -> DiskFree:
    """``statvfs`` of ``path``, or of its nearest existing parent (a suite's logs directory
    is created by its first launch). Space as an unprivileged user may use it (``f_bavail``)."""
    probe = full = os.path.abspath(path)
    while True:
        try:
            st = os.statvfs(probe)
            break
        except (FileNotFoundError, NotADirectoryError):
            parent = os.path.dirname(probe)
            if parent == probe:
                return DiskFree(path=path, free_mib=None, total_mib=None, free_inodes=None, missing=True)
            probe = parent
        except OSError:
            return DiskFree(path=path, free_mib=None, total_mib=None, free_inodes=None)
    return DiskFree(
        path=path,
        free_mib=(st.f_bavail * st.f_frsize) >> 20,
        total_mib=(st.f_blocks * st.f_frsize) >> 20,
        free_inodes=st.f_favail if st.f_files else None,
        missing=probe != full,
    )


def min_free_mib(total_mib: int | None, limit: DiskLimit) -> int:
    return floor_mib(total_mib, limit.min_mib, limit.min_frac)


def disk_wait(free: DiskFree, limit: DiskLimit) -> str | None:
    """Why launches that write to ``free.path`` wait, or None. Unknown figures never block."""
    floor = min_free_mib(free.total_mib, limit)
    if not floor:
        return None
    if free.free_mib is not None and free.free_mib < floor:
        return f"disk low: {free.path} has {gib(free.free_mib)} free, launches wait for {gib(floor)}"
    if free.free_inodes is not None and free.free_inodes < MIN_FREE_INODES:
        inodes = f"{free.free_inodes} free inodes"
        return f"disk low: {free.path} has {inodes}, launches wait for {MIN_FREE_INODES}"
    return None


def parse_disk_min(text: str) -> DiskLimit:
    """``"1GiB"``, ``"512MiB"``, ``"5%"``, ``"1GiB,5%"`` or ``"0"`` (off) -> a :class:`DiskLimit`.
    Raises ``ValueError``."""
    host = parse_host_min(text)  # the same grammar as GPUSCHED_HOST_MIN_FREE
    return DiskLimit(min_mib=host.min_mib, min_frac=host.min_frac)


def disk_limit_from_env() -> DiskLimit:
    """``GPUSCHED_DISK_MIN_FREE``, else the default (1 GiB). ``submit`` and ``daemon start``
    refuse a value that does not parse (:func:`gpusched.daemon.check_env`); a daemon started
    some other way warns in its log and keeps the default."""
    raw = os.environ.get(DISK_MIN_ENV, "").strip()
    try:
        return parse_disk_min(raw) if raw else DiskLimit()
    except ValueError:
        log.warning("%s=%r is not like 1GiB, 5%%, 1GiB,5%% or 0; using the default", DISK_MIN_ENV, raw)
        return DiskLimit()


def machine_error(err: BaseException) -> OSError | None:
    """The ``OSError`` that made a launch fail for want of a machine resource, or None. Looks
    through ``__cause__``/``__context__`` (an executor may wrap the error in its own)."""
    seen = 0
    e: BaseException | None = err
    while e is not None and seen < 8:
        if isinstance(e, OSError) and e.errno in MACHINE_ERRNOS:
            return e
        e, seen = e.__cause__ or e.__context__, seen + 1
    return None


def pause_s(failures: int) -> float:
    """How long launches pause after the ``failures``-th machine failure in a row (1, 2, ...)."""
    return min(PAUSE_MAX_S, PAUSE_FIRST_S * 2 ** min(max(failures - 1, 0), 10))
