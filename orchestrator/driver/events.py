"""The job's event log: one JSON object per line, appended as things happen.

Each line: ``time_s`` (Unix seconds), ``event`` (what happened: ``planned``, ``launched``,
``preemption_notice``, ``node_lost``, ``recovered``, ...), ``decision`` (what the driver did about
it), ``reason`` (why, for people), and optionally ``plan_before`` / ``plan_after`` (a plan's short
description) and ``details`` (event-specific figures with units in their names, e.g.
``recovery_s``). Lines are flushed and fsynced one by one, so a crash loses at most the line being
written; the reader skips a torn last line instead of failing.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass(frozen=True, kw_only=True)
class Event:
    event: str
    decision: str = ""
    reason: str = ""
    plan_before: str | None = None
    plan_after: str | None = None
    details: dict = field(default_factory=dict)
    time_s: float = field(default_factory=time.time)

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v not in (None, {}, "")}


class EventLog:
    """Append-only JSON lines at ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, event: Event) -> None:
        line = json.dumps(event.to_dict(), sort_keys=True, default=str)
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(line + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def read(self) -> list[dict]:
        return list(read_events(self.path))


def read_events(path: Path) -> Iterator[dict]:
    """The events in ``path``, oldest first; a torn line (a crash mid-write) is skipped."""
    if not path.exists():
        return
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and "event" in record:
                yield record
