"""``submit --emulate`` of an AWS recipe: the driver on the controller VM calls the emulated EC2
itself (moto's server on the job's simulated internet, through the real boto3 client), every
instance boots its user-data as a namespace VM and joins over WireGuard, a spot reclaim is heard by
the node's own watcher from its instance metadata and becomes the driver's preemption notice, the
job recovers and finishes, its spend is priced at the provider's spot price, and nothing is left.
Needs root, iproute2, nftables, wireguard-go and moto's server; skipped elsewhere."""

from __future__ import annotations

import json

import pytest

from provisioners.local import netns, vms

REASON = vms.unsupported_reason()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(REASON is not None, reason=f"namespace VMs: {REASON}"),
]

RECIPE = """\
name: emu-aws-job
provider: aws
model: {name: gpt-tiny, profile: analytic}
training:
  {global_batch_size: 8, microbatch_sizes: [2, 4], steps: 30, precision: fp32, seed: 0,
   optimizer: {name: adamw, lr: 1.0e-3, weight_decay: 0.01, grad_clip_norm: null}}
objective: {goal: max_throughput}
constraints:
  {locations: [aws/us-east-1], gpu_types: [T4], max_gpus: 2, min_locations: 2, pricing: spot}
checkpointing: {every_steps: 5, path: CHECKPOINTS, keep_last: 2}
runtime: {allreduce: hierarchical, link_emulation: false}
"""


def test_an_aws_job_trains_on_the_emulated_cloud_through_a_reclaim(tmp_path, monkeypatch):
    from orchestrator.catalog import default_catalog
    from orchestrator.driver.job import RunOptions, run_job

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)  # the emulation brings its own keys
    recipe = tmp_path / "emu-aws-job.yaml"
    recipe.write_text(RECIPE.replace("CHECKPOINTS", str(tmp_path / "checkpoints")))
    options = RunOptions(jobs_dir=tmp_path / "jobs", emulate=True, preempt_at=(8,), notice_s=8.0)
    result = run_job(recipe, default_catalog(), options)

    assert result.state.phase == "done" and result.state.step == 30
    events = [json.loads(line) for line in (result.folder / "events.jsonl").open()]
    kinds = [e["event"] for e in events]
    chaos = next(e for e in events if e["event"] == "chaos")
    notice = next(e for e in events if e["event"] == "preemption_notice")
    # the reclaimed instance's notice came from its own watcher (IMDS -> drain -> notice)
    assert notice["reason"].startswith(f"node {chaos['details']['node']} ")
    assert chaos["details"]["node"].startswith("i-")  # an EC2 instance id
    assert kinds.index("chaos") < kinds.index("preemption_notice") < kinds.index("recovered")
    assert "node_lost" not in kinds or kinds.index("node_lost") > kinds.index("preemption_notice")
    # priced at the emulated API's spot price: the catalog's published one for its type
    assert result.choice is not None
    for request in result.choice.requests:
        region = request.infra.split("/")[1]
        assert request.usd_per_node_hour == pytest.approx(
            _catalog_spot(region, request.instance_type)
        )
    assert result.state.compute_usd > 0
    assert [n for n in netns.namespaces() if n.startswith(netns.prefix("emu-aws-job"))] == []


def _catalog_spot(region: str, instance_type: str) -> float:
    from orchestrator.catalog import default_catalog

    return min(
        o.spot_usd_per_hour
        for o in default_catalog().offers.offers
        if o.location.cloud == "aws"
        and o.location.region == region
        and o.instance_type == instance_type
        and o.spot_usd_per_hour is not None
    )


@pytest.mark.parametrize(
    ("code", "fix"),
    [
        ("InsufficientInstanceCapacity", "try another zone"),
        ("MaxSpotInstanceCountExceeded", "quota"),
    ],
)
def test_no_capacity_or_quota_anywhere_is_one_line_and_launches_nothing(tmp_path, code, fix):
    from orchestrator.catalog import default_catalog
    from orchestrator.driver.job import RunOptions, run_job

    recipe = tmp_path / "emu-aws-job.yaml"
    recipe.write_text(RECIPE.replace("CHECKPOINTS", str(tmp_path / "checkpoints")))
    options = RunOptions(
        jobs_dir=tmp_path / "jobs", emulate=True, emulated_refusals=(("us-east-1", code),)
    )
    result = run_job(recipe, default_catalog(), options)
    failure = result.state.failure
    assert result.state.phase == "failed" and failure["cause"] == "capacity"
    assert f"ec2.run_instances answered {code} in aws/us-east-1/us-east-1a" in failure["message"]
    assert fix in failure["fix"] and "\n" not in failure["message"]
    booted = result.folder / "instances"
    assert not booted.exists() or not any(booted.iterdir()), "no instance ever booted"
    assert [n for n in netns.namespaces() if n.startswith(netns.prefix("emu-aws-job"))] == []
