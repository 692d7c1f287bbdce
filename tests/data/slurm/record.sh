#!/usr/bin/env bash
# Re-record the Slurm fixtures of tests/contract/test_slurm_parsers.py from a real cluster.
#
#   scripts/slurm-ci.sh down
#   SLURM_CI_SLURMDBD=1 SLURM_CI_MINJOBAGE=10 scripts/slurm-ci.sh up   # sacct + a quick purge
#   bash tests/data/slurm/record.sh [OUTDIR]          # default: this folder
#   scripts/slurm-ci.sh down; SLURM_CI_SLURMDBD=0 scripts/slurm-ci.sh up
#   bash tests/data/slurm/record.sh --no-dbd [OUTDIR]  # the "accounting is disabled" answer
#   kill "$(cat /tmp/slurm-ci/slurmctld.pid)"; bash tests/data/slurm/record.sh --ctld-down [OUTDIR]
#
# Job ids restart at 1 on every fresh `up`, so the fixtures name jobs 1..N; the test expects the
# order of submission below. Error answers are saved as "<stderr>\nrc=<code>".
set -uo pipefail
if [ "${1:-}" = --no-dbd ]; then
    OUT=$(cd "${2:-$(dirname "$0")}" && pwd)
    { sacct -X -n -P -j 1 -o JobIDRaw,State,ExitCode,NodeList 2>&1; echo "rc=$?"; } >"$OUT/sacct_disabled.txt"
    scontrol show config >"$OUT/scontrol_show_config.txt"
    exit 0
fi
if [ "${1:-}" = --ctld-down ]; then
    OUT=$(cd "${2:-$(dirname "$0")}" && pwd)
    { scontrol ping 2>&1; echo "rc=$?"; } >"$OUT/scontrol_ping_down.txt"
    { squeue -t all -h -j 1,2 -o '%i|%A|%T|%r|%N' 2>&1; echo "rc=$?"; } >"$OUT/squeue_ctld_down.txt"
    exit 0
fi
OUT=$(cd "${1:-$(dirname "$0")}" && pwd)
W=$(mktemp -d /tmp/gpusched-record.XXXXXX)
mkdir -p "$W/dir with space"
cd "$W" || exit 1
sb() { sbatch --parsable --open-mode=append --no-requeue "$@"; }
script() { printf '#!/bin/sh\n%s\n' "$1" >"$W/$2.sh"; echo "$W/$2.sh"; }
# 1 ok  2 exit 1  3 exit 3  4 torch OOM line + exit 1  5 kill -9 itself  6 long (cancelled while
# running)  7 needs all 4 GPUs (pending, then cancelled)  8 array of 2 (task 1 exits 3)
# 9 output path with a space
J1=$(sb -J ok --gres=gpu:1 --comment=gpusched:tok-ok -o "$W/ok-%j.out" "$(script 'echo CVD=$CUDA_VISIBLE_DEVICES; sleep 3' ok)")
J2=$(sb -J fail --gres=gpu:1 -o "$W/fail-%j.out" "$(script 'sleep 3; exit 1' fail)")
J3=$(sb -J exit3 --gres=gpu:1 -o "$W/e3-%j.out" "$(script 'sleep 3; exit 3' e3)")
J4=$(sb -J oom --gres=gpu:1 -o "$W/oom-%j.out" \
    "$(script 'sleep 3; echo "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB" >&2; exit 1' oom)")
J5=$(sb -J sig -o "$W/sig-%j.out" "$(script 'sleep 3; kill -9 $$' sig)")
J6=$(sb -J long --comment=gpusched:tok-long -o "$W/long-%j.out" "$(script 'sleep 300' long)")
J7=$(sb -J gpu4 --gres=gpu:4 --comment=gpusched:tok-pend -o "$W/p-%j.out" "$(script 'sleep 1' p)")
J8=$(sb -J arr --array=0-1 -o "$W/arr-%A_%a.out" "$(script 'sleep 3; [ "$SLURM_ARRAY_TASK_ID" = 1 ] && exit 3; exit 0' arr)")
J9=$(sb -J 'name with space' -o "$W/dir with space/s-%j.out" "$(script 'sleep 3' s)")
echo "submitted $J1 $J2 $J3 $J4 $J5 $J6 $J7 $J8 $J9" >&2
sleep 1.5
# while running/pending
scontrol show job -o >"$OUT/scontrol_show_job_live.txt"
squeue -t all -h -o '%i|%A|%T|%r|%N' >"$OUT/squeue_all_live.txt"
squeue -h -t all --me -o '%A|%k' >"$OUT/squeue_comments.txt"
scontrol show job "$J6" >"$OUT/scontrol_show_job_multiline.txt"
scancel "$J6" "$J7"
for _ in $(seq 120); do [ -z "$(squeue -h -o %A)" ] && break; sleep 0.5; done
sleep 2 # sacct may lag a second
# all ended
scontrol show job -o >"$OUT/scontrol_show_job_done.txt"
squeue -t all -h -o '%i|%A|%T|%r|%N' >"$OUT/squeue_all_done.txt"
sacct -X -n -P -o JobIDRaw,State,ExitCode,NodeList >"$OUT/sacct.txt"
sacct -n -P -o JobIDRaw,State,ExitCode,NodeList >"$OUT/sacct_steps.txt"
# purged after MinJobAge: scontrol/squeue forget the job; sacct and jobcomp remember it
for _ in $(seq 240); do scontrol show job "$J1" >/dev/null 2>&1 || break; sleep 0.5; done
{ scontrol show job -o "$J1" 2>&1; echo "rc=$?"; } >"$OUT/scontrol_purged.txt"
{ squeue -t all -h -j "$J1" -o '%i|%A|%T|%r|%N' 2>&1; echo "rc=$?"; } >"$OUT/squeue_purged_one.txt"
{ squeue -t all -h -j "$J1,$J2" -o '%i|%A|%T|%r|%N' 2>&1; echo "rc=$?"; } >"$OUT/squeue_purged_many.txt"
cp "$(scontrol show config | awk '$1 == "JobCompLoc" {print $3}')" "$OUT/jobcomp.txt"
{ scontrol ping 2>&1; echo "rc=$?"; } >"$OUT/scontrol_ping_up.txt"
echo "recorded into $OUT (work dir $W)" >&2
