"""The program and the script a suite's command runs, where the command says so plainly.

A typo in ``python launchers/trian.py --config {config}`` fails every job of the suite the
moment it starts, and a ``git checkout`` that removes the script at 1 a.m. fails the rest of
the night's. Both are one missing file, which gpusched can look for: ``submit`` refuses the
plan, and the daemon holds the suite's launches while the file is gone.

Only a command that plainly runs a script is read: its first word a Python interpreter
(``python``, ``python3.11``, ``/opt/conda/bin/python``) with the script as its first
argument past the interpreter's own options, or a launcher (``torchrun``, ``accelerate
launch``, ``deepspeed``) with the first argument ending in ``.py``; leading ``NAME=value``
assignments and ``env``/``exec``/``nohup``/``time`` are passed over. Anything else (``sh -c``,
``cd x && ...``, ``python -m pkg``, a path with ``$`` or a placeholder in it) names no script,
and nothing is checked.

The program (the first word, past the same assignments and prefixes) is looked for on the PATH
the jobs get, by ``submit`` only: ``torchrun`` from a shell whose environment is not activated
fails every job with ``not found``. Shell words (``cd``, ``if``, ``source``) are not programs.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil

_PYTHON = re.compile(r"python[0-9.]*")
_LAUNCHERS = frozenset({"torchrun", "accelerate", "deepspeed"})
_PREFIXES = frozenset({"env", "exec", "nohup", "time"})
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*", re.DOTALL)
_PYTHON_FLAGS = frozenset({"-u", "-B", "-O", "-OO", "-s", "-S", "-E", "-I", "-q", "-b", "-d", "-v", "-P"})
_PYTHON_FLAGS_WITH_VALUE = frozenset({"-X", "-W"})


#: Words a shell runs itself: no program file to look for.
_SHELL_WORDS = frozenset(
    {
        ".", ":", "[", "[[", "!", "{", "}", "alias", "bg", "break", "case", "cd", "command", "continue",
        "do", "done", "echo", "elif", "else", "esac", "eval", "exit", "export", "false", "fc", "fg", "fi",
        "for", "function", "getopts", "hash", "if", "jobs", "kill", "local", "printf", "pwd", "read",
        "readonly", "return", "select", "set", "shift", "source", "test", "then", "times", "trap", "true",
        "type", "ulimit", "umask", "unalias", "unset", "until", "wait", "while",
    }
)  # fmt: skip


def _words(command: str) -> list[str] | None:
    """The command's words from its program on (``NAME=value`` and ``env``/``exec``/``nohup``/
    ``time`` passed over), or None where a quote is left open."""
    try:
        words = shlex.split(command)
    except ValueError:  # a quote left open: `sh -n` says so at submit
        return None
    while words and (words[0] in _PREFIXES or _ASSIGNMENT.fullmatch(words[0])):
        words = words[1:]
    return words


def program_of(command: str) -> str | None:
    """The program ``command`` starts, as written (``torchrun``, ``./run.sh``,
    ``/opt/conda/bin/python``), or None for a shell word (``cd``, ``if``, ``source``) or a
    word the shell would expand or split (``$PY``, ``(cd``, ``a;b``)."""
    words = _words(command)
    if not words or words[0] in _SHELL_WORDS or words[0].startswith("-"):  # (`env -i ...`: not read)
        return None
    if any(ch in words[0] for ch in "$`{}~*?[]()<>|;&'\""):
        return None
    return words[0]


def missing_program(command: str, workdir: str, path: str) -> str | None:
    """Why the program ``command`` starts would not run, or None: not on ``path`` (the PATH the
    jobs get), or, given as a path (relative to ``workdir``), not an executable file."""
    program = program_of(command)
    if program is None:
        return None
    if "/" not in program:
        return None if shutil.which(program, path=path) else f"runs {program}, which is not on PATH"
    full = os.path.join(workdir, program)
    if not os.path.isfile(full):
        return f"runs {program}, which is not a file"
    if not os.access(full, os.X_OK):
        return f"runs {program}, which is not executable (chmod +x {program})"
    return None


def script_of(command: str) -> str | None:
    """The script ``command`` runs, as written in it (relative to the workdir, or absolute),
    or None where the command does not plainly name one."""
    words = _words(command)
    if not words:
        return None
    program, args = os.path.basename(words[0]), words[1:]
    script: str | None = None
    if _PYTHON.fullmatch(program):
        rest = iter(args)
        for word in rest:
            if word in _PYTHON_FLAGS:
                continue
            if word in _PYTHON_FLAGS_WITH_VALUE:
                next(rest, None)
                continue
            script = word if word.endswith(".py") else None  # -m, -c, "-": no script file
            break
    elif program in _LAUNCHERS:
        script = next((a for a in args if a.endswith(".py") and not a.startswith("-")), None)
    if script is None or any(ch in script for ch in "${}*?[`~"):
        return None
    return script


def missing_script(command: str, workdir: str) -> str | None:
    """The script ``command`` runs when it is not a file (relative to ``workdir``), else None."""
    script = script_of(command)
    if script is None or os.path.isfile(os.path.join(workdir, script)):
        return None
    return script
