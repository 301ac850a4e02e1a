"""Azure behind the cloud contract, with azure-mgmt-compute.

Offers come from ``resource_skus.list`` (GPU sizes per location and zone, minus the subscription's
restrictions) priced by the Retail Prices API. A gang is launched as one VM per node with
``virtual_machines.begin_create_or_update`` (Spot with an eviction policy and ``maxPrice`` -1),
each behind its own NIC; launch waits, polling with a deadline, until every VM's operation has
succeeded and its instance view says ``PowerState/running``, and deletes them all if one fails.
``poll_events`` reads each live VM's instance view once per round: a vanished Spot VM (eviction
policy Delete) or a deallocated one (Deallocate) is ``NodeLost(reason="preempted")``.

Launched nodes are tracked by ``provisioners.tracker.NodeTracker`` (each with its eviction policy
and whether its VM was created, in ``Tracked.extra``). The SDK is imported only inside methods
(sdk.py), so this module imports without it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any

from provisioners.azure.credentials import (
    default_credential,
    find_credential,
    require_credential,
    require_subscription,
)
from provisioners.azure.firewall import SecurityGroups
from provisioners.azure.hosting import Hosting
from provisioners.azure.instances import (
    VmSettings,
    VmStatus,
    has_tag,
    labelled_vm,
    loss_reason,
    read_status,
    tags_of,
    throwaway_public_key,
    vm_body,
    vm_name,
)
from provisioners.azure.network import ArmNics, NicFactory
from provisioners.azure.offers import GpuSize, gpu_sizes, offers_of
from provisioners.azure.prices import PRICES_URL, PriceSource, RetailPrices
from provisioners.azure.sdk import (
    CLOUD,
    compute_client,
    exceptions,
    from_code,
    identity,
    map_error,
    mapped,
)
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
    scrub,
)
from provisioners.bootstrap.script import azure_custom_data, boot_data
from provisioners.tracker import NodeTracker, Tracked

log = logging.getLogger(__name__)
# Tracked.extra of a node: "eviction_policy" (Delete or Deallocate: what an eviction leaves) and
# "vm_created" (the create PUT was accepted, so deleting the VM deletes the NIC)


class AzureProvisioner(Provisioner):
    """Spot (or pay-as-you-go) GPU VMs in one resource group of one subscription."""

    cloud = CLOUD
    # 90 s: how long SkyPilot waits on Azure for a node to launch before it fails over
    launch_timeout_s = 90.0 + GPU_VM_BOOT_S + BOOTSTRAP_INSTALL_S
    unsupported = {
        Feature.AVAILABLE_COUNT: "Azure publishes no count of free VMs; resource SKUs say only "
        "whether a size may be deployed in a location or zone",
        Feature.AVAILABILITY_SCORE: "Azure's Spot Placement Score is a preview API outside "
        "azure-mgmt-compute; this adapter does not call it",
        Feature.PREEMPTION_RATE: "Azure shows Spot eviction-rate bands only in the portal and "
        "Azure Resource Graph (SpotResources), not in the compute API",
        Feature.PREEMPTION_NOTICE: "Azure announces an eviction (~30 s ahead) only to the VM "
        "itself through Scheduled Events; the control plane sees only the loss. Run "
        "provisioners.azure.metadata.notice on the node instead (its watcher does)",
    }

    def __init__(
        self,
        *,
        subscription_id: str | None = None,
        resource_group: str = "geo-orchestrator",
        locations: Sequence[str] | None = None,
        credential: Any = None,
        client_kwargs: Mapping[str, Any] | None = None,
        poll_interval_s: float = 5.0,
        vm: VmSettings | None = None,
        subnet_id: str | None = None,
        nic_factory: NicFactory | None = None,
        prices_endpoint: str = PRICES_URL,
        price_source: PriceSource | None = None,
    ) -> None:
        # the one place this adapter reads its environment: the SDK's own variable
        self._subscription_id = subscription_id or os.environ.get("AZURE_SUBSCRIPTION_ID")
        self.resource_group = resource_group
        self.locations = tuple(loc.lower() for loc in locations) if locations else None
        self._credential = credential
        self._client_kwargs = dict(client_kwargs or {})
        self.poll_interval_s = poll_interval_s
        self.vm = vm or VmSettings()
        self._subnet_id, self._nic_factory = subnet_id, nic_factory
        transport = {k: v for k, v in self._client_kwargs.items() if k == "transport"}
        self._price_source = price_source or RetailPrices(
            endpoint=prices_endpoint, client_kwargs=transport
        )
        self._client: Any = None
        self._host: Hosting | None = None
        self._groups: SecurityGroups | None = None
        self._nodes = NodeTracker()
        self._gpus_by_size: dict[str, int] = {}
        self._settings_lock = threading.Lock()  # the throwaway login key is made once
        self._stop = threading.Event()  # set by close(); interrupts every wait
        self._poll = PacedPoll(
            look=self._check_live_nodes,
            drain=self._nodes.drain,
            interval_s=self.poll_interval_s,
            stop=self._stop,
        )

    def _vm_settings(self) -> VmSettings:
        """The VM settings with a login key: ARM refuses a Linux VM with neither key nor
        password, so without one a throwaway key is made at the first launch."""
        with self._settings_lock:
            if self.vm.ssh_public_key is None:
                self.vm = dataclasses.replace(self.vm, ssh_public_key=throwaway_public_key())
            return self.vm

    # ---- clients ---------------------------------------------------------------------------------

    def _compute(self) -> Any:
        if self._client is None:
            subscription = require_subscription(self._subscription_id)
            client = compute_client()
            credential = self._credential or default_credential()
            self._credential_in_use = credential  # the hosting calls read its principal
            self._client = client(credential, subscription, **self._client_kwargs)
        return self._client

    def _nics(self) -> NicFactory:
        if self._nic_factory is None:
            given = self._subnet_id
            self._nic_factory = ArmNics(
                self._compute(),
                subscription_id=require_subscription(self._subscription_id),
                resource_group=self.resource_group,
                # no subnet given: the adapter's own network in each location (made once)
                subnet_for=(lambda _: given) if given else self._hosting().ensure_subnet,
                poll_interval_s=self.poll_interval_s,
                stop=self._stop,
                firewalls=self._firewalls(),
            )
        return self._nic_factory

    def _firewalls(self) -> SecurityGroups:
        if self._groups is None:
            self._groups = SecurityGroups(
                self._compute(),
                subscription_id=require_subscription(self._subscription_id),
                resource_group=self.resource_group,
            )
        return self._groups

    def _hosting(self) -> Hosting:
        if self._host is None:
            client = self._compute()
            self._host = Hosting(
                client,
                subscription_id=require_subscription(self._subscription_id),
                resource_group=self.resource_group,
                credential=self._credential_in_use,
                poll_interval_s=self.poll_interval_s,
                stop=self._stop,
            )
        return self._host

    # ---- the contract ----------------------------------------------------------------------------

    def check_credentials(self) -> None:
        # a missing SDK first: installing it is the first thing to do, before any login
        compute_client()
        identity()
        require_subscription(self._subscription_id)
        if self._credential is None:  # an explicit credential is the caller's choice
            require_credential(find_credential())
        self._compute()  # SdkMissing if the SDK is absent; builds no token yet

    def offers(
        self, *, gpus: Collection[str] | None = None, regions: Collection[str] | None = None
    ) -> list[Offer]:
        wanted = {r.lower() for r in regions} if regions is not None else None
        locations = self.locations
        if wanted is not None:
            locations = tuple(sorted(wanted & set(locations) if locations else wanted))
        every = gpu_sizes(self._list_skus(locations))
        self._gpus_by_size |= {s.name: s.gpus_per_node for s in every}
        sizes = [
            s
            for s in every
            if (gpus is None or s.gpu in gpus) and (locations is None or s.location in locations)
        ]
        by_region: dict[str, list[GpuSize]] = {}
        for size in sizes:
            by_region.setdefault(size.location, []).append(size)
        offers = []
        for region, found in sorted(by_region.items()):
            prices = self._price_source.prices(region, {s.name for s in found})
            observed_s = time.time()
            for size in found:
                offers += offers_of(
                    size, prices.get(size.name), observed_s, source=self._price_source.source
                )
        return offers

    def launch(self, request: LaunchRequest) -> list[Node]:
        custom_data = [  # too long: say so before anything is created
            boot_data(azure_custom_data, s, cloud=CLOUD, call="virtual_machines.create")
            for s in request.boot_scripts
        ]
        region, zone = self._where(request)
        self._nics()  # fail before creating anything if there is no network to put VMs in
        # a CPU VM (a job's controller) has no GPU to look up among the GPU sizes
        gpus = self._gpus_per_node(request.instance_type, region) if request.gpu else 0
        deadline_s = time.monotonic() + request.timeout_s
        gang: list[Tracked] = []
        try:
            pollers = {}
            for index in range(request.count):
                tracked = self._track(request, region, zone, index, gpus)
                gang.append(tracked)
                pollers[tracked.node.node_id] = self._create(
                    tracked,
                    region,
                    zone,
                    request,
                    deadline_s,
                    custom_data=custom_data[index] if custom_data else None,
                )
            self._wait_running(gang, pollers, deadline_s, request.infra)
            ready = [self._mark_running(t) for t in gang]
        except BaseException:  # all or nothing, whatever stopped us (errors, timeout, Ctrl-C)
            self._cleanup(gang)
            raise
        self._nodes.emit(*(NodeReady(node=node) for node in ready))
        log.info("azure: gang %s running: %s", request.gang, [n.node_id for n in ready])
        return ready

    def nodes(self, *, gang: str | None = None) -> list[Node]:
        # current states: a look at the live nodes, whose losses wait for poll_events
        self._check_live_nodes()
        return self._nodes.nodes(gang=gang)

    def labelled(self, key: str) -> list[LabelledVm]:
        """The VMs of this provisioner's resource group that carry tag ``key``, whoever made
        them (virtual_machines.list)."""
        with mapped(call="virtual_machines.list", where=self.resource_group):
            # with each VM's power state: one that powered itself off is stopped, still billed
            listed = self._compute().virtual_machines.list(
                self.resource_group, expand="instanceView"
            )
            vms = list(listed)
        return [labelled_vm(vm) for vm in vms if has_tag(vm, key, self.locations)]

    def terminate_labelled(self, vms: Sequence[LabelledVm]) -> None:
        gone = [
            Tracked(
                node=Node(
                    node_id=vm.node_id,
                    gang="",
                    infra=vm.infra,
                    instance_type=vm.instance_type,
                    gpu="",
                    gpus=0,
                    spot=True,
                    state=vm.state,
                ),  # fmt: skip
                extra={"eviction_policy": "Delete", "vm_created": True},
            )
            for vm in vms
        ]
        self._delete(gone, reason="a sweep of labelled VMs")

    def open_overlay(self, firewall: Firewall) -> None:
        self._firewalls().open_overlay(firewall)

    def drop_firewalls(self, job: str) -> tuple[list[str], list[str]]:
        return self._firewalls().drop(job)

    def address_of(self, name: str) -> str | None:
        """The public (else private) address of VM ``name`` of the resource group."""
        return self._nics().address(name)

    def job_bucket(self, region: str) -> str:
        return self._hosting().ensure_bucket(region.lower())

    def job_buckets(self) -> dict[str, str]:
        return self._hosting().job_buckets()

    def identities(self, bucket_url: str) -> Identities:
        return self._hosting().ensure_identities(bucket_url)

    def relabel(self, node_ids: Sequence[str], labels: Mapping[str, str]) -> None:
        known = [t.node for t in self._nodes.known(node_ids, alive_only=False)]
        self.relabel_labelled(
            [
                LabelledVm(n.node_id, n.infra, n.instance_type, n.state, tags_of(n.gang, n.labels))
                for n in known
            ],
            labels,
        )

    def relabel_labelled(self, vms: Sequence[LabelledVm], labels: Mapping[str, str]) -> None:
        """Merge ``labels`` into each VM's tags (a PATCH of the VM: its other tags stay)."""
        for vm in vms:
            with mapped(call="virtual_machines.begin_update", where=vm.node_id):
                self._compute().virtual_machines.begin_update(
                    self.resource_group,
                    vm.node_id,
                    {"tags": {**vm.labels, **labels}},
                    polling_interval=self.poll_interval_s,
                ).result()

    def terminate(self, node_ids: Sequence[str]) -> None:
        known = self._nodes.known(node_ids, alive_only=False)
        self._delete([t for t in known if t.node.state != NodeState.TERMINATED], reason="terminate")

    def poll_events(self, *, timeout_s: float = 0.0) -> list[Event]:
        # a look's losses queue after what was queued before
        return self._poll(timeout_s=timeout_s)

    def close(self) -> None:
        self._stop.set()
        if self._client is not None:
            self._client.close()

    # ---- offers ----------------------------------------------------------------------------------

    def _list_skus(self, locations: Sequence[str] | None) -> list[Any]:
        skus = self._compute().resource_skus
        where = ", ".join(locations) if locations else "all locations"
        with mapped(call="resource_skus.list", where=where):
            if locations is None:
                return list(skus.list())
            return [s for loc in locations for s in skus.list(filter=f"location eq '{loc}'")]

    # ---- launch ----------------------------------------------------------------------------------

    def _where(self, request: LaunchRequest) -> tuple[str, str | None]:
        parts = request.infra.split("/")
        if parts[0] != CLOUD or len(parts) > 3:
            raise CloudCallError(
                f"infra {request.infra!r} is not an Azure location",
                cloud=CLOUD,
                call="launch",
                fix="write azure/<region> or azure/<region>/<zone number>, e.g. azure/eastus/1",
            )
        return parts[1].lower(), (parts[2] if len(parts) == 3 else None)

    def _gpus_per_node(self, size: str, region: str) -> int:
        """GPUs of a VM size, from the last offers or else from the region's resource SKUs."""
        if size not in self._gpus_by_size:
            for found in gpu_sizes(self._list_skus((region,))):
                self._gpus_by_size[found.name] = found.gpus_per_node
        if size not in self._gpus_by_size:
            raise CloudCallError(
                f"{size} is not a GPU VM size this subscription may deploy in {region}",
                cloud=CLOUD,
                call="resource_skus.list",
                fix="pick an instance_type from offers() for this region",
            )
        return self._gpus_by_size[size]

    def _cleanup(self, gang: list[Tracked]) -> None:
        """Delete a failed gang; a failure to clean up is logged, the launch error is raised."""
        try:
            self._delete(gang, reason="launch failed")
        except ProvisionerError as error:
            log.error("azure: could not delete every VM of a failed gang: %s", error)

    def _track(
        self, request: LaunchRequest, region: str, zone: str | None, index: int, gpus: int
    ) -> Tracked:
        name = vm_name(request.gang, index)
        node = Node(
            node_id=name,
            gang=request.gang,
            infra="/".join(p for p in (CLOUD, region, zone) if p),
            instance_type=request.instance_type,
            gpu=request.gpu,
            gpus=gpus,
            spot=request.spot,
            state=NodeState.PENDING,
            launched_at_s=time.time(),
            labels=request.labels,
        )
        return self._nodes.add(
            node, where=region, eviction_policy=self.vm.eviction_policy, vm_created=False
        )

    def _create(
        self,
        tracked: Tracked,
        region: str,
        zone: str | None,
        request: LaunchRequest,
        deadline_s: float,
        *,
        custom_data: str | None,
    ) -> Any:
        """Create the NIC and start the VM create; returns the operation's poller."""
        name = tracked.node.node_id
        nic_id = self._nics().create(
            name=name, location=region, deadline_s=deadline_s, firewall=request.firewall
        )
        tags = tags_of(request.gang, request.labels)
        body = vm_body(
            self._vm_settings(),
            name=name,
            location=region,
            zone=zone,
            size=request.instance_type,
            spot=request.spot,
            nic_id=nic_id,
            tags=tags,
            custom_data=custom_data,
            identity=request.identity,
        )
        with mapped(call="virtual_machines.begin_create_or_update", where=request.infra):
            poller = self._compute().virtual_machines.begin_create_or_update(
                self.resource_group, name, body, polling_interval=self.poll_interval_s
            )
        tracked.extra["vm_created"] = True
        return poller

    def _wait_running(
        self, gang: list[Tracked], pollers: dict[str, Any], deadline_s: float, infra: str
    ) -> None:
        """Poll until every VM's create succeeded and it runs; typed error at the first failure."""
        waiting = {t.node.node_id for t in gang}
        while waiting:
            for name in sorted(waiting):
                if self._vm_ready(name, pollers, infra):
                    waiting.discard(name)
            if not waiting:
                return
            if time.monotonic() >= deadline_s or self._stop.is_set():
                raise CapacityError(
                    f"{len(waiting)} of {len(gang)} VMs in {infra} not running in time: "
                    f"{sorted(waiting)}",
                    cloud=CLOUD,
                    call="launch",
                    fix="try another zone or region, or raise LaunchRequest.timeout_s",
                )
            self._stop.wait(self.poll_interval_s)

    def _vm_ready(self, name: str, pollers: dict[str, Any], infra: str) -> bool:
        poller = pollers.get(name)
        if poller is not None:
            if not poller.done():
                return False
            with mapped(call="virtual_machines.begin_create_or_update", where=infra):
                poller.result()  # raises the operation's error (e.g. ZonalAllocationFailed)
            pollers.pop(name)
        status = self._status(name)
        if status is None:
            raise CloudCallError(
                f"VM {name} vanished while starting in {infra}",
                cloud=CLOUD,
                call="virtual_machines.instance_view",
                fix="a Spot VM can be evicted at once; try another zone or region",
            )
        if status.failed:
            code = status.provisioning.partition("/")[2] if status.provisioning else ""
            raise from_code(
                code, status.message, call="virtual_machines.instance_view", where=infra
            )
        return status.running

    def _mark_running(self, tracked: Tracked) -> Node:
        address = self._nics().address(tracked.node.node_id)
        return self._nodes.update(tracked, state=NodeState.RUNNING, address=address)

    def _delete(self, gang: list[Tracked], *, reason: str) -> None:
        """Delete these VMs (their NICs with them); missing ones are fine. Errors are raised only
        after every delete was attempted, so one failure does not leave the rest running."""
        errors = exceptions()
        failures = []
        for tracked in gang:
            name = tracked.node.node_id
            try:
                if tracked.extra["vm_created"]:
                    self._compute().virtual_machines.begin_delete(
                        self.resource_group, name, polling_interval=self.poll_interval_s
                    )
                else:  # no VM took the NIC: delete it directly
                    self._nics().delete(name)
            except errors.ResourceNotFoundError:
                pass  # already gone: exactly what we wanted
            except (errors.AzureError, ProvisionerError) as error:
                failures.append((name, error))
                continue
            self._nodes.update(tracked, _terminated)
            log.info("azure: deleting VM %s (%s)", name, reason)
        if failures:
            name, error = failures[0]
            if isinstance(error, ProvisionerError):
                raise error
            raise map_error(error, call="virtual_machines.begin_delete", where=name) from error

    # ---- events ----------------------------------------------------------------------------------

    def _status(self, name: str) -> VmStatus | None:
        """The VM's instance view, or None if the VM does not exist (any more)."""
        with mapped(call="virtual_machines.instance_view", where=name):
            try:
                view = self._compute().virtual_machines.instance_view(self.resource_group, name)
            except exceptions().ResourceNotFoundError:
                return None
        return read_status(view.get("statuses"))

    def _check_live_nodes(self) -> None:
        """Look at each running node once; a lost one is LOST and its NodeLost queued."""
        live = [t for t in self._nodes.tracked() if t.node.state == NodeState.RUNNING]
        for tracked in live:
            try:
                status = self._status(tracked.node.node_id)
            except CloudCallError as error:  # a passing ARM hiccup: look again next round
                log.warning("azure: could not read %s: %s", tracked.node.node_id, scrub(str(error)))
                continue
            reason = loss_reason(tracked.node.spot, tracked.extra["eviction_policy"], status)
            if reason is None:
                continue
            self._nodes.ended(tracked, state=NodeState.LOST, reason=reason)
            log.info("azure: node %s lost (%s)", tracked.node.node_id, reason)


def _terminated(tracked: Tracked) -> tuple[()]:
    """Deleted: TERMINATED, unless already LOST (a preemption stays one); no event."""
    if tracked.node.state != NodeState.LOST:
        tracked.node = replace(tracked.node, state=NodeState.TERMINATED)
    return ()
