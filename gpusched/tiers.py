"""Apply a tier to a job: env vars, config overrides, micro-batch scaling that keeps the
effective batch, and resume keys.

Pure: every function here takes plain values and returns new ones; nothing touches a file,
a process or a clock. Config mappings are *nested* (``{"optimizer": {"lr": 1e-4}}``); a
dotted key in a plan (``optimizer.lr``) is expanded by :func:`expand_dotted` when the plan
is loaded, so every layer merged here is already nested.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from msgspec import Struct, field
from msgspec.structs import replace

from gpusched.errors import PlanError, did_you_mean
from gpusched.model import BatchRule, JobSpec, Suite, Tier

#: Injected into every suite unless its plan overrides a key (or sets it to ``null`` to
#: drop it). Seed 004's zero-cost levers: less allocator fragmentation, fewer threads.
DEFAULT_ENV: Mapping[str, str] = MappingProxyType(
    {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "PYTORCH_ALLOC_CONF": "expandable_segments:True",  # the name newer torch reads
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",  # logs stream live into the pane and the log file
    }
)

#: Set by gpusched for each attempt, over whatever the plan says (the card it was placed on,
#: the job's names: :func:`gpusched.attempt.materialize`), so a plan may not set them.
SET_PER_ATTEMPT = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "GPUSCHED_JOB_ID",
        "GPUSCHED_SUITE",
        "GPUSCHED_JOB",
        "GPUSCHED_ATTEMPT",
        "GPUSCHED_TIER",
        "GPUSCHED_ATTEMPT_DIR",
        "GPUSCHED_GPU",
    }
)

Path_ = tuple[Any, ...]  # a key path inside a nested config


# --------------------------------------------------------------------------- nested configs


def split_key(key: str) -> tuple[str, ...]:
    """``"optimizer.lr"`` -> ``("optimizer", "lr")``. ValueError on an empty segment."""
    parts = tuple(key.split("."))
    if any(not p for p in parts):
        raise ValueError(f"key {key!r} has an empty part between dots")
    return parts


def expand_dotted(mapping: Mapping[Any, Any]) -> dict[Any, Any]:
    """A new nested dict where every text key with dots sets a nested value, at any depth.

    ValueError (naming the key) when one mapping sets the same value twice, e.g.
    ``{"a": 1, "a.b": 2}`` or ``{"a.b": 1, "a": {"b": 2}}``. Non-text keys are kept as they are.
    """
    out: dict[Any, Any] = {}
    for key, value in mapping.items():
        parts = split_key(key) if isinstance(key, str) else (key,)
        node = expand_dotted(value) if isinstance(value, Mapping) else copy.deepcopy(value)
        for part in reversed(parts[1:]):
            node = {part: node}
        _merge_strict(out, parts[0], node, str(key))
    return out


def _merge_strict(into: dict[Any, Any], key: Any, value: Any, shown: str) -> None:
    if key not in into:
        into[key] = value
    elif isinstance(into[key], dict) and isinstance(value, dict):
        for k, v in value.items():
            _merge_strict(into[key], k, v, shown)
    else:
        raise ValueError(f"key {shown!r} sets a value that another key of the same mapping sets too")


def deep_merge(base: Mapping[Any, Any], over: Mapping[Any, Any]) -> dict[Any, Any]:
    """A new dict: ``over`` on top of ``base``; mappings merge key by key, anything else in
    ``over`` replaces. Neither input is modified or shared with the result."""
    out = {k: copy.deepcopy(v) for k, v in base.items()}
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(dict(value) if isinstance(value, Mapping) else value)
    return out


def get_path(config: Mapping[Any, Any], path: Path_, default: Any = None) -> Any:
    """The value at ``path`` in a nested config, or ``default``."""
    node: Any = config
    for part in path:
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def set_path(config: dict[Any, Any], path: Path_, value: Any) -> None:
    """Set ``path`` in place, creating (or replacing non-mapping) intermediate levels."""
    node = config
    for part in path[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[path[-1]] = value


def leaves(config: Mapping[Any, Any], prefix: Path_ = ()) -> Iterator[tuple[Path_, Any]]:
    """Every (path, value) whose value is not a non-empty mapping, depth first, in order."""
    for key, value in config.items():
        if isinstance(value, Mapping) and value:
            yield from leaves(value, (*prefix, key))
        else:
            yield (*prefix, key), value


def show_value(value: Any) -> str:
    """A value as it reads in YAML, on one line (``true``, ``null``, ``[1, 2]``)."""
    if isinstance(value, str):
        return value if value and "\n" not in value else json.dumps(value)
    return json.dumps(value, default=str)


def _dotted(path: Path_) -> str:
    return ".".join(str(p) for p in path)


# --------------------------------------------------------------------------- the ladder


class TierLayer(Struct, frozen=True, kw_only=True):
    """One tier as written in a plan: only its *own* additions. ``placement`` holds the
    keys among ``batch``, ``exclusive``, ``min_free_mib`` that the tier sets itself;
    the others are inherited from the tier before it."""

    name: str
    env: Mapping[str, str] = field(default_factory=dict)
    config: Mapping[str, Any] = field(default_factory=dict)
    placement: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""


def stack_tiers(layers: Sequence[TierLayer]) -> tuple[Tier, ...]:
    """Resolve layers into cumulative tiers: tier k = tier k-1 + layer k (later keys win,
    config mappings deep-merge); batch/exclusive/min_free_mib inherited unless set."""
    out: list[Tier] = []
    prev = Tier(name="")
    for layer in layers:
        prev = replace(
            prev,
            name=layer.name,
            env={**prev.env, **layer.env},
            config=deep_merge(prev.config, layer.config),
            description=layer.description or _describe(layer, out[-1].name if out else None),
            **layer.placement,
        )
        out.append(prev)
    return tuple(out)


def _describe(layer: TierLayer, before: str | None) -> str:
    bits = [f"{_dotted(p)}: {show_value(v)}" for p, v in leaves(layer.config)]
    bits += [f"{k}={v}" for k, v in layer.env.items()]
    rule = layer.placement.get("batch")
    if rule is not None:
        bits.append(_describe_rule(rule))
    if layer.placement.get("exclusive"):
        bits.append("alone on its GPU")
    if layer.placement.get("min_free_mib") is not None:
        bits.append(f"needs {layer.placement['min_free_mib']} MiB free")
    head = "as configured" if before is None else f"as {before}"
    return head + (" + " + ", ".join(bits) if bits else "")


def _describe_rule(rule: BatchRule) -> str:
    if rule.micro_batch is not None:
        return f"micro-batch {rule.micro_batch}"
    return f"micro-batch x{rule.scale:g}"


_DEFAULT_LAYERS = (
    TierLayer(
        name="A",
        description="as configured, with the default env (expandable segments, one thread per process)",
    ),
    TierLayer(
        name="B",
        config={
            "gradient_checkpointing": True,
            "logits_to_keep": 1,
            "num_data_workers": 2,
            "dataloader_prefetch_factor": 1,
        },
        description="A + gradient checkpointing, last logits only, 2 data workers, prefetch 1"
        " (-40-60% activations, ~5-10% slower)",
    ),
    TierLayer(
        name="C",
        placement={"batch": BatchRule(scale=0.5)},
        description="B + half the micro-batch, double the accumulation (same effective batch)",
    ),
    TierLayer(
        name="D",
        config={"num_data_workers": 0},
        placement={"batch": BatchRule(micro_batch=1), "exclusive": True},
        description="B + micro-batch 1, no data workers, alone on its GPU (last resort)",
    ),
)


def default_tiers() -> tuple[Tier, ...]:
    """The ladder a plan without ``tiers:`` gets (seed 004's plans A/B/C, plus a last resort):
    A as configured; B gradient checkpointing, ``logits_to_keep: 1``, 2 workers, prefetch 1;
    C = B + micro-batch x0.5; D = B + micro-batch 1, 0 workers, exclusive."""
    return stack_tiers(_DEFAULT_LAYERS)


def tier_index(suite: Suite, name_or_index: str) -> int:
    """The index of a tier given by name (exact, else case-insensitive if unique) or by its
    0-based position as digits. PlanError with did-you-mean otherwise."""
    names = [t.name for t in suite.tiers]
    text = name_or_index.strip()
    if text in names:
        return names.index(text)
    folded = [i for i, n in enumerate(names) if n.lower() == text.lower()]
    if len(folded) == 1:
        return folded[0]
    if text.isdigit() and int(text) < len(names):
        return int(text)
    raise PlanError(
        f"--tier {name_or_index}: suite {suite.name} has no such tier{did_you_mean(text, names)}; "
        f"its tiers are {', '.join(names) or '(none)'} (or their positions 0-{max(len(names) - 1, 0)})"
    )


# --------------------------------------------------------------------------- batch scaling


def scale_batch(size: int, accum: int, rule: BatchRule) -> tuple[int, int]:
    """New (micro-batch, accumulation) under ``rule`` with ``size * accum`` kept exactly.

    The new micro-batch is the largest divisor of the effective batch that is at most the
    target (``floor(size * scale)`` or ``micro_batch``, never below 1, never above ``size``).
    ValueError when ``size`` or ``accum`` is below 1 or the rule gives neither field.
    """
    if size < 1 or accum < 1:
        raise ValueError(f"batch size and accumulation must be >= 1 (got {size}, {accum})")
    if rule.micro_batch is not None:
        target = rule.micro_batch
    elif rule.scale is not None:
        target = math.floor(size * rule.scale + 1e-9)  # 100 * 0.29 is 28.999...
    else:
        raise ValueError("a batch rule needs scale or micro_batch")
    effective = size * accum
    new = _largest_divisor_at_most(effective, max(1, min(target, size)))
    return new, effective // new


def _largest_divisor_at_most(n: int, limit: int) -> int:
    best = 1
    d = 1
    while d * d <= n:
        if n % d == 0:
            for cand in (d, n // d):
                if best < cand <= limit:
                    best = cand
        d += 1
    return best


# --------------------------------------------------------------------------- resolve


class Resolved(Struct, frozen=True, kw_only=True):
    """What a job gets at one tier. ``config`` is the full config to write (a fresh dict the
    caller may keep); ``env`` the injected variables only (suite env, which already holds
    DEFAULT_ENV, then job env, then tier env); ``notes`` one human line per injected thing."""

    config: dict[str, Any]
    env: dict[str, str]
    notes: tuple[str, ...]


def resolve(suite: Suite, job: JobSpec, tier: int, *, checkpoint: str | None = None) -> Resolved:
    """Base config + suite config + job config + tier config (deep-merged, later wins), then
    the tier's batch rule, then the resume keys when ``checkpoint`` is given and the suite
    says how to resume. PlanError when ``tier`` is not an index of ``suite.tiers``."""
    if not 0 <= tier < len(suite.tiers):
        raise PlanError(f"suite {suite.name}: tier {tier} does not exist (it has {len(suite.tiers)} tiers)")
    the_tier = suite.tiers[tier]
    layers = [("suite", suite.config), ("job", job.config), (_TIER, the_tier.config)]
    stages = [deep_merge(suite.base_config_data, {})]  # the config before each layer, then after all
    for _, layer in layers:
        stages.append(deep_merge(stages[-1], layer))
    config = stages[-1]
    notes = _config_notes(suite, tier, layers, stages)
    notes += _env_notes(suite, job, tier)
    if the_tier.batch is not None:
        notes.append(_apply_batch(suite, tier, config))
    if checkpoint is not None:
        notes.append(_apply_resume(suite, config, checkpoint))
    env = {**suite.env, **job.env, **the_tier.env}
    return Resolved(config=config, env=env, notes=tuple(notes))


def _config_at(tier: Tier, path: Path_) -> Any:
    return get_path(tier.config, path, _MISSING)


def _env_at(tier: Tier, key: str) -> Any:
    return tier.env.get(key, _MISSING)


_MISSING = object()


def _origin(suite: Suite, tier: int, getter: Callable[[Tier, Any], Any], key: Any) -> str:
    """``"tier X"``: the earliest tier from which on ``key`` kept the value it has at ``tier``
    (tiers are cumulative, so this names the tier that introduced it)."""
    here = getter(suite.tiers[tier], key)
    first = tier
    while first > 0 and getter(suite.tiers[first - 1], key) == here:
        first -= 1
    return f"tier {suite.tiers[first].name}"


_TIER = "tier"  # label of the tier layer; replaced by the tier that introduced each key


def _config_notes(
    suite: Suite, tier: int, layers: list[tuple[str, Mapping[str, Any]]], stages: list[dict[str, Any]]
) -> list[str]:
    """One line per leaf a layer set: ``key: before -> after (who)``, where *before* is the
    value just below the last layer that set it and *who* is suite, job or the tier."""
    writer: dict[Path_, int] = {}
    for i, (_, layer) in enumerate(layers):
        for path, _ in leaves(layer):
            writer.pop(path, None)  # re-insert so the order follows the last writer
            writer[path] = i
    notes = []
    for path, i in writer.items():
        label = layers[i][0]
        who = _origin(suite, tier, _config_at, path) if label == _TIER else label
        change = _change(get_path(stages[i], path, _MISSING), get_path(stages[-1], path))
        notes.append(f"{_dotted(path)}: {change} ({who})")
    return notes


def _change(old: Any, new: Any) -> str:
    if old is _MISSING or old == new:
        return show_value(new)
    return f"{show_value(old)} -> {show_value(new)}"


def _env_notes(suite: Suite, job: JobSpec, tier: int) -> list[str]:
    notes = [f"env {k}={v} (job)" for k, v in job.env.items() if k not in suite.tiers[tier].env]
    for key, value in suite.tiers[tier].env.items():
        notes.append(f"env {key}={value} ({_origin(suite, tier, _env_at, key)})")
    return notes


def _batch_origin(suite: Suite, tier: int) -> str:
    return _origin(suite, tier, lambda t, _k: t.batch, "batch")


def _apply_batch(suite: Suite, tier: int, config: dict[str, Any]) -> str:
    rule = suite.tiers[tier].batch
    assert rule is not None
    keys = suite.batch_keys
    size_path, acc_path = split_key(keys.size), split_key(keys.accumulation)
    size = get_path(config, size_path)
    accum = get_path(config, acc_path, 1)
    label = _batch_origin(suite, tier)
    for key, value in ((keys.size, size), (keys.accumulation, accum)):
        why = _batch_problem(key, value)
        if why:
            return f"{label}: {_describe_rule(rule)} skipped: {why}"
    new_size, new_accum = scale_batch(size, accum, rule)
    set_path(config, size_path, new_size)
    set_path(config, acc_path, new_accum)
    return (
        f"{label}: {keys.size} {size} -> {new_size}, {keys.accumulation} {accum} -> {new_accum}"
        f" (effective batch {size * accum} kept)"
    )


def _batch_problem(key: str, value: Any) -> str | None:
    if value is None:
        return f"no {key} in the config"
    if not _whole(value) or value < 1:
        return f"{key} is {show_value(value)}, not a whole number >= 1"
    return None


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _apply_resume(suite: Suite, config: dict[str, Any], checkpoint: str) -> str:
    spec = suite.resume
    if spec is None or (spec.flag_key is None and spec.path_key is None):
        return f"checkpoint {checkpoint} not used: the plan has no resume: flag_key/path_key; starting over"
    set_keys = []
    if spec.flag_key is not None:
        set_path(config, split_key(spec.flag_key), True)
        set_keys.append(f"{spec.flag_key}: true")
    if spec.path_key is not None:
        set_path(config, split_key(spec.path_key), checkpoint)
        set_keys.append(f"{spec.path_key}: {checkpoint}")
    return f"resume from {checkpoint} ({', '.join(set_keys)})"
