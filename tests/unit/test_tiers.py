"""tiers.py: the default ladder, cumulation, config merging, batch scaling, resolve()."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusched import tiers
from gpusched.errors import PlanError
from gpusched.model import BatchKeys, BatchRule, JobSpec, ResumeSpec, Suite, Tier
from gpusched.tiers import TierLayer


def make_suite(**over: object) -> Suite:
    fields: dict[str, object] = {
        "name": "s",
        "plan_path": "/p/plans/s.yaml",
        "workdir": "/p",
        "logs_dir": "/p/logs/s",
        "command": "python t.py --config {config}",
        "base_config": None,
        "base_config_data": {"batch_size": 8, "gradient_accumulation_steps": 2, "num_data_workers": 8},
        "env": dict(tiers.DEFAULT_ENV),
        "tiers": tiers.default_tiers(),
    }
    fields.update(over)
    return Suite(**fields)  # type: ignore[arg-type]


JOB = JobSpec(suite="s", name="87-qnli", task="qnli", config={"seed": 87}, env={"TASK": "qnli"})


def one_line(err: pytest.ExceptionInfo[PlanError], *needles: str) -> str:
    msg = str(err.value)
    assert "\n" not in msg
    for needle in needles:
        assert needle in msg, msg
    return msg


# --------------------------------------------------------------------------- defaults


def test_default_env_values() -> None:
    assert dict(tiers.DEFAULT_ENV) == {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "PYTORCH_ALLOC_CONF": "expandable_segments:True",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
    }


def test_default_ladder_values() -> None:
    a, b, c, d = tiers.default_tiers()
    assert [t.name for t in (a, b, c, d)] == ["A", "B", "C", "D"]
    assert a.config == {} and a.env == {} and a.batch is None and not a.exclusive
    b_config = {
        "gradient_checkpointing": True,
        "logits_to_keep": 1,
        "num_data_workers": 2,
        "dataloader_prefetch_factor": 1,
    }
    assert b.config == b_config and b.batch is None and not b.exclusive
    assert c.config == b_config and c.batch == BatchRule(scale=0.5) and not c.exclusive
    assert d.config == {**b_config, "num_data_workers": 0}
    assert d.batch == BatchRule(micro_batch=1) and d.exclusive
    for tier in (a, b, c, d):
        assert tier.description and "\n" not in tier.description
        assert tier.min_free_mib is None


def test_default_tiers_are_fresh_each_call() -> None:
    first = tiers.default_tiers()
    first[1].config["gradient_checkpointing"] = False  # type: ignore[index]
    assert tiers.default_tiers()[1].config["gradient_checkpointing"] is True


# --------------------------------------------------------------------------- cumulation


def test_stack_tiers_is_cumulative_and_inherits_placement() -> None:
    layers = [
        TierLayer(name="A", env={"X": "1"}, config={"a": {"b": 1, "c": 2}}, placement={"min_free_mib": 9000}),
        TierLayer(
            name="B", env={"Y": "2"}, config={"a": {"b": 10}}, placement={"batch": BatchRule(scale=0.5)}
        ),
        TierLayer(name="C", env={"X": "3"}, placement={"exclusive": True, "min_free_mib": None}),
        TierLayer(name="D", config={"z": True}, placement={"batch": BatchRule(micro_batch=1)}),
    ]
    a, b, c, d = tiers.stack_tiers(layers)
    assert a.env == {"X": "1"} and a.min_free_mib == 9000
    assert b.env == {"X": "1", "Y": "2"} and b.config == {"a": {"b": 10, "c": 2}}
    assert b.batch == BatchRule(scale=0.5) and b.min_free_mib == 9000 and not b.exclusive
    assert c.env == {"X": "3", "Y": "2"} and c.batch == BatchRule(scale=0.5)
    assert c.exclusive and c.min_free_mib is None
    assert d.config == {"a": {"b": 10, "c": 2}, "z": True} and d.batch == BatchRule(micro_batch=1)
    assert d.exclusive


def test_stack_tiers_describes_tiers_without_a_description() -> None:
    a, b = tiers.stack_tiers(
        [TierLayer(name="A"), TierLayer(name="B", config={"x.y": 1}, placement={"exclusive": True})]
    )
    assert a.description == "as configured"
    assert b.description.startswith("as A + ") and "alone on its GPU" in b.description


# --------------------------------------------------------------------------- config helpers


def test_expand_dotted_nests_at_any_depth() -> None:
    got = tiers.expand_dotted({"optimizer.lr": 1e-4, "optimizer": {"betas.0": 0.9}, "top": 1, 3: "int key"})
    assert got == {"optimizer": {"lr": 1e-4, "betas": {"0": 0.9}}, "top": 1, 3: "int key"}


@pytest.mark.parametrize(
    "mapping",
    [{"a": 1, "a.b": 2}, {"a.b": 2, "a": 1}, {"a.b": 1, "a": {"b": 2}}],
)
def test_expand_dotted_rejects_a_value_set_twice(mapping: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="sets a value"):
        tiers.expand_dotted(mapping)


@pytest.mark.parametrize("key", ["a..b", ".a", "a."])
def test_expand_dotted_rejects_empty_parts(key: str) -> None:
    with pytest.raises(ValueError, match="empty part"):
        tiers.expand_dotted({key: 1})


def test_deep_merge_merges_mappings_and_copies() -> None:
    base = {"a": {"b": 1, "c": [1, 2]}, "d": 1}
    over = {"a": {"b": 2}, "d": {"e": 1}}
    got = tiers.deep_merge(base, over)
    assert got == {"a": {"b": 2, "c": [1, 2]}, "d": {"e": 1}}
    got["a"]["c"].append(3)
    got["d"]["e"] = 5
    assert base == {"a": {"b": 1, "c": [1, 2]}, "d": 1} and over == {"a": {"b": 2}, "d": {"e": 1}}


def test_set_and_get_path() -> None:
    cfg: dict[str, object] = {"a": 1}
    tiers.set_path(cfg, ("a", "b", "c"), 2)
    assert cfg == {"a": {"b": {"c": 2}}}
    assert tiers.get_path(cfg, ("a", "b", "c")) == 2
    assert tiers.get_path(cfg, ("a", "x"), "dflt") == "dflt"


# --------------------------------------------------------------------------- scale_batch


@pytest.mark.parametrize(
    ("size", "accum", "rule", "want"),
    [
        (8, 1, BatchRule(scale=0.5), (4, 2)),
        (8, 2, BatchRule(scale=0.5), (4, 4)),
        (6, 1, BatchRule(scale=0.5), (3, 2)),
        (5, 1, BatchRule(scale=0.5), (1, 5)),  # 2 does not divide 5: the next divisor down
        (12, 1, BatchRule(scale=0.7), (6, 2)),  # floor(8.4) = 8, largest divisor of 12 <= 8 is 6
        (1, 4, BatchRule(scale=0.5), (1, 4)),  # never below 1
        (96, 1, BatchRule(scale=0.5), (48, 2)),
        (8, 3, BatchRule(micro_batch=1), (1, 24)),
        (8, 1, BatchRule(micro_batch=32), (8, 1)),  # never grows
        (100, 1, BatchRule(scale=0.29), (25, 4)),  # 100 * 0.29 is 28.999...: floor is 29, not 28
    ],
)
def test_scale_batch_examples(size: int, accum: int, rule: BatchRule, want: tuple[int, int]) -> None:
    assert tiers.scale_batch(size, accum, rule) == want


def test_scale_batch_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        tiers.scale_batch(0, 1, BatchRule(scale=0.5))
    with pytest.raises(ValueError):
        tiers.scale_batch(4, 1, BatchRule())


rules = st.one_of(
    st.builds(BatchRule, scale=st.floats(min_value=0.01, max_value=1.0)),
    st.builds(BatchRule, micro_batch=st.integers(min_value=1, max_value=512)),
)


@given(size=st.integers(1, 4096), accum=st.integers(1, 256), rule=rules)
def test_scale_batch_keeps_effective_batch(size: int, accum: int, rule: BatchRule) -> None:
    new_size, new_accum = tiers.scale_batch(size, accum, rule)
    assert new_size * new_accum == size * accum
    assert 1 <= new_size <= size
    assert new_accum >= accum


@given(size=st.integers(1, 2048), accum=st.integers(1, 64), scale=st.floats(0.01, 1.0))
def test_scale_batch_picks_the_largest_fitting_divisor(size: int, accum: int, scale: float) -> None:
    new_size, _ = tiers.scale_batch(size, accum, BatchRule(scale=scale))
    target = max(1, int(size * scale + 1e-9))
    assert new_size <= target
    assert not any((size * accum) % d == 0 for d in range(new_size + 1, target + 1))


# --------------------------------------------------------------------------- resolve


def test_resolve_layers_in_order_and_keeps_suite_untouched() -> None:
    suite = make_suite(
        base_config_data={"a": 1, "opt": {"lr": 1, "name": "adam"}, "batch_size": 8},
        config={"opt": {"lr": 2}, "b": 1},
        tiers=(Tier(name="A", config={"b": 3, "opt": {"name": "sgd"}}),),
    )
    job = JobSpec(suite="s", name="j", task="j", config={"a": 2, "b": 2})
    got = tiers.resolve(suite, job, 0)
    assert got.config == {"a": 2, "opt": {"lr": 2, "name": "sgd"}, "batch_size": 8, "b": 3}
    got.config["opt"]["lr"] = 99
    assert suite.config == {"opt": {"lr": 2}, "b": 1}
    assert suite.base_config_data["opt"] == {"lr": 1, "name": "adam"}


def test_resolve_env_is_suite_then_job_then_tier() -> None:
    suite = make_suite(
        env={"X": "suite", "Y": "suite"},
        tiers=(Tier(name="A"), Tier(name="B", env={"Y": "tier", "Z": "tier"})),
    )
    job = JobSpec(suite="s", name="j", task="j", env={"X": "job", "Y": "job"})
    assert tiers.resolve(suite, job, 0).env == {"X": "job", "Y": "job"}
    got = tiers.resolve(suite, job, 1)
    assert got.env == {"X": "job", "Y": "tier", "Z": "tier"}
    assert "env Y=tier (tier B)" in got.notes and "env X=job (job)" in got.notes


def test_resolve_default_tier_c_halves_batch_and_notes_it() -> None:
    got = tiers.resolve(make_suite(), JOB, 2)
    assert got.config["batch_size"] == 4 and got.config["gradient_accumulation_steps"] == 4
    assert got.config["gradient_checkpointing"] is True and got.config["num_data_workers"] == 2
    assert (
        "tier C: batch_size 8 -> 4, gradient_accumulation_steps 2 -> 4 (effective batch 16 kept)" in got.notes
    )
    assert "gradient_checkpointing: true (tier B)" in got.notes  # introduced by B, still named B
    assert "num_data_workers: 8 -> 2 (tier B)" in got.notes
    assert "seed: 87 (job)" in got.notes
    assert got.env == {**tiers.DEFAULT_ENV, "TASK": "qnli"}
    assert all("\n" not in note for note in got.notes)


def test_resolve_notes_show_the_value_just_below_the_writer() -> None:
    suite = make_suite(config={"num_data_workers": 4, "max_steps": 5})
    got = tiers.resolve(suite, JOB, 1)
    assert "num_data_workers: 4 -> 2 (tier B)" in got.notes
    assert "max_steps: 5 (suite)" in got.notes
    assert not any(n.startswith("num_data_workers: 8 -> 4") for n in got.notes)  # overridden: not shown


def test_resolve_default_tier_d() -> None:
    got = tiers.resolve(make_suite(), JOB, 3)
    assert (got.config["batch_size"], got.config["gradient_accumulation_steps"]) == (1, 16)
    assert "num_data_workers: 8 -> 0 (tier D)" in got.notes
    assert any(n.startswith("tier D: batch_size 8 -> 1") for n in got.notes)


def test_resolve_tier_a_injects_nothing_but_job_config() -> None:
    got = tiers.resolve(make_suite(), JOB, 0)
    assert got.config == {
        "batch_size": 8,
        "gradient_accumulation_steps": 2,
        "num_data_workers": 8,
        "seed": 87,
    }
    assert got.notes == ("seed: 87 (job)", "env TASK=qnli (job)")


def test_resolve_skips_batch_rule_without_batch_key() -> None:
    suite = make_suite(base_config_data={"lr": 1})
    got = tiers.resolve(suite, JOB, 2)
    assert "batch_size" not in got.config and "gradient_accumulation_steps" not in got.config
    assert "tier C: micro-batch x0.5 skipped: no batch_size in the config" in got.notes


def test_resolve_skips_batch_rule_on_non_number() -> None:
    suite = make_suite(base_config_data={"batch_size": "auto"})
    got = tiers.resolve(suite, JOB, 2)
    assert got.config["batch_size"] == "auto"
    assert any("skipped: batch_size is auto" in n for n in got.notes)


def test_resolve_missing_accumulation_counts_as_one() -> None:
    suite = make_suite(base_config_data={"batch_size": 8})
    got = tiers.resolve(suite, JOB, 2)
    assert (got.config["batch_size"], got.config["gradient_accumulation_steps"]) == (4, 2)


def test_resolve_custom_dotted_batch_keys() -> None:
    suite = make_suite(
        base_config_data={"train": {"micro": 6, "accum": 1}},
        batch_keys=BatchKeys(size="train.micro", accumulation="train.accum"),
    )
    got = tiers.resolve(suite, JOB, 2)
    assert got.config["train"] == {"micro": 3, "accum": 2}


def test_resolve_resume_sets_flag_and_path() -> None:
    suite = make_suite(resume=ResumeSpec(flag_key="is_keep_training", path_key="trainer.resume_from"))
    got = tiers.resolve(suite, JOB, 1, checkpoint="outputs/x/checkpoint-40")
    assert got.config["is_keep_training"] is True
    assert got.config["trainer"] == {"resume_from": "outputs/x/checkpoint-40"}
    assert got.notes[-1].startswith("resume from outputs/x/checkpoint-40")
    assert "is_keep_training" not in tiers.resolve(suite, JOB, 1).config


def test_resolve_checkpoint_without_resume_spec_is_noted_not_applied() -> None:
    got = tiers.resolve(make_suite(), JOB, 0, checkpoint="out/checkpoint-1")
    assert "is_keep_training" not in got.config
    assert "starting over" in got.notes[-1]


def test_resolve_rejects_unknown_tier_index() -> None:
    with pytest.raises(PlanError) as err:
        tiers.resolve(make_suite(), JOB, 4)
    one_line(err, "tier 4", "4 tiers")


# --------------------------------------------------------------------------- tier_index


@pytest.mark.parametrize(("text", "want"), [("A", 0), ("C", 2), ("d", 3), ("1", 1), (" B ", 1)])
def test_tier_index(text: str, want: int) -> None:
    assert tiers.tier_index(make_suite(), text) == want


def test_tier_index_unknown_name_suggests() -> None:
    suite = make_suite(tiers=tiers.stack_tiers([TierLayer(name="zero2"), TierLayer(name="zero3")]))
    with pytest.raises(PlanError) as err:
        tiers.tier_index(suite, "zero4")
    one_line(err, "--tier zero4", "did you mean", "zero2, zero3")
    with pytest.raises(PlanError):
        tiers.tier_index(suite, "7")
