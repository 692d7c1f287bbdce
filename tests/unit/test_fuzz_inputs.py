"""Every bad input gets one clear line: hypothesis throws arbitrary text at the flag parsers
and arbitrary YAML (wrong types, unknown keys, odd job names, huge matrices) at the plan
loader, in-process for speed. The only acceptable outcomes are a valid result or a
:class:`GpuschedError` whose message is one line; never another exception. A suite that loads
must also resolve at every tier, so nothing that passed `submit` can fail at launch time
for a reason `submit` could have named.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpusched import flags, matrix, plan, tiers
from gpusched.errors import GpuschedError

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def one_line(err: GpuschedError) -> None:
    msg = str(err)
    assert msg.strip(), "empty error message"
    assert "\n" not in msg and "\r" not in msg, f"multi-line error: {msg!r}"


def expect_clean(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Call ``fn``; a GpuschedError must be one line; anything else fails the test."""
    try:
        return fn(*args, **kwargs)
    except GpuschedError as e:
        one_line(e)
        return None


# --------------------------------------------------------------------------- flags

flag_text = st.one_of(
    st.text(max_size=40),
    st.text(alphabet="0123456789,- \t\n:;$()'\"`²٣", max_size=30),
    st.lists(st.integers(-3, 2**70), max_size=9).map(lambda xs: ",".join(map(str, xs))),
)


@FUZZ
@given(text=flag_text, detected=st.one_of(st.none(), st.integers(0, 16)))
@example(text="²", detected=None)
@example(text="0,x\ny", detected=2)
@example(text="0-99999999999999999999", detected=None)
def test_parse_gpus_never_raises_anything_else(text: str, detected: int | None) -> None:
    out = expect_clean(flags.parse_gpus, text, detected=detected)
    if out is not None:
        assert all(isinstance(g, int) and g >= 0 for g in out)
        assert len(set(out)) == len(out)
        if detected is not None:
            assert all(g < detected for g in out)


@FUZZ
@given(
    text=flag_text,
    gpus=st.one_of(st.none(), st.lists(st.integers(0, 15), unique=True, max_size=8).map(tuple)),
    detected=st.one_of(st.none(), st.integers(0, 16)),
)
@example(text="²,1", gpus=None, detected=None)
@example(text="1\n,x", gpus=None, detected=None)
def test_parse_gpu_plan_never_raises_anything_else(text: str, gpus: Any, detected: int | None) -> None:
    out = expect_clean(flags.parse_gpu_plan, text, gpus=gpus, detected=detected)
    if out is not None:
        assert len(out.gpus) == len(out.slots) and any(out.slots)
        assert all(isinstance(s, int) and s >= 0 for s in out.slots)


# --------------------------------------------------------------------------- plan files

GOOD = {
    "command": "python train.py --config {config}",
    "matrix": {"seed": [1, 2], "task": ["a", "b"]},
    "job": {"name": "{seed}-{task}", "task": "{task}", "config": {"seed": "{seed}"}},
    "config": {"batch_size": 8, "gradient_accumulation_steps": 1},
}

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**64), 2**64), st.floats(allow_nan=True), st.text(max_size=12)
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.text(max_size=8), st.integers()), inner, max_size=4),
    ),
    max_leaves=12,
)
plan_keys = st.sampled_from([*plan._TOP_KEYS, "comand", "tier", "", "matrix.seed"])
hostile_names = st.one_of(
    st.text(max_size=20),
    st.sampled_from(
        [
            "a b",
            "it's",
            'say "hi"',
            "$(touch pwned)",
            "`id`",
            "a;rm -rf x",
            "x\ny",
            "é",
            "日本",
            "a/b",
            "..",
            "-x",
            "a" * 81,
            "ok-name",
            "x\x00y",
            "\u2028",
        ]
    ),
)


def load(tmp: Path, doc: Any) -> Any:
    path = tmp / "plans" / "fz.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc, allow_unicode=True))
    suite = expect_clean(plan.load_suite, "fz", cwd=tmp)
    if suite is not None:
        for job in suite.jobs[:3]:  # what launch would do: resolve at every tier
            for i in range(len(suite.tiers)):
                tiers.resolve(suite, job, i)
            assert matrix.JOB_NAME_RE.fullmatch(job.name)
    return suite


@pytest.fixture(scope="module")
def scratch() -> Any:
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


@FUZZ
@given(key=plan_keys, value=values)
def test_one_wrong_value_in_a_good_plan(scratch: Path, key: str, value: Any) -> None:
    load(scratch, {**GOOD, key: value})


known = st.sampled_from(
    [
        "batch_size",
        "gradient_accumulation_steps",
        "output_dir",
        "name",
        "config",
        "env",
        "batch",
        "scale",
        "micro_batch",
        "exclusive",
        "min_free_mib",
        "flag_key",
        "errors",
        "backoff_s",
        "a.b",
        "x..y",
        "size",
    ]
)
shaped = st.recursive(
    scalars,
    lambda inner: st.dictionaries(known, inner, max_size=4) | st.lists(inner, max_size=3),
    max_leaves=10,
)


@FUZZ
@given(
    key=st.sampled_from(["config", "tiers", "resume", "batch", "retry", "env", "job", "jobs"]), value=shaped
)
def test_plausible_shapes_with_wrong_types(scratch: Path, key: str, value: Any) -> None:
    load(scratch, {**GOOD, key: value})


@FUZZ
@given(doc=st.dictionaries(plan_keys, values, max_size=6))
def test_arbitrary_plan_documents(scratch: Path, doc: dict[str, Any]) -> None:
    load(scratch, doc)


@FUZZ
@given(text=st.text(max_size=200))
@example(text="command: [unclosed\n")
@example(text="a: 1\na: 2\n")
@example(text="- just\n- a list\n")
@example(text="\ufeffcommand: x {config}\njobs: [{name: a}]\n")
def test_arbitrary_plan_text(scratch: Path, text: str) -> None:
    load(scratch, text)


@FUZZ
@given(name=hostile_names, value=values)
def test_explicit_job_names_and_overrides(scratch: Path, name: str, value: Any) -> None:
    suite = load(scratch, {"command": GOOD["command"], "jobs": [{"name": name, "config": {"note": value}}]})
    if suite is not None:
        assert suite.jobs[0].name == name


@FUZZ
@given(values_=st.lists(hostile_names, min_size=1, max_size=3, unique=True))
def test_matrix_values_become_names_or_one_line_errors(scratch: Path, values_: list[str]) -> None:
    load(scratch, {"command": GOOD["command"], "matrix": {"v": values_}, "job": {"name": "{v}"}})


def test_a_huge_matrix_is_refused_quickly(scratch: Path) -> None:
    doc = {"command": GOOD["command"], "matrix": {f"v{i}": list(range(30)) for i in range(6)}}
    with pytest.raises(GpuschedError) as e:
        plan.load_suite("fz", cwd=_write(scratch, doc))
    one_line(e.value)
    assert "more than" in str(e.value)


def _write(tmp: Path, doc: Any) -> Path:
    (tmp / "plans").mkdir(exist_ok=True)
    (tmp / "plans" / "fz.yaml").write_text(yaml.safe_dump(doc))
    (tmp / "train.py").touch()  # the script GOOD's command runs
    return tmp


# --------------------------------------------------------------------------- --pairs / --only


@pytest.fixture(scope="module")
def good_suite(scratch: Path) -> Any:
    return plan.load_suite("fz", cwd=_write(scratch, GOOD))


@FUZZ
@given(
    pairs=st.one_of(st.none(), flag_text, hostile_names), only=st.one_of(st.none(), flag_text, hostile_names)
)
@example(pairs="1:a", only=None)
@example(pairs=None, only="1-*")
def test_pairs_and_only(good_suite: Any, pairs: str | None, only: str | None) -> None:
    out = expect_clean(flags.select_jobs, good_suite, pairs=pairs, only=only)
    if out is not None:
        assert out.jobs and {j.name for j in out.jobs} <= {j.name for j in good_suite.jobs}
