"""Printing for the CLI: aligned text tables for people, one JSON document for programs."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from typing import Any, TextIO


def format_cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value != 0 and abs(value) < 0.001:
            return f"{value:.3g}"
        return f"{value:,.4f}".rstrip("0").rstrip(".") if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Columns padded to their widest cell; numbers right-aligned, text left-aligned."""
    cells = [[format_cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    numeric = [
        all(isinstance(row[i], (int, float)) or row[i] is None for row in rows) and bool(rows)
        for i in range(len(headers))
    ]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ]
        return "  ".join(parts).rstrip()

    out = [line(headers), line(["-" * w for w in widths])]
    out.extend(line(row) for row in cells)
    return "\n".join(out)


def print_json(document: Any, stream: TextIO | None = None) -> None:
    json.dump(document, stream or sys.stdout, indent=2, sort_keys=False)
    (stream or sys.stdout).write("\n")


# a source path in parentheses, alone or leading ("(orchestrator/driver/machine.py)",
# "(provisioners/bootstrap/joined.py; ...)"): for readers of the code, not of --help
_SOURCE_NOTE = re.compile(r" ?\((?:[\w./-]+\.(?:py|sh|md))(?:[;,] ?([^()]*))?\)")
_TRAILING_SOURCE = re.compile(r"[;,] ?[\w./-]+/[\w.-]+\.(?:py|sh|md)(?=\))")  # "(...; a/b.py)"


def help_text(docstring: str) -> str:
    """A module docstring as a command's ``--help`` text: no reST double backticks, no source
    paths (a parenthesis that only names a file goes; one that says more keeps the rest)."""

    def keep_rest(match: re.Match) -> str:
        rest = match.group(1)
        return f" ({rest})" if rest else ""

    text = _SOURCE_NOTE.sub(keep_rest, docstring.replace("``", ""))
    text = _TRAILING_SOURCE.sub("", text)
    return text.strip()


def printable(value: object) -> object:
    """Text with its control characters (escape sequences, carriage returns) written as escapes,
    so that what a file holds cannot drive the terminal; other values as they are."""
    if not isinstance(value, str) or value.isprintable() or _only_newlines(value):
        return value
    return "".join(
        c if c.isprintable() or c == "\n" else c.encode("unicode_escape").decode("ascii")
        for c in value
    )


def _only_newlines(text: str) -> bool:
    return text.replace("\n", "").isprintable()
