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

    def catch_up(self, state: JobState) -> int:
        """Write the rows of steps the saved state committed but the file lacks: a driver that
        died between saving a step and writing its row (its node preempted) is restarted, and
        its row would otherwise be missing for good. Such a row has the step's loss and the
        state's figures; its rate is not known. Returns the number of rows written."""
        written = _last_step(self.path)
        # the state keeps one loss per committed step (cut back too when it rolls back)
        rows = [
            self._line(state, step=step, loss=loss, took_s=0.0)
            for step, loss in enumerate(state.losses[written : state.step], start=written + 1)
        ]
        self._append(rows)
        return len(rows)

    def record(self, state: JobState, result: StepResult) -> dict:
        now = time.time()
        took = state.train_s - self.last[1] if self.last else 0.0
        self.last = (now, state.train_s)
        line = self._line(state, step=state.step, loss=result.loss, took_s=took, now_s=now)
        if result.sample_ids is not None:
            line["samples"] = list(result.sample_ids)
        self._append([line])
        return line

    def _line(
        self, state: JobState, *, step: int, loss: float, took_s: float, now_s: float | None = None
    ) -> dict:
        return {
            "time_s": state.updated_at_s if now_s is None else now_s,
            "step": step,
            "loss": _finite(loss),
            "samples_per_s": _finite(self.batch / took_s) if took_s > 0 else None,
            "usd_spent": _finite(state.compute_usd + state.egress_usd),
            "egress_bytes": _finite(state.egress_bytes),
            "nodes": len(state.nodes),
            "recoveries": state.recoveries,
        }

    def _append(self, lines: list[dict]) -> None:
        if not lines:
            return
        # a row cut short by a death mid-write is ended first; strict JSON: no NaN token
        text = "".join(json.dumps(line, allow_nan=False) + "\n" for line in lines)
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(("\n" if _cut_short(self.path) else "") + text)


def read_rows(path: Path) -> list[dict]:
    """The file's whole rows (a row cut short by a death mid-write is left out)."""
    if not path.exists():
        return []
    rows = []
    with path.open(encoding="utf-8") as handle:
        for text in handle:
            try:
                row = json.loads(text)
            except ValueError:
                continue
            if isinstance(row, dict) and isinstance(row.get("step"), int):
                rows.append(row)
    return rows


def parse_row(line: bytes) -> dict | None:
    """One line of the file as a row, or None (not a row: cut short, not JSON)."""
    try:
        row = json.loads(line.decode("utf-8"))
    except (ValueError, RecursionError):
        return None
    return row if isinstance(row, dict) and isinstance(row.get("step"), int) else None


def _cut_short(path: Path) -> bool:
    if not path.exists() or path.stat().st_size == 0:
        return False
    with path.open("rb") as handle:
        handle.seek(-1, 2)
        return handle.read(1) != b"\n"


def _last_step(path: Path) -> int:
    """The step of the file's last whole row (0: none)."""
    rows = read_rows(path)
    return rows[-1]["step"] if rows else 0


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
