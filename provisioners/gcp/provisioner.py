"""``GcpProvisioner``: GPU VMs on Google Compute Engine through google-cloud-compute (REST).

- offers: see ``offers``.
- launch: ``instances.insert`` per node (SPOT scheduling for spot), then the zone operations are
  polled to DONE and the instances to RUNNING within ``request.timeout_s``; any failure deletes
  every instance of the gang that was inserted, then raises the typed error.
- events: each ``poll_events`` call lists our instances and the zone's
  ``compute.instances.preempted`` operations: RUNNING -> NodeReady, preempted -> NodeLost
  ("preempted"), vanished or stopped without a preemption -> NodeLost ("failed"). The nodes, their
  zones and the queued events live in a ``provisioners.tracker.NodeTracker``.

Credentials come only from google-auth's standard chain (``google.auth.default()``); tests may
inject ``credentials`` and ``client_options`` to point the real client at a local fake.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from provisioners.base import (
    BOOTSTRAP_INSTALL_S,
    GPU_VM_BOOT_S,
    CapacityError,
    CloudCallError,
    Event,
    Feature,
    Firewall,
    Identities,
    LabelledVm,
    LaunchRequest,
    Node,
    NodeReady,
    NodeState,
    Offer,
    PacedPoll,
    Provisioner,
    ProvisionerError,
)
from provisioners.bootstrap.script import boot_data, gcp_metadata
from provisioners.gcp import firewall as job_firewall
from provisioners.gcp import hosting, pricing, sdk
from provisioners.gcp.api import ComputeApi
from provisioners.gcp.catalog import gpus_for, last_segment
from provisioners.gcp.instances import (
    GANG_LABEL,
    MANAGED_LABEL,
    InstanceSpec,
    VmOptions,
    address_of,
    build_instance,
    instance_name,
    sanitize_labels,
)
from provisioners.gcp.labels import set_labels
from provisioners.gcp.offers import Market, MarketOptions
from provisioners.tracker import NodeTracker, Tracked

_LOG = logging.getLogger(__name__)
CLOUD = "gcp"
DEFAULT_IMAGE = (
    "projects/deeplearning-platform-release/global/images/family/common-cu124-debian-11-py310"
)
PREEMPTED_FILTER = 'operationType="compute.instances.preempted"'
_DEAD_STATUSES = ("STOPPED", "TERMINATED", "SUSPENDED")


@dataclass(frozen=True, kw_only=True)
class GcpOptions:
    """The adapter's settings (the constructor's keywords, validated once)."""

    project: str | None = None
    client_options: Mapping[str, Any] | None = None  # e.g. {"api_endpoint": ...} for a fake
    market: MarketOptions = MarketOptions()
    vm: VmOptions = VmOptions(
        image=DEFAULT_IMAGE,
        disk_size_gb=200,
        network="global/networks/default",
        external_ip=True,
        spot_termination_action="DELETE",
        service_account_scopes=sdk.SCOPES,
    )
    poll_interval_s: float = 5.0

    def __post_init__(self) -> None:
        if self.poll_interval_s < 0:
            raise ValueError(f"poll_interval_s must be >= 0, not {self.poll_interval_s}")
        if self.vm.spot_termination_action not in ("DELETE", "STOP"):
            raise ValueError(
                f"spot_termination_action must be DELETE or STOP, not "
                f"{self.vm.spot_termination_action!r}"
            )


class GcpProvisioner(Provisioner):
    """GPU instances on GCP (spot or on-demand) behind the provisioner contract."""

    cloud = CLOUD
    # 240 s: how long SkyPilot waits on GCP for a node to launch before it fails over
    launch_timeout_s = 240.0 + GPU_VM_BOOT_S + BOOTSTRAP_INSTALL_S
    unsupported = {
        Feature.RELABEL: "not yet: instances.setLabels needs each instance's label fingerprint",
        Feature.AVAILABLE_COUNT: "the Compute API does not say how many GPUs a zone can give",
        Feature.AVAILABILITY_SCORE: "GCP publishes no spot availability score",
        Feature.PREEMPTION_RATE: "GCP publishes no preemption rate per zone or machine type",
        Feature.PREEMPTION_NOTICE: "GCP's ~30 s preemption notice reaches only the VM's own "
        "metadata server, not the control plane; the loss is seen from zone operations",
    }

    def __init__(
        self,
        *,
        project: str | None = None,
        regions: Collection[str] = (),
        zones: Collection[str] = (),
        client_options: Mapping[str, Any] | None = None,
        credentials: Any = None,
        billing_endpoint: str = pricing.BILLING_ENDPOINT,
        price_table: pricing.PriceTable | None = None,
        poll_interval_s: float = 5.0,
        image: str = DEFAULT_IMAGE,
        disk_size_gb: int = 200,
        network: str = "global/networks/default",
        external_ip: bool = True,
        spot_termination_action: str = "DELETE",
    ) -> None:
        """``credentials`` is for tests only (a fake token against a local endpoint); without it
        the adapter uses ``google.auth.default()``, the standard chain."""
        self.options = GcpOptions(
            project=project,
            client_options=client_options,
            market=MarketOptions(
                regions=tuple(regions),
                zones=tuple(zones),
                billing_endpoint=billing_endpoint,
                price_table=price_table,
            ),
            vm=VmOptions(
                image=image,
                disk_size_gb=disk_size_gb,
                network=network,
                external_ip=external_ip,
                spot_termination_action=spot_termination_action,
                service_account_scopes=sdk.SCOPES,
            ),
            poll_interval_s=poll_interval_s,
        )
        self._api = ComputeApi(
            project=project, credentials=credentials, client_options=client_options
        )
        self._market = Market(self._api, self.options.market)
        self._tracker = NodeTracker()  # the nodes (``where``: their zone) and queued events
        self._stop = threading.Event()
        self._poll = PacedPoll(
            look=self._refresh,
            drain=self._tracker.drain,
            interval_s=self.options.poll_interval_s,
            stop=self._stop,
        )

    @classmethod
    def at_endpoint(
        cls,
        endpoint: str,
        *,
        token: str,
        project: str,
        regions: Collection[str] = (),
        poll_interval_s: float = 0.5,
    ) -> GcpProvisioner:
        """An adapter for the Compute and Billing APIs at ``endpoint`` (an emulation,
        provisioners/emulated/gcp.py) that sends a fixed bearer ``token``."""
        from google.oauth2.credentials import Credentials

        return cls(
            project=project,
            regions=regions,
            credentials=Credentials(token=token),
            client_options={"api_endpoint": endpoint},
            billing_endpoint=endpoint,
            poll_interval_s=poll_interval_s,
        )

    def check_credentials(self) -> None:
        self._api.credentials_and_project()

    # ---- hosting a job's controller (hosting.py) -------------------------------------------------

    def job_bucket(self, region: str) -> str:
        return hosting.ensure_bucket(self._api, region, endpoint=self._storage_endpoint())

    def job_buckets(self) -> dict[str, str]:
        return hosting.job_buckets(self._api, endpoint=self._storage_endpoint())

    def identities(self, bucket_url: str) -> Identities:
        return hosting.IDENTITIES

    def _storage_endpoint(self) -> str | None:
        return (self.options.client_options or {}).get("api_endpoint")

    @property
    def project(self) -> str:
        return self._api.project

    def offers(
        self, *, gpus: Collection[str] | None = None, regions: Collection[str] | None = None
    ) -> list[Offer]:
        return self._market.offers(gpus=gpus, regions=regions)

    # ---- launch ---------------------------------------------------------------------------------

    def launch(self, request: LaunchRequest) -> list[Node]:
        for script in request.boot_scripts:  # too long: say so before anything is inserted
            boot_data(gcp_metadata, script, cloud=CLOUD, call="instances.insert")
        region, zone = self._place(request)
        gpus, attached = self._gpu_count(request, zone)
        labels = sanitize_labels(
            (*request.labels, (MANAGED_LABEL, "true"), (GANG_LABEL, request.gang))
        )
        specs = [
            InstanceSpec(
                name=instance_name(request.gang, i),
                zone=zone,
                machine_type=request.instance_type,
                gpu=request.gpu,
                attached_gpus=gpus if attached else 0,
                spot=request.spot,
                labels=labels,
                startup_script=request.boot_scripts[i] if request.boot_scripts else None,
                network_tags=self._behind(request.firewall),
                service_account=request.identity or "default",
            )
            for i in range(request.count)
        ]
        infra = f"{CLOUD}/{region}/{zone}"
        tracked = [
            self._tracker.add(
                Node(
                    node_id=spec.name,
                    gang=request.gang,
                    infra=infra,
                    instance_type=request.instance_type,
                    gpu=request.gpu,
                    gpus=gpus,
                    spot=request.spot,
                    state=NodeState.PENDING,
                    launched_at_s=time.time(),
                    labels=labels,
                ),
                where=zone,
            )
            for spec in specs
        ]
        deadline = time.monotonic() + request.timeout_s
        inserted: list[str] = []
        try:
            operations = [self._insert(spec, inserted) for spec in specs]
            for operation in operations:
                self._wait_operation(operation, zone, deadline)
            running = self._wait_running(zone, [s.name for s in specs], deadline)
        except ProvisionerError:
            self._delete_all(zone, inserted)
            for one in tracked:
                self._tracker.ended(one, state=NodeState.TERMINATED)
            raise
        return [
            self._tracker.update(
                one,
                _ready,
                state=NodeState.RUNNING,
                address=address_of(running[one.node.node_id]),
            )
            for one in tracked
        ]

    def _behind(self, firewall: Firewall | None) -> tuple[str, ...]:
        """The network tag of the job's firewall rule, made (or set) before its VMs exist."""
        if firewall is None:
            return ()
        self.open_overlay(firewall)
        return (job_firewall.rule_name(firewall.name),)

    def open_overlay(self, firewall: Firewall) -> None:
        job_firewall.open_overlay(self._api, network=self.options.vm.network, firewall=firewall)

    def _place(self, request: LaunchRequest) -> tuple[str, str]:
        """(region, zone) for the request; without a zone, the first zone offering it."""
        parts = request.infra.split("/")
        if parts[0] != CLOUD:
            raise CloudCallError(
                f"{request.infra!r} is not a GCP location",
                cloud=CLOUD,
                call="launch",
                fix="use infra 'gcp/REGION[/ZONE]'",
            )
        region = parts[1]
        if len(parts) > 2:
            return region, parts[2]
        if not request.gpu:  # a CPU VM (a job's controller): the first zone that is up
            zones = self._market.zones([region])
            if zones:
                return region, zones[0]
        for shape in self._market.zone_gpus(gpus=[request.gpu], regions=[region]):
            if shape.machine.name == request.instance_type:
                return region, shape.zone
        raise CapacityError(
            f"no zone of {region} offers {request.instance_type} with {request.gpu}",
            cloud=CLOUD,
            call="launch",
            fix="choose a region or zone that offers() lists for this GPU and instance type",
        )

    def _gpu_count(self, request: LaunchRequest, zone: str) -> tuple[int, bool]:
        """GPUs per node, and whether they are attached as guestAccelerators (False: the
        accelerator-optimized machine type carries them)."""
        if not request.gpu:
            return 0, False  # a CPU VM
        machine = self._market.machine(zone, request.instance_type)
        count, attached = gpus_for(request.instance_type, request.gpu, machine)
        if count == 0:
            raise CloudCallError(
                f"{request.instance_type} in {zone} has no {request.gpu} and takes none",
                cloud=CLOUD,
                call="launch",
                fix="use an instance type that offers() lists for this GPU",
            )
        return count, attached

    def _insert(self, spec: InstanceSpec, inserted: list[str]) -> Any:
        instance = build_instance(sdk.compute_module(), spec, self.options.vm)
        operation = self._api.call(
            "instances.insert",
            spec.zone,
            lambda: self._api.client("InstancesClient").insert_unary(
                project=self.project, zone=spec.zone, instance_resource=instance
            ),
        )
        inserted.append(spec.name)
        return operation

    def _wait_operation(self, operation: Any, zone: str, deadline: float) -> None:
        """Poll a zone operation until DONE; raise the typed error it carries."""
        done = sdk.compute_module().Operation.Status.DONE
        while operation.status != done:
            self._pause_until(deadline, what=f"operation {operation.name}", zone=zone)
            operation = self._api.call(
                "zoneOperations.get",
                zone,
                lambda name=operation.name: self._api.client("ZoneOperationsClient").get(
                    project=self.project, zone=zone, operation=name
                ),
            )
        failure = sdk.from_operation(operation, call="instances.insert", where=zone)
        if failure is not None:
            raise failure

    def _wait_running(self, zone: str, names: Sequence[str], deadline: float) -> dict[str, Any]:
        """Poll every instance until RUNNING; a stopped or vanished one fails the gang."""
        running: dict[str, Any] = {}
        while True:
            for name in [n for n in names if n not in running]:
                instance = self._api.call(
                    "instances.get",
                    zone,
                    lambda name=name: self._api.client("InstancesClient").get(
                        project=self.project, zone=zone, instance=name
                    ),
                )
                if instance.status == "RUNNING":
                    running[name] = instance
                elif instance.status in _DEAD_STATUSES + ("STOPPING",):
                    raise CapacityError(
                        f"instance {name} went {instance.status} before it ran (a spot VM "
                        "reclaimed at start usually means the zone is short of capacity)",
                        cloud=CLOUD,
                        call="instances.get",
                        fix="try another zone or on-demand",
                    )
            if len(running) == len(names):
                return running
            self._pause_until(deadline, what="instances to reach RUNNING", zone=zone)

    def _pause_until(self, deadline: float, *, what: str, zone: str) -> None:
        """Wait one poll interval, or raise when ``deadline`` has passed (or ``close()``)."""
        left = deadline - time.monotonic()
        if left <= 0 or self._stop.is_set():
            raise CloudCallError(
                f"timed out waiting for {what} in {zone}",
                cloud=CLOUD,
                call="launch",
                fix="raise LaunchRequest.timeout_s, or try another zone",
            )
        self._stop.wait(min(self.options.poll_interval_s, left))

    # ---- nodes, terminate, events ---------------------------------------------------------------

    def nodes(self, *, gang: str | None = None) -> list[Node]:
        return self._tracker.nodes(gang=gang)

    def terminate(self, node_ids: Sequence[str]) -> None:
        # only live ones: unknown or already gone needs nothing (idempotent)
        for tracked in self._tracker.known(node_ids):
            self._delete(tracked.where, tracked.node.node_id)
            self._tracker.ended(tracked, state=NodeState.TERMINATED)

    def relabel(self, node_ids: Sequence[str], labels: Mapping[str, str]) -> None:
        for tracked in self._tracker.known(node_ids):
            set_labels(self._api, zone=tracked.where, name=tracked.node.node_id, labels=labels)

    def drop_firewalls(self, job: str) -> tuple[list[str], list[str]]:
        return job_firewall.drop(self._api, job=job), []

    def relabel_labelled(self, vms: Sequence[LabelledVm], labels: Mapping[str, str]) -> None:
        for vm in vms:
            set_labels(self._api, zone=vm.infra.split("/")[2], name=vm.node_id, labels=labels)

    def poll_events(self, *, timeout_s: float = 0.0) -> list[Event]:
        return self._poll(timeout_s=timeout_s)

    def close(self) -> None:
        self._stop.set()

    def _refresh(self) -> None:
        """One look at the cloud for every zone where we have live nodes (queueing the events
        their changes mean)."""
        for zone, tracked in self._tracker.by_where().items():
            instances = {
                i.name: i
                for i in self._api.call(
                    "instances.list",
                    zone,
                    lambda zone=zone: list(
                        self._api.client("InstancesClient").list(
                            request={
                                "project": self.project,
                                "zone": zone,
                                "filter": f'labels.{MANAGED_LABEL}="true"',
                            }
                        )
                    ),
                )
            }
            preempted = {
                last_segment(op.target_link)
                for op in self._api.call(
                    "zoneOperations.list",
                    zone,
                    lambda zone=zone: list(
                        self._api.client("ZoneOperationsClient").list(
                            request={
                                "project": self.project,
                                "zone": zone,
                                "filter": PREEMPTED_FILTER,
                            }
                        )
                    ),
                )
            }
            for one in tracked:
                node_id = one.node.node_id
                self._observe(one, instances.get(node_id), node_id in preempted)

    def _observe(self, tracked: Tracked, instance: Any, preempted: bool) -> None:
        """Update one node from what the cloud shows and queue the event it implies."""
        if preempted:
            self._tracker.ended(tracked, state=NodeState.LOST, reason="preempted")
        elif instance is None or instance.status in _DEAD_STATUSES:
            self._tracker.ended(tracked, state=NodeState.LOST, reason="failed")
        elif instance.status == "RUNNING" and tracked.node.state == NodeState.PENDING:
            self._tracker.update(
                tracked, _ready, state=NodeState.RUNNING, address=address_of(instance)
            )

    def labelled(self, key: str) -> list[LabelledVm]:
        """Our instances in every zone (instances.aggregatedList on our managed label: a filter
        cannot name a key with a hyphen) that carry label ``key``, as GCP stores it."""
        wanted = sanitize_labels([(key, "")])[0][0]
        scoped = self._api.call(
            "instances.aggregatedList",
            "all zones",
            lambda: list(
                self._api.client("InstancesClient").aggregated_list(
                    request={"project": self.project, "filter": f'labels.{MANAGED_LABEL}="true"'}
                )
            ),
        )
        found = []
        regions = set(self.options.market.regions)
        for scope, listed in scoped:
            zone = last_segment(scope)
            region = zone.rsplit("-", 1)[0]
            if regions and region not in regions:
                continue
            for instance in listed.instances:
                labels = dict(instance.labels)
                if wanted not in labels or instance.status in ("TERMINATED", "STOPPING"):
                    continue
                running = instance.status == "RUNNING"
                found.append(
                    LabelledVm(
                        node_id=instance.name,
                        infra=f"{CLOUD}/{region}/{zone}",
                        instance_type=last_segment(instance.machine_type),
                        state=NodeState.RUNNING if running else NodeState.PENDING,
                        labels=labels,
                    )
                )
        return found

    def terminate_labelled(self, vms: Sequence[LabelledVm]) -> None:
        for vm in vms:
            self._delete(vm.infra.split("/")[2], vm.node_id)

    def _delete(self, zone: str, name: str) -> None:
        """Delete one instance; one that is already gone (HTTP 404) is fine."""
        not_found = sdk.not_found_error()
        try:
            self._api.client("InstancesClient").delete_unary(
                project=self.project, zone=zone, instance=name
            )
        except not_found:
            return
        except sdk.sdk_errors() as error:
            raise sdk.typed(error, call="instances.delete", where=zone) from None

    def _delete_all(self, zone: str, names: Sequence[str]) -> None:
        """Best-effort cleanup of a failed gang; a failure here is logged, not raised, so that the
        error that made the gang fail is the one the caller sees."""
        for name in names:
            try:
                self._delete(zone, name)
            except ProvisionerError as error:
                _LOG.warning(
                    "gcp: could not delete %s in %s after a failed launch: %s", name, zone, error
                )


def _ready(tracked: Tracked) -> list[Event]:
    """The event of a node that has just reached RUNNING (run under the tracker's lock)."""
    return [NodeReady(node=tracked.node)]
