"""How a plan's ``matrix:``, ``job:`` and ``jobs:`` become :class:`JobSpec` values.

:func:`variables` reads the matrix, :func:`matrix_jobs` renders the ``job:`` template once
per matrix point (in matrix order), :func:`explicit_jobs` reads the ``jobs:`` list, and
:func:`check_unique` rejects a job name used twice. :func:`placeholders` parses the
``{name}`` fields of any plan template (``command:`` too). Every problem is a one-line
:class:`PlanError` naming the file and key path, as in :mod:`gpusched.yamlfields`.
"""

from __future__ import annotations

import itertools
import math
import re
import string
from collections.abc import Mapping, Sequence
from typing import Any

from gpusched import yamlfields as yf
from gpusched.errors import did_you_mean
from gpusched.model import JobSpec

JOB_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+=-]{0,79}")
#: :data:`JOB_NAME_RE` in words, as a refused name is told it (a plan's, a simulated trace's).
JOB_NAME_RULE = "use letters, digits and _ . + = - (starting with a letter or digit, at most 80 characters)"
VAR_RE = yf.ENV_KEY_RE  # matrix variable names: usable as {placeholders}
MAX_MATRIX_JOBS = 10_000
LITERAL_BRACES = "write {{ and }} for a literal brace"

_JOB_BLOCK_KEYS = ("name", "task", "config", "env", "priority")


# --------------------------------------------------------------------------- templates


def placeholders(w: yf.Where, template: str, *, bare: bool = True) -> list[str]:
    """Names of the ``{fields}`` in a template. With ``bare``, a field may not carry a
    format spec or conversion (``{gpu:>3}``): command values are shell-quoted text."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise w.error(f"malformed template {yf.show(template)}: {exc}", LITERAL_BRACES) from None
    names = []
    for _, field_name, spec, conversion in parsed:
        if field_name is None:
            continue
        if not VAR_RE.fullmatch(field_name) or (bare and (spec or conversion)):
            shown = field_name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "")
            raise w.error(f"placeholder {{{shown}}} must be a plain {{name}}", LITERAL_BRACES)
        names.append(field_name)
    return names


# --------------------------------------------------------------------------- matrix and jobs


def variables(w: yf.Where, raw: Mapping[str, Any]) -> dict[str, list[Any]]:
    if raw.get("matrix") is None:
        for key in ("job", "pairs"):
            if raw.get(key) is not None:
                raise w.at(key).error(
                    "applies to matrix points, but the plan has no matrix:", "add a matrix:"
                )
        return {}
    wm = w.at("matrix")
    mapping = yf.mapping(wm, raw["matrix"], "matrix: {seed: [87, 88], task: [a, b]}")
    if not mapping:
        raise wm.error("is empty", "give each variable a list of values, e.g. seed: [87, 88]")
    matrix = {_matrix_var(wm, k): _matrix_values(wm.at(k), v) for k, v in mapping.items()}
    total = math.prod(len(v) for v in matrix.values())
    if total > MAX_MATRIX_JOBS:
        raise wm.error(
            f"makes {total} jobs, more than {MAX_MATRIX_JOBS}", "split the suite into several plans"
        )
    return matrix


def _matrix_var(w: yf.Where, key: Any) -> str:
    if not isinstance(key, str) or not VAR_RE.fullmatch(key):
        raise w.at(str(key)).error(
            "is not a usable variable name", "use letters, digits and _ (e.g. seed, task)"
        )
    return key


def _matrix_values(w: yf.Where, value: Any) -> list[Any]:
    values = value if isinstance(value, list) else None
    if not values:
        raise w.error(f"must be a non-empty list of values, got {yf.show(value)}", "e.g. [87, 88, 89]")
    seen: set[tuple[type, Any]] = set()
    for i, item in enumerate(values):
        if not isinstance(item, yf.SCALARS):
            raise w.at(i).error(f"must be a single value (text, number), got {yf.type_name(item)}")
        if (type(item), item) in seen:
            raise w.at(i).error(f"{yf.show(item)} is listed twice", "list each value once")
        seen.add((type(item), item))
    return values


def matrix_jobs(
    w: yf.Where, raw: Mapping[str, Any], matrix: dict[str, list[Any]], suite: str
) -> tuple[list[tuple[JobSpec, str]], dict[str, str]]:
    """(job, origin) for every matrix point, and job name -> pairs rendering."""
    if not matrix:
        return [], {}
    wj = w.at("job")
    block = yf.mapping(wj, raw.get("job"), 'job: {name: "{seed}-{task}", config: {seed: "{seed}"}}')
    yf.check_keys(wj, block, _JOB_BLOCK_KEYS)
    names = list(matrix)
    templates = {
        "name": block.get("name", "-".join("{" + n + "}" for n in names)),
        "task": block.get("task"),
        "config": yf.mapping(wj.at("config"), block.get("config"), 'config: {seed: "{seed}"}'),
        "env": yf.mapping(wj.at("env"), block.get("env"), 'env: {TASK: "{task}"}'),
        "priority": block.get("priority", 0),
        "pairs": pairs_template(w, raw, matrix),
    }
    for key, template in templates.items():
        where = w.at("pairs") if key == "pairs" else wj.at(key)
        _check_template(where, template, names)
    jobs, pairs = [], {}
    at = {key: wj.at(key) for key in _JOB_BLOCK_KEYS}  # (once, not for each of thousands of points)
    wp = w.at("pairs")
    for point in itertools.product(*matrix.values()):
        values = dict(zip(names, point, strict=True))
        origin = _point(values)
        job = _matrix_job(at, templates, values, suite, origin)
        jobs.append((job, f"matrix point {origin}"))
        pairs[job.name] = str(_render(wp, templates["pairs"], values))
    return jobs, pairs


def pairs_template(w: yf.Where, raw: Mapping[str, Any], matrix: dict[str, list[Any]]) -> str | None:
    if not matrix:
        return None
    if raw.get("pairs") is None:
        return ":".join("{" + n + "}" for n in matrix)
    return yf.text(w.at("pairs"), raw["pairs"], 'pairs: "{seed}:{task}"')


def _matrix_job(
    at: Mapping[str, yf.Where], t: Mapping[str, Any], values: dict[str, Any], suite: str, origin: str
) -> JobSpec:
    """The job of one matrix point; ``at``: where each of ``job:``'s fields is."""
    name = str(_render(at["name"], t["name"], values))
    _check_job_name(at["name"], name, origin)
    task = name if t["task"] is None else _task(at["task"], _render(at["task"], t["task"], values))
    return JobSpec(
        suite=suite,
        name=name,
        task=task,
        config=yf.config(at["config"], _render(at["config"], t["config"], values)),
        env=yf.strict_env(at["env"], _render(at["env"], t["env"], values)),
        priority=_priority(at["priority"], _render(at["priority"], t["priority"], values)),
    )


def _point(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={yf.show(v)}" for k, v in values.items())


_SINGLE_RE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _check_template(w: yf.Where, template: Any, names: Sequence[str]) -> None:
    """Every placeholder in ``template`` (a value, or mappings/lists of them) is a matrix var."""
    if isinstance(template, Mapping):
        for key, value in template.items():
            _check_template(w.at(str(key)), value, names)
    elif isinstance(template, list):
        for i, value in enumerate(template):
            _check_template(w.at(i), value, names)
    elif isinstance(template, str):
        for name in placeholders(w, template, bare=False):
            if name not in names:
                raise w.error(
                    f"placeholder {{{name}}} is not a matrix variable{did_you_mean(name, names)}",
                    f"matrix variables: {', '.join(names)}; {LITERAL_BRACES}",
                )


def _render(w: yf.Where, template: Any, values: Mapping[str, Any]) -> Any:
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
        raise w.error(f"cannot fill {yf.show(template)} for {_point(values)}: {exc}") from None


def _check_job_name(w: yf.Where, name: str, origin: str) -> None:
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
        f"job name {yf.show(name)} ({origin}) {what}",
        JOB_NAME_RULE,
    )


def _task(w: yf.Where, value: Any) -> str:
    if not isinstance(value, yf.SCALARS) or isinstance(value, bool) or not str(value).strip():
        raise w.error(f"must be text (the prediction key siblings share), got {yf.show(value)}")
    return yf.single_line(w, str(value), 'task: "{task}"')


def _priority(w: yf.Where, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise w.error(f"must be a whole number (higher runs first), got {yf.show(value)}")
    return value


def explicit_jobs(w: yf.Where, value: Any, suite: str) -> list[tuple[JobSpec, str]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise w.error(
            f"must be a list of jobs, got {yf.type_name(value)}", "e.g. jobs: [{name: run1, config: {}}]"
        )
    return [(_explicit_job(w.at(i), item, suite), f"jobs[{i}]") for i, item in enumerate(value)]


def _explicit_job(w: yf.Where, item: Any, suite: str) -> JobSpec:
    mapping = yf.mapping(w, item, "{name: run1, task: glue-tvt_qnli, config: {seed: 87}}")
    yf.check_keys(w, mapping, _JOB_BLOCK_KEYS)
    if mapping.get("name") is None:
        raise w.at("name").error("missing: every job in jobs: needs a name", "e.g. name: 87-glue-tvt_qnli")
    raw_name = mapping["name"]
    if not isinstance(raw_name, str | int) or isinstance(raw_name, bool):
        raise w.at("name").error(f"must be text, got {yf.type_name(raw_name)}")
    name = str(raw_name)
    _check_job_name(w.at("name"), name, "in jobs:")
    return JobSpec(
        suite=suite,
        name=name,
        task=name if mapping.get("task") is None else _task(w.at("task"), mapping["task"]),
        config=yf.config(w.at("config"), mapping.get("config")),
        env=yf.strict_env(w.at("env"), mapping.get("env")),
        priority=_priority(w.at("priority"), mapping.get("priority", 0)),
    )


def check_unique(w: yf.Where, jobs: Sequence[tuple[JobSpec, str]]) -> None:
    seen: dict[str, str] = {}
    for job, origin in jobs:
        if job.name in seen:
            key = f"{origin}.name" if origin.startswith("jobs[") else "job.name"
            raise w.at(key).error(
                f"job name {job.name!r} is used twice ({seen[job.name]} and {origin})",
                "give every job its own name (e.g. include every matrix variable in job.name)",
            )
        seen[job.name] = origin
