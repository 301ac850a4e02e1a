"""``validate`` (built) and ``submit``, ``status`` (announced, not built yet)."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from orchestrator.catalog import Catalog
from orchestrator.cli.output import format_table, print_json
from orchestrator.recipe import Recipe, load_recipe
from orchestrator.recipe.models import spec_of


def add_validate(commands: argparse._SubParsersAction, formatter: type) -> None:
    p = commands.add_parser(
        "validate",
        help="check a recipe and print what it asks for",
        description="Parse a recipe strictly and check it against the catalog: unknown keys, wrong types, "
        "impossible values and constraints that leave no GPU are errors naming file, line and field.",
        formatter_class=formatter,
        epilog="example:\n  python -m orchestrator validate recipes/quickstart.yaml",
    )
    p.add_argument("recipe", type=Path, metavar="RECIPE", help="a recipe .yaml")
    p.add_argument(
        "--json", action="store_true", help="print the parsed recipe as one JSON document"
    )
    p.set_defaults(run=run_validate)


def run_validate(args: argparse.Namespace, catalog: Catalog) -> int:
    recipe = load_recipe(args.recipe, catalog=catalog)
    offers = catalog.market(recipe.provider, recipe.market_file()).query(
        gpus=recipe.constraints.gpu_types,
        within=[catalog.location(t) for t in recipe.constraints.locations],
        exclude=[catalog.location(t) for t in recipe.constraints.exclude_locations],
        pricing=recipe.constraints.pricing,
    )
    if args.json:
        print_json({"valid": True, "recipe": _recipe_json(recipe), "matching_offers": len(offers)})
        return 0
    spec = spec_of(recipe.model)
    t = recipe.training
    rows = [
        ("name", recipe.name),
        ("provider", recipe.provider + (f" (market {recipe.market})" if recipe.market else "")),
        (
            "model",
            f"{spec.name}: {spec.parameter_count() / 1e6:,.1f}M parameters, {spec.num_layers} layers, "
            f"profile {recipe.model.profile}",
        ),
        (
            "training",
            f"{t.steps} steps of {t.global_batch_size} samples, microbatches {list(t.microbatch_sizes)}, "
            f"{t.precision}, {t.optimizer.name} lr {t.optimizer.lr:g}",
        ),
        ("objective", _objective_text(recipe)),
        (
            "gpus",
            f"{', '.join(recipe.constraints.gpu_types) or 'any type'}, "
            f"{recipe.constraints.pricing.replace('_', '-')}, max {recipe.constraints.max_gpus or 'unlimited'}",
        ),
        ("places", ", ".join(recipe.constraints.locations) or "anywhere the provider offers"),
        (
            "offers",
            f"{len(offers)} matching offers in {len({o.location for o in offers})} locations",
        ),
    ]
    print(f"{args.recipe}: valid")
    print(format_table(("field", "value"), rows))
    return 0


def _objective_text(recipe: Recipe) -> str:
    o = recipe.objective
    limits = [
        f"budget ${o.budget_usd_per_hour:g}/h" if o.budget_usd_per_hour else "",
        f"at least {o.min_throughput_samples_per_s:g} samples/s"
        if o.min_throughput_samples_per_s
        else "",
        f"deadline {o.deadline_h:g} h" if o.deadline_h else "",
        f"total budget ${o.budget_usd:g}" if o.budget_usd else "",
        "risk-aware" if o.risk_aware else "",
    ]
    return ", ".join([o.goal] + [x for x in limits if x])


def _recipe_json(recipe: Recipe) -> dict:
    return dataclasses.asdict(recipe)
