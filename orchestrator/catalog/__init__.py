"""The data catalog: GPU specs, regions, network, egress prices and GPU offers from configs/."""

from orchestrator.catalog.catalog import PROVIDER_CLOUDS, Catalog, default_catalog
from orchestrator.catalog.egress import EgressPrice
from orchestrator.catalog.gpus import GpuSpec
from orchestrator.catalog.locations import Location
from orchestrator.catalog.network import LinkEstimate
from orchestrator.catalog.offers import OFFER_COLUMNS, Offer, OfferTable

__all__ = [
    "OFFER_COLUMNS",
    "PROVIDER_CLOUDS",
    "Catalog",
    "EgressPrice",
    "GpuSpec",
    "LinkEstimate",
    "Location",
    "Offer",
    "OfferTable",
    "default_catalog",
]
