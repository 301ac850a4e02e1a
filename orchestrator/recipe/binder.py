"""Fill frozen dataclasses from a parsed YAML document, strictly, with errors that point at lines.

Unknown keys ("did you mean ...?", or "belongs under training:"), missing required keys, wrong types
and unknown choices are RecipeErrors naming the file, line and field, with the field's ``help``
metadata as the "To fix" line. Only structure and types are checked here; values against each
other and against the catalog are checked in checks.py.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any, Literal, NoReturn, Union

from orchestrator.errors import RecipeError
from orchestrator.yamlsrc import Path_, YamlDoc, path_text

_TYPE_WORDS = {int: "a whole number", float: "a number", str: "text", bool: "true or false"}


def describe(value: Any) -> str:
    """How a YAML value reads to the user: ``'abc' (text)``, ``[1, 2] (a list)``."""
    if value is None:
        return "nothing (empty)"
    if isinstance(value, bool):
        return f"{str(value).lower()} (true/false)"
    if isinstance(value, dict):
        return "a mapping of keys"
    if isinstance(value, list):
        return f"{value!r} (a list)"
    if isinstance(value, str):
        return f"'{value}' (text)"
    return f"{value!r}"


class Binder:
    """Binds one document; ``root`` is the dataclass of the whole document."""

    def __init__(self, doc: YamlDoc, root: type) -> None:
        self.doc = doc
        self.root = root
        self._all_keys = _key_index(root)

    def fail(self, path: Path_, message: str, fix: str | None) -> NoReturn:
        raise RecipeError(
            message,
            file=self.doc.file,
            line=self.doc.line(path),
            field=path_text(path) or "(top level)",
            fix=fix,
        )

    def bind(self) -> Any:
        if self.doc.value is None:
            self.fail((), "the file is empty", "start from recipes/quickstart.yaml")
        return self.bind_dataclass(self.root, self.doc.value, ())

    def bind_dataclass(self, cls: type, value: Any, path: Path_) -> Any:
        fields = {f.name: f for f in dataclasses.fields(cls)}
        if not isinstance(value, dict):
            keys = ", ".join(fields)
            self.fail(
                path,
                f"expected a mapping with keys ({keys}), got {describe(value)}",
                f"write one 'key: value' per line, indented under {path_text(path) or 'the top level'}",
            )
        for key in value:
            if key not in fields:
                self._unknown_key(key, path, tuple(fields))
        hints = typing.get_type_hints(cls)
        kwargs = {}
        for name, spec in fields.items():
            help_text = spec.metadata.get("help")
            if name in value:
                kwargs[name] = self.bind_value(hints[name], value[name], path + (name,), help_text)
            elif (
                spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING
            ):
                where = f"under {path_text(path)}" if path else "at the top level"
                self.fail(
                    path, f"missing required key '{name}'", f"add '{name}:' {where}: {help_text}"
                )
        return cls(**kwargs)

    def _unknown_key(self, key: str, path: Path_, allowed: tuple[str, ...]) -> NoReturn:
        close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
        if close:
            self.fail(
                path + (key,),
                f"unknown key '{key}' (did you mean '{close[0]}'?)",
                f"rename it to '{close[0]}'",
            )
        elsewhere = [p for p in self._all_keys.get(key, ()) if p != path]
        if elsewhere:
            home = path_text(elsewhere[0]) or "the top level"
            self.fail(
                path + (key,),
                f"unknown key '{key}' here; it belongs under {home}",
                f"move '{key}' under {home}",
            )
        self.fail(path + (key,), f"unknown key '{key}'", f"use one of: {', '.join(allowed)}")

    def bind_value(self, hint: Any, value: Any, path: Path_, help_text: str | None) -> Any:
        origin, args = typing.get_origin(hint), typing.get_args(hint)
        if origin in (Union, types.UnionType):
            if value is None and type(None) in args:
                return None
            (inner,) = [a for a in args if a is not type(None)]
            return self.bind_value(inner, value, path, help_text)
        if dataclasses.is_dataclass(hint):
            return self.bind_dataclass(hint, value, path)
        if origin is Literal:
            return self._choice(args, value, path, help_text)
        if origin is tuple:
            return self._list(args[0], value, path, help_text)
        return self._scalar(hint, value, path, help_text)

    def _choice(
        self, choices: tuple[str, ...], value: Any, path: Path_, help_text: str | None
    ) -> str:
        if isinstance(value, str) and value in choices:
            return value
        close = (
            difflib.get_close_matches(str(value), choices, n=1, cutoff=0.5)
            if value is not None
            else []
        )
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        self.fail(
            path,
            f"{describe(value)} is not one of {', '.join(choices)}{hint}",
            f"write one of: {', '.join(choices)}",
        )

    def _list(self, item: Any, value: Any, path: Path_, help_text: str | None) -> tuple:
        if not isinstance(value, list):
            self.fail(
                path,
                f"expected a list, got {describe(value)}",
                help_text or "write a list in brackets, e.g. [1, 2]",
            )
        return tuple(self.bind_value(item, v, path + (i,), help_text) for i, v in enumerate(value))

    def _scalar(self, hint: type, value: Any, path: Path_, help_text: str | None) -> Any:
        ok = {
            bool: isinstance(value, bool),
            int: isinstance(value, int) and not isinstance(value, bool),
            float: isinstance(value, (int, float)) and not isinstance(value, bool),
            str: isinstance(value, str) and value.strip() != "",
        }
        assert hint in ok, f"unsupported field type {hint}"
        if not ok[hint]:
            got = "empty text" if value == "" else describe(value)
            self.fail(path, f"expected {_TYPE_WORDS[hint]}, got {got}", help_text)
        return float(value) if hint is float else value


def _key_index(root: type) -> dict[str, list[Path_]]:
    """Every key of the schema and the sections it may appear in."""
    index: dict[str, list[Path_]] = {}

    def walk(cls: type, path: Path_) -> None:
        hints = typing.get_type_hints(cls)
        for spec in dataclasses.fields(cls):
            index.setdefault(spec.name, []).append(path)
            hint = hints[spec.name]
            if dataclasses.is_dataclass(hint):
                walk(hint, path + (spec.name,))

    walk(root, ())
    return index
