"""The subprocess backend's runner (gpusched/runner.sh): one long-lived shell that forks each
attempt's wrapper. What it must keep of a wrapper started on its own: each attempt leads its
own process group, with no terminal; it outlives the daemon; nothing is left a zombie. And
what it must do when it cannot be had or dies: start wrappers on their own, and never run an
attempt twice. Real shells and processes; nothing sleeps a fixed time."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from gpusched import proc
from gpusched.attempt import AttemptPaths
from gpusched.executors import WRAPPER, Handle, LaunchUncertain
from gpusched.executors import subprocess as sub
from gpusched.executors.subprocess import SubprocessExecutor
from gpusched.home import Home
from tests.contract.test_executors import Bench, exited
from tests.helpers import retry_until

GATED = 'echo started > "@DIR@/started"\nwhile [ ! -e "@DIR@/gate" ]; do sleep 0.02; done\necho done\n'
WITH_CHILD = (  # started, with a child in the background that waits for the gate too
    'echo started > "@DIR@/started"\n'
    'sh -c \'echo $$ > "$0/child.pid"; while [ ! -e "$0/gate" ]; do sleep 0.02; done\' "@DIR@" &\n'
    "wait\n"
)


class Runs(Bench):
    """The executor contract's bench over a subprocess executor (``kw``: its options), its
    jobs named s/j1, s/j2... (killed at teardown)."""

    def __init__(self, root: Path, **kw: bool) -> None:
        home = Home(root / "home")
        make = lambda: SubprocessExecutor(home, **kw)  # noqa: E731
        super().__init__(kind="subprocess", home=home, root=root, make=make, ex=make())

    @property
    def plain(self) -> SubprocessExecutor:
        assert isinstance(self.ex, SubprocessExecutor)
        return self.ex

    def launch(self, script: str, env: dict[str, str] | None = None) -> tuple[Handle, AttemptPaths]:  # type: ignore[override]
        h, paths, _ = super().launch(script, suite="s", job_name=f"j{self.n + 1}", env=env)
        return h, paths

    def runner_pid(self) -> int:
        assert self.plain._runner is not None
        return self.plain._runner.child.pid


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[Runs]:
    r = Runs(tmp_path)
    yield r
    for h in r.handles:
        r.ex.terminate(h, force=True)
    r.plain.close()


def gone(pid: int) -> bool:
    """No process, not even a zombie, has this pid: its parent reaped it."""
    try:
        psutil.Process(pid)
    except psutil.NoSuchProcess:
        return True
    return False


def wrapper_on_its_own(h: Handle) -> bool:
    return psutil.Process(h["pid"]).cmdline()[:2] == ["sh", str(WRAPPER)]


@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_each_attempt_leads_its_own_group_without_a_terminal_and_a_cancel_stops_only_it(
    runs: Runs, monkeypatch: pytest.MonkeyPatch, shell: str
) -> None:
    """Also where ``sh`` is bash (Fedora, Arch): its job control and its SIGCHLD trap too."""
    monkeypatch.setattr(sub, "SH", shell)
    (h1, p1), (h2, p2) = runs.launch(GATED), runs.launch(WITH_CHILD)
    for h, p in ((h1, p1), (h2, p2)):
        retry_until((p.dir / "started").exists)
        pid = h["pid"]
        assert os.getpgid(pid) == pid  # (what a cancel signals)
        assert os.getsid(pid) == runs.runner_pid() != pid  # forked by the runner, not exec'd
        assert psutil.Process(pid).terminal() is None
        assert p.read_pid() is not None and p.read_pid()[0] == pid  # type: ignore[index]
    assert psutil.Process(runs.runner_pid()).cmdline()[0] == shell
    child = int(retry_until(lambda: (p2.dir / "child.pid").exists() and (p2.dir / "child.pid").read_text()))
    assert os.getpgid(child) == h2["pid"]  # a job's own `&` stays in its group (no job control there)
    runs.ex.terminate(h1)
    assert exited(p1)["signal"] == 15
    assert runs.ex.alive(h2) and not (p2.dir / "exit.json").exists()
    retry_until(lambda: gone(h1["pid"]))  # reaped by the runner
    (p2.dir / "gate").touch()
    rec = exited(p2)
    assert rec["exit_code"] == 0 and rec["wrapper_pid"] == h2["pid"]


@pytest.mark.parametrize("use_runner", [True, False], ids=["runner", "on its own"])
def test_a_job_that_opens_the_terminal_is_told_there_is_none(tmp_path: Path, use_runner: bool) -> None:
    """The runner had a terminal for an instant (job control needs one) and hung it up: a job
    that opens /dev/tty must fail at once, as on its own, not stop on a background read."""
    runs = Runs(tmp_path, runner=use_runner)
    try:
        _, paths = runs.launch(
            'if read -r line </dev/tty; then echo "read $line"; else echo no terminal; fi\n'
        )
        assert exited(paths)["exit_code"] == 0
        assert "no terminal" in paths.output.read_text()
    finally:
        runs.plain.close()


def test_an_ended_wrapper_is_reaped_while_the_runner_waits_for_the_next_line(runs: Runs) -> None:
    h, paths = runs.launch("exit 3\n")
    assert exited(paths)["exit_code"] == 3
    retry_until(lambda: gone(h["pid"]))  # no `<defunct>` left until the next launch
    _, paths = runs.launch("echo again\n")  # and the runner still reads
    assert exited(paths)["exit_code"] == 0


def test_the_runner_ends_with_the_daemon_and_its_jobs_run_on(runs: Runs) -> None:
    h, paths = runs.launch(GATED)
    retry_until((paths.dir / "started").exists)
    runner = runs.runner_pid()
    runs.plain.close()  # as the daemon's end closes the runner's input
    retry_until(lambda: not proc.is_alive(runner, None))
    assert runs.ex.alive(h)
    (paths.dir / "gate").touch()
    assert exited(paths)["exit_code"] == 0
    assert "done" in paths.output.read_text()


def test_a_runner_that_died_is_replaced_at_the_next_launch(
    runs: Runs, caplog: pytest.LogCaptureFixture
) -> None:
    _, paths = runs.launch("exit 0\n")
    exited(paths)
    first = runs.runner_pid()
    os.kill(first, signal.SIGKILL)
    retry_until(lambda: not proc.is_alive(first, None))
    with caplog.at_level(logging.WARNING):
        h, paths = runs.launch(GATED)
    retry_until((paths.dir / "started").exists)
    assert runs.runner_pid() != first and os.getsid(h["pid"]) == runs.runner_pid()
    (paths.dir / "gate").touch()
    assert exited(paths)["exit_code"] == 0
    assert "the runner is gone" in caplog.text


def test_a_runner_that_dies_holding_a_launch_makes_it_uncertain_not_failed(
    runs: Runs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It may have forked the wrapper before it died: the launch is neither a handle nor a
    failure (a failure is requeued: the job could run twice). The scheduler leaves it
    ``launching`` for its reconcile (see test_crash_safety)."""
    dies = tmp_path / "dies.sh"
    dies.write_text("echo ready\nread -r line\nexit 0\n")
    monkeypatch.setattr(sub, "RUNNER", dies)
    with pytest.raises(LaunchUncertain, match="s/j1: the runner ended"):
        runs.launch("exit 0\n")
    monkeypatch.undo()
    _, paths = runs.launch("exit 0\n")  # the next launch gets a real runner again
    assert exited(paths)["exit_code"] == 0


def test_a_runner_that_reads_no_more_does_not_hang_the_daemon(
    runs: Runs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A runner that stopped reading (stopped with SIGSTOP, say) fills its pipe; the launch
    gives up on it after ANSWER_S and starts the wrapper on its own, once."""
    stuck, pids = tmp_path / "stuck.sh", tmp_path / "stuck.pids"
    stuck.write_text(f"echo $$ >>{pids}\necho ready\nexec sleep 30\n")
    monkeypatch.setattr(sub, "RUNNER", stuck)
    monkeypatch.setattr(sub, "ANSWER_S", 0.2)
    big = "x" * 100_000  # a line longer than a pipe holds (64 KiB), an argument no longer than exec takes
    try:
        h, paths = runs.launch('echo "${#GS_BIG}"\n' + GATED, env={"GS_BIG": big})
        assert len(pids.read_text().split()) == 2  # a second runner was tried, then none
        retry_until((paths.dir / "started").exists)
        assert wrapper_on_its_own(h)
        (paths.dir / "gate").touch()
        assert exited(paths)["exit_code"] == 0
        assert f"{len(big)}" in paths.output.read_text()
    finally:
        for pid in pids.read_text().split():
            proc.signal_pid(int(pid), signal.SIGKILL)


def test_values_that_span_lines_start_the_wrapper_on_its_own(runs: Runs) -> None:
    _, paths = runs.launch('printf "%s|" "$GS_TWO_LINES"\n', env={"GS_TWO_LINES": "one\ntwo"})
    retry_until(lambda: paths.read_pid() is not None)
    assert runs.plain._runner is None  # nothing went through a runner
    assert exited(paths)["exit_code"] == 0
    assert "one\ntwo|" in paths.output.read_text()
    odd = "a b;$HOME 'q' \"dq\" {x} \\n"
    h, paths = runs.launch('printf "%s|" "$GS_ODD"\n' + GATED, env={"GS_ODD": odd})
    retry_until((paths.dir / "started").exists)
    assert not wrapper_on_its_own(h)  # quotes, spaces and a backslash travel on the runner's line
    (paths.dir / "gate").touch()
    assert exited(paths)["exit_code"] == 0
    assert f"{odd}|" in paths.output.read_text()


def test_without_a_pty_wrappers_start_on_their_own(
    runs: Runs, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    tried = []

    def no_pty() -> tuple[int, int]:
        tried.append(1)
        raise OSError(2, "out of pty devices")

    monkeypatch.setattr(os, "openpty", no_pty)
    with caplog.at_level(logging.WARNING):
        h1, p1 = runs.launch(GATED)
        h2, p2 = runs.launch(GATED)
    assert "no runner (" in caplog.text and "out of pty devices" in caplog.text
    assert len(tried) == 1  # not tried again at every launch
    for h, p in ((h1, p1), (h2, p2)):
        retry_until((p.dir / "started").exists)
        assert wrapper_on_its_own(h) and os.getpgid(h["pid"]) == h["pid"]
        (p.dir / "gate").touch()
        assert exited(p)["exit_code"] == 0


@pytest.mark.parametrize(
    ("raw", "wanted"), [("0", False), (" off ", False), ("1", True), ("yes", True), ("", True)]
)
def test_gpusched_runner_reads_1_or_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, raw: str, wanted: bool
) -> None:
    monkeypatch.setenv("GPUSCHED_RUNNER", raw)
    assert SubprocessExecutor(Home(tmp_path / "home"))._use_runner is wanted
    if raw.strip():
        assert sub.parse_runner(raw) is wanted
    with pytest.raises(ValueError):
        sub.parse_runner("fast")


def test_gpusched_runner_0_starts_each_wrapper_on_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUSCHED_RUNNER", "0")
    runs = Runs(tmp_path)
    try:
        h, paths = runs.launch(GATED)
        retry_until((paths.dir / "started").exists)
        assert wrapper_on_its_own(h) and runs.plain._runner is None
        (paths.dir / "gate").touch()
        exited(paths)
    finally:
        runs.plain.close()
