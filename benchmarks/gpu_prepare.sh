#!/bin/bash
# What a lent, bare GPU machine needs for gpu_machine.sh, fetched here (where PyPI and Debian are
# reachable; that machine reaches nothing) into the ignored folders its header names, so that a
# session spends none of its device minutes on it:
#
#   bash benchmarks/gpu_prepare.sh [BEFORE_COMMIT] [PARTS_COMMIT]
#
# .whl/   gpusched's dependencies that machine lacks, as wheels for its Python (3.12)
# .deb/   task-spooler, GNU parallel and tmux with its libraries, unpacked there, never installed
# .before/  with BEFORE_COMMIT (may be ''): that tree's gpusched/, timed in turn with this one
# .parts/   with PARTS_COMMIT: that tree's gpusched/, timed beside this one by the two status parts
#           (the tree before a change to status; stop 63: a238f48)
# Then carry them: run(command="bash benchmarks/gpu_machine.sh $OUT 4", carry=[".whl", ".deb",
# ".before", ".parts"]), or two commands with PARTS (gpu_machine.sh's header).
set -eu
cd "$(dirname "$0")/.."
rm -rf .whl .deb .before .parts
mkdir -p .whl .deb
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl libtmux tenacity msgspec simple-gpu-scheduler
(cd .deb && apt-get download -q task-spooler parallel tmux libevent-core-2.1-7 libutempter0 >/dev/null)
if [ -n "${1:-}" ]; then
    mkdir -p .before
    git archive "$1" gpusched | tar -x -C .before
    git rev-parse --short "$1" >.before/COMMIT
fi
if [ -n "${2:-}" ]; then
    mkdir -p .parts
    git archive "$2" gpusched | tar -x -C .parts
    git rev-parse --short "$2" >.parts/COMMIT
fi
du -sh .whl .deb ${1:+.before} ${2:+.parts} | tr '\n' ' '
echo "(64 MiB a call in all)"
