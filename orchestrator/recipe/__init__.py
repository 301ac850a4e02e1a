"""Recipes: strict YAML parsed once into frozen, typed objects (see docs/recipe.md).

recipe = load_recipe("recipes/quickstart.yaml")
recipe.training.global_batch_size
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.catalog import Catalog, default_catalog
from orchestrator.errors import RecipeError, together
from orchestrator.recipe.binder import Binder
from orchestrator.recipe.checks import check_recipe
from orchestrator.recipe.schema import (
    CheckpointConfig,
    ConstraintsConfig,
    DataConfig,
    ModelConfig,
    ObjectiveConfig,
    OptimizerConfig,
    ParallelismConfig,
    Recipe,
    RuntimeConfig,
    TrainingConfig,
)
from orchestrator.yamlsrc import RECIPE_LIMITS, YamlSyntaxError, load_yaml_text, read_user_text

__all__ = [
    "CheckpointConfig",
    "ConstraintsConfig",
    "DataConfig",
    "ModelConfig",
    "ObjectiveConfig",
    "OptimizerConfig",
    "ParallelismConfig",
    "Recipe",
    "RuntimeConfig",
    "TrainingConfig",
    "load_recipe",
    "parse_recipe",
]


def load_recipe(path: str | Path, *, catalog: Catalog | None = None) -> Recipe:
    """Read, bind and check the recipe at ``path``; raise RecipeError naming file, line and field."""
    path = Path(path)
    text = read_user_text(
        path,
        max_bytes=RECIPE_LIMITS.max_bytes,
        error=RecipeError,
        fix="give the path of a recipe .yaml, e.g. recipes/quickstart.yaml",
    )
    return parse_recipe(text, file=str(path), folder=path.resolve().parent, catalog=catalog)


def parse_recipe(text: str, *, file: str, folder: Path, catalog: Catalog | None = None) -> Recipe:
    """Parse recipe text; ``file`` is the name errors show, ``folder`` resolves relative paths."""
    try:
        doc = load_yaml_text(text, file=file)
    except YamlSyntaxError as exc:
        raise RecipeError(
            exc.message,
            file=file,
            line=exc.line,
            fix="correct the YAML: two-space indents, 'key: value', lists in [ ] or '- ' items",
        ) from None
    binder = Binder(doc, Recipe)
    recipe = binder.bind_partial()
    if not binder.problems:
        return check_recipe(recipe, doc, catalog or default_catalog(), folder)
    # unknown keys, and what the checks find in the rest: every problem in one report
    try:
        check_recipe(recipe, doc, catalog or default_catalog(), folder)
    except RecipeError as error:
        raise together([*binder.problems, error]) from None
    raise together(binder.problems)
