"""Network interfaces for new VMs: an Azure VM cannot be created without a NIC.

azure-mgmt-network is not a dependency, so ``ArmNics`` creates NICs with plain ARM REST calls
(``Microsoft.Network/networkInterfaces``) sent through the compute client's own pipeline
(``ComputeManagementClient.send_request``): same credential, retries and logging, no extra SDK.
Each NIC gets one dynamic private IP in an existing subnet (``subnet_id``); it is created with
``deleteOption: Delete`` on the VM so that deleting the VM deletes it. Anything else (public IPs,
accelerated networking, your own NIC builder) plugs in through the ``NicFactory`` protocol.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Protocol

from provisioners.azure.errors import map_error
from provisioners.base import CloudCallError

NETWORK_API_VERSION = "2023-11-01"


class NicFactory(Protocol):
    """Makes, finds the address of, and deletes the NIC of a node named ``name``."""

    def create(self, *, name: str, location: str, deadline_s: float) -> str:
        """Create the NIC (waiting until ARM has provisioned it) and return its resource id."""
        ...

    def address(self, name: str) -> str | None:
        """The node's private IP address, if known."""
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
        subnet_id: str,
        poll_interval_s: float,
        stop: threading.Event,
    ) -> None:
        self._client, self._subnet_id = client, subnet_id
        self._prefix = (
            f"/subscriptions/{subscription_id}/resourceGroups/{resource_group}"
            "/providers/Microsoft.Network/networkInterfaces/"
        )
        self._poll_interval_s, self._stop = poll_interval_s, stop

    def nic_name(self, name: str) -> str:
        return f"{name}-nic"

    def create(self, *, name: str, location: str, deadline_s: float) -> str:
        body = {
            "location": location,
            "properties": {
                "ipConfigurations": [
                    {
                        "name": "ipconfig1",
                        "properties": {
                            "subnet": {"id": self._subnet_id},
                            "privateIPAllocationMethod": "Dynamic",
                        },
                    }
                ]
            },
        }
        nic = self._call("PUT", name, body)
        # NIC creation is a long-running operation too; a VM may reference it only once done.
        while (nic or {}).get("properties", {}).get("provisioningState") not in ("Succeeded", None):
            if time.monotonic() >= deadline_s:
                raise CloudCallError(
                    f"NIC {self.nic_name(name)} not provisioned in time",
                    cloud="azure",
                    call="networkInterfaces PUT",
                    fix="retry; check the subnet and the resource group's activity log",
                )
            self._stop.wait(self._poll_interval_s)
            nic = self._call("GET", name)
        return self._prefix + self.nic_name(name)

    def address(self, name: str) -> str | None:
        nic = self._call("GET", name) or {}
        configs = nic.get("properties", {}).get("ipConfigurations") or [{}]
        return configs[0].get("properties", {}).get("privateIPAddress")

    def delete(self, name: str) -> None:
        self._call("DELETE", name)

    def _call(self, method: str, name: str, body: dict | None = None) -> dict | None:
        """One ARM request; None for a missing NIC (404), typed errors otherwise."""
        from azure.core.exceptions import AzureError
        from azure.core.rest import HttpRequest

        url = f"{self._prefix}{self.nic_name(name)}?api-version={NETWORK_API_VERSION}"
        call = f"networkInterfaces {method}"
        try:
            response = self._client.send_request(HttpRequest(method, url, json=body))
            if response.status_code == 404:
                return None
            response.raise_for_status()
            return response.json() if response.content else None
        except AzureError as error:
            raise map_error(error, call=call, where=self.nic_name(name)) from error
