"""``python -m orchestrator plan RECIPE``: the best plans for a recipe on its market, ranked."""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

from orchestrator.catalog import Catalog
from orchestrator.cli.output import format_table, print_json
from orchestrator.cli.plot import draw_frontier
from orchestrator.errors import UserError
from orchestrator.planner import SearchOptions, prepare
from orchestrator.planner.explain import (
    gpus_by_location,
    no_plan_error,
    peak_memory,
    shape_text,
    why_behind,
)
from orchestrator.planner.search import SearchResult, search
from orchestrator.recipe import Recipe, load_recipe

GIB = 1024**3
MAX_TOP = 100  # plans listed: the search goes on until it has this many


def add_plan(commands: argparse._SubParsersAction, formatter: type) -> None:
    p = commands.add_parser(
        "plan",
        help="choose GPUs, places and the parallel plan for a recipe",
        description="Search which GPUs to rent where (spot or on-demand) and how to split the model "
        "over them (pipeline stages and layer split, GPU type and TP degree per stage, data-parallel "
        "degree, microbatch, flat or hierarchical all-reduce, cross-region compression), score every "
        "candidate with the simulator under the recipe's objective, and print the best plans ranked, "
        "with why the runners-up lost. The best plan can be written in the plan format (-o), which "
        "simulate and submit read back. Searches longer than a second report progress on stderr.",
        formatter_class=formatter,
        epilog="examples:\n  python -m orchestrator plan recipes/quickstart.yaml\n"
        "  python -m orchestrator plan recipes/sailor-gptneo27-a100-v100.yaml --top 3 -o plan.yaml "
        "--plot frontier.png",
    )
    p.add_argument("recipe", type=Path, metavar="RECIPE", help="a recipe .yaml")
    p.add_argument(
        "--market",
        type=Path,
        metavar="FILE",
        help="plan against this offers CSV (columns of configs/prices/offers.csv) instead of the "
        "recipe's market",
    )
    p.add_argument(
        "--top",
        type=int,
        default=5,
        metavar="K",
        help=f"how many plans to list (5; 1 to {MAX_TOP})",
    )
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("-o", "--output", type=Path, metavar="PLAN", help="write the best plan here")
    p.add_argument(
        "--plot",
        type=Path,
        metavar="PICTURE",
        help="draw the cost/throughput frontier of every simulated plan (.png, .svg or .pdf)",
    )
    p.set_defaults(run=run_plan)


def run_plan(args: argparse.Namespace, catalog: Catalog) -> int:
    if not 1 <= args.top <= MAX_TOP:
        raise UserError(
            f"--top {args.top}: must be from 1 to {MAX_TOP}", field="--top", fix="give --top 5"
        )
    recipe = load_recipe(args.recipe, catalog=catalog)
    # a missing file, a folder or a FIFO is a CatalogError naming it
    market = None if args.market is None else catalog.load_market(args.market)
    context = prepare(recipe, catalog, market)
    options = SearchOptions(top_k=args.top, progress=lambda line: print(line, file=sys.stderr))
    result = search(context.evaluator, context.space, options)
    objective = context.evaluator.objective
    if not result.plans:
        raise no_plan_error(result, objective)
    best = result.plans[0]
    if args.output is not None:
        _write_plan(args.output, recipe, args.recipe, best)
    if args.plot is not None:
        draw_frontier(
            args.plot,
            result.points,
            [(e.score.samples_per_s, e.score.cost_per_million_samples_usd) for e in result.plans],
            f"{recipe.name}: {len(result.points):,} plans simulated",
        )
    network = context.evaluator.network
    reasons = [why_behind(e, best, network, objective) for e in result.plans[1:]]
    if args.json:
        print_json(_document(recipe, result, reasons, args))
        return 0
    _print(recipe, result, reasons, args)
    return 0


def _write_plan(path: Path, recipe: Recipe, recipe_path: Path, best) -> None:
    s = best.score
    header = (
        f"# The best plan for {recipe_path} ({recipe.name}), written by python -m orchestrator plan:\n"
        f"# {s.samples_per_s:,.2f} samples/s, ${s.spend_usd_per_hour:,.2f}/h, "
        f"${s.cost_per_million_samples_usd:,.2f} per 1M samples (predicted).\n"
    )
    try:
        path.write_text(header + best.plan.to_yaml(), encoding="utf-8")
    except OSError as exc:
        raise UserError(
            f"cannot write {path}: {exc.strerror}", field="--output", fix="give a writable path"
        ) from None


def _rows(result: SearchResult) -> list[tuple]:
    rows = []
    for rank, e in enumerate(result.plans, start=1):
        peak, capacity = peak_memory(e)
        estimate = e.estimate
        share = (
            estimate.egress_usd_per_iteration / estimate.cost_per_iteration_usd
            if estimate.cost_per_iteration_usd
            else 0.0
        )
        rows.append(
            (
                rank,
                places_short(e.plan),
                shape_text(e.plan),
                e.plan.microbatch_size,
                _round(e.score.samples_per_s),
                round(e.score.spend_usd_per_hour, 2),
                _round(e.score.cost_per_million_samples_usd),
                f"{share:.0%}",
                f"{peak / GIB:.1f}/{capacity / GIB:.0f}",
            )
        )
    return rows


def print_wrapped(text: str, width: int = 100) -> None:
    print(textwrap.fill(text, width=width, break_on_hyphens=False, break_long_words=False))


def places_short(plan) -> str:
    """``2xT4@sim-eu-a 1xA100*@us-central1-a``: GPUs per place by its last part (the whole
    cloud/region/zone where two places share one), ``*`` for on-demand; --json has them whole."""
    counts: dict[tuple[str, str, bool], int] = {}
    for stage in plan.stages:
        for r in stage.replicas:
            counts[(r.infra, r.gpu, r.spot)] = counts.get((r.infra, r.gpu, r.spot), 0) + r.tp
    infras = {infra for infra, _, _ in counts}
    tails = {infra.rsplit("/", 1)[-1] for infra in infras}
    whole = len(tails) < len(infras)
    return " ".join(
        f"{n}x{gpu}{'' if spot else '*'}@{infra if whole else infra.rsplit('/', 1)[-1]}"
        for (infra, gpu, spot), n in sorted(counts.items())
    )


def search_verdict(result: SearchResult) -> str:
    """Whether the best plan is proven the best of the plan space, or how far the bounds say a
    plan the search's heuristics skipped could be better."""
    if result.proven:
        return "the best plan is proven the best of the plan space"
    skipped = ", ".join(result.heuristics)
    if result.gap is None:
        return f"best found (not every choice tried: {skipped}; no bound covers them all)"
    return (
        f"best found: the bounds allow a plan up to {result.gap:.1%} better "
        f"(not every choice tried: {skipped})"
    )


def _round(value: float) -> float:
    """Three significant figures at least, two decimals at most: enough to rank by eye."""
    return round(value, 2 if value >= 10 else 4 if value < 1 else 3)


def _print(recipe: Recipe, result: SearchResult, reasons: list[str], args) -> None:
    print(
        f"{recipe.name}: {len(result.plans)} best of {result.evaluations:,} plans simulated "
        f"({result.configs:,} configurations bounded) in {result.seconds:.2f} s; "
        + search_verdict(result)
    )
    print(
        format_table(
            (
                "rank",
                "gpus@place",
                "shape",
                "mbs",
                "samples_s",
                "usd_per_h",
                "usd_per_1m",
                "egress",
                "peak_gib",
            ),
            _rows(result),
        )
    )
    print(
        "\ngpus@place: GPUs per place (its zone, or region; * on demand); peak_gib: the fullest "
        "GPU's peak memory / its capacity; egress: share of the cost"
    )
    for rank, reason in enumerate(reasons, start=2):
        print(f"{rank}: {reason}")
    if recipe.provider == "local" and recipe.model.profile == "auto":
        print_wrapped(
            "note: these figures use the profile estimated for the GPU types and the catalog's "
            "local prices; submit first times the model on this machine and plans on the local "
            f"market's live offers, so its plan and figures can differ: python -m orchestrator "
            f"submit {args.recipe} --dry-run shows them"
        )
    if args.output is not None:
        print(
            f"\nbest plan written to {args.output}; its breakdown: "
            f"python -m orchestrator simulate {args.recipe} --plan {args.output}"
        )
    else:
        print("\nwrite the best plan with -o plan.yaml")
    if args.plot is not None:
        print(f"frontier drawn in {args.plot}")


def _document(recipe: Recipe, result: SearchResult, reasons: list[str], args) -> dict:
    plans = []
    for rank, e in enumerate(result.plans, start=1):
        plans.append(
            {
                "rank": rank,
                "gpus_by_location": gpus_by_location(e.plan),
                "shape": shape_text(e.plan),
                "samples_per_s": e.score.samples_per_s,
                "usd_per_hour": e.score.spend_usd_per_hour,
                "usd_per_million_samples": e.score.cost_per_million_samples_usd,
                "behind_the_best": reasons[rank - 2] if rank > 1 else None,
                "plan": e.plan.to_dict(),
                "estimate": e.estimate.to_dict(),
            }
        )
    return {
        "recipe": recipe.name,
        "search": {
            "seconds": result.seconds,
            "plans_simulated": result.evaluations,
            "configurations": result.configs,
            "proven_best": result.proven,
            "heuristics": list(result.heuristics),
            "gap": result.gap,
            "verdict": search_verdict(result),
        },
        "plans": plans,
        "written": str(args.output) if args.output else None,
        "frontier": [[s, c] for s, c, ok in result.points if ok],
    }
