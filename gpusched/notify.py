"""Telling the user while the night runs: a plan's ``notify:`` command, which the daemon runs
when one of the suite's jobs fails for good, when a GPU is taken out of service under one of
its jobs, when jobs end for a disk that filled up or a network that failed (and wait to run
again), when launches start to wait for the machine (a disk nearly full) while it has jobs
queued or running, and when the suite's last job ends. The same news of a suite (a failure
with the same reason, a full disk) is one notice, however many jobs it ended, and is not told
again for :data:`QUIET_S`.

What happened is read from the store's ``events`` (every transition writes one), after a
cursor: whatever moved a job (a reap, a failed launch, a ``cancel`` from another shell) is
seen the same way, and a restarted daemon goes on from where the last one was. The cursor is
saved before a command runs, so a notice is sent at most once (a crash in between loses it
rather than sending it twice). :func:`notices` turns events into notices and touches nothing;
:class:`Notifier` is the daemon's edge that reads, saves and runs.

The command runs in the background with ``sh``, in the suite's workdir, in the environment
of the shell that submitted it, plus ``GPUSCHED_EVENT`` (``failed``, ``gpu_out``,
``disk_full``, ``network``, ``waiting`` or ``done``), ``GPUSCHED_SUITE``, ``GPUSCHED_JOB_ID``
(the job's, for ``failed`` and ``gpu_out``, the first job's for ``disk_full`` and ``network``;
else empty) and ``GPUSCHED_MESSAGE`` (one line). Values reach it as
variables, never pasted into the command text, so a message with quotes in it cannot change
what runs. Its output goes to ``notify.log`` in the state directory, after a line naming the
notice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from msgspec import Struct
from msgspec.structs import replace

from gpusched import proc
from gpusched.disk import LAUNCH_WAIT_FLAG
from gpusched.home import Home
from gpusched.model import Outcome
from gpusched.store import Store

log = logging.getLogger(__name__)

#: Event kinds that can make a notice: a job failed, ended otherwise, a card out of service,
#: a job requeued (news only when the machine ended it: :data:`MACHINE`).
KINDS = ("fail", "done", "cancel", "gpu_out", "requeue")
#: The outcomes of a requeue that a person can mend and would want to hear of: a disk that
#: filled up (every running job dies at its next save), a network that failed.
MACHINE = (Outcome.DISK_FULL.value, Outcome.NETWORK.value)
#: A suite hears of the same news at most once in this long: a failure with the same reason (a
#: missing module fails every job within a minute), a full disk or a failed network (which
#: ends every running job, one after another; the jobs it requeued wait this long to run again).
#: Jobs the same news ended meanwhile are counted in the next such notice ("and 39 more").
QUIET_S = 300.0
#: Where the cursor (the last event looked at) is kept, as a store flag.
CURSOR_FLAG = "notify_cursor"
#: The cursor is saved at least this often when nothing is sent (and always before a send).
SAVE_EVERY_S = 60.0
#: Runs the plan's command: sources the submitting shell's environment ($1), goes to the
#: workdir ($2), exports the notice ($3-$6) and runs the command ($7).
SCRIPT = (
    '[ -r "$1" ] && . "$1"\n'
    'cd "$2" 2>/dev/null || cd "${HOME:-/}" || cd /\n'  # its workdir gone: the notice still goes
    'export GPUSCHED_EVENT="$3" GPUSCHED_SUITE="$4" GPUSCHED_JOB_ID="$5" GPUSCHED_MESSAGE="$6"\n'
    '(eval "$7")\n'  # (in a subshell: an `exit 3` of its own ends it, not this script)
    'rc=$?; [ "$rc" = 0 ] || echo "(the notify command exited $rc)"\n'  # a hook that fails says so
)


class Notice(Struct, frozen=True, kw_only=True):
    event: str  # failed, gpu_out, disk_full, network, waiting or done
    suite: str
    job_id: str  # "" for waiting and done; the first job's for news of several
    message: str
    what: str = ""  # failed, disk_full, network: the reason, told once a QUIET_S for the suite
    more: int = 0  # how many other jobs of the suite it ended

    def counting(self, held: int) -> Notice:
        """This notice, also counting ``held`` more jobs (ended by the same, not told yet)."""
        more = self.more + held
        return replace(self, more=more, message=_said(self.event, self.suite, self.job_id, more, self.what))


def _said(event: str, suite: str, first: str, more: int, what: str) -> str:
    who = f"{first} and {more} more of {suite}" if more else first
    return f"{who} failed: {what}" if event == "failed" else f"{who}: {what}"


def notices(
    events: Sequence[tuple[int, str | None, str, str, str | None]],
    *,
    ended: Callable[[str], bool],
    counts: Callable[[str], dict[str, int]],
) -> list[Notice]:
    """The notices of ``events`` (``(id, job_id, kind, message, outcome)``, in order): the jobs
    that failed, one notice for each suite and reason (the first job, and how many more); each
    card taken out of service under a job; one notice for each suite and outcome of
    :data:`MACHINE` that requeued its jobs (the first job's reason, and how many more); then
    each suite that one of these events ended (``ended``: it has no job queued or running
    now), with its jobs by state."""
    out: list[Notice] = []
    touched: list[str] = []
    news: dict[tuple[str, str, str], list[tuple[str, str]]] = {}  # (event, suite, key) -> (job, what)s
    for _, job_id, kind, message, outcome in events:
        if not job_id:
            continue  # a card found broken with no job on it: no suite to tell
        suite = job_id.split("/", 1)[0]
        if kind == "fail":
            news.setdefault(("failed", suite, message), []).append((job_id, message))
        elif kind == "gpu_out":
            said = f"{message} (under {job_id})"
            out.append(Notice(event="gpu_out", suite=suite, job_id=job_id, message=said))
        elif kind == "requeue" and outcome in MACHINE:  # its reason names the attempt: one key
            news.setdefault((outcome, suite, ""), []).append((job_id, message))
        if suite not in touched:
            touched.append(suite)
    for (event, suite, _), ended_by in news.items():
        (first, what), more = ended_by[0], len({j for j, _ in ended_by}) - 1
        said = _said(event, suite, first, more, what)
        out.append(Notice(event=event, suite=suite, job_id=first, message=said, what=what, more=more))
    for suite in touched:
        if ended(suite):
            c = counts(suite)
            ends = ("succeeded", "failed", "cancelled")
            jobs = ", ".join(f"{n} {state}" for state in ends if (n := c.get(state)))
            out.append(Notice(event="done", suite=suite, job_id="", message=f"{suite} done: {jobs}"))
    return out


class Notifier:
    """The daemon's side: after each tick, :meth:`check` reads the new events, saves the
    cursor and runs the suites' commands for their notices. ``spawn`` starts a command
    (tests pass their own)."""

    def __init__(
        self,
        store: Store,
        home: Home,
        *,
        spawn: Callable[..., Any] = proc.spawn,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store, self.home, self.spawn, self.clock = store, home, spawn, clock
        self.children: list[Any] = []  # commands started and not yet seen to end (then reaped)
        saved = store.flag(CURSOR_FLAG)
        # a queue's first daemon with notices starts from now: what happened before is not news
        self.cursor = int(saved) if saved else store.last_event_id()
        self.saved_at = float("-inf") if not saved else clock()
        self.saved = self.cursor if saved else -1
        self.waiting = store.flag(LAUNCH_WAIT_FLAG) is not None  # launches already waiting: not news
        self.told_at: dict[tuple[str, str, str], float] = {}  # (suite, event, what) -> when last told
        self.held: dict[tuple[str, str, str], int] = {}  # ... -> jobs it ended since, not told yet

    def check(self) -> list[Notice]:
        """Send what happened since the last check; the notices sent."""
        self.children = [c for c in self.children if c.poll() is None]  # no zombie left till the next job
        events = self.store.events_after(self.cursor, KINDS)
        if events:
            self.cursor = events[-1][0]
        found = (
            notices(events, ended=self.store.suite_ended, counts=lambda s: self.store.counts(suites=[s]))
            if events
            else []
        )
        found = [n for n0 in found if (n := self._news(n0)) is not None]
        found += self._waits()
        todo: list[tuple[Notice, tuple[str, str, str | None]]] = []
        targets: dict[str, tuple[str, str, str | None] | None] = {}
        for n in found:
            if n.suite not in targets:
                targets[n.suite] = self.store.notify_target(n.suite)
            if (target := targets[n.suite]) is not None:
                todo.append((n, target))
        if self.cursor != self.saved and (todo or self.clock() - self.saved_at >= SAVE_EVERY_S):
            self.store.set_flag(CURSOR_FLAG, str(self.cursor))  # before a send: at most once
            self.saved, self.saved_at = self.cursor, self.clock()
        for n, target in todo:
            self._run(n, *target)
        return [n for n, _ in todo]

    def _news(self, n: Notice) -> Notice | None:
        """``n``, or None when its suite was told the same within :data:`QUIET_S` (a failure
        with the same reason, a full disk, a failed network): its jobs are then counted in
        the next such notice. Other notices are always news."""
        if n.event != "failed" and n.event not in MACHINE:
            return n
        now = self.clock()
        key = (n.suite, n.event, n.what if n.event == "failed" else "")
        if now - self.told_at.get(key, float("-inf")) < QUIET_S:
            self.held[key] = self.held.get(key, 0) + 1 + n.more
            return None
        self.told_at[key] = now
        held = self.held.pop(key, 0)
        return n.counting(held) if held else n

    def _waits(self) -> list[Notice]:
        """A ``waiting`` notice for each suite with jobs queued or running, once when launches
        start to wait for the machine (a disk low, a pause after a launch failed for want of a
        resource: ``disk.LAUNCH_WAIT_FLAG``, which the scheduler writes), not again until they
        have resumed: the night stalls there until someone frees the disk."""
        why = self.store.flag(LAUNCH_WAIT_FLAG)
        news, self.waiting = why is not None and not self.waiting, why is not None
        if not news:
            return []
        said = f"launches wait: {why}"
        return [
            Notice(event="waiting", suite=suite, job_id="", message=said)
            for suite in sorted(self.store.active_suites())
        ]

    def _run(self, n: Notice, command: str, workdir: str, env_path: str | None) -> None:
        message = " ".join(n.message.split())  # one line, whatever the reason held
        notice = [n.event, n.suite, n.job_id, message]
        argv = ["sh", "-c", SCRIPT, "sh", env_path or "", workdir, *notice, command]
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        try:
            with open(self.home.notify_log, "a", encoding="utf-8") as out:
                out.write(f"{stamp} {n.event} {n.suite}: {message}\n")
                out.flush()
                child = self.spawn(argv, stdout=out, stderr=out)
        except Exception:  # telling the user never stops the scheduling
            log.exception("notify: could not run the command of suite %s for %s", n.suite, n.event)
        else:
            if child is not None:
                self.children.append(child)
