"""An emulated Azure that really boots: the in-memory ARM and Retail Prices API (azure_api.py) on a
VM of the job's simulated internet, namespace VMs as the virtual machines.

The real azure-mgmt-compute client of the Azure adapter sends its requests through
``RelayTransport`` to the API on the ``azure-api`` VM (the real URL in a header; the bearer token of
a per-emulation credential checked on each). Every VM it creates boots (booter.py) as a namespace VM
that runs its decoded ``osProfile.customData``, as cloud-init does, with Azure's instance metadata
service inside it (Scheduled Events, ``Metadata: true``). They stay in step: a deleted VM loses its
namespace; one that powers itself off is left stopped; ``interrupt(name, notice_s)`` is a Spot
eviction (a ``Preempt`` scheduled event now, then at ``NotBefore`` the VM goes and ARM deletes it
under eviction policy Delete); ``lose`` takes it with no notice. A VM whose NIC is behind a
network security group has the group's inbound rules in front of it as nftables rules, kept in
step with the API (what the group does not admit does not arrive). The API's SKUs are the T4
sizes the catalog lists for the emulated regions, at the catalog's published prices.

Needs root (namespaces).
"""

from __future__ import annotations

import base64
import uuid
from pathlib import Path

from provisioners.emulated.azure_api import FakeAzure, price, sku
from provisioners.emulated.azure_wire import serve
from provisioners.emulated.booter import EmulatedCloud, Seen
from provisioners.emulated.imds import AzureMetadata, MetadataService
from provisioners.local import netns

API_VM = "azure-api"
RESOURCE_GROUP = "geo-orchestrator"  # the adapter's default group
API_PORT = 80
# the adapter's NICs go in this subnet (the emulated network has no other)
SUBNET = "/subscriptions/emulated/resourceGroups/net/providers/Microsoft.Network/virtualNetworks/geo/subnets/default"


class EmulatedAzure(EmulatedCloud):
    name = "azure"
    api_vm = API_VM  # the VM its API listens on

    def __init__(
        self,
        *,
        internet: netns.Internet,
        folder: Path,
        sizes: dict[tuple[str, str], tuple[int, int, float, float, float]],
        vm_env: dict[str, str] | None = None,
        refusals: dict[str, str] | None = None,
    ) -> None:
        """``sizes``: (region, VM size) -> (GPUs, vCPUs, memory GiB, on-demand $/h, spot $/h),
        what the API lists and prices; ``refusals``: region -> ``capacity`` (creates there fail
        ZonalAllocationFailed) or ``quota`` (a 409 OperationNotAllowed quota error)."""
        super().__init__(internet=internet, folder=folder, vm_env=vm_env)
        self.api = FakeAzure(prices_page_size=100)
        self.subscription_id = self.api.subscription_id
        self.resource_group = RESOURCE_GROUP
        # the user's token, shaped as Entra ID's (the adapter reads whom to grant roles to); the
        # API answers only known tokens
        self.token = self.api.hosting.mint(str(uuid.uuid4()))
        self.subnet_id = SUBNET
        for (region, size), (gpus, vcpus, memory_gb, on_demand, spot) in sorted(sizes.items()):
            self.api.skus.append(sku(size, region, gpus=gpus, vcpus=vcpus, memory_gb=memory_gb))
            meter = size.removeprefix("Standard_").replace("_", " ")
            self.api.prices += [
                price(region, size, on_demand, meter, product="Virtual Machines NCasT4 v3 Series"),
                price(
                    region, size, spot, f"{meter} Spot", product="Virtual Machines NCasT4 v3 Series"
                ),
            ]
            kind = (refusals or {}).get(region)
            for zone in ("1", "2", "3"):
                if kind == "capacity":
                    self.api.capacity[(size, zone)] = 0
            if kind == "quota":
                self.api.create_errors[size] = (
                    409,
                    "OperationNotAllowed",
                    f"Operation could not be completed as it results in exceeding approved "
                    f"LowPriorityCores quota. Location: {region}, Current Limit: 0.",
                )
        self._server = None
        self.endpoint_url = ""

    def start(self) -> str:
        """Start the API and the booter; the endpoint for ``RelayTransport``."""
        api = self.internet.add_vm(API_VM)
        self._server = serve(
            self.api,
            host=api.public_ip,
            port=API_PORT,
            listen=lambda make: netns.in_namespace(api.netns, make),
        )
        self.endpoint_url = f"http://{api.public_ip}:{API_PORT}"
        self.booter.start()
        return self.endpoint_url

    def _seen(self) -> list[Seen]:
        with self.api.lock:
            vms = [
                (vm.name, vm.body, vm.provisioning, vm.power, self.api.ingress(vm.body))
                for vm in self.api.vms.values()
            ]
        seen = []
        for name, body, provisioning, power, ingress in vms:
            data = body["properties"].get("osProfile", {}).get("customData")
            seen.append(
                Seen(
                    instance_id=name,
                    zone=(body.get("zones") or [""])[0],
                    running=provisioning != "Failed" and power in ("starting", "running"),
                    script=base64.b64decode(data) if data else None,
                    ingress=ingress,  # its security group's rules, as the VM's own firewall
                )
            )
        return seen

    def _metadata(self, vm: netns.Vm, seen: Seen) -> MetadataService:
        with self.api.lock:
            found = self.api.vms.get(seen.instance_id)
            body = found.body if found else {}
        named = (body.get("identity") or {}).get("userAssignedIdentities") or {}
        compute = {
            "name": seen.instance_id,
            "location": body.get("location", ""),
            "resourceGroupName": self.resource_group,
            "subscriptionId": self.subscription_id,
        }

        def mint() -> str | None:  # the VM's one user-assigned identity, as IMDS picks it
            with self.api.lock:
                held = [self.api.hosting.identity_of(i) for i in named]
                if len(held) != 1 or held[0] is None:
                    return None
                return self.api.hosting.mint(held[0]["properties"]["principalId"])

        return MetadataService(vm, AzureMetadata(name=seen.instance_id, compute=compute, mint=mint))

    def tagged(self, tags: dict[str, str]) -> list[str]:
        """VMs whose tags include ``tags``, booted here."""
        with self.api.lock:
            named = [
                vm.name
                for vm in self.api.vms.values()
                if tags.items() <= (vm.body.get("tags") or {}).items()
            ]
        return [name for name in named if self.vm_of(name) is not None]

    def _ended(self, name: str, why: str) -> None:
        with self.api.lock:
            vm = self.api.vms.get(name)
            if vm is None:
                return
            if why == "shutdown":
                vm.power = "stopped"
                return
        if why == "reclaimed":
            self.api.evict(name)
        else:
            with self.api.lock:
                self.api.vms.pop(name, None)

    def close(self) -> None:
        """Stop booting, remove every VM, stop the API."""
        self.booter.close()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        self.internet.kill_vm(API_VM)
