#!/bin/sh
# gpusched pane loop: sh pane.sh FIFO ANSWERS WRAPPER, the process of a tmux pane that runs one
# job after another (GPUSCHED_TMUX_PANES=auto or reuse; gpusched/executors/tmux_reuse.py).
# The executor writes one line per attempt into FIFO; this shell answers the pid of the
# wrapper it started on ANSWERS. Notes at the end, after the last command.
fifo=$1
answers=$2
wrap=$3
set -- --define
. "$wrap" || exit 1 # (8)
exec 7<>"$fifo" # (1)
set -m
case $- in
*m*) ;;
*) echo "gpusched: no job control in this pane" && exit 1 ;;
esac
while read -r tok until line <&7; do
    [ "$tok" = - ] && exit "$until" # (9)
    read -r up _ </proc/uptime # (5)
    if [ "${up%.*}${up#*.}" -gt "$until" ]; then
        printf '[gpusched] a launch given up on was not run (%s)\n' "$tok"
        continue
    fi
    printf '\033[0m\033[H\033[2J' # (2)
    hup=
    trap 'hup=1' HUP # (10)
    (eval "$line" && gpusched_wrap "$@") 7<&- & # (3)
    printf '%s %s\n' "$tok" "$!" 1<>"$answers"
    fg >/dev/null # (4)
    while kill -0 "$!" 2>/dev/null; do # (6)
        printf '\n[gpusched] a Ctrl-Z does not pause a job: it goes on (gpusched cancel stops it)\n'
        fg >/dev/null 2>&1
        [ $? -eq 2 ] && break
    done
    kill -s HUP -- "-$!" 2>/dev/null # (7)
    trap - HUP
    [ -z "$hup" ] || exit 0 # (10)
done
exit 0

# ---------------------------------------------------------------------------------------------
# Nothing below is read by sh.
#
# Why it exists: every tmux pane costs its server a fork, a pseudo-terminal and a utmp record
# (the setgid utempter helper, waited for), about 3 ms a job on a 2-core VM, serially in the
# server. A pane that runs the next job once its last one has ended costs that once per slot
# of the night, not once per job.
#
# (1) Read-write, so that the open never waits for a writer and `read` never sees the end of
#     input while the executor is away (a restarted daemon opens the same FIFO again, by the
#     path in the pane's @gpusched_fifo option).
# (2) A fresh screen for each job (its attributes reset, the screen cleared; what the last job
#     showed scrolls into the pane's history), as a window of its own would give it.
# (3) The line is `export NAME='value' ...; set -- 'ATTEMPT_DIR' tee`, every value quoted by the
#     executor. The subshell, in the background at first, leads a process group of its own
#     (job control), which a cancel signals without touching this shell; it runs the
#     wrapper in "tee" mode, which shows the job's output here and appends it to output.log.
#     The FIFO is not passed on to the job.
# (4) The job is brought to the foreground: the terminal's keys reach its group (a Ctrl-C
#     stops the job, not this loop), and this shell waits for it. When the pane is closed,
#     the job runs on, as in a window of its own (10).
# (5) Each line carries the time after which it must not run: the clock since boot in
#     hundredths of a second (/proc/uptime, read by a builtin: no `date` exec a job). A line
#     this loop reaches late (it was busy, or stopped) is one the executor has given up
#     waiting for, and the scheduler may have requeued its attempt as never started: run now,
#     it would run twice.
# (6) `fg` also returns when the job stops (a Ctrl-Z in the pane): it is sent on again, as tmux
#     does with a pane's own process, so that no job sits stopped all night on its GPU with
#     nothing to resume it. The wrapper still being there is what tells a stop from an end
#     (once ended, `fg` has reaped it); a `fg` that finds no job (2) ends the loop whatever
#     the pid now names.
# (7) What is left of the job's group (a helper started with `&`) is hung up once the wrapper
#     has exited, as the kernel does when a window's wrapper, its terminal's session leader,
#     exits: it does not run on into the next job's screen. The wrapper's tee ignores it.
# (8) The wrapper's function, gpusched_wrap, defined once for every job of the pane
#     (gpusched/wrap.sh, note 7).
# (9) The executor's "-" line: the last job stays on screen (it did not succeed, or with
#     `auto` it ran for long), so this pane runs no more and keeps it there, dead
#     (remain-on-exit), as a window of its own would; the loop exits with the job's code (the
#     line's second field), which tmux shows as the wrapper's.
# (10) A closed pane or a killed tmux server hangs up the terminal, which the kernel signals to
#     this shell alone, as the session's leader; had it died of that, its exit would hang up
#     the job's group, the terminal's foreground (a window of its own's wrapper, the leader
#     there, traps it). So while a job runs a hang-up is trapped, and sh keeps it until the job
#     has ended (it does not interrupt `fg`): the job runs on to its exit record, as in a window
#     of its own, and this loop then ends, its terminal gone. Between jobs it ends at once.
