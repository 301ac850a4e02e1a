"""``submit`` on the local cloud with models that are not built in, and data of the user's.

A Hugging Face GPT-2 (its shape from its config, its per-layer times measured here since
``profile: auto``) reads token files from a (moto) bucket as 2 stages x 2 replicas over two
locations; one of its nodes is preempted with notice and the job re-plans. It ends with the
single-process run's losses on the same samples, and the sample ids its committed steps logged
hold every window of the set exactly once per epoch. A model from a user's package beside the
recipe trains too, its code reaching the driver and the workers through Ray's ``runtime_env``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.integration.conftest import SMALL_GPT2  # noqa: E402
from tests.integration.jobs import submit_job  # noqa: E402

USER_PACKAGE = Path(__file__).parents[1] / "fixtures" / "usermodels" / "tiny_lm"
TOKENS = "s3://token-set/train"
WINDOWS = 40  # in the token set: 30 steps of 8 samples are 6 epochs
RECIPE = """\
name: job
provider: local
model: MODEL
DATA
training:
  global_batch_size: 8
  microbatch_sizes: [2]
  steps: STEPS
  precision: fp32
  optimizer: {name: adamw, lr: 3.0e-3, grad_clip_norm: 1.0}
  seed: 3
objective: {goal: max_throughput}
constraints:
  locations: [local/sim-us/sim-us-a, local/sim-eu/sim-eu-a]
  gpu_types: [T4]
  max_gpus: 4
  pricing: spot
parallelism: {tensor_parallel: [TP], data_parallel: [DP], max_pipeline_stages: 2}
checkpointing: {every_steps: 6, path: CHECKPOINTS, keep_last: 2}
runtime: {link_emulation: false}
local_cloud: {preempt_at_steps: PREEMPT, notice_s: 2.0OFFERS}
"""
# nodes of two CPU slots (two "GPUs") in both places: room for a tensor-parallel group per node
OFFERS = """\
cloud,region,zone,instance_type,gpu,gpus_per_node,vcpus,memory_gib,on_demand_usd_per_hour,\
spot_usd_per_hour,available_count,preemption_rate_per_hour,source,as_of
local,sim-us,sim-us-a,sim-t4-2,T4,2,2,4,1.144,0.360,3,0.1,test market,2023-04-01
local,sim-eu,sim-eu-a,sim-t4-2,T4,2,2,4,1.144,0.360,3,0.1,test market,2023-04-01
"""
# the same sums in another order (replicas, stages), carried by Adam over 30 steps
RELATIVE_TOLERANCE = 1e-4


def _recipe(
    model: str, *, data: str = "", steps: int, preempt: str = "[]", tp: int = 1, offers: str = ""
) -> str:
    text = RECIPE.replace("MODEL", model).replace("DATA\n", f"data: {data}\n" if data else "")
    text = text.replace("TP", str(tp)).replace("DP", "1" if tp > 1 else "2")
    text = text.replace("OFFERS", f", offers: {offers}" if offers else "")
    return text.replace("STEPS", str(steps)).replace("PREEMPT", preempt)


def _reference(source, steps: int, data=None) -> list[float]:
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
    return workload_losses(build_workload(source, seed=3, data=data), config)


def _check_losses(state: dict, want: list[float]) -> None:
    assert state["phase"] == "done" and state["step"] == len(want)
    got = state["losses"]
    relative = [abs(g - w) / w for g, w in zip(got, want, strict=True)]
    assert max(relative) <= RELATIVE_TOLERANCE, (relative, got, want)


def _token_set(endpoint: str) -> None:
    """Two token files, 25 and 15 windows of GPT-2's 32 tokens (and one more token each)."""
    import boto3
    import numpy as np

    s3 = boto3.client("s3", endpoint_url=endpoint)
    s3.create_bucket(Bucket="token-set")
    rng = np.random.default_rng(0)
    for name, windows in (("a.bin", 25), ("b.bin", 15)):
        tokens = rng.integers(0, SMALL_GPT2["vocab_size"], size=windows * 32 + 1, dtype=np.uint16)
        s3.put_object(Bucket="token-set", Key=f"train/{name}", Body=tokens.tobytes())


@pytest.mark.integration
def test_a_gpt2_on_token_files_survives_a_preemption_with_one_process_losses(
    tmp_path, monkeypatch, s3_endpoint, s3_env
):
    from runtime.models.protocol import ModelSource
    from runtime.workload import DataSource

    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_endpoint)  # the nodes' boto3 finds moto
    _token_set(s3_endpoint)
    model = f"{{hf: gpt2, config: {json.dumps(SMALL_GPT2)}, profile: auto}}"  # JSON is YAML
    data = f'{{source: tokens, path: "{TOKENS}", log_samples: true}}'
    state = submit_job(_recipe(model, data=data, steps=30, preempt="[11]"), tmp_path, "hf-job")

    events = [json.loads(line) for line in (tmp_path / "jobs/hf-job/events.jsonl").open()]
    assert any(e["event"] == "recovered" for e in events)
    planned = [e for e in events if e["event"] == "planned"]
    assert planned and planned[0]["plan_after"].startswith("PP2 x DP2 x TP1"), planned
    source = ModelSource(kind="hf", target="gpt2", args=SMALL_GPT2)
    _check_losses(state, _reference(source, 30, DataSource(kind="tokens", url=TOKENS)))

    committed = {}  # a step trained again after a rollback: its last commit counts
    for line in (tmp_path / "jobs/hf-job/metrics.jsonl").open():
        row = json.loads(line)
        committed[row["step"]] = row["samples"]
    read = [i for step in sorted(committed) for i in committed[step]]
    assert len(read) == 30 * 8
    epochs = [read[e * WINDOWS : (e + 1) * WINDOWS] for e in range(6)]
    assert all(sorted(epoch) == list(range(WINDOWS)) for epoch in epochs)
    assert epochs[0] != epochs[1]  # each epoch in an order of its own


@pytest.mark.integration
def test_a_gpt2_as_two_stages_of_tp2_survives_a_preemption_with_one_process_losses(tmp_path):
    """Nodes of two slots; the planner may only split by 2: two stages of TP 2 (profiled split
    on this machine first), one node preempted, the job re-planned and resumed from the shards."""
    from runtime.models.protocol import ModelSource

    (tmp_path / "offers.csv").write_text(OFFERS)
    model = f"{{hf: gpt2, config: {json.dumps(SMALL_GPT2)}, profile: auto}}"
    recipe = _recipe(model, steps=9, preempt="[4]", tp=2, offers="offers.csv")
    state = submit_job(recipe.replace("every_steps: 6", "every_steps: 3"), tmp_path, "tp-job")

    events = [json.loads(line) for line in (tmp_path / "jobs/tp-job/events.jsonl").open()]
    assert any(e["event"] == "recovered" for e in events)
    planned = [e for e in events if e["event"] == "planned"]
    assert planned and planned[0]["plan_after"].startswith("PP2 x DP1 x TP2"), planned
    profile = json.loads(next((tmp_path / "jobs/tp-job").glob("profile-*.json")).read_text())
    assert sorted(profile["layers"]) == ["1", "2"]  # measured whole and split on this machine
    _check_losses(state, _reference(ModelSource(kind="hf", target="gpt2", args=SMALL_GPT2), 9))


@pytest.mark.integration
def test_a_model_from_a_package_beside_the_recipe_trains_through_submit(tmp_path, monkeypatch):
    from runtime.models.protocol import ModelSource

    shutil.copytree(USER_PACKAGE, tmp_path / "tiny_lm")  # the user's folder: recipe and package
    model = '{module: "tiny_lm:build", args: {depth: 4}, profile: auto}'
    state = submit_job(_recipe(model, steps=8), tmp_path, "own-job")
    monkeypatch.syspath_prepend(str(tmp_path))  # for this process's reference run only
    source = ModelSource(kind="module", target="tiny_lm:build", args={"depth": 4})
    _check_losses(state, _reference(source, 8))
