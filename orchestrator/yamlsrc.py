"""Load YAML into plain Python values and remember the line of every key and list item.

Recipes, plans and config files are parsed from YAML nodes rather than ``yaml.safe_load`` so that an
error can say on which line the bad value is. Duplicate keys are errors (PyYAML keeps the last one
silently), and an unquoted number in exponent form (``3e-4``, ``2.0e9``), which YAML 1.1 reads as text
unless written ``2.0e+9``, is read as a float as the user meant.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

Path_ = tuple[str | int, ...]  # a position in the document: keys and list indices from the root

# YAML 1.1 reads 3e-4 and 2.0e9 as text (it wants a dot and a signed exponent: 2.0e+9)
_EXPONENT_FLOAT = re.compile(r"^[-+]?(\d+(\.\d*)?|\.\d+)[eE][-+]?\d+$")


class YamlSyntaxError(Exception):
    """The text is not valid YAML, or has a duplicate key; ``line`` is 1-based."""

    def __init__(self, message: str, line: int | None) -> None:
        super().__init__(message)
        self.message = message
        self.line = line


@dataclass(frozen=True)
class YamlDoc:
    """A parsed document: its plain value and the 1-based line of each position in it."""

    value: Any
    lines: dict[Path_, int]
    file: str

    def line(self, path: Path_) -> int | None:
        """Line of ``path``, or of its nearest ancestor that has one."""
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return self.lines.get(())


def load_yaml_text(text: str, *, file: str) -> YamlDoc:
    """Parse one YAML document; raise YamlSyntaxError with a line on malformed input."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        raise YamlSyntaxError(_describe_yaml_error(exc), line) from None
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        raise YamlSyntaxError(
            f"not valid YAML: character #x{exc.character:04x} is not allowed", line
        ) from None
    except yaml.YAMLError as exc:
        raise YamlSyntaxError(f"not valid YAML: {exc}", 1) from None
    if node is None:
        return YamlDoc(value=None, lines={(): 1}, file=file)
    builder = _Builder()
    builder.lines[()] = node.start_mark.line + 1
    value = builder.value(node, ())
    return YamlDoc(value=value, lines=builder.lines, file=file)


def load_yaml_file(path: Path, *, display: str | None = None) -> YamlDoc:
    """Read and parse ``path``; ``display`` is the name errors show (defaults to the path)."""
    text = path.read_text(encoding="utf-8")
    return load_yaml_text(text, file=display or str(path))


def _describe_yaml_error(exc: yaml.MarkedYAMLError) -> str:
    problem = exc.problem or "malformed YAML"
    if "found character '\\t'" in problem or "\t" in str(exc.problem_mark or ""):
        return "not valid YAML: a tab character; YAML indents with spaces only"
    if exc.context:
        return f"not valid YAML: {exc.context}, {problem}"
    return f"not valid YAML: {problem}"


class _Builder:
    """Turns one composed node tree into plain values, recording lines; one per document."""

    def __init__(self) -> None:
        # Only the loader's constructor is used, to type scalars exactly as yaml.safe_load would.
        self._loader = yaml.SafeLoader("")
        self.lines: dict[Path_, int] = {}

    def scalar(self, node: yaml.ScalarNode) -> Any:
        try:
            value = self._loader.construct_object(node, deep=True)
        except (yaml.YAMLError, ValueError, TypeError, OverflowError):
            # e.g. an explicit tag that does not fit its text: `!!int forty`, `!!binary x`
            raise YamlSyntaxError(
                f"cannot read the value '{node.value}' as {node.tag.rsplit(':', 1)[-1]}",
                node.start_mark.line + 1,
            ) from None
        if isinstance(value, str) and node.style is None and _EXPONENT_FLOAT.match(value):
            return float(value)
        return value

    def value(self, node: yaml.Node, path: Path_) -> Any:
        if isinstance(node, yaml.ScalarNode):
            return self.scalar(node)
        if isinstance(node, yaml.SequenceNode):
            items = []
            for index, child in enumerate(node.value):
                self.lines[path + (index,)] = child.start_mark.line + 1
                items.append(self.value(child, path + (index,)))
            return items
        if isinstance(node, yaml.MappingNode):
            return self.mapping(node, path)
        raise YamlSyntaxError(
            f"unsupported YAML node {type(node).__name__}", node.start_mark.line + 1
        )

    def mapping(self, node: yaml.MappingNode, path: Path_) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if not isinstance(key_node, yaml.ScalarNode):
                raise YamlSyntaxError("a key must be a plain name, not a list or mapping", line)
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise YamlSyntaxError(
                    "merge keys ('<<') are not supported; write the keys out", line
                )
            key = self.scalar(key_node)
            key = key if isinstance(key, str) else str(key)
            if key in result:
                first = self.lines[path + (key,)]
                raise YamlSyntaxError(f"duplicate key '{key}' (first given on line {first})", line)
            self.lines[path + (key,)] = line
            result[key] = self.value(value_node, path + (key,))
        return result


def path_text(path: Path_) -> str:
    """``('training', 'microbatch_sizes', 2)`` -> ``training.microbatch_sizes[2]``."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text = f"{text}.{part}" if text else part
    return text
