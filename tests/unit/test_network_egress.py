"""Network lookups fall back measured pair -> region pair -> relation default; egress rules by relation."""

from __future__ import annotations

import json
import shutil

import pytest

from orchestrator.catalog import Catalog
from orchestrator.catalog.catalog import PACKAGED_CONFIGS_DIR
from orchestrator.errors import UserError


def _sailor_cap(src: str, dst: str) -> float:
    data = json.loads(
        (PACKAGED_CONFIGS_DIR / "network/sailor/multizone_bandwidths_het.json").read_text()
    )
    return data[src]["A100-40"]["1"][dst]["A100-40"]["1"][1]


def test_measured_zone_pair_from_sailor(catalog):
    link = catalog.link("gcp/us-central1/us-central1-a", "gcp/us-west1/us-west1-b")
    assert link.bandwidth_from == "measured pair"
    assert link.bandwidth_bytes_per_s == pytest.approx(_sailor_cap("us-central1-a", "us-west1-b"))
    assert link.relation == "same_continent"
    assert link.rtt_from == "relation default" and link.rtt_s == pytest.approx(0.031)
    # the message-size curve is kept: small messages get less than the cap
    assert (
        link.bandwidth_for_message(1e6)
        < link.bandwidth_for_message(1e9)
        <= link.bandwidth_bytes_per_s
    )


def test_same_zone_gets_region_rtt_from_erben(catalog):
    link = catalog.link("gcp/us-central1/us-central1-a", "gcp/us-central1/us-central1-a")
    assert link.bandwidth_from == "measured pair" and link.relation == "same_zone"
    assert link.rtt_from == "region pair" and link.rtt_s == pytest.approx(0.00066)


def test_region_pair_from_erben_is_single_stream(catalog):
    link = catalog.link("gcp/us-central1", "gcp/europe-west1/europe-west1-b")
    assert link.bandwidth_from == "region pair" and link.bandwidth_table == "erben2024_gcp_regions"
    assert link.bandwidth_bytes_per_s == pytest.approx(0.21e9 / 8)
    assert link.rtt_s == pytest.approx(0.10311)
    assert link.streams == 1
    assert link.relation == "other_continent"


def test_directed_measurements_between_clouds(catalog):
    gc_to_aws = catalog.link("gcp/us-west1", "aws/us-west-2")
    aws_to_gc = catalog.link("aws/us-west-2", "gcp/us-west1")
    assert gc_to_aws.bandwidth_bytes_per_s == pytest.approx(1.52e9 / 8)
    assert aws_to_gc.bandwidth_bytes_per_s == pytest.approx(1.81e9 / 8)
    assert catalog.link(
        "azure/southcentralus", "gcp/us-west1"
    ).bandwidth_bytes_per_s == pytest.approx(0.47e9 / 8)
    assert (
        catalog.link("aws/us-west-2", "azure/southcentralus").bandwidth_from == "relation default"
    )


def test_pair_measured_one_way_serves_both(tmp_path):
    configs = tmp_path / "configs"
    shutil.copytree(PACKAGED_CONFIGS_DIR, configs)
    erben = configs / "network" / "erben" / "network.yaml"
    text = erben.read_text()
    assert "    Azure: {GC: 0.47, Azure: 7.63}" in text
    erben.write_text(text.replace("    Azure: {GC: 0.47, Azure: 7.63}", "    Azure: {Azure: 7.63}"))
    link = Catalog(configs).link("azure/southcentralus", "gcp/us-west1")
    assert link.bandwidth_from == "region pair"
    assert link.bandwidth_bytes_per_s == pytest.approx(0.45e9 / 8)  # the GC -> Azure figure


def test_region_pair_derived_from_zone_measurements(catalog):
    link = catalog.link("gcp/us-central1", "gcp/us-west1")
    assert link.bandwidth_from == "region pair" and "mean of 4 zone pairs" in link.bandwidth_table


@pytest.mark.parametrize(
    ("src", "dst", "relation", "gb_per_s", "rtt_ms"),
    [
        (
            "gcp/europe-west4/europe-west4-a",
            "gcp/europe-west4/europe-west4-a",
            "same_zone",
            1.45,
            0.5,
        ),
        (
            "gcp/europe-west4/europe-west4-a",
            "gcp/europe-west4/europe-west4-b",
            "same_region",
            1.42,
            0.9,
        ),
        ("aws/us-east-1", "aws/us-west-2", "same_continent", 0.63, 31),
        ("aws/us-east-1", "aws/eu-west-1", "other_continent", 0.18, 102),
        ("aws/us-east-1", "gcp/us-east4", "other_cloud", 0.63, 31),
        ("aws/eu-west-1", "gcp/us-east4", "other_continent", 0.18, 102),
        ("local/sim-us/sim-us-a", "local/sim-us/sim-us-b", "same_region", 1.42, 0.9),
    ],
)
def test_relation_defaults(catalog, src, dst, relation, gb_per_s, rtt_ms):
    link = catalog.link(src, dst)
    assert (link.relation, link.bandwidth_from, link.rtt_from) == (
        relation,
        "relation default",
        "relation default",
    )
    assert link.bandwidth_bytes_per_s == pytest.approx(gb_per_s * 1e9)
    assert link.rtt_s == pytest.approx(rtt_ms / 1000)


def test_whole_cloud_has_no_link(catalog):
    with pytest.raises(UserError) as info:
        catalog.link("gcp", "gcp/us-central1")
    assert "names a whole cloud" in info.value.message


@pytest.mark.parametrize(
    ("src", "dst", "relation", "usd_per_gb"),
    [
        ("gcp/us-central1/us-central1-a", "gcp/us-central1/us-central1-a", "same_zone", 0.0),
        ("gcp/us-central1/us-central1-a", "gcp/us-central1/us-central1-b", "inter_zone", 0.01),
        ("gcp/us-central1", "gcp/us-west1", "inter_region", 0.02),
        ("gcp/us-central1", "gcp/europe-west1", "inter_continent", 0.05),
        ("gcp/us-central1", "gcp/australia-southeast1", "inter_continent", 0.15),
        ("gcp/asia-east1", "gcp/europe-west1", "inter_continent", 0.08),
        ("aws/us-east-1/us-east-1a", "aws/us-east-1/us-east-1b", "inter_zone", 0.01),
        ("aws/us-east-1", "gcp/us-central1", "inter_cloud", 0.09),
        ("local/sim-us/sim-us-a", "local/sim-eu/sim-eu-a", "inter_continent", 0.05),
    ],
)
def test_egress_prices(catalog, src, dst, relation, usd_per_gb):
    price = catalog.egress_price(src, dst)
    assert (price.relation, price.usd_per_gb) == (relation, pytest.approx(usd_per_gb))
    assert price.table == "current"
    assert relation == "same_zone" or price.source.as_of


def test_erben_table_reproduces_the_paper(catalog):
    assert (
        catalog.egress_price("gcp/us-central1", "gcp/europe-west1", "erben_2023_04").usd_per_gb
        == 0.08
    )
    assert (
        catalog.egress_price(
            "gcp/us-central1", "gcp/australia-southeast1", "erben_2023_04"
        ).usd_per_gb
        == 0.15
    )
    assert (
        catalog.egress_price("aws/us-east-1", "aws/eu-west-1", "erben_2023_04").usd_per_gb == 0.02
    )
    with pytest.raises(UserError):
        catalog.egress_price("gcp/us-central1", "gcp/us-west1", "no_such_table")


def test_most_specific_egress_rule_wins(catalog):
    rules = catalog.egress.rules("gcp")
    to_oceania = [
        r for r in rules if r.relation == "inter_continent" and r.to_continent == "oceania"
    ]
    catch_all = [r for r in rules if r.relation == "inter_continent" and r.specificity == 0]
    assert to_oceania and catch_all and to_oceania[0].usd_per_gb != catch_all[0].usd_per_gb
