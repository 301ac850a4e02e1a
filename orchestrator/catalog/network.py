"""Bandwidth and round-trip time between two locations, and where each figure came from.

configs/network/index.yaml names the relation defaults (the cross-region study's table) and the
measured tables (Erben et al.'s region matrices, SAILOR's GCP zone pairs). A lookup falls back from
a measured zone pair, to a region pair, to the relation default, separately for bandwidth and RTT,
and the answer says which it used.

What two nodes get from the network also depends on the nodes: a cloud caps a VM's egress by its
type, and a cluster's nodes have the NICs they have. SAILOR measured its zone pairs per pair of GPU
types (one GPU per node sending to one): A100 VMs get 2.4 GB/s within a zone where V100 VMs get 1.7,
GH200 nodes 23 GB/s, and its RTX-3090 node 0.1 GB/s. A lookup that names the GPU types at both ends
takes that pair's figure for exactly these two zones where the table has one (``node_pairs``), and
falls back to the place-level lookup otherwise.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from orchestrator.catalog.locations import Location, Regions
from orchestrator.catalog.records import Entry, Source, read_sources, read_yaml
from orchestrator.errors import CatalogError
from orchestrator.yamlsrc import YamlDoc

GB = 1e9
RELATIONS = ("same_zone", "same_region", "same_continent", "other_continent", "other_cloud")


@dataclass(frozen=True)
class Measurement:
    """One measured directed link; either figure may be missing (SAILOR has no RTTs)."""

    bandwidth_bytes_per_s: float | None
    rtt_s: float | None
    streams: int | None
    table: str
    source: Source
    # SAILOR's message-size curve: bandwidth GB/s = c2*L^2 + c1*L + c0, L = log2(bytes / 1e6)
    curve: tuple[float, float, float] | None = None


@dataclass(frozen=True)
class LinkEstimate:
    """What the catalog knows of the link from ``src`` to ``dst``."""

    src: str
    dst: str
    relation: str
    bandwidth_bytes_per_s: float
    rtt_s: float
    streams: int | None  # TCP streams behind the bandwidth figure; None when not stated
    bandwidth_from: str  # "measured pair", "region pair" or "relation default"
    bandwidth_table: str
    bandwidth_source: Source
    rtt_from: str
    rtt_table: str
    rtt_source: Source
    curve: tuple[float, float, float] | None = None

    def bandwidth_for_message(self, message_bytes: float) -> float:
        """Bandwidth for one message of this size: the measured curve if any, capped."""
        if self.curve is None or message_bytes <= 0:
            return self.bandwidth_bytes_per_s
        x = math.log2(message_bytes / 1e6)
        c2, c1, c0 = self.curve
        fitted = (c2 * x * x + c1 * x + c0) * GB
        return min(max(fitted, 1.0), self.bandwidth_bytes_per_s)

    def to_json(self) -> dict:
        return {
            "from": self.src,
            "to": self.dst,
            "relation": self.relation,
            "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
            "bandwidth_gb_per_s": round(self.bandwidth_bytes_per_s / GB, 4),
            "rtt_s": self.rtt_s,
            "streams": self.streams,
            "bandwidth_from": self.bandwidth_from,
            "bandwidth_table": self.bandwidth_table,
            "bandwidth_source": self.bandwidth_source.to_json(),
            "rtt_from": self.rtt_from,
            "rtt_table": self.rtt_table,
            "rtt_source": self.rtt_source.to_json(),
        }


class NetworkTable:
    """Relation defaults plus measured zone pairs and region pairs."""

    def __init__(
        self,
        regions: Regions,
        defaults: dict[str, Measurement],
        zone_pairs: dict[tuple[Location, Location], Measurement],
        region_pairs: dict[tuple[Location, Location], Measurement],
    ) -> None:
        self.regions = regions
        self.defaults = defaults
        self.zone_pairs = zone_pairs
        self.region_pairs = region_pairs
        self._zone_means = _region_means(zone_pairs)
        # (src zone, dst zone, src GPU, dst GPU) -> a measurement between nodes of those GPU types,
        # by the catalog's GPU names once ``resolve_gpus`` has run (the files use their own)
        self.node_pairs: dict[tuple[Location, Location, str, str], Measurement] = {}

    def zones(self) -> frozenset[Location]:
        return frozenset(loc for pair in self.zone_pairs for loc in pair)

    def resolve_gpus(self, canonical: Callable[[str], str | None]) -> None:
        """Key node pairs by the catalog's GPU names (``canonical``: a file's name -> the catalog's,
        None for a GPU the catalog does not list, whose figures are dropped)."""
        resolved = {}
        for (src, dst, a, b), measurement in self.node_pairs.items():
            names = canonical(a), canonical(b)
            if None not in names:
                resolved[(src, dst, *names)] = measurement
        self.node_pairs = resolved

    def link(
        self, src: Location, dst: Location, gpus: tuple[str, str] | None = None
    ) -> LinkEstimate:
        """The link from ``src`` to ``dst`` (both region- or zone-level); with ``gpus``, between
        a node of the first GPU type at ``src`` and one of the second at ``dst``."""
        relation = self.regions.relation(src, dst).network
        candidates = self._candidates(src, dst)
        if gpus is not None and self.node_pairs:
            candidates = self._node_candidates(src, dst, gpus) + candidates
        default = ("relation default", f"relation_defaults.{relation}", self.defaults[relation])
        bw_from, bw_table, bw = next(
            (c for c in candidates if c[2].bandwidth_bytes_per_s is not None), default
        )
        rtt_from, rtt_table, rtt = next((c for c in candidates if c[2].rtt_s is not None), default)
        return LinkEstimate(
            src=str(src),
            dst=str(dst),
            relation=relation,
            bandwidth_bytes_per_s=bw.bandwidth_bytes_per_s,
            rtt_s=rtt.rtt_s,
            streams=bw.streams,
            bandwidth_from=bw_from,
            bandwidth_table=bw_table,
            bandwidth_source=bw.source,
            rtt_from=rtt_from,
            rtt_table=rtt_table,
            rtt_source=rtt.source,
            curve=bw.curve,
        )

    def _node_candidates(
        self, src: Location, dst: Location, gpus: tuple[str, str]
    ) -> list[tuple[str, str, Measurement]]:
        if not (src.zone and dst.zone):
            return []
        a, b = gpus
        found = []
        for key in ((src, dst, a, b), (dst, src, b, a)):
            measurement = self.node_pairs.get(key)
            if measurement is not None:
                found.append(("measured node pair", measurement.table, measurement))
        return found

    def _candidates(self, src: Location, dst: Location) -> list[tuple[str, str, Measurement]]:
        found = []
        if src.zone and dst.zone:
            for key in ((src, dst), (dst, src)):
                if key in self.zone_pairs:
                    found.append(
                        ("measured pair", self.zone_pairs[key].table, self.zone_pairs[key])
                    )
        regions = (src.region_location(), dst.region_location())
        for table in (self.region_pairs, self._zone_means):
            for key in (regions, regions[::-1]):
                if key in table:
                    found.append(("region pair", table[key].table, table[key]))
        return found

    @classmethod
    def load(cls, path: Path, display: str, regions: Regions) -> NetworkTable:
        doc = read_yaml(path, display)
        top = Entry(doc, ())
        sources = read_sources(doc, top)
        defaults = _read_defaults(doc, top, sources)
        zone_pairs: dict[tuple[Location, Location], Measurement] = {}
        region_pairs: dict[tuple[Location, Location], Measurement] = {}
        measured = top.raw("measured")
        top.done()
        if not isinstance(measured, list):
            top.fail(
                ("measured",), "expected a list of measured tables", "write measured: [] if none"
            )
        node_pairs: dict[tuple[Location, Location, str, str], Measurement] = {}
        for index in range(len(measured)):
            entry = Entry(doc, ("measured", index))
            table = _read_measured(entry, path.parent, display, sources, regions)
            for pair, measurement in table.items():
                if len(pair) == 4:
                    node_pairs[pair] = measurement
                    continue
                target = zone_pairs if pair[0].zone else region_pairs
                target[pair] = measurement
        network = cls(regions, defaults, zone_pairs, region_pairs)
        network.node_pairs = node_pairs
        return network


def _read_defaults(doc: YamlDoc, top: Entry, sources: dict[str, Source]) -> dict[str, Measurement]:
    raw = top.raw("relation_defaults")
    if not isinstance(raw, dict):
        top.fail(
            ("relation_defaults",), "expected a mapping", f"give each of {', '.join(RELATIONS)}"
        )
    defaults = {}
    for relation in RELATIONS:
        if relation not in raw:
            top.fail(
                ("relation_defaults",),
                f"missing relation '{relation}'",
                f"add relation_defaults.{relation}",
            )
        entry = Entry(doc, ("relation_defaults", relation), label=relation)
        defaults[relation] = Measurement(
            bandwidth_bytes_per_s=entry.number("bandwidth_gb_per_s") * GB,
            rtt_s=entry.number("rtt_ms") / 1000.0,
            streams=_streams(entry),
            table=f"relation_defaults.{relation}",
            source=_source(entry, sources),
        )
        entry.done()
    for relation in raw:
        if relation not in RELATIONS:
            top.fail(
                ("relation_defaults", relation),
                f"unknown relation '{relation}'",
                f"use {', '.join(RELATIONS)}",
            )
    return defaults


def _streams(entry: Entry) -> int | None:
    value = entry.raw("streams", required=False)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        entry.fail(
            entry.path + ("streams",),
            f"expected a whole number >= 1 or null, got {value!r}",
            "fix streams",
        )
    return value


def _source(entry: Entry, sources: dict[str, Source]) -> Source:
    key = entry.text("source")
    if key not in sources:
        entry.fail(entry.path + ("source",), f"unknown source '{key}'", "add it under sources:")
    return sources[key]


def _read_measured(
    entry: Entry, folder: Path, display: str, sources: dict[str, Source], regions: Regions
) -> dict[tuple[Location, Location], Measurement]:
    name = entry.text("name")
    entry.label = name
    file = entry.text("file")
    kind = entry.text("format")
    streams = _streams(entry)
    source = _source(entry, sources)
    data_path = folder / file
    data_display = str(Path(display).parent / file)
    if kind == "erben_matrix":
        section = entry.text("section")
        labels = _labels(entry, regions)
        entry.done()
        return _erben_matrix(data_path, data_display, section, labels, name, streams, source)
    if kind == "sailor_zones":
        cloud = entry.text("cloud")
        gpu = entry.text("use_gpu")
        per_node = int(entry.number("use_gpus_per_node"))
        entry.done()
        return _sailor_zones(
            data_path, data_display, cloud, gpu, per_node, name, streams, source, regions
        )
    entry.fail(
        entry.path + ("format",), f"unknown format '{kind}'", "use erben_matrix or sailor_zones"
    )


def _labels(entry: Entry, regions: Regions) -> dict[str, Location]:
    raw = entry.raw("labels")
    if not isinstance(raw, dict) or not raw:
        entry.fail(
            entry.path + ("labels",), "expected label: location lines", "e.g. US: gcp/us-central1"
        )
    labels = {}
    for label, text in raw.items():
        try:
            location = Location.parse(text)
        except ValueError as exc:
            entry.fail(entry.path + ("labels", label), str(exc), "write cloud/region")
        if location.region is None or not regions.has_region(location.cloud, location.region):
            entry.fail(
                entry.path + ("labels", label),
                f"'{text}' is not a region in configs/regions.yaml",
                "name a listed cloud/region",
            )
        labels[label] = location
    return labels


def _erben_matrix(
    path: Path,
    display: str,
    section: str,
    labels: dict[str, Location],
    name: str,
    streams: int | None,
    source: Source,
) -> dict[tuple[Location, Location], Measurement]:
    doc = read_yaml(path, display)
    top = Entry(doc, (section,))
    throughput = top.raw("throughput_gbit_s")
    latency = top.raw("latency_ms")
    pairs: dict[tuple[Location, Location], Measurement] = {}
    for a, row in throughput.items():
        for b, gbit in row.items():
            if a not in labels or b not in labels:
                raise CatalogError(
                    f"label '{a if a not in labels else b}' has no location",
                    file=display,
                    line=doc.line((section, "throughput_gbit_s", a, b)),
                    fix="map it under labels: in configs/network/index.yaml",
                )
            rtt_ms = latency.get(a, {}).get(b)
            pairs[(labels[a], labels[b])] = Measurement(
                bandwidth_bytes_per_s=float(gbit) * 1e9 / 8,
                rtt_s=None if rtt_ms is None else rtt_ms / 1000,
                streams=streams,
                table=name,
                source=source,
            )
    return pairs


def _sailor_zones(
    path: Path,
    display: str,
    cloud: str,
    gpu: str,
    per_node: int,
    name: str,
    streams: int | None,
    source: Source,
    regions: Regions,
) -> dict[tuple[Location, Location], Measurement]:
    if not path.is_file():
        raise CatalogError("file not found", file=display, fix="restore it from the repository")
    data = json.loads(path.read_text(encoding="utf-8"))
    pairs: dict[tuple, Measurement] = {}
    for src_zone, by_gpu in data.items():
        # every pair of GPU types, one GPU per node at each end: a rank's view of the link
        for src_gpu, by_count in by_gpu.items():
            for dst_zone, by_dst_gpu in by_count.get("1", {}).items():
                for dst_gpu, by_dst_count in by_dst_gpu.items():
                    entry = by_dst_count.get("1")
                    if entry is None:
                        continue
                    (c2, c1, c0), cap = entry
                    key = (
                        _zone_location(cloud, src_zone, regions, display),
                        _zone_location(cloud, dst_zone, regions, display),
                        src_gpu,
                        dst_gpu,
                    )
                    pairs[key] = Measurement(
                        bandwidth_bytes_per_s=float(cap),
                        rtt_s=None,
                        streams=streams,
                        table=f"{name} ({src_gpu} -> {dst_gpu})",
                        source=source,
                        curve=(float(c2), float(c1), float(c0)),
                    )
        targets = by_gpu.get(gpu, {}).get(str(per_node), {})
        for dst_zone, by_dst_gpu in targets.items():
            entry = by_dst_gpu.get(gpu, {}).get(str(per_node))
            if entry is None:
                continue
            (c2, c1, c0), cap = entry
            src, dst = (
                _zone_location(cloud, src_zone, regions, display),
                _zone_location(cloud, dst_zone, regions, display),
            )
            pairs[(src, dst)] = Measurement(
                bandwidth_bytes_per_s=float(cap),
                rtt_s=None,
                streams=streams,
                table=name,
                source=source,
                curve=(float(c2), float(c1), float(c0)),
            )
    if not any(len(pair) == 2 for pair in pairs):
        raise CatalogError(
            f"no entries for GPU {gpu} with {per_node} per node",
            file=display,
            fix="check use_gpu and use_gpus_per_node in configs/network/index.yaml",
        )
    return pairs


def _zone_location(cloud: str, zone: str, regions: Regions, display: str) -> Location:
    region = zone.rsplit("-", 1)[0]
    if not regions.has_region(cloud, region):
        raise CatalogError(
            f"zone '{zone}' is in no region of {cloud} in configs/regions.yaml",
            file=display,
            fix="add its region to configs/regions.yaml",
        )
    return Location(cloud, region, zone)


def _region_means(
    zone_pairs: dict[tuple[Location, Location], Measurement],
) -> dict[tuple[Location, Location], Measurement]:
    """Region-pair figures derived from zone pairs: the mean over the measured zone pairs."""
    groups: dict[tuple[Location, Location], list[Measurement]] = defaultdict(list)
    for (a, b), measurement in zone_pairs.items():
        groups[(a.region_location(), b.region_location())].append(measurement)
    means = {}
    for key, items in groups.items():
        first = items[0]
        bandwidths = [m.bandwidth_bytes_per_s for m in items if m.bandwidth_bytes_per_s is not None]
        rtts = [m.rtt_s for m in items if m.rtt_s is not None]
        means[key] = Measurement(
            bandwidth_bytes_per_s=sum(bandwidths) / len(bandwidths) if bandwidths else None,
            rtt_s=sum(rtts) / len(rtts) if rtts else None,
            streams=first.streams,
            table=f"{first.table} (mean of {len(items)} zone pairs)",
            source=first.source,
        )
    return means
