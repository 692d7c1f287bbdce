#!/bin/sh
# gpusched attempt wrapper. Runs inside the job's tmux pane or detached process group.
#
#   sh wrap.sh ATTEMPT_DIR [tee|file]
#
# Contract (see gpusched/attempt.py, which owns every path named here):
#   - writes ATTEMPT_DIR/pid (its own PID) before the job starts; the file's mtime is the
#     attempt's start time;
#   - runs ATTEMPT_DIR/launch.sh (env + cd + the job's command) in a subshell, its stdout and
#     stderr appended to ATTEMPT_DIR/output.log, and also shown on this terminal in "tee" mode;
#   - writes ATTEMPT_DIR/exit.json when the job ends, also when the job was stopped with
#     SIGTERM/SIGINT/SIGHUP; the file's mtime is the attempt's end time;
#   - then pokes the daemon's wake FIFO ($GPUSCHED_WAKE) so a freed slot is refilled at once,
#     and exits with the job's status.
# It is POSIX sh on purpose, and starts no program of its own in "file" mode (only tee in
# "tee" mode, reading the folder's .output.pipe FIFO where there is one): every step is a
# shell builtin, because on a busy machine each exec costs about a millisecond, and that is
# what dispatching a thousand short jobs is made of. So the clock is the kernel's (file
# mtimes, not `date`), and exit.json is one short write instead of a temp file and `mv`: a
# reader sees a whole JSON object or none (a cut-short prefix does not parse), and the daemon
# only trusts a missing or partial one once this process is gone.
dir=$1
mode=${2:-tee}
caught=
rc=
trap 'caught=15' TERM
trap 'caught=2' INT
trap 'caught=1' HUP
tee=
tee_done() {
    # wait for the background tee (what the job printed is all in output.log); a trapped
    # signal cuts a wait short, so wait again while it runs
    while [ -n "$tee" ]; do
        wait "$tee"
        [ $? -gt 128 ] && kill -0 "$tee" 2>/dev/null || tee=
    done
}
run_job() {
    # launch.sh, in the subshell it is called in. On SIGINT, SIGTERM or SIGHUP the subshell
    # waits for the job's command to finish stopping (a trainer saving its checkpoint) and
    # then exits: 130 and 143 (a stop asked for is not a success, whatever the job's handler
    # returns), and after a hangup the command's own status (a job that ignores it runs on).
    # Without the traps it died at once, and exit.json said the job had ended while it
    # still ran (and, in a tmux pane, this shell's exit hung the job up). A signal that lands
    # in the instant between two of launch.sh's commands misses the next one, which the
    # subshell then waits for: a cancel then ends at its grace's SIGKILL.
    trap 'exit 130' INT
    trap 'exit 143' TERM
    trap 'exit' HUP
    set --
    . "$dir/launch.sh"
}
printf '%s\n' "$$" >"$dir/pid"
pipe=$dir/.output.pipe
if [ "$mode" = tee ] && [ -p "$pipe" ]; then
    # The output goes through tee to this terminal and output.log by way of the FIFO the
    # tmux executor made: two processes fewer than the pipeline below, whose exit status
    # must be fetched back. A Ctrl-C in the pane (SIGINT), a cancel or a limit (SIGTERM) and
    # a closed pane (SIGHUP) reach the whole group. tee ignores them all (sh starts a
    # background command with SIGINT ignored), so what the job prints as it stops still
    # reaches output.log; and this shell, which leads the pane's terminal session and whose
    # exit sends what is left of the group a SIGHUP, outlives the job's command (run_job).
    # (Before, tee died with the job: the last lines were lost, and a trainer that printed
    # "saving" first died of the broken pipe.)
    trap '' TERM HUP
    LC_ALL=C tee -a "$dir/output.log" <"$pipe" &
    tee=$!
    trap 'caught=15' TERM
    trap 'caught=1' HUP
    (run_job) >"$pipe" 2>&1
    rc=$?
    : 1<>"$pipe" # a tee still waiting for the job's output to open (it never did) gets its end
    # The log is whole before exit.json is written, unless a signal stopped the job: then a
    # process it left behind may hold the output open for good (a helper started with `&`
    # ignores SIGINT), and this shell writes exit.json and goes (its exit hangs that process
    # up, as the pane's closing would); tee writes out what is left.
    [ -n "$caught" ] || tee_done
elif [ "$mode" = tee ]; then
    # (an attempt folder without the FIFO: made by an older gpusched, or on a filesystem
    # without FIFOs) the output goes through tee to this terminal (fd 4); the exit status
    # comes back on fd 3
    exec 4>&1
    rc=$({ { (run_job) 2>&1 3>&- 4>&-; echo $? >&3; } |
        LC_ALL=C tee -a "$dir/output.log" >&4 3>&-; } 3>&1)
    exec 4>&-
else
    (run_job) >>"$dir/output.log" 2>&1 </dev/null
    rc=$?
fi
code=null
sig=null
if [ -n "$rc" ]; then
    code=$rc
    if [ "$rc" -gt 128 ] && [ "$rc" -lt 160 ]; then sig=$((rc - 128)); fi
elif [ -n "$caught" ]; then
    sig=$caught
fi
printf '{"exit_code": %s, "signal": %s, "wrapper_pid": %s}\n' "$code" "$sig" "$$" >"$dir/exit.json"
if [ -n "${GPUSCHED_WAKE:-}" ] && [ -p "$GPUSCHED_WAKE" ]; then
    # read-write open of a FIFO never blocks on Linux, whether or not the daemon listens
    { printf x >&3; } 3<>"$GPUSCHED_WAKE" 2>/dev/null
fi
if [ "$mode" = tee ]; then
    printf '\n[gpusched] %s exited: code=%s signal=%s\n' "${GPUSCHED_JOB_ID:-job}" "$code" "$sig"
fi
# the job's own status, so that what ran the wrapper (Slurm's sacct, a dead tmux pane) tells the truth
if [ -n "$rc" ]; then exit "$rc"; elif [ -n "$caught" ]; then exit $((128 + caught)); else exit 1; fi
