#!/bin/sh
# gpusched attempt wrapper: sh wrap.sh ATTEMPT_DIR [tee|file]. A long-lived shell (the
# subprocess backend's runner.sh, a reused tmux pane's pane.sh) sources it once with --define
# and calls gpusched_wrap in each subshell it forks. Its contract and the notes on each step
# are at the end, after the last command: sh reads them only where it defines the function
# once (on a busy machine each kilobyte sh reads costs every job ~10 us).
gpusched_wrap() { # (7)
    dir=$1
    mode=${2:-tee}
    caught=
    rc=
    tee=
    set -- /proc/self/task/* # (6)
    self=${1##*/}
    case $self in '' | *[!0-9]*) self=$$ ;; esac
    trap 'caught=15' TERM
    trap 'caught=2' INT
    trap 'caught=1' HUP
    run_job() { # (2)
        trap 'exit 130' INT
        trap 'exit 143' TERM
        trap 'exit' HUP
        set --
        . "$dir/launch.sh"
    }
    printf '%s\n' "$self" >"$dir/pid"
    if [ "$mode" = file ]; then
        (run_job) >>"$dir/output.log" 2>&1 </dev/null
        rc=$?
    elif [ -p "$dir/.output.pipe" ]; then # (3)
        trap '' TERM HUP
        LC_ALL=C tee -a "$dir/output.log" <"$dir/.output.pipe" &
        tee=$!
        trap 'caught=15' TERM
        trap 'caught=1' HUP
        (run_job) >"$dir/.output.pipe" 2>&1
        rc=$?
        : 1<>"$dir/.output.pipe"
        while [ -z "$caught" ] && [ -n "$tee" ]; do # (1)
            wait "$tee"
            [ $? -gt 128 ] && kill -0 "$tee" 2>/dev/null || tee=
        done
    else # (4)
        exec 4>&1
        rc=$({ { (run_job) 2>&1 3>&- 4>&-; echo $? >&3; } |
            LC_ALL=C tee -a "$dir/output.log" >&4 3>&-; } 3>&1)
        exec 4>&-
    fi
    code=null
    sig=null
    if [ -n "$rc" ]; then
        code=$rc
        if [ "$rc" -gt 128 ] && [ "$rc" -lt 160 ]; then sig=$((rc - 128)); fi
    elif [ -n "$caught" ]; then
        sig=$caught
    fi
    printf '{"exit_code": %s, "signal": %s, "wrapper_pid": %s}\n' "$code" "$sig" "$self" >"$dir/exit.json"
    if [ -n "${GPUSCHED_WAKE:-}" ] && [ -p "$GPUSCHED_WAKE" ]; then
        { printf x >&3; } 3<>"$GPUSCHED_WAKE" 2>/dev/null # (5)
    fi
    if [ "$mode" != file ]; then
        printf '\n[gpusched] %s exited: code=%s signal=%s\n' "${GPUSCHED_JOB_ID:-job}" "$code" "$sig"
    fi
    if [ -n "$rc" ]; then exit "$rc"; elif [ -n "$caught" ]; then exit $((128 + caught)); else exit 1; fi
}
[ "${1-}" = --define ] || gpusched_wrap "$@" # (8)

# ---------------------------------------------------------------------------------------------
# Nothing below is read by sh when it runs this file (gpusched_wrap ends at an exit); a shell
# that defines the function once reads it once.
#
# Runs inside the job's tmux pane ("tee" mode) or detached process group ("file" mode: a
# subshell of the runner, which leads the group, or a wrapper of its own in its own session).
# Contract (see gpusched/attempt.py, which owns every path named here):
#   - writes ATTEMPT_DIR/pid (its own PID) before the job starts; the file's mtime is the
#     attempt's start time;
#   - runs ATTEMPT_DIR/launch.sh (env + cd + the job's command) in a subshell, its stdout and
#     stderr appended to ATTEMPT_DIR/output.log, and also shown on this terminal in "tee" mode;
#   - writes ATTEMPT_DIR/exit.json when the job ends, also when the job was stopped with
#     SIGTERM/SIGINT/SIGHUP; the file's mtime is the attempt's end time;
#   - then pokes the daemon's wake FIFO ($GPUSCHED_WAKE) so a freed slot is refilled at once,
#     and exits with the job's status (so that what ran the wrapper, Slurm's sacct or a dead
#     tmux pane, tells the truth).
# It is POSIX sh on purpose, and starts no program of its own in "file" mode (only tee in
# "tee" mode): every step is a shell builtin, because on a busy machine each exec costs about
# a millisecond, and that is what dispatching a thousand short jobs is made of. So the clock
# is the kernel's (file mtimes, not `date`), and exit.json is one short write instead of a
# temp file and `mv`: a reader sees a whole JSON object or none (a cut-short prefix does not
# parse), and the daemon only trusts a missing or partial one once this process is gone.
#
# (1) Waits for the background tee of (3), so that what the job printed is all in output.log
#     (not after a signal: see (3)); a trapped signal cuts a `wait` short, so it waits again
#     while tee runs.
# (2) run_job runs launch.sh, in the subshell it is called in. On SIGINT, SIGTERM or SIGHUP
#     that subshell waits for the job's command to finish stopping (a trainer saving its
#     checkpoint), then exits: 130 and 143 (a stop asked for is not a success, whatever the
#     job's handler returns), and after a hangup the command's own status (a job that ignores
#     it runs on, and may end well). Without the traps the subshell died at once, and
#     exit.json said the job had ended while it still ran (in a tmux pane, this shell's exit
#     then hung the job up). A signal that lands in the instant between two of launch.sh's
#     commands misses the next one, which the subshell then waits for: a cancel then ends at
#     its grace's SIGKILL.
# (3) In a tmux pane, tee takes the job's output from the FIFO the tmux executor made in the
#     attempt folder to this terminal and output.log: two processes fewer than the pipeline
#     of (4), whose exit status must be fetched back. A Ctrl-C in the pane (SIGINT), a cancel
#     or a limit (SIGTERM) and a SIGHUP sent to the group reach all of it; tee ignores them
#     all (sh starts a background command with SIGINT ignored), so what the job prints as it
#     stops reaches output.log, and this shell, which leads the pane's terminal session and
#     whose exit hangs up what is left of the group, outlives the job's command. The
#     `: 1<>FIFO` opens and closes a writer: a tee still waiting for one (the job's output
#     never opened) gets its end. The log is whole before exit.json is written, except after
#     a signal: a helper the job started with `&` ignores SIGINT and may hold the output open
#     for good, so exit.json is written at once, this shell's exit hangs that helper up, and
#     tee writes out what is left. (Before, tee died with the job: its last lines were lost,
#     and a trainer that printed "saving" first died of the broken pipe.)
# (4) A folder without the FIFO (made by an older gpusched, or on a filesystem without FIFOs):
#     the output goes through a pipeline into tee to this terminal (fd 4), and the exit status
#     comes back on fd 3.
# (5) A read-write open of a FIFO never blocks on Linux, whether or not the daemon listens.
# (6) Its own pid. Not $$: in a subshell the runner (gpusched/runner.sh) or a reused pane's
#     loop (gpusched/pane.sh) forked, $$ is that shell's pid. The glob is expanded by this
#     process, in whose /proc/self/task the one thread is itself, whichever way it was
#     started: a directory listing, where a `read` of /proc/self/stat took ~300 one-byte
#     reads (~0.1 ms a job). Without /proc (the glob left as it is) it falls back on $$.
# (7) One function, so that a shell that starts many wrappers parses it once (runner.sh and
#     pane.sh source this file with --define when they start, then call gpusched_wrap in each
#     subshell): sourcing the file in every subshell parsed it again, ~0.1 ms a job.
# (8) `sh wrap.sh ATTEMPT_DIR MODE` (a tmux window, Slurm, a wrapper started on its own) runs
#     it at once; --define only defines it.
