"""Typed reads of plan YAML: each getter takes a :class:`Where` (file and key path, e.g.
``plans/E1.yaml: tiers[2].batch``) and a raw value, and returns the value checked and
converted, or raises a :class:`PlanError` whose message is ONE line naming the file and key
path, what is wrong, and how to fix it. :func:`read_yaml` reads a file the same way (a key
written twice in one mapping is an error). Used by :mod:`gpusched.plan` for suite-level keys
and by :mod:`gpusched.matrix` for jobs; the config and env getters are shared by both.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from msgspec import Struct

from gpusched import tiers
from gpusched.errors import PlanError, did_you_mean

ENV_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SCALARS = (str, int, float, bool)


# --------------------------------------------------------------------------- error locations


class Where(Struct, frozen=True):
    """A place in a plan file; :meth:`error` builds the one-line PlanError for it."""

    file: str
    path: str = ""

    def at(self, key: str | int) -> Where:
        if isinstance(key, int):
            return Where(self.file, f"{self.path}[{key}]")
        return Where(self.file, f"{self.path}.{key}" if self.path else str(key))

    def error(self, what: str, fix: str = "") -> PlanError:
        where = f"{self.file}: {self.path}" if self.path else self.file
        return one_line(f"{where}: {what}" + (f"; {fix}" if fix else ""))


def one_line(message: str) -> PlanError:
    return PlanError(" ".join(message.split("\n")))


def show(value: Any, limit: int = 60) -> str:
    shown = repr(value)
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


def type_name(value: Any) -> str:
    names = {
        dict: "a mapping",
        list: "a list",
        str: "text",
        bool: "true/false",
        int: "a number",
        float: "a number",
        type(None): "empty",
    }
    return names.get(type(value), f"a {type(value).__name__}")


# --------------------------------------------------------------------------- typed getters


def check_keys(w: Where, raw: Mapping[Any, Any], allowed: Sequence[str]) -> None:
    for key in raw:
        if key not in allowed:
            hint = did_you_mean(str(key), allowed)
            raise w.at(str(key)).error(f"unknown key{hint}", f"allowed keys here: {', '.join(allowed)}")


def mapping(w: Where, value: Any, example: str) -> Mapping[Any, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise w.error(f"must be a mapping, got {type_name(value)} {show(value)}", f"e.g. {example}")
    return value


def text(w: Where, value: Any, example: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise w.error(f"must be non-empty text, got {type_name(value)} {show(value)}", f"e.g. {example}")
    return value


def whole(w: Where, value: Any, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise w.error(f"must be a whole number >= {minimum}, got {show(value)}")
    return value


def number(w: Where, value: Any, *, minimum: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= minimum:
        raise w.error(f"must be a number >= {minimum:g}, got {show(value)}")
    return float(value)


_DURATION_RE = re.compile("".join(rf"(?:(\d+(?:\.\d+)?){unit})?" for unit in "dhms"))
_DURATION_UNITS = (86400.0, 3600.0, 60.0, 1.0)


def duration(w: Where, value: Any, example: str) -> float:
    """Seconds from a number of seconds or text such as ``90s``, ``30m``, ``6h``, ``1h30m``,
    ``2d``; above zero."""
    seconds: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION_RE.fullmatch(value.replace(" ", ""))) and any(m.groups()):
        seconds = sum(float(g) * unit for g, unit in zip(m.groups(), _DURATION_UNITS, strict=True) if g)
    if seconds is None or not 0 < seconds < float("inf"):
        raise w.error(
            f"must be a duration above zero (seconds, or text like 90s, 30m, 6h, 1h30m), got {show(value)}",
            f"e.g. {example}",
        )
    return seconds


_SIZE_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt])i?b", re.IGNORECASE)
_SIZE_SHIFT = {"k": -10, "m": 0, "g": 10, "t": 20}  # to MiB


def size_mib(w: Where, value: Any, example: str) -> int:
    """MiB from text such as ``500MiB``, ``2GiB``, ``2GB``, ``1TiB`` (a unit is required: a bare
    number could mean bytes or MiB); at least 1 MiB. KB and KiB, MB and MiB... read alike."""
    m = _SIZE_RE.fullmatch(value.strip()) if isinstance(value, str) else None
    mib = None if m is None else float(m.group(1)) * 2.0 ** _SIZE_SHIFT[m.group(2).lower()]
    if mib is None or not 1 <= mib < 2**53:
        raise w.error(
            f"must be a size of at least 1 MiB, like 500MiB or 2GiB, got {show(value)}", f"e.g. {example}"
        )
    return int(mib)


def boolean(w: Where, value: Any) -> bool:
    if not isinstance(value, bool):
        raise w.error(f"must be true or false, got {show(value)}")
    return value


def single_line(w: Where, value: Any, example: str) -> str:
    given = text(w, value, example)
    if "\n" in given.strip():
        raise w.error("must be a single line", f"e.g. {example}")
    return given.strip()


# --------------------------------------------------------------------------- reading files


#: PyYAML's safe loader on libyaml where PyYAML was built with it (the wheels are): the same
#: documents, ten times faster to read (a thousand-job matrix: ~8 ms instead of ~100).
_SafeLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _PlanLoader(_SafeLoader):  # type: ignore[valid-type,misc]
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


def read_yaml(path: Path, shown: str, *, strict: bool) -> Any:
    try:
        content = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise one_line(f"{shown}: cannot be read ({exc})") from None
    try:
        return yaml.load(content, Loader=_PlanLoader if strict else _SafeLoader)  # both loaders are safe
    except yaml.YAMLError as exc:
        raise _yaml_error(shown, exc, content) from None


def _yaml_error(shown: str, exc: yaml.YAMLError, content: str) -> PlanError:
    mark = getattr(exc, "problem_mark", None)
    where = f"{shown}:{mark.line + 1}:{mark.column + 1}" if mark else shown
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    what = f"{problem} ({context})" if context else problem
    line = f"line {mark.line + 1}" if mark else "the file"
    fix = f"check indentation, colons and quotes near {line}"
    if "appears twice" in what:
        fix = "keep one of them (merge their contents)"
    elif "\t" in _up_to(content, mark):
        fix = f"YAML indents with spaces, not tabs: replace the tab on {line}"  # (an editor's default)
    return one_line(f"{where}: not valid YAML: {what}; {fix}")


def _up_to(content: str, mark: Any) -> str:
    """The line of ``content`` that ``mark`` points into, up to and including its column."""
    if mark is None:
        return ""
    lines = content.splitlines()
    return lines[mark.line][: mark.column + 1] if mark.line < len(lines) else ""


# --------------------------------------------------------------------------- config and env


def config(w: Where, value: Any) -> dict[str, Any]:
    """A config overlay, nested (dotted keys expanded)."""
    overlay = mapping(w, value, "config: {max_steps: 200, optimizer.lr: 1.0e-4}")
    try:
        return tiers.expand_dotted(overlay)
    except ValueError as exc:
        raise w.error(
            str(exc), "write each key once (optimizer.lr, or optimizer: {lr: ...}, not both)"
        ) from None


def env(w: Where, value: Any, *, null_ok: bool = False) -> dict[str, str | None]:
    given = mapping(w, value, "env: {NUM_DATA_WORKERS: 2}")
    out: dict[str, str | None] = {}
    for key, val in given.items():
        if not isinstance(key, str) or not ENV_KEY_RE.fullmatch(key):
            raise w.at(str(key)).error(
                "is not a valid environment variable name",
                "use letters, digits and _, not starting with a digit",
            )
        if key in tiers.SET_PER_ATTEMPT:
            hint = "--gpus chooses the cards" if key.startswith("CUDA_") else "the job reads it as set"
            raise w.at(key).error(
                "is set by gpusched for every attempt, over the plan's value", f"remove it; {hint}"
            )
        out[key] = _env_value(w.at(key), val, null_ok=null_ok)
    return out


def _env_value(w: Where, value: Any, *, null_ok: bool) -> str | None:
    if value is None and null_ok:
        return None
    if not isinstance(value, SCALARS):
        what = f"must be a single value (text, number, true/false), got {type_name(value)}"
        raise w.error(
            what, "quote it to pass it as text" + ("; null drops a default variable" if null_ok else "")
        )
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def strict_env(w: Where, value: Any) -> dict[str, str]:
    return {k: v for k, v in env(w, value).items() if v is not None}


def config_key(w: Where, value: Any, *, null_ok: bool = False) -> Any:
    if value is None and null_ok:
        return None
    key = text(w, value, "batch_size (a config key; dots for nesting)")
    try:
        tiers.split_key(key)
    except ValueError as exc:
        raise w.error(str(exc)) from None
    return key
