#!/bin/sh
# gpusched attempt wrapper. Runs inside the job's tmux pane or detached process group.
#
#   sh wrap.sh ATTEMPT_DIR [tee|file]
#
# Contract (see gpusched/attempt.py, which owns every path named here):
#   - writes ATTEMPT_DIR/pid ("PID STARTED_AT") before the job starts;
#   - runs ATTEMPT_DIR/launch.sh (env + cd + the job's command), its stdout and stderr
#     appended to ATTEMPT_DIR/output.log, and also shown on this terminal in "tee" mode;
#   - writes ATTEMPT_DIR/exit.json atomically (temp file + rename) when the job ends, also when
#     the job was stopped with SIGTERM/SIGINT/SIGHUP;
#   - then pokes the daemon's wake FIFO ($GPUSCHED_WAKE) so a freed slot is refilled at once.
# It is POSIX sh on purpose: no interpreter start on the hot path of every job. It also starts
# as few programs as it can -- date twice, mv once (tee in "tee" mode), with LC_ALL=C so they
# load no locale -- because on a busy machine each exec costs about a millisecond, and that is
# what dispatching a thousand short jobs is made of.
dir=$1
mode=${2:-tee}
caught=
rc=
trap 'caught=15' TERM
trap 'caught=2' INT
trap 'caught=1' HUP
started=$(LC_ALL=C date +%s.%N)
# one short write (no temp + rename): a reader sees the whole line or an empty file
printf '%s %s\n' "$$" "$started" >"$dir/pid"
if [ "$mode" = tee ]; then
    # the output goes through tee to this terminal (fd 4); the exit status comes back on fd 3
    exec 4>&1
    rc=$({ { sh "$dir/launch.sh" 2>&1 3>&- 4>&-; echo $? >&3; } |
        LC_ALL=C tee -a "$dir/output.log" >&4 3>&-; } 3>&1)
    exec 4>&-
else
    sh "$dir/launch.sh" >>"$dir/output.log" 2>&1 </dev/null
    rc=$?
fi
ended=$(LC_ALL=C date +%s.%N)
code=null
sig=null
if [ -n "$rc" ]; then
    code=$rc
    if [ "$rc" -gt 128 ] && [ "$rc" -lt 160 ]; then sig=$((rc - 128)); fi
elif [ -n "$caught" ]; then
    sig=$caught
fi
printf '{"exit_code": %s, "signal": %s, "started_at": %s, "ended_at": %s, "wrapper_pid": %s}\n' \
    "$code" "$sig" "$started" "$ended" "$$" >"$dir/exit.json.tmp" &&
    LC_ALL=C mv -f "$dir/exit.json.tmp" "$dir/exit.json"
if [ -n "${GPUSCHED_WAKE:-}" ] && [ -p "$GPUSCHED_WAKE" ]; then
    # read-write open of a FIFO never blocks on Linux, whether or not the daemon listens
    { printf x >&3; } 3<>"$GPUSCHED_WAKE" 2>/dev/null
fi
if [ "$mode" = tee ]; then
    printf '\n[gpusched] %s exited: code=%s signal=%s\n' "${GPUSCHED_JOB_ID:-job}" "$code" "$sig"
fi
exit 0
