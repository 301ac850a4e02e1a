"""Random mutations of valid recipes never yield a traceback: a recipe or a UserError with a line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.errors import UserError
from orchestrator.recipe import Recipe, parse_recipe

RECIPES = sorted((Path(__file__).resolve().parents[2] / "recipes").glob("*.yaml"))
RECIPE_DATA = [yaml.safe_load(p.read_text()) for p in RECIPES]
RECIPE_TEXT = [p.read_text() for p in RECIPES]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["auto", "A100", "gcp/us-central1", "local", "spot", "s3://b/p", "-1", ""]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    found = [prefix] if prefix else []
    if isinstance(node, dict):
        for key, value in node.items():
            found += _paths(value, prefix + (key,))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += _paths(value, prefix + (index,))
    return found


def _parent(root: Any, path: tuple) -> Any:
    for part in path[:-1]:
        root = root[part]
    return root


@st.composite
def mutated_recipes(draw) -> str:
    import copy

    data = copy.deepcopy(draw(st.sampled_from(RECIPE_DATA)))
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(data)
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent, key = _parent(data, path), path[-1]
        action = draw(st.sampled_from(["replace", "delete", "rename", "add"]))
        if action == "replace":
            parent[key] = draw(values)
        elif action == "delete":
            del parent[key]
        elif action == "rename" and isinstance(parent, dict):
            new_key = draw(st.text(min_size=1, max_size=20))
            parent[new_key] = parent.pop(key)
        elif action == "add" and isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=10))] = draw(values)
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


@st.composite
def damaged_texts(draw) -> str:
    text = draw(st.sampled_from(RECIPE_TEXT))
    position = draw(st.integers(0, len(text)))
    insert = draw(
        st.sampled_from(
            ["\t", ":", "- ", "[", "]", "{", "\n  ", "'", '"', "&a ", "*a", "!!int ", "#", "\x00"]
        )
    )
    cut = draw(st.integers(0, 5))
    return text[:position] + insert + text[position + cut :]


def _parse_never_crashes(text: str, tmp: Path) -> None:
    try:
        recipe = parse_recipe(text, file="mutated.yaml", folder=tmp)
    except UserError as error:
        assert error.line is not None and error.line >= 1, error.render()
        assert error.render().startswith("mutated.yaml") or error.render().startswith("configs"), (
            error.render()
        )
        return
    assert isinstance(recipe, Recipe)


@settings(
    max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=mutated_recipes())
def test_mutated_recipe_parses_or_names_the_problem(text, tmp_path):
    _parse_never_crashes(text, tmp_path)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=damaged_texts())
def test_damaged_yaml_parses_or_names_the_problem(text, tmp_path):
    _parse_never_crashes(text, tmp_path)
