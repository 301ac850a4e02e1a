"""``python -m orchestrator catalog gpus|offers|network|egress|regions|models``: query configs/."""

from __future__ import annotations

import argparse
from pathlib import Path

from orchestrator.catalog import PROVIDER_CLOUDS
from orchestrator.catalog.offers import PRICINGS
from orchestrator.cli.catalog_views import (
    run_egress,
    run_gpus,
    run_models,
    run_network,
    run_offers,
    run_regions,
)


def add_parser(commands: argparse._SubParsersAction, formatter: type) -> None:
    parser = commands.add_parser(
        "catalog",
        help="query the data catalog: GPUs, offers and prices, network, egress",
        description="Query the tables in configs/ (offline; no network, no credentials).",
        formatter_class=formatter,
        epilog="examples:\n  python -m orchestrator catalog offers --gpu A100 --json\n"
        "  python -m orchestrator catalog network gcp/us-central1 gcp/europe-west1",
    )
    tables = parser.add_subparsers(dest="table", required=True, metavar="TABLE")
    _add_gpus(tables, formatter)
    _add_offers(tables, formatter)
    _add_network(tables, formatter)
    _add_egress(tables, formatter)
    _add_regions(tables, formatter)
    _add_models(tables, formatter)


def _json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", action="store_true", help="print one JSON document instead of a table"
    )


def _add_gpus(tables: argparse._SubParsersAction, formatter: type) -> None:
    p = tables.add_parser(
        "gpus",
        help="GPU types: memory, peak TFLOPS, bandwidth, interconnect",
        formatter_class=formatter,
        description="GPU specifications with their sources.",
        epilog="example:\n  python -m orchestrator catalog gpus --min-memory-gib 40",
    )
    p.add_argument("--name", help="one GPU by name or alias (e.g. A100-40, V100-16)")
    p.add_argument(
        "--min-memory-gib", type=float, default=0.0, help="only GPUs with at least this memory"
    )
    _json_flag(p)
    p.set_defaults(run=run_gpus)


def _add_offers(tables: argparse._SubParsersAction, formatter: type) -> None:
    p = tables.add_parser(
        "offers",
        help="GPU VM offers with on-demand and spot prices",
        formatter_class=formatter,
        description="Offers of the offline price snapshot (configs/prices/offers.csv), "
        "of a provider's market polled now, or of a market file. Prices older than 6 h are "
        "flagged with their age.",
        epilog="examples:\n  python -m orchestrator catalog offers --gpu A100 --json\n"
        "  python -m orchestrator catalog offers --gpu T4 --location gcp --pricing spot\n"
        "  python -m orchestrator catalog offers --provider local\n"
        "  python -m orchestrator catalog offers --live --save market.csv\n"
        "  python -m orchestrator plan recipe.yaml --market market.csv",
    )
    p.add_argument("--gpu", action="append", default=[], help="GPU type (repeatable)")
    p.add_argument(
        "--location",
        action="append",
        default=[],
        help="cloud[/region[/zone]] to include (repeatable)",
    )
    p.add_argument(
        "--exclude",
        action="append",
        default=[],
        help="cloud[/region[/zone]] to leave out (repeatable)",
    )
    p.add_argument(
        "--pricing", choices=PRICINGS, default="any", help="spot: only offers with a spot price"
    )
    p.add_argument(
        "--provider",
        choices=tuple(PROVIDER_CLOUDS),
        help="poll this provider's market now (local: the simulated spot market; a cloud: its "
        "APIs, with the credentials of its SDK's standard chain)",
    )
    p.add_argument(
        "--live",
        action="store_true",
        help="poll every cloud (aws, gcp, azure) that has credentials; skip the others with a warning",
    )
    p.add_argument(
        "--save", type=Path, metavar="FILE", help="write the offers shown as a market CSV"
    )
    p.add_argument(
        "--market", type=Path, help="a market CSV with the columns of configs/prices/offers.csv"
    )
    p.add_argument(
        "--sort",
        choices=("gpu_price", "price", "location", "gpu"),
        default="gpu_price",
        help="gpu_price: by spot (else on-demand) $ per GPU-hour",
    )
    p.add_argument("--limit", type=int, default=0, help="show at most this many rows (0: all)")
    _json_flag(p)
    p.set_defaults(run=run_offers)


def _add_network(tables: argparse._SubParsersAction, formatter: type) -> None:
    p = tables.add_parser(
        "network",
        help="bandwidth and RTT between two locations, and where they come from",
        formatter_class=formatter,
        description="With FROM and TO: the link both ways (measured pair, region pair or "
        "relation default). Without: the relation defaults and measured pairs.",
        epilog="examples:\n  python -m orchestrator catalog network "
        "gcp/us-central1/us-central1-a gcp/us-west1/us-west1-b\n"
        "  python -m orchestrator catalog network --json",
    )
    p.add_argument("src", nargs="?", metavar="FROM", help="cloud/region[/zone]")
    p.add_argument("dst", nargs="?", metavar="TO", help="cloud/region[/zone]")
    _json_flag(p)
    p.set_defaults(run=run_network)


def _add_egress(tables: argparse._SubParsersAction, formatter: type) -> None:
    p = tables.add_parser(
        "egress",
        help="$ per GB sent between two locations, or the rules per cloud",
        formatter_class=formatter,
        description="Egress price of traffic from FROM to TO (the sender's cloud charges), "
        "or all rules of a table.",
        epilog="examples:\n  python -m orchestrator catalog egress gcp/us-central1 gcp/europe-west1\n"
        "  python -m orchestrator catalog egress --table erben_2023_04",
    )
    p.add_argument("src", nargs="?", metavar="FROM", help="cloud/region[/zone]")
    p.add_argument("dst", nargs="?", metavar="TO", help="cloud/region[/zone]")
    p.add_argument("--table", help="rule table (default: the file's default_table)")
    _json_flag(p)
    p.set_defaults(run=run_egress)


def _add_regions(tables: argparse._SubParsersAction, formatter: type) -> None:
    p = tables.add_parser(
        "regions",
        help="regions of each cloud and their continents",
        formatter_class=formatter,
        epilog="example:\n  python -m orchestrator catalog regions --cloud aws",
    )
    p.add_argument("--cloud", help="only this cloud")
    _json_flag(p)
    p.set_defaults(run=run_regions)


def _add_models(tables: argparse._SubParsersAction, formatter: type) -> None:
    p = tables.add_parser(
        "models",
        help="built-in models a recipe can name",
        formatter_class=formatter,
        epilog="example:\n  python -m orchestrator catalog models --json",
    )
    _json_flag(p)
    p.set_defaults(run=run_models)
