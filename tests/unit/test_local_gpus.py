"""The local cloud on a machine with GPUs: which GPU each simulated node's workers train on, and
which groups may take NCCL (never two ranks on one GPU)."""

from __future__ import annotations

import os

import pytest

from provisioners.local.cluster import CUDA_FIRST_ENV, LocalCluster, NodeSpec
from runtime import devices
from runtime.comm import Comm
from runtime.devices import cuda_index


def _spec(name: str, gpus: int, role: str = "worker") -> NodeSpec:
    return NodeSpec(
        name=name,
        cloud="local",
        region="sim-eu",
        zone="sim-eu-a",
        gpu="T4",
        gpus=gpus,
        vcpus=gpus,
        gang="g",
        role=role,
    )


def test_nodes_take_the_machines_gpus_in_turn():
    cluster = LocalCluster(host_gpus=3, dies_with_owner=False)
    firsts = []
    for name, gpus in (("a", 2), ("b", 2), ("c", 1)):
        count, env = cluster._gpu_settings(_spec(name, gpus))
        assert count == gpus
        assert env[devices.NOSET_ENV] == "1"
        firsts.append(int(env[CUDA_FIRST_ENV]))
    assert firsts == [0, 2, 1]  # a: 0,1; b: 2,0; c: 1
    assert CUDA_FIRST_ENV == devices.CUDA_FIRST_ENV  # two packages, one name


def test_no_gpus_on_a_cpu_machine_nor_for_the_controller():
    assert LocalCluster(dies_with_owner=False)._gpu_settings(_spec("a", 2)) == (0, {})
    on_gpus = LocalCluster(host_gpus=1, dies_with_owner=False)
    assert on_gpus._gpu_settings(_spec("ctl", 1, role="controller")) == (0, {})


def test_a_worker_finds_its_gpu_from_rays_id(monkeypatch):
    monkeypatch.delenv(devices.NOSET_ENV, raising=False)
    assert cuda_index(["5"], device_count=1) == 0  # Ray showed the worker its GPU alone
    monkeypatch.setenv(devices.NOSET_ENV, "1")
    monkeypatch.setenv(CUDA_FIRST_ENV, "2")
    assert cuda_index(["1"], device_count=4) == 3
    assert cuda_index(["1"], device_count=2) == 1  # round robin: more node GPUs than the host's
    assert cuda_index([], device_count=4) == 0


@pytest.mark.parametrize(
    ("gpus", "ranks", "shared", "reaches"),
    [
        (["h/GPU-a", "h/GPU-b"], (0, 1), False, True),
        (["h/GPU-a", "h/GPU-a"], (0, 1), False, False),  # one host, one GPU twice: refused
        (["h/GPU-a", "h/GPU-a"], (0, 1), True, True),  # each rank an NCCL host of its own
        (["h/GPU-a", None], (0, 1), True, False),  # a CPU worker
        (["h/GPU-a", "g/GPU-a", "h/GPU-a"], (0, 1), False, True),
    ],
)
def test_nccl_between_ranks_on_gpus_of_their_own_or_hosts_of_their_own(
    gpus, ranks, shared, reaches
):
    comm = Comm.__new__(Comm)
    comm._gpus, comm.gpu_shared = gpus, shared
    assert comm._nccl_reaches(ranks) is reaches


def test_ranks_sharing_a_gpu_become_nccl_hosts_of_their_own(monkeypatch):
    assert not devices.share_a_gpu(["h/GPU-a", "h/GPU-b", None, None])
    assert devices.share_a_gpu(["h/GPU-a", None, "h/GPU-a"])
    monkeypatch.setenv(devices.NCCL_HOST_ENV, "unset")  # recorded, so the test undoes it
    devices.own_nccl_host(3)
    first = os.environ[devices.NCCL_HOST_ENV]
    devices.own_nccl_host(4)
    assert first.endswith("geo-rank-3") and os.environ[devices.NCCL_HOST_ENV] != first
