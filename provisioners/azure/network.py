"""Network interfaces for new VMs: an Azure VM cannot be created without a NIC.

azure-mgmt-network is not a dependency, so ``ArmNics`` creates NICs with plain ARM REST calls
(``Microsoft.Network/networkInterfaces``) sent through the compute client's own pipeline
(``ComputeManagementClient.send_request``): same credential, retries and logging, no extra SDK.
Each NIC gets one dynamic private IP in its location's subnet (``subnet_for(location)``: a given
subnet, or the adapter's own virtual network there, hosting.py); it is created with
``deleteOption: Delete`` on the VM so that deleting the VM deletes it. Anything else (accelerated
networking, your own NIC builder) plugs in through the ``NicFactory`` protocol.

A VM launched behind a job's firewall (``LaunchRequest.firewall``) also gets what a node of a
job needs to be reached from another cloud, as on AWS and GCP: a Standard static **public IP** of
its own (``Microsoft.Network/publicIPAddresses``, deleted with its NIC), and its NIC goes behind the
job's network security group in its location (firewall.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from provisioners.azure.arm import NETWORK_API_VERSION, arm_call
from provisioners.azure.firewall import SecurityGroups
from provisioners.base import CloudCallError, Firewall


class NicFactory(Protocol):
    """Makes, finds the address of, and deletes the NIC of a node named ``name``."""

    def create(
        self, *, name: str, location: str, deadline_s: float, firewall: Firewall | None = None
    ) -> str:
        """Create the NIC (waiting until ARM has provisioned it) and return its resource id;
        behind ``firewall`` with a public IP of its own when one is given."""
        ...

    def address(self, name: str) -> str | None:
        """The node's public IP address if it has one, else its private one, if known."""
        ...

    def delete(self, name: str) -> None:
        """Delete the NIC; a missing one is fine."""
        ...


class ArmNics:
    """``NicFactory`` over ARM REST through the compute client (no azure-mgmt-network needed)."""

    def __init__(
        self,
        client: Any,
        *,
        subscription_id: str,
        resource_group: str,
        subnet_for: Callable[[str], str],
        poll_interval_s: float,
        stop: threading.Event,
        firewalls: SecurityGroups,
    ) -> None:
        self._client, self._subnet_for, self._firewalls = client, subnet_for, firewalls
        self._group = f"/subscriptions/{subscription_id}/resourceGroups/{resource_group}"
        self._prefix = f"{self._group}/providers/Microsoft.Network/networkInterfaces/"
        self._poll_interval_s, self._stop = poll_interval_s, stop

    def nic_name(self, name: str) -> str:
        return f"{name}-nic"

    def create(
        self, *, name: str, location: str, deadline_s: float, firewall: Firewall | None = None
    ) -> str:
        subnet = {"id": self._subnet_for(location)}
        config: dict = {"subnet": subnet, "privateIPAllocationMethod": "Dynamic"}
        properties: dict = {"ipConfigurations": [{"name": "ipconfig1", "properties": config}]}
        if firewall is not None:
            properties["networkSecurityGroup"] = {"id": self._firewalls.ensure(firewall, location)}
            ip_id = self._public_ip(name, location, deadline_s)
            config["publicIPAddress"] = {"id": ip_id, "properties": {"deleteOption": "Delete"}}
        path = self._prefix + self.nic_name(name)
        self._provisioned(path, {"location": location, "properties": properties}, deadline_s)
        return path

    def _public_ip(self, name: str, location: str, deadline_s: float) -> str:
        path = f"{self._group}/providers/Microsoft.Network/publicIPAddresses/{name}-ip"
        body = {
            "location": location,
            "sku": {"name": "Standard"},
            "properties": {"publicIPAllocationMethod": "Static"},
        }
        self._provisioned(path, body, deadline_s)
        return path

    def _provisioned(self, path: str, body: dict, deadline_s: float) -> dict:
        """PUT a resource and wait until ARM has provisioned it (a VM may reference it only
        then): creating one is a long-running operation."""
        kind = path.rsplit("/", 2)[-2]
        made = self._arm("PUT", path, body, call=f"{kind} PUT")
        while (made or {}).get("properties", {}).get("provisioningState") not in (
            "Succeeded",
            None,
        ):
            if time.monotonic() >= deadline_s:
                raise CloudCallError(
                    f"{path.rsplit('/', 1)[-1]} not provisioned in time",
                    cloud="azure",
                    call=f"{kind} PUT",
                    fix="retry; check the subnet and the resource group's activity log",
                )
            self._stop.wait(self._poll_interval_s)
            made = self._arm("GET", path, call=f"{kind} GET")
        return made or {}

    def address(self, name: str) -> str | None:
        public = self._arm(
            "GET",
            f"{self._group}/providers/Microsoft.Network/publicIPAddresses/{name}-ip",
            call="publicIPAddresses GET",
        )
        found = (public or {}).get("properties", {}).get("ipAddress")
        if found:
            return found
        nic = self._arm("GET", self._prefix + self.nic_name(name), call="networkInterfaces GET")
        configs = (nic or {}).get("properties", {}).get("ipConfigurations") or [{}]
        return configs[0].get("properties", {}).get("privateIPAddress")

    def delete(self, name: str) -> None:
        """The NIC, then its public IP (a VM's deletion takes both; a NIC whose VM was never
        made leaves its IP behind otherwise)."""
        self._arm("DELETE", self._prefix + self.nic_name(name), call="networkInterfaces DELETE")
        self._arm(
            "DELETE",
            f"{self._group}/providers/Microsoft.Network/publicIPAddresses/{name}-ip",
            call="publicIPAddresses DELETE",
        )

    def _arm(self, method: str, path: str, body: dict | None = None, *, call: str) -> dict | None:
        """One ARM request; None for a missing resource (404), typed errors otherwise."""
        return arm_call(
            self._client, method, path, body, api_version=NETWORK_API_VERSION, call=call
        )
