"""Market traces for the local cloud: capacity and spot price per offer over market time.

Our format (CSV; a blank cell keeps the previous value):

    time_s,infra,gpu,available_count,spot_usd_per_hour
    0,local/sim-us/sim-us-a,T4,4,0.18
    600,local/sim-us/sim-us-a,T4,1,

Readers for SAILOR's published availability traces (../shared/data/sailor/traces/, MIT):

- the wide CSV (``,Timestamp,A100-40_us-central1-a,...``): GPUs available per GPU type and GCP
  zone at Unix timestamps; ``places`` maps each zone to a local infra, and counts of GPUs become
  counts of nodes with ``gpus_per_node``;
- the JSON list ``[{"Time": s, "GPUs": n}, ...]``: one series, applied to one (infra, gpu).
"""

from __future__ import annotations

import bisect
import csv
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

TRACE_COLUMNS = ("time_s", "infra", "gpu", "available_count", "spot_usd_per_hour")
# SAILOR names GPUs with their memory: A100-40, A100-80, V100-16
SAILOR_GPUS = {"A100-40": "A100", "A100-80": "A100-80GB", "V100-16": "V100", "V100-32": "V100-32GB"}


class TraceError(ValueError):
    """A trace file is malformed: names the file, the line and what to write."""

    def __init__(self, path: Path, line: int, problem: str, fix: str) -> None:
        super().__init__(f"{path}:{line}: {problem}\n  To fix: {fix}")


@dataclass(frozen=True)
class TracePoint:
    time_s: float
    available_count: int | None
    spot_usd_per_hour: float | None


class Trace:
    """Per (infra, gpu), the market's state from each point's time until the next."""

    def __init__(self, series: Mapping[tuple[str, str], list[TracePoint]]) -> None:
        self._series = {
            key: sorted(points, key=lambda p: p.time_s) for key, points in series.items()
        }
        self._times = {key: [p.time_s for p in points] for key, points in self._series.items()}

    def keys(self) -> list[tuple[str, str]]:
        return sorted(self._series)

    def at(self, infra: str, gpu: str, time_s: float) -> TracePoint | None:
        """The state of (infra, gpu) at ``time_s``; None before its first point or if untraced."""
        times = self._times.get((infra, gpu))
        if not times:
            return None
        i = bisect.bisect_right(times, time_s) - 1
        return self._series[(infra, gpu)][i] if i >= 0 else None

    def next_time_after(self, time_s: float) -> float | None:
        later = [
            t[i] for t in self._times.values() if (i := bisect.bisect_right(t, time_s)) < len(t)
        ]
        return min(later, default=None)


def read_trace(path: Path) -> Trace:
    """A trace in our CSV format."""
    series: dict[tuple[str, str], list[TracePoint]] = {}
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        if tuple(reader.fieldnames or ()) != TRACE_COLUMNS:
            raise TraceError(
                path, 1, f"header is {reader.fieldnames}", f"write: {','.join(TRACE_COLUMNS)}"
            )
        for line, row in enumerate(reader, start=2):
            key = (row["infra"], row["gpu"])
            if not key[0].startswith("local/") or not key[1]:
                raise TraceError(
                    path, line, f"infra {key[0]!r}, gpu {key[1]!r}", "name a local place and a GPU"
                )
            previous = series.get(key, [TracePoint(0.0, None, None)])[-1]
            try:
                point = TracePoint(
                    float(row["time_s"]),
                    int(row["available_count"])
                    if row["available_count"]
                    else previous.available_count,
                    float(row["spot_usd_per_hour"])
                    if row["spot_usd_per_hour"]
                    else previous.spot_usd_per_hour,
                )
            except ValueError as error:
                raise TraceError(
                    path,
                    line,
                    str(error),
                    "write numbers; leave a cell blank to keep the last value",
                ) from None
            series.setdefault(key, []).append(point)
    return Trace(series)


def read_sailor_csv(path: Path, *, places: Mapping[str, str], gpus_per_node: int = 1) -> Trace:
    """SAILOR's wide CSV; ``places`` maps its GCP zones (``us-central1-a``) to local infras."""
    series: dict[tuple[str, str], list[TracePoint]] = {}
    with path.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.reader(handle))
    header, start = rows[0], None
    columns = []
    for column in header[2:]:
        gpu_name, _, zone = column.partition("_")
        if gpu_name not in SAILOR_GPUS or zone not in places:
            raise TraceError(
                path,
                1,
                f"column {column!r}",
                f"map zone {zone!r} in places and use one of {sorted(SAILOR_GPUS)}",
            )
        columns.append((places[zone], SAILOR_GPUS[gpu_name]))
    for row in rows[1:]:
        stamp = float(row[1])
        start = stamp if start is None else start
        for (infra, gpu), cell in zip(columns, row[2:], strict=True):
            nodes = int(float(cell)) // gpus_per_node
            series.setdefault((infra, gpu), []).append(TracePoint(stamp - start, nodes, None))
    return Trace(series)


def read_sailor_json(path: Path, *, infra: str, gpu: str, gpus_per_node: int = 1) -> Trace:
    """SAILOR's ``[{"Time": s, "GPUs": n}, ...]`` as the capacity of one offer."""
    points = [
        TracePoint(float(item["Time"]), int(item["GPUs"]) // gpus_per_node, None)
        for item in json.loads(path.read_text(encoding="utf-8"))
    ]
    return Trace({(infra, gpu): points})
