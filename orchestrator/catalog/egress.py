"""Egress prices: $/GB for bytes sent from one location to another (configs/egress.yaml).

The sender's cloud charges. Rules are written per cloud for a relation (``inter_zone``,
``inter_region``, ``inter_continent``, ``inter_cloud``; ``same_zone`` is free unless a rule says
otherwise), optionally narrowed to a sender continent (``from``) and a receiver continent (``to``).
The most specific matching rule wins. The file holds several dated tables (the providers' current
prices, Erben et al.'s April 2023 table); ``default_table`` names the one tools use.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from orchestrator.catalog.locations import CONTINENTS, Location, Regions
from orchestrator.catalog.records import Entry, Source, read_sources, read_yaml
from orchestrator.errors import CatalogError, UserError
from orchestrator.yamlsrc import YamlDoc

EGRESS_RELATIONS = ("same_zone", "inter_zone", "inter_region", "inter_continent", "inter_cloud")
ANY = "any"


@dataclass(frozen=True)
class EgressRule:
    relation: str
    from_continent: str  # a continent or "any"
    to_continent: str
    usd_per_gb: float
    source: Source

    def matches(self, relation: str, src_continent: str, dst_continent: str) -> bool:
        return (
            self.relation == relation
            and self.from_continent in (ANY, src_continent)
            and self.to_continent in (ANY, dst_continent)
        )

    @property
    def specificity(self) -> int:
        return (self.from_continent != ANY) + (self.to_continent != ANY)

    def describe(self) -> str:
        parts = [self.relation]
        if self.from_continent != ANY:
            parts.append(f"from {self.from_continent}")
        if self.to_continent != ANY:
            parts.append(f"to {self.to_continent}")
        return " ".join(parts)


@dataclass(frozen=True)
class EgressPrice:
    """The price of one GB from ``src`` to ``dst`` and the rule that set it."""

    src: str
    dst: str
    relation: str
    usd_per_gb: float
    table: str
    rule: str
    source: Source | None  # None for the implicit free same-zone rule

    def to_json(self) -> dict:
        return {
            "from": self.src,
            "to": self.dst,
            "relation": self.relation,
            "usd_per_gb": self.usd_per_gb,
            "table": self.table,
            "rule": self.rule,
            "source": None if self.source is None else self.source.to_json(),
        }


class EgressTable:
    """Dated rule tables by cloud."""

    def __init__(
        self,
        regions: Regions,
        tables: dict[str, dict[str, tuple[EgressRule, ...]]],
        default_table: str,
        file: str,
    ) -> None:
        self.regions = regions
        self.tables = tables
        self.default_table = default_table
        self.file = file

    def rules(self, cloud: str, table: str | None = None) -> tuple[EgressRule, ...]:
        return self._table(table).get(cloud, ())

    def _table(self, table: str | None) -> dict[str, tuple[EgressRule, ...]]:
        name = table or self.default_table
        if name not in self.tables:
            raise UserError(
                f"unknown egress table '{name}'", fix=f"use one of: {', '.join(self.tables)}"
            )
        return self.tables[name]

    def price(self, src: Location, dst: Location, table: str | None = None) -> EgressPrice:
        """$/GB for traffic from ``src`` to ``dst`` (region- or zone-level). Between two machines
        of one place (``src == dst``, a region too) the same-zone rule applies."""
        relation = "same_zone" if src == dst else self.regions.relation(src, dst).egress
        src_continent = self.regions.continent(src)
        dst_continent = self.regions.continent(dst)
        name = table or self.default_table
        rules = self._table(table).get(src.cloud)
        if rules is None:
            raise UserError(
                f"no egress prices for cloud '{src.cloud}' in table '{name}'",
                field=str(src),
                fix=f"add rules for {src.cloud} to configs/egress.yaml",
            )
        matching = [r for r in rules if r.matches(relation, src_continent, dst_continent)]
        if not matching:
            if relation == "same_zone":
                return EgressPrice(
                    str(src), str(dst), relation, 0.0, name, "same zone (free)", None
                )
            raise UserError(
                f"no egress rule of {src.cloud} matches {relation} from {src_continent} to {dst_continent}",
                fix=f"add a catch-all {relation} rule for {src.cloud} to configs/egress.yaml",
            )
        best = max(matching, key=lambda r: r.specificity)
        return EgressPrice(
            str(src), str(dst), relation, best.usd_per_gb, name, best.describe(), best.source
        )

    @classmethod
    def load(cls, path: Path, display: str, regions: Regions) -> EgressTable:
        doc = read_yaml(path, display)
        top = Entry(doc, ())
        sources = read_sources(doc, top)
        default_table = top.text("default_table")
        raw_tables = top.raw("tables")
        top.done()
        if not isinstance(raw_tables, dict) or default_table not in raw_tables:
            top.fail(
                ("default_table",),
                f"default_table '{default_table}' is not under tables:",
                "name one of the tables",
            )
        tables = {}
        for name, clouds in raw_tables.items():
            if not isinstance(clouds, dict):
                top.fail(("tables", name), "expected cloud: [rules] lines", "see the file's header")
            tables[name] = {
                cloud: _read_rules(doc, ("tables", name, cloud), sources, regions)
                for cloud in clouds
            }
            _check_coverage(doc, name, tables[name])
        return cls(regions, tables, default_table, display)


def _read_rules(
    doc: YamlDoc, path: tuple, sources: dict[str, Source], regions: Regions
) -> tuple[EgressRule, ...]:
    cloud = path[-1]
    if cloud not in regions.clouds():
        raise CatalogError(
            f"unknown cloud '{cloud}'",
            file=doc.file,
            line=doc.line(path),
            field=".".join(path),
            fix="use a cloud of configs/regions.yaml",
        )
    raw = doc.value
    for part in path:
        raw = raw[part]
    if not isinstance(raw, list):
        raise CatalogError(
            "expected a list of rules",
            file=doc.file,
            line=doc.line(path),
            field=".".join(path),
            fix="write - {relation: ..., usd_per_gb: ..., source: ...} items",
        )
    rules = []
    for index in range(len(raw)):
        entry = Entry(doc, path + (index,))
        relation = entry.text("relation")
        if relation not in EGRESS_RELATIONS:
            entry.fail(
                entry.path + ("relation",),
                f"unknown relation '{relation}'",
                f"use one of {', '.join(EGRESS_RELATIONS)}",
            )
        ends = []
        for key in ("from", "to"):
            value = entry.text(key, required=False) or ANY
            if value != ANY and value not in CONTINENTS:
                entry.fail(
                    entry.path + (key,),
                    f"unknown continent '{value}'",
                    f"use any or one of {', '.join(CONTINENTS)}",
                )
            ends.append(value)
        price = entry.number("usd_per_gb", strictly_positive=False)
        key = entry.text("source")
        if key not in sources:
            entry.fail(entry.path + ("source",), f"unknown source '{key}'", "add it under sources:")
        entry.done()
        rules.append(EgressRule(relation, ends[0], ends[1], price, sources[key]))
    return tuple(rules)


def _check_coverage(doc: YamlDoc, table: str, clouds: dict[str, tuple[EgressRule, ...]]) -> None:
    """Every relation but same_zone needs an answer for every continent pair."""
    for cloud, rules in clouds.items():
        for relation in EGRESS_RELATIONS[1:]:
            for src in CONTINENTS:
                for dst in CONTINENTS:
                    if relation == "inter_region" and src != dst:
                        continue
                    if not any(r.matches(relation, src, dst) for r in rules):
                        raise CatalogError(
                            f"no {relation} rule of {cloud} covers {src} -> {dst}",
                            file=doc.file,
                            line=doc.line(("tables", table, cloud)),
                            field=f"tables.{table}.{cloud}",
                            fix=f"add a catch-all rule: - {{relation: {relation}, usd_per_gb: ..., source: ...}}",
                        )
