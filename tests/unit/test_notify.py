"""A plan's ``notify:`` command: which events make a notice, that each is sent once (across
daemon restarts too), only for suites whose plan has a command, and that the command gets
the notice in variables, whatever characters the message holds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from msgspec.structs import replace

from gpusched import notify, proc
from gpusched.home import Home
from gpusched.model import GpuPlan, JobSpec
from tests.helpers import retry_until
from tests.unit.test_memory_scheduler import Box, make_suite


class Spawned:
    """A stand-in for ``proc.spawn`` that keeps the notices it was asked to send."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, str, str]] = []

    def __call__(self, argv: list[str], **_: Any) -> None:
        self.sent.append(tuple(argv[6:10]))  # type: ignore[arg-type]


def night(tmp_path: Path, name: str = "E1", command: str | None = "true", n: int = 3) -> Box:
    box = Box(tmp_path, GpuPlan(gpus=(0, 1, 2), slots=(1, 1, 1)), cards="3x24GiB")
    suite = replace(make_suite(tmp_path, n), name=name, notify=command)
    box.submit(replace(suite, jobs=tuple(replace(j, suite=name) for j in suite.jobs)))
    return box


def test_a_failed_job_and_the_suites_end_are_told_once_even_after_a_restart(tmp_path: Path) -> None:
    box = night(tmp_path)
    (tmp_path / "home").mkdir()
    home, spawned = Home(tmp_path / "home"), Spawned()
    notifier = notify.Notifier(box.store, home, spawn=spawned)
    box.tick()
    box.ex.finish(box.ex.token_of("E1/0-qnli"), exit_code=1, output="ValueError: bad 'label' column\n")
    box.ex.finish(box.ex.token_of("E1/1-qnli"), exit_code=0)
    box.tick()
    assert notifier.check() and spawned.sent == [
        ("failed", "E1", "E1/0-qnli", "E1/0-qnli failed: ValueError: bad 'label' column")
    ]
    assert notifier.check() == []  # nothing new
    box.store.request_cancel(["E1/2-qnli"])  # the last one, cancelled from another shell
    box.tick()
    box.tick()  # (stopped by the first, reaped by the second)
    assert [n.event for n in notifier.check()] == ["done"]
    assert spawned.sent[-1] == ("done", "E1", "", "E1 done: 1 succeeded, 1 failed, 1 cancelled")
    again = Spawned()
    assert notify.Notifier(box.store, home, spawn=again).check() == [] and again.sent == []  # a restart
    assert "done E1: E1 done: 1 succeeded, 1 failed, 1 cancelled" in home.notify_log.read_text()


def test_what_came_before_the_first_daemon_is_not_news_and_no_command_no_notice(tmp_path: Path) -> None:
    box = night(tmp_path)
    (tmp_path / "home").mkdir()
    home, spawned = Home(tmp_path / "home"), Spawned()
    box.tick()
    box.ex.finish(box.ex.token_of("E1/0-qnli"), exit_code=1, output="boom\n")
    box.tick()
    notifier = notify.Notifier(box.store, home, spawn=spawned)  # the queue's first, after that failure
    assert notifier.check() == []
    quiet = replace(make_suite(tmp_path, 1, task="rte"), name="E2")  # a plan without notify:
    box.submit(replace(quiet, jobs=(JobSpec(suite="E2", name="0-rte", task="rte"),)))
    for job_id in ("E1/1-qnli", "E1/2-qnli"):
        box.ex.finish(box.ex.token_of(job_id), exit_code=0)
    box.tick()
    box.ex.finish(box.ex.token_of("E2/0-rte"), exit_code=1, output="boom\n")
    box.tick()
    assert [(n.event, n.message) for n in notifier.check()] == [("done", "E1 done: 2 succeeded, 1 failed")]
    assert spawned.sent == [("done", "E1", "", "E1 done: 2 succeeded, 1 failed")]


def test_the_command_gets_the_notice_in_variables_in_the_workdir(tmp_path: Path) -> None:
    """The real ``sh``: quotes, ``$`` and backticks in a message stay text."""
    box = night(tmp_path, command='printf "%s\\n" "$GPUSCHED_MESSAGE" "$(pwd)" > told.txt')
    (tmp_path / "home").mkdir()
    notifier = notify.Notifier(box.store, Home(tmp_path / "home"), spawn=proc.spawn)
    box.tick()
    box.ex.finish(box.ex.token_of("E1/0-qnli"), exit_code=1, output="Error: `rm -rf x` said \"$HOME\" 'no'\n")
    box.tick()
    assert len(notifier.check()) == 1
    told = tmp_path / "told.txt"
    lines = retry_until(lambda: told.exists() and told.read_text().splitlines())
    assert lines == ["E1/0-qnli failed: Error: `rm -rf x` said \"$HOME\" 'no'", str(tmp_path)]
    retry_until(lambda: notifier.check() == [] and not notifier.children)  # ended, and reaped: no zombie


def test_a_command_that_fails_says_so_in_notify_log(tmp_path: Path) -> None:
    """A hook that cannot tell anyone (`notify-send` not installed, a webhook's curl that fails)
    leaves its exit status in notify.log under the notice, beside what it printed: a person
    who heard nothing all night finds out why."""
    box = night(tmp_path, command="echo trying; no-such-notifier-here; exit 3")
    (tmp_path / "home").mkdir()
    home = Home(tmp_path / "home")
    notifier = notify.Notifier(box.store, home, spawn=proc.spawn)
    box.tick()
    box.ex.finish(box.ex.token_of("E1/0-qnli"), exit_code=1, output="boom\n")
    box.tick()
    assert len(notifier.check()) == 1
    retry_until(lambda: notifier.check() == [] and not notifier.children)
    logged = home.notify_log.read_text().splitlines()
    assert logged[0].endswith("failed E1: E1/0-qnli failed: boom") and logged[1] == "trying"
    assert "no-such-notifier-here" in logged[2] and logged[-1] == "(the notify command exited 3)"


def test_a_suite_whose_working_directory_is_gone_is_still_told_so(tmp_path: Path, monkeypatch: Any) -> None:
    """Its jobs wait for the folder, and that is the news: the command runs in the home
    directory instead of not at all (it exited at its `cd`)."""
    work = tmp_path / "proj"
    work.mkdir()
    told = tmp_path / "told.txt"
    box = night(work, command=f'printf "%s\\n" "$GPUSCHED_MESSAGE" "$(pwd)" > {told}', n=5)
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "home").mkdir()
    notifier = notify.Notifier(box.store, Home(tmp_path / "home"), spawn=proc.spawn)
    box.tick()
    work.rename(tmp_path / "proj-moved")
    box.tick()
    assert [n.event for n in notifier.check()] == ["waiting"]
    lines = retry_until(lambda: told.exists() and told.read_text().splitlines())
    assert lines[0].startswith(f"launches wait: the working directory {work} of E1 is gone")
    assert lines[1] == str(tmp_path)
    retry_until(lambda: notifier.check() == [] and not notifier.children)


def test_a_card_out_of_service_under_a_job_is_told_and_one_with_no_job_is_not() -> None:
    events = [
        (7, "E1/3-rte", "gpu_out", "GPU 3 out of service: uncorrectable ECC error encountered", "gpu_fault"),
        (8, None, "gpu_out", "GPU 5 out of service: the driver finds the card gone", None),
        (9, "E1/3-rte", "requeue", "requeued at A elsewhere", "gpu_fault"),  # (the gpu_out says it)
        (10, "E1/4-rte", "requeue", "CUDA out of memory → requeued at tier B", "oom"),  # the ladder: no news
    ]
    told = notify.notices(events, ended=lambda suite: False, counts=lambda suite: {})
    assert told == [
        notify.Notice(
            event="gpu_out",
            suite="E1",
            job_id="E1/3-rte",
            message="GPU 3 out of service: uncorrectable ECC error encountered (under E1/3-rte)",
        )
    ]


def test_launches_that_start_to_wait_for_the_machine_are_told_once_a_pause(tmp_path: Path) -> None:
    """A disk filling up stalls the night: launches wait (the scheduler's ``launch_wait``
    flag), and each suite with jobs queued or running hears of it once, not at every tick it lasts."""
    from gpusched.disk import LAUNCH_WAIT_FLAG

    box = night(tmp_path, n=5)  # 3 run, 2 queued
    (tmp_path / "home").mkdir()
    spawned = Spawned()
    notifier = notify.Notifier(box.store, Home(tmp_path / "home"), spawn=spawned)
    box.tick()
    low = "the disk of /data holds 0.4 GiB free (under 1.0 GiB): free some space"
    box.store.set_flag(LAUNCH_WAIT_FLAG, low)
    assert [(n.event, n.suite, n.message) for n in notifier.check()] == [
        ("waiting", "E1", f"launches wait: {low}")
    ]
    box.store.set_flag(LAUNCH_WAIT_FLAG, low.replace("0.4", "0.3"))
    assert notifier.check() == []  # the same pause
    box.store.set_flag(LAUNCH_WAIT_FLAG, None)
    assert notifier.check() == []  # resumed: no news
    box.store.set_flag(LAUNCH_WAIT_FLAG, low)
    assert [n.event for n in notifier.check()] == ["waiting"]  # a new pause
    assert [s[0] for s in spawned.sent] == ["waiting", "waiting"]


def test_a_full_disk_is_told_once_a_wait_however_many_jobs_it_ended(tmp_path: Path) -> None:
    """Checkpoints fill the disk at 2 a.m.: each running job dies at its next save and waits 5
    minutes to run again. The suite hears of it at once, in one notice naming the first job, its
    reason and how many more, and not again while those jobs wait; a failed network is told
    apart, and an OOM walking down the ladder stays no news."""
    from gpusched.outcome import MACHINE_WAIT_S

    box = night(tmp_path, n=3)
    (tmp_path / "home").mkdir()
    spawned, clock = Spawned(), [100.0]
    notifier = notify.Notifier(box.store, Home(tmp_path / "home"), spawn=spawned, clock=lambda: clock[0])
    box.tick()
    full = "OSError: [Errno 28] No space left on device: '/data/ckpt/step-900'\n"
    for job_id in ("E1/0-qnli", "E1/1-qnli"):
        box.ex.finish(box.ex.token_of(job_id), exit_code=1, output=full)
    box.ex.finish(
        box.ex.token_of("E1/2-qnli"), exit_code=1, output="torch.OutOfMemoryError: CUDA out of memory.\n"
    )
    box.tick()
    told = notifier.check()
    assert [(n.event, n.job_id) for n in told] == [("disk_full", "E1/0-qnli")]
    assert told[0].message.startswith(
        "E1/0-qnli and 1 more of E1: the disk filled up, requeued at tier A in 300 s"
    )
    assert told[0].message.endswith("No space left on device: '/data/ckpt/step-900'")
    assert spawned.sent == [("disk_full", "E1", "E1/0-qnli", told[0].message)]

    box.ex.finish(box.ex.token_of("E1/2-qnli"), exit_code=1, output=full)  # (its tier-B run)
    box.tick()
    assert notifier.check() == []  # the same full disk, within the wait
    clock[0] += MACHINE_WAIT_S
    box.store.retry_many(
        {"E1/0-qnli": None}, now=box.now
    )  # the disk freed, the job run again at once: it fills again
    box.tick()
    box.ex.finish(box.ex.token_of("E1/0-qnli"), exit_code=1, output=full)
    box.tick()
    told = notifier.check()  # with the job it ended while quiet: E1/2-qnli
    assert [(n.event, n.message.split(":")[0]) for n in told] == [("disk_full", "E1/0-qnli and 1 more of E1")]

    box.store.retry_many({"E1/1-qnli": None}, now=box.now)
    box.tick()
    box.ex.finish(
        box.ex.token_of("E1/1-qnli"),
        exit_code=1,
        output="requests.exceptions.ConnectionError: "
        "HTTPSConnectionPool(host='huggingface.co', port=443): Max retries exceeded\n",
    )
    box.tick()
    assert [n.event for n in notifier.check()] == ["network"]  # another news, however soon


def test_the_same_failure_of_many_jobs_is_one_notice_not_one_a_job(tmp_path: Path) -> None:
    """A missing module fails every job of the suite within a minute: a phone buzzing forty
    times says no more than once. Jobs failing for the same reason are one notice (the first
    job, and how many more), then none for that reason for QUIET_S, those jobs counted in the
    next; another reason is news at once, and so is the suite's end."""
    box = night(tmp_path, n=7)  # 3 run, 4 queued
    (tmp_path / "home").mkdir()
    spawned, clock = Spawned(), [100.0]
    notifier = notify.Notifier(box.store, Home(tmp_path / "home"), spawn=spawned, clock=lambda: clock[0])
    box.tick()
    missing = "ModuleNotFoundError: No module named 'peft'\n"
    for i in range(3):
        box.ex.finish(box.ex.token_of(f"E1/{i}-qnli"), exit_code=1, output=missing)
    box.tick()
    assert [(n.event, n.job_id, n.message) for n in notifier.check()] == [
        (
            "failed",
            "E1/0-qnli",
            "E1/0-qnli and 2 more of E1 failed: ModuleNotFoundError: No module named 'peft'",
        )
    ]
    for i in (3, 4):
        box.ex.finish(box.ex.token_of(f"E1/{i}-qnli"), exit_code=1, output=missing)
    box.ex.finish(box.ex.token_of("E1/5-qnli"), exit_code=1, output="ValueError: bad 'label' column\n")
    box.tick()
    assert [n.message for n in notifier.check()] == ["E1/5-qnli failed: ValueError: bad 'label' column"]
    clock[0] += notify.QUIET_S
    box.ex.finish(box.ex.token_of("E1/6-qnli"), exit_code=1, output=missing)
    box.tick()
    assert [(n.event, n.message) for n in notifier.check()] == [
        ("failed", "E1/6-qnli and 2 more of E1 failed: ModuleNotFoundError: No module named 'peft'"),
        ("done", "E1 done: 7 failed"),
    ]
    assert len(spawned.sent) == 4  # for seven failed jobs, and the end
