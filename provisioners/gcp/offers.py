"""The GCP market (the adapter's offers): GPU machine shapes per zone from the Compute API, priced.

Three list calls describe the market (``zones.list`` for UP zones, then the aggregated lists of
accelerator types and machine types over all zones); ``catalog`` turns them into shapes and
``pricing`` prices them. The Billing Catalog is read at most once per ``price_ttl_s``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection
from dataclasses import dataclass

from provisioners.base import Offer
from provisioners.gcp import pricing, sdk
from provisioners.gcp.api import ComputeApi
from provisioners.gcp.catalog import MachineShape, ZoneGpu, last_segment, region_of, zone_gpus

_LOG = logging.getLogger(__name__)
SOURCE = "compute.googleapis.com zones/acceleratorTypes/machineTypes"


@dataclass(frozen=True, kw_only=True)
class MarketOptions:
    """Where to look and where prices come from."""

    regions: tuple[str, ...] = ()  # only these regions (empty: all)
    zones: tuple[str, ...] = ()  # only these zones (empty: all)
    billing_endpoint: str = pricing.BILLING_ENDPOINT
    price_table: pricing.PriceTable | None = None  # (gpu, region) -> (on-demand, spot) $/GPU-h
    price_ttl_s: float = 3600.0
    call_timeout_s: float = 60.0


class Market:
    """Lists GPU offers; remembers machine shapes so a launch knows a type's GPUs."""

    def __init__(self, api: ComputeApi, options: MarketOptions) -> None:
        self._api, self.options = api, options
        self._machines: dict[tuple[str, str], MachineShape] = {}
        self._book: tuple[float, pricing.PriceBook] | None = None

    def offers(
        self, *, gpus: Collection[str] | None, regions: Collection[str] | None
    ) -> list[Offer]:
        """Priced offers; a shape without any price is left out (the contract wants one)."""
        shapes = self.zone_gpus(gpus=gpus, regions=regions)
        book = self._price_book()
        now, found = time.time(), []
        for shape in shapes:
            on_demand = book.node_usd_per_hour(shape, spot=False)
            spot = book.node_usd_per_hour(shape, spot=True)
            if on_demand is not None or spot is not None:
                found.append(_offer(shape, on_demand, spot, now=now, prices=book.source))
        if shapes and not found:
            _LOG.warning("gcp: %d GPU machine shapes, none priced (%s)", len(shapes), book.source)
        return found

    def zone_gpus(
        self, *, gpus: Collection[str] | None, regions: Collection[str] | None
    ) -> list[ZoneGpu]:
        """Every (zone, machine type, GPU, count) the allowed zones can run."""
        zones = set(self._zones(regions))
        accelerators = self._accelerators(zones)
        machines = self._machine_shapes(zones)
        shapes = []
        for zone in sorted(zones):
            found = zone_gpus(
                zone=zone, machines=machines.get(zone, ()), accelerators=accelerators.get(zone, {})
            )
            shapes += [s for s in found if gpus is None or s.gpu in gpus]
        return shapes

    def machine(self, zone: str, machine_type: str) -> MachineShape:
        """The shape of ``machine_type`` in ``zone`` (``machineTypes.get`` if not seen yet)."""
        if (zone, machine_type) not in self._machines:
            found = self._api.call(
                "machineTypes.get",
                zone,
                lambda: self._api.client("MachineTypesClient").get(
                    project=self._api.project, zone=zone, machine_type=machine_type
                ),
            )
            self._machines[(zone, machine_type)] = sdk.shape(found)
        return self._machines[(zone, machine_type)]

    def zones(self, regions: Collection[str] | None) -> list[str]:
        """The zones that are up in ``regions`` (None: every allowed region)."""
        return self._zones(regions)

    def _zones(self, regions: Collection[str] | None) -> list[str]:
        """Names of the UP zones allowed by the options and by ``regions``."""
        api = self._api
        listed = api.call(
            "zones.list",
            f"project {api.project}",
            lambda: list(api.client("ZonesClient").list(project=api.project)),
        )
        names = []
        for zone in listed:
            region = last_segment(zone.region) or region_of(zone.name)
            allowed = (
                zone.status == "UP"
                and (not self.options.zones or zone.name in self.options.zones)
                and (not self.options.regions or region in self.options.regions)
                and (regions is None or region in regions)
            )
            if allowed:
                names.append(zone.name)
        return sorted(names)

    def _accelerators(self, zones: Collection[str]) -> dict[str, dict[str, int]]:
        """zone -> {accelerator type: most cards per instance}."""
        api = self._api
        pager = api.call(
            "acceleratorTypes.aggregatedList",
            f"project {api.project}",
            lambda: list(api.client("AcceleratorTypesClient").aggregated_list(project=api.project)),
        )
        found: dict[str, dict[str, int]] = {}
        for _, scoped in pager:
            for accelerator in scoped.accelerator_types:
                zone = last_segment(accelerator.zone)
                if zone in zones:
                    cards = accelerator.maximum_cards_per_instance or 1
                    found.setdefault(zone, {})[accelerator.name] = cards
        return found

    def _machine_shapes(self, zones: Collection[str]) -> dict[str, list[MachineShape]]:
        api = self._api
        pager = api.call(
            "machineTypes.aggregatedList",
            f"project {api.project}",
            lambda: list(api.client("MachineTypesClient").aggregated_list(project=api.project)),
        )
        machines: dict[str, list[MachineShape]] = {}
        for _, scoped in pager:
            for machine in scoped.machine_types:
                zone = last_segment(machine.zone)
                if zone in zones:
                    shape = sdk.shape(machine)
                    self._machines[(zone, shape.name)] = shape
                    machines.setdefault(zone, []).append(shape)
        return machines

    def _price_book(self) -> pricing.PriceBook:
        if self.options.price_table is not None:
            return pricing.book_from_table(self.options.price_table)
        if self._book is not None and time.monotonic() - self._book[0] < self.options.price_ttl_s:
            return self._book[1]
        book = self._fetch_billing()
        self._book = (time.monotonic(), book)
        return book

    def _fetch_billing(self) -> pricing.PriceBook:
        call = "cloudbilling.services.skus.list"
        where = f"{self.options.billing_endpoint} {pricing.COMPUTE_SERVICE}"
        session = sdk.authorized_session(self._api.credentials)
        try:
            skus = pricing.iter_skus(
                session,
                endpoint=self.options.billing_endpoint,
                timeout_s=self.options.call_timeout_s,
            )
            return pricing.book_from_skus(skus, source=f"cloudbilling {pricing.COMPUTE_SERVICE}")
        except pricing.BillingHttpError as error:
            typed = sdk.classify(error.text, call=call, where=where, status=error.status)
            raise type(typed)(
                typed.message,
                cloud=sdk.CLOUD,
                call=call,
                fix=f"{typed.fix}; the Cloud Billing API (cloudbilling.googleapis.com) must be "
                "enabled, or pass price_table=... with $/GPU-hour per (gpu, region)",
            ) from None
        except sdk.sdk_errors() as error:
            raise sdk.typed(error, call=call, where=where) from None
        finally:
            session.close()


def _offer(
    shape: ZoneGpu, on_demand: float | None, spot: float | None, *, now: float, prices: str
) -> Offer:
    return Offer(
        cloud=sdk.CLOUD,
        region=shape.region,
        zone=shape.zone,
        instance_type=shape.machine.name,
        gpu=shape.gpu,
        gpus_per_node=shape.gpus_per_node,
        vcpus=shape.machine.vcpus,
        memory_gib=shape.machine.memory_gib,
        on_demand_usd_per_hour=on_demand,
        spot_usd_per_hour=spot,
        observed_at_s=now,
        source=f"{SOURCE}; prices: {prices}",
    )
