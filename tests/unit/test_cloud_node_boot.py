"""orchestrator/driver/cloud.py node_boot: what a node of a cloud provider boots with. On a real
provider each GPU of the instance type is a Ray GPU (its workers train on CUDA); on an emulated
one the same slots are CPUs standing in for them. Either way a node carries its job, its name
label and a worker slot per GPU."""

from __future__ import annotations

from orchestrator.driver.cloud import CloudSpec, node_boot
from provisioners.base import LaunchRequest


def _cloud(endpoint_url, install=None):
    return CloudSpec(
        provider="aws",
        regions=("us-east-1",),
        endpoint_url=endpoint_url,
        ray_address="100.64.0.1:6379",
        admin_socket="/run/geo/admin.sock",
        install=install,
        nodes_dir="/var/lib/geo/nodes",
        ray_env=(),
        shutdown_command="shutdown -h now",
        grace_s=60.0,
        node_label="geo-node",
    )


def _request():
    return LaunchRequest(
        gang="job-0",
        infra="aws/us-east-1/us-east-1a",
        instance_type="g5.12xlarge",
        gpu="A10G",
        count=1,
        gpus_per_node=4,
    )


def test_a_real_instances_gpus_are_ray_gpus():
    boot = node_boot(_cloud(None), "job")("job-0-0", "token", _request())
    assert boot.num_gpus == 4 and boot.num_cpus == 4
    assert boot.labels["geo-node"] == "job-0-0" and boot.job == "job"


def test_an_emulated_instances_gpus_are_cpu_slots():
    boot = node_boot(_cloud("http://198.51.100.1:5000"), "job")("job-0-0", "token", _request())
    assert boot.num_gpus == 0 and boot.num_cpus == 4


def test_each_real_node_gets_a_wheel_url_presigned_for_its_own_boot(monkeypatch):
    """The controller's role keys expire within hours; a job replaces nodes for days: the
    URL is signed when the node is launched, not when the controller started."""
    import pytest

    pytest.importorskip("moto")
    from moto import mock_aws

    from provisioners.bootstrap.script import Install

    for name, value in (
        ("AWS_ACCESS_KEY_ID", "AKIAEXAMPLEEXAMPLE00"),
        ("AWS_SECRET_ACCESS_KEY", "x" * 40),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        monkeypatch.setenv(name, value)  # fmt: skip
    install = Install(
        mode="pip", wheel="s3://geo-orchestrator-1-us-east-1/jobs/job/wheel/w.whl",
        package_version="0.1.0", ray_version="2.60.0", torch_version="2.13.0",
    )  # fmt: skip
    with mock_aws():
        boot_for = node_boot(_cloud(None, install), "job")
        first = boot_for("job-0-0", "token", _request()).install.wheel
        second = boot_for("job-0-1", "token", _request()).install.wheel
    assert first.startswith("https://") and "X-Amz-Signature" in first
    assert "X-Amz-Expires=3600" in first and second.startswith("https://")
