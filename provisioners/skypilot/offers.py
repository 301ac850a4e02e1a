"""Offers from SkyPilot's catalog: the per-cloud ``vms.csv`` files (schema v8) it keeps on disk.

Columns used: InstanceType, AcceleratorName, AcceleratorCount, vCPUs, MemoryGiB, Price (on-demand
$/h), SpotPrice ($/h), Region, AvailabilityZone. Rows without an instance type (GCP's attachable
GPUs, priced per GPU on top of a host VM) or without a whole number of GPUs are left out. AWS rows
carry zone *ids* (``use1-az1``) whose names differ per account, so AWS offers are per region, at the
cheapest spot price among its zones.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import replace
from typing import Any

from provisioners.base import Offer

_ZONE_ID = re.compile(r"^[a-z]{2,5}\d+-az\d+$")  # an AWS zone id, not a zone name


def catalog_file(cloud: str) -> str:
    """The catalog file SkyPilot keeps for ``cloud``, relative to its catalog directory."""
    return f"{cloud}/vms.csv"


def number(value: Any) -> float | None:
    """A CSV cell as a float; empty cells and NaN (pandas' empty) are ``None``."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    result = float(value)
    return None if math.isnan(result) else result


def text(value: Any) -> str | None:
    """A CSV cell as a stripped string; empty cells and NaN are ``None``."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    result = str(value).strip()
    return result or None


def records(frame: Any) -> list[Mapping[str, Any]]:
    """Rows of a data frame (SkyPilot's lazy pandas frame, or any object with ``to_dict``)."""
    return list(frame.to_dict(orient="records"))


def _zone(cloud: str, row: Mapping[str, Any]) -> str | None:
    zone = text(row.get("AvailabilityZone"))
    if zone is None or _ZONE_ID.match(zone):
        return None  # unknown, or an id we cannot name without the account's mapping
    return zone


def to_offer(cloud: str, row: Mapping[str, Any], *, observed_at_s: float) -> Offer | None:
    """One catalog row as an offer, or ``None`` if it is not a whole-GPU VM with a price."""
    instance_type, gpu = text(row.get("InstanceType")), text(row.get("AcceleratorName"))
    count, region = number(row.get("AcceleratorCount")), text(row.get("Region"))
    if not (instance_type and gpu and region) or count is None or count < 1 or count % 1:
        return None
    on_demand, spot = number(row.get("Price")), number(row.get("SpotPrice"))
    vcpus, memory = number(row.get("vCPUs")), number(row.get("MemoryGiB"))
    if (on_demand is None and spot is None) or not vcpus or not memory:
        return None
    return Offer(
        cloud=cloud,
        region=region,
        zone=_zone(cloud, row),
        instance_type=instance_type,
        gpu=gpu,
        gpus_per_node=int(count),
        vcpus=vcpus,
        memory_gib=memory,
        on_demand_usd_per_hour=on_demand,
        spot_usd_per_hour=spot,
        observed_at_s=observed_at_s,
        source=f"sky.catalog {catalog_file(cloud)}",
    )


def _cheaper(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


def _merge(offers: Iterable[Offer]) -> list[Offer]:
    """One offer per place and type: rows that collapse to a region keep their cheapest prices."""
    merged: dict[tuple[str, str | None, str], Offer] = {}
    for offer in offers:
        key = (offer.region, offer.zone, offer.instance_type)
        seen = merged.get(key)
        merged[key] = (
            offer
            if seen is None
            else replace(
                seen,
                on_demand_usd_per_hour=_cheaper(
                    seen.on_demand_usd_per_hour, offer.on_demand_usd_per_hour
                ),
                spot_usd_per_hour=_cheaper(seen.spot_usd_per_hour, offer.spot_usd_per_hour),
            )
        )
    return list(merged.values())


def offers_from_rows(
    cloud: str,
    rows: Iterable[Mapping[str, Any]],
    *,
    observed_at_s: float,
    gpus: Collection[str] | None = None,
    regions: Collection[str] | None = None,
) -> list[Offer]:
    """The GPU offers among ``rows``; GPU and region filters ignore case, as SkyPilot's do."""
    wanted_gpus = {g.lower() for g in gpus} if gpus else None
    wanted_regions = {r.lower() for r in regions} if regions else None
    found = []
    for row in rows:
        offer = to_offer(cloud, row, observed_at_s=observed_at_s)
        if offer is None:
            continue
        if wanted_gpus is not None and offer.gpu.lower() not in wanted_gpus:
            continue
        if wanted_regions is not None and offer.region.lower() not in wanted_regions:
            continue
        found.append(offer)
    return _merge(found)
