"""The submit flags that narrow a suite and name its GPUs, turned into validated values:
``--pairs`` / ``--only`` (:func:`select_jobs`) and ``--gpus`` / ``--gpu-plan``
(:func:`parse_gpus`, :func:`parse_gpu_plan`).

Pure. Every problem is a :class:`PlanError` whose message is ONE line naming the flag and
the value given, what is wrong, and how to fix it.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping, Sequence

from msgspec.structs import replace

from gpusched import plan
from gpusched import yamlfields as yf
from gpusched.errors import PlanError, did_you_mean
from gpusched.model import GpuPlan, Suite

# --------------------------------------------------------------------------- --pairs / --only


def select_jobs(suite: Suite, *, pairs: str | None = None, only: str | None = None) -> Suite:
    """The suite with only the jobs picked by ``--pairs`` (comma-separated, each compared
    exactly with a matrix job's pairs rendering, e.g. ``87:glue-tvt_qnli``) and ``--only``
    (comma-separated fnmatch patterns on job names); both given: a job must pass both.
    Order is kept. PlanError naming any entry that matches no job of the suite."""
    keep = list(suite.jobs)
    rendered: Mapping[str, str] = getattr(suite, "pairs", {})
    if pairs is not None:
        wanted = _flag_list("--pairs", pairs, "87:glue-tvt_qnli,88:glue-tvt_sst2")
        _check_pairs(suite, wanted, rendered)
        keep = [j for j in keep if rendered.get(j.name) in wanted]
    if only is not None:
        patterns = _flag_list("--only", only, "'87-*,*-glue-tvt_rte'")
        names = [j.name for j in suite.jobs]
        for pattern in patterns:
            if not fnmatch.filter(names, pattern) and pattern not in names:
                raise yf.one_line(
                    f"--only {pattern}: matches no job of suite {suite.name}{did_you_mean(pattern, names)}; "
                    f"jobs look like {_examples(names)}"
                )
        keep = [j for j in keep if any(fnmatch.fnmatchcase(j.name, p) for p in patterns)]
    if not keep:
        raise PlanError(
            f"--pairs {pairs} and --only {only}: no job of suite {suite.name} passes both; widen one"
        )
    kept = {j.name for j in keep}
    if isinstance(suite, plan.PlannedSuite):
        return replace(suite, jobs=tuple(keep), pairs={k: v for k, v in rendered.items() if k in kept})
    return replace(suite, jobs=tuple(keep))


def _check_pairs(suite: Suite, wanted: Sequence[str], rendered: Mapping[str, str]) -> None:
    if not isinstance(suite, plan.PlannedSuite):
        raise PlanError(
            f"--pairs: suite {suite.name} was not loaded from its plan file; pick jobs with --only"
        )
    if not rendered:
        raise PlanError(
            f"--pairs: suite {suite.name} has no matrix, so no job has a pair; pick jobs with --only NAME"
        )
    template = getattr(suite, "pairs_template", None) or ""
    shape = template.replace("{", "").replace("}", "")
    available = list(dict.fromkeys(rendered.values()))
    for pair in wanted:
        if pair not in available:
            raise PlanError(
                f"--pairs {pair}: no job of suite {suite.name} has this pair{did_you_mean(pair, available)}; "
                f"pairs read as {shape}, e.g. {_examples(available)}"
            )


def _flag_list(flag: str, text: str, example: str) -> list[str]:
    items = [part.strip() for part in text.split(",") if part.strip()]
    if not items:
        raise PlanError(f"{flag} {text!r}: nothing listed; e.g. {flag} {example}")
    return items


def _examples(values: Sequence[str], n: int = 3) -> str:
    head = ", ".join(values[:n])
    return head + (f" ... ({len(values)} in all)" if len(values) > n else "")


# --------------------------------------------------------------------------- --gpus / --gpu-plan


def parse_gpus(text: str | None, *, detected: int | None) -> tuple[int, ...] | None:
    """``--gpus "0,1,2"`` / ``"0 1 2"`` / ``"4-6"`` -> GPU indices in the order given; None
    when ``text`` is None. Rejects negatives, duplicates, and (when ``detected`` is known)
    indices the machine does not have."""
    if text is None:
        return None
    out: list[int] = []
    for token in _entries("--gpus", text, "0,1,2 or --gpus 0-3"):
        out.extend(_gpu_entry(text, token))
    for i, gpu in enumerate(out):
        if gpu in out[:i]:
            raise PlanError(f"--gpus {text}: GPU {gpu} is listed twice; list each GPU once")
    if detected is not None:
        for gpu in out:
            if gpu >= detected:
                raise PlanError(
                    f"--gpus {text}: GPU {gpu} does not exist: this machine has {_have(detected)}"
                )
    return tuple(out)


def _gpu_entry(text: str, token: str) -> list[int]:
    if token.isascii() and token.isdigit():  # not "²": str.isdigit() takes it, int() does not
        return [int(token)]
    span = re.fullmatch(r"([0-9]+)-([0-9]+)", token)
    if span and int(span.group(1)) <= int(span.group(2)) and int(span.group(2)) - int(span.group(1)) < 1024:
        return list(range(int(span.group(1)), int(span.group(2)) + 1))
    if re.fullmatch(r"-[0-9]+", token):
        raise PlanError(f"--gpus {text}: {token} is negative; GPU indices start at 0 (see nvidia-smi)")
    if span:
        raise PlanError(f"--gpus {text}: range {token} runs backwards; write it low-high, e.g. 4-6")
    raise PlanError(f"--gpus {text}: {token!r} is not a GPU index; write e.g. --gpus 0,1,2 or --gpus 0-3")


def _have(detected: int) -> str:
    if detected == 0:
        return "no GPUs"
    return f"{detected} GPU{'s' if detected != 1 else ''} ({'0' if detected == 1 else f'0-{detected - 1}'})"


def _entries(flag: str, text: str, example: str) -> list[str]:
    """Comma-separated (spaces around entries tolerated) or whitespace-separated entries."""
    parts = [p.strip() for p in text.split(",")] if "," in text else text.split()
    if not parts:
        raise PlanError(f"{flag} {text!r}: nothing given; e.g. {flag} {example}")
    for i, part in enumerate(parts, 1):
        if not part:
            raise PlanError(f"{flag} {text!r}: entry {i} is empty; e.g. {flag} {example}")
    return parts


def parse_gpu_plan(text: str, *, gpus: tuple[int, ...] | None, detected: int | None) -> GpuPlan:
    """``--gpu-plan "2,2,1"``: the most jobs at once on each GPU, in the order of ``gpus``
    (or GPUs 0..n-1 when ``gpus`` is None). Strict: one entry per GPU (no broadcasting of a
    single number), every entry a whole number >= 0, at least one above 0."""
    example = "--gpu-plan 2,2,1"
    slots = []
    for i, entry in enumerate(_entries("--gpu-plan", text, "2,2,1"), 1):
        if not (entry.isascii() and entry.isdigit()):
            raise PlanError(
                f"--gpu-plan {text}: entry {i} {entry!r} is not a whole number >= 0 "
                f"(the most jobs at once on that GPU); e.g. {example}"
            )
        slots.append(int(entry))
    if gpus is not None and len(slots) != len(gpus):
        raise PlanError(
            f"--gpu-plan {text}: {len(slots)} entries for the {len(gpus)} GPUs of --gpus "
            f"{','.join(map(str, gpus))}; give one entry per GPU (a single number is not repeated)"
        )
    if gpus is None:
        if detected is not None and len(slots) > detected:
            raise PlanError(
                f"--gpu-plan {text}: {len(slots)} entries but this machine has {_have(detected)}; "
                "give one entry per GPU, or name the GPUs with --gpus"
            )
        gpus = tuple(range(len(slots)))
    if not any(slots):
        raise PlanError(
            f"--gpu-plan {text}: every GPU has 0 slots, so nothing could run; give a GPU at least 1"
        )
    return GpuPlan(gpus=gpus, slots=tuple(slots))
