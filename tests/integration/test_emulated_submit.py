"""``submit --emulate`` of an AWS and a GCP recipe: the driver on the controller VM calls the
emulated API itself (moto's EC2 through the real boto3 client; the Compute API fake through the
real google-cloud-compute client) on the job's simulated internet, every instance boots its
user-data / startup-script as a namespace VM and joins over WireGuard, a spot reclaim is heard by
the node's own watcher from its metadata server (IMDSv2, GCE's ``preempted``) and becomes the
driver's preemption notice, the job recovers and finishes, its spend is priced at the provider's
prices, and nothing is left. With no capacity or quota anywhere: one line, nothing launched.
Needs root, iproute2, nftables, wireguard-go and moto's server; skipped elsewhere."""

from __future__ import annotations

import json
import re

import pytest

from provisioners.local import netns, vms

REASON = vms.unsupported_reason()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(REASON is not None, reason=f"namespace VMs: {REASON}"),
]

RECIPE = """\
name: emu-PROVIDER-job
provider: PROVIDER
model: {name: gpt-tiny, profile: analytic}
training:
  {global_batch_size: 8, microbatch_sizes: [2, 4], steps: 60, precision: fp32, seed: 0,
   optimizer: {name: adamw, lr: 1.0e-3, weight_decay: 0.01, grad_clip_norm: null}}
objective: {goal: max_throughput}
constraints:
  {locations: [REGION], gpu_types: [T4], max_gpus: 2, min_locations: 2, pricing: spot}
checkpointing: {every_steps: 10, path: CHECKPOINTS, keep_last: 2}
runtime: {allreduce: hierarchical, link_emulation: false}
"""


REGIONS = {"aws": "aws/us-east-1", "gcp": "gcp/us-central1", "azure": "azure/eastus"}
# the emulated Compute API's prices (its Billing SKUs, gcp_api.py): n1-standard-8 + 1 T4, spot
GCP_SPOT = {"n1-standard-8": 8 * 0.0066 + 30 * 0.0009 + 0.14}


def _recipe(tmp_path, provider: str):
    recipe = tmp_path / f"emu-{provider}-job.yaml"
    text = RECIPE.replace("CHECKPOINTS", str(tmp_path / "checkpoints"))
    recipe.write_text(text.replace("PROVIDER", provider).replace("REGION", REGIONS[provider]))
    return recipe


BUCKETS = {  # the job's folder in its bucket (a storage account's names are hashed)
    "gcp": r"gs://geo-test-project-us-central1/jobs/emu-gcp-job",
    "azure": r"https://geo[0-9a-f]{21}\.blob\.core\.windows\.net/geo/jobs/emu-azure-job",
}


# aws: test_controller_vm.py, the same through a controller VM of a standing emulated cloud.
# gcp and azure as `submit --emulate` runs them: the controller a GCE instance (a VM with a
# managed identity) launched through the adapter, the job's folder in the fake's Cloud Storage
# (a storage account's container)
@pytest.mark.parametrize("provider,controller_vm", [("gcp", True), ("azure", True)])
def test_a_job_trains_on_the_emulated_cloud_through_a_reclaim(
    tmp_path, monkeypatch, provider, controller_vm
):
    from orchestrator.catalog import default_catalog
    from orchestrator.driver.job import RunOptions, run_job

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)  # the emulation brings its own keys
    monkeypatch.setenv("GEO_ORCHESTRATOR_HOME", str(tmp_path / "home"))  # its standing cloud
    recipe = _recipe(tmp_path, provider)
    options = RunOptions(
        jobs_dir=tmp_path / "jobs",
        emulate=True,
        controller_vm=controller_vm,
        preempt_at=(8,),
        notice_s=8.0,
    )
    result = run_job(recipe, default_catalog(), options)
    if controller_vm:  # its folder came back from the job's bucket
        record = json.loads((result.folder / "bucket.json").read_text())
        assert re.fullmatch(BUCKETS[provider], record["url"]), record["url"]

    assert result.state.phase == "done" and result.state.step == 60
    events = [json.loads(line) for line in (result.folder / "events.jsonl").open()]
    kinds = [e["event"] for e in events]
    chaos = next(e for e in events if e["event"] == "chaos")
    notice = next(e for e in events if e["event"] == "preemption_notice")
    # the reclaimed instance's notice came from its own watcher (metadata -> drain -> notice)
    assert notice["reason"].startswith(f"node {chaos['details']['node']} ")
    # (a launch that failed before training, e.g. a node too slow to join on a loaded machine,
    # is an earlier loss and recovery of its own)
    heard = kinds.index("preemption_notice")
    assert kinds.index("chaos") < heard < kinds.index("recovered", heard)
    assert "node_lost" not in kinds[kinds.index("chaos") :]  # moved off before the node went
    # priced at the emulated API's spot price: the catalog's published one for its type
    assert result.choice is not None
    for request in result.choice.requests:
        region = request.infra.split("/")[1]
        expected = (
            GCP_SPOT[request.instance_type]
            if provider == "gcp"
            else _catalog_spot(provider, region, request.instance_type)
        )  # fmt: skip
        assert request.usd_per_node_hour == pytest.approx(expected)
    assert result.state.compute_usd > 0
    assert [
        n for n in netns.namespaces() if n.startswith(netns.prefix(f"emu-{provider}-job"))
    ] == []
    # a standing cloud the run started went with it
    assert [n for n in netns.namespaces() if f"emulated-{provider}" in n] == []


def _catalog_spot(cloud: str, region: str, instance_type: str) -> float:
    from orchestrator.catalog import default_catalog

    return min(
        o.spot_usd_per_hour
        for o in default_catalog().offers.offers
        if o.location.cloud == cloud
        and o.location.region == region
        and o.instance_type == instance_type
        and o.spot_usd_per_hour is not None
    )


@pytest.mark.parametrize(
    ("provider", "kind", "answer", "fix"),
    [  # one case per cloud (the suite's time): capacity and quota read alike in the driver
        ("aws", "quota", "MaxSpotInstanceCountExceeded", "quota"),
        ("gcp", "capacity", "ZONE_RESOURCE_POOL_EXHAUSTED", "another zone"),
        ("azure", "capacity", "ZonalAllocationFailed", "zone"),
    ],
)
def test_no_capacity_or_quota_anywhere_is_one_line_and_launches_nothing(
    tmp_path, provider, kind, answer, fix
):
    from orchestrator.catalog import default_catalog
    from orchestrator.driver.job import RunOptions, run_job

    region = REGIONS[provider]
    options = RunOptions(
        jobs_dir=tmp_path / "jobs",
        emulate=True,
        emulated_refusals=((region.split("/")[1], kind),),
    )
    result = run_job(_recipe(tmp_path, provider), default_catalog(), options)
    failure = result.state.failure
    assert result.state.phase == "failed" and failure["cause"] == "capacity", failure
    assert f"answered {answer}" in failure["message"] and f"in {region}/" in failure["message"]
    assert fix in failure["fix"] and "\n" not in failure["message"]
    booted = result.folder / "instances"
    assert not booted.exists() or not any(booted.iterdir()), "no instance ever booted"
    assert [
        n for n in netns.namespaces() if n.startswith(netns.prefix(f"emu-{provider}-job"))
    ] == []
    # a standing cloud the run started went with it
    assert [n for n in netns.namespaces() if f"emulated-{provider}" in n] == []
