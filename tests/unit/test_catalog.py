"""The catalog: GPU specs, offers, and validation of the files under configs/."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from orchestrator.catalog import Catalog, Location, default_catalog
from orchestrator.catalog.catalog import PACKAGED_CONFIGS_DIR
from orchestrator.errors import CatalogError

REQUIRED_GPUS = [
    "A100",
    "A100-80GB",
    "H100",
    "H200",
    "GH200",
    "V100",
    "T4",
    "L4",
    "A10G",
    "A10",
    "RTX-3090",
    "RTX-2080",
    "Titan-RTX",
]


@pytest.fixture
def configs_copy(tmp_path: Path) -> Path:
    """A private copy of configs/ that a test may damage."""
    target = tmp_path / "configs"
    shutil.copytree(PACKAGED_CONFIGS_DIR, target)
    return target


def test_required_gpus_and_sailor_aliases(catalog):
    for name in REQUIRED_GPUS:
        spec = catalog.gpus.get(name)
        assert spec.memory_gib > 0 and spec.peak_fp16_tflops >= spec.peak_fp32_tflops > 0
        assert spec.sources and all(s.as_of for s in spec.sources)
    assert catalog.gpus.get("A100-40").name == "A100"
    assert catalog.gpus.get("v100-16").name == "V100"
    assert catalog.gpus.get("GH-96").name == "GH200"
    assert catalog.gpus.get("A100-80").name == "A100-80GB"
    assert catalog.gpus.find("no-such-gpu") is None
    assert catalog.gpus.suggest("A1000") == "A100"


def test_bf16_support_follows_architecture(catalog):
    assert catalog.gpus.get("A100").supports_bf16
    assert not catalog.gpus.get("V100").supports_bf16
    assert not catalog.gpus.get("T4").supports_bf16


@pytest.mark.parametrize("cloud", ["aws", "gcp", "azure"])
def test_price_snapshot_covers_four_regions_on_three_continents(catalog, cloud):
    offers = catalog.market(cloud).offers
    regions = {o.location.region_location() for o in offers}
    continents = {catalog.regions.continent(r) for r in regions}
    assert len(regions) >= 4 and len(continents) >= 3, (sorted(map(str, regions)), continents)


def test_every_offer_has_prices_source_and_date(catalog):
    for offer in catalog.offers.offers + catalog.local_offers.offers:
        assert offer.on_demand_usd_per_hour > 0
        assert (
            offer.spot_usd_per_hour is None
            or offer.spot_usd_per_hour <= offer.on_demand_usd_per_hour
        )
        assert offer.source and offer.as_of
        assert catalog.gpus.find(offer.gpu).name == offer.gpu


def test_offer_query_filters(catalog):
    within = [Location.parse("gcp/us-central1")]
    a100 = catalog.offers.query(gpus=["A100"], within=within, pricing="spot")
    assert a100 and all(
        o.gpu == "A100" and o.location.region == "us-central1" and o.spot_usd_per_hour for o in a100
    )
    excluded = catalog.offers.query(
        gpus=["A100"], within=within, exclude=[Location.parse("gcp/us-central1/us-central1-a")]
    )
    assert excluded and all(o.location.zone != "us-central1-a" for o in excluded)
    assert len(excluded) < len(catalog.offers.query(gpus=["A100"], within=within))


def test_local_market_is_its_own(catalog):
    local = catalog.market("local")
    assert local.offers and all(o.location.cloud == "local" for o in local.offers)
    assert all(o.available_count and o.preemption_rate_per_hour is not None for o in local.offers)
    assert {o.location.cloud for o in catalog.market("skypilot").offers} == {"aws", "gcp", "azure"}


def test_location_parsing_and_checks(catalog):
    assert str(Location.parse("gcp/us-central1/us-central1-a")) == "gcp/us-central1/us-central1-a"
    assert Location.parse("gcp").covers(Location.parse("gcp/us-west1/us-west1-b"))
    assert not Location.parse("gcp/us-west1").covers(Location.parse("gcp/us-central1"))
    assert (
        catalog.location("aws/us-east-1/us-east-1c").zone == "us-east-1c"
    )  # fits AWS's zone naming
    for bad, fragment in [
        ("gcp/us-centrl1", "did you mean 'us-central1'"),
        ("gpc", "did you mean 'gcp'"),
        ("aws/us-east-1/zz", "zone"),
        ("a/b/c/d", "cloud[/region[/zone]]"),
    ]:
        with pytest.raises(Exception) as info:
            catalog.location(bad)
        assert fragment in str(info.value)


def test_catalog_loads_lazily(configs_copy):
    (configs_copy / "prices" / "offers.csv").write_text("not,a,valid,header\n")
    catalog = Catalog(configs_copy)
    assert catalog.gpus.get("A100")  # GPUs load without touching the broken offers file
    with pytest.raises(CatalogError):
        _ = catalog.offers


def test_default_catalog_is_shared_and_resettable():
    first = default_catalog()
    assert default_catalog() is first
    default_catalog.cache_clear()
    assert default_catalog() is not first


def _replace_line(path: Path, old: str, new: str) -> int:
    """Replace the first line containing ``old``; return its 1-based line number."""
    lines = path.read_text().splitlines(keepends=True)
    for number, line in enumerate(lines, start=1):
        if old in line:
            lines[number - 1] = line.replace(old, new)
            path.write_text("".join(lines))
            return number
    raise AssertionError(f"{old!r} not in {path}")


def _offers_line_of(path: Path, fragment: str) -> int:
    return next(
        n for n, line in enumerate(path.read_text().splitlines(), start=1) if fragment in line
    )


@pytest.mark.parametrize(
    ("column", "transform", "fragment"),
    [
        ("spot_usd_per_hour", lambda cells: cells.__setitem__(9, "abc"), "'abc' is not a number"),
        ("on_demand_usd_per_hour", lambda cells: cells.__setitem__(8, "-3"), "must be > 0"),
        ("gpu", lambda cells: cells.__setitem__(4, "A1000"), "did you mean 'A100'"),
        ("region", lambda cells: cells.__setitem__(1, "mars-central1"), "not a region of"),
        ("zone", lambda cells: cells.__setitem__(2, "elsewhere-a"), "is not in region"),
        (
            "as_of",
            lambda cells: cells.__setitem__(13, "last week"),
            "expected YYYY-MM-DD or YYYY-MM-DDTHH:MM:SSZ",
        ),
        (
            "spot_usd_per_hour",
            lambda cells: cells.__setitem__(9, "999"),
            "above the on-demand price",
        ),
    ],
)
def test_bad_offer_row_names_file_line_and_column(configs_copy, column, transform, fragment):
    path = configs_copy / "prices" / "offers.csv"
    lines = path.read_text().splitlines()
    number = next(
        n
        for n, line in enumerate(lines, start=1)
        if line.startswith("gcp,us-central1,us-central1-a")
    )
    cells = lines[number - 1].split(",")
    transform(cells)
    lines[number - 1] = ",".join(cells)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(CatalogError) as info:
        _ = Catalog(configs_copy).offers
    error = info.value
    assert (error.file, error.line) == ("configs/prices/offers.csv", number), error.render()
    assert error.field.startswith(column) and fragment in error.message, error.render()


def test_bad_offers_header(configs_copy):
    path = configs_copy / "prices" / "offers.csv"
    _replace_line(path, "spot_usd_per_hour", "spot_price")
    with pytest.raises(CatalogError) as info:
        _ = Catalog(configs_copy).offers
    assert info.value.line == 1 and "first line must be exactly" in info.value.fix


def test_bad_gpu_value_names_file_line_and_field(configs_copy):
    path = configs_copy / "gpus.yaml"
    number = _replace_line(path, "memory_gib: 40", "memory_gib: -40")
    with pytest.raises(CatalogError) as info:
        _ = Catalog(configs_copy).gpus
    error = info.value
    assert (error.file, error.line) == ("configs/gpus.yaml", number)
    assert "memory_gib" in error.field and "A100" in error.field and "must be > 0" in error.message


def test_unknown_key_in_gpu_entry(configs_copy):
    path = configs_copy / "gpus.yaml"
    number = _replace_line(path, "memory_gib: 40", "memory_gb: 40")
    with pytest.raises(CatalogError) as info:
        _ = Catalog(configs_copy).gpus
    assert info.value.line == number and "did you mean 'memory_gib'" in info.value.message


def test_duplicate_gpu_alias(configs_copy):
    path = configs_copy / "gpus.yaml"
    _replace_line(path, "aliases: [A100-80,", "aliases: [A100-40,")
    with pytest.raises(CatalogError) as info:
        _ = Catalog(configs_copy).gpus
    assert "used by both" in info.value.message


def test_bad_egress_rule(configs_copy):
    path = configs_copy / "egress.yaml"
    number = _replace_line(path, "relation: inter_zone", "relation: inter_zoen")
    with pytest.raises(CatalogError) as info:
        _ = Catalog(configs_copy).egress
    assert (info.value.file, info.value.line) == ("configs/egress.yaml", number)
    assert "unknown relation 'inter_zoen'" in info.value.message


def test_bad_continent(configs_copy):
    path = configs_copy / "regions.yaml"
    number = _replace_line(path, "us-central1: north_america", "us-central1: north_americas")
    with pytest.raises(CatalogError) as info:
        _ = Catalog(configs_copy).regions
    assert (info.value.file, info.value.line) == ("configs/regions.yaml", number)


def test_bad_network_default(configs_copy):
    path = configs_copy / "network" / "index.yaml"
    number = _replace_line(path, "bandwidth_gb_per_s: 1.42", "bandwidth_gb_per_s: fast")
    with pytest.raises(CatalogError) as info:
        _ = Catalog(configs_copy).network
    assert (info.value.file, info.value.line) == ("configs/network/index.yaml", number)
    assert "same_region" in info.value.field


def test_market_file_with_aliases_is_normalized(catalog, tmp_path):
    header = (PACKAGED_CONFIGS_DIR / "prices" / "offers.csv").read_text().splitlines()[0]
    path = tmp_path / "market.csv"
    path.write_text(
        header
        + "\ngcp,us-central1,us-central1-a,a2-highgpu-1g,A100-40,1,12,85,3.67,1.1,,,mine,2026-01-01\n"
    )
    market = catalog.load_market(path)
    assert [o.gpu for o in market.offers] == ["A100"]
