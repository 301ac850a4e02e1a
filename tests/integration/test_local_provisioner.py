"""The local simulated spot cloud: its market (no Ray) and, on a real local Ray cluster, the contract
and a preemption that really kills a node, with the notice before the death."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from provisioners.base import LaunchRequest, NodeLost, NodeState, Offer, PreemptionNotice
from provisioners.local import LocalProvisioner
from provisioners.local.market import LocalMarket, MarketClock
from provisioners.local.trace import (
    Trace,
    TraceError,
    TracePoint,
    read_sailor_csv,
    read_sailor_json,
    read_trace,
)
from tests.integration.contract import Harness, run_contract, wait_for

SAILOR_TRACES = Path(__file__).resolve().parents[3] / "shared" / "data" / "sailor" / "traces"
US_A = "local/sim-us/sim-us-a"


class ManualClock(MarketClock):
    """Market time set by the test."""

    def __init__(self) -> None:
        super().__init__(speed=1.0, wall=lambda: 0.0)
        self.t = 0.0

    def now_s(self) -> float:
        return self.t


def _offer(zone: str = "sim-us-a", rate: float | None = 0.5, capacity: int | None = 4) -> Offer:
    return Offer(
        cloud="local",
        region="sim-us",
        zone=zone,
        instance_type="sim-t4-1",
        gpu="T4",
        gpus_per_node=1,
        vcpus=1,
        memory_gib=2,
        on_demand_usd_per_hour=0.5,
        spot_usd_per_hour=0.2,
        available_count=capacity,
        preemption_rate_per_hour=rate,
        observed_at_s=1.0,
        source="test",
    )


def test_random_model_is_seeded_and_preempts_only_spot_nodes():
    def doomed(seed: int) -> list[str]:
        clock = ManualClock()
        market = LocalMarket([_offer()], clock=clock, seed=seed)
        for i in range(4):
            market.hold(f"n{i}", US_A, "sim-t4-1", spot=i != 3)
        clock.t = 3 * 3600.0  # rate 0.5/h over 3 h: most spot nodes are gone
        return market.due_preemptions()

    assert doomed(7) == doomed(7)
    assert "n3" not in doomed(7) and doomed(7)
    assert {tuple(doomed(s)) for s in range(8)} != {tuple(doomed(7))}


def test_capacity_counts_nodes_in_use_and_prices_stay_in_their_band():
    clock = ManualClock()
    market = LocalMarket([_offer()], clock=clock, seed=1)
    market.hold("n0", US_A, "sim-t4-1", spot=True)
    assert market.capacity(US_A, "sim-t4-1") == 3
    for hour in range(200):
        clock.t = hour * 3600.0
        price = market.offers()[0].spot_usd_per_hour
        assert 0.2 * 0.7 - 1e-9 <= price <= 0.2 * 1.3 + 1e-9
    assert len({o.spot_usd_per_hour for o in [market.offers()[0]]}) == 1


def test_a_location_outage_offers_nothing_there_until_it_ends():
    clock = ManualClock()
    market = LocalMarket([_offer(), _offer(zone="sim-us-b")], clock=clock, seed=1)
    market.outage(US_A, duration_s=600.0)
    assert market.capacity(US_A, "sim-t4-1") == 0
    assert market.capacity("local/sim-us/sim-us-b", "sim-t4-1") == 4  # other places untouched
    clock.t = 599.0
    assert market.capacity(US_A, "sim-t4-1") == 0
    clock.t = 600.0
    assert market.capacity(US_A, "sim-t4-1") == 4


def test_trace_capacity_drop_preempts_the_newest_spot_nodes():
    clock = ManualClock()
    trace = Trace({(US_A, "T4"): [TracePoint(0, 4, 0.2), TracePoint(600, 1, 0.3)]})
    market = LocalMarket([_offer(rate=None)], clock=clock, trace=trace)
    for i in range(3):
        clock.t = float(i)
        market.hold(f"n{i}", US_A, "sim-t4-1", spot=True)
    clock.t = 100.0
    assert market.due_preemptions() == []
    assert market.offers()[0].available_count == 1  # 4 traced, 3 in use
    assert 0 < market.next_event_wall_s() <= 500
    clock.t = 700.0
    assert market.due_preemptions() == ["n1", "n2"]
    assert market.offers()[0].spot_usd_per_hour == 0.3


def test_our_trace_format_keeps_blank_cells(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text(
        f"time_s,infra,gpu,available_count,spot_usd_per_hour\n0,{US_A},T4,4,0.18\n600,{US_A},T4,1,\n"
    )
    trace = read_trace(path)
    assert trace.at(US_A, "T4", 900) == TracePoint(600.0, 1, 0.18)
    path.write_text("time,infra\n")
    with pytest.raises(TraceError, match="To fix"):
        read_trace(path)


@pytest.mark.skipif(not SAILOR_TRACES.is_dir(), reason="../shared/data is not beside the checkout")
def test_sailor_traces_read_as_capacity_over_time():
    zones = ["us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f", "us-west1-b"]
    places = {z: f"local/sim-us/sim-us-{z[-1]}" for z in zones}
    wide = read_sailor_csv(SAILOR_TRACES / "gpu_trace_multizone.csv", places=places)
    assert wide.at("local/sim-us/sim-us-a", "A100", 0).available_count == 32
    assert wide.at("local/sim-us/sim-us-a", "A100", 10_000).available_count == 128
    series = read_sailor_json(
        SAILOR_TRACES / "traces_a100_availability.json", infra=US_A, gpu="A100"
    )
    assert series.at(US_A, "A100", 0).available_count == 4
    assert series.at(US_A, "A100", 130).available_count == 3


@pytest.fixture
def local_cloud():
    provisioner = LocalProvisioner(notice_s=1.5, tick_s=0.1)
    yield provisioner
    provisioner.close()


@pytest.mark.integration
def test_contract_on_a_real_ray_cluster(local_cloud, caplog):
    harness = Harness(
        provisioner=local_cloud,
        launchable=LaunchRequest(
            gang="g1", infra=US_A, instance_type="sim-t4-1", gpu="T4", count=2
        ),
        no_capacity=LaunchRequest(
            gang="g0", infra=US_A, instance_type="sim-t4-1", gpu="T4", count=5
        ),
        preempt=local_cloud.preempt_now,
        event_timeout_s=30,
    )
    run_contract(harness, caplog)


@pytest.mark.integration
def test_preemption_notice_comes_while_the_node_lives_and_ray_records_a_preemption(local_cloud):
    """A node with work on it (an actor placed by its location resource) lives until the notice's
    deadline, dies then, and the GCS records the death as a drain for preemption."""
    import ray

    request = LaunchRequest(gang="p", infra=US_A, instance_type="sim-t4-1", gpu="T4", count=1)
    (node,) = local_cloud.launch(request)
    ray.init(address=local_cloud.address)
    try:
        # defined here so that Ray ships it by value (workers cannot import the tests package)
        @ray.remote(num_cpus=0, resources={f"infra:{US_A}": 1})
        class Where:
            def node(self) -> str:
                return ray.get_runtime_context().get_node_id()

        worker = Where.remote()
        assert ray.get(worker.node.remote(), timeout=60) == node.node_id
        harness = Harness(local_cloud, request, request, None, event_timeout_s=30)
        local_cloud.preempt_now(node.node_id)
        seen = wait_for(
            harness, lambda s: any(isinstance(e, PreemptionNotice) for e in s), "notice"
        )
        notice = next(e for e in seen if isinstance(e, PreemptionNotice))
        assert node.node_id in local_cloud.cluster.alive(), "the notice arrives before the death"
        assert notice.deadline_s > time.time()
        wait_for(harness, lambda s: any(isinstance(e, NodeLost) for e in s), "NodeLost")
        assert time.time() >= notice.deadline_s - 0.05
        assert local_cloud.nodes()[0].state == NodeState.LOST
        assert (
            _death_reason(local_cloud.address, node.node_id, timeout_s=30)
            == "AUTOSCALER_DRAIN_PREEMPTED"
        )
    finally:
        ray.shutdown()


def _death_reason(address: str, node_id: str, *, timeout_s: float) -> str:
    """The GCS's recorded death reason of the node, once it has declared it dead."""
    import ray._raylet
    from ray.core.generated import common_pb2, gcs_pb2

    client = ray._raylet.GcsClient(address=address)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = {k.hex(): v for k, v in client.get_all_node_info(timeout=10).items()}[node_id]
        if info.state == gcs_pb2.GcsNodeInfo.DEAD:
            return common_pb2.NodeDeathInfo.Reason.Name(info.death_info.reason)
        client_wait = min(0.2, deadline - time.monotonic())
        time.sleep(max(client_wait, 0))  # polling the GCS: there is no death subscription here
    pytest.fail(f"node {node_id} not declared dead within {timeout_s} s")
