"""Locations (SkyPilot infra strings), the regions of each cloud, and how two locations relate.

A location is ``cloud``, ``cloud/region`` or ``cloud/region/zone`` (``gcp/us-central1/us-central1-a``,
``local/sim-us/sim-us-a``). Which network default and which egress price apply between two places
follows from their relation: same zone, same region, same continent, another continent, another
cloud. Regions and their continents come from configs/regions.yaml.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path

from orchestrator.catalog.records import Entry, read_yaml
from orchestrator.errors import CatalogError, UserError

CONTINENTS = (
    "north_america",
    "south_america",
    "europe",
    "asia",
    "oceania",
    "middle_east",
    "africa",
)


@dataclass(frozen=True, order=True)
class Location:
    """A cloud, a region of it, or a zone of that region."""

    cloud: str
    region: str | None = None
    zone: str | None = None

    @classmethod
    def parse(cls, text: str) -> Location:
        """Parse ``cloud[/region[/zone]]``; raise ValueError saying what is wrong."""
        if not isinstance(text, str) or not text.strip():
            raise ValueError(
                "a location is written cloud[/region[/zone]], e.g. gcp/us-central1/us-central1-a"
            )
        parts = text.strip().strip("/").split("/")
        if len(parts) > 3 or any(not p for p in parts):
            raise ValueError(
                f"'{text}' is not cloud[/region[/zone]] (e.g. gcp, gcp/us-central1, gcp/us-central1/us-central1-a)"
            )
        cloud = parts[0].lower()
        region = parts[1] if len(parts) > 1 else None
        zone = parts[2] if len(parts) > 2 else None
        return cls(cloud, region, zone)

    @property
    def level(self) -> str:
        return "zone" if self.zone else "region" if self.region else "cloud"

    def region_location(self) -> Location:
        return Location(self.cloud, self.region)

    def covers(self, other: Location) -> bool:
        """True when ``other`` lies inside this location (a prefix match on cloud/region/zone)."""
        if self.cloud != other.cloud:
            return False
        if self.region is not None and self.region != other.region:
            return False
        return self.zone is None or self.zone == other.zone

    def __str__(self) -> str:
        return "/".join(p for p in (self.cloud, self.region, self.zone) if p)


@dataclass(frozen=True)
class Relation:
    """How two locations relate; both must be at least region-level."""

    same_cloud: bool
    same_continent: bool
    same_region: bool
    same_zone: bool  # false when either zone is unknown

    @property
    def network(self) -> str:
        """The key of configs/network/index.yaml relation_defaults that applies."""
        if not self.same_continent:
            return "other_continent"
        if not self.same_cloud:
            return "other_cloud"
        if not self.same_region:
            return "same_continent"
        return "same_zone" if self.same_zone else "same_region"

    @property
    def egress(self) -> str:
        """The relation that egress rules (configs/egress.yaml) are written for."""
        if not self.same_cloud:
            return "inter_cloud"
        if not self.same_continent:
            return "inter_continent"
        if not self.same_region:
            return "inter_region"
        return "same_zone" if self.same_zone else "inter_zone"


class Regions:
    """The clouds, their regions and continents (configs/regions.yaml)."""

    def __init__(
        self,
        continents: dict[str, dict[str, str]],
        *,
        as_of: str,
        zone_patterns: dict[str, str] | None = None,
    ) -> None:
        self._continents = continents
        self.as_of = as_of
        self._zone_patterns = zone_patterns or {}

    def zone_fits(self, location: Location) -> bool:
        """Whether the zone's name fits its cloud's naming pattern for that region."""
        pattern = self._zone_patterns.get(location.cloud)
        if pattern is None or location.zone is None or location.region is None:
            return False
        return (
            re.fullmatch(pattern.replace("{region}", re.escape(location.region)), location.zone)
            is not None
        )

    @classmethod
    def load(cls, path: Path, display: str) -> Regions:
        doc = read_yaml(path, display)
        top = Entry(doc, ())
        as_of = top.date("as_of")
        clouds_raw = top.raw("clouds")
        patterns = top.raw("zone_patterns", required=False) or {}
        top.done()
        if not isinstance(patterns, dict) or not all(isinstance(v, str) for v in patterns.values()):
            top.fail(
                ("zone_patterns",),
                "expected cloud: pattern lines",
                'write e.g. gcp: "{region}-[a-z]"',
            )
        if not isinstance(clouds_raw, dict) or not clouds_raw:
            raise CatalogError(
                "clouds must map each cloud to its regions",
                file=display,
                line=doc.line(("clouds",)),
                field="clouds",
                fix="see the file's header",
            )
        continents: dict[str, dict[str, str]] = {}
        for cloud, regions in clouds_raw.items():
            if not isinstance(regions, dict) or not regions:
                raise CatalogError(
                    "expected region: continent lines",
                    file=display,
                    line=doc.line(("clouds", cloud)),
                    field=f"clouds.{cloud}",
                    fix="write e.g. us-central1: north_america",
                )
            for region, continent in regions.items():
                if continent not in CONTINENTS:
                    raise CatalogError(
                        f"unknown continent {continent!r}",
                        file=display,
                        line=doc.line(("clouds", cloud, region)),
                        field=f"clouds.{cloud}.{region}",
                        fix=f"use one of: {', '.join(CONTINENTS)}",
                    )
            continents[cloud] = dict(regions)
        for cloud in patterns:
            if cloud not in continents:
                top.fail(
                    ("zone_patterns", cloud),
                    f"unknown cloud '{cloud}'",
                    "use a cloud listed under clouds:",
                )
        return cls(continents, as_of=as_of, zone_patterns=dict(patterns))

    def clouds(self) -> tuple[str, ...]:
        return tuple(sorted(self._continents))

    def regions(self, cloud: str) -> tuple[str, ...]:
        return tuple(sorted(self._continents.get(cloud, {})))

    def has_region(self, cloud: str, region: str) -> bool:
        return region in self._continents.get(cloud, {})

    def continent(self, location: Location) -> str:
        """Continent of a region-level or zone-level location known to the table."""
        assert location.region is not None, "a continent needs a region"
        try:
            return self._continents[location.cloud][location.region]
        except KeyError:
            raise UserError(
                f"unknown region '{location.region}' of cloud '{location.cloud}'",
                field=str(location),
                fix="use a region listed in configs/regions.yaml",
            ) from None

    def relation(self, a: Location, b: Location) -> Relation:
        for loc in (a, b):
            if loc.region is None:
                raise UserError(
                    f"'{loc}' names a whole cloud; network and egress need a region or a zone",
                    field=str(loc),
                    fix=f"write {loc.cloud}/<region>, e.g. {loc.cloud}/{_first(self.regions(loc.cloud))}",
                )
        same_region = a.cloud == b.cloud and a.region == b.region
        return Relation(
            same_cloud=a.cloud == b.cloud,
            same_continent=self.continent(a) == self.continent(b),
            same_region=same_region,
            same_zone=same_region and a.zone is not None and a.zone == b.zone,
        )

    def problem(
        self, location: Location, known_zones: frozenset[Location]
    ) -> tuple[str, str] | None:
        """Why ``location`` is not in the catalog, with a fix; None when it is."""
        if location.cloud not in self._continents:
            return _unknown("cloud", location.cloud, self.clouds())
        if location.region is None:
            return None
        if not self.has_region(location.cloud, location.region):
            return _unknown(
                f"region of {location.cloud}", location.region, self.regions(location.cloud)
            )
        if location.zone is None or location in known_zones or self.zone_fits(location):
            return None
        zones = sorted(
            z.zone for z in known_zones if z.region_location() == location.region_location()
        )
        kind = f"zone of {location.cloud}/{location.region}"
        if not zones and location.cloud in self._zone_patterns:
            pattern = self._zone_patterns[location.cloud].replace("{region}", location.region)
            return (
                f"unknown {kind} '{location.zone}'",
                f"zone names of {location.cloud} match {pattern}",
            )
        return _unknown(kind, location.zone, tuple(zones))


def _first(names: tuple[str, ...]) -> str:
    return names[0] if names else "<region>"


def _unknown(kind: str, name: str, known: tuple[str, ...]) -> tuple[str, str]:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    if close:
        return f"unknown {kind} '{name}' (did you mean '{close[0]}'?)", f"write '{close[0]}'"
    if not known:
        return (
            f"unknown {kind} '{name}'",
            "no such place is in the catalog; name the region instead",
        )
    listed = ", ".join(known[:12]) + (", ..." if len(known) > 12 else "")
    return f"unknown {kind} '{name}'", f"use one of: {listed}"
