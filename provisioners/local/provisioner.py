"""The local simulated spot cloud behind the contract: a market (market.py) and a real Ray cluster
(cluster.py) whose nodes really die when the market preempts them.

A watcher thread follows the market: when it takes a spot node back, the node first gets a
``PreemptionNotice`` (and a GCS drain with reason PREEMPTION and the same deadline), then, after
``notice_s`` market seconds, its processes are killed and ``NodeLost(reason="preempted")`` follows.
Nodes that die without the market's doing (a crashed raylet, someone killing processes) are reported
as ``NodeLost(reason="failed")``. ``offers()`` needs no cluster; the Ray head starts at the first
launch (4-8 s here, then 2-3 s per node).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Collection, Sequence
from dataclasses import replace
from pathlib import Path

from provisioners.base import (
    CapacityError,
    CloudCallError,
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
    Unsupported,
)
from provisioners.local.cluster import LocalCluster, NodeSpec
from provisioners.local.market import LocalMarket, MarketClock, default_offers_file, read_offers
from provisioners.local.trace import Trace

log = logging.getLogger(__name__)


class LocalProvisioner(Provisioner):
    cloud = "local"
    unsupported = {
        Feature.RELABEL: "the local cloud's VMs carry no lease (they end with the job's process)",
        Feature.FIREWALL: "the local cloud's VMs close their own public interface to all but "
        "WireGuard (nftables); there is no cloud firewall in front of them",
    }
    launch_timeout_s = 120.0  # a process or namespace VM joins in seconds

    def __init__(
        self,
        *,
        offers_file: Path | None = None,
        trace: Trace | None = None,
        seed: int = 0,
        speed: float = 1.0,
        notice_s: float = 30.0,
        tick_s: float = 0.25,
        cluster: LocalCluster | None = None,
        slow_nodes: int = 0,
        slowdown: float = 2.0,
    ) -> None:
        """``speed``: market seconds per wall second; ``notice_s``: market seconds between a
        preemption notice and the node's death; ``tick_s``: how often the watcher looks at Ray;
        ``slow_nodes``: the first this many GPU nodes launched run ``slowdown`` times slower than
        their GPU type (noisy neighbours)."""
        self.slow_nodes, self.slowdown = slow_nodes, slowdown
        self._launched = 0  # GPU nodes started so far
        self.clock = MarketClock(speed=speed)
        self.offers_file = offers_file or default_offers_file()
        offers = read_offers(self.offers_file, observed_at_s=time.time())
        self.market = LocalMarket(offers, clock=self.clock, trace=trace, seed=seed)
        self.notice_s, self.tick_s = notice_s, tick_s
        self.cluster = cluster or LocalCluster()
        self._lock = threading.RLock()
        self._nodes: dict[str, Node] = {}
        self._deaths: dict[str, float] = {}  # node id -> wall time (monotonic) it is killed
        self._events: queue.Queue[Event] = queue.Queue()
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    @property
    def address(self) -> str:
        """The Ray cluster's address, for ``ray.init(address=...)`` (starts the head if needed)."""
        return self.cluster.address

    def check_credentials(self) -> None:
        """The local cloud needs none."""

    def offers(
        self, *, gpus: Collection[str] | None = None, regions: Collection[str] | None = None
    ) -> list[Offer]:
        with self._lock:
            offers = self.market.offers()
        return [
            o
            for o in offers
            if (gpus is None or o.gpu in gpus) and (regions is None or o.region in regions)
        ]

    # -- launching ------------------------------------------------------------------------------

    def launch(self, request: LaunchRequest) -> list[Node]:
        offer = self._offer_for(request)
        with self._lock:
            free = self.market.capacity(offer.infra, offer.instance_type)
            if free is not None and free < request.count:
                raise CapacityError(
                    f"{request.count} x {offer.instance_type} asked, {free} free in {offer.infra}",
                    cloud=self.cloud,
                    call="launch",
                    fix="ask for fewer nodes or another location (see: catalog offers --provider local)",
                )
            started: list[Node] = []
            try:
                for i in range(request.count):
                    started.append(self._start_node(request, offer, i))
            except (TimeoutError, RuntimeError, OSError) as error:
                self._undo(started)
                log_file = getattr(error, "log_file", None)  # a VM's bootstrap failed
                raise CloudCallError(
                    f"node {len(started) + 1} of {request.count} did not start: {error}",
                    cloud=self.cloud,
                    call="launch",
                    fix=f"read the node's bootstrap log {log_file}"
                    if log_file
                    else "check free memory and CPU on this machine (each node is a Ray raylet)",
                ) from None
            for node in started:
                self._events.put(NodeReady(node=node))
        self._ensure_watcher()
        return started

    def _offer_for(self, request: LaunchRequest) -> Offer:
        offer = self.market.offer(request.infra, request.instance_type)
        if offer is None or offer.gpu != request.gpu:
            known = ", ".join(sorted(f"{o.infra} {o.instance_type}" for o in self.market.offers()))
            raise Unsupported(
                f"no offer {request.instance_type} ({request.gpu}) in {request.infra}",
                cloud=self.cloud,
                call="launch",
                fix=f"use one of: {known}",
            )
        if not request.spot and offer.on_demand_usd_per_hour is None:
            raise Unsupported(
                f"{offer.instance_type} in {offer.infra} has no on-demand price",
                cloud=self.cloud,
                call="launch",
                fix="launch it as spot",
            )
        return offer

    def _start_node(self, request: LaunchRequest, offer: Offer, index: int) -> Node:
        spec = NodeSpec(
            name=f"{request.gang}-{index}",
            cloud=offer.cloud,
            region=offer.region,
            zone=offer.zone,
            gpu=offer.gpu,
            gpus=offer.gpus_per_node,
            vcpus=offer.vcpus,
            gang=request.gang,
            slowdown=self.slowdown if self._launched < self.slow_nodes else 1.0,
        )
        self._launched += 1
        node_id = self.cluster.add(spec, timeout_s=request.timeout_s)
        self.market.hold(node_id, offer.infra, offer.instance_type, spot=request.spot)
        node = Node(
            node_id=node_id,
            gang=request.gang,
            infra=offer.infra,
            instance_type=offer.instance_type,
            gpu=offer.gpu,
            gpus=offer.gpus_per_node,
            spot=request.spot,
            state=NodeState.RUNNING,
            address=node_id,
            launched_at_s=time.time(),
            labels=tuple(sorted({**spec.labels(), **dict(request.labels)}.items())),
        )
        self._nodes[node_id] = node
        return node

    def launch_controller(self, *, name: str, timeout_s: float = 60.0) -> Node:
        """A small node of its own for a job's driver, as SkyPilot runs a managed job's controller
        on a VM of its own: one CPU, no GPU, resource ``controller: 1``, not a market offer (no
        price, never preempted by the market); ``preempt_now`` can still take it (chaos)."""
        spec = NodeSpec(
            name=name,
            cloud="local",
            region="controller",
            zone=None,
            gpu="none",
            gpus=0,
            vcpus=1,
            gang=name,
            role="controller",
        )
        with self._lock:
            node_id = self.cluster.add(spec, timeout_s=timeout_s)
            node = Node(
                node_id=node_id,
                gang=name,
                infra=spec.infra,
                instance_type="controller",
                gpu="none",
                gpus=0,
                spot=False,
                state=NodeState.RUNNING,
                address=node_id,
                launched_at_s=time.time(),
                labels=tuple(sorted(spec.labels().items())),
            )
            self._nodes[node_id] = node
        self._ensure_watcher()
        return node

    def _undo(self, started: list[Node]) -> None:
        for node in started:
            self.cluster.kill(node.node_id)
            self.market.release(node.node_id)
            self._set_state(node.node_id, NodeState.TERMINATED)

    # -- watching -------------------------------------------------------------------------------

    def nodes(self, *, gang: str | None = None) -> list[Node]:
        with self._lock:
            return [n for n in self._nodes.values() if gang is None or n.gang == gang]

    def terminate(self, node_ids: Sequence[str]) -> None:
        with self._lock:
            for node_id in node_ids:
                node = self._nodes.get(node_id)
                if node is None or node.state in (NodeState.TERMINATED, NodeState.LOST):
                    continue
                self.cluster.kill(node_id)
                self.market.release(node_id)
                self._deaths.pop(node_id, None)
                self._set_state(node_id, NodeState.TERMINATED)

    def preempt_now(self, node_id: str) -> None:
        """Make the market take this node back now (as a trace or the random model would)."""
        with self._lock:
            self._notice(node_id)
        self._ensure_watcher()

    def lose_now(self, node_id: str) -> None:
        """Make the market take this node back now without notice (spot capacity can vanish
        so): its processes are killed at once and ``NodeLost(reason="preempted")`` follows."""
        with self._lock:
            node = self._nodes.get(node_id)
            if node is None or node.state not in (NodeState.RUNNING, NodeState.PREEMPTING):
                return
            self._deaths.pop(node_id, None)
            self.cluster.kill(node_id)
            self.market.release(node_id)
            self._set_state(node_id, NodeState.LOST)
            self._events.put(NodeLost(node_id=node_id, infra=node.infra, reason="preempted"))

    def preempt_location(self, infra: str, *, outage_s: float) -> list[str]:
        """Take back every running node in ``infra`` at once and offer none there for
        ``outage_s`` market seconds; returns the nodes noticed."""
        with self._lock:
            self.market.outage(infra, duration_s=outage_s)
            doomed = sorted(
                n.node_id
                for n in self._nodes.values()
                if n.infra == infra and n.state is NodeState.RUNNING
            )
            for node_id in doomed:
                self._notice(node_id)
        self._ensure_watcher()
        return doomed

    def poll_events(self, *, timeout_s: float = 0.0) -> list[Event]:
        try:
            events = [
                self._events.get(timeout=timeout_s) if timeout_s > 0 else self._events.get_nowait()
            ]
        except queue.Empty:
            return []
        while True:
            try:
                events.append(self._events.get_nowait())
            except queue.Empty:
                return events

    def close(self) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=10)
        with self._lock:
            self.cluster.shutdown()

    def _ensure_watcher(self) -> None:
        if self._watcher is None or not self._watcher.is_alive():
            self._stop.clear()
            self._watcher = threading.Thread(
                target=self._watch, name="local-cloud-market", daemon=True
            )
            self._watcher.start()

    def _watch(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                for node_id in self.market.due_preemptions():
                    self._notice(node_id)
                self._kill_due()
                self._find_failures()
                wait = min(self.tick_s, self.market.next_event_wall_s(), self._next_death_s())
            self._stop.wait(max(wait, 0.01))

    def _notice(self, node_id: str) -> None:
        node = self._nodes.get(node_id)
        if node is None or node.state != NodeState.RUNNING:
            return
        lead_s = self.notice_s / self.clock.speed
        deadline = time.time() + lead_s
        self._events.put(PreemptionNotice(node_id=node_id, infra=node.infra, deadline_s=deadline))
        self.cluster.drain_for_preemption(
            node_id, deadline_s=deadline, message="local market preemption"
        )
        self._deaths[node_id] = time.monotonic() + lead_s
        self._set_state(node_id, NodeState.PREEMPTING)
        log.info(
            "local cloud: preemption notice for %s in %s (%.1f s)", node_id, node.infra, lead_s
        )

    def _kill_due(self) -> None:
        now = time.monotonic()
        for node_id in [n for n, at in self._deaths.items() if at <= now]:
            del self._deaths[node_id]
            self.cluster.kill(node_id)
            self.market.release(node_id)
            self._set_state(node_id, NodeState.LOST)
            self._events.put(
                NodeLost(node_id=node_id, infra=self._nodes[node_id].infra, reason="preempted")
            )

    def _find_failures(self) -> None:
        expected = {
            n
            for n, node in self._nodes.items()
            if node.state in (NodeState.RUNNING, NodeState.PREEMPTING)
        }
        if not expected:
            return
        for node_id in expected - self.cluster.alive():
            # a draining node that went early still died of its preemption
            reason = "preempted" if self._nodes[node_id].state == NodeState.PREEMPTING else "failed"
            self._deaths.pop(node_id, None)
            self.cluster.kill(node_id)
            self.market.release(node_id)
            self._set_state(node_id, NodeState.LOST)
            self._events.put(
                NodeLost(node_id=node_id, infra=self._nodes[node_id].infra, reason=reason)
            )

    def _next_death_s(self) -> float:
        now = time.monotonic()
        return min((at - now for at in self._deaths.values()), default=float("inf"))

    def _set_state(self, node_id: str, state: NodeState) -> None:
        self._nodes[node_id] = replace(self._nodes[node_id], state=state)
