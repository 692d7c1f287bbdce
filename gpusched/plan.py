"""Suite plan files (``plans/NAME.yaml``) and plan-like flags (``--gpus``, ``--gpu-plan``,
``--pairs``, ``--only``) turned into validated plain values.

Pure except that :func:`load_suite` reads the plan file, its base config and checks that
its workdir exists. Every problem is a :class:`PlanError` whose message is ONE line naming
the file and key path (``plans/E1.yaml: tiers[2].batch.scale: ...``) or the flag, what is
wrong, and how to fix it. The format is documented in ``docs/plan-format.md``.
"""

from __future__ import annotations

import fnmatch
import itertools
import math
import os
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from gpusched import tiers
from gpusched.errors import PlanError, did_you_mean
from gpusched.model import BatchKeys, BatchRule, GpuPlan, JobSpec, ResumeSpec, RetryPolicy, Suite, Tier

SUITE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,39}")
JOB_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+=-]{0,79}")
TIER_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+=-]{0,31}")
ENV_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
VAR_RE = ENV_KEY_RE  # matrix variable names: usable as {placeholders}
COMMAND_FIELDS = ("config", "job", "suite", "tier", "attempt_dir", "gpu")
MAX_MATRIX_JOBS = 10_000
MAX_TIERS = 8

_TOP_KEYS = (
    "description", "command", "workdir", "base_config", "env", "config", "batch",
    "matrix", "job", "jobs", "pairs", "tiers", "resume", "retry",
)  # fmt: skip
_JOB_BLOCK_KEYS = ("name", "task", "config", "env", "priority")
_TIER_KEYS = ("name", "env", "config", "batch", "exclusive", "min_free_mib", "description")
_SCALARS = (str, int, float, bool)
_LITERAL_BRACES = "write {{ and }} for a literal brace"


@dataclass(frozen=True, kw_only=True)
class PlannedSuite(Suite):
    """A :class:`Suite` as :func:`load_suite` returns it, plus what ``--pairs`` needs:
    ``pairs`` maps each matrix job's name to its pairs-template rendering (explicit jobs
    have none); ``pairs_template`` is that template (None without a matrix)."""

    pairs: Mapping[str, str] = field(default_factory=dict)
    pairs_template: str | None = None


# --------------------------------------------------------------------------- error locations


@dataclass(frozen=True)
class _Where:
    """A place in a plan file; :meth:`error` builds the one-line PlanError for it."""

    file: str
    path: str = ""

    def at(self, key: str | int) -> _Where:
        if isinstance(key, int):
            return _Where(self.file, f"{self.path}[{key}]")
        return _Where(self.file, f"{self.path}.{key}" if self.path else str(key))

    def error(self, what: str, fix: str = "") -> PlanError:
        where = f"{self.file}: {self.path}" if self.path else self.file
        return _one_line(f"{where}: {what}" + (f"; {fix}" if fix else ""))


def _one_line(message: str) -> PlanError:
    return PlanError(" ".join(message.split("\n")))


def _show(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _type_name(value: Any) -> str:
    names = {dict: "a mapping", list: "a list", str: "text", bool: "true/false", type(None): "empty"}
    return names.get(type(value), f"a {type(value).__name__}")


# --------------------------------------------------------------------------- typed getters


def _check_keys(w: _Where, raw: Mapping[Any, Any], allowed: Sequence[str]) -> None:
    for key in raw:
        if key not in allowed:
            hint = did_you_mean(str(key), allowed)
            raise w.at(str(key)).error(f"unknown key{hint}", f"allowed keys here: {', '.join(allowed)}")


def _mapping(w: _Where, value: Any, example: str) -> Mapping[Any, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise w.error(f"must be a mapping, got {_type_name(value)} {_show(value)}", f"e.g. {example}")
    return value


def _text(w: _Where, value: Any, example: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise w.error(f"must be non-empty text, got {_type_name(value)} {_show(value)}", f"e.g. {example}")
    return value


def _whole(w: _Where, value: Any, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise w.error(f"must be a whole number >= {minimum}, got {_show(value)}")
    return value


def _number(w: _Where, value: Any, *, minimum: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= minimum:
        raise w.error(f"must be a number >= {minimum:g}, got {_show(value)}")
    return float(value)


def _bool(w: _Where, value: Any) -> bool:
    if not isinstance(value, bool):
        raise w.error(f"must be true or false, got {_show(value)}")
    return value


def _single_line(w: _Where, value: Any, example: str) -> str:
    text = _text(w, value, example)
    if "\n" in text.strip():
        raise w.error("must be a single line", f"e.g. {example}")
    return text.strip()


# --------------------------------------------------------------------------- reading files


class _PlanLoader(yaml.SafeLoader):
    """safe_load, except that a key written twice in one mapping is an error, not a silent
    overwrite (two ``config:`` blocks are a common copy-paste slip)."""


def _no_duplicates(loader: _PlanLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if not isinstance(key, str | int | float | bool):
            continue  # unhashable keys: construct_mapping reports them
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} appears twice in the same mapping", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node)


_PlanLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)


def _read_yaml(path: Path, shown: str, *, strict: bool) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise _one_line(f"{shown}: cannot be read ({exc})") from None
    try:
        return yaml.load(text, Loader=_PlanLoader if strict else yaml.SafeLoader)  # both loaders are safe
    except yaml.YAMLError as exc:
        raise _yaml_error(shown, exc) from None


def _yaml_error(shown: str, exc: yaml.YAMLError) -> PlanError:
    mark = getattr(exc, "problem_mark", None)
    where = f"{shown}:{mark.line + 1}:{mark.column + 1}" if mark else shown
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    what = f"{problem} ({context})" if context else problem
    line = f"line {mark.line + 1}" if mark else "the file"
    fix = f"check indentation, colons and quotes near {line}"
    if "appears twice" in what:
        fix = "keep one of them (merge their contents)"
    return _one_line(f"{where}: not valid YAML: {what}; {fix}")


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
            raise _one_line(
                f"{_display(path, cwd)}: {kind}; pass a plan name from plans/ or a path to a .yaml file"
            )
        return path
    plans = cwd / "plans"
    for suffix in (".yaml", ".yml"):
        if (plans / f"{ref}{suffix}").is_file():
            return plans / f"{ref}{suffix}"
    available = sorted({p.stem for p in plans.glob("*.y*ml")}) if plans.is_dir() else []
    if not available:
        raise _one_line(
            f"plans/{ref}.yaml: file not found and {plans} has no plans; "
            "run from the project root (the folder holding plans/) or pass a path to a .yaml file"
        )
    raise _one_line(
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
    The returned object is a :class:`PlannedSuite` (a Suite that :func:`select_jobs` can
    filter by ``--pairs``)."""
    cwd = Path(os.path.abspath(cwd))
    path = _find_plan(ref, cwd)
    w = _Where(_display(path, cwd))
    raw = _read_yaml(path, w.file, strict=True)
    if raw is None:
        raise w.error("the plan is empty", "a plan needs at least command: and matrix: or jobs:")
    if not isinstance(raw, Mapping):
        raise w.error(f"must be a mapping of keys (command:, matrix:, ...), got {_type_name(raw)}")
    _check_keys(w, raw, _TOP_KEYS)
    suite_name = _suite_name(w, name if name is not None else path.stem, from_file=name is None)
    workdir = _workdir(w.at("workdir"), raw.get("workdir"), path.parent, cwd)
    base_path, base_data = _base_config(w.at("base_config"), raw.get("base_config"), workdir, cwd)
    matrix = _matrix(w, raw)
    jobs, pairs = _matrix_jobs(w, raw, matrix, suite_name)
    jobs += _explicit_jobs(w.at("jobs"), raw.get("jobs"), suite_name)
    if not jobs:
        raise w.error("the plan defines no jobs", "add a matrix: (with job:) or a jobs: list")
    _check_unique(w, jobs)
    suite = PlannedSuite(
        name=suite_name,
        plan_path=str(path),
        workdir=str(workdir),
        logs_dir=str(cwd / "logs" / suite_name),
        command=_command(w.at("command"), raw.get("command")),
        base_config=base_path,
        base_config_data=base_data,
        config=_config(w.at("config"), raw.get("config")),
        env=_suite_env(w.at("env"), raw.get("env")),
        tiers=_tiers(w.at("tiers"), raw.get("tiers")),
        batch_keys=_batch_keys(w.at("batch"), raw.get("batch")),
        resume=_resume(w.at("resume"), raw.get("resume")),
        retry=_retry(w.at("retry"), raw.get("retry")),
        jobs=tuple(job for job, _ in jobs),
        description=_description(w.at("description"), raw.get("description")),
        pairs=pairs,
        pairs_template=_pairs_template(w, raw, matrix),
    )
    _check_resume_dirs(w, suite, jobs)
    return suite


def _suite_name(w: _Where, name: str, *, from_file: bool) -> str:
    if SUITE_NAME_RE.fullmatch(name):
        return name
    fix = "rename the plan file" if from_file else "choose another suite name"
    raise w.error(
        f"suite name {_show(name)} is not allowed: use letters, digits and _ . - "
        "(starting with a letter or digit, at most 40 characters)",
        fix,
    )


def _workdir(w: _Where, value: Any, plan_dir: Path, cwd: Path) -> Path:
    if value is None:
        return cwd
    text = _text(w, value, "workdir: ..")
    path = Path(os.path.abspath(plan_dir / Path(text).expanduser()))
    if not path.is_dir():
        raise w.error(
            f"{text!r} resolves to {path}, which is not a directory", "workdir is relative to the plan"
        )
    return path


def _base_config(w: _Where, value: Any, workdir: Path, cwd: Path) -> tuple[str | None, dict[str, Any]]:
    if value is None:
        return None, {}
    text = _text(w, value, "base_config: configs/base.yaml")
    path = Path(os.path.abspath(workdir / Path(text).expanduser()))
    if not path.is_file():
        raise w.error(
            f"file not found: {text} (resolved to {path})",
            f"fix the path (relative to workdir {workdir}) or remove base_config",
        )
    data = _read_yaml(path, _display(path, cwd), strict=False)
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise w.error(f"{text} must hold a mapping of config keys, got {_type_name(data)}")
    return str(path), dict(data)


def _command(w: _Where, value: Any) -> str:
    example = "command: python train.py --config {config}"
    if value is None:
        raise w.error("missing: every plan needs the command that starts one job", example)
    text = _text(w, value, example)
    names = _placeholders(w, text)
    unknown = [n for n in names if n not in COMMAND_FIELDS]
    if unknown:
        raise w.error(
            f"placeholder {{{unknown[0]}}} is unknown{did_you_mean(unknown[0], COMMAND_FIELDS)}",
            f"allowed: {', '.join('{' + f + '}' for f in COMMAND_FIELDS)}; {_LITERAL_BRACES}",
        )
    if "config" not in names:
        raise w.error(
            "has no {config}: the job would never see its materialized config",
            "pass it the way your trainer reads it, e.g. --config {config}",
        )
    return text


def _placeholders(w: _Where, template: str, *, bare: bool = True) -> list[str]:
    """Names of the ``{fields}`` in a template. With ``bare``, a field may not carry a
    format spec or conversion (``{gpu:>3}``): command values are shell-quoted text."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise w.error(f"malformed template {_show(template)}: {exc}", _LITERAL_BRACES) from None
    names = []
    for _, field_name, spec, conversion in parsed:
        if field_name is None:
            continue
        if not VAR_RE.fullmatch(field_name) or (bare and (spec or conversion)):
            shown = field_name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "")
            raise w.error(f"placeholder {{{shown}}} must be a plain {{name}}", _LITERAL_BRACES)
        names.append(field_name)
    return names


def _description(w: _Where, value: Any) -> str:
    return "" if value is None else " ".join(_text(w, value, "description: GLUE x seeds").split())


# --------------------------------------------------------------------------- config and env


def _config(w: _Where, value: Any) -> dict[str, Any]:
    """A config overlay, nested (dotted keys expanded)."""
    mapping = _mapping(w, value, "config: {max_steps: 200, optimizer.lr: 1.0e-4}")
    try:
        return tiers.expand_dotted(mapping)
    except ValueError as exc:
        raise w.error(
            str(exc), "write each key once (optimizer.lr, or optimizer: {lr: ...}, not both)"
        ) from None


def _env(w: _Where, value: Any, *, null_ok: bool = False) -> dict[str, str | None]:
    mapping = _mapping(w, value, "env: {NUM_DATA_WORKERS: 2}")
    out: dict[str, str | None] = {}
    for key, val in mapping.items():
        if not isinstance(key, str) or not ENV_KEY_RE.fullmatch(key):
            raise w.at(str(key)).error(
                "is not a valid environment variable name",
                "use letters, digits and _, not starting with a digit",
            )
        out[key] = _env_value(w.at(key), val, null_ok=null_ok)
    return out


def _env_value(w: _Where, value: Any, *, null_ok: bool) -> str | None:
    if value is None and null_ok:
        return None
    if not isinstance(value, _SCALARS):
        what = f"must be a single value (text, number, true/false), got {_type_name(value)}"
        raise w.error(
            what, "quote it to pass it as text" + ("; null drops a default variable" if null_ok else "")
        )
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _strict_env(w: _Where, value: Any) -> dict[str, str]:
    return {k: v for k, v in _env(w, value).items() if v is not None}


def _suite_env(w: _Where, value: Any) -> dict[str, str]:
    """DEFAULT_ENV, then the plan's env; a ``null`` value drops that variable."""
    merged: dict[str, str | None] = {**tiers.DEFAULT_ENV, **_env(w, value, null_ok=True)}
    return {k: v for k, v in merged.items() if v is not None}


def _batch_keys(w: _Where, value: Any) -> BatchKeys:
    mapping = _mapping(
        w, value, "batch: {size_key: batch_size, accumulation_key: gradient_accumulation_steps}"
    )
    _check_keys(w, mapping, ("size_key", "accumulation_key"))
    defaults = BatchKeys()
    size = _config_key(w.at("size_key"), mapping.get("size_key", defaults.size))
    accum = _config_key(w.at("accumulation_key"), mapping.get("accumulation_key", defaults.accumulation))
    return BatchKeys(size=size, accumulation=accum)


def _config_key(w: _Where, value: Any, *, null_ok: bool = False) -> Any:
    if value is None and null_ok:
        return None
    text = _text(w, value, "batch_size (a config key; dots for nesting)")
    try:
        tiers.split_key(text)
    except ValueError as exc:
        raise w.error(str(exc)) from None
    return text


# --------------------------------------------------------------------------- matrix and jobs


def _matrix(w: _Where, raw: Mapping[str, Any]) -> dict[str, list[Any]]:
    if raw.get("matrix") is None:
        for key in ("job", "pairs"):
            if raw.get(key) is not None:
                raise w.at(key).error(
                    "applies to matrix points, but the plan has no matrix:", "add a matrix:"
                )
        return {}
    wm = w.at("matrix")
    mapping = _mapping(wm, raw["matrix"], "matrix: {seed: [87, 88], task: [a, b]}")
    if not mapping:
        raise wm.error("is empty", "give each variable a list of values, e.g. seed: [87, 88]")
    matrix = {_matrix_var(wm, k): _matrix_values(wm.at(k), v) for k, v in mapping.items()}
    total = math.prod(len(v) for v in matrix.values())
    if total > MAX_MATRIX_JOBS:
        raise wm.error(
            f"makes {total} jobs, more than {MAX_MATRIX_JOBS}", "split the suite into several plans"
        )
    return matrix


def _matrix_var(w: _Where, key: Any) -> str:
    if not isinstance(key, str) or not VAR_RE.fullmatch(key):
        raise w.at(str(key)).error(
            "is not a usable variable name", "use letters, digits and _ (e.g. seed, task)"
        )
    return key


def _matrix_values(w: _Where, value: Any) -> list[Any]:
    values = value if isinstance(value, list) else None
    if not values:
        raise w.error(f"must be a non-empty list of values, got {_show(value)}", "e.g. [87, 88, 89]")
    seen: set[tuple[type, Any]] = set()
    for i, item in enumerate(values):
        if not isinstance(item, _SCALARS):
            raise w.at(i).error(f"must be a single value (text, number), got {_type_name(item)}")
        if (type(item), item) in seen:
            raise w.at(i).error(f"{_show(item)} is listed twice", "list each value once")
        seen.add((type(item), item))
    return values


def _matrix_jobs(
    w: _Where, raw: Mapping[str, Any], matrix: dict[str, list[Any]], suite: str
) -> tuple[list[tuple[JobSpec, str]], dict[str, str]]:
    """(job, origin) for every matrix point, and job name -> pairs rendering."""
    if not matrix:
        return [], {}
    wj = w.at("job")
    block = _mapping(wj, raw.get("job"), 'job: {name: "{seed}-{task}", config: {seed: "{seed}"}}')
    _check_keys(wj, block, _JOB_BLOCK_KEYS)
    names = list(matrix)
    templates = {
        "name": block.get("name", "-".join("{" + n + "}" for n in names)),
        "task": block.get("task"),
        "config": _mapping(wj.at("config"), block.get("config"), 'config: {seed: "{seed}"}'),
        "env": _mapping(wj.at("env"), block.get("env"), 'env: {TASK: "{task}"}'),
        "priority": block.get("priority", 0),
        "pairs": _pairs_template(w, raw, matrix),
    }
    for key, template in templates.items():
        where = w.at("pairs") if key == "pairs" else wj.at(key)
        _check_template(where, template, names)
    jobs, pairs = [], {}
    for point in itertools.product(*matrix.values()):
        values = dict(zip(names, point, strict=True))
        job = _matrix_job(wj, templates, values, suite)
        jobs.append((job, f"matrix point {_point(values)}"))
        pairs[job.name] = str(_render(w.at("pairs"), templates["pairs"], values))
    return jobs, pairs


def _pairs_template(w: _Where, raw: Mapping[str, Any], matrix: dict[str, list[Any]]) -> str | None:
    if not matrix:
        return None
    if raw.get("pairs") is None:
        return ":".join("{" + n + "}" for n in matrix)
    return _text(w.at("pairs"), raw["pairs"], 'pairs: "{seed}:{task}"')


def _matrix_job(wj: _Where, t: Mapping[str, Any], values: dict[str, Any], suite: str) -> JobSpec:
    name = str(_render(wj.at("name"), t["name"], values))
    _check_job_name(wj.at("name"), name, _point(values))
    task = name if t["task"] is None else _task(wj.at("task"), _render(wj.at("task"), t["task"], values))
    return JobSpec(
        suite=suite,
        name=name,
        task=task,
        config=_config(wj.at("config"), _render(wj.at("config"), t["config"], values)),
        env=_strict_env(wj.at("env"), _render(wj.at("env"), t["env"], values)),
        priority=_priority(wj.at("priority"), _render(wj.at("priority"), t["priority"], values)),
    )


def _point(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={_show(v)}" for k, v in values.items())


_SINGLE_RE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _check_template(w: _Where, template: Any, names: Sequence[str]) -> None:
    """Every placeholder in ``template`` (a value, or mappings/lists of them) is a matrix var."""
    if isinstance(template, Mapping):
        for key, value in template.items():
            _check_template(w.at(str(key)), value, names)
    elif isinstance(template, list):
        for i, value in enumerate(template):
            _check_template(w.at(i), value, names)
    elif isinstance(template, str):
        for name in _placeholders(w, template, bare=False):
            if name not in names:
                raise w.error(
                    f"placeholder {{{name}}} is not a matrix variable{did_you_mean(name, names)}",
                    f"matrix variables: {', '.join(names)}; {_LITERAL_BRACES}",
                )


def _render(w: _Where, template: Any, values: Mapping[str, Any]) -> Any:
    """Fill a template. A text that is exactly one ``{var}`` keeps the value's type."""
    if isinstance(template, Mapping):
        return {k: _render(w.at(str(k)), v, values) for k, v in template.items()}
    if isinstance(template, list):
        return [_render(w.at(i), v, values) for i, v in enumerate(template)]
    if not isinstance(template, str):
        return template
    single = _SINGLE_RE.fullmatch(template)
    if single:
        return values[single.group(1)]
    try:
        return template.format_map(values)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
        raise w.error(f"cannot fill {_show(template)} for {_point(values)}: {exc}") from None


def _check_job_name(w: _Where, name: str, origin: str) -> None:
    if JOB_NAME_RE.fullmatch(name):
        return
    bad = sorted({c for c in name if not re.fullmatch(r"[A-Za-z0-9_.+=-]", c)})
    what = (
        f"has characters that are not allowed: {', '.join(repr(c) for c in bad)}" if bad else "is not allowed"
    )
    if not name:
        what = "is empty"
    elif len(name) > 80:
        what = f"is {len(name)} characters long"
    raise w.error(
        f"job name {_show(name)} ({origin}) {what}",
        "use letters, digits and _ . + = - (starting with a letter or digit, at most 80 characters)",
    )


def _task(w: _Where, value: Any) -> str:
    if not isinstance(value, _SCALARS) or isinstance(value, bool) or not str(value).strip():
        raise w.error(f"must be text (the prediction key siblings share), got {_show(value)}")
    return _single_line(w, str(value), 'task: "{task}"')


def _priority(w: _Where, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise w.error(f"must be a whole number (higher runs first), got {_show(value)}")
    return value


def _explicit_jobs(w: _Where, value: Any, suite: str) -> list[tuple[JobSpec, str]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise w.error(
            f"must be a list of jobs, got {_type_name(value)}", "e.g. jobs: [{name: run1, config: {}}]"
        )
    return [(_explicit_job(w.at(i), item, suite), f"jobs[{i}]") for i, item in enumerate(value)]


def _explicit_job(w: _Where, item: Any, suite: str) -> JobSpec:
    mapping = _mapping(w, item, "{name: run1, task: glue-tvt_qnli, config: {seed: 87}}")
    _check_keys(w, mapping, _JOB_BLOCK_KEYS)
    if mapping.get("name") is None:
        raise w.at("name").error("missing: every job in jobs: needs a name", "e.g. name: 87-glue-tvt_qnli")
    raw_name = mapping["name"]
    if not isinstance(raw_name, str | int) or isinstance(raw_name, bool):
        raise w.at("name").error(f"must be text, got {_type_name(raw_name)}")
    name = str(raw_name)
    _check_job_name(w.at("name"), name, "in jobs:")
    return JobSpec(
        suite=suite,
        name=name,
        task=name if mapping.get("task") is None else _task(w.at("task"), mapping["task"]),
        config=_config(w.at("config"), mapping.get("config")),
        env=_strict_env(w.at("env"), mapping.get("env")),
        priority=_priority(w.at("priority"), mapping.get("priority", 0)),
    )


def _check_unique(w: _Where, jobs: Sequence[tuple[JobSpec, str]]) -> None:
    seen: dict[str, str] = {}
    for job, origin in jobs:
        if job.name in seen:
            key = f"{origin}.name" if origin.startswith("jobs[") else "job.name"
            raise w.at(key).error(
                f"job name {job.name!r} is used twice ({seen[job.name]} and {origin})",
                "give every job its own name (e.g. include every matrix variable in job.name)",
            )
        seen[job.name] = origin


# --------------------------------------------------------------------------- tiers, resume, retry


def _tiers(w: _Where, value: Any) -> tuple[Tier, ...]:
    if value is None:
        return tiers.default_tiers()
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_TIERS:
        got = f"{len(value)} tiers" if isinstance(value, list) else _type_name(value)
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


def _tier_layer(w: _Where, item: Any) -> tiers.TierLayer:
    if isinstance(item, str):
        item = {"name": item}
    mapping = _mapping(w, item, "{name: B, config: {gradient_checkpointing: true}}")
    _check_keys(w, mapping, _TIER_KEYS)
    name = mapping.get("name")
    if not isinstance(name, str) or not TIER_NAME_RE.fullmatch(name):
        raise w.at("name").error(
            f"must be a tier name, got {_show(name)}",
            "use letters, digits and _ . + = - (starting with a letter or digit, at most 32 characters)",
        )
    placement: dict[str, Any] = {}
    if mapping.get("batch") is not None:
        placement["batch"] = _batch_rule(w.at("batch"), mapping["batch"])
    if "exclusive" in mapping:
        placement["exclusive"] = _bool(w.at("exclusive"), mapping["exclusive"])
    if "min_free_mib" in mapping:
        value = mapping["min_free_mib"]
        placement["min_free_mib"] = None if value is None else _whole(w.at("min_free_mib"), value, minimum=0)
    return tiers.TierLayer(
        name=name,
        env=_strict_env(w.at("env"), mapping.get("env")),
        config=_config(w.at("config"), mapping.get("config")),
        placement=placement,
        description=_description(w.at("description"), mapping.get("description")),
    )


def _batch_rule(w: _Where, value: Any) -> BatchRule:
    mapping = _mapping(w, value, "batch: {scale: 0.5}")
    _check_keys(w, mapping, ("scale", "micro_batch"))
    if len(mapping) != 1:
        raise w.error(
            "give exactly one of scale or micro_batch", "e.g. batch: {scale: 0.5} or batch: {micro_batch: 1}"
        )
    if "scale" in mapping:
        scale = mapping["scale"]
        if isinstance(scale, bool) or not isinstance(scale, int | float) or not 0 < scale <= 1:
            raise w.at("scale").error(
                f"must be a number above 0 and at most 1 (the micro-batch never grows), got {_show(scale)}",
                "e.g. scale: 0.5 halves the micro-batch and doubles accumulation",
            )
        return BatchRule(scale=float(scale))
    return BatchRule(micro_batch=_whole(w.at("micro_batch"), mapping["micro_batch"], minimum=1))


def _resume(w: _Where, value: Any) -> ResumeSpec | None:
    if value is None:
        return None
    mapping = _mapping(w, value, "resume: {flag_key: is_keep_training}")
    _check_keys(w, mapping, ("checkpoint_glob", "output_dir_key", "flag_key", "path_key"))
    defaults = ResumeSpec()
    spec = ResumeSpec(
        checkpoint_glob=_text(
            w.at("checkpoint_glob"), mapping.get("checkpoint_glob", defaults.checkpoint_glob), "checkpoint*"
        ),
        output_dir_key=_config_key(
            w.at("output_dir_key"), mapping.get("output_dir_key", defaults.output_dir_key)
        ),
        flag_key=_config_key(w.at("flag_key"), mapping.get("flag_key"), null_ok=True),
        path_key=_config_key(w.at("path_key"), mapping.get("path_key"), null_ok=True),
    )
    if spec.flag_key is None and spec.path_key is None:
        raise w.error(
            "says neither how to tell the trainer to resume",
            "set flag_key (e.g. is_keep_training) and/or path_key (e.g. resume_from_checkpoint)",
        )
    return spec


def _check_resume_dirs(w: _Where, suite: Suite, jobs: Sequence[tuple[JobSpec, str]]) -> None:
    """With resume on, each job needs its own output dir, or jobs resume each other's runs."""
    if suite.resume is None:
        return
    key = suite.resume.output_dir_key
    wk = w.at("resume").at("output_dir_key")
    example = f'e.g. job.config.{key}: "outputs/{{task}}/seed{{seed}}"'
    seen: dict[str, str] = {}
    for job, _ in jobs:
        merged = tiers.deep_merge(tiers.deep_merge(suite.base_config_data, suite.config), job.config)
        out = tiers.get_path(merged, tiers.split_key(key))
        if out is None:
            raise wk.error(f"job {job.name!r} has no {key}, so its checkpoints cannot be found", example)
        if str(out) in seen:
            what = f"jobs {seen[str(out)]!r} and {job.name!r} share {key} {_show(out)}"
            raise wk.error(f"{what}: they would resume from each other's checkpoints", example)
        seen[str(out)] = job.name


def _retry(w: _Where, value: Any) -> RetryPolicy:
    mapping = _mapping(w, value, "retry: {errors: 1, backoff_s: 30}")
    _check_keys(w, mapping, ("errors", "backoff_s"))
    defaults = RetryPolicy()
    return RetryPolicy(
        errors=_whole(w.at("errors"), mapping.get("errors", defaults.errors), minimum=0),
        backoff_s=_number(w.at("backoff_s"), mapping.get("backoff_s", defaults.backoff_s), minimum=0),
    )


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
                raise _one_line(
                    f"--only {pattern}: matches no job of suite {suite.name}{did_you_mean(pattern, names)}; "
                    f"jobs look like {_examples(names)}"
                )
        keep = [j for j in keep if any(fnmatch.fnmatchcase(j.name, p) for p in patterns)]
    if not keep:
        raise PlanError(
            f"--pairs {pairs} and --only {only}: no job of suite {suite.name} passes both; widen one"
        )
    kept = {j.name for j in keep}
    if isinstance(suite, PlannedSuite):
        return replace(suite, jobs=tuple(keep), pairs={k: v for k, v in rendered.items() if k in kept})
    return replace(suite, jobs=tuple(keep))


def _check_pairs(suite: Suite, wanted: Sequence[str], rendered: Mapping[str, str]) -> None:
    if not isinstance(suite, PlannedSuite):
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
