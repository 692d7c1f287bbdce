"""Suite plan files (``plans/NAME.yaml``) turned into a validated :class:`PlannedSuite`.

Pure except that :func:`load_suite` reads the plan file, its base config and checks that
its workdir exists. Every problem is a :class:`PlanError` whose message is ONE line naming
the file and key path (``plans/E1.yaml: tiers[2].batch.scale: ...``), what is wrong, and
how to fix it. The format is documented in ``docs/plan-format.md``.

This module reads the suite-level keys (command, workdir, base_config, env, batch, tiers,
resume, retry, limits); :mod:`gpusched.yamlfields` holds the typed getters and YAML reading,
:mod:`gpusched.matrix` turns ``matrix:``/``job:``/``jobs:`` into jobs, and
:mod:`gpusched.flags` handles ``--pairs``, ``--only``, ``--gpus`` and ``--gpu-plan``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from msgspec import field

from gpusched import matrix, tiers
from gpusched import yamlfields as yf
from gpusched.command import missing_script
from gpusched.errors import did_you_mean
from gpusched.model import BatchKeys, BatchRule, JobSpec, Limits, ResumeSpec, RetryPolicy, Suite, Tier

SUITE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,39}")
TIER_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+=-]{0,31}")
COMMAND_FIELDS = ("config", "job", "suite", "tier", "attempt_dir", "gpu")
MAX_TIERS = 8

_TOP_KEYS = (
    "description", "command", "workdir", "base_config", "env", "config", "batch",
    "matrix", "job", "jobs", "pairs", "tiers", "resume", "retry", "limits", "notify",
)  # fmt: skip
_TIER_KEYS = ("name", "env", "config", "batch", "exclusive", "min_free_mib", "description")


class PlannedSuite(Suite, frozen=True, kw_only=True):
    """A :class:`Suite` as :func:`load_suite` returns it, plus what ``--pairs`` needs:
    ``pairs`` maps each matrix job's name to its pairs-template rendering (explicit jobs
    have none); ``pairs_template`` is that template (None without a matrix)."""

    pairs: Mapping[str, str] = field(default_factory=dict)
    pairs_template: str | None = None


# --------------------------------------------------------------------------- finding the plan


def _display(path: Path, cwd: Path) -> str:
    try:
        return str(path.relative_to(cwd))
    except ValueError:
        return str(path)


def _find_plan(ref: str, cwd: Path) -> Path:
    if ref.endswith((".yaml", ".yml")) or "/" in ref:
        path = Path(os.path.abspath(cwd / Path(ref).expanduser()))
        if not path.is_file():
            kind = "is not a file" if path.exists() else "file not found"
            raise yf.one_line(
                f"{_display(path, cwd)}: {kind}; pass a plan name from plans/ or a path to a .yaml file"
            )
        return path
    plans = cwd / "plans"
    for suffix in (".yaml", ".yml"):
        if (plans / f"{ref}{suffix}").is_file():
            return plans / f"{ref}{suffix}"
    available = sorted({p.stem for p in plans.glob("*.y*ml")}) if plans.is_dir() else []
    if not available:
        raise yf.one_line(
            f"plans/{ref}.yaml: file not found and {plans} has no plans; "
            "run from the project root (the folder holding plans/) or pass a path to a .yaml file"
        )
    raise yf.one_line(
        f"plans/{ref}.yaml: file not found{did_you_mean(ref, available)}; "
        f"plans in {plans}: {', '.join(available)}"
    )


# --------------------------------------------------------------------------- load_suite


def load_suite(ref: str, *, cwd: Path, name: str | None = None) -> Suite:
    """Read and validate a plan. ``ref`` is a suite name (``cwd/plans/NAME.yaml``, then
    ``.yml``) or a path to a .yaml file (relative to ``cwd``). The result has absolute
    ``plan_path``, ``workdir``, ``logs_dir`` (``cwd/logs/<suite>``) and ``base_config``,
    tiers already cumulative, config layers already nested (dotted keys expanded),
    ``env`` = DEFAULT_ENV + the plan's env, and jobs in order: matrix points, then ``jobs:``.
    The returned object is a :class:`PlannedSuite` (a Suite that
    :func:`gpusched.flags.select_jobs` can filter by ``--pairs``)."""
    cwd = Path(os.path.abspath(cwd))
    path = _find_plan(ref, cwd)
    w = yf.Where(_display(path, cwd))
    raw = yf.read_yaml(path, w.file, strict=True)
    if raw is None:
        raise w.error("the plan is empty", "a plan needs at least command: and matrix: or jobs:")
    if not isinstance(raw, Mapping):
        raise w.error(f"must be a mapping of keys (command:, matrix:, ...), got {yf.type_name(raw)}")
    yf.check_keys(w, raw, _TOP_KEYS)
    suite_name = _suite_name(w, name if name is not None else path.stem, from_file=name is None)
    workdir = _workdir(w.at("workdir"), raw.get("workdir"), path.parent, cwd)
    base_path, base_data = _base_config(w.at("base_config"), raw.get("base_config"), workdir, cwd)
    grid = matrix.variables(w, raw)
    jobs, pairs = matrix.matrix_jobs(w, raw, grid, suite_name)
    jobs += matrix.explicit_jobs(w.at("jobs"), raw.get("jobs"), suite_name)
    if not jobs:
        raise w.error("the plan defines no jobs", "add a matrix: (with job:) or a jobs: list")
    matrix.check_unique(w, jobs)
    suite = PlannedSuite(
        name=suite_name,
        plan_path=str(path),
        workdir=str(workdir),
        logs_dir=str(cwd / "logs" / suite_name),
        command=_command(w.at("command"), raw.get("command"), workdir),
        base_config=base_path,
        base_config_data=base_data,
        config=yf.config(w.at("config"), raw.get("config")),
        env=_suite_env(w.at("env"), raw.get("env")),
        tiers=_tiers(w.at("tiers"), raw.get("tiers")),
        batch_keys=_batch_keys(w.at("batch"), raw.get("batch")),
        resume=_resume(w.at("resume"), raw.get("resume")),
        retry=_retry(w.at("retry"), raw.get("retry")),
        limits=_limits(w.at("limits"), raw.get("limits")),
        jobs=tuple(job for job, _ in jobs),
        description=_description(w.at("description"), raw.get("description")),
        notify=None if raw.get("notify") is None else yf.text(w.at("notify"), raw["notify"], _NOTIFY_EXAMPLE),
        pairs=pairs,
        pairs_template=matrix.pairs_template(w, raw, grid),
    )
    _check_resume_dirs(w, suite, jobs)
    return suite


def _suite_name(w: yf.Where, name: str, *, from_file: bool) -> str:
    if SUITE_NAME_RE.fullmatch(name):
        return name
    fix = "rename the plan file" if from_file else "choose another suite name"
    raise w.error(
        f"suite name {yf.show(name)} is not allowed: use letters, digits and _ . - "
        "(starting with a letter or digit, at most 40 characters)",
        fix,
    )


def _workdir(w: yf.Where, value: Any, plan_dir: Path, cwd: Path) -> Path:
    if value is None:
        return cwd
    text = yf.text(w, value, "workdir: ..")
    path = Path(os.path.abspath(plan_dir / Path(text).expanduser()))
    if not path.is_dir():
        raise w.error(
            f"{text!r} resolves to {path}, which is not a directory", "workdir is relative to the plan"
        )
    return path


def _base_config(w: yf.Where, value: Any, workdir: Path, cwd: Path) -> tuple[str | None, dict[str, Any]]:
    if value is None:
        return None, {}
    text = yf.text(w, value, "base_config: configs/base.yaml")
    path = Path(os.path.abspath(workdir / Path(text).expanduser()))
    if not path.is_file():
        raise w.error(
            f"file not found: {text} (resolved to {path})",
            f"fix the path (relative to workdir {workdir}) or remove base_config",
        )
    data = yf.read_yaml(path, _display(path, cwd), strict=False)
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise w.error(f"{text} must hold a mapping of config keys, got {yf.type_name(data)}")
    return str(path), dict(data)


def _command(w: yf.Where, value: Any, workdir: Path) -> str:
    example = "command: python train.py --config {config}"
    if value is None:
        raise w.error("missing: every plan needs the command that starts one job", example)
    text = yf.text(w, value, example)
    names = matrix.placeholders(w, text)
    unknown = [n for n in names if n not in COMMAND_FIELDS]
    if unknown:
        raise w.error(
            f"placeholder {{{unknown[0]}}} is unknown{did_you_mean(unknown[0], COMMAND_FIELDS)}",
            f"allowed: {', '.join('{' + f + '}' for f in COMMAND_FIELDS)}; {matrix.LITERAL_BRACES}",
        )
    if "config" not in names:
        raise w.error(
            "has no {config}: the job would never see its materialized config",
            "pass it the way your trainer reads it, e.g. --config {config}",
        )
    if said := _shell_syntax_error(text.format_map(dict.fromkeys(COMMAND_FIELDS, "x"))):
        raise w.error(f"the shell cannot parse it ({said})", "check its quotes, brackets and if/fi")
    if (script := missing_script(text, str(workdir))) is not None:  # every job would fail at once
        where = "" if os.path.isabs(script) else f" in {workdir} (the workdir)"
        raise w.error(
            f"runs {script}, which is not a file{where}{_near(script, workdir)}",
            "fix the path, or the workdir it is relative to",
        )
    return text


def _near(script: str, workdir: Path) -> str:
    """`` (did you mean 'launchers/train.py'?)`` for a file beside where ``script`` was looked for."""
    folder = os.path.dirname(script)
    try:
        names = os.listdir(workdir / folder)
    except OSError:
        return ""
    return did_you_mean(script, [os.path.join(folder, n) for n in names])


def _shell_syntax_error(command: str) -> str | None:
    """What ``sh -n`` (read, run nothing) says of ``command``, which every job's launch.sh
    runs in sh: a missing quote fails each job at once, so it is found here instead."""
    import subprocess

    try:
        r = subprocess.run(["sh", "-n", "-c", command], capture_output=True, text=True, check=False)
    except OSError:  # no sh to ask here: the jobs' own shell will say
        return None
    if r.returncode == 0:
        return None
    lines = r.stderr.strip().splitlines()
    said = lines[-1] if lines else f"exit {r.returncode}"
    return said.split("Syntax error: ", 1)[-1] if "Syntax error: " in said else said


_NOTIFY_EXAMPLE = """notify: 'curl -s -d "$GPUSCHED_MESSAGE" ntfy.sh/my-lab-gpus'"""


def _description(w: yf.Where, value: Any) -> str:
    return "" if value is None else " ".join(yf.text(w, value, "description: GLUE x seeds").split())


# --------------------------------------------------------------------------- config and env


def _suite_env(w: yf.Where, value: Any) -> dict[str, str]:
    """DEFAULT_ENV, then the plan's env; a ``null`` value drops that variable."""
    merged: dict[str, str | None] = {**tiers.DEFAULT_ENV, **yf.env(w, value, null_ok=True)}
    return {k: v for k, v in merged.items() if v is not None}


def _batch_keys(w: yf.Where, value: Any) -> BatchKeys:
    mapping = yf.mapping(
        w, value, "batch: {size_key: batch_size, accumulation_key: gradient_accumulation_steps}"
    )
    yf.check_keys(w, mapping, ("size_key", "accumulation_key"))
    defaults = BatchKeys()
    size = yf.config_key(w.at("size_key"), mapping.get("size_key", defaults.size))
    accum = yf.config_key(w.at("accumulation_key"), mapping.get("accumulation_key", defaults.accumulation))
    return BatchKeys(size=size, accumulation=accum)


# --------------------------------------------------------------------------- tiers, resume, retry, limits


def _tiers(w: yf.Where, value: Any) -> tuple[Tier, ...]:
    if value is None:
        return tiers.default_tiers()
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_TIERS:
        got = f"{len(value)} tiers" if isinstance(value, list) else yf.type_name(value)
        raise w.error(
            f"must be a list of 1 to {MAX_TIERS} tiers, got {got}", "e.g. tiers: [{name: A}, {name: B}]"
        )
    layers = [_tier_layer(w.at(i), item) for i, item in enumerate(value)]
    names = [layer.name for layer in layers]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise (
                w.at(i).at("name").error(f"tier name {name!r} is used twice", "give every tier its own name")
            )
    return tiers.stack_tiers(layers)


def _tier_layer(w: yf.Where, item: Any) -> tiers.TierLayer:
    if isinstance(item, str):
        item = {"name": item}
    mapping = yf.mapping(w, item, "{name: B, config: {gradient_checkpointing: true}}")
    yf.check_keys(w, mapping, _TIER_KEYS)
    name = mapping.get("name")
    if not isinstance(name, str) or not TIER_NAME_RE.fullmatch(name):
        raise w.at("name").error(
            f"must be a tier name, got {yf.show(name)}",
            "use letters, digits and _ . + = - (starting with a letter or digit, at most 32 characters)",
        )
    placement: dict[str, Any] = {}
    if mapping.get("batch") is not None:
        placement["batch"] = _batch_rule(w.at("batch"), mapping["batch"])
    if "exclusive" in mapping:
        placement["exclusive"] = yf.boolean(w.at("exclusive"), mapping["exclusive"])
    if "min_free_mib" in mapping:
        value = mapping["min_free_mib"]
        placement["min_free_mib"] = (
            None if value is None else yf.whole(w.at("min_free_mib"), value, minimum=0)
        )
    return tiers.TierLayer(
        name=name,
        env=yf.strict_env(w.at("env"), mapping.get("env")),
        config=yf.config(w.at("config"), mapping.get("config")),
        placement=placement,
        description=_description(w.at("description"), mapping.get("description")),
    )


def _batch_rule(w: yf.Where, value: Any) -> BatchRule:
    mapping = yf.mapping(w, value, "batch: {scale: 0.5}")
    yf.check_keys(w, mapping, ("scale", "micro_batch"))
    if len(mapping) != 1:
        raise w.error(
            "give exactly one of scale or micro_batch", "e.g. batch: {scale: 0.5} or batch: {micro_batch: 1}"
        )
    if "scale" in mapping:
        scale = mapping["scale"]
        if isinstance(scale, bool) or not isinstance(scale, int | float) or not 0 < scale <= 1:
            raise w.at("scale").error(
                f"must be a number above 0 and at most 1 (the micro-batch never grows), got {yf.show(scale)}",
                "e.g. scale: 0.5 halves the micro-batch and doubles accumulation",
            )
        return BatchRule(scale=float(scale))
    return BatchRule(micro_batch=yf.whole(w.at("micro_batch"), mapping["micro_batch"], minimum=1))


def _resume(w: yf.Where, value: Any) -> ResumeSpec | None:
    if value is None:
        return None
    mapping = yf.mapping(w, value, "resume: {flag_key: is_keep_training}")
    yf.check_keys(w, mapping, ("checkpoint_glob", "output_dir_key", "flag_key", "path_key"))
    defaults = ResumeSpec()
    spec = ResumeSpec(
        checkpoint_glob=yf.text(
            w.at("checkpoint_glob"), mapping.get("checkpoint_glob", defaults.checkpoint_glob), "checkpoint*"
        ),
        output_dir_key=yf.config_key(
            w.at("output_dir_key"), mapping.get("output_dir_key", defaults.output_dir_key)
        ),
        flag_key=yf.config_key(w.at("flag_key"), mapping.get("flag_key"), null_ok=True),
        path_key=yf.config_key(w.at("path_key"), mapping.get("path_key"), null_ok=True),
    )
    if spec.flag_key is None and spec.path_key is None:
        raise w.error(
            "says neither how to tell the trainer to resume",
            "set flag_key (e.g. is_keep_training) and/or path_key (e.g. resume_from_checkpoint)",
        )
    return spec


def _check_resume_dirs(w: yf.Where, suite: Suite, jobs: Sequence[tuple[JobSpec, str]]) -> None:
    """With resume on, each job needs its own output dir, or jobs resume each other's runs."""
    if suite.resume is None:
        return
    key = suite.resume.output_dir_key
    wk = w.at("resume").at("output_dir_key")
    example = f'e.g. job.config.{key}: "outputs/{{task}}/seed{{seed}}"'
    seen: dict[str, str] = {}
    base = tiers.deep_merge(suite.base_config_data, suite.config)
    for job, _ in jobs:
        out = _output_dir(suite, base, job)
        if out is None:
            raise wk.error(f"job {job.name!r} has no {key}, so its checkpoints cannot be found", example)
        if str(out) in seen:
            what = f"jobs {seen[str(out)]!r} and {job.name!r} share {key} {yf.show(out)}"
            raise wk.error(f"{what}: they would resume from each other's checkpoints", example)
        seen[str(out)] = job.name


def output_dirs(suite: Suite, jobs: Iterable[JobSpec]) -> dict[str, str]:
    """Absolute output dir -> job name, for ``jobs`` of a suite with ``resume:`` (whose
    checkpoints live there); jobs without one are left out."""
    if suite.resume is None:
        return {}
    base = tiers.deep_merge(suite.base_config_data, suite.config)
    found = {}
    for job in jobs:
        if (out := _output_dir(suite, base, job)) is not None:
            found[os.path.normpath(os.path.join(suite.workdir, str(out)))] = job.name
    return found


def _output_dir(suite: Suite, base: dict[str, Any], job: JobSpec) -> Any:
    """The job's ``resume.output_dir_key`` value (None when unset): ``base`` (the base config
    and the suite's, merged once for all jobs) with the job's config over it."""
    assert suite.resume is not None
    return tiers.get_path(tiers.deep_merge(base, job.config), tiers.split_key(suite.resume.output_dir_key))


def _retry(w: yf.Where, value: Any) -> RetryPolicy:
    mapping = yf.mapping(w, value, "retry: {errors: 1, backoff_s: 30}")
    yf.check_keys(w, mapping, ("errors", "backoff_s"))
    defaults = RetryPolicy()
    return RetryPolicy(
        errors=yf.whole(w.at("errors"), mapping.get("errors", defaults.errors), minimum=0),
        backoff_s=yf.number(w.at("backoff_s"), mapping.get("backoff_s", defaults.backoff_s), minimum=0),
    )


def _limits(w: yf.Where, value: Any) -> Limits:
    example = "limits: {time: 6h, silence: 30m, output: 2GiB}"
    mapping = yf.mapping(w, value, example)
    yf.check_keys(w, mapping, ("time", "silence", "output"))
    time_s, silence_s = (
        None if mapping.get(key) is None else yf.duration(w.at(key), mapping[key], example)
        for key in ("time", "silence")
    )
    output = mapping.get("output")
    output_mib = None if output is None else yf.size_mib(w.at("output"), output, example)
    return Limits(time_s=time_s, silence_s=silence_s, output_mib=output_mib)
