"""A job's firewall on Azure: its network security group in each location it uses.

The group is ``<firewall name>-<location>`` (``Microsoft.Network/networkSecurityGroups``, plain ARM
REST through the compute client: azure-mgmt-network is not a dependency), tagged ``geo-job``, with
one inbound rule allowing the overlay's UDP port from the firewall's sources; Azure's default rules
deny every other inbound packet from the internet and keep replies. A node's NIC goes behind it
(network.py); ``open_overlay`` rewrites the rule in every location the job used, and
``drop`` deletes the groups once no NIC uses them.
"""

from __future__ import annotations

from typing import Any

from provisioners.azure.arm import NETWORK_API_VERSION, arm_call
from provisioners.base import Firewall, ProvisionerError

OVERLAY_RULE_PRIORITY = 100  # ours first; Azure's defaults sit at 65000 and above


class SecurityGroups:
    """The jobs' network security groups in one resource group."""

    def __init__(self, client: Any, *, subscription_id: str, resource_group: str) -> None:
        self._client = client
        self._base = (
            f"/subscriptions/{subscription_id}/resourceGroups/{resource_group}"
            "/providers/Microsoft.Network/networkSecurityGroups"
        )
        self._made: dict[tuple[str, str], str] = {}  # (firewall name, location) -> its id

    def ensure(self, firewall: Firewall, location: str) -> str:
        """The job's NSG in ``location``, its one rule as ``firewall`` says (PUT: made or set)."""
        path = f"{self._base}/{firewall.name}-{location}"
        rule = {
            "name": "overlay",
            "properties": {
                "description": f"geo-orchestrator job {firewall.job}: WireGuard only",
                "protocol": "Udp",
                "sourcePortRange": "*",
                "destinationPortRange": str(firewall.port),
                # none yet: a rule must name a source; loopback admits nobody from outside
                "sourceAddressPrefixes": list(firewall.cidrs()) or ["127.0.0.1/32"],
                "destinationAddressPrefix": "*",
                "access": "Allow",
                "priority": OVERLAY_RULE_PRIORITY,
                "direction": "Inbound",
            },
        }
        body = {
            "location": location,
            "tags": {"geo-job": firewall.job},
            "properties": {"securityRules": [rule]},
        }
        self._arm("PUT", path, body, call="networkSecurityGroups PUT")
        self._made[(firewall.name, location)] = path
        return path

    def open_overlay(self, firewall: Firewall) -> None:
        """Make the job's groups, in every location it used, admit exactly ``firewall.sources``."""
        for name, location in list(self._made):
            if name == firewall.name:
                self.ensure(firewall, location)

    def drop(self, job: str) -> tuple[list[str], list[str]]:
        """Delete the job's security groups (found by their ``geo-job`` tag); (deleted, still on
        NICs of VMs that are going)."""
        listed = self._arm("GET", self._base, call="networkSecurityGroups GET") or {}
        dropped, in_use = [], []
        for group in listed.get("value", []):
            if (group.get("tags") or {}).get("geo-job") != job:
                continue
            try:
                self._arm(
                    "DELETE", f"{self._base}/{group['name']}", call="networkSecurityGroups DELETE"
                )
                dropped.append(group["name"])
            except ProvisionerError as error:
                if "inuse" not in error.message.lower().replace(" ", ""):
                    raise
                in_use.append(group["name"])
        return dropped, in_use

    def _arm(self, method: str, path: str, body: dict | None = None, *, call: str) -> dict | None:
        return arm_call(
            self._client, method, path, body, api_version=NETWORK_API_VERSION, call=call
        )
