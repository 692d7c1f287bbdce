"""plan.py, matrix.py, yamlfields.py: loading and validating plan files; flags.py: --pairs/--only,
--gpus, --gpu-plan."""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpusched import flags, plan, tiers
from gpusched.errors import PlanError
from gpusched.model import BatchKeys, BatchRule, GpuPlan, ResumeSpec, RetryPolicy, Suite

REPO = Path(__file__).resolve().parents[2]

MINIMAL = """
command: python train.py --config {config}
matrix:
  seed: [87, 88]
  task: [qnli, sst2]
"""


def write(root: Path, body: str, name: str = "s", suffix: str = ".yaml") -> Path:
    path = root / "plans" / f"{name}{suffix}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(body))
    (root / "train.py").touch()  # the script the plans' commands run (submit checks it is there)
    return path


def load(root: Path, body: str, **kw: Any) -> Suite:
    write(root, body)
    return plan.load_suite("s", cwd=root, **kw)


def error(fn: Callable[[], object], *needles: str) -> str:
    """The PlanError message of ``fn()``: asserted to be one line holding every needle."""
    with pytest.raises(PlanError) as err:
        fn()
    msg = str(err.value)
    assert "\n" not in msg, msg
    for needle in needles:
        assert needle in msg, msg
    return msg


def load_error(root: Path, body: str, *needles: str) -> str:
    write(root, body)
    return error(lambda: plan.load_suite("s", cwd=root), *needles)


def with_base(body: str) -> str:
    return textwrap.dedent(MINIMAL) + textwrap.dedent(body)


# --------------------------------------------------------------------------- the basics


def test_minimal_plan_fills_the_suite(tmp_path: Path) -> None:
    suite = load(tmp_path, MINIMAL)
    assert suite.name == "s"
    assert suite.plan_path == str(tmp_path / "plans" / "s.yaml")
    assert suite.workdir == str(tmp_path) and suite.logs_dir == str(tmp_path / "logs" / "s")
    assert suite.command == "python train.py --config {config}"
    assert suite.base_config is None and suite.base_config_data == {}
    assert suite.env == dict(tiers.DEFAULT_ENV)
    assert suite.tiers == tiers.default_tiers()
    assert suite.batch_keys == BatchKeys() and suite.resume is None and suite.retry == RetryPolicy()
    assert [j.name for j in suite.jobs] == ["87-qnli", "87-sst2", "88-qnli", "88-sst2"]
    assert all(j.suite == "s" and j.task == j.name and j.id == f"s/{j.name}" for j in suite.jobs)


def test_full_plan_fields(tmp_path: Path) -> None:
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "base.yaml").write_text("batch_size: 8\nopt: {lr: 1, name: adam}\n")
    suite = load(
        tmp_path,
        """
        description: |
          two seeds
          on two tasks
        command: python train.py --config {config} --job {job} --gpu {gpu}
        workdir: ..
        base_config: cfg/base.yaml
        env: {NUM_DATA_WORKERS: 2, FLAG: true, RATIO: 0.5, OMP_NUM_THREADS: 4, MKL_NUM_THREADS: null}
        config: {max_steps: 200, opt.lr: 2}
        batch: {size_key: micro, accumulation_key: accum}
        matrix: {seed: [1], task: [a]}
        resume: {flag_key: keep, output_dir_key: out}
        job: {config: {out: "o/{task}/{seed}"}}
        retry: {errors: 2, backoff_s: 5}
        """,
    )
    assert suite.description == "two seeds on two tasks"
    assert suite.workdir == str(tmp_path)
    assert suite.base_config == str(tmp_path / "cfg" / "base.yaml")
    assert suite.base_config_data == {"batch_size": 8, "opt": {"lr": 1, "name": "adam"}}
    assert (
        suite.env["NUM_DATA_WORKERS"] == "2" and suite.env["FLAG"] == "true" and suite.env["RATIO"] == "0.5"
    )
    assert suite.env["OMP_NUM_THREADS"] == "4" and "MKL_NUM_THREADS" not in suite.env
    assert suite.env["PYTORCH_ALLOC_CONF"] == "expandable_segments:True"
    assert suite.config == {"max_steps": 200, "opt": {"lr": 2}}
    assert suite.batch_keys == BatchKeys(size="micro", accumulation="accum")
    assert suite.resume == ResumeSpec(flag_key="keep", output_dir_key="out")
    assert suite.retry == RetryPolicy(errors=2, backoff_s=5.0)


def test_plan_found_by_yml_suffix_and_by_path(tmp_path: Path) -> None:
    write(tmp_path, MINIMAL, name="other", suffix=".yml")
    assert plan.load_suite("other", cwd=tmp_path).name == "other"
    elsewhere = tmp_path / "x" / "mine.yaml"
    elsewhere.parent.mkdir()
    elsewhere.write_text(MINIMAL)
    suite = plan.load_suite("x/mine.yaml", cwd=tmp_path)
    assert suite.name == "mine" and suite.workdir == str(tmp_path)


def test_workdir_is_relative_to_the_plan_file(tmp_path: Path) -> None:
    (tmp_path / "plans" / "sub").mkdir(parents=True)
    (tmp_path / "plans" / "sub" / "train.py").touch()
    suite = load(tmp_path, MINIMAL + "workdir: sub\n")
    assert suite.workdir == str(tmp_path / "plans" / "sub")
    load_error(tmp_path, MINIMAL + "workdir: nowhere\n", "plans/s.yaml: workdir:", "not a directory")


def test_name_override(tmp_path: Path) -> None:
    suite = load(tmp_path, MINIMAL, name="E1-again")
    assert suite.name == "E1-again" and suite.logs_dir.endswith("logs/E1-again")
    assert {j.suite for j in suite.jobs} == {"E1-again"}
    error(
        lambda: plan.load_suite("s", cwd=tmp_path, name="bad name"), "'bad name'", "choose another suite name"
    )
    error(lambda: plan.load_suite("s", cwd=tmp_path, name=".hidden"), "not allowed")
    error(lambda: plan.load_suite("s", cwd=tmp_path, name="x" * 41), "at most 40")


def test_bad_file_stem_is_rejected(tmp_path: Path) -> None:
    write(tmp_path, MINIMAL, name="my plan")
    error(lambda: plan.load_suite("plans/my plan.yaml", cwd=tmp_path), "'my plan'", "rename the plan file")


# --------------------------------------------------------------------------- finding and reading


def test_missing_plan_lists_available(tmp_path: Path) -> None:
    write(tmp_path, MINIMAL, name="E1")
    write(tmp_path, MINIMAL, name="demo")
    msg = error(lambda: plan.load_suite("dmeo", cwd=tmp_path), "plans/dmeo.yaml", "not found", "'demo'")
    assert "E1, demo" in msg


def test_missing_plans_folder(tmp_path: Path) -> None:
    error(lambda: plan.load_suite("E1", cwd=tmp_path), "plans/E1.yaml", "project root")


def test_missing_plan_path(tmp_path: Path) -> None:
    error(lambda: plan.load_suite("nope/x.yaml", cwd=tmp_path), "nope/x.yaml", "file not found")
    (tmp_path / "d.yaml").mkdir()
    error(lambda: plan.load_suite("d.yaml", cwd=tmp_path), "d.yaml", "is not a file")


def test_malformed_yaml_names_file_and_line(tmp_path: Path) -> None:
    body = "command: python t.py --config {config}\nmatrix:\n  seed: [1, 2\n  task: [a]\n"
    msg = load_error(tmp_path, body, "plans/s.yaml:", "not valid YAML", "near line")
    assert msg.startswith("plans/s.yaml:4:") or msg.startswith("plans/s.yaml:3:")


def test_a_tab_in_the_indentation_is_named_as_such(tmp_path: Path) -> None:
    """An editor that indents with a tab: libyaml says only "found character that cannot start
    any token"; the line says it is the tab, and on which line."""
    body = "command: python t.py --config {config}\njobs:\n\t- name: a\n"
    load_error(
        tmp_path, body, "plans/s.yaml:3:", "not valid YAML", "YAML indents with spaces, not tabs", "line 3"
    )


def test_duplicate_yaml_keys_are_errors(tmp_path: Path) -> None:
    load_error(
        tmp_path, MINIMAL + "config: {a: 1}\nconfig: {b: 2}\n", "plans/s.yaml:7:", "'config' appears twice"
    )


@pytest.mark.parametrize(
    ("body", "needle"),
    [("", "the plan is empty"), ("- a\n- b\n", "must be a mapping"), ("just text\n", "must be a mapping")],
)
def test_plan_must_be_a_mapping(tmp_path: Path, body: str, needle: str) -> None:
    load_error(tmp_path, body, "plans/s.yaml", needle)


# --------------------------------------------------------------------------- unknown keys and types


@pytest.mark.parametrize(
    ("extra", "where", "suggestion"),
    [
        ("confg: {}\n", "plans/s.yaml: confg: unknown key", "did you mean 'config'"),
        (
            "tiers: [{name: A}, {name: B, confg: {}}]\n",
            "plans/s.yaml: tiers[1].confg: unknown key",
            "'config'",
        ),
        ("tiers: [{name: A, batch: {scal: 0.5}}]\n", "tiers[0].batch.scal: unknown key", "'scale'"),
        ("resume: {flag: x}\n", "plans/s.yaml: resume.flag: unknown key", "'flag_key'"),
        ("retry: {error: 1}\n", "plans/s.yaml: retry.error: unknown key", "'errors'"),
        ("batch: {size: b}\n", "plans/s.yaml: batch.size: unknown key", "'size_key'"),
        ("job: {nam: x}\n", "plans/s.yaml: job.nam: unknown key", "'name'"),
        ("jobs: [{name: x, confg: {}}]\n", "plans/s.yaml: jobs[0].confg: unknown key", "'config'"),
    ],
)
def test_unknown_keys_suggest(tmp_path: Path, extra: str, where: str, suggestion: str) -> None:
    msg = load_error(tmp_path, MINIMAL + extra, where, suggestion)
    assert "allowed keys here" in msg


@pytest.mark.parametrize(
    ("extra", "needles"),
    [
        ("env: [A]\n", ("env: must be a mapping", "got a list")),
        ("config: 3\n", ("config: must be a mapping", "got a number")),
        ("tiers: 5\n", ("tiers: must be a list of 1 to 8 tiers", "got a number")),
        ("retry: {errors: two}\n", ("retry.errors: must be a whole number >= 0", "'two'")),
        ("retry: {backoff_s: -1}\n", ("retry.backoff_s: must be a number >= 0",)),
        ("tiers: {A: {}}\n", ("tiers: must be a list of 1 to 8 tiers",)),
        ("tiers: []\n", ("tiers: must be a list of 1 to 8 tiers", "got 0 tiers")),
        ("tiers: [{name: A, exclusive: yes please}]\n", ("tiers[0].exclusive: must be true or false",)),
        ("tiers: [{name: A, min_free_mib: -1}]\n", ("tiers[0].min_free_mib: must be a whole number >= 0",)),
        ("tiers: [{name: A, min_free_mib: 1.5}]\n", ("tiers[0].min_free_mib",)),
        ("description: [a]\n", ("description: must be non-empty text",)),
        ("notify: 5\n", ("notify: must be non-empty text", 'e.g. notify: \'curl -s -d "$GPUSCHED_MESSAGE"')),
        ("notify: '  '\n", ("notify: must be non-empty text",)),
        ("batch: {size_key: 3}\n", ("batch.size_key: must be non-empty text",)),
        ("batch: {size_key: a..b}\n", ("batch.size_key", "empty part")),
        ("base_config: 3\n", ("base_config: must be non-empty text",)),
        ("jobs: {name: x}\n", ("jobs: must be a list of jobs",)),
        ("jobs: [{task: x}]\n", ("jobs[0].name: missing",)),
        ("jobs: [{name: x, priority: high}]\n", ("jobs[0].priority: must be a whole number",)),
        ("jobs: [{name: x, task: [a]}]\n", ("jobs[0].task: must be text",)),
    ],
)
def test_wrong_types_name_the_key(tmp_path: Path, extra: str, needles: tuple[str, ...]) -> None:
    load_error(tmp_path, MINIMAL + extra, "plans/s.yaml: ", *needles)


# --------------------------------------------------------------------------- command


@pytest.mark.parametrize(
    ("command", "needles"),
    [
        (None, ("command: missing",)),
        ("''", ("command: must be non-empty text",)),
        ("python t.py", ("command: has no {config}", "never see its", "--config {config}")),
        (
            "python t.py --config {cofig}",
            ("placeholder {cofig} is unknown", "did you mean 'config'", "{gpu}"),
        ),
        ("python t.py --config {config} --x ${HOME}", ("{HOME} is unknown", "{{ and }}")),
        ("python t.py --config {config} --gpu {gpu:>3}", ("{gpu:>3} must be a plain {name}",)),
        ("python t.py --config {config", ("command: malformed template",)),
        ("python t.py --config {}", ("placeholder {} must be a plain",)),
        # what the shell of every job's launch.sh would refuse, at once, forty times over
        ("'python t.py --config \"{config}'", ("the shell cannot parse it (Unterminated quoted string)",)),
        ("'if true; then python t.py --config {config}'", ("the shell cannot parse it", "if/fi")),
    ],
)
def test_command_errors(tmp_path: Path, command: str | None, needles: tuple[str, ...]) -> None:
    body = MINIMAL.replace("command: python train.py --config {config}\n", "")
    if command is not None:
        body += f"command: {command}\n"
    load_error(tmp_path, body, "plans/s.yaml: command", *needles)


def test_command_may_use_every_field_and_literal_braces(tmp_path: Path) -> None:
    cmd = "run {config} {job} {suite} {tier} {attempt_dir} {gpu} --x '{{a}}'"
    suite = load(tmp_path, MINIMAL.replace("python train.py --config {config}", f'"{cmd}"'))
    assert suite.command == cmd


# --------------------------------------------------------------------------- matrix and templates


def test_matrix_expansion_order_names_and_typed_templates(tmp_path: Path) -> None:
    suite = load(
        tmp_path,
        """
        command: python train.py --config {config}
        matrix:
          seed: [87, 88, 89]
          task: [glue-tvt_qnli, glue-tvt_sst2]
          lr: [0.001]
        job:
          name: "{task}-s{seed}"
          task: "{task}"
          config:
            seed: "{seed}"
            lr: "{lr}"
            data: "{task}"
            tag: "s{seed}"
            output_dir: "outputs/{task}/seed{seed}"
            optimizer.lr: "{lr}"
            tags: ["{task}", "x{seed}", 3]
            nested: {seed_again: "{seed}", braces: "{{seed}}"}
          env: {SEED: "{seed}", LR: "{lr}"}
          priority: "{seed}"
        """,
    )
    assert len(suite.jobs) == 6
    assert [j.name for j in suite.jobs[:3]] == ["glue-tvt_qnli-s87", "glue-tvt_sst2-s87", "glue-tvt_qnli-s88"]
    job = suite.jobs[0]
    assert job.task == "glue-tvt_qnli" and job.priority == 87
    assert job.config == {
        "seed": 87,
        "lr": 0.001,
        "data": "glue-tvt_qnli",
        "tag": "s87",
        "output_dir": "outputs/glue-tvt_qnli/seed87",
        "optimizer": {"lr": 0.001},
        "tags": ["glue-tvt_qnli", "x87", 3],
        "nested": {"seed_again": 87, "braces": "{seed}"},
    }
    assert isinstance(job.config["seed"], int)
    assert job.env == {"SEED": "87", "LR": "0.001"}


def test_default_job_name_joins_matrix_values(tmp_path: Path) -> None:
    suite = load(tmp_path, "command: t {config}\nmatrix: {b: [x], a: [1, 2]}\n")
    assert [j.name for j in suite.jobs] == ["x-1", "x-2"]


@pytest.mark.parametrize(
    ("matrix", "needles"),
    [
        ("matrix: {}\n", ("matrix: is empty",)),
        ("matrix: {seed: []}\n", ("matrix.seed: must be a non-empty list",)),
        ("matrix: {seed: 3}\n", ("matrix.seed: must be a non-empty list",)),
        ("matrix: {seed: [1, 1]}\n", ("matrix.seed[1]: 1 is listed twice",)),
        ("matrix: {seed: [[1]]}\n", ("matrix.seed[0]: must be a single value",)),
        ("matrix: {se-ed: [1]}\n", ("matrix.se-ed: is not a usable variable name",)),
        ("matrix: [1, 2]\n", ("matrix: must be a mapping",)),
    ],
)
def test_matrix_errors(tmp_path: Path, matrix: str, needles: tuple[str, ...]) -> None:
    load_error(tmp_path, "command: t {config}\n" + matrix, "plans/s.yaml: ", *needles)


def test_matrix_larger_than_the_limit(tmp_path: Path) -> None:
    body = f"command: t {{config}}\nmatrix: {{a: {list(range(101))}, b: {list(range(100))}}}\n"
    load_error(tmp_path, body, "plans/s.yaml: matrix: makes 10100 jobs", "more than 10000")


def test_matrix_at_the_limit_loads(tmp_path: Path) -> None:
    body = f"command: t {{config}}\nmatrix: {{a: {list(range(100))}, b: {list(range(100))}}}\n"
    assert len(load(tmp_path, body).jobs) == 10_000


@pytest.mark.parametrize(
    ("job_block", "where"),
    [
        ('job: {config: {output_dir: "out/{sed}"}}\n', "job.config.output_dir: placeholder {sed}"),
        ('job: {name: "{seed}-{tsk}"}\n', "job.name: placeholder {tsk}"),
        ('job: {env: {X: "{nope}"}}\n', "job.env.X: placeholder {nope}"),
        ('job: {config: {tags: [a, "{x}"]}}\n', "job.config.tags[1]: placeholder {x}"),
        ('pairs: "{seed}/{tsk}"\n', "pairs: placeholder {tsk}"),
    ],
)
def test_placeholders_must_be_matrix_vars(tmp_path: Path, job_block: str, where: str) -> None:
    msg = load_error(tmp_path, MINIMAL + job_block, f"plans/s.yaml: {where} is not a matrix variable")
    assert "matrix variables: seed, task" in msg


def test_placeholder_suggestion(tmp_path: Path) -> None:
    load_error(tmp_path, MINIMAL + 'job: {config: {x: "{sed}"}}\n', "did you mean 'seed'")


def test_format_spec_that_does_not_fit_the_value(tmp_path: Path) -> None:
    load_error(tmp_path, MINIMAL + 'job: {name: "{task:03d}"}\n', "job.name: cannot fill", "task='qnli'")


def test_job_and_pairs_need_a_matrix(tmp_path: Path) -> None:
    base = "command: t {config}\njobs: [{name: a}]\n"
    load_error(tmp_path, base + "job: {name: x}\n", "plans/s.yaml: job: applies to matrix points", "matrix:")
    load_error(tmp_path, base + "pairs: x\n", "plans/s.yaml: pairs: applies to matrix points")


def test_no_jobs_at_all(tmp_path: Path) -> None:
    load_error(tmp_path, "command: t {config}\n", "plans/s.yaml: the plan defines no jobs", "matrix:")


# --------------------------------------------------------------------------- job names


@pytest.mark.parametrize(
    ("name", "bad"),
    [
        ("'a b'", "' '"),
        ("'a$b'", "'$'"),
        ("'a;rm'", "';'"),
        ("'a/b'", "'/'"),
        ('"a\'b"', '"\'"'),
        ('"a\\nb"', "'\\n'"),
        ("'a\"b'", "'\"'"),
    ],
)
def test_bad_job_names_are_named(tmp_path: Path, name: str, bad: str) -> None:
    msg = load_error(tmp_path, f"command: t {{config}}\njobs: [{{name: {name}}}]\n", "jobs[0].name: job name")
    assert f"not allowed: {bad}" in msg
    assert "letters, digits and _ . + = -" in msg


def test_bad_job_names_from_the_matrix(tmp_path: Path) -> None:
    body = "command: t {config}\nmatrix: {seed: [1], task: [glue/qnli]}\n"
    load_error(tmp_path, body, "job.name: job name '1-glue/qnli'", "seed=1, task='glue/qnli'", "'/'")


def test_job_name_length_and_first_character(tmp_path: Path) -> None:
    load_error(tmp_path, f"command: t {{config}}\njobs: [{{name: {'x' * 81}}}]\n", "81 characters long")
    assert load(tmp_path, f"command: t {{config}}\njobs: [{{name: {'x' * 80}}}]\n").jobs[0].name == "x" * 80
    load_error(
        tmp_path, "command: t {config}\njobs: [{name: -x}]\n", "job name '-x'", "starting with a letter"
    )


def test_allowed_job_name_characters(tmp_path: Path) -> None:
    suite = load(tmp_path, "command: t {config}\njobs: [{name: a_b.c+d=e-f}, {name: 7}]\n")
    assert [j.name for j in suite.jobs] == ["a_b.c+d=e-f", "7"]


def test_duplicate_job_names(tmp_path: Path) -> None:
    body = MINIMAL + "jobs: [{name: 87-qnli}]\n"
    load_error(
        tmp_path, body, "job name '87-qnli' is used twice", "matrix point seed=87, task='qnli'", "jobs[0]"
    )
    body = "command: t {config}\nmatrix: {seed: [1, 2]}\njob: {name: same}\n"
    load_error(tmp_path, body, "'same' is used twice")


def test_explicit_jobs_after_matrix_jobs(tmp_path: Path) -> None:
    suite = load(
        tmp_path,
        MINIMAL
        + """
jobs:
  - name: extra
    task: qnli
    priority: 3
    config: {seed: 1, opt.lr: 2}
    env: {X: 1}
  - name: bare
""",
    )
    assert [j.name for j in suite.jobs][-2:] == ["extra", "bare"]
    extra, bare = suite.jobs[-2:]
    assert extra.task == "qnli" and extra.priority == 3
    assert extra.config == {"seed": 1, "opt": {"lr": 2}} and extra.env == {"X": "1"}
    assert bare.task == "bare" and bare.config == {} and bare.priority == 0


# --------------------------------------------------------------------------- env and config


@pytest.mark.parametrize("key", ["1X", "A-B", "A B", "Ä"])
def test_env_keys_must_be_names(tmp_path: Path, key: str) -> None:
    load_error(
        tmp_path, MINIMAL + f'env: {{"{key}": 1}}\n', f"plans/s.yaml: env.{key}: is not a valid environment"
    )


@pytest.mark.parametrize(
    ("extra", "where"),
    [
        ("env: {CUDA_VISIBLE_DEVICES: 0}\n", "env.CUDA_VISIBLE_DEVICES: is set by gpusched"),
        ("tiers: [{name: A, env: {CUDA_DEVICE_ORDER: x}}]\n", "tiers[0].env.CUDA_DEVICE_ORDER: is set by"),
        ("jobs: [{name: x, env: {GPUSCHED_GPU: 1}}]\n", "jobs[0].env.GPUSCHED_GPU: is set by gpusched"),
    ],
)
def test_env_may_not_set_what_each_attempt_is_given(tmp_path: Path, extra: str, where: str) -> None:
    """The card a job was placed on and its names are set over the plan's env: a plan that sets
    them would see its value silently replaced (or, on Slurm, replace the allocation's)."""
    load_error(tmp_path, MINIMAL + extra, f"plans/s.yaml: {where}")


@pytest.mark.parametrize(
    ("extra", "where"),
    [
        ("env: {A: [1]}\n", "env.A: must be a single value"),
        ("env: {A: {b: 1}}\n", "env.A: must be a single value"),
        ("job: {env: {A: null}}\n", "job.env.A: must be a single value"),
        ("tiers: [{name: A, env: {A: [1]}}]\n", "tiers[0].env.A: must be a single value"),
        ("jobs: [{name: x, env: {7: a}}]\n", "jobs[0].env.7: is not a valid"),
    ],
)
def test_env_values_must_be_scalars(tmp_path: Path, extra: str, where: str) -> None:
    load_error(tmp_path, MINIMAL + extra, f"plans/s.yaml: {where}")


@pytest.mark.parametrize(
    ("extra", "where"),
    [
        ("config: {a: 1, a.b: 2}\n", "plans/s.yaml: config: key 'a.b'"),
        ("config: {a..b: 1}\n", "plans/s.yaml: config: key 'a..b' has an empty part"),
        ("tiers: [{name: A, config: {x.y: 1, x: {y: 2}}}]\n", "plans/s.yaml: tiers[0].config: key 'x'"),
        ("job: {config: {a.b: 1, a: 2}}\n", "plans/s.yaml: job.config: key 'a'"),
    ],
)
def test_config_conflicts(tmp_path: Path, extra: str, where: str) -> None:
    load_error(tmp_path, MINIMAL + extra, where)


# --------------------------------------------------------------------------- tiers


def test_tiers_are_cumulative(tmp_path: Path) -> None:
    suite = load(
        tmp_path,
        MINIMAL
        + """
tiers:
  - name: A
    env: {X: 1}
    min_free_mib: 8000
  - name: B
    description: checkpointing
    config: {gradient_checkpointing: true, opt.lr: 1}
    env: {Y: 2}
  - name: C
    config: {opt.wd: 0}
    batch: {scale: 0.5}
    exclusive: true
  - name: D
    env: {X: 3}
    batch: {micro_batch: 1}
    min_free_mib: null
  - E
""",
    )
    a, b, c, d, e = suite.tiers
    assert (
        a.env == {"X": "1"}
        and a.min_free_mib == 8000
        and a.description == "as configured + X=1, needs 8000 MiB free"
    )
    assert b.config == {"gradient_checkpointing": True, "opt": {"lr": 1}} and b.env == {"X": "1", "Y": "2"}
    assert b.description == "checkpointing" and b.min_free_mib == 8000
    assert c.config == {"gradient_checkpointing": True, "opt": {"lr": 1, "wd": 0}}
    assert c.batch == BatchRule(scale=0.5) and c.exclusive
    assert d.env == {"X": "3", "Y": "2"} and d.batch == BatchRule(micro_batch=1)
    assert d.exclusive and d.min_free_mib is None
    assert e.name == "E" and e.config == d.config and e.batch == d.batch and e.description == "as D"


@pytest.mark.parametrize(
    ("tiers_yaml", "needles"),
    [
        ("[{name: A}, {name: B}, {name: C, batch: {scale: 2}}]", ("tiers[2].batch.scale", "at most 1")),
        ("[{name: A, batch: {scale: 0}}]", ("tiers[0].batch.scale", "above 0")),
        ("[{name: A, batch: {scale: yes}}]", ("tiers[0].batch.scale",)),
        ("[{name: A, batch: {scale: 0.5, micro_batch: 1}}]", ("tiers[0].batch: give exactly one",)),
        ("[{name: A, batch: {}}]", ("tiers[0].batch: give exactly one",)),
        (
            "[{name: A, batch: {micro_batch: 0}}]",
            ("tiers[0].batch.micro_batch: must be a whole number >= 1",),
        ),
        ("[{name: A}, {name: A}]", ("tiers[1].name: tier name 'A' is used twice",)),
        ("[{config: {}}]", ("tiers[0].name: must be a tier name",)),
        ("[{name: 'a b'}]", ("tiers[0].name: must be a tier name", "'a b'")),
        ("[A, B, C, D, E, F, G, H, I]", ("tiers: must be a list of 1 to 8 tiers", "got 9 tiers")),
        ("[{name: A, env: {X: 1}}, 3]", ("tiers[1]: must be a mapping",)),
    ],
)
def test_tier_errors(tmp_path: Path, tiers_yaml: str, needles: tuple[str, ...]) -> None:
    load_error(tmp_path, MINIMAL + f"tiers: {tiers_yaml}\n", "plans/s.yaml: tiers", *needles)


# --------------------------------------------------------------------------- base config


def test_missing_base_config_names_key_and_path(tmp_path: Path) -> None:
    msg = load_error(
        tmp_path, MINIMAL + "base_config: cfg/nope.yaml\n", "plans/s.yaml: base_config: file not found"
    )
    assert "cfg/nope.yaml" in msg and str(tmp_path / "cfg" / "nope.yaml") in msg


def test_base_config_must_be_a_mapping(tmp_path: Path) -> None:
    (tmp_path / "b.yaml").write_text("- 1\n- 2\n")
    load_error(tmp_path, MINIMAL + "base_config: b.yaml\n", "base_config: b.yaml must hold a mapping")


def test_empty_base_config_is_empty(tmp_path: Path) -> None:
    (tmp_path / "b.yaml").write_text("")
    assert load(tmp_path, MINIMAL + "base_config: b.yaml\n").base_config_data == {}


def test_malformed_base_config_names_its_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "b.yaml").write_text("a: 1\nb: [1,\n")
    load_error(tmp_path, MINIMAL + "base_config: b.yaml\n", "b.yaml:3:", "not valid YAML")


# --------------------------------------------------------------------------- resume and retry


def test_resume_needs_a_flag_or_path_key(tmp_path: Path) -> None:
    load_error(tmp_path, MINIMAL + "resume: {}\n", "plans/s.yaml: resume: says neither", "flag_key")
    load_error(tmp_path, MINIMAL + "resume: {flag_key: null}\n", "plans/s.yaml: resume:")


def test_resume_needs_an_output_dir_per_job(tmp_path: Path) -> None:
    body = MINIMAL + "resume: {flag_key: keep}\n"
    load_error(tmp_path, body, "resume.output_dir_key: job '87-qnli' has no output_dir")
    body += 'config: {output_dir: "outputs/same"}\n'
    load_error(tmp_path, body, "resume.output_dir_key: jobs '87-qnli' and '87-sst2' share output_dir")
    body = MINIMAL + 'resume: {flag_key: keep}\njob: {config: {output_dir: "o/{task}/{seed}"}}\n'
    assert load(tmp_path, body).resume == ResumeSpec(flag_key="keep")


# --------------------------------------------------------------------------- --pairs / --only


@pytest.fixture
def suite4(tmp_path: Path) -> Suite:
    return load(tmp_path, MINIMAL + "jobs: [{name: extra}]\n")


def test_pairs_select_exactly_and_keep_order(suite4: Suite) -> None:
    got = flags.select_jobs(suite4, pairs="88:sst2, 87:qnli")
    assert [j.name for j in got.jobs] == ["87-qnli", "88-sst2"]
    assert got.name == suite4.name and got.tiers == suite4.tiers
    assert [j.name for j in flags.select_jobs(got, pairs="88:sst2").jobs] == ["88-sst2"]


def test_unknown_pair_is_named(suite4: Suite) -> None:
    error(
        lambda: flags.select_jobs(suite4, pairs="87:qnli,89:qnli"),
        "--pairs 89:qnli",
        "did you mean",
        "seed:task",
        "87:qnli",
    )


def test_pairs_need_a_matrix(tmp_path: Path) -> None:
    suite = load(tmp_path, "command: t {config}\njobs: [{name: a}]\n")
    error(lambda: flags.select_jobs(suite, pairs="1:a"), "--pairs", "no matrix", "--only")


def test_custom_pairs_template(tmp_path: Path) -> None:
    suite = load(tmp_path, MINIMAL + 'pairs: "{task}@{seed}"\n')
    assert [j.name for j in flags.select_jobs(suite, pairs="qnli@88").jobs] == ["88-qnli"]
    error(lambda: flags.select_jobs(suite, pairs="88:qnli"), "--pairs 88:qnli", "task@seed")


def test_only_patterns(suite4: Suite) -> None:
    assert [j.name for j in flags.select_jobs(suite4, only="87-*,extra").jobs] == [
        "87-qnli",
        "87-sst2",
        "extra",
    ]
    error(lambda: flags.select_jobs(suite4, only="87-qnl"), "--only 87-qnl", "did you mean '87-qnli'")
    error(lambda: flags.select_jobs(suite4, only=" , "), "--only", "nothing listed")


def test_pairs_and_only_together(suite4: Suite) -> None:
    got = flags.select_jobs(suite4, pairs="87:qnli,88:qnli", only="88-*")
    assert [j.name for j in got.jobs] == ["88-qnli"]
    error(lambda: flags.select_jobs(suite4, pairs="87:qnli", only="88-*"), "no job of suite s passes both")


def test_select_nothing_given_keeps_all(suite4: Suite) -> None:
    assert flags.select_jobs(suite4).jobs == suite4.jobs


def test_a_stored_suite_holds_no_pair_per_job(tmp_path: Path) -> None:
    """The pairs are for --pairs at submit; the store's suite row, which every `status` parses
    again, holds the suite's own fields, not an entry per matrix point."""
    import json

    from gpusched.store import Store

    suite = load(tmp_path, MINIMAL.replace("[87, 88]", f"{list(range(500))}"))
    assert isinstance(suite, plan.PlannedSuite) and len(suite.pairs) == 1000
    store = Store(tmp_path / "gs.db")
    plan1 = GpuPlan(gpus=(0,), slots=(1,))
    store.submit(suite, plan1, backend="subprocess", cwd=str(tmp_path), env_path=None)
    (spec,) = store.db.execute("SELECT spec FROM suites").fetchone()
    assert "pairs" not in json.loads(spec) and len(spec) < 5000  # (20 KB with them)
    row = store.suite("s")
    assert row is not None and row.suite.tiers == suite.tiers and row.suite.command == suite.command
    assert row.suite.env == suite.env and row.suite.logs_dir == suite.logs_dir


# --------------------------------------------------------------------------- --gpus


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("0,1,2", (0, 1, 2)),
        ("0 1 2", (0, 1, 2)),
        (" 3, 1 ", (3, 1)),
        ("4-6", (4, 5, 6)),
        ("0,4-5", (0, 4, 5)),
    ],
)
def test_parse_gpus(text: str, want: tuple[int, ...]) -> None:
    assert flags.parse_gpus(text, detected=None) == want
    assert flags.parse_gpus(text, detected=8) == want


def test_parse_gpus_none() -> None:
    assert flags.parse_gpus(None, detected=4) is None


@pytest.mark.parametrize(
    ("text", "detected", "needles"),
    [
        ("7", 4, ("--gpus 7", "this machine has 4 GPUs (0-3)")),
        ("0,1", 1, ("GPU 1 does not exist", "1 GPU (0)")),
        ("0", 0, ("no GPUs",)),
        ("0,1,1", None, ("--gpus 0,1,1", "GPU 1 is listed twice")),
        ("0-2,2", None, ("GPU 2 is listed twice",)),
        ("-1", None, ("--gpus -1", "negative")),
        ("6-4", None, ("runs backwards",)),
        ("0,x", None, ("'x' is not a GPU index",)),
        ("", None, ("--gpus", "nothing given")),
        ("0,,1", None, ("entry 2 is empty",)),
    ],
)
def test_parse_gpus_errors(text: str, detected: int | None, needles: tuple[str, ...]) -> None:
    error(lambda: flags.parse_gpus(text, detected=detected), "--gpus", *needles)


# --------------------------------------------------------------------------- --gpu-plan


def test_parse_gpu_plan() -> None:
    assert flags.parse_gpu_plan("2,2,2,2,1,1,1", gpus=None, detected=7) == GpuPlan(
        gpus=(0, 1, 2, 3, 4, 5, 6), slots=(2, 2, 2, 2, 1, 1, 1)
    )
    assert flags.parse_gpu_plan("2, 0 ,1", gpus=(4, 5, 6), detected=8) == GpuPlan(
        gpus=(4, 5, 6), slots=(2, 0, 1)
    )
    assert flags.parse_gpu_plan("1 1", gpus=None, detected=None) == GpuPlan(gpus=(0, 1), slots=(1, 1))


@pytest.mark.parametrize(
    ("text", "gpus", "detected", "needles"),
    [
        ("2,x", None, None, ("--gpu-plan 2,x", "entry 2 'x' is not a whole number >= 0")),
        ("2,-1", None, None, ("entry 2 '-1'",)),
        ("1.5", None, None, ("entry 1 '1.5'",)),
        ("2,2,2", (0, 1), None, ("3 entries for the 2 GPUs of --gpus 0,1", "one entry per GPU")),
        ("2", (0, 1), None, ("1 entries for the 2 GPUs", "not repeated")),
        ("1,1,1,1,1", None, 4, ("5 entries but this machine has 4 GPUs (0-3)", "--gpus")),
        ("0,0", None, None, ("every GPU has 0 slots", "nothing could run")),
        ("", None, None, ("--gpu-plan", "nothing given")),
        ("2,,2", None, None, ("entry 2 is empty",)),
    ],
)
def test_parse_gpu_plan_errors(
    text: str, gpus: tuple[int, ...] | None, detected: int | None, needles: tuple[str, ...]
) -> None:
    error(lambda: flags.parse_gpu_plan(text, gpus=gpus, detected=detected), "--gpu-plan", *needles)


# --------------------------------------------------------------------------- shipped plans


STUB_BASES = {
    "launchers/configs/gla_lora_base.yaml": "batch_size: 8\nnum_data_workers: 8\n",
    "launchers/configs/demo_base.yaml": "batch_size: 8\ngradient_accumulation_steps: 1\nmax_steps: 20\n",
}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repository when its base configs exist; else a copy of plans/ with stand-in base
    configs (the trainers' configs are written separately from the plans)."""
    if all((REPO / rel).is_file() for rel in STUB_BASES):
        return REPO
    root = tmp_path_factory.mktemp("project")
    shutil.copytree(REPO / "plans", root / "plans")
    for rel, text in STUB_BASES.items():
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text((REPO / rel).read_text() if (REPO / rel).is_file() else text)
    return root


def test_e1_plan(project: Path, tmp_path: Path) -> None:
    suite = plan.load_suite("E1", cwd=project)
    assert len(suite.jobs) == 14 and suite.workdir == str(project)
    assert suite.command == "python launchers/train_glue.py --config {config}"
    assert suite.base_config == str(project / "launchers/configs/gla_lora_base.yaml")
    assert suite.jobs[0].name == "87-glue-tvt_qnli" and suite.jobs[0].task == "glue-tvt_qnli"
    assert suite.jobs[0].config == {
        "seed": 87,
        "data": "glue-tvt_qnli",
        "output_dir": "outputs/E1/glue-tvt_qnli/seed87",
    }
    assert {j.task for j in suite.jobs} == {
        f"glue-tvt_{t}" for t in ("qnli", "sst2", "mrpc", "rte", "cola", "stsb", "mnli")
    }
    assert suite.resume is not None and suite.resume.flag_key == "is_keep_training"
    assert suite.tiers == tiers.default_tiers()
    picked = flags.select_jobs(suite, pairs="87:glue-tvt_qnli")
    assert [j.name for j in picked.jobs] == ["87-glue-tvt_qnli"]
    # submitted from anywhere, the workdir is still the project (workdir: .. in the plan)
    elsewhere = plan.load_suite(str(project / "plans" / "E1.yaml"), cwd=tmp_path)
    assert elsewhere.workdir == str(project) and elsewhere.logs_dir == str(tmp_path / "logs" / "E1")


def demo_peak_mib(config: dict[str, Any]) -> float:
    """demo_job.py's memory model."""
    checkpointing = 0.5 if config.get("gradient_checkpointing") else 1
    logits = 0 if config.get("logits_to_keep") == 1 else 1024
    return 2048 + 300 * config["batch_size"] * checkpointing + logits


def test_demo_plan_shows_the_oom_ladder(project: Path) -> None:
    suite = plan.load_suite("demo", cwd=project)
    assert len(suite.jobs) == 6 and len({j.task for j in suite.jobs}) == 3
    assert suite.command == "python launchers/demo_job.py --config {config}"
    assert suite.resume is not None and suite.resume.flag_key == "is_keep_training"
    by_task = {j.task: j for j in suite.jobs}
    for job in suite.jobs:
        cfg = tiers.resolve(suite, job, 0).config
        assert str(cfg["output_dir"]).startswith("outputs/demo/")
        assert cfg["max_steps"] * cfg["step_time_s"] <= 25
    big = by_task["mnli"]
    fits = [demo_peak_mib(tiers.resolve(suite, big, t).config) <= 12288 for t in range(4)]
    assert fits == [False, False, True, True]  # A and B OOM, C fits
    c = tiers.resolve(suite, big, 2).config
    assert c["batch_size"] * c["gradient_accumulation_steps"] == 96 and c["fake_gpu_mib"] == 12288
    for task in ("sst2", "qnli"):
        assert demo_peak_mib(tiers.resolve(suite, by_task[task], 0).config) <= 12288


def test_deepspeed_plan(project: Path) -> None:
    suite = plan.load_suite("deepspeed", cwd=project)
    assert len(suite.jobs) == 3
    assert [t.name for t in suite.tiers] == ["zero2", "zero2_offload", "zero3", "zero3_offload"]
    assert [t.min_free_mib for t in suite.tiers] == [12000, 6000, 4000, 0]
    ladder = [tiers.resolve(suite, suite.jobs[0], i).config for i in range(4)]
    zero = [c["deepspeed"]["zero_optimization"] for c in ladder]
    assert [z["stage"] for z in zero] == [2, 2, 3, 3]
    assert [z["offload_optimizer"]["device"] for z in zero] == ["none", "cpu", "none", "cpu"]
    assert zero[3]["offload_param"]["device"] == "cpu" and "offload_param" not in zero[2]
    assert [c["batch_size"] * c["gradient_accumulation_steps"] for c in ladder] == [16] * 4
    assert ladder[3]["batch_size"] == 1
