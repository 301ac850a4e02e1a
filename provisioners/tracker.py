"""One node tracker for every cloud adapter: the nodes it launched, what it already said of each,
and the events it has yet to hand out.

An adapter adds a node when it asks the cloud for it, replaces the node's record as the cloud's
answers change it (``update``, under the tracker's lock, so that ``nodes()`` from the driver's
thread never sees half a change), queues the events those changes mean, and hands them out from
``poll_events`` (``drain``). What only one cloud needs per node (the region to call, whether the VM
was created, its eviction policy) rides along in ``Tracked.extra``. The local simulated cloud and
SkyPilot track other things (Ray nodes, whole clusters) and keep their own records.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from provisioners.base import Event, Node, NodeLost, NodeState

ALIVE = frozenset({NodeState.PENDING, NodeState.RUNNING, NodeState.PREEMPTING})


@dataclass
class Tracked:
    """A launched node and the adapter's bookkeeping about it (changed under the tracker's lock)."""

    node: Node
    where: str = ""  # the region or zone the adapter calls the cloud in for this node
    notice_sent: bool = False  # a PreemptionNotice went out (a loss after it is a preemption)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def alive(self) -> bool:
        return self.node.state in ALIVE


class NodeTracker:
    """The nodes of one adapter, by id, and its queue of events; safe across threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tracked: dict[str, Tracked] = {}
        self._events: list[Event] = []

    def add(
        self, node: Node, *, where: str = "", event: Event | None = None, **extra: Any
    ) -> Tracked:
        """Track ``node`` (replacing an earlier record of the same id), queueing ``event``."""
        tracked = Tracked(node=node, where=where, extra=dict(extra))
        with self._lock:
            self._tracked[node.node_id] = tracked
            if event is not None:
                self._events.append(event)
        return tracked

    def get(self, node_id: str) -> Tracked | None:
        with self._lock:
            return self._tracked.get(node_id)

    def nodes(self, *, gang: str | None = None) -> list[Node]:
        """Every tracked node's last record, or ``gang``'s only."""
        with self._lock:
            return [t.node for t in self._tracked.values() if gang is None or t.node.gang == gang]

    def tracked(self, *, alive_only: bool = True) -> list[Tracked]:
        with self._lock:
            return [t for t in self._tracked.values() if t.alive or not alive_only]

    def by_where(self, *, alive_only: bool = True) -> dict[str, list[Tracked]]:
        """The tracked nodes grouped by the region or zone the adapter calls for them."""
        groups: dict[str, list[Tracked]] = {}
        for tracked in self.tracked(alive_only=alive_only):
            groups.setdefault(tracked.where, []).append(tracked)
        return groups

    def known(self, node_ids: Iterable[str], *, alive_only: bool = True) -> list[Tracked]:
        """Those of ``node_ids`` this tracker knows (alive ones only, by default), once each."""
        with self._lock:
            found = (self._tracked.get(i) for i in dict.fromkeys(node_ids))
            return [t for t in found if t is not None and (t.alive or not alive_only)]

    def update(
        self,
        tracked: Tracked,
        change: Callable[[Tracked], Iterable[Event]] | None = None,
        /,
        **fields: Any,
    ) -> Node:
        """Replace fields of ``tracked.node`` (``state=``, ``address=``...) and/or run ``change``
        (which may edit ``tracked`` and returns the events it means), queueing those events."""
        with self._lock:
            if fields:
                tracked.node = replace(tracked.node, **fields)
            if change is not None:
                self._events.extend(change(tracked))
            return tracked.node

    def ended(self, tracked: Tracked, *, state: NodeState, reason: str | None = None) -> None:
        """``tracked`` is gone (TERMINATED or LOST); with ``reason``, queue its NodeLost."""
        with self._lock:
            tracked.node = replace(tracked.node, state=state)
            if reason is not None:
                node = tracked.node
                self._events.append(NodeLost(node_id=node.node_id, infra=node.infra, reason=reason))

    def emit(self, *events: Event) -> None:
        with self._lock:
            self._events.extend(events)

    def drain(self) -> list[Event]:
        """The queued events, oldest first; the queue is then empty."""
        with self._lock:
            events, self._events = self._events, []
        return events
