"""What an attempt directory's files cost on the disk the benchmarks (or your logs) are on.

    python benchmarks/fs_inodes.py [--jobs 1000] [--dir DIR]     (DIR: default $TMPDIR)

Makes ``--jobs`` job folders the way gpusched lays out a first attempt (a job folder, an
attempt folder, five small files: seven inodes), three times: into a new folder, again into
another, and once more right after deleting the first two. Prints the wall and kernel time
per job for each. On a journaled filesystem the three agree (about half a millisecond a job
on a 2-core VM). On ext4 without a journal the third costs several times the second:
creating an inode there scans past every inode deleted in the last minutes (ext4 holds them
back until their inode table block is surely written: ``recently_deleted`` in
``fs/ext4/ialloc.c``), so any benchmark that deletes one sandbox and makes the next measures
the deletion. ``bench_dispatch.py`` and the others name the filesystem in their heading.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import filesystem, table

FILES = ("config.yaml", "launch.sh", "pid", "output.log", "exit.json")


def make(base: str, jobs: int) -> tuple[float, float]:
    """(wall ms, kernel ms) per job to lay out ``jobs`` first attempts under ``base``."""
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for i in range(jobs):
        attempt = os.path.join(base, f"job{i}", "1-A")
        os.mkdir(os.path.dirname(attempt))
        os.mkdir(attempt)
        for name in FILES:
            with open(os.path.join(attempt, name), "w") as f:
                f.write("x" * 300)
    r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    return (t1 - t0) * 1000 / jobs, (r1.ru_stime - r0.ru_stime) * 1000 / jobs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where to make them (default: $TMPDIR)")
    args = ap.parse_args(argv)
    if not os.path.isdir(args.dir):
        print(f"fs_inodes.py: --dir {args.dir}: not a folder; give an existing one", file=sys.stderr)
        return 2
    first = tempfile.mkdtemp(prefix="gpusched-fs-", dir=args.dir)
    second = tempfile.mkdtemp(prefix="gpusched-fs-", dir=args.dir)
    third = tempfile.mkdtemp(prefix="gpusched-fs-", dir=args.dir)
    try:
        rows = [["into a new folder", *make(first, args.jobs)]]
        rows.append(["again, into another", *make(second, args.jobs)])
        shutil.rmtree(first)
        shutil.rmtree(second)
        rows.append([f"right after deleting those {14 * args.jobs} inodes", *make(third, args.jobs)])
    finally:
        for d in (first, second, third):
            shutil.rmtree(d, ignore_errors=True)
    print(f"{args.jobs} attempt folders of seven inodes on {filesystem(args.dir)}\n")
    print(
        table(
            ["laid out", "wall ms/job", "kernel ms/job"], [[r[0], f"{r[1]:.2f}", f"{r[2]:.2f}"] for r in rows]
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
