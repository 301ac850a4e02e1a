"""Strict readers for config entries: a YAML mapping or a CSV row, field by field.

Each reader knows the file and the line of the entry, so a bad value is reported as
``configs/gpus.yaml:41: gpus[3].memory_gib: ...`` or ``configs/prices/offers.csv:17: spot_usd_per_hour:
...``. Unknown keys are errors: a misspelt column or key must not be silently ignored.
"""

from __future__ import annotations

import csv
import datetime as dt
import difflib
import io
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from orchestrator.errors import CatalogError
from orchestrator.yamlsrc import (
    MIB,
    Path_,
    YamlDoc,
    YamlSyntaxError,
    load_yaml_file,
    path_text,
    read_user_text,
)

MAX_CSV_BYTES = 16 * MIB  # the packaged snapshot of every cloud's offers is 0.1 MiB
ROW_NUMBER_MAX = 1e9  # no price, count or size in a config row comes near; keeps sums finite


def display_path(path: Path, configs_dir: Path) -> str:
    """``configs/gpus.yaml`` for files under the configs folder, the full path otherwise."""
    try:
        return str(Path("configs") / path.resolve().relative_to(configs_dir.resolve()))
    except ValueError:
        return str(path)


def read_yaml(path: Path, display: str) -> YamlDoc:
    """Parse a config YAML file, turning syntax errors and missing files into CatalogError."""
    try:
        return load_yaml_file(path, display=display, error=CatalogError)
    except YamlSyntaxError as exc:
        raise CatalogError(
            exc.message, file=display, line=exc.line, fix="correct the YAML"
        ) from None


class Entry:
    """One mapping in a YAML config file, read strictly: call ``done()`` after the last field."""

    def __init__(self, doc: YamlDoc, path: Path_, label: str | None = None) -> None:
        self.doc = doc
        self.path = path
        self.label = label
        value = self._lookup(path)
        if not isinstance(value, dict):
            self.fail(
                path,
                f"expected a mapping of keys, got {type(value).__name__}",
                "write key: value lines",
            )
        self.value: dict[str, Any] = value
        self.used: set[str] = set()

    def _lookup(self, path: Path_) -> Any:
        value = self.doc.value
        for part in path:
            value = value[part]
        return value

    def fail(self, path: Path_, message: str, fix: str) -> NoReturn:
        field = path_text(path) + (f" ({self.label})" if self.label else "")
        raise CatalogError(
            message, file=self.doc.file, line=self.doc.line(path), field=field, fix=fix
        )

    def raw(self, key: str, *, required: bool = True) -> Any:
        self.used.add(key)
        if key not in self.value:
            if required:
                typo = difflib.get_close_matches(
                    key, [k for k in self.value if k not in self.used], n=1
                )
                if typo:
                    self.fail(
                        self.path + (typo[0],),
                        f"unknown key '{typo[0]}' (did you mean '{key}'?)",
                        f"rename it to '{key}'",
                    )
                self.fail(self.path, f"missing key '{key}'", f"add '{key}:' to this entry")
            return None
        return self.value[key]

    def text(self, key: str, *, required: bool = True) -> str | None:
        value = self.raw(key, required=required)
        if value is None and not required:
            return None
        if not isinstance(value, str) or not value.strip():
            self.fail(
                self.path + (key,), f"expected text, got {value!r}", f"write a non-empty {key}"
            )
        return value

    def number(
        self,
        key: str,
        *,
        required: bool = True,
        nullable: bool = False,
        minimum: float = 0.0,
        strictly_positive: bool = True,
    ) -> float | None:
        value = self.raw(key, required=required)
        if value is None and (nullable or not required):
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(
                self.path + (key,), f"expected a number, got {value!r}", f"write {key} as a number"
            )
        bad = value <= minimum if strictly_positive else value < minimum
        if bad:
            relation = ">" if strictly_positive else ">="
            self.fail(
                self.path + (key,), f"must be {relation} {minimum:g}, got {value}", f"correct {key}"
            )
        return float(value)

    def texts(self, key: str, *, required: bool = False) -> tuple[str, ...]:
        value = self.raw(key, required=required)
        if value is None:
            return ()
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            self.fail(
                self.path + (key,),
                f"expected a list of names, got {value!r}",
                f"write {key}: [a, b]",
            )
        return tuple(value)

    def date(self, key: str) -> str:
        value = self.raw(key)
        if isinstance(value, dt.date):
            return value.isoformat()
        if not isinstance(value, str) or not _is_date(value):
            self.fail(
                self.path + (key,),
                f"expected a date YYYY-MM-DD, got {value!r}",
                "write the date as YYYY-MM-DD",
            )
        return value

    def done(self) -> None:
        """Reject keys that no reader asked for."""
        for key in self.value:
            if key not in self.used:
                hint = difflib.get_close_matches(key, sorted(self.used), n=1)
                if hint:
                    self.fail(
                        self.path + (key,),
                        f"unknown key '{key}' (did you mean '{hint[0]}'?)",
                        f"rename it to '{hint[0]}'",
                    )
                self.fail(
                    self.path + (key,),
                    f"unknown key '{key}'",
                    f"use one of: {', '.join(sorted(self.used))}",
                )


@dataclass(frozen=True, kw_only=True)
class Source:
    """Where figures come from: a document and its date."""

    key: str
    title: str
    url: str
    as_of: str
    note: str | None = None

    def to_json(self) -> dict:
        return {"title": self.title, "url": self.url, "as_of": self.as_of}


def read_sources(doc: YamlDoc, top: Entry) -> dict[str, Source]:
    raw = top.raw("sources")
    if not isinstance(raw, dict) or not raw:
        top.fail(
            ("sources",), "expected a mapping of source keys", "list each document under sources:"
        )
    """Read the `sources:` mapping that every config file keeps: key -> title, url, as_of, note."""
    sources = {}
    for key in raw:
        entry = Entry(doc, ("sources", key), label=key)
        sources[key] = Source(
            key=key,
            title=entry.text("title"),
            url=entry.text("url"),
            as_of=entry.date("as_of"),
            note=entry.text("note", required=False),
        )
        entry.done()
    return sources


def _is_date(text: str) -> bool:
    try:
        dt.date.fromisoformat(text)
    except ValueError:
        return False
    return True


class Row:
    """One CSV row, read strictly; ``line`` is the row's line in the file (header is line 1)."""

    def __init__(self, values: dict[str, str], *, file: str, line: int, label: str = "") -> None:
        self.values = values
        self.file = file
        self.line = line
        self.label = label

    def fail(self, column: str, message: str, fix: str) -> NoReturn:
        field = f"{column} ({self.label})" if self.label else column
        raise CatalogError(message, file=self.file, line=self.line, field=field, fix=fix)

    def text(self, column: str, *, required: bool = True) -> str | None:
        value = self.values[column].strip()
        if not value:
            if required:
                self.fail(column, "is empty", f"fill in {column}")
            return None
        return value

    def number(
        self,
        column: str,
        *,
        required: bool = True,
        integer: bool = False,
        strictly_positive: bool = True,
        most: float = ROW_NUMBER_MAX,
    ) -> float | None:
        text = self.text(column, required=required)
        if text is None:
            return None
        kind = "a whole number" if integer else "a number"
        try:
            value = int(text) if integer else float(text)
        except ValueError:  # also an integer of more digits than Python converts
            self.fail(column, f"{_short_repr(text, 40)} is not {kind}", f"write {column} as {kind}")
        if not math.isfinite(value):
            self.fail(column, f"must be a finite number, got {text}", f"write {column} as {kind}")
        if value < 0 or (strictly_positive and value == 0):
            relation = "> 0" if strictly_positive else ">= 0"
            self.fail(column, f"must be {relation}, got {text}", f"correct {column}")
        if value > most:
            self.fail(
                column,
                f"must be at most {most:,g}, got {_short_repr(text, 40)}",
                f"correct {column}",
            )
        return value

    def date(self, column: str) -> str:
        text = self.text(column)
        if not _is_date(text):
            self.fail(
                column, f"expected a date YYYY-MM-DD, got {text!r}", "write the date as YYYY-MM-DD"
            )
        return text

    def date_or_time(self, column: str) -> str:
        """A date (YYYY-MM-DD) or a UTC time (YYYY-MM-DDTHH:MM:SSZ, as live snapshots write)."""
        text = self.text(column)
        if not (_is_date(text) or _is_utc_time(text)):
            self.fail(
                column,
                f"expected YYYY-MM-DD or YYYY-MM-DDTHH:MM:SSZ, got {text!r}",
                "write the date, or the UTC time the price was observed",
            )
        return text


def _short_repr(value: object, most: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= most else f"{text[:most]}..."


def _is_utc_time(text: str) -> bool:
    try:
        dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return False
    return True


def read_csv_rows(path: Path, display: str, columns: tuple[str, ...]) -> Iterator[Row]:
    """Yield the rows of a CSV whose header must be exactly ``columns``."""
    text = read_user_text(
        path,
        max_bytes=MAX_CSV_BYTES,
        error=CatalogError,
        display=display,
        fix="check the path; offers files are CSV",
    )
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        yield from _rows(reader, display, columns)
    except csv.Error as exc:  # a NUL byte, a field over the csv module's limit
        raise CatalogError(
            f"not CSV: {exc}", file=display, line=reader.line_num, fix="save the file as plain CSV"
        ) from None


def _rows(reader, display: str, columns: tuple[str, ...]) -> Iterator[Row]:
    header = next(reader, None)
    if header is None or tuple(h.strip() for h in header) != columns:
        raise CatalogError(
            f"header is {_short_repr(header)}",
            file=display,
            line=1,
            fix=f"the first line must be exactly: {','.join(columns)}",
        )
    for values in reader:
        line = reader.line_num
        if not values or all(not v.strip() for v in values):
            continue
        if len(values) != len(columns):
            raise CatalogError(
                f"has {len(values)} fields, expected {len(columns)}",
                file=display,
                line=line,
                fix="quote fields that contain commas; one value per column",
            )
        yield Row(dict(zip(columns, values, strict=True)), file=display, line=line)
