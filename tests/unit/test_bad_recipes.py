"""Hand-written bad recipes: each error must name the file, the line and the field, and say what to do."""

from __future__ import annotations

import textwrap

import pytest

from orchestrator.errors import RecipeError
from orchestrator.recipe import load_recipe

MODEL = "model:\n  name: gpt-tiny\n"
TRAINING = "training:\n  global_batch_size: 16\n  steps: 10\n"

# (id, recipe text, field named, line named, fragment of the message)
CASES = [
    (
        "recovery-without-attempts",
        MODEL + TRAINING + "recovery:\n  max_attempts: 0\n",
        "recovery.max_attempts",
        7,
        "must be >= 1",
    ),
    (
        "recovery-backoff-cap-below-the-first-wait",
        MODEL + TRAINING + "recovery:\n  backoff_s: 30\n  max_backoff_s: 5\n",
        "recovery.max_backoff_s",
        8,
        "less than backoff_s",
    ),
    (
        "recovery-seconds-not-finite",
        MODEL + TRAINING + "recovery:\n  max_seconds: .inf\n",
        "recovery.max_seconds",
        7,
        "",
    ),
    (
        "preemption-after-the-last-step",
        MODEL + TRAINING + "local_cloud:\n  preempt_at_steps: [3, 10]\n",
        "local_cloud.preempt_at_steps",
        7,
        "outside 1..9",
    ),
    (
        "preemptions-on-a-real-cloud",
        "provider: aws\n" + MODEL + TRAINING + "local_cloud:\n  preempt_at_steps: [3]\n",
        "local_cloud",
        7,
        "applies to the local simulated cloud",
    ),
    (
        "notice-not-positive",
        MODEL + TRAINING + "local_cloud:\n  notice_s: 0\n",
        "local_cloud.notice_s",
        7,
        "must be > 0",
    ),
    (
        "unknown-top-level-key",
        MODEL + TRAINING + "objectve:\n  goal: min_cost\n",
        "objectve",
        6,
        "did you mean 'objective'",
    ),
    (
        "typo-nested-key",
        MODEL + "training:\n  glbal_batch_size: 16\n  steps: 10\n",
        "training.glbal_batch_size",
        4,
        "did you mean 'global_batch_size'",
    ),
    ("key-in-wrong-section", MODEL + TRAINING + "steps: 5\n", "steps", 6, "belongs under training"),
    (
        "unknown-key-no-suggestion",
        MODEL + TRAINING + "runtime:\n  turbo: true\n",
        "runtime.turbo",
        7,
        "unknown key 'turbo'",
    ),
    (
        "batch-not-a-number",
        MODEL + "training:\n  global_batch_size: sixty-four\n  steps: 10\n",
        "training.global_batch_size",
        4,
        "expected a whole number",
    ),
    (
        "batch-is-float",
        MODEL + "training:\n  global_batch_size: 16.5\n  steps: 10\n",
        "training.global_batch_size",
        4,
        "expected a whole number",
    ),
    (
        "steps-is-bool",
        MODEL + "training:\n  global_batch_size: 16\n  steps: true\n",
        "training.steps",
        5,
        "expected a whole number",
    ),
    (
        "microbatches-not-a-list",
        MODEL + TRAINING + "  microbatch_sizes: 4\n",
        "training.microbatch_sizes",
        6,
        "expected a list",
    ),
    (
        "microbatch-not-dividing",
        MODEL + TRAINING + "  microbatch_sizes: [1, 3]\n",
        "training.microbatch_sizes[1]",
        6,
        "not divisible by microbatch size 3",
    ),
    (
        "microbatch-zero",
        MODEL + TRAINING + "  microbatch_sizes:\n    - 2\n    - 0\n",
        "training.microbatch_sizes[1]",
        8,
        "must be >= 1",
    ),
    (
        "microbatch-twice",
        MODEL + TRAINING + "  microbatch_sizes: [2, 2]\n",
        "training.microbatch_sizes[1]",
        6,
        "listed twice",
    ),
    (
        "microbatches-empty",
        MODEL + TRAINING + "  microbatch_sizes: []\n",
        "training.microbatch_sizes",
        6,
        "empty",
    ),
    (
        "steps-zero",
        MODEL + "training:\n  global_batch_size: 16\n  steps: 0\n",
        "training.steps",
        5,
        "must be >= 1",
    ),
    ("missing-training", MODEL, "(top level)", 1, "missing required key 'training'"),
    (
        "missing-steps",
        MODEL + "training:\n  global_batch_size: 16\n",
        "training",
        3,
        "missing required key 'steps'",
    ),
    (
        "precision-typo",
        MODEL + TRAINING + "  precision: fp61\n",
        "training.precision",
        6,
        "not one of fp32, fp16-mixed, bf16-mixed",
    ),
    (
        "lr-negative",
        MODEL + TRAINING + "  optimizer:\n    name: adam\n    lr: -1.0e-3\n",
        "training.optimizer.lr",
        8,
        "must be > 0",
    ),
    (
        "momentum-with-adam",
        MODEL + TRAINING + "  optimizer:\n    name: adam\n    momentum: 0.9\n",
        "training.optimizer.momentum",
        8,
        "momentum applies to sgd",
    ),
    (
        "negative-budget",
        MODEL + TRAINING + "objective:\n  goal: max_throughput\n  budget_usd_per_hour: -5\n",
        "objective.budget_usd_per_hour",
        8,
        "must be > 0",
    ),
    (
        "negative-total-budget",
        MODEL + TRAINING + "objective:\n  budget_usd: -1\n",
        "objective.budget_usd",
        7,
        "must be > 0",
    ),
    (
        "floor-with-max-throughput",
        MODEL + TRAINING + "objective:\n  min_throughput_samples_per_s: 10\n",
        "objective.min_throughput_samples_per_s",
        7,
        "applies to goal min_cost",
    ),
    (
        "budget-with-min-cost",
        MODEL + TRAINING + "objective:\n  goal: min_cost\n  budget_usd_per_hour: 3\n",
        "objective.budget_usd_per_hour",
        8,
        "applies to goal max_throughput",
    ),
    (
        "floor-and-deadline",
        MODEL
        + TRAINING
        + "objective:\n  goal: min_cost\n  min_throughput_samples_per_s: 10\n  deadline_h: 2\n",
        "objective.deadline_h",
        9,
        "not both",
    ),
    (
        "deadline-negative",
        MODEL + TRAINING + "objective:\n  goal: min_cost\n  deadline_h: -2\n",
        "objective.deadline_h",
        8,
        "must be > 0",
    ),
    (
        "goal-typo",
        MODEL + TRAINING + "objective:\n  goal: max_thruput\n",
        "objective.goal",
        7,
        "did you mean 'max_throughput'",
    ),
    (
        "unknown-model",
        "model:\n  name: gpt-tinyy\n" + TRAINING,
        "model.name",
        2,
        "did you mean 'gpt-tiny'",
    ),
    (
        "sailor-profile-of-builtin",
        "model:\n  name: gpt-tiny\n  profile: sailor\n" + TRAINING,
        "model.profile",
        3,
        "SAILOR published no profile",
    ),
    (
        "missing-profile-file",
        "model:\n  name: gpt-tiny\n  profile: profiles/none.json\n" + TRAINING,
        "model.profile",
        3,
        "does not exist",
    ),
    (
        "images-for-gpt",
        MODEL + "data:\n  source: synthetic-images\n" + TRAINING,
        "data.source",
        4,
        "cannot train on synthetic-images",
    ),
    (
        "shards-without-path",
        MODEL + "data:\n  source: shards\n" + TRAINING,
        "data",
        3,
        "needs a path",
    ),
    (
        "unknown-gpu",
        MODEL + TRAINING + "constraints:\n  gpu_types: [A1000]\n",
        "constraints.gpu_types[0]",
        7,
        "unknown GPU type 'A1000'",
    ),
    (
        "gpu-twice-by-alias",
        MODEL + TRAINING + "provider: gcp\nconstraints:\n  gpu_types: [A100, A100-40]\n",
        "constraints.gpu_types[1]",
        8,
        "listed twice",
    ),
    (
        "unknown-cloud",
        MODEL + TRAINING + "constraints:\n  locations: [gpc/us-central1]\n",
        "constraints.locations[0]",
        7,
        "did you mean 'gcp'",
    ),
    (
        "unknown-region",
        MODEL + TRAINING + "provider: gcp\nconstraints:\n  locations:\n    - gcp/us-centrl1\n",
        "constraints.locations[0]",
        9,
        "did you mean 'us-central1'",
    ),
    (
        "bad-zone",
        MODEL
        + TRAINING
        + "provider: gcp\nconstraints:\n  locations: [gcp/us-central1/us-central1-zz]\n",
        "constraints.locations[0]",
        8,
        "unknown zone",
    ),
    (
        "location-off-provider",
        MODEL + TRAINING + "constraints:\n  locations: [gcp/us-central1]\n",
        "constraints.locations[0]",
        7,
        "provider local does not reach",
    ),
    (
        "aws-provider-gcp-place",
        MODEL + TRAINING + "provider: aws\nconstraints:\n  locations: [gcp]\n",
        "constraints.locations[0]",
        8,
        "provider aws does not reach",
    ),
    (
        "no-gpu-of-type-there",
        MODEL
        + TRAINING
        + "provider: gcp\nconstraints:\n  locations: [gcp/australia-southeast1]\n  gpu_types: [A100]\n",
        "constraints.gpu_types",
        9,
        "none of A100 is offered",
    ),
    (
        "everything-excluded",
        MODEL + TRAINING + "constraints:\n  exclude_locations: [local]\n",
        "constraints.exclude_locations",
        7,
        "no offer of the local market",
    ),
    (
        "bf16-without-bf16-gpu",
        MODEL + TRAINING + "  precision: bf16-mixed\nprovider: gcp\n"
        "constraints:\n  gpu_types: [V100, T4]\n",
        "training.precision",
        6,
        "none of V100, T4 has",
    ),
    (
        "max-gpus-zero",
        MODEL + TRAINING + "constraints:\n  max_gpus: 0\n",
        "constraints.max_gpus",
        7,
        "must be >= 1",
    ),
    (
        "min-locations-zero",
        MODEL + TRAINING + "constraints:\n  min_locations: 0\n",
        "constraints.min_locations",
        7,
        "must be >= 1",
    ),
    (
        "min-locations-over-max-gpus",
        MODEL + TRAINING + "constraints:\n  max_gpus: 2\n  min_locations: 3\n",
        "constraints.min_locations",
        8,
        "need at least as many GPUs",
    ),
    (
        "pricing-typo",
        MODEL + TRAINING + "constraints:\n  pricing: spot_only\n",
        "constraints.pricing",
        7,
        "did you mean 'spot'",
    ),
    (
        "tp-not-power-of-two",
        MODEL + TRAINING + "parallelism:\n  tensor_parallel: [1, 3]\n",
        "parallelism.tensor_parallel[1]",
        7,
        "not a power of two",
    ),
    (
        "dp-cannot-split-batch",
        MODEL + TRAINING + "  microbatch_sizes: [4]\nparallelism:\n  data_parallel: [3]\n",
        "parallelism.data_parallel[0]",
        8,
        "cannot be split over 3 replicas",
    ),
    (
        "too-many-stages",
        MODEL + TRAINING + "parallelism:\n  max_pipeline_stages: 9\n",
        "parallelism.max_pipeline_stages",
        7,
        "only 6 layers",
    ),
    (
        "checkpoint-every-zero",
        MODEL + TRAINING + "checkpointing:\n  every_steps: 0\n",
        "checkpointing.every_steps",
        7,
        "must be >= 1",
    ),
    (
        "checkpoint-bad-s3",
        MODEL + TRAINING + "checkpointing:\n  path: s3:/bucket\n",
        "checkpointing.path",
        7,
        "not s3://bucket/prefix",
    ),
    (
        "checkpoint-bad-gcs",
        MODEL + TRAINING + "checkpointing:\n  path: gs://My_Bucket/x\n",
        "checkpointing.path",
        7,
        "not gs://bucket/prefix",
    ),
    (
        "streams-zero",
        MODEL + TRAINING + "runtime:\n  streams: 0\n",
        "runtime.streams",
        7,
        "must be from 1 to 256",
    ),
    (
        "compression-with-flat",
        MODEL + TRAINING + "runtime:\n  allreduce: flat\n  compression: int8\n",
        "runtime.compression",
        8,
        "hierarchical all-reduce",
    ),
    (
        "market-file-missing",
        MODEL + TRAINING + "market: nowhere.csv\n",
        "market",
        6,
        "does not exist",
    ),
    (
        "duplicate-key",
        MODEL + TRAINING + "  steps: 20\n",
        "(top level)",
        6,
        "duplicate key 'steps'",
    ),
    ("tab-indent", MODEL + "training:\n\tglobal_batch_size: 16\n", "(top level)", 4, "tab"),
    (
        "unclosed-list",
        MODEL + TRAINING + "  microbatch_sizes: [1, 2\nobjective: {}\n",
        "(top level)",
        7,
        "not valid YAML",
    ),
    ("top-level-list", "- model: gpt-tiny\n", "(top level)", 1, "expected a mapping"),
    ("empty-file", "", "(top level)", 1, "the file is empty"),
    ("section-is-scalar", "model: gpt-tiny\n" + TRAINING, "model", 1, "expected a mapping"),
    (
        "provider-unknown",
        MODEL + TRAINING + "provider: lambda\n",
        "provider",
        6,
        "not one of local",
    ),
]


@pytest.mark.parametrize(
    ("text", "field", "line", "fragment"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_recipe_names_field_line_and_fix(write_recipe, text, field, line, fragment):
    path = write_recipe(text)
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    error = info.value
    assert error.file == str(path)
    assert error.line == line, error.render()
    if field != "(top level)" or error.field:
        assert (error.field or "(top level)") == field, error.render()
    assert fragment in error.message, error.render()
    assert error.fix, "every error says what to write instead"
    assert f"{path}:{line}" in error.render()


def test_there_are_at_least_thirty_cases():
    assert len(CASES) >= 30


def test_all_problems_are_reported_together(write_recipe):
    text = MODEL + textwrap.dedent("""\
        training:
          global_batch_size: 16
          steps: 0
          microbatch_sizes: [3]
        runtime:
          streams: 0
        """)
    with pytest.raises(RecipeError) as info:
        load_recipe(write_recipe(text))
    fields = [info.value.field] + [e.field for e in info.value.also]
    assert fields == ["training.steps", "training.microbatch_sizes[0]", "runtime.streams"]
    assert info.value.render().count("To fix:") == 3


def test_unknown_keys_do_not_hide_the_other_problems(write_recipe):
    """Every unknown key (in the file's order), then what the checks find in the rest."""
    text = MODEL + textwrap.dedent("""\
        training:
          global_batch_size: 16
          epochs: 3
          steps: 0
        objectiv:
          goal: max_throughput
        runtime:
          streams: 0
          turbo: true
        """)
    with pytest.raises(RecipeError) as info:
        load_recipe(write_recipe(text))
    fields = [info.value.field] + [e.field for e in info.value.also]
    assert fields == [
        "training.epochs",
        "objectiv",
        "runtime.turbo",
        "training.steps",
        "runtime.streams",
    ]
    assert "did you mean 'objective'" in info.value.render()


def test_missing_file_is_a_user_error(tmp_path):
    with pytest.raises(RecipeError) as info:
        load_recipe(tmp_path / "absent.yaml")
    assert "file not found" in info.value.render()
