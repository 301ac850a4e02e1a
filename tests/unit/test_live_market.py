"""``catalog offers --provider/--live/--save``: the market polled now, snapshots that ``plan
--market`` reads back, prices flagged with their age, and clouds without credentials named."""

from __future__ import annotations

import csv
import json

from orchestrator.market import STALE_AFTER_S, age_s, describe_age
from tests.unit.test_cli import REPO, run_cli


def test_local_provider_shows_the_simulated_market_now():
    result = run_cli("catalog", "offers", "--provider", "local", "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["market"] == "live: local" and document["warnings"] == []
    offers = document["offers"]
    assert offers and all(o["cloud"] == "local" for o in offers)
    assert all(o["available_count"] is not None and o["age_s"] < 600 for o in offers)
    assert not any(o["stale"] for o in offers)


def test_a_saved_snapshot_is_read_back_by_catalog_and_plan(tmp_path):
    snapshot = tmp_path / "market.csv"
    saved = run_cli("catalog", "offers", "--provider", "local", "--save", str(snapshot))
    assert saved.returncode == 0, saved.stderr
    assert f"wrote 5 offers to {snapshot}" in saved.stdout
    rows = list(csv.DictReader(snapshot.open()))
    assert len(rows) == 5 and all(r["as_of"].endswith("Z") for r in rows)
    listed = run_cli("catalog", "offers", "--market", str(snapshot), "--json")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout)["count"] == 5
    planned = run_cli(
        "plan", str(REPO / "recipes" / "quickstart.yaml"), "--market", str(snapshot), "--json"
    )
    assert planned.returncode == 0, planned.stderr


def test_old_prices_are_flagged_with_their_age(tmp_path):
    source = (REPO / "configs" / "local" / "offers.csv").read_text().splitlines()
    old = [source[0]] + [line.rsplit(",", 1)[0] + ",2020-01-01" for line in source[1:]]
    market = tmp_path / "old.csv"
    market.write_text("\n".join(old) + "\n")
    result = run_cli("catalog", "offers", "--market", str(market))
    assert result.returncode == 0, result.stderr
    assert "STALE" in result.stdout and "offers carry prices older than 6 h" in result.stdout


def test_age_reads_dates_and_utc_times():
    class Dated:
        as_of = "2026-01-01"

    class Timed:
        as_of = "2026-01-01T06:00:00Z"

    midnight = 1767225600.0  # 2026-01-01T00:00:00Z
    assert age_s(Dated(), now_s=midnight + 60) == 60
    assert age_s(Timed(), now_s=midnight + 7 * 3600) == 3600
    assert describe_age(STALE_AFTER_S) == "6 h" and describe_age(90) == "2 min"


def test_a_cloud_without_credentials_says_what_is_missing():
    for provider, needle in (
        ("aws", "AWS_ACCESS_KEY_ID"),
        ("gcp", "GOOGLE_APPLICATION_CREDENTIALS"),
        ("azure", "AZURE_"),
    ):
        result = run_cli("catalog", "offers", "--provider", provider)
        assert result.returncode == 2, (provider, result.stdout, result.stderr)
        assert needle in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_live_skips_clouds_without_credentials_naming_each():
    result = run_cli("catalog", "offers", "--live")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    for cloud in ("aws", "gcp", "azure"):
        assert f"skipped {cloud}" in result.stderr


def test_a_missing_sdk_is_named_apart_from_missing_credentials(monkeypatch):
    """A cloud whose SDK does not import says which package and extra install it; one without
    credentials points at where the SDK looked."""
    from orchestrator import market
    from orchestrator.catalog import default_catalog
    from provisioners.sdk_loader import load_sdk

    class NoSdk:
        def check_credentials(self):
            load_sdk("no_such_sdk_here", cloud="aws", package="boto3", extra="aws")

    monkeypatch.setattr(market, "create", lambda name: NoSdk())
    live = market.poll(default_catalog(), ["aws"], strict=False)
    (warning,) = live.warnings
    assert "skipped aws: boto3 is not installed" in warning
    assert "pip install 'geo-orchestrator[aws]'" in warning and "credentials" not in warning
