"""``submit`` on the local cloud with models that are not built in: a Hugging Face GPT-2 (its
shape from its config, its per-layer times measured here, since ``profile: auto``) planned over two
locations, one of its nodes preempted with notice; and a model from a user's package next to the
recipe, its code reaching the driver and the workers through Ray's ``runtime_env``. Each job ends
with the single-process run's losses: nothing the preemption or the shipping did changed them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.integration.jobs import submit_job  # noqa: E402

USER_PACKAGE = Path(__file__).parents[1] / "fixtures" / "usermodels" / "tiny_lm"
# dropout off: the pipeline's workers draw masks from other generators than one process does
GPT2 = {
    "n_layer": 4,
    "n_embd": 64,
    "n_head": 4,
    "n_positions": 32,
    "vocab_size": 512,
    "resid_pdrop": 0.0,
    "embd_pdrop": 0.0,
    "attn_pdrop": 0.0,
}
RECIPE = """\
name: job
provider: local
model: MODEL
training:
  global_batch_size: 8
  microbatch_sizes: [2]
  steps: 24
  precision: fp32
  optimizer: {name: adamw, lr: 3.0e-3, grad_clip_norm: 1.0}
  seed: 3
objective: {goal: max_throughput}
constraints:
  locations: [local/sim-us/sim-us-a, local/sim-eu/sim-eu-a]
  gpu_types: [T4]
  max_gpus: 4
  pricing: spot
parallelism: {tensor_parallel: [1]}
checkpointing: {every_steps: 8, path: CHECKPOINTS, keep_last: 2}
runtime: {link_emulation: false}
local_cloud: {preempt_at_steps: PREEMPT, notice_s: 2.0}
"""
# the same sums in another order (replicas, stages), carried by Adam over 24 steps
RELATIVE_TOLERANCE = 1e-4


def _reference(model_source, steps: int) -> list[float]:
    from runtime.reference import TrainConfig, workload_losses
    from runtime.workload import build_workload

    config = TrainConfig(
        steps=steps,
        global_batch_size=8,
        microbatch_size=2,
        learning_rate=3e-3,
        seed=3,
        grad_clip_norm=1.0,
    )
    return workload_losses(build_workload(model_source, seed=3), config)


def _check(state: dict, want: list[float]) -> None:
    assert state["phase"] == "done" and state["step"] == len(want)
    got = state["losses"]
    relative = [abs(g - w) / w for g, w in zip(got, want, strict=True)]
    assert max(relative) <= RELATIVE_TOLERANCE, (relative, got, want)


@pytest.mark.integration
def test_a_hugging_face_gpt2_job_survives_a_preemption_with_one_process_losses(tmp_path):
    from runtime.models.protocol import ModelSource

    model = f"{{hf: gpt2, config: {json.dumps(GPT2)}, profile: auto}}"  # JSON is YAML
    recipe = RECIPE.replace("MODEL", model)
    state = submit_job(recipe.replace("PREEMPT", "[12]"), tmp_path, "hf-job")
    events = [json.loads(line) for line in (tmp_path / "jobs/hf-job/events.jsonl").open()]
    assert any(e["event"] == "recovered" for e in events)
    stages = state["plan"]["stages"]
    assert len(stages) == 2 and all(len(s["replicas"]) == 2 for s in stages), stages
    _check(state, _reference(ModelSource(kind="hf", target="gpt2", args=GPT2), 24))


@pytest.mark.integration
def test_a_model_from_a_package_beside_the_recipe_trains_through_submit(tmp_path, monkeypatch):
    from runtime.models.protocol import ModelSource

    shutil.copytree(USER_PACKAGE, tmp_path / "tiny_lm")  # the user's folder: recipe and package
    recipe = RECIPE.replace("MODEL", '{module: "tiny_lm:build", args: {depth: 4}, profile: auto}')
    state = submit_job(recipe.replace("PREEMPT", "[]"), tmp_path, "own-job")
    monkeypatch.syspath_prepend(str(tmp_path))  # for this process's reference run only
    source = ModelSource(kind="module", target="tiny_lm:build", args={"depth": 4})
    _check(state, _reference(source, 24))
