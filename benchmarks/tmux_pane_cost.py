"""What a tmux pane costs, and how much of it is tmux's utmp record: the tmux rows of the
dispatch table (1,000 no-op jobs over 16 slots) as they are, and with the tmux server's
libutempter calls made no-ops, beside GNU parallel, rounds in turn.

    python benchmarks/tmux_pane_cost.py [--jobs 1000] [--rounds 3]

A tmux built with libutempter (Debian's and Ubuntu's are) records every pane in utmp: at each
pane's start and end the server forks libutempter's setgid helper and waits for it, in its one
thread, so the panes of a tick are created one after the other behind it. This script builds a
shared library whose ``utempter_*`` functions do nothing (with ``cc``; without one it says so
and stops) and preloads it (``LD_PRELOAD``) into everything the "no utempter" rows start: the
CLI, the daemon and the tmux server it starts (the jobs too, where the library is loaded but
never called). That is a measurement, not something gpusched does to a user's tmux: a user's
``tmux ls`` and ``who`` would no longer see the panes.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import machine, median, table
from bench_dispatch import gpusched, parallel, tmux_alone

SHIM = """
int utempter_add_record(int fd, const char *host) { (void)fd; (void)host; return 1; }
int utempter_remove_record(int fd) { (void)fd; return 1; }
int utempter_remove_added_record(void) { return 1; }
void utempter_set_helper(const char *path) { (void)path; }
"""


def build_shim(folder: Path) -> Path | None:
    """The no-op libutempter, built in ``folder``; None without a C compiler."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    src, lib = folder / "noutempter.c", folder / "noutempter.so"
    src.write_text(SHIM)
    subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(lib), str(src)], check=True)
    return lib


@contextlib.contextmanager
def preloaded(lib: Path | None) -> Iterator[None]:
    """``lib`` preloaded into every process started meanwhile (nothing when None)."""
    if lib is None:
        yield
        return
    before = os.environ.get("LD_PRELOAD")
    os.environ["LD_PRELOAD"] = str(lib)
    try:
        yield
    finally:
        if before is None:
            del os.environ["LD_PRELOAD"]
        else:
            os.environ["LD_PRELOAD"] = before


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    if not shutil.which("tmux"):
        print("tmux_pane_cost: no tmux here; install it (apt-get install -y tmux)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        lib = build_shim(Path(tmp))
        if lib is None:
            print("tmux_pane_cost: no C compiler (cc) to build the no-op libutempter with", file=sys.stderr)
            return 2
        runs = {
            "floor: a tmux window per job, nothing else": (tmux_alone, None),
            "floor: a tmux window per job, no utempter": (tmux_alone, lib),
            "gpusched (tmux)": (gpusched("tmux"), None),
            "gpusched (tmux), no utempter": (gpusched("tmux"), lib),
            "GNU parallel -j16": (parallel, None),
        }
        if not shutil.which("parallel"):
            del runs["GNU parallel -j16"]
        walls: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.rounds):
            for name, (run, preload) in runs.items():
                with preloaded(preload):
                    took = run(args.jobs, 16)
                walls[name].append(took.wall_s)
                print(f"  {name}: {took.wall_s:.2f} s", file=sys.stderr, flush=True)
    base = median(walls["GNU parallel -j16"]) if "GNU parallel -j16" in walls else None
    print(
        f"tmux's pane cost: {args.jobs} no-op jobs over 16 slots, median of {args.rounds} rounds "
        f"in turn ({machine()})\n"
    )
    rows = [
        [
            name,
            f"{median(w):.2f}",
            "-".join(f"{x:.2f}" for x in (min(w), max(w))),
            f"{median(w) / base:.2f}x" if base else "",
        ]
        for name, w in walls.items()
    ]
    print(table(["run", "wall s", "range s", "vs parallel"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
