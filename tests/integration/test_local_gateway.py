"""The local cloud's gateway: a provisioner object served by this process to callers elsewhere in
the cluster (the driver actor). Values and typed errors come back as themselves; a call the
gateway does not serve is refused."""

from __future__ import annotations

import os
import threading

import pytest

from provisioners.base import CapacityError, LaunchRequest


class FakeCloud:
    """Stands for LocalProvisioner: answers ``nodes`` and refuses every launch."""

    def nodes(self, *, gang=None):
        return [f"node-of-{gang}"]

    def launch(self, request: LaunchRequest):
        raise CapacityError(
            f"{request.count} asked, 0 free in {request.infra}",
            cloud="local",
            call="launch",
            fix="ask for fewer nodes or another location",
        )


@pytest.fixture
def served():
    import ray

    from provisioners.local.gateway import serve, start_gateway

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(
        address="local",  # a cluster of its own, never one another process started
        num_cpus=1,
        resources={"head": 1},
        include_dashboard=False,
        log_to_driver=False,
    )
    stop = threading.Event()
    server = threading.Thread(target=serve, args=(FakeCloud(), start_gateway("gw-test"), stop))
    server.start()
    try:
        yield "gw-test"
    finally:
        stop.set()
        server.join(timeout=10)
        ray.shutdown()


@pytest.mark.integration
def test_values_and_typed_errors_cross_the_gateway(served):
    from provisioners.local.gateway import RemoteProvisioner

    remote = RemoteProvisioner(served, timeout_s=30)
    assert remote.nodes(gang="g") == ["node-of-g"]
    request = LaunchRequest(
        gang="g", infra="local/sim-us/sim-us-a", instance_type="sim-t4-1", gpu="T4", count=3
    )
    with pytest.raises(CapacityError) as raised:
        remote.launch(request)
    assert raised.value.cloud == "local" and raised.value.call == "launch"
    assert "3 asked" in raised.value.message and "another location" in raised.value.fix
    with pytest.raises(ValueError, match="no call"):
        remote._call("cluster")  # not one of the calls it serves
