"""The VM an Azure node is: its settings, the create body, and how to read its instance view.

A Spot node is created with ``priority: Spot``, an eviction policy (``Delete`` by default: an
evicted node's disk is useless to elastic training and a deallocated VM keeps using Spot quota),
and ``billingProfile.maxPrice`` -1 (pay up to the pay-as-you-go price, so it is evicted only for
capacity, never for price). Its NIC and OS disk are deleted with it.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from provisioners.base import LabelledVm, NodeState

GANG_TAG = "geo-orchestrator-gang"
EVICTION_POLICIES = ("Delete", "Deallocate")
# instance-view power states that, on a Spot VM we did not stop, mean Azure evicted it
EVICTED_POWER_STATES = frozenset({"deallocated", "deallocating", "stopped", "stopping"})


@dataclass(frozen=True, kw_only=True)
class VmSettings:
    """Image, login and Spot settings of every node this provisioner creates."""

    image_publisher: str = "microsoft-dsvm"
    image_offer: str = "ubuntu-hpc"
    image_sku: str = "2204"
    image_version: str = "latest"
    admin_username: str = "azureuser"
    # a public key (not a secret); Azure requires one for a Linux VM without a password. None: a
    # throwaway key made per provisioner whose private half is never kept: nobody logs in to a
    # node, which joins its job by the bootstrap (docs/bootstrap.md)
    ssh_public_key: str | None = None
    os_disk_size_gib: int = 256
    eviction_policy: str = "Delete"
    spot_max_price_usd_per_hour: float = -1.0  # -1: up to the pay-as-you-go price

    def __post_init__(self) -> None:
        if self.eviction_policy not in EVICTION_POLICIES:
            raise ValueError(
                f"eviction_policy is {self.eviction_policy!r}; write one of {EVICTION_POLICIES}"
            )
        if self.spot_max_price_usd_per_hour != -1 and self.spot_max_price_usd_per_hour <= 0:
            raise ValueError("spot_max_price_usd_per_hour is -1 (no cap) or a positive price")


def vm_body(
    settings: VmSettings,
    *,
    name: str,
    location: str,
    zone: str | None,
    size: str,
    spot: bool,
    nic_id: str,
    tags: Mapping[str, str],
    custom_data: str | None = None,
    identity: str | None = None,
) -> dict[str, Any]:
    """The ``virtualMachines`` PUT body (REST shape) for one node; ``custom_data`` (base64) is
    its boot script, which cloud-init runs at first boot; ``identity``: the resource id of the
    user-assigned managed identity it acts as."""
    properties: dict[str, Any] = {
        "hardwareProfile": {"vmSize": size},
        "storageProfile": {
            "imageReference": {
                "publisher": settings.image_publisher,
                "offer": settings.image_offer,
                "sku": settings.image_sku,
                "version": settings.image_version,
            },
            "osDisk": {
                "createOption": "FromImage",
                "deleteOption": "Delete",
                "diskSizeGB": settings.os_disk_size_gib,
                "managedDisk": {"storageAccountType": "Premium_LRS"},
            },
        },
        "osProfile": _os_profile(settings, name, custom_data),
        "networkProfile": {
            "networkInterfaces": [{"id": nic_id, "properties": {"deleteOption": "Delete"}}]
        },
    }
    if spot:
        properties |= {
            "priority": "Spot",
            "evictionPolicy": settings.eviction_policy,
            "billingProfile": {"maxPrice": settings.spot_max_price_usd_per_hour},
        }
    body: dict[str, Any] = {"location": location, "tags": dict(tags), "properties": properties}
    if zone:
        body["zones"] = [zone]
    if identity:
        body["identity"] = {"type": "UserAssigned", "userAssignedIdentities": {identity: {}}}
    return body


def throwaway_public_key() -> str:
    """An RSA 3072 public key in OpenSSH form whose private half is dropped at once (RSA: the
    key type every Azure region accepts)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=3072)
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    return public.decode("ascii") + " geo-orchestrator-no-login"


def _os_profile(settings: VmSettings, name: str, custom_data: str | None) -> dict[str, Any]:
    assert settings.ssh_public_key, "the provisioner sets a key"
    key_path = f"/home/{settings.admin_username}/.ssh/authorized_keys"
    extra = {} if custom_data is None else {"customData": custom_data}
    return {
        **extra,
        "computerName": name[:64],
        "adminUsername": settings.admin_username,
        "linuxConfiguration": {
            "disablePasswordAuthentication": True,
            "ssh": {"publicKeys": [{"path": key_path, "keyData": settings.ssh_public_key}]},
        },
    }


@dataclass(frozen=True)
class VmStatus:
    """What an instance view says: ``ProvisioningState/<x>`` and ``PowerState/<y>``, lowercased."""

    provisioning: str | None
    power: str | None
    codes: tuple[str, ...]
    message: str = ""

    @property
    def running(self) -> bool:
        return self.provisioning == "succeeded" and self.power == "running"

    @property
    def failed(self) -> bool:
        return (self.provisioning or "").startswith("failed")

    @property
    def evicted(self) -> bool:
        """Looks evicted: stopped without our asking, or a status naming eviction/preemption."""
        named = any("evict" in c or "preempt" in c for c in self.codes)
        return named or self.power in EVICTED_POWER_STATES


def read_status(statuses: Sequence[Any] | None) -> VmStatus:
    """Parse an instance view's ``statuses`` (SDK models or dicts, both mappings)."""
    provisioning = power = None
    codes, message = [], ""
    for status in statuses or []:
        code = str(status.get("code") or "").lower()
        codes.append(code)
        kind, _, value = code.partition("/")
        if kind == "provisioningstate":
            provisioning = value  # "succeeded", "creating", "failed/zonalallocationfailed", ...
            message = str(status.get("message") or "")
        elif kind == "powerstate":
            power = value
    return VmStatus(provisioning, power, tuple(codes), message)


def vm_name(gang: str, index: int) -> str:
    """A VM name Azure accepts (letters, digits, hyphens; <= 64), unique across relaunches."""
    base = re.sub(r"[^a-z0-9-]+", "-", gang.lower()).strip("-")[:40] or "gang"
    return f"{base}-{uuid.uuid4().hex[:6]}-{index}"


def loss_reason(spot: bool, eviction_policy: str, status: VmStatus | None) -> str | None:
    """Why a running node is gone (``preempted`` or ``failed``), or None if it still runs."""
    if status is None:  # vanished: eviction policy Delete removes an evicted Spot VM
        return "preempted" if spot and eviction_policy == "Delete" else "failed"
    if status.evicted:
        return "preempted" if spot else "failed"
    if status.failed:
        return "failed"
    return None


def tags_of(gang: str, labels: Mapping[str, str] | Sequence[tuple[str, str]]) -> dict[str, str]:
    """A node's tags: its gang's, then its labels."""
    return {GANG_TAG: gang, **dict(labels)}


def has_tag(vm: Any, key: str, locations: Sequence[str] | None) -> bool:
    """Whether a listed VM (an SDK model) carries tag ``key`` in one of ``locations`` (None:
    anywhere)."""
    location = (vm.location or "").lower()
    return key in (vm.tags or {}) and not (locations and location not in locations)


def labelled_vm(vm: Any) -> LabelledVm:
    """A listed VM (an SDK model) as the contract's ``LabelledVm``."""
    location, zone = (vm.location or "").lower(), (vm.zones or [""])[0]
    return LabelledVm(
        node_id=vm.name,
        infra="/".join(p for p in ("azure", location, zone) if p),
        instance_type=vm.hardware_profile.vm_size if vm.hardware_profile else "",
        state=_listed_state(vm),
        labels=dict(vm.tags or {}),
    )


def _listed_state(vm: Any) -> NodeState:
    """A listed VM's state: a stopped or deallocated one (its power state, when the list has
    instance views) is not running, whoever stopped it."""
    view = getattr(vm, "instance_view", None)
    if view is not None and read_status(view.statuses).power in EVICTED_POWER_STATES:
        return NodeState.TERMINATED
    return NodeState.RUNNING if vm.provisioning_state == "Succeeded" else NodeState.PENDING
