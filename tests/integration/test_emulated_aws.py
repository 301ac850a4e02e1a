"""The AWS adapter on an emulated EC2 that really boots (provisioners/emulated/aws.py): the real
boto3 client talks to moto's server over the job's simulated internet, each instance moto starts
boots as a namespace VM from its decoded user-data (the node bootstrap, rendered by
JoinedProvisioner), joins the job's Ray cluster over WireGuard, hears its spot reclaim from its own
instance metadata (IMDSv2) and drains itself; the driver's side sees one PreemptionNotice, then the
loss. Needs root, iproute2, nftables, wireguard-go and moto's server; skipped elsewhere."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from provisioners.base import LaunchRequest, NodeLost, PreemptionNotice
from provisioners.local import netns, vms

REASON = vms.unsupported_reason()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(REASON is not None, reason=f"namespace VMs: {REASON}"),
]
JOB = "emu-aws-test"
REGION = "us-east-1"
ZONE = "us-east-1a"
AMI_PARAMETER = "/aws/service/ami-amazon-linux-latest/amzn2-ami-hvm-x86_64-gp2"


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A controller VM (overlay + Ray head), an emulated EC2 on its internet, the AWS adapter
    behind JoinedProvisioner; all removed after."""
    import boto3
    import ray

    from orchestrator.driver.cloud import controller_link, node_boot
    from provisioners.aws import AwsProvisioner
    from provisioners.bootstrap.joined import JoinedProvisioner
    from provisioners.emulated.aws import EmulatedAws

    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEMULATEDEMULATED")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "emulated-secret")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    cluster = vms.NamespaceCluster(job=JOB, folder=tmp_path / "vms", grace_s=30.0)
    aws = joined = None
    try:
        address = cluster.address  # the controller VM, entered by this (main) thread
        ray.init(address=address, log_to_driver=False)
        aws = EmulatedAws(internet=cluster.internet, folder=tmp_path / "ec2", vm_env=vms._vm_env())
        endpoint = aws.start()
        inner = AwsProvisioner(
            regions=[REGION],
            session_factory=lambda: boto3.session.Session(region_name=REGION),
            endpoint_url=endpoint,
            ami_ssm_parameter=AMI_PARAMETER,
            placement_scores=False,
            on_demand_prices=False,
            poll_interval_s=0.5,
        )
        cloud = _cloud(cluster, tmp_path / "nodes")
        joined = JoinedProvisioner(
            inner,
            job=JOB,
            link=controller_link(cloud),
            boot_for=node_boot(cloud, JOB),
            lease_s=3600.0,
        )
        yield joined, aws, cluster
    finally:
        if joined is not None:
            joined.terminate([n.node_id for n in joined.nodes()])
            joined.close()
        if aws is not None:
            aws.close()
        ray.shutdown()
        cluster.shutdown()
    assert [n for n in netns.namespaces() if n.startswith(netns.prefix(JOB))] == []


def _cloud(cluster, folder: Path):
    """The controller's side as submit --emulate makes it (orchestrator/driver/cloud.py)."""
    from orchestrator.driver.cloud import CloudSpec, halt_self_command

    return CloudSpec(
        provider="aws",
        regions=(REGION,),
        endpoint_url=None,
        ray_address=cluster.address,
        admin_socket=str(cluster.admin_socket),
        install=cluster.install,
        nodes_dir=str(folder),
        ray_env=tuple(vms.RAY_ENV.items()),
        shutdown_command=halt_self_command(),
        grace_s=30.0,
        node_label=vms.NODE_LABEL,
    )


def test_an_instance_boots_its_user_data_joins_and_hears_its_reclaim(world):
    import ray

    joined, aws, _ = world
    request = LaunchRequest(gang="g", infra=f"aws/{REGION}/{ZONE}", instance_type="g4dn.xlarge",
                            gpu="T4", count=1, timeout_s=120.0)  # fmt: skip
    (node,) = joined.launch(request)
    assert aws.vm_of(node.node_id) is not None, "the instance is a VM"
    labelled = [n for n in ray.nodes() if n["Alive"] and n["Labels"].get("geo-gang") == "g"]
    assert len(labelled) == 1
    assert labelled[0]["Resources"].get(f"infra:aws/{REGION}/{ZONE}") == 1.0

    aws.interrupt(node.node_id, notice_s=6.0)
    events, deadline = [], time.monotonic() + 30
    while time.monotonic() < deadline and not any(isinstance(e, NodeLost) for e in events):
        events += joined.poll_events(timeout_s=1.0)
    kinds = [type(e).__name__ for e in events]
    assert kinds.count("PreemptionNotice") == 1, kinds
    notice = next(e for e in events if isinstance(e, PreemptionNotice))
    lost = next(e for e in events if isinstance(e, NodeLost))
    assert notice.node_id == lost.node_id == node.node_id and lost.reason == "preempted"
    assert kinds.index("PreemptionNotice") < kinds.index("NodeLost")
    assert aws.vm_of(node.node_id) is None, "the reclaimed instance's VM is gone"
