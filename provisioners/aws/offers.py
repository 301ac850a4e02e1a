"""The AWS GPU market of one region: which GPU instance types each zone offers, their spot price now,
their on-demand price, and how likely a spot request is to be filled (spot placement scores).

Sources, one per field: ``describe_instance_types`` (GPU model, count and memory, vCPUs, memory),
``describe_instance_type_offerings`` (zones), ``describe_spot_price_history`` (spot $/h and when it
was observed), the Pricing API's ``get_products`` (on-demand $/h) and ``get_spot_placement_scores``
(score 1-10, reported as 0.1-1.0). AWS tells neither how many nodes it could give nor a preemption
rate, so those stay ``None``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from provisioners.aws.sdk import call, pages
from provisioners.base import ProvisionerError

log = logging.getLogger(__name__)

MIB_PER_GIB = 1024
# AWS reports GPU memory a little under the marketing size (an "80 GB" A100 shows 81920 MiB, an
# A10G 22888 MiB), so variants are told apart by a threshold rather than an exact size.
_LARGE_MEMORY_VARIANTS = {
    "A100": (70 * MIB_PER_GIB, "A100-80GB"),
    "V100": (30 * MIB_PER_GIB, "V100-32GB"),
}
_CHUNK = 100  # describe_instance_types and spot price history take at most 100 types per call
SPOT_PRODUCT = "Linux/UNIX"


@dataclass(frozen=True)
class GpuInstanceType:
    """What ``describe_instance_types`` says about one GPU instance type."""

    instance_type: str
    gpu: str  # SkyPilot's accelerator name
    gpus_per_node: int
    vcpus: float
    memory_gib: float


@dataclass(frozen=True)
class SpotPrice:
    usd_per_hour: float
    observed_at_s: float


def skypilot_gpu_name(aws_name: str, memory_mib: int) -> str:
    """SkyPilot's accelerator name for an AWS GPU name and per-GPU memory (A100 80 GB -> A100-80GB)."""
    variant = _LARGE_MEMORY_VARIANTS.get(aws_name)
    if variant is not None and memory_mib >= variant[0]:
        return variant[1]
    # the other AWS names (T4, T4g, A10G, L4, L40S, H100, H200, ...) are SkyPilot's names already
    return aws_name


def parse_instance_type(info: dict[str, Any]) -> GpuInstanceType | None:
    """The GPU facts of one ``describe_instance_types`` entry; None if it has no NVIDIA GPU (the
    runtime needs CUDA, so AMD and Inferentia/Trainium types are not offers here)."""
    gpus = [g for g in info.get("GpuInfo", {}).get("Gpus", []) if g.get("Manufacturer") == "NVIDIA"]
    if not gpus:
        return None
    first = gpus[0]
    return GpuInstanceType(
        instance_type=info["InstanceType"],
        gpu=skypilot_gpu_name(first["Name"], int(first.get("MemoryInfo", {}).get("SizeInMiB", 0))),
        gpus_per_node=sum(int(g.get("Count", 0)) for g in gpus),
        vcpus=float(info["VCpuInfo"]["DefaultVCpus"]),
        memory_gib=info["MemoryInfo"]["SizeInMiB"] / MIB_PER_GIB,
    )


def _chunks(items: Sequence[str]) -> Iterable[list[str]]:
    for start in range(0, len(items), _CHUNK):
        yield list(items[start : start + _CHUNK])


def gpu_instance_types(ec2: Any, only: Sequence[str] | None) -> dict[str, GpuInstanceType]:
    """GPU instance types of the client's region: all of them, or just ``only``."""
    if only:
        infos = [
            i
            for chunk in _chunks(only)
            for i in pages(ec2, "describe_instance_types", "InstanceTypes", InstanceTypes=chunk)
        ]
    else:
        # no server-side GPU filter exists on every endpoint, so list all and keep the GPU ones
        infos = list(pages(ec2, "describe_instance_types", "InstanceTypes"))
    parsed = (parse_instance_type(info) for info in infos)
    return {t.instance_type: t for t in parsed if t is not None}


def zones_by_type(ec2: Any, types: Iterable[str]) -> dict[str, list[str]]:
    """Zone names where each of ``types`` is offered."""
    wanted = set(types)
    zones: dict[str, list[str]] = {}
    for offering in pages(
        ec2,
        "describe_instance_type_offerings",
        "InstanceTypeOfferings",
        LocationType="availability-zone",
    ):
        if offering["InstanceType"] in wanted:
            zones.setdefault(offering["InstanceType"], []).append(offering["Location"])
    return {t: sorted(z) for t, z in zones.items()}


def _epoch_s(value: datetime | str) -> float:
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return value.timestamp()


def spot_prices(
    ec2: Any, types: Sequence[str], *, now_s: float
) -> dict[tuple[str, str], SpotPrice]:
    """The latest Linux spot price per (zone, instance type). With StartTime=now AWS returns the
    price in effect now for every zone, so this is one short page per 100 types."""
    latest: dict[tuple[str, str], SpotPrice] = {}
    start = datetime.fromtimestamp(now_s, tz=timezone.utc)
    for chunk in _chunks(sorted(types)):
        history = pages(
            ec2,
            "describe_spot_price_history",
            "SpotPriceHistory",
            InstanceTypes=chunk,
            ProductDescriptions=[SPOT_PRODUCT],
            StartTime=start,
        )
        for entry in history:
            key = (entry["AvailabilityZone"], entry["InstanceType"])
            price = SpotPrice(float(entry["SpotPrice"]), _epoch_s(entry["Timestamp"]))
            if key not in latest or price.observed_at_s > latest[key].observed_at_s:
                latest[key] = price
    return latest


def placement_scores(ec2: Any, region: str, types: Sequence[str]) -> dict[tuple[str, str], float]:
    """Spot placement score / 10 per (zone, instance type), asking one type at a time (AWS scores
    a set of types as one flexible fleet). If AWS refuses (permissions, its limit on distinct
    requests per day, an endpoint without the call), the scores so far are kept, the rest stay
    unknown, and one line is logged."""
    scores: dict[tuple[str, str], float] = {}
    try:
        zones = call(ec2, "describe_availability_zones")["AvailabilityZones"]
        zone_names = {z["ZoneId"]: z["ZoneName"] for z in zones}
        for instance_type in types:
            answer = pages(
                ec2,
                "get_spot_placement_scores",
                "SpotPlacementScores",
                InstanceTypes=[instance_type],
                TargetCapacity=1,
                SingleAvailabilityZone=True,
                RegionNames=[region],
            )
            for score in answer:
                zone = zone_names.get(score.get("AvailabilityZoneId", ""))
                if zone is not None:
                    scores[(zone, instance_type)] = int(score["Score"]) / 10
    except ProvisionerError as error:
        log.warning(
            "aws: no spot placement scores in %s (%s); availability_score stays unknown",
            region,
            error.message,
        )
    return scores


def on_demand_price(pricing: Any, region: str, instance_type: str) -> float | None:
    """The Linux, shared-tenancy on-demand $/h of ``instance_type`` in ``region`` (Pricing API)."""
    filters = {
        "instanceType": instance_type,
        "regionCode": region,
        "operatingSystem": "Linux",
        "tenancy": "Shared",
        "preInstalledSw": "NA",
        "capacitystatus": "Used",
    }
    products = pages(
        pricing,
        "get_products",
        "PriceList",
        ServiceCode="AmazonEC2",
        Filters=[{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in filters.items()],
    )
    for product in products:
        price = _usd_per_hour(json.loads(product) if isinstance(product, str) else product)
        if price is not None:
            return price
    return None


def _usd_per_hour(product: dict[str, Any]) -> float | None:
    """The first positive hourly USD price in a price-list product's on-demand terms."""
    for term in product.get("terms", {}).get("OnDemand", {}).values():
        for dimension in term.get("priceDimensions", {}).values():
            usd = float(dimension.get("pricePerUnit", {}).get("USD", 0) or 0)
            if usd > 0 and dimension.get("unit", "Hrs") in ("Hrs", "Hours"):
                return usd
    return None
