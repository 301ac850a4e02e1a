"""The views behind ``catalog gpus|offers|network|egress|regions|models``.

Each view builds records (dicts with units in their keys); ``--json`` prints them as one document,
otherwise a table shows chosen columns of the same records, so both speak the same names.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from orchestrator.catalog import Catalog, GpuSpec, Location, Offer
from orchestrator.catalog.offers import OfferTable
from orchestrator.cli.output import format_table, print_json
from orchestrator.errors import UserError
from runtime.models.specs import BUILTIN_MODELS

Table = tuple[list[dict], Sequence[str]]  # records and the columns a table shows
# a table's short headers for long field names (--json keeps the names, with their units)
HEADERS = {
    "gpus_per_node": "gpus",
    "on_demand_usd_per_hour": "od_$/h",
    "spot_usd_per_hour": "spot_$/h",
    "usd_per_gpu_hour": "$/gpu_h",
    "available_count": "free",
    "preemption_rate_per_hour": "preempt/h",
}


def emit(
    args: argparse.Namespace, document: dict, tables: Sequence[Table], footer: str = ""
) -> int:
    if args.json:
        print_json(document)
        return 0
    for index, (records, columns) in enumerate(tables):
        if index:
            print()
        headers = [HEADERS.get(c, c) for c in columns]
        print(format_table(headers, [[record.get(c) for c in columns] for record in records]))
    if footer:
        print(f"\n{footer}")
    return 0


def _gpu(catalog: Catalog, name: str, flag: str) -> GpuSpec:
    spec = catalog.gpus.find(name)
    if spec is None:
        hint = catalog.gpus.suggest(name)
        raise UserError(
            f"unknown GPU '{name}'" + (f" (did you mean '{hint}'?)" if hint else ""),
            field=flag,
            fix="see the GPU types: python -m orchestrator catalog gpus",
        )
    return spec


def _both_or_neither(args: argparse.Namespace, command: str) -> None:
    if (args.src is None) != (args.dst is None):
        raise UserError(
            "give both FROM and TO, or neither",
            field=command,
            fix=f"e.g. python -m orchestrator catalog {command} gcp/us-central1 gcp/europe-west1",
        )


def run_gpus(args: argparse.Namespace, catalog: Catalog) -> int:
    specs = [_gpu(catalog, args.name, "--name")] if args.name else list(catalog.gpus.specs)
    records = [_gpu_record(s) for s in specs if s.memory_gib >= args.min_memory_gib]
    columns = (
        "name",
        "memory_gib",
        "peak_fp16_tflops",
        "peak_bf16_tflops",
        "peak_fp32_tflops",
        "memory_bandwidth_gb_per_s",
        "interconnect",
        "interconnect_bidirectional_gb_per_s",
    )
    footer = (
        f"{len(records)} GPU types; dense peaks; aliases and sources: --json or {catalog.gpus.file}"
    )
    return emit(
        args,
        {"gpus": records, "count": len(records), "file": catalog.gpus.file},
        [(records, columns)],
        footer,
    )


def _gpu_record(spec: GpuSpec) -> dict:
    return {
        "name": spec.name,
        "aliases": list(spec.aliases),
        "vendor": spec.vendor,
        "architecture": spec.architecture,
        "form_factor": spec.form_factor,
        "memory_gib": spec.memory_gib,
        "memory_bandwidth_gb_per_s": spec.memory_bandwidth_gb_per_s,
        "peak_fp16_tflops": spec.peak_fp16_tflops,
        "peak_bf16_tflops": spec.peak_bf16_tflops,
        "peak_tf32_tflops": spec.peak_tf32_tflops,
        "peak_fp32_tflops": spec.peak_fp32_tflops,
        "interconnect": spec.interconnect,
        "interconnect_bidirectional_gb_per_s": spec.interconnect_bidirectional_gb_per_s,
        "tdp_w": spec.tdp_w,
        "sources": [{**s.to_json(), "note": s.note} for s in spec.sources],
    }


def _offers_market(args: argparse.Namespace, catalog: Catalog) -> tuple[OfferTable, list[str]]:
    """The table to show: a market file, a provider polled now, every cloud polled, or the
    offline snapshot; and warnings about clouds skipped."""
    if args.market:
        return catalog.load_market(args.market), []
    if args.provider or args.live:
        from orchestrator.market import CLOUD_PROVIDERS, poll

        names = [args.provider] if args.provider else list(CLOUD_PROVIDERS)
        live = poll(catalog, names, strict=bool(args.provider))
        if args.live and not live.table.offers:
            for warning in live.warnings:
                print(f"warning: {warning}", file=sys.stderr)
            raise UserError(
                "no cloud could be polled",
                field="--live",
                fix="install the SDKs or set up the credentials named above, or use --provider local",
            )
        return live.table, live.warnings
    return catalog.offers, []


def run_offers(args: argparse.Namespace, catalog: Catalog) -> int:
    from orchestrator.market import STALE_AFTER_S, age_s, describe_age, write_snapshot

    market, warnings = _offers_market(args, catalog)
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    offers = market.query(
        gpus=[_gpu(catalog, name, "--gpu").name for name in args.gpu],
        within=[catalog.location(t) for t in args.location],
        exclude=[catalog.location(t) for t in args.exclude],
        pricing=args.pricing,
    )
    offers.sort(key=_SORT_KEYS[args.sort])
    offers = offers[: args.limit] if args.limit > 0 else offers
    if args.save:
        write_snapshot(offers, args.save)
    now = time.time()
    records = []
    for o in offers:
        age = age_s(o, now_s=now)
        records.append(
            o.to_json()
            | {
                "usd_per_gpu_hour": _per_gpu(o),
                "age_s": round(age),
                "age": describe_age(age) + (" STALE" if age > STALE_AFTER_S else ""),
                "stale": age > STALE_AFTER_S,
            }
        )
    columns = (
        "infra",
        "instance_type",
        "gpu",
        "gpus_per_node",
        "on_demand_usd_per_hour",
        "spot_usd_per_hour",
        "usd_per_gpu_hour",
        "available_count",
        "preemption_rate_per_hour",
        "age",
    )
    sources = sorted({o.source for o in offers})
    footer = (
        f"{len(offers)} offers from {market.file}; $/gpu_h is the spot price where there is one; "
        "od: on demand; free: nodes available now; preempt/h: spot preemptions per hour"
    )
    if 0 < len(sources) <= 4:
        footer += "\nsources: " + "; ".join(sources)
    stale = sum(r["stale"] for r in records)
    if stale:
        footer += f"\n{stale} offers carry prices older than {describe_age(STALE_AFTER_S)} (STALE)"
    if args.save:
        footer += f"\nwrote {len(offers)} offers to {args.save}"
    document = {
        "offers": records,
        "count": len(records),
        "market": market.file,
        "warnings": warnings,
        "filters": {
            "gpu": args.gpu,
            "location": args.location,
            "exclude": args.exclude,
            "pricing": args.pricing,
        },
    }
    return emit(args, document, [(records, columns)], footer)


def _per_gpu(offer: Offer) -> float:
    price = (
        offer.spot_usd_per_hour
        if offer.spot_usd_per_hour is not None
        else offer.on_demand_usd_per_hour
    )
    return round(price / offer.gpus_per_node, 4)


_SORT_KEYS = {
    "gpu_price": lambda o: (_per_gpu(o), str(o.location), o.instance_type),
    "price": lambda o: (o.spot_usd_per_hour or o.on_demand_usd_per_hour, str(o.location)),
    "location": lambda o: (str(o.location), o.gpu, o.instance_type),
    "gpu": lambda o: (o.gpu, _per_gpu(o), str(o.location)),
}


def run_network(args: argparse.Namespace, catalog: Catalog) -> int:
    _both_or_neither(args, "network")
    if args.src is None:
        return _network_overview(args, catalog)
    links = [catalog.link(args.src, args.dst), catalog.link(args.dst, args.src)]
    records = [link.to_json() | {"rtt_ms": round(link.rtt_s * 1000, 2)} for link in links]
    columns = (
        "from",
        "to",
        "relation",
        "bandwidth_gb_per_s",
        "rtt_ms",
        "streams",
        "bandwidth_from",
        "bandwidth_table",
        "rtt_from",
    )
    return emit(args, {"links": records}, [(records, columns)])


def _network_overview(args: argparse.Namespace, catalog: Catalog) -> int:
    net = catalog.network
    defaults = [_measurement_record(m) | {"relation": name} for name, m in net.defaults.items()]
    measured = [
        _measurement_record(m) | {"from": str(a), "to": str(b)}
        for pairs in (net.region_pairs, net.zone_pairs)
        for (a, b), m in sorted(pairs.items())
    ]
    columns = ("bandwidth_gb_per_s", "rtt_ms", "streams", "table")
    return emit(
        args,
        {"relation_defaults": defaults, "measured": measured},
        [(defaults, ("relation", *columns)), (measured, ("from", "to", *columns))],
    )


def _measurement_record(m) -> dict:
    bandwidth, rtt = m.bandwidth_bytes_per_s, m.rtt_s
    return {
        "bandwidth_bytes_per_s": bandwidth,
        "bandwidth_gb_per_s": None if bandwidth is None else round(bandwidth / 1e9, 4),
        "rtt_s": rtt,
        "rtt_ms": None if rtt is None else round(rtt * 1000, 2),
        "streams": m.streams,
        "table": m.table,
        "source": m.source.to_json(),
    }


def run_egress(args: argparse.Namespace, catalog: Catalog) -> int:
    _both_or_neither(args, "egress")
    if args.src is not None:
        prices = [
            catalog.egress_price(args.src, args.dst, args.table),
            catalog.egress_price(args.dst, args.src, args.table),
        ]
        records = [p.to_json() | {"as_of": p.source.as_of if p.source else None} for p in prices]
        columns = ("from", "to", "relation", "usd_per_gb", "rule", "table", "as_of")
        return emit(args, {"prices": records}, [(records, columns)], "the sender's cloud charges")
    table = args.table or catalog.egress.default_table
    records = [
        {
            "cloud": cloud,
            "relation": r.relation,
            "from": r.from_continent,
            "to": r.to_continent,
            "usd_per_gb": r.usd_per_gb,
            "as_of": r.source.as_of,
            "source": r.source.to_json(),
        }
        for cloud in catalog.regions.clouds()
        for r in catalog.egress.rules(cloud, table)
    ]
    columns = ("cloud", "relation", "from", "to", "usd_per_gb", "as_of")
    footer = f"table '{table}' of {catalog.egress.file}; the sender's cloud charges"
    return emit(args, {"table": table, "rules": records}, [(records, columns)], footer)


def run_regions(args: argparse.Namespace, catalog: Catalog) -> int:
    clouds = [args.cloud] if args.cloud else list(catalog.regions.clouds())
    if args.cloud and args.cloud not in catalog.regions.clouds():
        raise UserError(
            f"unknown cloud '{args.cloud}'",
            field="--cloud",
            fix=f"use one of: {', '.join(catalog.regions.clouds())}",
        )
    records = [
        {
            "cloud": cloud,
            "region": region,
            "continent": catalog.regions.continent(Location(cloud, region)),
        }
        for cloud in clouds
        for region in catalog.regions.regions(cloud)
    ]
    return emit(args, {"regions": records}, [(records, ("cloud", "region", "continent"))])


def run_models(args: argparse.Namespace, catalog: Catalog) -> int:
    records = [
        {
            "name": name,
            "family": spec.family,
            "layers": spec.num_layers,
            "parameters_millions": round(spec.parameter_count() / 1e6, 2),
            "sailor_profile": getattr(spec, "sailor_name", None),
            "description": spec.description,
        }
        for name, spec in BUILTIN_MODELS.items()
    ]
    columns = ("name", "family", "layers", "parameters_millions", "sailor_profile", "description")
    return emit(args, {"models": records}, [(records, columns)])
