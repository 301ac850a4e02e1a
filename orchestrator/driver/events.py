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
from typing import BinaryIO

MAX_LINE_BYTES = 1024 * 1024  # an event is a few hundred bytes; a longer line is not one
# the times a calendar (datetime) can show: 1970 to the end of year 9999
EARLIEST_S, LATEST_S = 0.0, 253_402_300_799.0


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
    """The events in ``path``, oldest first. A line that is not one event is skipped: a torn line
    (a crash mid-write), bytes that are not UTF-8, a line longer than ``MAX_LINE_BYTES``, JSON that
    is not an object, or an object whose ``event``, ``time_s`` or ``details`` has the wrong type."""
    if not path.is_file():  # missing, or a folder or FIFO (never opened: it could block)
        return
    with path.open("rb") as handle:
        while line := handle.readline(MAX_LINE_BYTES + 1):
            if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                _skip_rest_of_line(handle)
                continue
            record = _parse(line)
            if record is not None:
                yield record


class LogTail:
    """The records appended to a JSON-lines log since the last ``read()``: complete lines only
    (a line being written is read once it ends), from the log's end at creation (``from_start``:
    from its first line). ``parse`` turns one line into a record or None (skipped)."""

    READ_BYTES = 16 * 1024 * 1024  # at most this much per read: a follower catches up in steps

    def __init__(self, path: Path, *, from_start: bool = False, parse=None) -> None:
        self.path, self.parse = path, parse or _parse
        self.offset = 0 if from_start or not path.is_file() else path.stat().st_size

    def read(self) -> list[dict]:
        if not self.path.is_file():
            return []
        with self.path.open("rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            if size < self.offset:  # the log was replaced: read the new one from its start
                self.offset = 0
            handle.seek(self.offset)
            data = handle.read(min(size - self.offset, self.READ_BYTES))
        end = data.rfind(b"\n") + 1  # the rest is a line still being written
        self.offset += end
        lines = data[:end].splitlines()
        return [r for line in lines if len(line) <= MAX_LINE_BYTES and (r := self.parse(line))]


def _parse(line: bytes) -> dict | None:
    try:
        record = json.loads(line.decode("utf-8"))
    except (ValueError, RecursionError):  # not UTF-8, not JSON, an integer of 5,000 digits
        return None
    return record if _is_event(record) else None


def _is_event(record: object) -> bool:
    """An event as ``Event.to_dict`` writes it, its time one that a calendar can show."""
    if not isinstance(record, dict) or not isinstance(record.get("event"), str):
        return False
    time_s = record.get("time_s")
    if isinstance(time_s, bool) or not isinstance(time_s, (int, float)):
        return False
    if not EARLIEST_S <= time_s <= LATEST_S:  # also false for NaN
        return False
    texts = ("decision", "reason", "plan_before", "plan_after")
    if any(not isinstance(record.get(k, ""), str | None) for k in texts):
        return False
    return isinstance(record.get("details", {}), dict)


def _skip_rest_of_line(handle: BinaryIO) -> None:
    while (chunk := handle.readline(MAX_LINE_BYTES)) and not chunk.endswith(b"\n"):
        pass
