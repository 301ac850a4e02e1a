"""The live market: poll provisioners for offers and turn them into the catalog's offers.

``poll`` asks each named provider (provisioners/) for its offers now. A cloud without credentials or
without its SDK is skipped with a one-line warning that says what is missing, unless it was the only
one asked for (then its error is the user's to fix). Live offers lacking an on-demand price (AWS
without the Pricing API, GCP without the billing catalog) take it from the offline snapshot for the
same cloud, region and instance type, and say so in their source; those with no on-demand price
anywhere are left out and counted.

``write_snapshot`` writes offers in the configs/ CSV format with ``as_of`` as a UTC time, which
``plan --market FILE`` and ``catalog offers --market FILE`` read back. Prices older than
``STALE_AFTER_S`` are flagged with their age.
"""

from __future__ import annotations

import csv
import datetime as dt
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.catalog import Catalog, Location, Offer
from orchestrator.catalog.offers import OFFER_COLUMNS, OfferTable
from orchestrator.errors import UserError
from provisioners.base import CredentialsMissing, ProvisionerError, SdkMissing
from provisioners.base import Offer as LiveOffer
from provisioners.registry import ADAPTERS, create

STALE_AFTER_S = 6 * 3600.0  # spot prices move within hours; older ones are flagged
CLOUD_PROVIDERS = ("aws", "gcp", "azure")  # what ``--live`` polls besides the local cloud


@dataclass
class LiveMarket:
    table: OfferTable
    warnings: list[str] = field(default_factory=list)
    observed_at_s: dict[int, float] = field(default_factory=dict)  # id(offer) -> Unix time


def poll(catalog: Catalog, providers: Sequence[str], *, strict: bool) -> LiveMarket:
    """Offers of ``providers`` now. ``strict``: a provider that cannot be polled is an error (the
    user asked for it by name) rather than a warning."""
    offers, warnings, observed = [], [], {}
    for name in providers:
        assert name in ADAPTERS, name
        try:
            provisioner = create(name)
            provisioner.check_credentials()
            live = provisioner.offers()
        except (CredentialsMissing, SdkMissing) as error:
            if strict:
                raise UserError(error.message, fix=error.fix, field=f"--provider {name}") from None
            # one line per cloud: what is missing; a missing SDK says how to install it, missing
            # credentials say where ``--provider NAME`` shows the SDK looked
            then = (
                error.fix
                if isinstance(error, SdkMissing)
                else f"details: python -m orchestrator catalog offers --provider {name}"
            )
            warnings.append(f"skipped {name}: {error.message.split('. ')[0]} ({then})")
            continue
        except ProvisionerError as error:
            if strict:
                raise UserError(
                    f"{error.cloud} {error.call}: {error.message}", fix=error.fix
                ) from None
            warnings.append(f"skipped {name}: {error.call} failed: {error.message.split('. ')[0]}")
            continue
        converted, dropped = convert_offers(catalog, live)
        if dropped:
            warnings.append(f"{name}: left out {dropped} offers with no on-demand price anywhere")
        for offer, seen_s in converted:
            offers.append(offer)
            observed[id(offer)] = seen_s
    source = "live: " + ", ".join(providers)
    return LiveMarket(OfferTable(offers, source), warnings, observed)


def convert_offers(
    catalog: Catalog, live: Sequence[LiveOffer]
) -> tuple[list[tuple[Offer, float]], int]:
    """A provisioner's offers in the catalog's terms, each with the Unix time it was observed; and
    how many were left out (a GPU the catalog lacks, or no on-demand price anywhere)."""
    snapshot = {
        (o.location.cloud, o.location.region, o.instance_type): o.on_demand_usd_per_hour
        for o in catalog.offers.offers
    }
    converted, dropped = [], 0
    for o in live:
        spec = catalog.gpus.find(o.gpu)
        on_demand, source = o.on_demand_usd_per_hour, o.source
        if on_demand is None:
            on_demand = snapshot.get((o.cloud, o.region, o.instance_type))
            source += f"; on-demand from {catalog.offers.file}"
        if spec is None or on_demand is None:
            dropped += 1
            continue
        stamp = dt.datetime.fromtimestamp(o.observed_at_s, dt.timezone.utc)
        offer = Offer(
            location=Location(o.cloud, o.region, o.zone),
            instance_type=o.instance_type,
            gpu=spec.name,
            gpus_per_node=o.gpus_per_node,
            vcpus=o.vcpus,
            memory_gib=o.memory_gib,
            on_demand_usd_per_hour=on_demand,
            spot_usd_per_hour=o.spot_usd_per_hour,
            available_count=o.available_count,
            preemption_rate_per_hour=o.preemption_rate_per_hour,
            source=source,
            as_of=stamp.strftime("%Y-%m-%dT%H:%M:%SZ"),
        )
        converted.append((offer, o.observed_at_s))
    return converted, dropped


def age_s(offer: Offer, *, now_s: float | None = None) -> float:
    """Seconds since the offer's ``as_of`` (a date counts from its midnight UTC)."""
    text = offer.as_of
    if "T" in text:
        stamp = dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)
    else:
        stamp = dt.datetime.combine(dt.date.fromisoformat(text), dt.time(), dt.timezone.utc)
    return max(0.0, (now_s if now_s is not None else time.time()) - stamp.timestamp())


def describe_age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


def write_snapshot(offers: Sequence[Offer], path: Path) -> None:
    """Offers in the configs/ offers format (columns of configs/prices/offers.csv)."""
    try:
        handle = path.open("w", newline="", encoding="utf-8")
    except OSError as error:
        raise UserError(
            f"cannot write {path}: {error.strerror}", fix="choose a writable path"
        ) from None
    with handle:
        writer = csv.writer(handle)
        writer.writerow(OFFER_COLUMNS)
        for o in offers:
            writer.writerow(
                [
                    o.location.cloud,
                    o.location.region,
                    o.location.zone or "",
                    o.instance_type,
                    o.gpu,
                    o.gpus_per_node,
                    _cell(o.vcpus),
                    _cell(o.memory_gib),
                    _cell(o.on_demand_usd_per_hour),
                    _cell(o.spot_usd_per_hour),
                    _cell(o.available_count),
                    _cell(o.preemption_rate_per_hour),
                    o.source,
                    o.as_of,
                ]
            )


def _cell(value: float | int | None) -> str:
    return "" if value is None else f"{value:g}"
