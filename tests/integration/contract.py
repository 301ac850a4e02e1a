"""The one contract every provisioner meets, as checks over a ``Harness``.

Each adapter's test module builds a Harness (the real adapter wired to its fake cloud, or, for the
local cloud, to a real local Ray cluster) and test_provisioner_contract.py runs every check on each.
A harness says what to launch, what must fail for lack of capacity, how to make the cloud preempt a
node, and which fake secrets it planted (they must never appear in anything the adapter returns,
raises or logs).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from provisioners.base import (
    CapacityError,
    Event,
    Feature,
    LaunchRequest,
    Node,
    NodeLost,
    NodeReady,
    NodeState,
    Offer,
    PreemptionNotice,
    Provisioner,
    ProvisionerError,
)


@dataclass
class Harness:
    provisioner: Provisioner
    launchable: LaunchRequest  # must succeed (use count >= 2 to exercise the gang)
    no_capacity: LaunchRequest  # must raise CapacityError and leave nothing behind
    # make the cloud preempt this node (a spot interruption / eviction); None if it cannot
    preempt: Callable[[str], None] | None
    secrets: tuple[str, ...] = ()  # fake credentials planted for this test
    event_timeout_s: float = 30.0  # how long an event may take to show up
    said: list[str] = field(default_factory=list)  # every text the adapter produced, for the grep

    def record(self, *values: object) -> None:
        self.said += [repr(v) for v in values] + [str(v) for v in values]


def wait_for(harness: Harness, predicate: Callable[[list[Event]], bool], what: str) -> list[Event]:
    """Poll events until ``predicate`` holds for all seen so far; fail after the harness timeout."""
    seen: list[Event] = []
    deadline = time.monotonic() + harness.event_timeout_s
    while not predicate(seen):
        left = deadline - time.monotonic()
        if left <= 0:
            pytest.fail(f"no {what} within {harness.event_timeout_s} s; events: {seen}")
        batch = harness.provisioner.poll_events(timeout_s=min(left, 1.0))
        harness.record(*batch)
        seen += batch
    return seen


def check_declares_capabilities(harness: Harness) -> None:
    p = harness.provisioner
    assert p.cloud and isinstance(p.cloud, str)
    for feature, reason in p.unsupported.items():
        assert isinstance(feature, Feature) and isinstance(reason, str) and len(reason) > 10


def check_offers(harness: Harness) -> None:
    p = harness.provisioner
    offers = p.offers()
    harness.record(*offers)
    assert offers and all(isinstance(o, Offer) for o in offers)
    now = time.time()
    for o in offers:
        assert o.cloud in p.clouds and o.region and o.instance_type and o.gpu
        assert o.gpus_per_node >= 1 and o.vcpus > 0 and o.memory_gib > 0
        for price in (o.on_demand_usd_per_hour, o.spot_usd_per_hour):
            assert price is None or price >= 0
        assert o.on_demand_usd_per_hour is not None or o.spot_usd_per_hour is not None
        assert 0 < o.observed_at_s <= now + 1
        if o.available_count is not None:
            assert o.available_count >= 0
        if o.availability_score is not None:
            assert 0 <= o.availability_score <= 1
    request = harness.launchable
    only = p.offers(gpus=[request.gpu])
    assert only and all(o.gpu == request.gpu for o in only)
    assert any(o.instance_type == request.instance_type for o in only)


def check_launch_gang(harness: Harness) -> list[Node]:
    p, request = harness.provisioner, harness.launchable
    nodes = p.launch(request)
    harness.record(*nodes)
    assert len(nodes) == request.count
    assert all(n.state == NodeState.RUNNING and n.gang == request.gang for n in nodes)
    assert all(n.infra.startswith(request.infra) and n.gpu == request.gpu for n in nodes)
    assert len({n.node_id for n in nodes}) == request.count
    listed = {n.node_id: n for n in p.nodes(gang=request.gang)}
    assert set(listed) >= {n.node_id for n in nodes}
    ready = wait_for(
        harness,
        lambda seen: (
            {e.node.node_id for e in seen if isinstance(e, NodeReady)} >= {n.node_id for n in nodes}
        ),
        "NodeReady for every node",
    )
    assert ready
    return nodes


def check_capacity_failure_is_typed_and_clean(harness: Harness) -> None:
    p, request = harness.provisioner, harness.no_capacity
    with pytest.raises(CapacityError) as caught:
        p.launch(request)
    harness.record(caught.value)
    assert caught.value.cloud == p.cloud and "To fix" in str(caught.value)
    alive = [
        n for n in p.nodes(gang=request.gang) if n.state in (NodeState.PENDING, NodeState.RUNNING)
    ]
    assert not alive, f"a failed gang left nodes behind: {alive}"


def check_preemption_events(harness: Harness, nodes: list[Node]) -> None:
    if harness.preempt is None:
        return
    p, victim = harness.provisioner, nodes[0]
    harness.preempt(victim.node_id)
    seen = wait_for(
        harness,
        lambda events: any(isinstance(e, NodeLost) and e.node_id == victim.node_id for e in events),
        f"NodeLost for preempted node {victim.node_id}",
    )
    lost = next(e for e in seen if isinstance(e, NodeLost) and e.node_id == victim.node_id)
    assert lost.reason == "preempted"
    if p.supports(Feature.PREEMPTION_NOTICE):
        notices = [e for e in seen if isinstance(e, PreemptionNotice)]
        assert notices and notices[0].node_id == victim.node_id
        assert seen.index(notices[0]) < seen.index(lost), "the notice comes before the loss"
        assert notices[0].deadline_s >= notices[0].at_s
    state = {n.node_id: n.state for n in p.nodes()}.get(victim.node_id)
    assert state in (None, NodeState.LOST)


def check_terminate(harness: Harness, nodes: list[Node]) -> None:
    p = harness.provisioner
    ids = [n.node_id for n in nodes]
    p.terminate(ids)
    p.terminate(ids)  # idempotent
    left = {n.node_id: n.state for n in p.nodes()}
    for node_id in ids:
        assert left.get(node_id) in (None, NodeState.TERMINATED, NodeState.LOST)


def check_no_secret_leaks(harness: Harness, caplog: pytest.LogCaptureFixture) -> None:
    texts = harness.said + [r.getMessage() for r in caplog.records]
    for secret in harness.secrets:
        leaks = [t for t in texts if secret in t]
        assert not leaks, f"a planted secret shows up in: {leaks[:3]}"


def run_contract(harness: Harness, caplog: pytest.LogCaptureFixture) -> None:
    """Every check in order, on one harness (one cluster or fake cloud per adapter)."""
    caplog.set_level(logging.DEBUG)
    try:
        check_declares_capabilities(harness)
        check_offers(harness)
        check_capacity_failure_is_typed_and_clean(harness)
        nodes = check_launch_gang(harness)
        check_preemption_events(harness, nodes)
        check_terminate(harness, nodes)
    except ProvisionerError as error:  # a contract failure, shown as such
        harness.record(error)
        raise
    finally:
        check_no_secret_leaks(harness, caplog)
