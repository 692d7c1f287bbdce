#!/bin/bash
# The checks that need a real NVIDIA GPU, one after the other, each with a time limit: the
# NVML probe tests, placement beside an outside process (subprocess backend, then tmux where
# tmux is installed, a window per job and reused panes), and genuine CUDA OOMs down the tier ladder. Prints each check's output
# and a PASS/FAIL line per check; exits 1 if any failed.
#
#   bash benchmarks/gpu_checks.sh [LADDER_STEPS]    # LADDER_STEPS: optimizer steps per ladder job (6)
#
# About 6 minutes on an H200 (tier C of the ladder takes ~12 s a step there).
#
# Run it from the project's root with gpusched importable (`pip install -e .`, or PYTHONPATH).
set -u
cd "$(dirname "$0")/.." || exit 2
python=${PYTHON:-python3}
steps=${1:-6}
declare -A result
run() {  # run NAME LIMIT_S COMMAND...
    local name=$1 limit=$2 t=$SECONDS
    shift 2
    echo "=== $name"
    timeout "$limit" "$@"
    local rc=$?
    result[$name]="exit $rc after $((SECONDS - t)) s"
    echo "--- $name: ${result[$name]}"
}
if ! nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader; then
    echo "gpu_checks: no NVIDIA GPU here (nvidia-smi failed); run this on a machine with one"
    exit 2
fi
# from elsewhere than the checkout: the checks run gpusched from scratch directories
if ! err=$(cd / && "$python" -c "import gpusched.cli, libtmux, tenacity, msgspec, pynvml, torch" 2>&1); then
    echo "gpu_checks: gpusched or a dependency is not importable with $python: ${err##*$'\n'}; pip install -e '.[torch]'"
    exit 2
fi
run probe 120 "$python" -m pytest -p no:cacheprovider -q -m gpu tests/contract/test_probes.py
run outsider 300 "$python" benchmarks/gpu_outsider.py --jobs 6 --job-s 12 --timeout 260
names="probe outsider"
if command -v tmux >/dev/null; then  # the same, each job in its own pane of gpusched's tmux server
    # (by default: jobs of 12 s keep their panes, as jobs of 10 s or more do)
    run outsider-tmux 300 "$python" benchmarks/gpu_outsider.py --jobs 6 --job-s 12 --timeout 260 --backend tmux
    # and in panes that run one job after another (GPUSCHED_TMUX_PANES=reuse)
    GPUSCHED_TMUX_PANES=reuse run outsider-tmux-reuse 300 "$python" benchmarks/gpu_outsider.py --jobs 6 \
        --job-s 12 --timeout 260 --backend tmux
    names="$names outsider-tmux outsider-tmux-reuse"
else
    echo "=== outsider-tmux: not run, no tmux here"
fi
run ladder 480 "$python" benchmarks/gpu_oom_ladder.py --jobs 2 --steps "$steps" --timeout 420
failed=0
for name in $names ladder; do
    case ${result[$name]} in "exit 0 "*) echo "PASS $name (${result[$name]})" ;;
        *) echo "FAIL $name (${result[$name]})"; failed=1 ;; esac
done
exit $failed
