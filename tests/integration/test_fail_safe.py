"""A job whose state is broken stops with the cause instead of retrying for ever: submitted again
after every checkpoint it kept was damaged, it trains nothing, exits 1 and says in one line what
failed and what to do (on the local simulated cloud, end to end)."""

from __future__ import annotations

import json

import pytest

from orchestrator.catalog import default_catalog
from orchestrator.cli import main
from orchestrator.driver.job import STOP_FILE, RunOptions, run_job

RECIPE = """\
name: broken
provider: local
model: {name: gpt-tiny, profile: analytic}
training:
  global_batch_size: 4
  microbatch_sizes: [2]
  steps: 40
  optimizer: {name: adamw, lr: 3.0e-3, grad_clip_norm: null}
constraints: {locations: [local/sim-us/sim-us-a], gpu_types: [T4], max_gpus: 1, pricing: spot}
checkpointing: {every_steps: 5, path: CHECKPOINTS, keep_last: 2}
runtime: {link_emulation: false}
"""


@pytest.mark.integration
def test_a_job_whose_checkpoints_are_all_damaged_stops_with_the_cause(tmp_path, capsys):
    recipe = tmp_path / "broken.yaml"
    recipe.write_text(RECIPE.replace("CHECKPOINTS", str(tmp_path / "checkpoints")))
    folder = tmp_path / "jobs" / "broken"

    def stop_at_12(state, result) -> None:
        if state.step >= 12:
            (folder / STOP_FILE).write_text("stop\n")

    options = RunOptions(jobs_dir=tmp_path / "jobs", on_step=stop_at_12)
    first = run_job(recipe, default_catalog(), options).state
    # the follower sees a step a little after the driver commits it: it stops soon after 12
    assert first.phase == "stopped" and first.checkpoint_step == first.step >= 12
    manifests = sorted((tmp_path / "checkpoints").rglob("manifest.json"))
    assert len(manifests) == 2  # keep_last
    for path in manifests:
        path.write_bytes(b"\x00garbage")

    code = main(["submit", str(recipe), "--jobs-dir", str(tmp_path / "jobs"), "--quiet"])
    out, err = capsys.readouterr()
    state = json.loads((folder / "state.json").read_text())["state"]
    assert code == 1 and state["phase"] == "failed"
    assert state["failure"]["cause"] == "checkpoint"
    assert state["trained_steps"] == first.trained_steps  # nothing trained on a broken state
    assert f"why: checkpoint: no readable checkpoint at or before step {first.step}" in out
    assert "--from-scratch" in out and "Traceback" not in out + err
    events = [json.loads(line) for line in (folder / "events.jsonl").open()]
    assert events[-1]["event"] == "failed" and "\n" not in events[-1]["reason"]
    assert state["nodes"] == [] and state["recoveries"] <= first.recoveries + 1
