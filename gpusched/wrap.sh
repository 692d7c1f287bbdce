#!/bin/sh
# gpusched attempt wrapper. Runs inside the job's tmux pane or detached process group.
#
#   sh wrap.sh ATTEMPT_DIR [tee|file]
#
# Contract (see gpusched/attempt.py, which owns every path named here):
#   - writes ATTEMPT_DIR/pid ("PID STARTED_AT") before the job starts;
#   - runs ATTEMPT_DIR/launch.sh (env + cd + exec of the job's command), its stdout and stderr
#     appended to ATTEMPT_DIR/output.log, and also shown on this terminal in "tee" mode;
#   - writes ATTEMPT_DIR/exit.json atomically (temp file + rename) when the job ends, also when
#     the job was stopped with SIGTERM/SIGINT/SIGHUP;
#   - then pokes the daemon's wake FIFO ($GPUSCHED_WAKE) so a freed slot is refilled at once.
# It is POSIX sh on purpose: no interpreter start on the hot path of every job.
dir=$1
mode=${2:-tee}
caught=
trap 'caught=15' TERM
trap 'caught=2' INT
trap 'caught=1' HUP
started=$(date +%s.%N)
printf '%s %s\n' "$$" "$started" >"$dir/pid.tmp" && mv -f "$dir/pid.tmp" "$dir/pid"
rm -f "$dir/.rc"
if [ "$mode" = tee ]; then
    # the group runs in a subshell; its exit status reaches us through .rc
    { sh "$dir/launch.sh" 2>&1; echo $? >"$dir/.rc"; } | tee -a "$dir/output.log"
    rc=$(cat "$dir/.rc" 2>/dev/null)
else
    sh "$dir/launch.sh" >>"$dir/output.log" 2>&1 </dev/null
    rc=$?
fi
ended=$(date +%s.%N)
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
    mv -f "$dir/exit.json.tmp" "$dir/exit.json"
rm -f "$dir/.rc"
if [ -n "${GPUSCHED_WAKE:-}" ] && [ -p "$GPUSCHED_WAKE" ]; then
    # read-write open of a FIFO never blocks on Linux, whether or not the daemon listens
    { printf x >&3; } 3<>"$GPUSCHED_WAKE" 2>/dev/null
fi
if [ "$mode" = tee ]; then
    printf '\n[gpusched] %s exited: code=%s signal=%s\n' "${GPUSCHED_JOB_ID:-job}" "$code" "$sig"
fi
exit 0
