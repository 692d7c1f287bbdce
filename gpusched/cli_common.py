"""What the ``gpusched`` commands share: the home directory, the state database, the probe spec
of ``--fake-gpus`` and job references. Light imports only: every command, ``status`` included,
imports this module."""

from __future__ import annotations

import fnmatch
import os
import shutil
import sys
from typing import TYPE_CHECKING, Any

from gpusched.errors import ExecutorError, UsageError, did_you_mean

if TYPE_CHECKING:  # annotations only: the CLI imports its heavy modules lazily
    from gpusched.home import Home
    from gpusched.records import SuiteRow
    from gpusched.store import Store


def _home() -> Home:
    """The state directory, made if need be; UsageError when another machine's daemon runs on
    it (:func:`gpusched.daemon.check_machine`)."""
    from gpusched import daemon
    from gpusched.home import Home  # a record: not imported for --version or --help

    home = Home.from_env().ensure()
    daemon.check_machine(home)
    return home


def _store(*, readonly: bool = False) -> Store:
    """The state database; ``readonly`` (commands that only look) opens it without taking the
    write lock, so that they never wait behind the daemon's transactions."""
    from gpusched.store import Store

    home = _home()
    if readonly and home.db.exists():
        return Store(home.db, readonly=True)
    return Store(home.db)  # created (or migrated) here


def _probe_spec(fake: str | None) -> str | None:
    fake = fake or os.environ.get("GPUSCHED_FAKE_GPUS")
    return f"fake:{fake}" if fake else None


def daemon_probe_spec(info: dict[str, Any] | None) -> str | None:
    """The probe of the running daemon (``daemon.info``), so that a command shows the GPUs it
    schedules on, fake ones included; without a daemon, ``GPUSCHED_FAKE_GPUS`` or the real one."""
    if info and info.get("probe_spec"):
        return str(info["probe_spec"])
    return _probe_spec(None)


def probe_source(fake: str | None, probe: str | None = None) -> str:
    """How a probe was asked for, as the user wrote it: for :func:`refuse_another_probe`."""
    if probe:
        return f"--probe {probe}"
    if fake:
        return f"--fake-gpus {fake}"
    return f"GPUSCHED_FAKE_GPUS={os.environ.get('GPUSCHED_FAKE_GPUS', '')}"


def refuse_another_probe(info: dict[str, Any] | None, requested: str | None, source: str) -> None:
    """UsageError when a probe was asked for (``requested``, from ``source``) and the daemon
    already running (``daemon.info``) places jobs with another: its GPUs, not those asked
    for, would be the ones the jobs get."""
    if not requested or not info or not info.get("ready"):
        return
    want = requested.strip().lower()
    spec, name = str(info.get("probe_spec") or "").strip(), str(info.get("probe") or "")
    if want == spec.lower() or (not want.startswith("fake") and want == name):
        return
    flag = source.split()[0]
    instead = "unset GPUSCHED_FAKE_GPUS" if flag.startswith("GPUSCHED_") else f"leave {flag} out"
    raise UsageError(
        f"{source}: the daemon already running (pid {info.get('pid')}) places jobs with probe "
        f"'{spec or name}', not '{requested}'; stop it with `gpusched daemon stop` (its jobs keep "
        f"running) and try again, or {instead}"
    )


def submitted_suite(name: str, *, only_active: bool = False) -> SuiteRow | None:
    """Suite ``name`` as last submitted to this queue, or None; with ``only_active``, only while
    it still has jobs queued or running: a submit again during its night, without
    ``--gpu-plan``, ``--gpus`` or ``--backend``, keeps its plan, GPUs and backend (a repeated
    command is harmless; it does not put a 2,2,2 night back to one job a GPU), and a finished
    suite submitted again starts from the defaults. Reads the queue; never creates it."""
    from gpusched.home import Home

    db = Home.from_env().db
    if not db.exists():
        return None
    from gpusched.store import ACTIVE_STATES, Store

    store = Store(db, readonly=True)
    try:
        if (
            only_active
            and not store.db.execute(
                "SELECT 1 FROM jobs WHERE suite = ? AND state IN (?, ?) LIMIT 1", (name, *ACTIVE_STATES)
            ).fetchone()
        ):
            return None
        return store.suite(name)
    finally:
        store.close()


def known_suite(store: Store, name: str) -> str:
    """``name`` when a suite of that name was submitted; else UsageError, with the nearest."""
    names = store.suite_names()
    if name not in names:
        raise UsageError(f"--suite {name}: no such suite{did_you_mean(name, names)}")
    return name


def resolve_jobs(store: Store, patterns: list[str]) -> list[str]:
    """Job ids for ids, bare names (when unambiguous) or shell patterns; unknown -> UsageError."""
    ids = [r["id"] for r in store.db.execute("SELECT id FROM jobs ORDER BY seq")]
    out: list[str] = []
    for pat in patterns:
        if pat in ids:
            out.append(pat)
            continue
        hits = [i for i in ids if fnmatch.fnmatchcase(i, pat) or fnmatch.fnmatchcase(i.split("/", 1)[1], pat)]
        if not hits:
            of_suite = [i for i in ids if i.startswith(f"{pat}/")]
            if of_suite:  # `gpusched logs E1`: a suite's name where a job's was meant
                raise UsageError(
                    f"'{pat}' is a suite, not a job: name one of its jobs ({of_suite[0]}, ...),"
                    f" or all of them as '{pat}/*' where a command takes several"
                )
            raise UsageError(f"no job matches '{pat}'{did_you_mean(pat, ids)}: see `gpusched status`")
        if len(hits) > 1 and not any(ch in pat for ch in "*?["):
            raise UsageError(f"'{pat}' is ambiguous ({', '.join(hits[:3])}...): give the full id SUITE/NAME")
        out.extend(h for h in hits if h not in out)
    return out


def terminal() -> tuple[int | None, bool]:
    """Columns to lay tables out in and whether to colour: ``COLUMNS``, else the terminal's
    width (80 where it says 0), else (output into a pipe or a file) None, the tables' own
    width, so that every row stays one line for ``grep``; colour on a terminal unless
    ``NO_COLOR`` or ``TERM=dumb``, or always with ``FORCE_COLOR``."""
    tty = sys.stdout.isatty()
    try:
        width: int | None = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        try:
            # (a terminal of no size, as `script` or some consoles give, says 0: taken as 80)
            width = (os.get_terminal_size(sys.stdout.fileno()).columns or 80) if tty else None
        except (OSError, ValueError):
            width = 80
    env = os.environ
    color = bool(env.get("FORCE_COLOR")) or (tty and not env.get("NO_COLOR") and env.get("TERM") != "dumb")
    return None if width is None else max(width, 20), color


BACKENDS = ("tmux", "subprocess", "slurm")


def default_backend() -> str:
    """tmux when it is on PATH (panes to attach to), plain detached processes otherwise."""
    return "tmux" if shutil.which("tmux") else "subprocess"


def check_backend(name: str) -> str:
    """Validate ``--backend`` before anything is enqueued (here, not beside the executors:
    importing those costs ``submit`` ~9 ms of its start, logging included)."""
    if name not in BACKENDS:
        raise UsageError(
            f"--backend {name}: unknown backend{did_you_mean(name, BACKENDS)}; "
            f"use one of {', '.join(BACKENDS)}"
        )
    if name == "tmux" and not shutil.which("tmux"):
        raise ExecutorError(
            "--backend tmux: tmux is not on PATH; "
            "install it (apt-get install tmux) or use --backend subprocess"
        )
    if name == "slurm":
        from gpusched.executors.slurm import check_available

        check_available()
    return name
