"""GPU offers: VMs with GPUs, where, at what on-demand and spot price (a market snapshot).

One CSV format serves the offline price snapshot (configs/prices/offers.csv), the local simulated
market (configs/local/offers.csv) and any market file a user passes. A GPU name in a file may be an
alias; offers carry the canonical name.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.catalog.gpus import GpuTable
from orchestrator.catalog.locations import Location, Regions
from orchestrator.catalog.records import Row, read_csv_rows

OFFER_COLUMNS = (
    "cloud",
    "region",
    "zone",
    "instance_type",
    "gpu",
    "gpus_per_node",
    "vcpus",
    "memory_gib",
    "on_demand_usd_per_hour",
    "spot_usd_per_hour",
    "available_count",
    "preemption_rate_per_hour",
    "source",
    "as_of",
)
PRICINGS = ("spot", "on_demand", "any")
MAX_AVAILABLE_VMS = 100_000  # VMs one offer can give now: beyond any zone's real capacity
MAX_GPUS_PER_NODE = 64


@dataclass(frozen=True, kw_only=True)
class Offer:
    """A VM type with GPUs in one location. Prices are for the whole VM."""

    location: Location
    instance_type: str
    gpu: str
    gpus_per_node: int
    vcpus: float
    memory_gib: float
    on_demand_usd_per_hour: float
    spot_usd_per_hour: float | None
    available_count: int | None  # VMs the location can give now; None when unknown
    preemption_rate_per_hour: float | None  # expected preemptions per VM-hour; None when unknown
    source: str
    as_of: str

    def price_usd_per_hour(self, *, spot: bool) -> float | None:
        return self.spot_usd_per_hour if spot else self.on_demand_usd_per_hour

    def to_json(self) -> dict:
        gpus = self.gpus_per_node
        return {
            "infra": str(self.location),
            "cloud": self.location.cloud,
            "region": self.location.region,
            "zone": self.location.zone,
            "instance_type": self.instance_type,
            "gpu": self.gpu,
            "gpus_per_node": gpus,
            "vcpus": self.vcpus,
            "memory_gib": self.memory_gib,
            "on_demand_usd_per_hour": self.on_demand_usd_per_hour,
            "spot_usd_per_hour": self.spot_usd_per_hour,
            "on_demand_usd_per_gpu_hour": round(self.on_demand_usd_per_hour / gpus, 5),
            "spot_usd_per_gpu_hour": None
            if self.spot_usd_per_hour is None
            else round(self.spot_usd_per_hour / gpus, 5),
            "available_count": self.available_count,
            "preemption_rate_per_hour": self.preemption_rate_per_hour,
            "source": self.source,
            "as_of": self.as_of,
        }


class OfferTable:
    """A set of offers with a filter."""

    def __init__(self, offers: Iterable[Offer], file: str) -> None:
        self.offers = tuple(offers)
        self.file = file

    def __len__(self) -> int:
        return len(self.offers)

    def locations(self) -> frozenset[Location]:
        return frozenset(o.location for o in self.offers)

    def query(
        self,
        *,
        gpus: Sequence[str] = (),
        within: Sequence[Location] = (),
        exclude: Sequence[Location] = (),
        pricing: str = "any",
    ) -> list[Offer]:
        """Offers of the given canonical GPU names (all if empty), inside any of ``within`` (all if
        empty), outside every ``exclude``, with a spot price when ``pricing`` is ``spot``."""
        assert pricing in PRICINGS, pricing
        wanted = set(gpus)
        return [
            offer
            for offer in self.offers
            if (not wanted or offer.gpu in wanted)
            and (not within or any(loc.covers(offer.location) for loc in within))
            and not any(loc.covers(offer.location) for loc in exclude)
            and (pricing != "spot" or offer.spot_usd_per_hour is not None)
        ]

    @classmethod
    def load(cls, path: Path, display: str, regions: Regions, gpus: GpuTable) -> OfferTable:
        return cls(
            (
                _read_offer(row, regions, gpus)
                for row in read_csv_rows(path, display, OFFER_COLUMNS)
            ),
            display,
        )


def _read_offer(row: Row, regions: Regions, gpus: GpuTable) -> Offer:
    cloud = row.text("cloud").lower()
    region = row.text("region")
    zone = row.text("zone", required=False)
    row.label = "/".join(p for p in (cloud, region, zone) if p)
    if cloud not in regions.clouds():
        row.fail("cloud", f"unknown cloud '{cloud}'", f"use one of: {', '.join(regions.clouds())}")
    if not regions.has_region(cloud, region):
        row.fail(
            "region",
            f"'{region}' is not a region of {cloud} in configs/regions.yaml",
            "add the region there or correct the name",
        )
    # GCP, AWS and the local cloud name zones after their region; Azure numbers them.
    if zone is not None and cloud != "azure" and not zone.startswith(region):
        row.fail(
            "zone",
            f"zone '{zone}' is not in region '{region}'",
            "a zone's name starts with its region's",
        )
    gpu_name = row.text("gpu")
    spec = gpus.find(gpu_name)
    if spec is None:
        hint = gpus.suggest(gpu_name)
        row.fail(
            "gpu",
            f"unknown GPU '{gpu_name}'" + (f" (did you mean '{hint}'?)" if hint else ""),
            "use a GPU name or alias of configs/gpus.yaml, or add the GPU there",
        )
    on_demand = row.number("on_demand_usd_per_hour")
    spot = row.number("spot_usd_per_hour", required=False)
    if spot is not None and spot > on_demand:
        row.fail(
            "spot_usd_per_hour",
            f"spot price {spot} is above the on-demand price {on_demand}",
            "check both prices",
        )
    available = row.number(
        "available_count",
        required=False,
        integer=True,
        strictly_positive=False,
        most=MAX_AVAILABLE_VMS,
    )
    return Offer(
        location=Location(cloud, region, zone),
        instance_type=row.text("instance_type"),
        gpu=spec.name,
        gpus_per_node=int(row.number("gpus_per_node", integer=True, most=MAX_GPUS_PER_NODE)),
        vcpus=row.number("vcpus"),
        memory_gib=row.number("memory_gib"),
        on_demand_usd_per_hour=on_demand,
        spot_usd_per_hour=spot,
        available_count=None if available is None else int(available),
        preemption_rate_per_hour=row.number(
            "preemption_rate_per_hour", required=False, strictly_positive=False
        ),
        source=row.text("source"),
        as_of=row.date_or_time("as_of"),
    )
