"""The catalog: one lazily loaded, cached query layer over the tables in configs/.

    catalog = default_catalog()
    catalog.offers.query(gpus=["A100"], within=[Location.parse("gcp/us-central1")])
    catalog.link("gcp/us-central1/us-central1-a", "gcp/europe-west1")
    catalog.egress_price("aws/us-east-1", "gcp/us-central1")

Each table is read and validated the first time it is used; a bad value raises CatalogError naming
the file and row. ``default_catalog.cache_clear()`` resets the shared instance (tests do).
"""

from __future__ import annotations

import functools
from functools import cached_property
from pathlib import Path

from orchestrator.catalog.egress import EgressPrice, EgressTable
from orchestrator.catalog.gpus import GpuTable
from orchestrator.catalog.locations import Location, Regions
from orchestrator.catalog.network import LinkEstimate, NetworkTable
from orchestrator.catalog.offers import OfferTable
from orchestrator.catalog.records import display_path, read_yaml
from orchestrator.errors import UserError
from orchestrator.yamlsrc import YamlDoc

# The installed layout puts configs/ beside orchestrator/ (both top-level in site-packages), as in
# the source tree; so the data is found relative to this package, not to the working directory.
PACKAGED_CONFIGS_DIR = Path(__file__).resolve().parents[2] / "configs"

# Which offers file is each provider's default market (see the recipe's `provider` and `market`).
PROVIDER_CLOUDS = {
    "local": ("local",),
    "skypilot": ("aws", "gcp", "azure"),
    "aws": ("aws",),
    "gcp": ("gcp",),
    "azure": ("azure",),
}


class Catalog:
    """GPU specs, regions, network, egress and offers, read from one configs folder."""

    def __init__(self, configs_dir: Path | None = None) -> None:
        self.configs_dir = Path(configs_dir) if configs_dir is not None else PACKAGED_CONFIGS_DIR
        self._docs: dict[str, YamlDoc] = {}

    def yaml_doc(self, relative: str) -> YamlDoc:
        """A config YAML file of this folder, parsed once (readers only read it)."""
        if relative not in self._docs:
            self._docs[relative] = read_yaml(*self._file(relative))
        return self._docs[relative]

    def _file(self, relative: str) -> tuple[Path, str]:
        path = self.configs_dir / relative
        return path, display_path(path, self.configs_dir)

    @cached_property
    def gpus(self) -> GpuTable:
        return GpuTable.load(*self._file("gpus.yaml"))

    @cached_property
    def regions(self) -> Regions:
        return Regions.load(*self._file("regions.yaml"))

    @cached_property
    def network(self) -> NetworkTable:
        table = NetworkTable.load(*self._file("network/index.yaml"), self.regions)
        gpus = self.gpus

        def canonical(name: str) -> str | None:
            spec = gpus.find(name)
            return None if spec is None else spec.name

        table.resolve_gpus(canonical)
        return table

    @cached_property
    def egress(self) -> EgressTable:
        return EgressTable.load(*self._file("egress.yaml"), self.regions)

    @cached_property
    def offers(self) -> OfferTable:
        """The offline price snapshot of AWS, GCP and Azure GPU offers."""
        return OfferTable.load(*self._file("prices/offers.csv"), self.regions, self.gpus)

    @cached_property
    def local_offers(self) -> OfferTable:
        """The market of the local simulated cloud."""
        return OfferTable.load(*self._file("local/offers.csv"), self.regions, self.gpus)

    def load_market(self, path: Path) -> OfferTable:
        """A user's market file (same columns as configs/prices/offers.csv)."""
        return OfferTable.load(path, str(path), self.regions, self.gpus)

    def market(self, provider: str, market_file: Path | None = None) -> OfferTable:
        """The offers a provider sees: a given market file, or the provider's default."""
        assert provider in PROVIDER_CLOUDS, provider
        if market_file is not None:
            return self.load_market(market_file)
        if provider == "local":
            return self.local_offers
        clouds = PROVIDER_CLOUDS[provider]
        return OfferTable(
            (o for o in self.offers.offers if o.location.cloud in clouds), self.offers.file
        )

    @cached_property
    def known_zones(self) -> frozenset[Location]:
        """Zones named by an offer, the local market or a measured network table."""
        zones = {loc for loc in self.offers.locations() | self.local_offers.locations() if loc.zone}
        return frozenset(zones | self.network.zones())

    def location(self, text: str) -> Location:
        """Parse and check a location; raise UserError naming what is unknown."""
        try:
            location = Location.parse(text)
        except ValueError as exc:
            raise UserError(str(exc), field=text, fix="write cloud[/region[/zone]]") from None
        problem = self.regions.problem(location, self.known_zones)
        if problem is not None:
            raise UserError(problem[0], field=text, fix=problem[1])
        return location

    def link(self, src: str | Location, dst: str | Location) -> LinkEstimate:
        """Bandwidth and RTT from ``src`` to ``dst``, with the source of each."""
        return self.network.link(self._as_location(src), self._as_location(dst))

    def egress_price(
        self, src: str | Location, dst: str | Location, table: str | None = None
    ) -> EgressPrice:
        """$/GB sent from ``src`` to ``dst`` and the rule that sets it."""
        return self.egress.price(self._as_location(src), self._as_location(dst), table)

    def _as_location(self, value: str | Location) -> Location:
        return value if isinstance(value, Location) else self.location(value)


@functools.cache
def default_catalog() -> Catalog:
    """The shared catalog over the packaged configs/ (reset with ``default_catalog.cache_clear()``)."""
    return Catalog()
