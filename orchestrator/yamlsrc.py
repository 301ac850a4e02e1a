"""Read the files a user gives, and load YAML into plain values with the line of every key.

Recipes, plans and config files are parsed from YAML nodes rather than ``yaml.safe_load`` so that an
error can say on which line the bad value is. Duplicate keys are errors (PyYAML keeps the last one
silently), and an unquoted number in exponent form (``3e-4``, ``2.0e9``), which YAML 1.1 reads as text
unless written ``2.0e+9``, is read as a float as the user meant.

Hostile input is refused before it costs much: ``read_user_text`` reads only regular files (a
folder, a FIFO or ``/dev/zero`` is named as such, never read) up to a size limit, and
``load_yaml_text`` walks the parser's events (an iterative pass) to refuse documents nested too
deeply, with too many nodes, or whose aliases expand beyond a small budget (a "billion laughs", or
an alias inside its own anchor) before the recursive composer and builder see them.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from orchestrator.errors import UserError

Path_ = tuple[str | int, ...]  # a position in the document: keys and list indices from the root

# YAML 1.1 reads 3e-4 and 2.0e9 as text (it wants a dot and a signed exponent: 2.0e+9)
_EXPONENT_FLOAT = re.compile(r"^[-+]?(\d+(\.\d*)?|\.\d+)[eE][-+]?\d+$")
# libyaml, when installed, parses in C: the limits pass costs little even on large plans
_FAST_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
MIB = 1024 * 1024


@dataclass(frozen=True)
class YamlLimits:
    """What one document may hold: bytes of text, nodes (aliases counted expanded), nesting depth,
    and nodes that aliases may add."""

    max_bytes: int = 1 * MIB
    max_nodes: int = 100_000
    max_depth: int = 64
    max_alias_nodes: int = 10_000


RECIPE_LIMITS = YamlLimits()
# a plan lists every replica: 40,000 replicas of 4 keys each fit (read in about 4 s, 150 MiB)
PLAN_LIMITS = YamlLimits(max_bytes=8 * MIB, max_nodes=400_000)
CONFIG_LIMITS = YamlLimits(max_bytes=8 * MIB, max_nodes=400_000)


class YamlSyntaxError(Exception):
    """The text is not valid YAML, has a duplicate key, or is over a limit; ``line`` is 1-based."""

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


# ---- files --------------------------------------------------------------------------------------


def file_problem(path: Path) -> str | None:
    """Why ``path`` cannot be read as a file (missing, a folder, a FIFO, a device), or None."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "file not found"
    except NotADirectoryError:
        return "file not found (a part of the path is a file, not a folder)"
    except OSError as exc:  # permission denied on a folder, a name too long, a symlink loop
        return f"cannot open the file: {exc.strerror or exc}"
    if stat.S_ISDIR(mode):
        return "is a folder, not a file"
    if not stat.S_ISREG(mode):
        kind = (
            "a FIFO (named pipe)"
            if stat.S_ISFIFO(mode)
            else "a device"
            if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "a socket"
            if stat.S_ISSOCK(mode)
            else "not a plain file"
        )
        return f"is {kind}, not a regular file; only regular files are read"
    return None


def read_user_text(
    path: Path,
    *,
    max_bytes: int,
    error: type[UserError] = UserError,
    display: str | None = None,
    fix: str = "give the path of a regular file",
) -> str:
    """The text of the regular file ``path``; raise ``error`` naming the file (``display``) when
    it is missing, is not a regular file, cannot be read, is larger than ``max_bytes`` or is not
    UTF-8 (naming the line of the first byte that is not)."""
    name = display or str(path)
    data = _read_bytes(path, max_bytes, error, name, fix)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(
            f"byte 0x{data[exc.start]:02x} is not UTF-8 text",
            file=name,
            line=data.count(b"\n", 0, exc.start) + 1,
            fix="save the file as UTF-8 text",
        ) from None


def _read_bytes(path: Path, max_bytes: int, error: type[UserError], name: str, fix: str) -> bytes:
    problem = file_problem(path)
    if problem is not None:
        raise error(problem, file=name, fix=fix)
    try:
        with open(path, "rb") as handle:
            data = handle.read(max_bytes + 1)  # never more: the file may grow while read
    except OSError as exc:
        raise error(f"cannot read the file: {exc.strerror or exc}", file=name, fix=fix) from None
    if len(data) > max_bytes:
        raise error(
            f"the file is larger than {max_bytes:,} bytes, the most read",
            file=name,
            fix=f"give a smaller file (at most {max_bytes // MIB} MiB)",
        )
    return data


# ---- YAML ---------------------------------------------------------------------------------------


def load_yaml_text(text: str, *, file: str, limits: YamlLimits = RECIPE_LIMITS) -> YamlDoc:
    """Parse one YAML document; raise YamlSyntaxError with a line on malformed input or when the
    document is over ``limits``."""
    if len(text) > limits.max_bytes:
        raise YamlSyntaxError(f"the text is longer than {limits.max_bytes:,} characters", None)
    node = _compose(str(text), limits)  # libyaml takes a str, not a subclass of it
    if node is None:
        return YamlDoc(value=None, lines={(): 1}, file=file)
    builder = _Builder()
    builder.lines[()] = node.start_mark.line + 1
    value = builder.value(node, ())
    return YamlDoc(value=value, lines=builder.lines, file=file)


def load_yaml_file(
    path: Path,
    *,
    display: str | None = None,
    limits: YamlLimits = CONFIG_LIMITS,
    error: type[UserError] = UserError,
) -> YamlDoc:
    """Read (``read_user_text``) and parse ``path``; ``display`` is the name errors show."""
    text = read_user_text(path, max_bytes=limits.max_bytes, error=error, display=display)
    return load_yaml_text(text, file=display or str(path), limits=limits)


def _compose(text: str, limits: YamlLimits) -> yaml.Node | None:
    """The node tree of ``text``, after the limits pass. libyaml parses first (fast); when it
    refuses the text, PyYAML tries again: it reads a few escapes libyaml does not, and its
    messages name more (the alias, the character)."""
    try:
        _check_limits(text, limits, _FAST_LOADER)
        return yaml.compose(text, Loader=_FAST_LOADER)
    except yaml.YAMLError as exc:
        if "nesting depth" in str(exc):  # libyaml's own limit (1,000), met while scanning ahead
            raise _too_deep(limits, exc.problem_mark.line + 1) from None
        fast_error = exc
    # PyYAML's scanner takes time quadratic in the nesting of [ and { (and its composer
    # recurses): past a depth it cannot accept anyway, libyaml's word is final
    if len(text) > RECIPE_LIMITS.max_bytes or _bracket_depth(text) > 2 * limits.max_depth:
        raise _syntax_error(fast_error, text)
    try:
        _check_limits(text, limits, yaml.SafeLoader)
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        raise _syntax_error(exc, text) from None


def _bracket_depth(text: str) -> int:
    """How deep ``[`` and ``{`` nest in ``text``, quotes and comments counted too: an upper
    bound of the flow nesting."""
    depth = deepest = 0
    for bracket in re.sub(r"[^\[\]{}]+", "", text):
        depth = depth + 1 if bracket in "[{" else max(0, depth - 1)
        deepest = max(deepest, depth)
    return deepest


def _syntax_error(exc: yaml.YAMLError, text: str) -> YamlSyntaxError:
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        return YamlSyntaxError(_describe_yaml_error(exc), line)
    if isinstance(exc, yaml.reader.ReaderError):
        line = text.count("\n", 0, exc.position) + 1
        character = (
            exc.character if isinstance(exc.character, int) else ord(exc.character[:1] or " ")
        )
        return YamlSyntaxError(f"not valid YAML: character #x{character:04x} is not allowed", line)
    return YamlSyntaxError(f"not valid YAML: {_short(str(exc), 200)}", 1)


@dataclass
class _Open:
    """A mapping or list not yet closed, in the limits pass."""

    anchor: str | None
    nodes_before: int
    depth: int
    deepest: int


def _check_limits(text: str, limits: YamlLimits, loader: type) -> None:
    """Walk the parser's events (``loader``'s; no recursion) and raise YamlSyntaxError at the
    first limit passed; an alias counts as every node of its anchor, as the builder will expand
    it."""
    nodes = aliased = 0
    opened: list[_Open] = []
    anchors: dict[str, tuple[int, int]] = {}  # anchor -> (nodes, depth below it)
    anchor_line: dict[str, int] = {}
    for event in yaml.parse(text, Loader=loader):
        line = event.start_mark.line + 1
        depth = len(opened)
        if isinstance(event, yaml.AliasEvent):
            size, below = _alias_size(event.anchor, anchors, opened, line)
            nodes, aliased = nodes + size, aliased + size
            if aliased > limits.max_alias_nodes:
                raise YamlSyntaxError(
                    f"aliases expand to more than {limits.max_alias_nodes:,} nodes "
                    "(an alias bomb?); write the values out",
                    line,
                )
            _deepen(opened, depth + below, limits, line)
        elif isinstance(event, (yaml.ScalarEvent, yaml.CollectionStartEvent)):
            nodes += 1
            anchor = event.anchor
            if anchor is not None and anchor in anchor_line:
                raise YamlSyntaxError(
                    f"the anchor '&{_short(anchor)}' is given twice (first on line "
                    f"{anchor_line[anchor]})",
                    line,
                )
            if anchor is not None:
                anchor_line[anchor] = line
            if isinstance(event, yaml.ScalarEvent):
                if anchor is not None:
                    anchors[anchor] = (1, 0)
            else:
                _deepen(opened, depth + 1, limits, line)
                opened.append(_Open(anchor, nodes - 1, depth + 1, depth + 1))
        elif isinstance(event, yaml.CollectionEndEvent):
            closed = opened.pop()
            if opened:
                opened[-1].deepest = max(opened[-1].deepest, closed.deepest)
            if closed.anchor is not None:
                anchors[closed.anchor] = (
                    nodes - closed.nodes_before,
                    closed.deepest - closed.depth + 1,
                )
        if nodes > limits.max_nodes:
            raise YamlSyntaxError(
                f"the document has more than {limits.max_nodes:,} values; it is too large", line
            )


def _alias_size(
    anchor: str, anchors: dict[str, tuple[int, int]], opened: list[_Open], line: int
) -> tuple[int, int]:
    if any(frame.anchor == anchor for frame in opened):
        raise YamlSyntaxError(
            f"the alias '*{_short(anchor)}' is inside the value it names (a recursive alias)",
            line,
        )
    if anchor not in anchors:
        raise YamlSyntaxError(f"the alias '*{_short(anchor)}' names no anchor before it", line)
    return anchors[anchor]


def _deepen(opened: list[_Open], depth: int, limits: YamlLimits, line: int) -> None:
    if depth > limits.max_depth:
        raise _too_deep(limits, line)
    if opened:
        opened[-1].deepest = max(opened[-1].deepest, depth)


def _too_deep(limits: YamlLimits, line: int | None) -> YamlSyntaxError:
    return YamlSyntaxError(f"lists and mappings are nested more than {limits.max_depth} deep", line)


def _describe_yaml_error(exc: yaml.MarkedYAMLError) -> str:
    problem = exc.problem or "malformed YAML"
    if "found character '\\t'" in problem or "\t" in str(exc.problem_mark or ""):
        return "not valid YAML: a tab character; YAML indents with spaces only"
    if exc.context:
        return f"not valid YAML: {exc.context}, {problem}"
    return f"not valid YAML: {problem}"


def _short(text: str, most: int = 40) -> str:
    """``text`` cut for a message: an error never echoes a megabyte back."""
    return text if len(text) <= most else f"{text[:most]}... ({len(text):,} characters)"


class _Builder:
    """Turns one composed node tree into plain values, recording lines; one per document."""

    def __init__(self) -> None:
        # Only the loader's constructor is used, to type scalars exactly as yaml.safe_load would.
        self._loader = yaml.SafeLoader("")
        self.lines: dict[Path_, int] = {}

    def scalar(self, node: yaml.ScalarNode) -> Any:
        try:
            value = self._loader.construct_object(node, deep=True)
        except (yaml.YAMLError, ValueError, TypeError, OverflowError, LookupError, AttributeError):
            # an explicit tag that does not fit its text: `!!int forty`, `!!binary x`, `!!int`
            # with no text (IndexError), `!!bool maybe` (KeyError), `!!timestamp x`
            # (AttributeError); or an integer of more digits than Python reads (ValueError)
            raise YamlSyntaxError(
                f"cannot read the value '{_short(node.value)}' as {node.tag.rsplit(':', 1)[-1]}",
                node.start_mark.line + 1,
            ) from None
        if isinstance(value, str) and not node.style and _EXPONENT_FLOAT.match(value):
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
                raise YamlSyntaxError(
                    f"duplicate key '{_short(key)}' (first given on line {first})", line
                )
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
