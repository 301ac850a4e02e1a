"""The seeded chaos of the local cloud's recipes (``local_cloud.preempt_*``, ``submit
--preempt-at``, ``--lose-at``): the market takes nodes after given steps."""

from __future__ import annotations

from orchestrator.driver.events import Event, EventLog
from orchestrator.driver.state import JobState

LOCATION_OUTAGE_S = 3600.0  # market seconds a location preempted as a whole offers nothing


_TAKES = {  # what the market does, per kind of chaos
    "node": "takes back, with notice, node",
    "lose": "takes, without notice, node",
    "location": "takes back every node in the location of node",
    "driver": "takes back the driver's node",
}


class ChaosSchedule:
    """The seeded chaos of the local cloud: after the listed steps the market takes back the
    first node of the job (by id) with notice or without, every node the job holds in that node's
    location, or the node the driver runs on; each is logged as a ``chaos`` event (its time is
    the moment the market acted). Steps already done when a (restarted) driver starts are not
    repeated."""

    def __init__(
        self,
        provisioner,
        *,
        market=None,
        nodes: set[int],
        locations: set[int],
        drivers: set[int] = frozenset(),
        losses: set[int] = frozenset(),
        own_node: str | None = None,
        done_steps: int = 0,
        events: EventLog | None = None,
    ) -> None:
        self.provisioner, self.own_node, self.events = provisioner, own_node, events
        # who takes nodes back: the local cloud itself, or an emulated provider's market
        self.market = provisioner if market is None else market
        listed = [(s, "node") for s in nodes] + [(s, "location") for s in locations]
        listed += [(s, "driver") for s in drivers] + [(s, "lose") for s in losses]
        self.pending = sorted(item for item in listed if item[0] > done_steps)

    def after(self, state: JobState) -> None:
        while self.pending and state.step >= self.pending[0][0]:
            _, what = self.pending.pop(0)
            cloud_nodes = {n.node_id: n for n in self.provisioner.nodes()}
            if what == "driver":
                if self.own_node in cloud_nodes:  # not when Ray restarted it on the head
                    self._log(what, self.own_node, state.step)
                    self.market.preempt_now(self.own_node)
                continue
            held = {n: node for n, node in cloud_nodes.items() if n in state.nodes}
            if not held:
                continue
            first = held[min(held)]
            self._log(what, first.node_id, state.step)
            if what == "location":  # and the market has none there for a while
                self.market.preempt_location(first.infra, outage_s=LOCATION_OUTAGE_S)
            elif what == "lose":
                self.market.lose_now(first.node_id)
            else:
                self.market.preempt_now(first.node_id)

    def _log(self, what: str, node: str, step: int) -> None:
        if self.events is not None:
            self.events.append(
                Event(
                    event="chaos",
                    decision="",
                    reason=f"after step {step} the market {_TAKES[what]} {node}",
                    details={"kind": what, "node": node, "step": step},
                )
            )
