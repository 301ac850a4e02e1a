"""Chaos on the local simulated cloud: a seeded schedule of preemptions over 200 steps, one of them
a whole location at once. The job must finish with the losses of the fault-free run, lose no
committed step (every preemption comes with a notice, which the driver acts on before the node
goes) and log each preemption with its recovery time."""

from __future__ import annotations

import json

import pytest

from orchestrator.cli import main

STEPS = 200
RECIPE = f"""\
name: chaos
provider: local
model: {{name: gpt-tiny, profile: auto}}
training:
  global_batch_size: 8
  microbatch_sizes: [2]
  steps: {STEPS}
  precision: fp32
  optimizer: {{name: adamw, lr: 3.0e-3, weight_decay: 0.01, grad_clip_norm: null}}
  seed: 5
objective: {{goal: max_throughput}}
constraints:
  locations: [local/sim-us/sim-us-a, local/sim-us/sim-us-b, local/sim-eu/sim-eu-a]
  gpu_types: [T4]
  max_gpus: 2
  pricing: spot
checkpointing: {{every_steps: 25, path: CHECKPOINTS, keep_last: 2}}
runtime: {{allreduce: flat, link_emulation: false}}
local_cloud:
  preempt_at_steps: [20, 55, 90, 160]
  preempt_location_at_steps: [125]   # both nodes of the job's location at once
  notice_s: 5.0
"""


def _submit(recipe_text: str, folder, name: str) -> dict:
    recipe = folder / f"{name}.yaml"
    text = recipe_text.replace("name: chaos", f"name: {name}")
    recipe.write_text(text.replace("CHECKPOINTS", str(folder / "checkpoints")))
    assert main(["submit", str(recipe), "--jobs-dir", str(folder / "jobs"), "--quiet"]) == 0
    return json.loads((folder / "jobs" / name / "state.json").read_text())["state"]


@pytest.mark.integration
def test_five_preemptions_one_a_whole_location_lose_nothing(tmp_path, capsys):
    state = _submit(RECIPE, tmp_path, "chaos")
    out = capsys.readouterr().out
    assert state["phase"] == "done" and state["step"] == STEPS, out
    events = [json.loads(line) for line in (tmp_path / "jobs/chaos/events.jsonl").open()]
    notices = [e for e in events if e["event"] == "preemption_notice"]
    moves = [e for e in events if e["event"] == "moving_off"]
    recovered = [e for e in events if e["event"] == "recovered"]
    assert len(moves) == 5 and state["recoveries"] == 5
    assert len(notices) == 6  # four single nodes, and the two nodes of one location
    (whole,) = [m for m in moves if "," in m["reason"]]  # the location's nodes left together
    assert len(recovered) == 5 and all(e["details"]["recovery_s"] > 0 for e in recovered)
    assert out.count("recovered in") == 5  # the summary lists each recovery and its time
    # each move is followed by its recovery before the next one
    order = [e["event"] for e in events if e["event"] in ("moving_off", "recovered")]
    assert order == ["moving_off", "recovered"] * 5
    assert "node_lost" not in {e["event"] for e in events}
    # the market had nothing left in that location: the plans after it went elsewhere
    gone = {
        n["details"]["infra"] for n in notices if n["details"]["step"] == whole["details"]["step"]
    }
    (place,) = gone
    later = [e for e in events if e["event"] == "planned" and e["time_s"] > whole["time_s"]]
    assert later and all(place not in e["plan_after"] for e in later)
    # no committed step lost: every step trained exactly once
    assert state["trained_steps"] == STEPS

    # the fault-free run of the same job: the same losses, step for step. Every plan here has
    # the same shape (PP1 x DP2), so only where the replicas run changes, not the arithmetic:
    # equal to the last bit. (Against a single-process run the sums' order differs and fp32
    # drift grows to ~3e-3 relative by step 200.)
    plans = {e["plan_after"].split(",")[0] for e in events if e["event"] == "planned"}
    assert len(plans) == 1, plans
    fault_free = _submit(RECIPE.split("local_cloud:")[0], tmp_path, "fault-free")
    assert fault_free["recoveries"] == 0
    assert state["losses"] == fault_free["losses"]
