"""orchestrator/driver/cloud.py node_boot: what a node of a cloud provider boots with. On a real
provider each GPU of the instance type is a Ray GPU (its workers train on CUDA); on an emulated
one the same slots are CPUs standing in for them. Either way a node carries its job, its name
label and a worker slot per GPU."""

from __future__ import annotations

from orchestrator.driver.cloud import CloudSpec, node_boot
from provisioners.base import LaunchRequest


def _cloud(endpoint_url):
    return CloudSpec(
        provider="aws",
        regions=("us-east-1",),
        endpoint_url=endpoint_url,
        ray_address="100.64.0.1:6379",
        admin_socket="/run/geo/admin.sock",
        install=None,
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
