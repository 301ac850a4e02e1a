"""GPU node prices for GCP: the Cloud Billing Catalog API, or a table the caller passes in.

The Compute API has no prices. The Billing Catalog lists SKUs of the Compute Engine service
(``services/6F81-5844-456A``): one per GPU model (``Nvidia Tesla T4 GPU running in Americas``), per
machine family's vCPU (``N1 Predefined Instance Core ...``, ``A2 Instance Core ...``) and memory
(``... Instance Ram ...``), each in an on-demand and a spot (``Spot Preemptible ...``, usage type
``Preemptible``) flavour, with the regions it applies to. A node's price is GPUs x GPU price +
vCPUs x core price + GiB x RAM price; when one of those parts is missing the price is unknown
(None) rather than understated. Disks and network are not included.

A caller-supplied ``price_table`` maps ``(gpu, region)`` to ``(on-demand, spot)`` $ per GPU-hour,
taken as the whole price of a node's share (no separate vCPU/RAM part).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from provisioners.gcp.catalog import ZoneGpu

COMPUTE_SERVICE = "services/6F81-5844-456A"
BILLING_ENDPOINT = "https://cloudbilling.googleapis.com"

PriceTable = Mapping[tuple[str, str], tuple[float | None, float | None]]

# SKUs for other kinds of use (commitments, workstations, reservations...) are not spot/on-demand
# list prices of a plain VM.
_SKIP_WORDS = (
    "commitment",
    "virtual workstation",
    "reserved",
    "dws",
    "calendar",
    "sole tenancy",
    "custom",
    "extended",
    "flex",
)
# Order matters: the most specific name first ("A100 80GB" before "A100").
_GPU_PATTERNS = tuple(
    (re.compile(pattern, re.IGNORECASE), gpu)
    for pattern, gpu in (
        (r"\bH100 Mega\b", "H100-MEGA"),
        (r"\bH100\b", "H100"),
        (r"\bH200\b", "H200"),
        (r"\bA100 80GB\b", "A100-80GB"),
        (r"\bA100\b", "A100"),
        (r"\bV100\b", "V100"),
        (r"\bP100\b", "P100"),
        (r"\bT4\b", "T4"),
        (r"\bL4\b", "L4"),
        (r"\bP4\b", "P4"),
    )
)
_VM_PATTERN = re.compile(
    r"^(?:spot preemptible )?(n1 predefined|a2|a3|g2) instance (core|ram)\b", re.IGNORECASE
)


@dataclass(frozen=True)
class PriceBook:
    """$ per unit-hour keyed by (part, name, region, spot); part is ``gpu``, ``core`` or ``ram``
    (per GPU, per vCPU, per GiB). ``vm_priced``: node prices need the core and RAM parts too."""

    unit_usd_per_hour: Mapping[tuple[str, str, str, bool], float] = field(default_factory=dict)
    vm_priced: bool = True
    source: str = ""

    def node_usd_per_hour(self, shape: ZoneGpu, *, spot: bool) -> float | None:
        """The price of one node of ``shape``, or None when any part of it is unknown."""
        gpu = self.unit_usd_per_hour.get(("gpu", shape.gpu, shape.region, spot))
        if gpu is None:
            return None
        total = gpu * shape.gpus_per_node
        if not self.vm_priced:
            return round(total, 6)
        family = shape.machine.name.split("-", 1)[0]
        core = self.unit_usd_per_hour.get(("core", family, shape.region, spot))
        ram = self.unit_usd_per_hour.get(("ram", family, shape.region, spot))
        if core is None or ram is None:
            return None
        return round(total + core * shape.machine.vcpus + ram * shape.machine.memory_gib, 6)


def book_from_table(table: PriceTable) -> PriceBook:
    """A price book from ``{(gpu, region): (on-demand, spot) $/GPU-hour}``."""
    prices: dict[tuple[str, str, str, bool], float] = {}
    for (gpu, region), (on_demand, spot) in table.items():
        if on_demand is not None:
            prices[("gpu", gpu, region, False)] = float(on_demand)
        if spot is not None:
            prices[("gpu", gpu, region, True)] = float(spot)
    return PriceBook(prices, vm_priced=False, source="price_table")


def _unit_price(sku: Mapping[str, Any]) -> float | None:
    """The list price of one unit of ``sku`` (the last tier: the rate after any free tier)."""
    for info in sku.get("pricingInfo", ())[:1]:
        tiers = info.get("pricingExpression", {}).get("tieredRates", ())
        if tiers:
            money = tiers[-1].get("unitPrice", {})
            return int(money.get("units", 0) or 0) + int(money.get("nanos", 0) or 0) / 1e9
    return None


def _sku_key(description: str) -> tuple[str, str] | None:
    """``(part, name)`` this SKU prices, e.g. ``("gpu", "T4")`` or ``("core", "n1")``."""
    lowered = description.lower()
    if any(word in lowered for word in _SKIP_WORDS):
        return None
    vm = _VM_PATTERN.match(description)
    if vm is not None:
        return vm.group(2).lower(), vm.group(1).split()[0].lower()
    if " gpu" not in lowered:
        return None
    for pattern, gpu in _GPU_PATTERNS:
        if pattern.search(description):
            return "gpu", gpu
    return None


def book_from_skus(skus: Iterator[Mapping[str, Any]], *, source: str) -> PriceBook:
    """A price book from Billing Catalog SKU resources (as JSON)."""
    prices: dict[tuple[str, str, str, bool], float] = {}
    for sku in skus:
        usage = sku.get("category", {}).get("usageType")
        if usage not in ("OnDemand", "Preemptible"):
            continue
        key = _sku_key(sku.get("description", ""))
        price = _unit_price(sku)
        if key is None or price is None:
            continue
        for region in sku.get("serviceRegions", ()):
            prices[(key[0], key[1], region, usage == "Preemptible")] = price
    return PriceBook(prices, vm_priced=True, source=source)


def iter_skus(session: Any, *, endpoint: str, timeout_s: float) -> Iterator[Mapping[str, Any]]:
    """Every SKU of the Compute Engine service, page by page, through an ``AuthorizedSession``.

    Raises ``BillingHttpError`` on a non-200 answer (the caller maps it to a typed error)."""
    url = f"{endpoint.rstrip('/')}/v1/{COMPUTE_SERVICE}/skus"
    token = ""
    while True:
        params = {"currencyCode": "USD", "pageSize": "5000"}
        if token:
            params["pageToken"] = token
        response = session.get(url, params=params, timeout=timeout_s)
        if response.status_code != 200:
            raise BillingHttpError(response.status_code, response.text[:500])
        page = response.json()
        yield from page.get("skus", ())
        token = page.get("nextPageToken", "")
        if not token:
            return


class BillingHttpError(Exception):
    """The Billing Catalog answered with an HTTP error."""

    def __init__(self, status: int, text: str) -> None:
        self.status, self.text = status, text
        super().__init__(f"HTTP {status}: {text}")
