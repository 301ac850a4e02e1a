"""A cloud adapter whose nodes boot the job's bootstrap and join the job's one Ray cluster.

``JoinedProvisioner`` wraps any adapter (AWS, GCP, Azure, SkyPilot) and adds what a node of a
job needs that the cloud's API does not give: for each node of a launch it mints a one-use join
token on the controller's overlay, renders the node's boot script (script.py) and hands the
scripts to the adapter (``LaunchRequest.boot_scripts``: user-data, startup-script, customData, a
SkyPilot run). The launch returns once every node runs *and* has joined the Ray cluster (found by
its ``geo-node`` label); a node that does not join in time fails the whole gang, which is then
terminated, as the contract's all-or-nothing launch asks.

Firewall: where the adapter makes one per job (``Feature.FIREWALL``: AWS security groups), the
nodes launch behind it, and it admits the overlay's UDP port from the controller's public address
and from every node that joined (the address the controller's overlay saw its join from), kept so
after every launch and termination: no node is reachable from anywhere else, not even by
WireGuard's handshake.

Preemption notices: where the cloud announces a reclaim only on the node (EC2's instance
metadata, GCE's ``preempted`` flag, Azure's Scheduled Events), the node's watcher drains its own
Ray node with the notice's deadline; this wrapper turns a drain of one of its nodes into the
contract's ``PreemptionNotice``, so the driver hears of it as it does on the local cloud.

The controller's side is passed in as functions (``ControllerLink``): minting and removing
overlay members, which Ray nodes joined under which name, which were drained for a preemption
and until when. Nothing here knows whether the controller is a namespace on this machine or a VM
in a cloud.
"""

from __future__ import annotations

import logging
import re
import secrets
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from provisioners.base import (
    CloudCallError,
    Event,
    Feature,
    Firewall,
    LaunchRequest,
    Node,
    NodeState,
    Offer,
    PreemptionNotice,
    Provisioner,
    ProvisionerError,
)
from provisioners.bootstrap.script import NodeBoot, render

log = logging.getLogger(__name__)

JOIN_LOOK_S = 0.5  # how often a launch looks for its nodes in the cluster
# how often the driver's event polls (one between every two steps) look for drained nodes: each
# look reads every node from Ray's GCS, and a cloud's notice comes 30 s or more ahead
NOTICE_LOOK_S = 0.5
JOB_LABEL, EXPIRES_LABEL = "geo-job", "geo-expires"  # on every VM: which job, until when


def of_job(labels: Mapping[str, str], job: str) -> bool:
    """Whether a VM's labels name ``job``, as the cloud stores the label: GCP lowercases a label
    value and turns what it does not allow (e.g. '.') into '-'."""
    label = labels.get(JOB_LABEL, "")
    return label == job or label == re.sub(r"[^a-z0-9_-]", "-", job.lower())[:63]


@dataclass(frozen=True, kw_only=True)
class ControllerLink:
    """What the wrapper asks of the job's controller."""

    mint: Callable[[str, float], str]  # (node name, ttl s) -> a join token for that node
    forget: Callable[[str], None]  # a node left: remove it from the overlay
    joined: Callable[[], dict[str, str]]  # Ray node id -> node name, of the nodes alive now
    # node name -> reclaim deadline (Unix s), of nodes drained for a preemption (even if gone)
    preempted: Callable[[], dict[str, float]]
    # the public addresses the overlay saw its joined nodes at, and the controller's own
    endpoints: Callable[[], list[str]] = lambda: []
    public_ip: str | None = None
    overlay_port: int = 51820


# (node name, join token, the request) -> the node's boot: the caller knows how its nodes install,
# shut down and find their notices
BootFor = Callable[[str, str, LaunchRequest], NodeBoot]


class JoinedProvisioner(Provisioner):
    def __init__(
        self,
        inner: Provisioner,
        *,
        job: str,
        link: ControllerLink,
        boot_for: BootFor,
        lease_s: float,
        stop: threading.Event | None = None,
        clock: Callable[[], float] = time.time,
        identity: str | None = None,
    ) -> None:
        """``lease_s``: how long a VM may live without the job renewing it (its expiry tag: what
        a sweep of leaked VMs reads; renewed at every event poll past half of it, where the
        cloud can relabel a VM); ``stop``: set to give up waiting launches; ``identity``: what
        the nodes act as toward the cloud (``Provisioner.identities``' node: the job's bucket,
        for checkpoints), None: nothing."""
        self.inner, self.job, self.link = inner, job, link
        self.identity = identity
        self.boot_for, self.lease_s = boot_for, lease_s
        self.cloud, self.launch_timeout_s = inner.cloud, inner.launch_timeout_s
        # the watcher hears the notice on the node: the adapter's own lack of one is made good
        self.unsupported = {
            f: why for f, why in inner.unsupported.items() if f is not Feature.PREEMPTION_NOTICE
        }
        self._names: dict[str, str] = {}  # cloud node id -> node name
        self._noticed: set[str] = set()
        self._stop = stop or threading.Event()
        self._clock = clock
        self._renew_at_s = clock() + lease_s / 2
        self._notice_look_at_s = float("-inf")  # when (``clock``) to look for drains next

    @property
    def clouds(self) -> tuple[str, ...]:
        return self.inner.clouds

    def check_credentials(self) -> None:
        self.inner.check_credentials()

    def offers(
        self, *, gpus: Collection[str] | None = None, regions: Collection[str] | None = None
    ) -> list[Offer]:
        return self.inner.offers(gpus=gpus, regions=regions)

    def launch(self, request: LaunchRequest) -> list[Node]:
        stem = f"{request.gang}-{secrets.token_hex(2)}"  # fresh names when a gang is retried
        names = [f"{stem}-{i}" for i in range(request.count)]
        scripts = []
        try:
            for name in names:
                token = self.link.mint(name, request.timeout_s)
                scripts.append(render(self.boot_for(name, token, request)))
            expires = f"{self._clock() + self.lease_s:.0f}"
            labels = (*request.labels, (JOB_LABEL, self.job), (EXPIRES_LABEL, expires))
            request = replace(
                request,
                labels=labels,
                boot_scripts=tuple(scripts),
                firewall=self._firewall(),
                identity=request.identity or self.identity,
            )
            nodes = self.inner.launch(request)
        except BaseException:
            self._forget(names)
            raise
        for node, name in zip(nodes, names, strict=True):  # node i ran script i
            self._names[node.node_id] = name
        try:
            self._wait_joined(
                request,
                dict(zip(names, nodes, strict=True)),
                deadline_s=time.monotonic() + request.timeout_s,
            )
        except BaseException:
            self.terminate([n.node_id for n in nodes])
            raise
        self._open()  # the new nodes' addresses, now that the overlay saw them
        return nodes

    def _firewall(self) -> Firewall | None:
        """The job's firewall as it stands: None where the adapter makes none."""
        if not self.inner.supports(Feature.FIREWALL):
            return None
        sources = {self.link.public_ip} if self.link.public_ip else set()
        sources.update(self.link.endpoints())
        return Firewall(job=self.job, port=self.link.overlay_port, sources=tuple(sorted(sources)))

    def _open(self) -> None:
        firewall = self._firewall()
        if firewall is not None:
            self.inner.open_overlay(firewall)

    def _wait_joined(
        self, request: LaunchRequest, nodes: dict[str, Node], *, deadline_s: float
    ) -> None:
        """Until every node (by name) is a live Ray node; a cloud call error naming the missing
        ones at the deadline, or at once when one of them stopped (its bootstrap failed and
        powered it off, or the cloud took it): waiting longer cannot help."""
        names = list(nodes)
        while True:
            missing = set(names) - set(self.link.joined().values())
            if not missing:
                return
            states = {n.node_id: n.state for n in self.inner.nodes(gang=request.gang)}
            ended = sorted(
                name
                for name in missing
                if states.get(nodes[name].node_id) in (NodeState.LOST, NodeState.TERMINATED)
            )
            if ended:
                raise CloudCallError(
                    f"{len(ended)} of {len(names)} nodes of {request.gang} in {request.infra} "
                    f"stopped before they joined the job's cluster: {', '.join(ended)}",
                    cloud=self.cloud,
                    call="launch (node bootstrap)",
                    fix="read the node's boot log (the cloud console's serial output shows its "
                    "last lines after GEO-BOOTSTRAP-FAILED); the launch is retried",
                )
            left_s = deadline_s - time.monotonic()
            if left_s <= 0 or self._stop.is_set():
                raise CloudCallError(
                    f"{len(missing)} of {len(names)} nodes of {request.gang} in {request.infra} "
                    f"ran but did not join the job's cluster within {request.timeout_s:g} s: "
                    f"{', '.join(sorted(missing))}",
                    cloud=self.cloud,
                    call="launch (node bootstrap)",
                    fix="read the node's boot log (the cloud console's serial output shows its "
                    "last lines after GEO-BOOTSTRAP-FAILED), or give launches a longer timeout",
                )
            self._stop.wait(min(JOIN_LOOK_S, left_s))

    def nodes(self, *, gang: str | None = None) -> list[Node]:
        return self.inner.nodes(gang=gang)

    def terminate(self, node_ids: Sequence[str]) -> None:
        self.inner.terminate(node_ids)
        self._forget([self._names[i] for i in node_ids if i in self._names])
        try:
            self._open()  # those nodes' addresses are admitted no more
        except CloudCallError as error:  # the next launch's firewall drops them, too
            log.warning("firewall: %s", error)

    def _forget(self, names: Sequence[str]) -> None:
        for name in names:
            try:
                self.link.forget(name)
            except (OSError, ValueError) as error:  # the controller's overlay is going too
                log.warning("overlay: removing %s: %s", name, error)

    def poll_events(self, *, timeout_s: float = 0.0) -> list[Event]:
        self._renew_leases()
        notices = self._notices()
        events = self.inner.poll_events(timeout_s=0.0 if notices else timeout_s)
        return notices + [e for e in events if not self._heard(e)]

    def _renew_leases(self) -> None:
        """Past half the lease, move every live node's expiry tag a lease ahead: a running job's
        VMs never look leaked (``status --all``), a dead job's expire within one lease."""
        now_s = self._clock()
        if now_s < self._renew_at_s or not self.inner.supports(Feature.RELABEL):
            return
        alive = (NodeState.PENDING, NodeState.RUNNING, NodeState.PREEMPTING)
        ours = [
            n.node_id for n in self.inner.nodes() if n.state in alive and n.node_id in self._names
        ]
        try:
            if ours:
                self.inner.relabel(ours, {EXPIRES_LABEL: f"{now_s + self.lease_s:.0f}"})
            self._renew_at_s = now_s + self.lease_s / 2
        except ProvisionerError as error:  # the next poll tries again
            log.warning("lease renewal: %s", error)

    def _heard(self, event: Event) -> bool:
        """A cloud's own notice of a node the watcher already reported is said once."""
        if not isinstance(event, PreemptionNotice):
            return False
        seen = event.node_id in self._noticed
        self._noticed.add(event.node_id)
        return seen

    def _notices(self) -> list[Event]:
        """A ``PreemptionNotice`` per node of ours that a watcher drained since the last look
        (at most one look per ``NOTICE_LOOK_S``)."""
        now_s = self._clock()
        # (a wall clock set back by more than the pace looks at once rather than waiting it out)
        if self._notice_look_at_s - NOTICE_LOOK_S <= now_s < self._notice_look_at_s:
            return []
        self._notice_look_at_s = now_s + NOTICE_LOOK_S
        preempted = self.link.preempted()
        if not preempted:
            return []
        infra = {n.node_id: n.infra for n in self.inner.nodes()}
        notices: list[Event] = []
        for node_id, name in self._names.items():
            if name in preempted and node_id not in self._noticed:
                self._noticed.add(node_id)
                notices.append(
                    PreemptionNotice(
                        node_id=node_id, infra=infra.get(node_id, ""), deadline_s=preempted[name]
                    )
                )
        return notices

    def close(self) -> None:
        self._stop.set()
        self.inner.close()
