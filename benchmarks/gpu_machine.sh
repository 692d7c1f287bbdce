#!/bin/bash
# One run of the aims and the real-GPU checks on a lent, bare GPU machine that has Python and
# torch but nothing of gpusched's own, and no network. What it needs is carried beside the
# checkout (the folders are in .gitignore; `bash benchmarks/gpu_prepare.sh [BEFORE_COMMIT]` fetches
# .whl/, .deb/ and .before/ here in one command):
#
#   .whl/  the wheels of gpusched's dependencies that machine lacks, for its Python:
#          python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#            --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#            -d .whl libtmux tenacity msgspec simple-gpu-scheduler
#   .before/  optional: an earlier tree, for the aims' dispatch rows and the night's first launch
#          to run in turn with this one
#          (git archive COMMIT gpusched | tar -x -C .before; echo COMMIT > .before/COMMIT)
#   .parts/  optional: another tree timed beside this one in the two status parts, e.g. the tree
#          before a change to status (stop 63: a238f48, before the kept entries)
#          (git archive COMMIT gpusched | tar -x -C .parts; echo COMMIT > .parts/COMMIT). The branch it
#          was made for, experiment/status-parts (stop 58), lived in one session's checkout only: gone.
#   .deb/  the tools compared against: (cd .deb && apt-get download task-spooler parallel tmux
#          libevent-core-2.1-7 libutempter0); unpacked with dpkg -x into a scratch root, never /
#
#   bash benchmarks/gpu_machine.sh OUT_DIR [STEPS]    # STEPS: the OOM ladder's steps a job (4)
#
# Writes each part's output to OUT_DIR (in_turn.txt, gpu_checks.txt, dispatch.txt, runner.txt,
# first_launch.txt, refill.txt, status.txt, status_suites.txt, idle_nvml.txt,
# refill_listing.txt) as it goes, so what ran before a time limit is kept.
# About 10 minutes on 16 cores and an H200, where a command of the lent machine may run 10 and a
# session has 15 in all, its start included: run it as two commands. PARTS="a b" runs those parts in
# this script's order, so the first command calls it twice to put the issue's aims before the GPU
# checks (stop 61: 505 s, six files under OUT_DIR, of the 8 a call brings back):
#   PARTS="dispatch status status_suites idle_nvml" bash benchmarks/gpu_machine.sh OUT_DIR 4;
#     PARTS=gpu_checks bash benchmarks/gpu_machine.sh OUT_DIR 4
# then, on the still-warm machine (it goes back after 30 s idle), the rest (stop 61: 104 s without
# runner and in_turn):
#   PARTS="refill first_launch refill_listing runner in_turn" bash benchmarks/gpu_machine.sh OUT_DIR
# (without PARTS, every part). A .parts/ tree adds four rows to each status part, little time (stop
# 63: 40 and 48 s with a238f48 beside this tree, against stop 61's 39 and 46 s without one).
set -u
out=${1:?usage: gpu_machine.sh OUT_DIR [STEPS]}
steps=${2:-4}
cd "$(dirname "$0")/.." || exit 2
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl ||
    exit 2
export PYTHONPATH=$PWD:/tmp/site
mkdir -p /tmp/debroot
for f in .deb/task-spooler_*.deb .deb/parallel_*.deb; do dpkg -x "$f" /tmp/debroot; done
if ! command -v tmux >/dev/null; then
    for f in .deb/tmux_*.deb .deb/libevent*.deb .deb/libutempter*.deb; do dpkg -x "$f" /tmp/debroot; done
    export LD_LIBRARY_PATH=/tmp/debroot/usr/lib/x86_64-linux-gnu
fi
export PATH=$PATH:/tmp/debroot/usr/bin
{
    echo "cores: $(nproc); $(python3 --version); $(tmux -V); commit: $(git rev-parse --short HEAD 2>/dev/null)" \
        "$([ -f .before/COMMIT ] && echo "; .before: $(cat .before/COMMIT)")"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
} | tee "$out/machine.txt"
part() {  # part NAME LIMIT_S COMMAND...: one part, its output to OUT_DIR/NAME.txt, cut at LIMIT_S
    local name=$1 limit=$2 t=$SECONDS
    shift 2
    case " ${PARTS:-$name} " in *" $name "*) ;; *) return 0 ;; esac  # PARTS="a b": only those
    echo "=== $name"
    timeout "$limit" "$@" 2>&1 | tee "$out/$name.txt"
    echo "--- $name: exit ${PIPESTATUS[0]} after $((SECONDS - t)) s" | tee -a "$out/$name.txt"
}
# the aims' rows in turn with .before/ (three rounds), then the whole table once; without
# .before/, the whole table three times
rounds=3
if [ -d .before/gpusched ]; then
    rounds=1
    part in_turn 180 bash -c 'for r in 1 2 3; do for tree in now .before; do echo "=== round $r: $tree";
        PYTHONPATH=$PWD/${tree#now}:/tmp/site TMPDIR=/dev/shm python3 benchmarks/bench_dispatch.py \
        --only "gpusched (subprocess),gpusched (tmux),task-spooler,GNU parallel"; done; done'
fi
part gpu_checks 360 bash benchmarks/gpu_checks.sh "$steps"
part dispatch 150 env TMPDIR=/dev/shm python3 benchmarks/bench_dispatch.py --repeat $rounds
# three rounds of plain processes in turn: wrappers forked by the runner (the default) and each
# started on its own (GPUSCHED_RUNNER=0, as before stop 40; benchmarks/README.md, "Stop 40")
part runner 120 bash -c 'for r in 1 2 3; do for on in 1 0; do echo "GPUSCHED_RUNNER=$on";
    GPUSCHED_RUNNER=$on TMPDIR=/dev/shm python3 benchmarks/bench_dispatch.py --only "gpusched (subprocess)"; done; done'
# the night's first launch (submit to the first job, no daemon running), in turn with .before/
part first_launch 60 bash -c 'python3 benchmarks/bench_first_launch.py --rounds 8 $([ -d .before/gpusched ] && echo --before .before)'
part refill 120 python3 benchmarks/bench_refill.py --jobs 300 --backend subprocess,tmux,tmux-job
part status 120 bash -c 'python3 benchmarks/bench_status.py --runs 3 $([ -d .parts/gpusched ] && echo --before .parts)'
# the same 10,000 jobs in 246 suites, as months of nights leave a store (benchmarks/README.md, "Stop 53")
part status_suites 120 bash -c 'python3 benchmarks/bench_status.py --runs 3 --jobs 200 --older 40 --past-suites 245 \
    $([ -d .parts/gpusched ] && echo --before .parts)'
# the idle daemon on the real card through NVML, 14 jobs each holding a CUDA context (fake cards
# cannot say what NVML's calls and the real processes' attribution cost a second)
part idle_nvml 120 python3 benchmarks/bench_idle.py --seconds 30 --real-gpus
# last, as the part a time limit may cut: the refill beside cards that list a process, as a real
# GPU's do, and 600 other processes (benchmarks/README.md, "Stop 58": fake cards list none, so no
# refill measured before it read the process table the daemon reads on a real GPU)
part refill_listing 60 python3 benchmarks/bench_refill.py --jobs 300 --backend subprocess,tmux --gpu-processes 600
