#!/bin/sh
# gpusched runner: sh runner.sh WRAPPER TTY, started by the subprocess backend
# (gpusched/executors/subprocess.py), which writes one line per attempt on its stdin and reads
# the pid of that attempt's wrapper from its stdout. Notes at the end, after the last command.
wrap=$1
tty=$2
set -- --define
. "$wrap" || exit 1 # (5)
exec 9<>"$tty" # (1)
set -m
exec 9>&-
trap '' HUP
trap 'chld=1; jobs >/dev/null' CHLD # (2)
case $- in
*m*) echo ready ;;
*) echo "no job control" && exit 1 ;;
esac
while :; do
    chld=
    if read -r line; then
        (eval "$line" && gpusched_wrap "$@") </dev/null >/dev/null & # (3)
        echo "$!"
    elif [ -z "$chld" ]; then
        break # (4)
    fi
done
exit 0

# ---------------------------------------------------------------------------------------------
# Nothing below is read by sh.
#
# Why it exists: starting `sh wrap.sh` for each attempt costs an exec (~0.5 ms of CPU on a
# small VM, more than the rest of the wrapper) and blocks the daemon while the child execs.
# This shell is started once per daemon and forks a subshell per attempt instead, which
# calls the wrapper's function: the same wrapper, the same files, a third of the CPU.
#
# (1) Job control, so that each attempt's subshell leads its own process group (a cancel
#     signals one job's processes and no other's). A shell turns it on only with a
#     controlling terminal: the opening of the pty the daemon made (this shell leads a new
#     session) makes it this session's; once job control is on, the daemon closes the pty's
#     other end. That hang-up (its SIGHUP ignored here, not in the jobs: a subshell's trap
#     replaces it) leaves the session with no terminal, as a wrapper started on its own
#     has none: a job that opens /dev/tty gets ENXIO, not a stop on a background read.
# (2) Ended subshells are reaped as they end, not at the next launch. SIGCHLD cuts a blocked
#     `read` short; the flag tells that from the end of input.
# (3) The line is `export NAME='value' ...; set -- 'ATTEMPT_DIR' file`, every value quoted by
#     the daemon (a value that cannot be written on one line is started without this
#     runner). The subshell exports them, runs the wrapper in "file" mode, and exits with
#     its status; its stdin and stdout are not this shell's pipes.
# (4) End of input: the daemon stopped (or died). The attempts go on, each in its own group;
#     a new daemon finds them by their handles and pid files, as it finds wrappers started
#     on their own.
# (5) The wrapper's function, gpusched_wrap, defined once: each subshell calls it, with
#     nothing to open or parse (gpusched/wrap.sh, note 7). A wrapper that cannot be read
#     ends this shell before it says "ready": the daemon then starts each wrapper on its own.
