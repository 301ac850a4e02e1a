"""Random mutations of valid recipes never yield a traceback: a recipe or a UserError with a line."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.errors import UserError
from orchestrator.recipe import Recipe, parse_recipe
from tests.fuzz.strategies import data_mutated

RECIPES = sorted((Path(__file__).resolve().parents[2] / "recipes").glob("*.yaml"))
RECIPE_TEXT = [p.read_text() for p in RECIPES]


@st.composite
def mutated_recipes(draw) -> str:
    return draw(data_mutated(draw(st.sampled_from(RECIPE_TEXT))))


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
