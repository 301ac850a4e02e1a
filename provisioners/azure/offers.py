"""Azure resource SKUs -> GPU VM sizes per location and zone, honoring the subscription's
restrictions.

``resource_skus.list`` returns, per VM size and location, its capabilities (``GPUs``, ``vCPUs``,
``MemoryGB``), the zones it exists in (``locationInfo[].zones``) and ``restrictions``: a restriction
of type ``Location`` means the size cannot be deployed in that location for this subscription, one
of type ``Zone`` removes only the zones it lists. Both reason codes (``NotAvailableForSubscription``
and ``QuotaId``) mean "you cannot deploy it here", so both exclude.

Azure numbers zones ``1``..``3``; configs/regions.yaml names them so (``azure/eastus/1``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from provisioners.base import Offer

log = logging.getLogger(__name__)

# VM size (without "Standard_") -> SkyPilot's accelerator name; first match wins, so the more
# specific patterns come first. Fractional-GPU sizes (NVads A10 v5 below 36 vCPUs share one GPU)
# are left out: they cannot run a training worker's full GPU.
GPU_BY_SIZE: tuple[tuple[str, str], ...] = (
    (r"ND\d+is?r_H200_v5", "H200"),
    (r"N[CD]\d+\w*_H100_v5", "H100"),
    (r"ND\d+am?sr_A100_v4", "A100-80GB"),
    (r"NC\d+ads_A100_v4", "A100-80GB"),
    (r"ND\d+asr_v4", "A100"),
    (r"NC\d+as_T4_v3", "T4"),
    (r"ND\d+rs_v2", "V100-32GB"),
    (r"NC\d+r?s_v3", "V100"),
    (r"NC\d+r?s_v2", "P100"),
    (r"NV(36|72)adm?s_A10_v5", "A10"),
)


def gpu_of(size: str) -> str | None:
    """The accelerator name of a VM size (``Standard_NC24ads_A100_v4`` -> ``A100-80GB``)."""
    short = size.removeprefix("Standard_")
    for pattern, gpu in GPU_BY_SIZE:
        if re.fullmatch(pattern, short, flags=re.IGNORECASE):
            return gpu
    return None


@dataclass(frozen=True)
class GpuSize:
    """One GPU VM size where this subscription may deploy it; ``zones`` empty = regional only."""

    name: str
    location: str
    gpu: str
    gpus_per_node: int
    vcpus: float
    memory_gib: float
    zones: tuple[str, ...]


def _get(obj: Any, key: str, default: Any = None) -> Any:
    """A field by its REST name: the SDK's models are mappings of the JSON they came from (and a
    restriction's ``values`` clashes with ``Mapping.values``, so attributes would not do)."""
    return default if obj is None else obj.get(key, default)


def _capabilities(sku: Any) -> dict[str, str]:
    return {_get(c, "name"): _get(c, "value") for c in _get(sku, "capabilities") or []}


def _same(a: str, b: str) -> bool:
    return a.lower() == b.lower()


def _usable_zones(sku: Any, location: str) -> tuple[str, ...] | None:
    """Zones of ``sku`` in ``location`` left after its restrictions; None if the location is out."""
    zones: set[str] = set()
    for info in _get(sku, "locationInfo") or []:
        if _same(_get(info, "location") or "", location):
            zones |= set(_get(info, "zones") or [])
    for restriction in _get(sku, "restrictions") or []:
        kind = _get(restriction, "type") or ""
        info = _get(restriction, "restrictionInfo")
        places = list(_get(restriction, "values") or []) + list(_get(info, "locations") or [])
        if not any(_same(p, location) for p in places):
            continue
        if _same(kind, "Location"):
            return None
        if _same(kind, "Zone"):
            restricted = set(_get(info, "zones") or [])
            if not zones - restricted:
                return None  # restricted in every zone it has: treat the location as out
            zones -= restricted
    return tuple(sorted(zones))


def gpu_sizes(skus: Iterable[Any]) -> list[GpuSize]:
    """The GPU VM sizes among ``skus`` (one per location they are listed in), restrictions applied."""
    found = []
    for sku in skus:
        if _get(sku, "resourceType") != "virtualMachines":
            continue
        name, caps = _get(sku, "name") or "", _capabilities(sku)
        gpu, gpus = gpu_of(name), int(float(caps.get("GPUs") or 0))
        if gpu is None or gpus < 1:
            continue
        for location in _get(sku, "locations") or []:
            zones = _usable_zones(sku, location)
            if zones is None:
                continue
            found.append(
                GpuSize(
                    name=name,
                    location=location.lower(),
                    gpu=gpu,
                    gpus_per_node=gpus,
                    vcpus=float(caps.get("vCPUs") or 0),
                    memory_gib=float(caps.get("MemoryGB") or 0),  # Azure's "GB" here are GiB
                    zones=zones,
                )
            )
    return found


def offers_of(size: GpuSize, price: Any, observed_s: float, *, source: str) -> list[Offer]:
    """The size's offers, one per zone it may be deployed in (``price``: a ``SizePrice`` from
    prices.py, None where the Retail Prices API has none: no offer then, it cannot be planned)."""
    if price is None:
        log.debug("azure: no retail price for %s in %s; skipped", size.name, size.location)
        return []
    return [
        Offer(
            cloud="azure",
            region=size.location,
            zone=zone,
            instance_type=size.name,
            gpu=size.gpu,
            gpus_per_node=size.gpus_per_node,
            vcpus=size.vcpus,
            memory_gib=size.memory_gib,
            on_demand_usd_per_hour=price.on_demand_usd_per_hour,
            spot_usd_per_hour=price.spot_usd_per_hour,
            observed_at_s=observed_s,
            source=f"azure resource_skus.list + {source}",
        )
        for zone in (size.zones or (None,))
    ]
