"""Hypothesis strategies for the fuzz campaign: one ``Case`` (files to lay out, a command line) per
input, for each CLI target.

Inputs mix mutations of the shipped recipes and plans (values swapped for hostile YAML tokens, keys
renamed or dropped, bytes damaged) with hostile generators: alias bombs, recursive aliases, deep
nesting, huge and non-finite numbers, control and escape characters, bytes that are not UTF-8,
long lists and texts, files that are folders, FIFOs or devices, torn JSON lines, and job state
files that are folders, garbage or the wrong types under a valid checksum. Hypothesis draws the
choices and sizes; large contents are built in Python from them, so that drawing stays cheap.

Planning is slow on large markets, so ``plan`` inputs stay on the local simulated market (or a
small market file): the hostile sizes there (max_gpus 1e6 over places of unknown capacity, a
batch of 2**20) must be fast too.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[2]
RECIPES = {p.name: p.read_text() for p in sorted((REPO / "recipes").glob("*.yaml"))}
PLANS = {p.name: p.read_text() for p in sorted((REPO / "recipes" / "plans").glob("*.yaml"))}
QUICKSTART = RECIPES["quickstart.yaml"]
LOCAL_OFFERS = (REPO / "configs" / "local" / "offers.csv").read_text()
# each shipped plan with the recipe it was written for
PLAN_RECIPES = {
    "quickstart.yaml": "quickstart.yaml",
    "sailor-opt350m-4zones.yaml": "sailor-opt350m-gcp-zones.yaml",
}
STATE_FORMAT = "geo-orchestrator/job-state-v1"

FOLDER, FIFO, DEVICE = "<folder>", "<fifo>", "<device>"  # special files a Case may ask for


class _Text(str):
    """Text Hypothesis does not keep: it holds on to every plain str or bytes a strategy returns
    (to explain failures), which for megabyte inputs grows the campaign by a megabyte an input;
    a subclass can be neither held by type nor weakly referenced, so it is let go."""


class _Bytes(bytes):
    """Bytes Hypothesis does not keep (see ``_Text``)."""


def unheld(make):
    """Wrap a composite strategy's function so that the text or bytes it returns is let go."""

    @functools.wraps(make)
    def wrapper(draw, *args, **kwargs):
        value = make(draw, *args, **kwargs)
        if isinstance(value, bytes):
            return _Bytes(value)
        return _Text(value) if isinstance(value, str) else value

    return wrapper


@dataclass
class Case:
    """One input: ``files`` (path under the run's folder -> bytes, text or a special kind) and the
    command line, where ``{root}`` stands for that folder."""

    target: str
    label: str
    args: list[str]
    files: dict[str, bytes | str] = field(default_factory=dict)


# ---- hostile values ----------------------------------------------------------------------------

_FIXED_TOKENS = [
    ".nan",
    ".NaN",
    ".inf",
    "-.inf",
    "1e400",
    "-1e400",
    "1.0e+30",
    "1e30",
    "1e-400",
    "0",
    "-1",
    "0.0",
    "-0.0",
    "true",
    "null",
    "~",
    "[]",
    "{}",
    "''",
    '"\\x00"',
    '"\\e[31mred\\e[0m"',
    '"a\\nb"',
    '"\\r\\x1b]0;title\\x07"',
    "/abs/path",
    "../../x",
    "..",
    "-x",
    "!!int forty",
    "!!binary x",
    "!!int",
    "!!float ''",
    "!!bool ''",
    "!!timestamp x",
    '"\\ud83d"',
    "!!python/object:os.system x",
    "*undefined",
    "&a [*a]",
    "'\u202e\u0000'",
    "{a: 1, a: 2}",
    "[1, [2, [3]]]",
    "4294967296",
    "18446744073709551616",
    "1048577",
    "65",
    "2.5",
    "'16'",
    "0x10",
    "0o17",
    "1_000",
    "+12",
    "2001-12-14",
    "yes",
    "no",
    "on",
    ":",
    "- x",
]


@st.composite
@unheld
def raw_token(draw) -> str:
    """A YAML value as written in the file, hostile or odd."""
    kind = draw(st.integers(0, 9))
    if kind <= 3:
        return draw(st.sampled_from(_FIXED_TOKENS))
    if kind == 4:  # a huge whole number, possibly negative
        digits = draw(st.sampled_from([16, 20, 31, 100, 4299, 4301, 6000]))
        return draw(st.sampled_from(["", "-"])) + "9" * digits
    if kind == 5:  # a long list
        count = draw(st.sampled_from([0, 2, 65, 1025, 3000]))
        return "[" + ", ".join([draw(st.sampled_from(["1", "2", "x", "-1"]))] * count) + "]"
    if kind == 6:  # a long text
        size = draw(st.sampled_from([65, 4097, 100_000]))
        return "x" * size
    if kind == 7:  # nesting
        depth = draw(st.sampled_from([3, 63, 65, 200, 2000]))
        return "[" * depth + "]" * depth
    if kind == 8:  # an ordinary number, near a limit or not
        return str(draw(st.one_of(st.integers(-(2**40), 2**40), st.floats(allow_nan=False))))
    return json.dumps(draw(st.text(max_size=12)))  # any characters, control ones included


def alias_bomb(levels: int, fan_out: int) -> str:
    """YAML lines whose last anchor expands to fan_out ** levels values."""
    lines = [f"lol0: &lol0 [{', '.join(['lol'] * fan_out)}]"]
    for i in range(1, levels):
        lines.append(f"lol{i}: &lol{i} [{', '.join([f'*lol{i - 1}'] * fan_out)}]")
    return "\n".join(lines) + "\n"


@st.composite
@unheld
def hostile_document(draw) -> str:
    """A whole YAML document built to hurt a parser."""
    kind = draw(st.sampled_from(["bomb", "recursive", "deep_flow", "deep_block", "keys", "wide"]))
    if kind == "bomb":
        return alias_bomb(draw(st.integers(2, 12)), draw(st.integers(2, 10)))
    if kind == "recursive":
        return draw(st.sampled_from(["a: &x [*x]\n", "a: &x {b: *x}\n", "&x [*x, *x]\n"]))
    depth = draw(st.sampled_from([10, 64, 65, 1000, 5000]))
    if kind == "deep_flow":
        return "a: " + "{b: " * depth + "1" + "}" * depth + "\n"
    if kind == "deep_block":
        return "".join("  " * i + "- \n" for i in range(min(depth, 1000))) + "x\n"
    if kind == "keys":  # many keys, long keys
        count, size = draw(st.sampled_from([(10, 10_000), (5000, 5), (60_000, 1)]))
        return "".join(f"{'k' * size}{i}: {i}\n" for i in range(count))
    # more values than a recipe may hold; fewer, then more, than a plan may
    return "[" + ", ".join(["1"] * draw(st.sampled_from([120_000, 450_000]))) + "]\n"


# ---- mutations of shipped YAML ---------------------------------------------------------------

_LINE_VALUE = r"^(\s*-?\s*)([A-Za-z_]+):\s*(\S.*)$"


@st.composite
@unheld
def line_mutated(draw, text: str, *, keep: tuple[str, ...] = ()) -> str:
    """``text`` with the values of 1 to 3 ``key: value`` lines replaced by raw tokens (never those
    of ``keep``, e.g. provider, so that planning stays on a small market)."""
    import re

    lines = text.splitlines()
    pattern = re.compile(_LINE_VALUE)
    candidates = [
        i for i, line in enumerate(lines) if (m := pattern.match(line)) and m.group(2) not in keep
    ]
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.sampled_from(candidates))
        m = pattern.match(lines[i])
        lines[i] = f"{m.group(1)}{m.group(2)}: {draw(raw_token())}"
    return "\n".join(lines) + "\n"


_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["auto", "A100", "T4", "gcp/us-central1", "local", "spot", "s3://b/p", ""]),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)


def _paths(node, prefix: tuple = ()) -> list[tuple]:
    found = [prefix] if prefix else []
    children = (
        node.items()
        if isinstance(node, dict)
        else enumerate(node)
        if isinstance(node, list)
        else ()
    )
    for key, value in children:
        found += _paths(value, prefix + (key,))
    return found


@st.composite
@unheld
def data_mutated(draw, text: str) -> str:
    """``text`` parsed, 1 to 3 values replaced, keys dropped, renamed or added, dumped again."""
    data = yaml.safe_load(text)
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(data)
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = data
        for part in path[:-1]:
            parent = parent[part]
        key = path[-1]
        action = draw(st.sampled_from(["replace", "delete", "rename", "add"]))
        if action == "replace":
            parent[key] = draw(_VALUES)
        elif action == "delete":
            del parent[key]
        elif isinstance(parent, dict):
            new_key = draw(st.text(min_size=1, max_size=20))
            parent[new_key] = parent.pop(key) if action == "rename" else draw(_VALUES)
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


@st.composite
@unheld
def byte_damaged(draw, text: str) -> bytes:
    """``text`` as UTF-8 with a few bytes inserted: not UTF-8, control characters, YAML syntax."""
    data = text.encode("utf-8")
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(data)))
        insert = draw(
            st.sampled_from(
                [
                    b"\xff",
                    b"\xc3",
                    b"\x00",
                    b"\x1b[2J",
                    b"\t",
                    b"\r",
                    b":",
                    b"- ",
                    b"[",
                    b"{",
                    b"'",
                    b'"',
                    b"&a ",
                    b"*a",
                    b"!!int ",
                    b"#",
                    b"\xef\xbb\xbf",
                    b"\x85",
                    b"\n  ",
                ]
            )
        )
        cut = draw(st.integers(0, 4))
        data = data[:at] + insert + data[at + cut :]
    return data


@st.composite
def yaml_input(draw, text: str, *, keep: tuple[str, ...] = ()) -> tuple[str, bytes | str]:
    """(label, content) of a YAML file derived from the shipped ``text``, or a hostile one."""
    kind = draw(st.sampled_from(["line", "line", "line", "data", "bytes", "hostile", "append"]))
    if kind == "line":
        return "raw value", draw(line_mutated(text, keep=keep))
    if kind == "data":
        return "mutated data", draw(data_mutated(text))
    if kind == "bytes":
        return "damaged bytes", draw(byte_damaged(text))
    if kind == "hostile":
        return "hostile document", draw(hostile_document())
    return "document + hostile keys", text + draw(hostile_document())


# ---- the targets -------------------------------------------------------------------------------


@st.composite
def validate_cases(draw) -> Case:
    name = draw(st.sampled_from(sorted(RECIPES)))
    kind = draw(st.integers(0, 19))
    if kind == 0:  # the recipe path is no regular file
        special = draw(st.sampled_from([FOLDER, FIFO, DEVICE, None]))
        files = {} if special is None else {"r.yaml": special}
        return Case(
            "validate", f"recipe is {special or 'missing'}", ["validate", "{root}/r.yaml"], files
        )
    if kind == 1:  # over the size limit
        return Case(
            "validate",
            "recipe over the size limit",
            ["validate", "{root}/r.yaml"],
            {"r.yaml": RECIPES[name] + "#" * (1024 * 1024)},
        )
    label, content = draw(yaml_input(RECIPES[name]))
    return Case(
        "validate", f"{label} of {name}", ["validate", "{root}/r.yaml"], {"r.yaml": content}
    )


_SMALL_RECIPE = """\
name: tiny
provider: local
model: {name: gpt-tiny}
training:
  global_batch_size: 16
  microbatch_sizes: [1, 2, 4]
  steps: 100
objective:
  goal: max_throughput
  budget_usd_per_hour: 5.0
constraints:
  gpu_types: [T4]
  max_gpus: 8
  min_locations: 1
  pricing: any
"""

# hostile sizes that must plan fast: they are bounded by what the market and the model can use
_HOSTILE_PLANS = {
    "max_gpus 1e6": ("max_gpus: 8", "max_gpus: 1000000"),
    "max_gpus 1e9": ("max_gpus: 8", "max_gpus: 1000000000"),
    "max_gpus 1e30": ("max_gpus: 8", "max_gpus: 1" + "0" * 30),
    "batch 2**20": ("global_batch_size: 16", "global_batch_size: 1048576"),
    "steps 1e9": ("steps: 100", "steps: 1000000000"),
    "batch 2**20, microbatch 1": ("microbatch_sizes: [1, 2, 4]", "microbatch_sizes: [1]"),
    "no max_gpus": ("max_gpus: 8", "max_gpus: null"),
    "budget tiny": ("budget_usd_per_hour: 5.0", "budget_usd_per_hour: 1.0e-9"),
}


@st.composite
def plan_cases(draw) -> Case:
    # the quickstart spreads over 3 places, which costs 4 times the small recipe's planning
    base = draw(st.sampled_from([QUICKSTART, _SMALL_RECIPE, _SMALL_RECIPE, _SMALL_RECIPE]))
    if draw(st.integers(0, 4)) == 0:
        chosen = draw(st.lists(st.sampled_from(sorted(_HOSTILE_PLANS)), min_size=1, max_size=3))
        text = _SMALL_RECIPE
        for key in chosen:
            old, new = _HOSTILE_PLANS[key]
            text = text.replace(old, new)
        return Case(
            "plan",
            "hostile size: " + ", ".join(chosen),
            ["plan", "{root}/r.yaml", "--top", "2"],
            {"r.yaml": text},
        )
    label, content = draw(yaml_input(base, keep=("provider", "market", "name")))
    if label.startswith("mutated data") and "provider" not in str(content):
        label += " (provider local by default)"
    return Case("plan", label, ["plan", "{root}/r.yaml", "--top", "2"], {"r.yaml": content})


_OFFER_HEADER, *_OFFER_ROWS = LOCAL_OFFERS.strip().splitlines()
_CELL_TOKENS = [
    "",
    "nan",
    "NaN",
    "inf",
    "-inf",
    "1e400",
    "-1",
    "0",
    "1" + "0" * 30,
    "9" * 5000,
    "x",
    "\x00",
    "\x1b[31m",
    '"a,b"',
    '"',
    "4",
    "1.5",
    "100000",
    "100001",
    "65",
    "T4",
    "A100",
    "local",
    "gcp",
    "sim-us",
    "sim-us-a",
    "2023-04-01",
    "2026-13-45",
    "\xff",
]


@st.composite
@unheld
def market_text(draw) -> str:
    """A market CSV: the local offers with cells, rows and the header damaged, or capacities left
    unknown (the planner must then bound the GPUs by what a plan can use)."""
    header = _OFFER_HEADER
    rows = [row.split(",") for row in _OFFER_ROWS[: draw(st.integers(1, len(_OFFER_ROWS)))]]
    kind = draw(st.sampled_from(["cells", "cells", "unknown counts", "header", "rows", "long"]))
    if kind == "cells":
        for _ in range(draw(st.integers(1, 4))):
            row = draw(st.sampled_from(rows))
            row[draw(st.integers(0, len(row) - 1))] = draw(st.sampled_from(_CELL_TOKENS))
    elif kind == "unknown counts":
        for row in rows:
            row[10] = ""
    elif kind == "header":
        header = draw(st.sampled_from(["", "cloud,region", header.upper(), header + ",extra"]))
    elif kind == "rows":
        rows.append(draw(st.sampled_from([["a"], [""] * 20, ["x" * 200_000]])))
    else:
        rows = rows * draw(st.sampled_from([100, 2000]))
    return "\n".join([header, *(",".join(row) for row in rows)]) + "\n"


@st.composite
def plan_market_cases(draw) -> Case:
    recipe = _SMALL_RECIPE
    if draw(st.booleans()):  # a capacity the market does not give, bounded only by max_gpus
        most = draw(st.sampled_from([64, 10**6, 10**9, 10**30]))
        recipe = recipe.replace("max_gpus: 8", f"max_gpus: {most}")
    market = draw(market_text())
    if draw(st.integers(0, 9)) == 0:
        market = draw(st.sampled_from([FOLDER, FIFO, DEVICE, market.encode() + b"\xff\xfe\n"]))
    return Case(
        "plan --market",
        "market file",
        ["plan", "{root}/r.yaml", "--market", "{root}/offers.csv", "--top", "2"],
        {"r.yaml": recipe, "offers.csv": market},
    )


@st.composite
def simulate_cases(draw) -> Case:
    plan_name = draw(st.sampled_from(sorted(PLAN_RECIPES)))
    recipe = RECIPES[PLAN_RECIPES[plan_name]]
    if draw(st.integers(0, 9)) == 0:
        plan = draw(st.sampled_from([FOLDER, FIFO, DEVICE]))
        label = f"plan is {plan}"
    else:
        label, plan = draw(yaml_input(PLANS[plan_name]))
    return Case(
        "simulate --plan",
        f"{label} of {plan_name}",
        ["simulate", "{root}/r.yaml", "--plan", "{root}/plan.yaml"],
        {"r.yaml": recipe, "plan.yaml": plan},
    )
