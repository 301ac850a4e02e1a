"""The instance we ask GCP for: names, labels, scheduling (spot), GPUs and boot disk.

Kept apart from the provisioner so that the body of ``instances.insert`` is easy to read and to
check: a spot node is ``provisioningModel=SPOT`` with a termination action and no automatic
restart; every GPU node has ``onHostMaintenance=TERMINATE`` (GPU VMs cannot live-migrate); a node
with a boot script carries it as the ``startup-script`` metadata item.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from provisioners.bootstrap.script import gcp_metadata
from provisioners.gcp.catalog import ACCELERATOR_BY_GPU

# label keys with "_" rather than "-": a list filter names them (labels.geo_orchestrator="true")
GANG_LABEL = "geo_gang"
MANAGED_LABEL = "geo_orchestrator"
_LABEL_MAX = 63  # GCP: keys and values at most 63 characters of [a-z0-9_-]


@dataclass(frozen=True, kw_only=True)
class InstanceSpec:
    """Everything needed to build one instance, besides the SDK's types."""

    name: str
    zone: str
    machine_type: str
    gpu: str
    attached_gpus: int  # guestAccelerators to add (0 for accelerator-optimized types)
    spot: bool
    labels: tuple[tuple[str, str], ...]
    # the node's boot script (its join token: a secret; repr hides it), run by the image's
    # google-guest-agent at boot; None boots the image as it is
    startup_script: str | None = field(default=None, repr=False)
    network_tags: tuple[str, ...] = ()  # the job's firewall rule targets its VMs by tag
    service_account: str = "default"  # what the VM acts as: the project's compute default


@dataclass(frozen=True, kw_only=True)
class VmOptions:
    """How our instances look apart from type and place (from the provisioner's options)."""

    image: str
    disk_size_gb: int
    network: str
    external_ip: bool
    spot_termination_action: str  # DELETE or STOP
    service_account_scopes: tuple[str, ...]


def _label_text(text: str) -> str:
    """``text`` under GCP's label rules: lowercase letters, digits, ``_`` and ``-``, <= 63 chars."""
    return re.sub(r"[^a-z0-9_-]", "-", text.lower())[:_LABEL_MAX]


def sanitize_labels(pairs: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """Labels GCP accepts (a key must also start with a letter), sorted, last value per key."""
    labels: dict[str, str] = {}
    for key, value in pairs:
        clean = _label_text(key)
        if not clean[:1].isalpha():
            clean = ("k" + clean)[:_LABEL_MAX]
        labels[clean] = _label_text(value)
    return tuple(sorted(labels.items()))


def instance_name(gang: str, index: int) -> str:
    """A fresh instance name (RFC 1035: starts with a letter, <= 63 chars) derived from the gang.

    A random suffix keeps names unique when a gang is launched again after a failure."""
    stem = re.sub(r"[^a-z0-9-]", "-", gang.lower()).strip("-")[:40] or "node"
    if not stem[0].isalpha():
        stem = "g-" + stem
    return f"{stem}-{index}-{secrets.token_hex(3)}"


def build_instance(compute: Any, spec: InstanceSpec, options: VmOptions) -> Any:
    """The ``compute_v1.Instance`` for ``spec`` (``compute`` is the imported ``compute_v1``)."""
    scheduling = compute.Scheduling(on_host_maintenance="TERMINATE")
    if spec.spot:
        scheduling.provisioning_model = "SPOT"
        scheduling.instance_termination_action = options.spot_termination_action
        scheduling.automatic_restart = False  # GCP refuses SPOT with automatic restart
    else:
        scheduling.provisioning_model = "STANDARD"
        scheduling.automatic_restart = True
    interface = compute.NetworkInterface(network=options.network)
    if options.external_ip:
        interface.access_configs = [
            compute.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")
        ]
    instance = compute.Instance(
        name=spec.name,
        machine_type=f"zones/{spec.zone}/machineTypes/{spec.machine_type}",
        scheduling=scheduling,
        labels=dict(spec.labels),
        disks=[
            compute.AttachedDisk(
                boot=True,
                auto_delete=True,
                initialize_params=compute.AttachedDiskInitializeParams(
                    source_image=options.image, disk_size_gb=options.disk_size_gb
                ),
            )
        ],
        network_interfaces=[interface],
        metadata=compute.Metadata(items=_metadata_items(compute, spec)),
        service_accounts=[
            compute.ServiceAccount(
                email=spec.service_account, scopes=list(options.service_account_scopes)
            )
        ],
    )
    if spec.network_tags:
        instance.tags = compute.Tags(items=list(spec.network_tags))
    if spec.attached_gpus:
        instance.guest_accelerators = [
            compute.AcceleratorConfig(
                accelerator_type=(
                    f"zones/{spec.zone}/acceleratorTypes/{ACCELERATOR_BY_GPU[spec.gpu]}"
                ),
                accelerator_count=spec.attached_gpus,
            )
        ]
    return instance


def _metadata_items(compute: Any, spec: InstanceSpec) -> list[Any]:
    # Deep Learning VM images install the NVIDIA driver on first boot when asked
    items = [compute.Items(key="install-nvidia-driver", value="True")] if spec.gpu else []
    if spec.startup_script is not None:
        (item,) = gcp_metadata(spec.startup_script)["items"]  # raises ScriptTooLarge
        items.append(compute.Items(key=item["key"], value=item["value"]))
    return items


def address_of(instance: Any) -> str | None:
    """The instance's external IP if it has one, else its internal IP."""
    for interface in instance.network_interfaces:
        for access in interface.access_configs:
            if access.nat_i_p:
                return access.nat_i_p
        if interface.network_i_p:
            return interface.network_i_p
    return None
