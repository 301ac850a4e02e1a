"""A job's figures per committed step: one JSON line each in its ``metrics.jsonl``, and Ray
metrics (the dashboard, Prometheus)."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path

from orchestrator.driver.machine import StepResult
from orchestrator.driver.state import JobState

METRICS_FILE = "metrics.jsonl"


class StepMetrics:
    """Appends one JSON line per committed step to the job's metrics.jsonl."""

    def __init__(self, path: Path, batch: int) -> None:
        self.path, self.batch = path, batch
        self.last: tuple[float, float] | None = None  # (time, train_s) at the previous step

    def record(self, state: JobState, result: StepResult) -> dict:
        now = time.time()
        took = state.train_s - self.last[1] if self.last else 0.0
        self.last = (now, state.train_s)
        line = {
            "time_s": now,
            "step": state.step,
            "loss": _finite(result.loss),
            "samples_per_s": _finite(self.batch / took) if took > 0 else None,
            "usd_spent": _finite(state.compute_usd + state.egress_usd),
            "egress_bytes": _finite(state.egress_bytes),
            "nodes": len(state.nodes),
            "recoveries": state.recoveries,
        }
        if result.sample_ids is not None:
            line["samples"] = list(result.sample_ids)
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(line, allow_nan=False) + "\n")  # strict JSON: no NaN token
        return line


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


class DashboardMetrics:
    """The job's figures as Ray metrics (``ray.util.metrics``), so they show on the Ray dashboard
    and its Prometheus endpoint, tagged with the job's name. ``gauge`` makes one gauge (Ray's by
    default; tests give a fake)."""

    NAMES = {
        "samples_per_s": "samples per second over the last step",
        "loss": "training loss of the last step",
        "usd_spent": "dollars spent: compute + egress",
        "usd_per_hour": "dollars per hour of the nodes held",
        "egress_gb": "gigabytes sent across zone, region or cloud boundaries",
        "recoveries": "recoveries from lost nodes",
        "nodes": "nodes held",
    }

    def __init__(self, job: str, *, gauge: Callable | None = None) -> None:
        if gauge is None:
            from ray.util.metrics import Gauge as gauge
        self.tags = {"job": job}
        self.gauges = {
            name: gauge(f"geo_orchestrator_{name}", description=text, tag_keys=("job",))
            for name, text in self.NAMES.items()
        }

    def update(self, row: dict, *, usd_per_hour: float) -> None:
        values = {
            **{
                k: row.get(k) for k in ("samples_per_s", "loss", "usd_spent", "recoveries", "nodes")
            },
            "usd_per_hour": usd_per_hour,
            "egress_gb": row["egress_bytes"] / 1e9,
        }
        for name, value in values.items():
            if value is not None:
                self.gauges[name].set(value, tags=self.tags)
