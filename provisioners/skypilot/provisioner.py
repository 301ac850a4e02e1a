"""``SkyPilotProvisioner``: GPU nodes on AWS, GCP and Azure through SkyPilot.

One gang is one SkyPilot cluster (``sky.launch`` with ``num_nodes``), which SkyPilot brings up all or
nothing; ours is also to ``down`` whatever a failed launch left. Offers come from SkyPilot's catalog
files, so their ``cloud`` is the real cloud (aws, gcp, azure), not ``skypilot``. Events come from
comparing each ``sky.status`` look with the last: a cluster that is UP for the first time means
NodeReady for its nodes; one that was UP and is now INIT, STOPPED or gone without our asking means
NodeLost ("preempted" for spot, "failed" otherwise). SkyPilot reports clusters, not single VMs, so a
loss is reported for the whole gang and a gang is terminated as a whole.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from provisioners.base import (
    BOOTSTRAP_INSTALL_S,
    GPU_VM_BOOT_S,
    CapacityError,
    CloudCallError,
    CredentialsMissing,
    Event,
    Feature,
    LaunchRequest,
    Node,
    NodeLost,
    NodeReady,
    NodeState,
    Offer,
    PacedPoll,
    Provisioner,
    ProvisionerError,
    Unsupported,
)
from provisioners.skypilot import credentials
from provisioners.skypilot.instances import (
    SKYPILOT_RAY_PORT,
    build_task,
    cluster_name,
    cluster_nodes,
    cluster_status,
    record_field,
)
from provisioners.skypilot.offers import catalog_file, offers_from_rows, records
from provisioners.skypilot.sdk import (
    CLOUD,
    RequestTimeout,
    check_request,
    load_sdk,
    to_error,
    wait,
)

log = logging.getLogger(__name__)
ALIVE = (NodeState.PENDING, NodeState.RUNNING)
CREDENTIAL_CHECKS = ("offline", "skypilot")


@dataclass(frozen=True, kw_only=True)
class SkyPilotConfig:
    """What the adapter may use and how it talks to SkyPilot."""

    clouds: tuple[str, ...] = ("aws", "gcp", "azure")
    cluster_prefix: str = "geo-"  # SkyPilot cluster names start with this
    setup: str | None = "pip install -q 'ray[default]'"  # run once per node before our Ray starts
    ray_port: int = 6379  # our Ray's port on the nodes
    poll_interval_s: float = 5.0
    call_timeout_s: float = 300.0  # status, down and check requests
    credential_check: str = "offline"  # "offline": look for files/env; "skypilot": `sky check`
    fetch_catalog: bool = True  # False: a missing catalog file is an error, never a download
    down_on_loss: bool = True  # down a cluster that lost nodes (the rest would bill, unusable)

    def __post_init__(self) -> None:
        if not self.clouds:
            raise ValueError("clouds must name at least one cloud, e.g. ('aws', 'gcp')")
        if self.ray_port == SKYPILOT_RAY_PORT:
            raise ValueError(f"ray_port {SKYPILOT_RAY_PORT} is SkyPilot's own Ray; choose another")
        if self.poll_interval_s < 0 or self.call_timeout_s <= 0:
            raise ValueError("poll_interval_s must be >= 0 and call_timeout_s > 0")
        if self.credential_check not in CREDENTIAL_CHECKS:
            raise ValueError(f"credential_check must be one of {CREDENTIAL_CHECKS}")


@dataclass
class _Gang:
    """One launched gang (one SkyPilot cluster) and what we last saw of it."""

    request: LaunchRequest
    cluster: str
    gpus_per_node: int
    nodes: list[Node] = field(default_factory=list)
    ever_up: bool = False
    down_requested: bool = False

    @property
    def ended(self) -> bool:
        return bool(self.nodes) and not any(n.state in ALIVE for n in self.nodes)


class SkyPilotProvisioner(Provisioner):
    """GPU clusters on the clouds SkyPilot is set up for, one cluster per gang."""

    cloud = CLOUD
    # SkyPilot fails over between zones itself (90-240 s each on AWS, Azure, GCP): room for three
    launch_timeout_s = 3 * 240.0 + GPU_VM_BOOT_S + BOOTSTRAP_INSTALL_S
    unsupported: Mapping[Feature, str] = {
        Feature.RELABEL: "SkyPilot sets a cluster's labels at launch only",
        Feature.FIREWALL: "SkyPilot opens the ports a task names (resources.ports) itself",
        Feature.PREEMPTION_NOTICE: "SkyPilot reports a cluster's state (UP, INIT, STOPPED), not "
        "the clouds' interruption notices; a preempted cluster shows at the next status refresh",
        Feature.AVAILABLE_COUNT: "SkyPilot's catalog lists prices, not how many nodes a cloud "
        "could start now",
        Feature.AVAILABILITY_SCORE: "SkyPilot's catalog has no availability signal",
        Feature.PREEMPTION_RATE: "SkyPilot's catalog has no interruption rates",
        Feature.LIST_LABELLED: "its VMs live on aws, gcp and azure with the same labels: "
        "status --all asks those clouds",
    }

    def __init__(
        self,
        *,
        clouds: Sequence[str] = ("aws", "gcp", "azure"),
        cluster_prefix: str = "geo-",
        setup: str | None = "pip install -q 'ray[default]'",
        ray_port: int = 6379,
        poll_interval_s: float = 5.0,
        call_timeout_s: float = 300.0,
        credential_check: str = "offline",
        fetch_catalog: bool = True,
        down_on_loss: bool = True,
        sdk: Any = None,
    ) -> None:
        self.config = SkyPilotConfig(
            clouds=tuple(c.lower() for c in clouds),
            cluster_prefix=cluster_prefix,
            setup=setup,
            ray_port=ray_port,
            poll_interval_s=poll_interval_s,
            call_timeout_s=call_timeout_s,
            credential_check=credential_check,
            fetch_catalog=fetch_catalog,
            down_on_loss=down_on_loss,
        )
        self._sdk = sdk  # None: import `sky` on first use
        self._gangs: dict[str, _Gang] = {}
        self._pending: list[Event] = []
        self._gpus: dict[tuple[str, str], int] = {}  # (cloud, instance type) -> GPUs per node
        self._closed = threading.Event()  # set by close(); also what polling waits on
        self._poll = PacedPoll(
            look=self._refresh,
            drain=self._drain,
            interval_s=self.config.poll_interval_s,
            stop=self._closed,
        )

    # ---- SDK calls ------------------------------------------------------------------------------

    def _sky(self) -> Any:
        if self._sdk is None:
            self._sdk = load_sdk()
        return self._sdk

    def _call(
        self, call: str, where: str, submit: Callable[[Any], Any], *, gone_ok: bool = False
    ) -> Any:
        """Submit one request and wait for its result (``call_timeout_s``), errors typed; with
        ``gone_ok``, a cluster that does not exist is an answer (``None``), not an error."""
        sdk = self._sky()
        gone = getattr(sdk.exceptions, "ClusterDoesNotExist", ()) if gone_ok else ()
        deadline_s = time.monotonic() + self.config.call_timeout_s
        try:
            request_id = submit(sdk)
            return wait(
                sdk,
                request_id,
                deadline_s=deadline_s,
                poll_interval_s=self.config.poll_interval_s,
                stop=self._closed,
            )
        except gone:
            return None
        except Exception as error:  # any SDK failure becomes a typed, scrubbed contract error
            raise to_error(sdk, error, call=call, where=where) from None

    def _down(self, cluster: str) -> None:
        """``sky down`` the cluster; one that does not exist is already down."""
        self._call("sky.down", cluster, lambda s: s.down(cluster), gone_ok=True)

    def _statuses(self, clusters: list[str]) -> dict[str, Any]:
        """cluster name -> its ``sky.status`` record, refreshed from the clouds where SkyPilot
        thinks it may have changed (spot clusters, autostop)."""
        rows = self._call(
            "sky.status",
            ", ".join(clusters),
            lambda s: s.status(cluster_names=clusters, refresh=s.StatusRefreshMode.AUTO),
        )
        return {record_field(row, "name"): row for row in rows or []}

    # ---- credentials and offers -----------------------------------------------------------------

    @property
    def clouds(self) -> tuple[str, ...]:
        return self.config.clouds

    def check_credentials(self) -> None:
        clouds = self.config.clouds
        self._sky()  # SdkMissing first: nothing else matters without the SDK
        if self.config.credential_check == "skypilot":
            result = self._call(
                "sky.check", ", ".join(clouds), lambda s: check_request(s, tuple(clouds))
            )
            missing = credentials.missing_by_check(clouds, result)
        else:
            missing = credentials.missing_offline(clouds)
        if missing:
            raise CredentialsMissing(
                "; ".join(f"{cloud}: {what}" for cloud, what in missing.items()),
                cloud=CLOUD,
                call="sky.check" if self.config.credential_check == "skypilot" else "credentials",
                fix="log in to each cloud named above (or leave it out of clouds=...), "
                "then run `sky check` to confirm SkyPilot sees it",
            )

    def offers(
        self, *, gpus: Collection[str] | None = None, regions: Collection[str] | None = None
    ) -> list[Offer]:
        found: list[Offer] = []
        for cloud in self.config.clouds:
            found += self._cloud_offers(cloud, gpus=gpus, regions=regions)
        return found

    def _cloud_offers(
        self, cloud: str, *, gpus: Collection[str] | None, regions: Collection[str] | None
    ) -> list[Offer]:
        common = self._sky().catalog.common
        name = catalog_file(cloud)
        path = common.get_catalog_path(name)
        on_disk = os.path.exists(path)
        if not on_disk and not self.config.fetch_catalog:
            raise CloudCallError(
                f"SkyPilot's {cloud} catalog is not on disk at {path} and fetching is off",
                cloud=CLOUD,
                call="sky.catalog.read_catalog",
                fix=f"run `sky show-gpus --infra {cloud}` once with network access, "
                "or construct the provisioner with fetch_catalog=True",
            )
        try:
            rows = records(common.read_catalog(name))
        except Exception as error:  # a failed download or an unreadable CSV, typed
            raise to_error(
                self._sky(), error, call="sky.catalog.read_catalog", where=path
            ) from None
        observed_at_s = os.path.getmtime(path) if os.path.exists(path) else time.time()
        return offers_from_rows(
            cloud, rows, observed_at_s=observed_at_s, gpus=gpus, regions=regions
        )

    def _gpus_per_node(self, request: LaunchRequest) -> int:
        key = (request.cloud, request.instance_type)
        if key not in self._gpus:
            for offer in self._cloud_offers(request.cloud, gpus=[request.gpu], regions=None):
                self._gpus[(offer.cloud, offer.instance_type)] = offer.gpus_per_node
        if key not in self._gpus:
            raise CloudCallError(
                f"{request.instance_type} with {request.gpu} GPUs is not in SkyPilot's "
                f"{request.cloud} catalog",
                cloud=CLOUD,
                call="sky.catalog.read_catalog",
                fix="pick an instance type from offers(), or refresh the catalog (`sky show-gpus`)",
            )
        return self._gpus[key]

    # ---- launch ---------------------------------------------------------------------------------

    def launch(self, request: LaunchRequest) -> list[Node]:
        if request.cloud not in self.config.clouds:
            raise CloudCallError(
                f"{request.infra} is on {request.cloud}, which this provisioner does not use "
                f"(clouds={list(self.config.clouds)})",
                cloud=CLOUD,
                call="sky.launch",
                fix=f"add {request.cloud!r} to clouds=..., or launch in one of those clouds",
            )
        previous = self._gangs.get(request.gang)
        if previous is not None and any(n.state in ALIVE for n in previous.nodes):
            raise CloudCallError(
                f"gang {request.gang!r} already runs as cluster {previous.cluster}",
                cloud=CLOUD,
                call="sky.launch",
                fix="terminate that gang first, or give the new one another name",
            )
        gang = _Gang(
            request=request,
            cluster=cluster_name(request.gang, prefix=self.config.cluster_prefix),
            gpus_per_node=self._gpus_per_node(request),
        )
        self._gangs[request.gang] = gang
        log.info(
            "sky.launch %s: %d x %s in %s",
            gang.cluster,
            request.count,
            request.instance_type,
            request.infra,
        )
        self._launch(gang)
        try:
            record = self._statuses([gang.cluster]).get(gang.cluster)
        except ProvisionerError:
            self._abandon(gang)  # up, but we cannot see it: do not leave it billing
            raise
        if cluster_status(record) != "UP":
            self._abandon(gang)
            raise CloudCallError(
                f"sky.launch of {gang.cluster} returned but the cluster is "
                f"{cluster_status(record) or 'gone'}, not UP",
                cloud=CLOUD,
                call="sky.status",
                fix=f"see `sky status {gang.cluster}` and `sky logs {gang.cluster}`, then retry",
            )
        self._pending += self._observe(gang, record)
        return list(gang.nodes)

    def _launch(self, gang: _Gang) -> None:
        """``sky.launch`` the gang's cluster and wait until it is up; on any failure, down what
        SkyPilot left and raise the typed error."""
        sdk, request = self._sky(), gang.request
        where = f"{request.count} x {request.instance_type} ({request.gpu}) in {request.infra}"
        deadline_s = time.monotonic() + request.timeout_s
        try:
            task = build_task(
                sdk,
                request,
                cluster=gang.cluster,
                gpus_per_node=gang.gpus_per_node,
                setup=self.config.setup,
                ray_port=self.config.ray_port,
            )
            # retry_until_up=False: no capacity here should fail fast so the caller can move on
            request_id = sdk.launch(task, cluster_name=gang.cluster, retry_until_up=False)
            wait(
                sdk,
                request_id,
                deadline_s=deadline_s,
                poll_interval_s=self.config.poll_interval_s,
                stop=self._closed,
            )
        except RequestTimeout:
            self._abandon(gang)
            raise CapacityError(
                f"{where} was not up within {request.timeout_s:g} s",
                cloud=CLOUD,
                call="sky.launch",
                fix="try another zone, region or cloud, or give the launch a longer timeout_s",
            ) from None
        except Exception as error:  # typed below; the gang is torn down first
            self._abandon(gang)
            raise to_error(sdk, error, call="sky.launch", where=where) from None

    def _abandon(self, gang: _Gang) -> None:
        """Down a gang that failed to start. If even that fails, the gang stays tracked, so that
        ``nodes()`` shows what SkyPilot still has and ``terminate`` can retry."""
        gang.down_requested = True
        try:
            self._down(gang.cluster)
        except ProvisionerError as error:
            log.error("could not down failed gang %s: %s", gang.cluster, error)
            return
        gang.nodes = [replace(n, state=NodeState.TERMINATED) for n in gang.nodes]

    # ---- nodes, events, terminate ---------------------------------------------------------------

    def _observe(self, gang: _Gang, record: Any) -> list[Event]:
        """Update ``gang`` from one status record (``None``: the cluster is gone); the events
        its change means."""
        status = cluster_status(record)
        if gang.down_requested:
            if status is None:
                gang.nodes = [replace(n, state=NodeState.TERMINATED) for n in gang.nodes]
            return []
        if status == "UP" and not gang.ever_up:
            gang.ever_up = True
            gang.nodes = cluster_nodes(
                record,
                gang.request,
                cluster=gang.cluster,
                gpus_per_node=gang.gpus_per_node,
                state=NodeState.RUNNING,
            )
            return [NodeReady(node=n) for n in gang.nodes]
        if status == "UP" or not gang.ever_up:
            return []  # unchanged, or still coming up
        # it was UP and now is INIT (nodes missing), STOPPED or gone, and we did not ask
        reason = "preempted" if gang.request.spot else "failed"
        log.warning(
            "cluster %s is %s: its nodes are lost (%s)", gang.cluster, status or "gone", reason
        )
        gang.nodes = [replace(n, state=NodeState.LOST) for n in gang.nodes]
        if self.config.down_on_loss and status is not None:
            self._abandon_lost(gang)
        return [NodeLost(node_id=n.node_id, infra=n.infra, reason=reason) for n in gang.nodes]

    def _abandon_lost(self, gang: _Gang) -> None:
        """Down what is left of a gang that lost nodes: it cannot train, yet it bills."""
        try:
            self._down(gang.cluster)
        except ProvisionerError as error:
            log.error("could not down %s after it lost nodes: %s", gang.cluster, error)

    def _refresh(self) -> None:
        """One ``sky.status`` look at every gang still alive; queue the events it means."""
        watched = [g for g in self._gangs.values() if g.nodes and not g.ended]
        if not watched:
            return
        records = self._statuses([g.cluster for g in watched])
        for gang in watched:
            self._pending += self._observe(gang, records.get(gang.cluster))

    def nodes(self, *, gang: str | None = None) -> list[Node]:
        self._refresh()
        return [
            node
            for name, tracked in self._gangs.items()
            if gang is None or name == gang
            for node in tracked.nodes
        ]

    def poll_events(self, *, timeout_s: float = 0.0) -> list[Event]:
        return self._poll(timeout_s=timeout_s)

    def _drain(self) -> list[Event]:
        events, self._pending = self._pending, []
        return events

    def terminate(self, node_ids: Sequence[str]) -> None:
        asked = set(node_ids)
        for gang in self._gangs.values():
            ids = {n.node_id for n in gang.nodes}
            if not ids & asked:
                continue
            alive = any(n.state in ALIVE for n in gang.nodes)
            if alive and not ids <= asked:
                raise Unsupported(
                    f"SkyPilot manages cluster {gang.cluster} as a whole; asked to end "
                    f"{sorted(ids & asked)} of its nodes {sorted(ids)}",
                    cloud=CLOUD,
                    call="sky.down",
                    fix=f"terminate every node of gang {gang.request.gang!r}, or launch gangs "
                    "of one node where nodes must go one by one",
                )
            gang.down_requested = True
            self._down(gang.cluster)
            gang.nodes = [
                n if n.state == NodeState.LOST else replace(n, state=NodeState.TERMINATED)
                for n in gang.nodes
            ]

    def close(self) -> None:
        self._closed.set()


__all__ = ["SkyPilotConfig", "SkyPilotProvisioner"]
