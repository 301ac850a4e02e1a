"""Fill frozen dataclasses from a parsed YAML document, strictly, with errors that point at lines.

Unknown keys ("did you mean ...?", or "belongs under training:"), missing required keys, wrong types
and unknown choices are RecipeErrors naming the file, line and field, with the field's ``help``
metadata as the "To fix" line. Only structure and types are checked here; values against each
other and against the catalog are checked in checks.py.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, NoReturn, Union

from orchestrator.errors import RecipeError, together
from orchestrator.recipe.limits import MAX_LIST_ITEMS, MAX_TEXT_CHARS
from orchestrator.yamlsrc import Path_, YamlDoc, path_text

MAX_NUMBER = 1e15  # for a number field that names no maximum of its own (limits.py)
MAX_NAME_GUESS = 100  # characters of a bad choice compared with the choices
_TYPE_WORDS = {int: "a whole number", float: "a number", str: "text", bool: "true or false"}


MAX_SETTINGS = 64  # keys of a settings mapping (a model's arguments, a config's fields)


class Settings(tuple):
    """A mapping of names to plain values (numbers, text, true/false, null, lists of those) that
    the code reading it interprets (a model's arguments): ``((key, value), ...)``, hashable, as
    every recipe field is."""

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self}


def describe(value: Any) -> str:
    """How a YAML value reads to the user: ``'abc' (text)``, ``[1, 2] (a list)``; long values
    are cut, so that an error never echoes a megabyte back."""
    if value is None:
        return "nothing (empty)"
    if isinstance(value, bool):
        return f"{str(value).lower()} (true/false)"
    if isinstance(value, dict):
        return "a mapping of keys"
    if isinstance(value, list):
        return f"{_cut(repr(value))} (a list of {len(value):,})"
    if isinstance(value, str):
        return f"'{_cut(value)}' (text)"
    if isinstance(value, int):
        if abs(value) < 10**15:
            return f"{value:,}"
        return f"{float(value):g}" if abs(value) < 10**300 else "a number too large to show"
    return _cut(repr(value))


def _cut(text: str, most: int = 60) -> str:
    return text if len(text) <= most else f"{text[:most]}..."


def described(
    text: str,
    *,
    most: float | None = None,
    items: int | None = None,
    chars: int | None = None,
    **kwargs: Any,
) -> Any:
    """A dataclass field with its "what to write" (``help``, the "To fix" of its errors) and its
    limits (limits.py): ``most``, the largest number (of a list, each item's); ``items``, the longest
    list; ``chars``, the longest text."""
    limits = {"most": most, "items": items, "chars": chars}
    metadata = {"help": text, **{k: v for k, v in limits.items() if v is not None}}
    return dataclasses.field(metadata=metadata, **kwargs)


class Binder:
    """Binds one document; ``root`` is the dataclass of the whole document."""

    def __init__(self, doc: YamlDoc, root: type) -> None:
        self.doc = doc
        self.root = root
        self._all_keys = _key_index(root)
        # unknown keys found so far: binding goes on without them, so that every problem of the
        # document is reported in one pass (``bind`` raises them, with what else it finds)
        self._problems: list[RecipeError] = []

    def _error(self, path: Path_, message: str, fix: str | None) -> RecipeError:
        return RecipeError(
            message,
            file=self.doc.file,
            line=self.doc.line(path),
            field=_cut(path_text(path), 200) or "(top level)",
            fix=fix,
        )

    def fail(self, path: Path_, message: str, fix: str | None) -> NoReturn:
        """A problem that stops binding: raised after the unknown keys found before it."""
        raise together([*self.problems, self._error(path, message, fix)])

    @property
    def problems(self) -> list[RecipeError]:
        """The unknown keys found so far, in the order of their lines."""
        return sorted(self._problems, key=lambda p: p.line or 0)

    def bind(self) -> Any:
        """The document bound; RecipeError with every unknown key when there were any."""
        value = self.bind_partial()
        if self.problems:
            raise together(self.problems)
        return value

    def bind_partial(self) -> Any:
        """The document bound without its unknown keys (``problems`` lists them)."""
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
                self._problems.append(self._unknown_key(key, path, tuple(fields)))
        hints = typing.get_type_hints(cls)
        kwargs = {}
        for name, spec in fields.items():
            if name in value:
                kwargs[name] = self.bind_value(
                    hints[name], value[name], path + (name,), spec.metadata
                )
            elif (
                spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING
            ):
                where = f"under {path_text(path)}" if path else "at the top level"
                self.fail(
                    path,
                    f"missing required key '{name}'",
                    f"add '{name}:' {where}: {spec.metadata.get('help')}",
                )
        return cls(**kwargs)

    def _unknown_key(self, key: str, path: Path_, allowed: tuple[str, ...]) -> RecipeError:
        shown = _cut(key)
        guessable = len(key) <= MAX_NAME_GUESS  # difflib's time grows with the square of it
        close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6) if guessable else []
        if close:
            return self._error(
                path + (key,),
                f"unknown key '{shown}' (did you mean '{close[0]}'?)",
                f"rename it to '{close[0]}'",
            )
        elsewhere = [p for p in self._all_keys.get(key, ()) if p != path]
        if elsewhere:
            home = path_text(elsewhere[0]) or "the top level"
            return self._error(
                path + (key,),
                f"unknown key '{shown}' here; it belongs under {home}",
                f"move '{shown}' under {home}",
            )
        return self._error(
            path + (key,), f"unknown key '{shown}'", f"use one of: {', '.join(allowed)}"
        )

    def bind_value(self, hint: Any, value: Any, path: Path_, meta: Mapping[str, Any]) -> Any:
        """``value`` as ``hint``; ``meta`` is the field's metadata: its help and its limits."""
        origin, args = typing.get_origin(hint), typing.get_args(hint)
        if origin in (Union, types.UnionType):
            if value is None and type(None) in args:
                return None
            (inner,) = [a for a in args if a is not type(None)]
            return self.bind_value(inner, value, path, meta)
        if dataclasses.is_dataclass(hint):
            return self.bind_dataclass(hint, value, path)
        if hint is Settings:
            return self._settings(value, path, meta)
        if origin is Literal:
            return self._choice(args, value, path)
        if origin is tuple:
            return self._list(args[0], value, path, meta)
        return self._scalar(hint, value, path, meta)

    def _settings(self, value: Any, path: Path_, meta: Mapping[str, Any]) -> Settings:
        help_text = meta.get("help")
        if not isinstance(value, dict):
            self.fail(
                path, f"expected a mapping of names to values, got {describe(value)}", help_text
            )
        if len(value) > MAX_SETTINGS:
            self.fail(path, f"{len(value):,} keys; at most {MAX_SETTINGS} are allowed", help_text)
        pairs = []
        for key, item in value.items():
            if not isinstance(key, str) or not key.isidentifier():
                self.fail(path, f"key {describe(key)} is not a name", "write names such as n_layer")
            plain = (bool, int, float, str, type(None))
            if isinstance(item, list) and all(isinstance(i, plain) for i in item):
                item = tuple(item[:MAX_LIST_ITEMS])
            elif not isinstance(item, plain):
                self.fail(
                    path + (key,),
                    f"expected a number, text, true/false, null or a list of those, got "
                    f"{describe(item)}",
                    help_text,
                )
            if isinstance(item, str):
                self._check_text(item, path + (key,), meta)
            pairs.append((key, item))
        return Settings(pairs)

    def _choice(self, choices: tuple[str, ...], value: Any, path: Path_) -> str:
        if isinstance(value, str) and value in choices:
            return value
        close = (
            difflib.get_close_matches(str(value)[:MAX_NAME_GUESS], choices, n=1, cutoff=0.5)
            if value is not None
            else []
        )
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        self.fail(
            path,
            f"{describe(value)} is not one of {', '.join(choices)}{hint}",
            f"write one of: {', '.join(choices)}",
        )

    def _list(self, item: Any, value: Any, path: Path_, meta: Mapping[str, Any]) -> tuple:
        help_text = meta.get("help")
        if not isinstance(value, list):
            self.fail(
                path,
                f"expected a list, got {describe(value)}",
                help_text or "write a list in brackets, e.g. [1, 2]",
            )
        most = meta.get("items", MAX_LIST_ITEMS)
        if len(value) > most:  # before binding a long list item by item
            self.fail(
                path,
                f"the list has {len(value):,} items; at most {most:,} are allowed",
                help_text or f"list at most {most:,} items",
            )
        return tuple(self.bind_value(item, v, path + (i,), meta) for i, v in enumerate(value))

    def _scalar(self, hint: type, value: Any, path: Path_, meta: Mapping[str, Any]) -> Any:
        ok = {
            bool: isinstance(value, bool),
            int: isinstance(value, int) and not isinstance(value, bool),
            float: isinstance(value, (int, float)) and not isinstance(value, bool),
            str: isinstance(value, str) and value.strip() != "",
        }
        assert hint in ok, f"unsupported field type {hint}"
        if not ok[hint]:
            got = "empty text" if value == "" else describe(value)
            self.fail(path, f"expected {_TYPE_WORDS[hint]}, got {got}", meta.get("help"))
        if hint is str:
            self._check_text(value, path, meta)
        elif hint is not bool:
            self._check_number(value, path, meta)
        return float(value) if hint is float else value

    def _check_number(self, value: float, path: Path_, meta: Mapping[str, Any]) -> None:
        if isinstance(value, float) and not math.isfinite(value):
            self.fail(path, f"must be a finite number, got {value}", meta.get("help"))
        most = meta.get("most", MAX_NUMBER)
        if value > most or value < -MAX_NUMBER:  # no field takes a negative number that large
            self.fail(
                path,
                f"must be at most {_number_text(most)}, got {_number_text(value)}",
                f"{meta.get('help')}; at most {_number_text(most)}",
            )

    def _check_text(self, value: str, path: Path_, meta: Mapping[str, Any]) -> None:
        most = meta.get("chars", MAX_TEXT_CHARS)
        if len(value) > most:
            self.fail(
                path,
                f"the text has {len(value):,} characters; at most {most:,} are allowed",
                meta.get("help"),
            )


def _number_text(value: float) -> str:
    """A number for a message: a 30-digit whole number is shown as 1e+30."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        value = int(value)
    return describe(value) if isinstance(value, int) else f"{value:g}"


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
