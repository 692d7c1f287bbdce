"""Room on disk and the machine's launch failures (gpusched.disk): pure rules, one real statvfs."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from gpusched import disk
from gpusched.disk import DiskFree, DiskLimit


def _free(mib: int | None, total: int | None = 100_000, inodes: int | None = 10**6) -> DiskFree:
    return DiskFree(path="/data/logs/E1", free_mib=mib, total_mib=total, free_inodes=inodes)


def test_launches_wait_below_the_floor_and_the_reason_names_the_directory_and_the_figures() -> None:
    limit = DiskLimit()  # 1 GiB
    assert disk.disk_wait(_free(2048), limit) is None
    assert disk.disk_wait(_free(512), limit) == (
        "disk low: /data/logs/E1 has 0.5 GiB free, launches wait for 1.0 GiB"
    )


def test_a_disk_out_of_inodes_is_low_whatever_its_bytes() -> None:
    why = disk.disk_wait(_free(50_000, inodes=12), DiskLimit())
    assert why == "disk low: /data/logs/E1 has 12 free inodes, launches wait for 1000"
    assert disk.disk_wait(_free(50_000, inodes=None), DiskLimit()) is None  # btrfs counts none


def test_unknown_figures_never_block_and_zero_turns_the_check_off() -> None:
    assert disk.disk_wait(_free(None, total=None, inodes=None), DiskLimit()) is None
    assert disk.disk_wait(_free(0, inodes=0), DiskLimit(min_mib=0)) is None


def test_a_share_and_a_size_together_take_the_smaller() -> None:
    limit = disk.parse_disk_min("10GiB,5%")
    assert disk.min_free_mib(100_000, limit) == 5000  # 5 % of a 100 GB disk < 10 GiB
    assert disk.min_free_mib(1_000_000, limit) == 10 * 1024  # ... and 10 GiB on a big one
    assert disk.min_free_mib(None, limit) == 10 * 1024  # total unknown: the size alone


@pytest.mark.parametrize(
    ("text", "mib", "frac"),
    [("1GiB", 1024, 0.0), ("512MiB", 512, 0.0), ("5%", 0, 0.05), ("2g,1%", 2048, 0.01), ("0", 0, 0.0)],
)
def test_the_setting_reads_like_the_host_ram_one(text: str, mib: int, frac: float) -> None:
    assert disk.parse_disk_min(text) == DiskLimit(min_mib=mib, min_frac=frac)


@pytest.mark.parametrize("text", ["lots", "-1GiB", "150%", "infGiB", "1e999g"])
def test_a_setting_that_does_not_parse_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError):
        disk.parse_disk_min(text)


def test_machine_errors_are_shortages_not_the_job_s_faults() -> None:
    full = OSError(errno.ENOSPC, "No space left on device")
    assert disk.machine_error(full) is full
    assert disk.machine_error(BlockingIOError(errno.EAGAIN, "fork: retry")) is not None
    assert disk.machine_error(PermissionError(errno.EACCES, "Permission denied")) is None
    assert disk.machine_error(FileNotFoundError(errno.ENOENT, "No such file")) is None
    assert disk.machine_error(ValueError("bad plan")) is None
    try:  # an executor that wraps the OSError in its own error
        try:
            raise OSError(errno.EMFILE, "Too many open files")
        except OSError as inner:
            raise RuntimeError("could not start the wrapper") from inner
    except RuntimeError as wrapped:
        found = disk.machine_error(wrapped)
    assert found is not None and found.errno == errno.EMFILE


def test_the_pause_doubles_to_five_minutes() -> None:
    assert [disk.pause_s(n) for n in (1, 2, 3, 4, 5, 6, 50)] == [10, 20, 40, 80, 160, 300, 300]


def test_statvfs_of_a_directory_not_made_yet_reads_its_nearest_parent(tmp_path: Path) -> None:
    here = disk.disk_free(str(tmp_path))
    later = disk.disk_free(str(tmp_path / "logs" / "E1"))  # made by the suite's first launch
    st = os.statvfs(tmp_path)
    assert here.free_mib is not None and here.total_mib == (st.f_blocks * st.f_frsize) >> 20
    assert later.path == str(tmp_path / "logs" / "E1")
    assert later.total_mib == here.total_mib and later.free_mib is not None
    assert abs(later.free_mib - here.free_mib) < 64  # the same filesystem, read a moment later
    assert not here.missing and later.missing
    (tmp_path / "file").write_text("")
    assert disk.disk_free(str(tmp_path / "file" / "below")).missing  # a file where a folder was meant
