"""Linux pay-as-you-go and Spot prices of VM sizes from the Azure Retail Prices API.

The API (https://prices.azure.com/api/retail/prices) is public and needs no sign-in. It is called
through an azure-core ``PipelineClient`` so that it shares the SDK's retries and logging, and so
that tests pass the same fake transport as for the compute client. One query per region asks for
all wanted sizes at once (an ``or`` of ``armSkuName``, in chunks to keep URLs short); pages are
followed through ``NextPageLink``.

Items are classified as Azure names them: ``skuName`` containing "Spot" is the Spot price,
"Low Priority" (the old Batch tier) is skipped, and any product naming "Windows" is skipped because
the workers run Linux.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from provisioners.azure.sdk import core
from provisioners.base import CloudCallError, scrub

PRICES_URL = "https://prices.azure.com/api/retail/prices"
NAMES_PER_QUERY = 10  # sizes per request: keeps the $filter (and URL) well under limits


@dataclass(frozen=True)
class SizePrice:
    """USD per node-hour; None where Azure lists no such price."""

    on_demand_usd_per_hour: float | None = None
    spot_usd_per_hour: float | None = None


def classify(item: dict[str, Any]) -> str | None:
    """``spot``, ``on_demand`` or None (not a Linux hourly USD consumption price)."""
    sku_name = str(item.get("skuName", ""))
    if "Windows" in str(item.get("productName", "")) or "Low Priority" in sku_name:
        return None
    if item.get("type", "Consumption") != "Consumption" or item.get("unitOfMeasure") != "1 Hour":
        return None
    if item.get("currencyCode", "USD") != "USD":
        return None
    return "spot" if "Spot" in sku_name else "on_demand"


def _cheaper(old: float | None, new: float) -> float:
    return new if old is None else min(old, new)


def fold(items: Iterable[dict[str, Any]]) -> dict[str, SizePrice]:
    """VM size -> prices, keeping the lowest where Azure lists several meters for one size."""
    prices: dict[str, SizePrice] = {}
    for item in items:
        kind = classify(item)
        if kind is None:
            continue
        size, usd = str(item["armSkuName"]), float(item["retailPrice"])
        old = prices.get(size, SizePrice())
        if kind == "spot":
            prices[size] = SizePrice(
                old.on_demand_usd_per_hour, _cheaper(old.spot_usd_per_hour, usd)
            )
        else:
            prices[size] = SizePrice(
                _cheaper(old.on_demand_usd_per_hour, usd), old.spot_usd_per_hour
            )
    return prices


def price_filter(region: str, sizes: Iterable[str]) -> str:
    names = " or ".join(f"armSkuName eq '{size}'" for size in sizes)
    return (
        "serviceName eq 'Virtual Machines' and priceType eq 'Consumption' "
        f"and armRegionName eq '{region}' and ({names})"
    )


class RetailPrices:
    """Prices of VM sizes per region, from the Retail Prices API (``endpoint`` for tests/mirrors)."""

    source = "prices.azure.com retail prices"

    def __init__(self, *, endpoint: str = PRICES_URL, client_kwargs: dict[str, Any] | None = None):
        self.endpoint = endpoint
        self._client_kwargs = dict(client_kwargs or {})
        self._client: Any = None

    def prices(self, region: str, sizes: Iterable[str]) -> dict[str, SizePrice]:
        wanted = sorted(set(sizes))
        items: list[dict[str, Any]] = []
        for start in range(0, len(wanted), NAMES_PER_QUERY):
            chunk = wanted[start : start + NAMES_PER_QUERY]
            items += self._pages({"$filter": price_filter(region, chunk)})
        return fold(items)

    def _pages(self, params: dict[str, str]) -> Iterator[dict[str, Any]]:
        from azure.core.exceptions import AzureError
        from azure.core.rest import HttpRequest

        request = HttpRequest("GET", self.endpoint, params=params)
        while request is not None:
            try:
                response = self._pipeline().send_request(request)
                response.raise_for_status()
                page = response.json()
            except (AzureError, ValueError) as error:
                raise CloudCallError(
                    f"could not read prices from {self.endpoint}: {scrub(str(error))}",
                    cloud="azure",
                    call="retail prices GET",
                    fix="check network access to prices.azure.com (no sign-in needed), or pass "
                    "another price_source",
                ) from error
            yield from page.get("Items") or []
            link = page.get("NextPageLink")
            request = HttpRequest("GET", link) if link else None

    def _pipeline(self) -> Any:
        if self._client is None:
            pipeline = core().PipelineClient
            self._client = pipeline(base_url=self.endpoint, **self._client_kwargs)
        return self._client


class PriceSource(Protocol):
    """Where offers' prices come from (the Retail Prices API by default)."""

    source: str

    def prices(self, region: str, sizes: Collection[str]) -> dict[str, SizePrice]: ...
