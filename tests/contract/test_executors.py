"""One contract, two real executors: every test in the first part runs against both the tmux
executor (a real tmux server on a private socket, killed at teardown) and the detached
subprocess executor, with real wrappers (gpusched/wrap.sh) and real processes. The second
part holds what only tmux promises (panes, windows, the socket), then the pure builders.

Jobs that must keep running wait for a file to appear (the "gate"), never for time; the
tests poll with ``retry_until`` and never sleep a fixed amount.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import stat
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from gpusched import proc, procfs
from gpusched.attempt import AttemptPaths
from gpusched.executors import WRAPPER, Executor, Handle, LaunchRequest
from gpusched.executors import tmux as tmux_mod
from gpusched.executors.subprocess import SubprocessExecutor
from gpusched.executors.tmux import (
    TmuxExecutor,
    attach_env,
    escape,
    launch_argv,
    parse_ids,
    session_name,
)
from gpusched.executors.tmux_control import ControlClient
from gpusched.executors.tmux_reuse import TmuxReuseExecutor
from gpusched.home import Home, this_host
from tests.helpers import retry_until

HAVE_TMUX = shutil.which("tmux") is not None
needs_tmux = pytest.mark.skipif(not HAVE_TMUX, reason="tmux is not installed")
# "subprocess" starts each wrapper through its runner, "subprocess-spawn" on its own (the
# path taken where no runner can be had, and by GPUSCHED_RUNNER=0)
# "tmux-reuse": panes that run one job after another (GPUSCHED_TMUX_PANES=reuse)
BACKENDS = [
    "subprocess",
    "subprocess-spawn",
    pytest.param("tmux", marks=needs_tmux),
    pytest.param("tmux-reuse", marks=needs_tmux),
]

# Job scripts (the attempt's launch.sh); @DIR@ becomes the attempt directory.
EXIT3 = "echo hi\nexit 3\n"
OK = "echo hi\n"
GATED = 'echo started > "@DIR@/started"\nwhile [ ! -e "@DIR@/gate" ]; do sleep 0.02; done\necho done\n'
WITH_CHILD = (
    'sh -c \'echo $$ > "$0/child.pid"; while [ ! -e "$0/gate" ]; do sleep 0.02; done\' "@DIR@" &\n'
    'while [ ! -e "@DIR@/child.pid" ]; do sleep 0.02; done\n'
    "wait\n"
)
# (and SIGHUP: the pty's hangup reaches a tmux pane's group once the wrapper, its session
# leader, has exited)
CHILD_IGNORES_TERM = (
    'sh -c \'trap "" TERM HUP; echo $$ > "$0/child.pid"; '
    'while [ ! -e "$0/gate" ]; do sleep 0.02; done\' "@DIR@" &\n'
    'while [ ! -e "@DIR@/child.pid" ]; do sleep 0.02; done\n'
    "wait\n"
)

# a helper that leaves the job's process group (and session) and lets go of its output, as a
# daemonising one does
LEAVES_GROUP = (
    'setsid sh -c \'echo $$ > "$0/child.pid"; while [ ! -e "$0/gate" ]; do sleep 0.02; done\' "@DIR@"'
    " </dev/null >/dev/null 2>&1 &\n"
    'while [ ! -e "@DIR@/child.pid" ]; do sleep 0.02; done\n'
    "wait\n"
)


@dataclass
class Bench:
    """One executor under test, its private home, and every attempt it launched."""

    kind: str
    home: Home
    root: Path
    make: Callable[[], Executor]
    ex: Executor
    handles: list[Handle] = field(default_factory=list)
    n: int = 0

    def request(
        self,
        script: str,
        *,
        suite: str = "s1",
        job_name: str | None = None,
        token: str | None = None,
        env: dict[str, str] | None = None,
        workdir: Path | None = None,
    ) -> tuple[LaunchRequest, AttemptPaths]:
        self.n += 1
        name = job_name or f"job{self.n}"
        paths = AttemptPaths(self.root / "logs" / f"{self.n}" / name / "1-A")
        paths.dir.mkdir(parents=True)
        paths.launch.write_text(script.replace("@DIR@", str(paths.dir)))
        req = LaunchRequest(
            job_id=f"{suite}/{name}",
            suite=suite,
            job_name=name,
            token=token or f"tok{self.n}-{uuid.uuid4().hex[:12]}",  # unique: cancel finds processes by it
            attempt_dir=paths.dir,
            workdir=workdir or self.root,
            env=env or {},
        )
        return req, paths

    def launch(self, script: str, **kw: object) -> tuple[Handle, AttemptPaths, LaunchRequest]:
        req, paths = self.request(script, **kw)  # type: ignore[arg-type]
        handle = self.ex.launch(req)
        self.handles.append(handle)
        return handle, paths, req

    @property
    def tx(self) -> TmuxExecutor:
        assert isinstance(self.ex, TmuxExecutor)
        return self.ex

    def tmux(self, *args: str) -> str:
        return proc.run(["tmux", "-S", str(self.home.tmux_socket), *args]).stdout


def _make(kind: str, home: Home) -> Callable[[], Executor]:
    if kind == "tmux":
        return lambda: TmuxExecutor(home)
    if kind == "tmux-reuse":
        return lambda: TmuxReuseExecutor(home)
    return lambda: SubprocessExecutor(home, runner=kind == "subprocess")


@pytest.fixture(params=BACKENDS)
def bench(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bench]:
    # a short root: a tmux socket path may not exceed 107 bytes
    root = tmp_path_factory.mktemp("ex")
    home = Home(root / "home")
    make = _make(request.param, home)
    b = Bench(kind=request.param, home=home, root=root, make=make, ex=make())
    yield b
    for h in b.handles:
        b.ex.terminate(h, force=True)
    if request.param.startswith("tmux"):
        proc.run(["tmux", "-S", str(home.tmux_socket), "kill-server"], check=False)


def _tmux_bench(kind: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bench]:
    """A bench of one tmux executor (``kind``), its server killed afterwards."""
    if not HAVE_TMUX:
        pytest.skip("tmux is not installed")
    root = tmp_path_factory.mktemp("tx")
    home = Home(root / "home")
    make = _make(kind, home)
    b = Bench(kind=kind, home=home, root=root, make=make, ex=make())
    yield b
    for h in b.handles:
        b.ex.terminate(h, force=True)
    proc.run(["tmux", "-S", str(home.tmux_socket), "kill-server"], check=False)


@pytest.fixture
def tmux_bench(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bench]:
    yield from _tmux_bench("tmux", tmp_path_factory)


@pytest.fixture(params=["tmux", "tmux-reuse"])
def pane_bench(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bench]:
    """What a job in a pane sees, in a window of its own and in a reused pane alike."""
    yield from _tmux_bench(request.param, tmp_path_factory)


def exited(paths: AttemptPaths) -> dict[str, object]:
    """exit.json once the wrapper has written it (polled: it is one short write, so a reader
    may see it created but still empty)."""
    return retry_until(lambda: _parsed(paths.exit))


def _parsed(path: Path) -> dict[str, object] | None:
    try:
        return json.loads(path.read_text())  # type: ignore[no-any-return]
    except (OSError, ValueError):
        return None


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def child_pid(paths: AttemptPaths) -> int:
    """The pid the job's background child wrote, once it has written it."""
    f = paths.dir / "child.pid"
    return int(retry_until(lambda: f.exists() and f.read_text().strip()))


# ====================================================================== the shared contract


def test_exit_code_output_and_pid_file(bench: Bench) -> None:
    h, paths, _ = bench.launch(EXIT3)
    rec = exited(paths)
    assert rec["exit_code"] == 3 and rec["signal"] is None
    assert "hi" in paths.output.read_text()
    pid = paths.read_pid()
    assert pid is not None and pid[0] == h["pid"]  # the handle names the wrapper itself
    assert abs(pid[1] - h["pid_started_at"]) < proc.SAME_START_S
    retry_until(lambda: not bench.ex.alive(h))


def test_alive_while_running_false_after(bench: Bench) -> None:
    h, paths, _ = bench.launch(GATED)
    retry_until((paths.dir / "started").exists)
    assert bench.ex.alive(h)
    (paths.dir / "gate").touch()
    assert exited(paths)["exit_code"] == 0
    retry_until(lambda: not bench.ex.alive(h))
    assert "done" in paths.output.read_text()


def test_terminate_stops_the_whole_group_and_records_signal_15(bench: Bench) -> None:
    h, paths, _ = bench.launch(WITH_CHILD)
    child = child_pid(paths)
    assert running(child)
    bench.ex.terminate(h)
    assert exited(paths)["signal"] == 15
    retry_until(lambda: not running(child))
    retry_until(lambda: not bench.ex.alive(h))


def test_force_kills_a_child_that_ignores_sigterm(bench: Bench) -> None:
    h, paths, _ = bench.launch(CHILD_IGNORES_TERM)
    child = child_pid(paths)
    bench.ex.terminate(h)
    assert exited(paths)["signal"] == 15  # the wrapper and the job's shell are gone...
    retry_until(lambda: not proc.is_alive(h["pid"], h["pid_started_at"]))
    assert running(child)  # ...but the child ignored SIGTERM and still holds the group
    assert bench.ex.alive(h)
    bench.ex.terminate(h, force=True)
    retry_until(lambda: not running(child))
    retry_until(lambda: not bench.ex.alive(h))


# a trainer's way with SIGTERM: say so, save a checkpoint (a moment), say so again, exit
SAVES_ON_TERM = (
    'sh -c \'trap "echo caught SIGTERM, saving; sleep 0.3; echo ok > $0/checkpoint; echo saved; exit 143"'
    " TERM\n"
    'echo started > "$0/started"; while [ ! -e "$0/gate" ]; do sleep 0.02; done\' "@DIR@"\n'
)


def test_a_cancelled_job_finishes_saving_and_its_last_words_are_logged(bench: Bench) -> None:
    """A cancel (or a limit) sends SIGTERM to the job's whole group, and a trainer saves a
    checkpoint as it stops, which the next attempt resumes from. In a tmux pane the tee that
    carries the job's output to the log and the pane was stopped with the job: the trainer's
    "saving" line met a broken pipe and killed it before it saved, and the wrapper's exit
    (it leads the pane's terminal session) sent what was left a SIGHUP. And on both backends
    exit.json came at once, while the trainer still saved: it now says the job ended once it
    has (a daemon not stopping the job itself would free the slot, and the GPU's next job
    start beside a process still holding memory)."""
    h, paths, _ = bench.launch(SAVES_ON_TERM)
    retry_until((paths.dir / "started").exists)
    bench.ex.terminate(h)
    assert exited(paths)["signal"] == 15
    assert (paths.dir / "checkpoint").read_text() == "ok\n"  # (saved before exit.json)
    retry_until(lambda: not bench.ex.alive(h))
    log = paths.output.read_text()
    assert "caught SIGTERM, saving" in log and "saved" in log


def test_a_cancelled_job_that_was_stopped_wakes_and_saves(bench: Bench) -> None:
    """A job stopped by a ``kill -STOP`` (or a Ctrl-Z in a reused pane that did not go on at
    once) keeps a SIGTERM pending: without a SIGCONT it would save nothing and end only at
    the grace's SIGKILL. ``status`` finds it suspended; a cancel wakes it, and it stops as it
    would have running. (The
    wrapper is left running: tmux goes on with a pane's process that stops, and its group.)"""
    h, paths, _ = bench.launch(SAVES_ON_TERM)
    retry_until((paths.dir / "started").exists)
    job = [p for p in proc.group_members(h["pid"]) if p != h["pid"]]
    assert job
    for p in job:
        proc.signal_pid(p, signal.SIGSTOP)

    def state(pid: int) -> str:  # T: stopped; Z: ended (gone: as good as ended)
        return (proc._stat(pid) or ("Z",))[0]

    # The job's loop runs a `sleep 0.02` now and then: one the list caught may end before its
    # stop and stay a zombie (its shell, stopped, reaps it no more). The rest stop.
    retry_until(lambda: all(state(p) in ("T", "Z") for p in job))
    job = [p for p in job if state(p) == "T"]
    assert job  # (its shell at least)
    # what `status` shows as suspended: the handle names this machine and the job's group
    assert h["host"] == this_host()
    stopped = procfs.stopped_in_groups({h["pid"]: h["pid_started_at"]})
    assert {pid for pid, _ in stopped[h["pid"]]} == set(job)
    bench.ex.terminate(h)
    assert exited(paths)["signal"] == 15
    assert (paths.dir / "checkpoint").read_text() == "ok\n"
    retry_until(lambda: not bench.ex.alive(h))


def test_terminate_reaches_a_process_that_left_the_group(bench: Bench) -> None:
    """A job's helper that calls setsid (or daemonises) is out of the job's process group, so
    a group signal misses it; it still carries the attempt's token, and cancel finds it."""
    h, paths, _ = bench.launch(LEAVES_GROUP)
    child = child_pid(paths)
    assert os.getpgid(child) != h["pid"]  # it did leave
    bench.ex.terminate(h)
    retry_until(lambda: not running(child))
    retry_until(lambda: not bench.ex.alive(h))


def test_an_attempt_lives_while_a_process_that_left_its_group_runs(bench: Bench) -> None:
    """The wrapper and its group may be gone while the job's detached helper still runs (and
    may hold GPU memory): the attempt counts as alive until that is gone too."""
    h, paths, _ = bench.launch(LEAVES_GROUP.replace("wait\n", ""))
    child = child_pid(paths)
    exited(paths)
    retry_until(lambda: not proc.group_alive(h["pid"], h["pid_started_at"]))
    assert running(child) and bench.ex.alive(h)
    (paths.dir / "gate").touch()
    retry_until(lambda: not bench.ex.alive(h))


def test_job_outlives_its_executor_and_is_rediscovered(bench: Bench) -> None:
    h, paths, req = bench.launch(GATED)
    retry_until((paths.dir / "started").exists)
    bench.ex = bench.make()  # the daemon restarted: a new executor that launched nothing
    found = bench.ex.discover()
    if bench.kind == "subprocess":  # a runner's wrapper: found by its pid file, as reconcile does
        assert req.token not in found
        pid = paths.read_pid()
        assert pid is not None
        again = {"pid": pid[0], "pid_started_at": pid[1], "token": req.token}
    else:
        again = found[req.token]
    assert again["pid"] == h["pid"] and bench.ex.alive(again)
    assert not again.get("dead", False)
    (paths.dir / "gate").touch()
    assert exited(paths)["exit_code"] == 0
    retry_until(lambda: not bench.ex.alive(again))
    after = bench.ex.discover()
    assert req.token not in after or after[req.token]["dead"]  # tmux keeps the dead pane


def listed(bench: Bench, token: str) -> bool:
    """Whether ``discover`` lists the attempt of ``token``. A wrapper the runner started is
    never listed (its command line and environment are the runner's): a restarted daemon
    finds it by its pid file."""
    found = token in bench.ex.discover()
    assert not (found and bench.kind == "subprocess")
    return found or bench.kind == "subprocess"


def test_discover_sees_only_its_own_home(bench: Bench, tmp_path_factory: pytest.TempPathFactory) -> None:
    _, paths, req = bench.launch(GATED)
    retry_until((paths.dir / "started").exists)
    other = _make(bench.kind, Home(tmp_path_factory.mktemp("other") / "home"))()
    assert req.token not in other.discover()
    assert listed(bench, req.token)
    (paths.dir / "gate").touch()


def test_env_reaches_the_job(bench: Bench) -> None:
    odd = "a b;$HOME 'q' \"dq\" {x}"
    script = 'printf "var=%s|semi=%s|token=%s\\n" "$GS_TEST_VAR" "$GS_SEMI" "$GPUSCHED_TOKEN"\n'
    _, paths, req = bench.launch(script, env={"GS_TEST_VAR": odd, "GS_SEMI": "x;"})
    assert exited(paths)["exit_code"] == 0
    assert f"var={odd}|semi=x;|token={req.token}" in paths.output.read_text()


def test_a_job_gets_the_signals_gpusched_ignores_at_their_defaults(bench: Bench) -> None:
    """Python ignores SIGPIPE and SIGXFSZ, the daemon also SIGHUP, and a process they start
    inherits what they ignore: a job's ``yes | head -n 1`` would fail with "Broken pipe", and
    ``kill -HUP`` would not stop it. Each backend starts the job with all three at their
    defaults, as a shell does; the wrapper says when SIGHUP stopped it."""
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as the daemon does
    try:
        _, paths, _ = bench.launch('yes | head -n 1\ngrep "^SigIgn:" /proc/self/status\n')
        exit_rec = exited(paths)
        # ("started" from the process that then sleeps: a signal sent before the job's shell
        # forks its next command misses that command, which the shell then waits for)
        handle, hup, _ = bench.launch("sh -c 'echo started; exec sleep 30'\n")
    finally:
        signal.signal(signal.SIGHUP, before)
    assert exit_rec["exit_code"] == 0
    out = paths.output.read_text()
    assert out.startswith("y\n") and "Broken pipe" not in out, out
    ignored = int(out.split("SigIgn:")[1].split()[0], 16)
    for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGHUP):
        assert not ignored & (1 << (sig - 1)), (sig, out)
    retry_until(lambda: hup.output.exists() and "started" in hup.output.read_text())
    proc.signal_group(handle["pid"], signal.SIGHUP)
    assert exited(hup)["signal"] == 1


def test_job_runs_in_its_workdir_and_never_elsewhere(bench: Bench) -> None:
    """launch.sh changes to the job's workdir (as materialize writes it); a workdir that is
    gone stops the job with 126 instead of running it somewhere else."""
    wd = bench.root / "work dir"
    wd.mkdir()
    cd = f"cd {shlex.quote(str(wd))} || exit 126\n"
    _, paths, _ = bench.launch(cd + "pwd -P\n", workdir=wd)
    assert exited(paths)["exit_code"] == 0
    assert str(wd.resolve()) in paths.output.read_text().splitlines()
    gone = f"cd {shlex.quote(str(bench.root / 'gone'))} || exit 126\ntouch ran-anyway\n"
    _, paths, _ = bench.launch(gone, workdir=wd)
    assert exited(paths)["exit_code"] == 126
    assert not list(bench.root.rglob("ran-anyway"))


def test_tmux_pane_opens_in_the_workdir(pane_bench: Bench) -> None:
    """The pane starts in the job's workdir, so a user who attaches lands there."""
    wd = pane_bench.root / "work dir"
    wd.mkdir()
    _, paths, _ = pane_bench.launch("pwd -P\n", workdir=wd)
    assert exited(paths)["exit_code"] == 0
    assert str(wd.resolve()) in paths.output.read_text().splitlines()


def test_odd_but_legal_names(bench: Bench) -> None:
    odd = "a.b+c=d-1"
    _, paths, _ = bench.launch(GATED, suite="x.y:z", job_name=odd, token=odd)
    retry_until((paths.dir / "started").exists)
    assert listed(bench, odd)
    (paths.dir / "gate").touch()
    assert exited(paths)["exit_code"] == 0


def test_wake_fifo_gets_a_byte(bench: Bench) -> None:
    fifo = bench.root / "wake"
    os.mkfifo(fifo)
    # hold a reader open throughout: a FIFO's bytes live only while someone has it open
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        _, paths, _ = bench.launch(EXIT3, env={"GPUSCHED_WAKE": str(fifo)})
        exited(paths)

        def poked() -> bytes:
            try:
                return os.read(fd, 16)
            except BlockingIOError:
                return b""

        assert retry_until(poked) == b"x"
    finally:
        os.close(fd)


def test_terminate_and_release_are_idempotent(bench: Bench) -> None:
    h, paths, _ = bench.launch(EXIT3)
    exited(paths)
    retry_until(lambda: not bench.ex.alive(h))
    for _ in range(2):
        bench.ex.terminate(h)
        bench.ex.terminate(h, force=True)
        bench.ex.release(h)
    assert not bench.ex.alive(h)


# ====================================================================== tmux only


def test_pane_process_is_the_wrapper_and_leads_its_group(tmux_bench: Bench) -> None:
    h, paths, _ = tmux_bench.launch(GATED)
    retry_until((paths.dir / "started").exists)
    pid = paths.read_pid()
    assert pid is not None and pid[0] == h["pid"]
    assert os.getpgid(h["pid"]) == h["pid"] == os.getsid(h["pid"])
    assert psutil.Process(h["pid"]).cmdline()[:2] == ["sh", str(WRAPPER)]
    (paths.dir / "gate").touch()


def test_dead_pane_stays_with_the_exit_line(tmux_bench: Bench) -> None:
    h, paths, req = tmux_bench.launch(EXIT3)
    exited(paths)
    line = f"[gpusched] {req.job_id} exited: code=3 signal=null"
    retry_until(lambda: line in tmux_bench.tx.capture(h))
    assert "hi" in tmux_bench.tx.capture(h, lines=50)
    found = retry_until(lambda: (d := tmux_bench.ex.discover()) and d[req.token]["dead"] and d)
    assert found[req.token]["pane"] == h["pane"]


def test_a_pane_tees_the_job_s_output_through_its_attempt_folder_s_hidden_fifo(pane_bench: Bench) -> None:
    """The executor makes ``.output.pipe`` before the pane starts, and the wrapper's tee reads
    the job's output from it (two processes fewer a job than a pipeline): the output reaches
    both the log and the pane, the exit code is the job's."""
    h, paths, _ = pane_bench.launch(GATED)
    assert stat.S_ISFIFO(os.stat(paths.dir / ".output.pipe").st_mode)
    retry_until((paths.dir / "started").exists)
    tee = retry_until(lambda: [c for c in psutil.Process(h["pid"]).children() if c.name() == "tee"])
    assert [os.path.realpath(f"/proc/{tee[0].pid}/fd/0")] == [str(paths.dir / ".output.pipe")]
    (paths.dir / "gate").touch()
    assert exited(paths)["exit_code"] == 0
    assert paths.output.read_text().splitlines() == ["done"]
    retry_until(lambda: "done" in pane_bench.tx.capture(h, lines=50))


def test_a_closed_pane_leaves_its_job_running_to_its_exit_record(pane_bench: Bench) -> None:
    """Closing a job's pane (a kill-pane, a window closed by hand) hangs up its terminal, not
    the job: it runs on, to its output.log and exit.json, as when the whole server is killed
    (`gpusched cancel` is what stops a job). A reused pane's loop outlives the hang-up while
    its job runs (dying, it would hang the job up) and ends once the job has."""
    b = pane_bench
    h, paths, _ = b.launch(GATED, job_name="closed")
    retry_until((paths.dir / "started").exists)
    loop = int(b.tmux("display-message", "-p", "-t", h["pane"], "#{pane_pid}"))
    keeper, kp, _ = b.launch(GATED, job_name="keeper")  # (the session and the server stay)
    b.tmux("kill-pane", "-t", h["pane"])
    retry_until(lambda: h["pane"] not in b.tmux("list-panes", "-a", "-F", "#{pane_id}").split())
    assert b.ex.alive(h) and not paths.exit.exists()
    (paths.dir / "gate").touch()
    assert ended(b, h, paths)["exit_code"] == 0
    assert paths.output.read_text().splitlines() == ["done"]
    retry_until(lambda: not running(loop))
    h2, p2, _ = b.launch(OK, job_name="next")
    assert h2["pane"] != h["pane"] and ended(b, h2, p2)["exit_code"] == 0
    (kp.dir / "gate").touch()
    assert ended(b, keeper, kp)["exit_code"] == 0


def test_a_ctrl_c_in_the_pane_lets_the_job_save_and_log_as_it_stops(pane_bench: Bench) -> None:
    """Ctrl-C in an attached pane interrupts the whole group. The job's command gets to finish
    what it does on SIGINT (a trainer's ``except KeyboardInterrupt: save()``), what it prints
    meanwhile reaches output.log, exit.json has its status, and a helper it started with `&`
    (which ignores SIGINT, as sh starts every background command) neither keeps the attempt
    open nor outlives it. (tee was once a pipeline element, interrupted with the job: the
    "saving" line met a broken pipe and the save never happened, and the exit code was lost.)"""
    job = (
        'sh -c \'echo $$ > "$0/helper.pid"; exec sleep 300\' "@DIR@" &\n'
        'sh -c \'trap "echo stopping: saving step 7; sleep 0.2; echo ok > $0/checkpoint; exit 130" INT\n'
        'echo started > "$0/started"; while [ ! -e "$0/gate" ]; do sleep 0.02; done\' "@DIR@"\n'
    )
    h, paths, _ = pane_bench.launch(job)
    retry_until((paths.dir / "started").exists)
    pid_file = paths.dir / "helper.pid"  # (the helper runs in the background: it may come after "started")
    helper = int(retry_until(lambda: pid_file.exists() and pid_file.read_text().strip()))
    pane_bench.tmux("send-keys", "-t", h["pane"], "C-c")
    rec = exited(paths)
    assert rec["exit_code"] == 130 and rec["signal"] == 2
    assert (paths.dir / "checkpoint").read_text() == "ok\n"
    # (after a signal exit.json does not wait for tee, which writes out the rest: the helper
    # might hold the output open for good; the wrapper's exit hangs it up, as a pane's does)
    retry_until(lambda: "stopping: saving step 7" in paths.output.read_text())
    retry_until(lambda: not running(helper))
    retry_until(lambda: not pane_bench.ex.alive(h))


def test_a_ctrl_z_in_the_pane_does_not_leave_the_job_stopped(pane_bench: Bench) -> None:
    """A Ctrl-Z in an attached pane must not leave the job stopped, holding its GPU all night
    with no shell prompt there to ``fg`` it from. In a window of its own the job's group has
    no parent in its session (tmux started the wrapper), so the kernel does not stop it; in a
    reused pane the loop's job control does, and the loop sends the job on at once and says so.
    Either way the job reads what is typed next and ends as it would have."""
    b = pane_bench
    job = (  # (dash runs no trap on SIGCONT)
        f"{shlex.quote(sys.executable)} -c 'import signal, sys\n"
        'signal.signal(signal.SIGCONT, lambda *_: open(sys.argv[1] + "/continued", "w").close())\n'
        'open(sys.argv[1] + "/started", "w").close()\n'
        'print("read", sys.stdin.readline().strip())\' "@DIR@"\n'
    )
    h, paths, _ = b.launch(job)
    retry_until((paths.dir / "started").exists)
    b.tmux("send-keys", "-t", h["pane"], "C-z")
    b.tmux("send-keys", "-t", h["pane"], "go", "Enter")
    assert exited(paths)["exit_code"] == 0
    assert "read go" in paths.output.read_text()
    if b.kind == "tmux":
        assert not (paths.dir / "continued").exists()  # never stopped
    else:
        assert (paths.dir / "continued").exists()
        retry_until(lambda: "a Ctrl-Z does not pause a job" in b.tx.capture(h, lines=50))
        h2, p2, _ = b.launch(EXIT3)
        assert h2["pane"] == h["pane"] and exited(p2)["exit_code"] == 3


def test_a_job_that_ignores_a_hangup_runs_on_and_ends_with_its_own_status(pane_bench: Bench) -> None:
    """A hangup of the pane's group (a closed terminal) stops what does not ignore it; a job
    that does (``nohup``) runs on, its output still logged, and its attempt ends when it ends,
    with its own exit code. (The subshell running launch.sh died of the hangup at once: the
    attempt ended with code 129 while the job still ran.)"""
    job = (
        'nohup sh -c \'echo started > "$0/started"; '
        'while [ ! -e "$0/gate" ]; do sleep 0.02; done; echo done\' "@DIR@"\n'
    )
    h, paths, _ = pane_bench.launch(job)
    retry_until((paths.dir / "started").exists)
    os.killpg(h["pid"], signal.SIGHUP)
    assert retry_until(lambda: proc.group_alive(h["pid"], h["pid_started_at"]))
    assert not paths.exit.exists()  # it runs on
    (paths.dir / "gate").touch()
    rec = exited(paths)
    assert rec["exit_code"] == 0 and rec["signal"] is None
    retry_until(lambda: "done" in paths.output.read_text())


def test_the_wrapper_tees_without_the_fifo_too(tmp_path: Path) -> None:
    """An attempt folder with no FIFO (made by an older gpusched, or on a filesystem without
    FIFOs) gets the pipeline: the same output on the terminal and in the log, the same
    status."""
    paths = AttemptPaths(tmp_path / "1-A")
    paths.dir.mkdir()
    paths.launch.write_text(EXIT3)
    r = proc.run(
        ["sh", str(WRAPPER), str(paths.dir), "tee"], check=False, env={**os.environ, "GPUSCHED_JOB_ID": "s/j"}
    )
    assert r.returncode == 3
    assert r.stdout.startswith("hi\n") and "[gpusched] s/j exited: code=3 signal=null" in r.stdout
    assert paths.output.read_text() == "hi\n"
    assert exited(paths)["exit_code"] == 3
    assert not paths.pipe.exists()


def test_terminated_pane_says_signal_15(pane_bench: Bench) -> None:
    h, paths, _ = pane_bench.launch(GATED)
    retry_until((paths.dir / "started").exists)
    pane_bench.ex.terminate(h)
    assert exited(paths)["signal"] == 15
    retry_until(lambda: "signal=15" in pane_bench.tx.capture(h))


def test_relaunch_replaces_the_jobs_window(tmux_bench: Bench) -> None:
    b = tmux_bench
    _, p1, _ = b.launch(EXIT3, job_name="j", token="t1")
    b.launch("true\n", job_name="other", token="t0")
    exited(p1)
    _, p2, _ = b.launch(EXIT3, job_name="j", token="t2")  # same executor: it knows the old window
    exited(p2)
    b.ex = b.make()  # a restarted daemon learns the windows from the server
    h3, p3, _ = b.launch(EXIT3, job_name="j", token="t3")
    exited(p3)
    windows = b.tmux("list-windows", "-t", "=s1", "-F", "#{window_id} #{window_name}").split("\n")
    assert f"{h3['window']} j" in windows
    assert [w for w in windows if w.endswith(" j")] == [f"{h3['window']} j"]
    found = b.ex.discover()
    assert "t3" in found and "t0" in found and "t1" not in found and "t2" not in found


def count_tmux_calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[list[str]]]:
    """The tmux argvs run from here on: exec'd (``exec``) or written to the control client
    (``line``)."""
    calls: dict[str, list[list[str]]] = {"exec": [], "line": []}
    real_run, real_line = proc.run, ControlClient.run

    def counting(cmd: list[str], **kw: Any) -> Any:
        calls["exec"].append(list(cmd))
        return real_run(cmd, **kw)

    def counting_line(self: ControlClient, argv: list[str]) -> Any:
        calls["line"].append(list(argv))
        return real_line(self, argv)

    monkeypatch.setattr(proc, "run", counting)
    monkeypatch.setattr(ControlClient, "run", counting_line)
    return calls


@pytest.mark.parametrize("control", [True, False], ids=["control-client", "exec-only"])
def test_launch_is_one_tmux_command_line(
    tmux_bench: Bench, monkeypatch: pytest.MonkeyPatch, control: bool
) -> None:
    """Each launch is one tmux command line: the first a tmux exec (it starts the server and
    the session), the next ones lines to the control client attached then; without one (a
    tmux before 3.2), one exec each."""
    if not control:
        monkeypatch.setattr(tmux_mod, "CONTROL_TRIES", 0)
    calls = count_tmux_calls(monkeypatch)
    b = tmux_bench
    _, first, _ = b.launch(EXIT3, job_name="a")  # starts the server and the session
    b.launch(EXIT3, job_name="b")  # new window
    _, again, _ = b.launch(EXIT3, job_name="a")  # relaunch: replaces a's window in the same line
    _, other, _ = b.launch(EXIT3, suite="s2", job_name="a")  # another suite: new session
    if control:
        assert (len(calls["exec"]), len(calls["line"])) == (1, 3), calls
    else:
        assert (len(calls["exec"]), len(calls["line"])) == (4, 0), calls
    assert [exited(p)["exit_code"] for p in (first, again, other)] == [3, 3, 3]
    windows = b.tx._tmux(["list-windows", "-a", "-F", "#{session_name} #{window_name}"]).stdout.split()
    assert sorted(zip(windows[::2], windows[1::2], strict=True)) == [("s1", "a"), ("s1", "b"), ("s2", "a")]


def test_a_launch_execs_tmux_when_the_control_client_is_gone_and_attaches_a_new_one(
    tmux_bench: Bench, monkeypatch: pytest.MonkeyPatch
) -> None:
    b = tmux_bench
    b.launch(EXIT3, job_name="a")
    client = b.tx._control
    assert client is not None and client.alive
    assert client._proc is not None
    client._proc.kill()
    client._proc.wait()
    calls = count_tmux_calls(monkeypatch)
    _, paths, _ = b.launch(EXIT3, job_name="b")
    assert exited(paths)["exit_code"] == 3 and len(calls["exec"]) == 1
    assert b.tx._control is not None and b.tx._control is not client and b.tx._control.alive
    _, paths, _ = b.launch(EXIT3, job_name="c")
    assert exited(paths)["exit_code"] == 3 and (len(calls["exec"]), len(calls["line"])) == (1, 2)


def test_a_ticks_launches_are_one_tmux_exec(tmux_bench: Bench, monkeypatch: pytest.MonkeyPatch) -> None:
    """launch_many: new sessions, new windows and a relaunch's replaced window, in one call."""
    b = tmux_bench
    _, old, _ = b.launch(EXIT3, job_name="a", token="t-old")
    exited(old)
    calls = count_tmux_calls(monkeypatch)
    made = [
        b.request(EXIT3, job_name="a", token="t-a"),  # relaunch of a
        b.request(EXIT3, job_name="b", token="t-b"),
        b.request(EXIT3, suite="s2", job_name="a", token="t-s2a"),  # a new session
        b.request(EXIT3, suite="s2", job_name="b", token="t-s2b"),  # ... filled in the same call
    ]
    handles = b.tx.launch_many([req for req, _ in made])
    assert (len(calls["exec"]), len(calls["line"])) == (0, 1), calls  # one line to the control client
    assert all(isinstance(h, dict) for h in handles)
    b.handles += handles  # type: ignore[arg-type]
    assert [exited(paths)["exit_code"] for _, paths in made] == [3, 3, 3, 3]
    assert len({h["pane"] for h in handles}) == 4  # type: ignore[index]
    found = b.ex.discover()
    assert {"t-a", "t-b", "t-s2a", "t-s2b"} <= found.keys() and "t-old" not in found


def test_launch_many_goes_on_one_by_one_where_the_chain_broke(tmux_bench: Bench) -> None:
    """A session closed behind the executor's back stops tmux's chain at its new-window;
    what was not opened is launched one by one, and every job runs once."""
    b = tmux_bench
    b.launch(EXIT3, suite="keep")  # keeps the server up
    _, p1, _ = b.launch(EXIT3)
    exited(p1)
    b.tmux("kill-session", "-t", "=s1")  # the executor still believes s1 exists
    made = [
        b.request(EXIT3, suite="keep", token="k1"),
        b.request(EXIT3, token="x1"),
        b.request(EXIT3, token="x2"),
    ]
    handles = b.tx.launch_many([req for req, _ in made])
    assert all(isinstance(h, dict) for h in handles), handles
    b.handles += handles  # type: ignore[arg-type]
    assert [exited(paths)["exit_code"] for _, paths in made] == [3, 3, 3]
    assert {"k1", "x1", "x2"} <= b.ex.discover().keys()
    assert [len(paths.output.read_text().split("hi")) - 1 for _, paths in made] == [1, 1, 1]  # once each


def test_launch_survives_a_session_killed_behind_its_back(tmux_bench: Bench) -> None:
    b = tmux_bench
    _, p1, _ = b.launch(EXIT3)
    exited(p1)
    b.tmux("kill-session", "-t", "=s1")
    b.launch(EXIT3, suite="keep")  # keeps the server up
    _, p2, req = b.launch(EXIT3)
    assert exited(p2)["exit_code"] == 3
    assert req.token in b.ex.discover()


def test_socket_and_conf_are_private(tmux_bench: Bench) -> None:
    tmux_bench.launch(EXIT3)
    st = os.stat(tmux_bench.home.tmux_socket)
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) & 0o077 == 0
    assert stat.S_IMODE(os.stat(tmux_bench.home.root).st_mode) == 0o700
    assert "set -g remain-on-exit on" in tmux_bench.home.tmux_conf.read_text()
    assert tmux_bench.tmux("show-options", "-gv", "remain-on-exit").strip() == "on"
    assert tmux_bench.tmux("show-options", "-gv", "history-limit").strip() == "20000"


def test_windows_are_tagged_and_named(tmux_bench: Bench) -> None:
    odd = "a.b+c=d-1"
    h, paths, _ = tmux_bench.launch(GATED, suite="x.y:z", job_name=odd, token=odd)
    retry_until((paths.dir / "started").exists)
    fmt = "#{session_name}|#{window_name}|#{@gpusched_token}|#{@gpusched_job}|#{@gpusched_suite}"
    shown = tmux_bench.tmux("display-message", "-p", "-t", h["pane"], fmt).strip()
    assert shown == f"x_y_z|{odd}|{odd}|x.y:z/{odd}|x.y:z"
    # a pane the user splits off the job's window is not the attempt
    tmux_bench.tmux("split-window", "-d", "-t", h["window"], "sleep 30")
    assert tmux_bench.ex.discover()[odd]["pane"] == h["pane"]
    # libtmux sees the same server
    session = tmux_bench.tx.server().sessions.get(session_name="x_y_z")
    window = session.windows.get(window_id=h["window"]) if session is not None else None
    assert window is not None and window.window_name == odd
    (paths.dir / "gate").touch()


def test_release_closes_the_window(tmux_bench: Bench) -> None:
    h, paths, req = tmux_bench.launch(EXIT3)
    tmux_bench.launch("true\n", job_name="keep")
    exited(paths)
    tmux_bench.ex.release(h)
    assert req.token not in tmux_bench.ex.discover()
    assert h["window"] not in tmux_bench.tmux("list-windows", "-a", "-F", "#{window_id}").split()


def test_attach_argv_names_the_session_and_window(tmux_bench: Bench) -> None:
    h, _, _ = tmux_bench.launch(EXIT3)
    argv = tmux_bench.tx.attach_argv(h)
    sock = str(tmux_bench.home.tmux_socket)
    attach = ["attach-session", "-t", h["session"], ";", "select-window", "-t", h["window"]]
    assert argv[1:] == ["-S", sock, *attach]
    assert os.path.basename(argv[0]) == "tmux"
    shown = tmux_bench.tmux("display-message", "-p", "-t", h["window"], "#{session_id}").strip()
    assert shown == h["session"]
    assert "TMUX" not in attach_env({"TMUX": "/tmp/x,1,0", "PATH": "/bin"})


def test_discover_without_a_server_is_empty(tmp_path_factory: pytest.TempPathFactory) -> None:
    if not HAVE_TMUX:
        pytest.skip("tmux is not installed")
    home = Home(tmp_path_factory.mktemp("none") / "home")
    assert TmuxExecutor(home).discover() == {}
    home.ensure()
    home.tmux_socket.touch()  # a stale socket file, no server behind it
    assert TmuxExecutor(home).discover() == {}


# ====================================================================== pure builders


def test_session_names_avoid_what_tmux_forbids() -> None:
    assert session_name("E1") == "E1"
    assert session_name("a.b:c") == "a_b_c"
    assert session_name("") == "_"


def test_escape_keeps_a_trailing_semicolon_literal() -> None:
    assert escape("a;") == "a\\;"
    assert escape(";") == "\\;"
    assert escape("a;b") == "a;b"
    assert escape("\\;") == "\\\\;"


def _req(**kw: object) -> LaunchRequest:
    base: dict[str, object] = {
        "job_id": "E1/j.1",
        "suite": "E1",
        "job_name": "j.1",
        "token": "tk",
        "attempt_dir": Path("/logs/j.1/1-A"),
        "workdir": Path("/proj"),
        "env": {"CUDA_VISIBLE_DEVICES": "0"},
    }
    return LaunchRequest(**{**base, **kw})  # type: ignore[arg-type]


def test_launch_argv_golden() -> None:
    ids = "#{pane_id}\t#{window_id}\t#{session_id}\t#{pane_pid}"
    env = ["-e", "GPUSCHED_JOB_ID=E1/j.1", "-e", "CUDA_VISIBLE_DEVICES=0", "-e", "GPUSCHED_TOKEN=tk"]
    window = [
        "-n",
        "j.1",
        "-c",
        "/proj",
        *env,
        "-P",
        "-F",
        ids,
        "--",
        "sh",
        str(WRAPPER),
        "/logs/j.1/1-A",
        "tee",
    ]
    tag = ["set-option", "-p", "-t", "=E1:{end}", "@gpusched_token", "tk", ";",
           "set-option", "-p", "-t", "=E1:{end}", "@gpusched_job", "E1/j.1"]  # fmt: skip
    assert launch_argv(_req(), new_session=False) == [
        "new-window", "-d", "-a", "-t", "=E1:{end}", *window, ";", *tag,
    ]  # fmt: skip
    assert launch_argv(_req(), new_session=True, replaces="@7") == [
        "new-session", "-d", "-s", "E1", *window, ";",
        "set-option", "-t", "=E1:", "@gpusched_suite", "E1", ";", *tag, ";", "kill-window", "-t", "@7",
    ]  # fmt: skip


def test_launch_argv_escapes_every_argument() -> None:
    argv = launch_argv(_req(job_name="x;", env={"V": "y;"}), new_session=False)
    assert "x\\;" in argv and "V=y\\;" in argv
    assert argv.count(";") == 2  # only the real separators


def test_parse_ids() -> None:
    assert parse_ids("%3\t@2\t$1\t4242\n") == ("%3", "@2", "$1", 4242)
    assert parse_ids("") is None
    assert parse_ids("can't find session\n") is None


def test_only_the_newest_windows_stay_and_running_ones_never_close(
    tmux_bench: Bench, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long night must not pile thousands of dead panes on the server: beyond KEEP_WINDOWS,
    each launch closes the oldest window whose attempt ended, in the same tmux exec."""
    import gpusched.executors.tmux as tmux_module

    monkeypatch.setattr(tmux_module, "KEEP_WINDOWS", 3)
    long_job, rpaths, _ = tmux_bench.launch(GATED, job_name="long")
    retry_until((rpaths.dir / "started").exists)
    ended = []
    for _ in range(5):
        h, paths, _ = tmux_bench.launch(EXIT3)
        exited(paths)
        retry_until(lambda h=h: not tmux_bench.ex.alive(h))
        ended.append(h["window"])
    windows = tmux_bench.tmux("list-windows", "-a", "-F", "#{window_id}").split()
    assert long_job["window"] in windows  # the oldest, but still running
    assert windows == [long_job["window"], *ended[-2:]]
    # what `gpusched attach` asks before attaching
    assert tmux_bench.ex.shows(long_job) and not tmux_bench.ex.shows({**long_job, "pane": "%999999"})
    (rpaths.dir / "gate").touch()


def test_the_control_client_passes_every_argument_literally(tmux_bench: Bench) -> None:
    """A line to the control client is parsed by tmux, which would expand ``$VAR`` and ``~``
    and split at ``;``: every argument reaches tmux as the argv path gives it."""
    b = tmux_bench
    b.launch(EXIT3, job_name="first")
    assert b.tx._control is not None and b.tx._control.alive
    odd = 'we\'ird $HOME ~ "q" {x} # a;'  # (not #{...}: tmux expands a window name's formats)
    _, paths, _ = b.launch(EXIT3, job_name=odd, env={"ODD": odd})
    assert exited(paths)["exit_code"] == 3
    names = b.tx._tmux(["list-windows", "-t", "=s1", "-F", "#{window_name}"]).stdout.splitlines()
    assert odd in names
    r = b.tx._control.run(["display-message", "-p", "-t", "=s1", "x", ";", "kill-window", "-t", "@99999"])
    assert r is not None and r.returncode == 1 and r.stdout == "x\n" and "@99999" in r.stderr


# ====================================================================== reused panes
# GPUSCHED_TMUX_PANES=reuse: a pane runs one job after another (gpusched/pane.sh); the shared
# contract above runs against it too ("tmux-reuse").


@pytest.fixture
def reuse_bench(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bench]:
    yield from _tmux_bench("tmux-reuse", tmp_path_factory)


def ended(b: Bench, h: Handle, paths: AttemptPaths) -> dict[str, object]:
    """exit.json, once the attempt's processes are all gone too (as the daemon reaps it)."""
    rec = exited(paths)
    retry_until(lambda: not b.ex.alive(h))
    return rec


def windows(b: Bench) -> list[str]:
    return b.tmux("list-windows", "-a", "-F", "#{window_id} #{window_name}").splitlines()


def test_a_reused_pane_runs_the_next_job_under_its_name_and_no_window_opens(reuse_bench: Bench) -> None:
    b = reuse_bench
    h1, p1, _ = b.launch(OK, job_name="first")
    assert ended(b, h1, p1)["exit_code"] == 0
    # (held until its group is looked at: a job that ended at once was reaped before the check)
    second = 'echo second\nwhile [ ! -e "@DIR@/gate" ]; do sleep 0.02; done\n'
    h2, p2, r2 = b.launch(second, job_name="second")
    assert (h2["pane"], h2["window"]) == (h1["pane"], h1["window"])
    assert h2["pid"] != h1["pid"] and os.getpgid(h2["pid"]) == h2["pid"]  # its own group
    (p2.dir / "gate").touch()
    assert ended(b, h2, p2)["exit_code"] == 0
    assert windows(b) == [f"{h1['window']} second"]
    assert p2.output.read_text() == "second\n" and p1.output.read_text() == "hi\n"
    # the pane shows the second job, tagged with its token: `gpusched attach` on the first says so
    assert b.ex.shows(h2) and not b.ex.shows(h1)
    assert b.ex.discover()[r2.token]["pane"] == h1["pane"]
    retry_until(lambda: f"[gpusched] {r2.job_id} exited: code=0" in b.tx.capture(h2))


def test_a_busy_pane_is_not_reused_and_each_job_gets_its_suites_pane(reuse_bench: Bench) -> None:
    b = reuse_bench
    busy, bp, _ = b.launch(GATED, job_name="busy")
    retry_until((bp.dir / "started").exists)
    other, op, _ = b.launch(OK, job_name="other")
    assert other["pane"] != busy["pane"]
    ended(b, other, op)
    elsewhere, ep, _ = b.launch(OK, suite="s2", job_name="elsewhere")
    assert elsewhere["pane"] not in (busy["pane"], other["pane"])  # another suite, another session
    ended(b, elsewhere, ep)
    again, ap, _ = b.launch(OK, job_name="again")
    assert again["pane"] == other["pane"]
    ended(b, again, ap)
    (bp.dir / "gate").touch()
    assert ended(b, busy, bp)["exit_code"] == 0
    assert len(windows(b)) == 3


def test_a_ctrl_c_in_a_reused_pane_stops_its_job_and_the_pane_keeps_it(reuse_bench: Bench) -> None:
    """The job is the pane's foreground group: a Ctrl-C reaches it, not the pane's loop; the
    job did not succeed, so its pane shows it on and the next job gets another."""
    b = reuse_bench
    h, paths, _ = b.launch(GATED, job_name="stopped")
    retry_until((paths.dir / "started").exists)
    b.tmux("send-keys", "-t", h["pane"], "C-c")
    assert ended(b, h, paths)["exit_code"] == 130
    h2, p2, _ = b.launch(OK, job_name="next")
    assert h2["pane"] != h["pane"] and ended(b, h2, p2)["exit_code"] == 0
    assert b.ex.shows(h)


def test_a_restarted_daemon_finds_the_running_job_and_launches_into_the_old_panes(reuse_bench: Bench) -> None:
    b = reuse_bench
    h, paths, req = b.launch(GATED, job_name="long")
    retry_until((paths.dir / "started").exists)
    h0, p0, _ = b.launch(OK, job_name="short")
    ended(b, h0, p0)
    b.ex = b.make()  # the daemon restarted
    found = b.ex.discover()[req.token]
    assert (found["pid"], found["pane"], found["dead"]) == (h["pid"], h["pane"], False)
    assert b.ex.alive(found)
    h1, p1, _ = b.launch(OK, job_name="after")
    assert h1["pane"] == h0["pane"]  # the idle one, not the busy one, not a new one
    assert ended(b, h1, p1)["exit_code"] == 0
    (paths.dir / "gate").touch()
    assert ended(b, h, paths)["exit_code"] == 0


def test_a_closed_pane_is_not_written_to(reuse_bench: Bench) -> None:
    """A user who closes an idle pane: the next launch opens a new one at once (a line written
    to a FIFO nobody reads would leave the launch unanswered for seconds)."""
    b = reuse_bench
    busy, bp, _ = b.launch(GATED, job_name="busy")  # (keeps the session and the server)
    h, paths, _ = b.launch(OK, job_name="first")
    ended(b, h, paths)
    loop = int(b.tmux("display-message", "-p", "-t", h["pane"], "#{pane_pid}"))
    b.tmux("kill-pane", "-t", h["pane"])
    retry_until(lambda: not running(loop))
    h2, p2, _ = b.launch(EXIT3, job_name="second")
    assert h2["pane"] not in (h["pane"], busy["pane"]) and ended(b, h2, p2)["exit_code"] == 3
    (bp.dir / "gate").touch()


@pytest.fixture
def keep_two(reuse_bench: Bench, monkeypatch: pytest.MonkeyPatch) -> Bench:
    """Reused panes, with two windows kept (KEEP_WINDOWS) rather than 64."""
    from gpusched.executors import tmux, tmux_reuse

    monkeypatch.setattr(tmux, "KEEP_WINDOWS", 2)  # (the ended windows are counted there)
    monkeypatch.setattr(tmux_reuse, "KEEP_WINDOWS", 2)
    return reuse_bench


def test_idle_panes_beyond_keep_windows_are_closed(keep_two: Bench) -> None:
    b = keep_two
    a, ap, _ = b.launch(GATED, job_name="a")
    c, cp, _ = b.launch(OK, job_name="c")
    ended(b, c, cp)
    d, dp, _ = b.launch(OK, suite="s2", job_name="d")  # a third pane: the idle one goes
    ended(b, d, dp)
    shown = [w.split()[0] for w in windows(b)]
    assert shown == [a["window"], d["window"]]
    (ap.dir / "gate").touch()
    ended(b, a, ap)
    b.ex.discover()
    fifos = [f for f in os.listdir(b.home.root / "panes") if f.endswith(".fifo")]
    assert len(fifos) == 2  # the closed pane's went


def pane_dead(b: Bench, pane: str) -> bool:
    return b.tmux("display-message", "-p", "-t", pane, "#{pane_dead}").strip() == "1"


def dead_with(b: Bench, pane: str) -> str:
    """The exit status the dead pane shows. tmux (3.3a) marks a pane dead at its terminal's end
    but, now and then, learns its process's status only at its next SIGCHLD (1 pane in 10 to 40
    here, with or without gpusched): a ``run-shell true`` between looks gives it one."""

    def shown() -> str:
        status = b.tmux("display-message", "-p", "-t", pane, "#{pane_dead}:#{pane_dead_status}").strip()
        if status == "1:":
            b.tmux("run-shell", "true")
        return status.partition(":")[2]

    return retry_until(shown)


def test_a_pane_whose_job_failed_keeps_it_on_screen_and_the_next_job_gets_another(reuse_bench: Bench) -> None:
    """As a window of its own would: a job that exited non-zero stays on its pane, dead, to look
    at; when that job runs again, the window that kept it is closed, as a window of its own's is."""
    b = reuse_bench
    bad, bp, breq = b.launch(EXIT3, job_name="bad")
    assert ended(b, bad, bp)["exit_code"] == 3
    nxt, np_, _ = b.launch(OK, job_name="next")
    assert nxt["pane"] != bad["pane"] and ended(b, nxt, np_)["exit_code"] == 0
    assert dead_with(b, bad["pane"]) == "3"  # its loop has ended: nothing more runs there
    assert b.ex.shows(bad) and f"[gpusched] {breq.job_id} exited: code=3" in b.tx.capture(bad)
    assert f"{bad['window']} bad" in windows(b)
    assert len([f for f in os.listdir(b.home.root / "panes") if f.endswith(".fifo")]) == 1
    again, ap, _ = b.launch(OK, job_name="bad")  # the job's next attempt
    assert again["pane"] == nxt["pane"] and ended(b, again, ap)["exit_code"] == 0
    assert windows(b) == [f"{nxt['window']} bad"]


def test_by_default_a_job_that_ran_long_keeps_its_pane_like_a_failed_one(reuse_bench: Bench) -> None:
    """GPUSCHED_TMUX_PANES=auto (the default): a job that succeeded after running SHORT_S or
    longer stays on its pane, dead, as in a window of its own; only panes of jobs of seconds
    run the next job. (Here every job counts as long: SHORT_S 0.)"""
    b = reuse_bench
    assert isinstance(b.ex, TmuxReuseExecutor)
    b.ex.short_s = 0.0
    done, dp, dreq = b.launch(OK, job_name="done")
    assert ended(b, done, dp)["exit_code"] == 0
    b.ex.reaped([done], {"s1"})  # reaped (s1 still queued): its pane shows it dead, as a window's would
    assert dead_with(b, done["pane"]) == "0"
    nxt, np_, _ = b.launch(OK, job_name="next")
    assert nxt["pane"] != done["pane"] and ended(b, nxt, np_)["exit_code"] == 0
    assert b.ex.shows(done) and f"[gpusched] {dreq.job_id} exited: code=0" in b.tx.capture(done)
    b.ex.short_s = None  # GPUSCHED_TMUX_PANES=reuse: a job that succeeded leaves its pane to the next
    b.ex.reaped([nxt], {"s1"})
    again, ap, _ = b.launch(OK, job_name="again")
    assert again["pane"] == nxt["pane"] and ended(b, again, ap)["exit_code"] == 0
    assert windows(b) == [f"{done['window']} done", f"{nxt['window']} again"]
    assert not pane_dead(b, again["pane"])


def test_a_suite_with_nothing_left_queued_has_its_idle_panes_show_their_last_job_dead(
    reuse_bench: Bench,
) -> None:
    """Once a suite has no job queued, a pane whose job of seconds succeeded runs nothing more:
    told so as the scheduler reaps, it shows that job dead (status 0), as a window of its own
    would, not a loop waiting all morning. A pane of a suite with jobs still queued stays
    ready, and one whose job still runs goes on."""
    b = reuse_bench
    busy, bp, _ = b.launch(GATED, job_name="busy")
    retry_until((bp.dir / "started").exists)
    done, dp, dreq = b.launch(OK, job_name="done")
    other, op, _ = b.launch(OK, suite="s2", job_name="other")
    assert ended(b, done, dp)["exit_code"] == 0 and ended(b, other, op)["exit_code"] == 0
    b.ex.reaped([done], {"s1", "s2"})  # both suites have jobs queued: both panes stay ready
    assert not pane_dead(b, done["pane"]) and not pane_dead(b, other["pane"])
    b.ex.reaped([], {"s2"})  # s1 has nothing left queued
    assert dead_with(b, done["pane"]) == "0"
    assert f"[gpusched] {dreq.job_id} exited: code=0" in b.tx.capture(done)
    assert not pane_dead(b, other["pane"]) and not pane_dead(b, busy["pane"]) and b.ex.alive(busy)
    late, lp, _ = b.launch(OK, job_name="late")  # a job requeued after all: a pane of its own
    assert late["pane"] not in (done["pane"], busy["pane"]) and ended(b, late, lp)["exit_code"] == 0
    (bp.dir / "gate").touch()
    assert ended(b, busy, bp)["exit_code"] == 0
    b.ex.reaped([busy, late], {"s2"})
    assert dead_with(b, busy["pane"]) == "0" and dead_with(b, late["pane"]) == "0"
    again, ap, _ = b.launch(OK, suite="s2", job_name="again")
    assert again["pane"] == other["pane"] and ended(b, again, ap)["exit_code"] == 0


def test_a_window_per_job_daemon_ends_the_reused_panes_an_earlier_daemon_left(reuse_bench: Bench) -> None:
    """A daemon restarted with GPUSCHED_TMUX_PANES=job after one that reused panes launches into
    none of them; each shows its last job dead once that job has ended (at its first tick for a
    pane already idle, though its suite has jobs queued), not a loop waiting all night."""
    from gpusched.executors.tmux_reuse import TmuxWindowExecutor

    b = reuse_bench
    busy, bp, breq = b.launch(GATED, job_name="busy")
    retry_until((bp.dir / "started").exists)
    done, dp, _ = b.launch(OK, job_name="done")
    assert ended(b, done, dp)["exit_code"] == 0
    b.ex = TmuxWindowExecutor(b.home)  # the daemon restarted with GPUSCHED_TMUX_PANES=job
    taken = b.ex.discover()[breq.token]
    assert taken["pane"] == busy["pane"] and b.ex.alive(taken)
    b.ex.reaped([], {"s1"})  # its first tick: s1 has jobs queued, but no pane will run one
    assert dead_with(b, done["pane"]) == "0"
    assert not pane_dead(b, busy["pane"]) and b.ex.alive(taken)
    h, hp, _ = b.launch(EXIT3, job_name="new")
    assert h["pane"] not in (busy["pane"], done["pane"])
    assert not b.tmux("display-message", "-p", "-t", h["pane"], "#{@gpusched_fifo}").strip()  # no loop
    assert ended(b, h, hp)["exit_code"] == 3
    (bp.dir / "gate").touch()
    assert ended(b, busy, bp)["exit_code"] == 0
    b.ex.reaped([taken, h], {"s1"})
    assert dead_with(b, busy["pane"]) == "0" and dead_with(b, h["pane"]) == "3"
    b.ex.discover()
    assert not [f for f in os.listdir(b.home.root / "panes") if f.endswith(".fifo")]


def test_how_long_a_job_ran_is_what_decides_whether_its_pane_keeps_it(tmp_path: Path) -> None:
    """By the attempt's own clock: the pid file's mtime (its start) to exit.json's (its end)."""
    from gpusched.executors.tmux_reuse import SHORT_S, Pane

    paths = AttemptPaths(tmp_path / "1-A")
    paths.dir.mkdir()

    def pane(code: int, ran_s: float) -> Pane:
        paths.pid.write_text("123\n")
        paths.exit.write_text(json.dumps({"exit_code": code, "signal": None}) + "\n")
        os.utime(paths.pid, (1000.0, 1000.0))
        os.utime(paths.exit, (1000.0 + ran_s, 1000.0 + ran_s))
        return Pane("%1", "@1", "$1", "s", "f", -1, 1, None, token="t", exit_path=str(paths.exit))

    assert not pane(0, SHORT_S - 0.5).keeps_screen(SHORT_S)  # seconds: the next job runs there
    assert pane(0, SHORT_S).keeps_screen(SHORT_S)
    assert pane(0, 3600).keeps_screen(SHORT_S)
    assert not pane(0, 3600).keeps_screen(None)  # reuse: every pane whose job succeeded
    assert pane(3, 1).keeps_screen(SHORT_S) and pane(3, 1).keeps_screen(None)  # failed: always kept
    paths.exit.write_text("")  # (seen created, not yet written: not ended)
    assert not Pane("%1", "@1", "$1", "s", "f", -1, 1, None, exit_path=str(paths.exit)).keeps_screen(0.0)


def test_a_restarted_daemon_runs_no_job_in_a_pane_that_shows_a_failed_one(reuse_bench: Bench) -> None:
    b = reuse_bench
    bad, bp, _ = b.launch(EXIT3, job_name="bad")
    ended(b, bad, bp)
    b.ex = b.make()  # the daemon restarted before it launched again: the pane's tags tell
    h, paths, _ = b.launch(OK, job_name="after")
    assert h["pane"] != bad["pane"] and ended(b, h, paths)["exit_code"] == 0
    retry_until(lambda: pane_dead(b, bad["pane"]))


def test_panes_of_failed_jobs_beyond_keep_windows_are_closed(keep_two: Bench) -> None:
    b = keep_two
    x, xp, _ = b.launch(EXIT3, job_name="x")
    ended(b, x, xp)
    y, yp, _ = b.launch(EXIT3, job_name="y")  # x's pane keeps x
    ended(b, y, yp)
    z, zp, _ = b.launch(OK, job_name="z")  # y's keeps y: a third window, so the oldest goes
    ended(b, z, zp)
    assert [w.split()[0] for w in windows(b)] == [y["window"], z["window"]]


def test_a_request_that_cannot_be_one_line_gets_a_window_of_its_own(reuse_bench: Bench) -> None:
    b = reuse_bench
    h1, p1, _ = b.launch(OK, job_name="plain")
    ended(b, h1, p1)
    script = 'printf "%s" "$TWO_LINES" > "@DIR@/two.txt"\n' + GATED
    h2, p2, _ = b.launch(script, job_name="two", env={"TWO_LINES": "a\nb"})
    retry_until((p2.dir / "started").exists)
    assert h2["pane"] != h1["pane"] and os.getsid(h2["pid"]) == h2["pid"]  # the wrapper leads the pane
    (p2.dir / "gate").touch()
    assert ended(b, h2, p2)["exit_code"] == 0 and (p2.dir / "two.txt").read_text() == "a\nb"
    h3, p3, _ = b.launch(OK, job_name="third")
    assert h3["pane"] == h1["pane"]
    ended(b, h3, p3)
    # a value longer than a pipe holds (and than tmux takes on a command line) goes as it is read
    big = "x" * 100_000
    h4, p4, _ = b.launch('printf "%s" "$BIG" | wc -c\n', job_name="big", env={"BIG": big})
    assert h4["pane"] == h1["pane"] and ended(b, h4, p4)["exit_code"] == 0
    assert p4.output.read_text().strip() == "100000"


def test_the_panes_setting_is_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from gpusched.executors import tmux_reuse
    from gpusched.executors.select import make_executor

    # (a value it does not take is refused by submit and `daemon start`; a daemon that meets
    # one anyway keeps the default, auto)
    for raw, short_s in (
        ("auto", tmux_reuse.SHORT_S),
        ("", tmux_reuse.SHORT_S),
        ("fast", tmux_reuse.SHORT_S),
        ("reuse", None),
        (" Reuse ", None),
        ("job", "a window for each"),
    ):
        monkeypatch.setenv(tmux_reuse.PANES_ENV, raw)
        ex = make_executor("tmux", Home(tmp_path))
        if short_s == "a window for each":
            assert type(ex) is tmux_reuse.TmuxWindowExecutor
        else:
            assert type(ex) is tmux_reuse.TmuxReuseExecutor and ex.short_s == short_s
    with pytest.raises(ValueError):
        tmux_reuse.parse_panes("fast")


def test_a_line_its_pane_reaches_too_late_is_not_run(reuse_bench: Bench) -> None:
    """A line written to a pane that was busy (a daemon that died between writing it and
    tagging the pane, then a new one that gave the launch up) must not run once the pane is
    free: the scheduler has requeued that attempt as never started, and it would run twice."""
    from gpusched.executors.tmux_reuse import boot_cs, pane_line

    b = reuse_bench
    busy, bp, _ = b.launch(GATED, job_name="busy")
    retry_until((bp.dir / "started").exists)
    late, lp = b.request("echo ran >> ran.txt\n", job_name="late")
    line = pane_line(late, until=boot_cs() - 1)
    assert line is not None
    os.write(b.tx._panes[busy["pane"]].fd, line)  # type: ignore[attr-defined]
    (bp.dir / "gate").touch()
    ended(b, busy, bp)
    retry_until(lambda: f"not run ({late.token})" in b.tx.capture(busy, lines=50))
    assert not (b.root / "ran.txt").exists() and lp.read_pid() is None
    h, paths, _ = b.launch(EXIT3, job_name="next")
    assert h["pane"] == busy["pane"] and ended(b, h, paths)["exit_code"] == 3


def test_a_pane_whose_tags_are_stale_is_not_taken_for_idle(reuse_bench: Bench) -> None:
    """The daemon died after writing a line into an idle pane and before tagging it with the
    new wrapper's pid: a new daemon reads the old (ended) wrapper's pid there, but the pane's
    loop has a child, so the pane is busy and the next job gets another."""
    b = reuse_bench
    h0, p0, _ = b.launch(EXIT3, job_name="first")
    ended(b, h0, p0)
    req, paths = b.request(GATED, job_name="running")
    b.tx.begin(req)  # type: ignore[attr-defined]
    retry_until((paths.dir / "started").exists)  # (and finish() is never called: the daemon died)
    b.ex = b.make()
    h, hp, _ = b.launch(EXIT3, job_name="other")
    assert h["pane"] != h0["pane"] and ended(b, h, hp)["exit_code"] == 3
    (paths.dir / "gate").touch()
    assert exited(paths)["exit_code"] == 0


def test_a_pane_whose_wrapper_wrote_its_exit_record_takes_the_next_line(tmp_path: Path) -> None:
    """The scheduler reaps an attempt by its exit.json, while its wrapper may still be printing
    its last line: its pane is free for the slot's next job (the loop reads the line once the
    wrapper exits), not a reason to open another window, and without that record it is busy."""
    import subprocess

    from gpusched.executors.tmux_reuse import Pane

    wrapper = subprocess.Popen(["sleep", "30"], start_new_session=True)  # (a group leader, as a wrapper)
    try:
        exit_json = tmp_path / "exit.json"
        pane = Pane("%1", "@1", "$1", "s", "", -1, os.getpid(), None, token="t", wrapper=wrapper.pid)
        pane.wrapper_started = proc.started_at(wrapper.pid)
        pane.exit_path = str(exit_json)
        assert not pane.idle()
        exit_json.write_text('{"exit_code": 0}')
        assert pane.idle()
        pane.exited_ok = None
        exit_json.write_text('{"exit_code": 1}')  # a job that failed: its pane keeps it
        assert not pane.idle() and pane.succeeded() is False
    finally:
        wrapper.kill()
        wrapper.wait()
