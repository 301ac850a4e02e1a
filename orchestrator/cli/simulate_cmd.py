"""``python -m orchestrator simulate RECIPE --plan PLAN.yaml [--json]``: predict a plan."""

from __future__ import annotations

import argparse
from pathlib import Path

from orchestrator.catalog import Catalog
from orchestrator.cli.output import format_table, print_json
from orchestrator.plan import Plan, load_plan
from orchestrator.planner import given_plan
from orchestrator.recipe import Recipe, load_recipe
from orchestrator.simulator import (
    Estimate,
    latency_aware_plan_warmup,
    simulate,
)
from orchestrator.simulator.core import describe_bottleneck

GIB = 1024**3


def add_simulate(commands: argparse._SubParsersAction, formatter: type) -> None:
    p = commands.add_parser(
        "simulate",
        help="predict iteration time, memory per GPU and dollars of a plan",
        description="Predict a plan for a recipe's model before anything runs: iteration time and its "
        "breakdown (compute per stage, pipeline fill and drain, transfers between places, "
        "data-parallel sync, optimizer), peak memory per GPU with an OOM flag, $/h, egress $ "
        "and $ per 1M samples.",
        formatter_class=formatter,
        epilog="example:\n  python -m orchestrator simulate recipes/sailor-opt350m-gcp-zones.yaml "
        "--plan recipes/plans/sailor-opt350m-4zones.yaml",
    )
    p.add_argument(
        "recipe", type=Path, metavar="RECIPE", help="the recipe (model, batch, precision, provider)"
    )
    p.add_argument(
        "--plan", type=Path, required=True, metavar="PLAN", help="a plan .yaml (docs/plan.md)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(run=run_simulate)


def estimate_plan(
    recipe: Recipe, plan: Plan, catalog: Catalog
) -> tuple[Plan, Estimate, dict | None]:
    """Check ``plan`` against the recipe, the catalog and the profile, then simulate it. The third
    value suggests a latency-aware warm-up when a link's round trip paces a pipeline."""
    given = given_plan(recipe, plan, catalog)
    plan, estimate, profile, network = given.plan, given.estimate, given.profile, given.network
    prices, settings = given.prices, given.settings
    suggestion = None
    if estimate.bottleneck.startswith("loop"):
        warmup = latency_aware_plan_warmup(profile, plan, network)
        better = simulate(
            profile,
            plan.with_warmup(warmup),
            network=network,
            prices=prices,
            settings=settings,
        )
        suggestion = {
            "pipeline_warmup": list(warmup),
            "samples_per_s": better.samples_per_s,
            "peak_memory_bytes": better.peak_memory_bytes,
            "oom": better.oom,
        }
    return plan, estimate, suggestion


def run_simulate(args: argparse.Namespace, catalog: Catalog) -> int:
    recipe = load_recipe(args.recipe, catalog=catalog)
    plan, estimate, suggestion = estimate_plan(recipe, load_plan(args.plan), catalog)
    if args.json:
        print_json(
            {
                "recipe": recipe.name,
                "plan": str(args.plan),
                **estimate.to_dict(),
                "suggestions": [suggestion] if suggestion else [],
            }
        )
        return 0
    _print_estimate(plan, estimate)
    if suggestion:
        print(
            f"suggestion: a link's round trip paces the pipeline; pipeline_warmup: {suggestion['pipeline_warmup']} "
            f"gives {suggestion['samples_per_s']:,.2f} samples/s with peak memory "
            f"{suggestion['peak_memory_bytes'] / GIB:.1f} GiB{' (OOM)' if suggestion['oom'] else ''}"
        )
    return 0


def _print_estimate(plan: Plan, e: Estimate) -> None:
    gpus = ", ".join(f"{g} ({source})" for g, source in e.profile_sources)
    print(
        f"plan: {plan.num_stages} stages x {plan.dp_degree} replicas, {plan.total_gpus} GPUs; microbatch "
        f"{plan.microbatch_size}, {max(e.microbatches)} microbatches per pipeline; {plan.allreduce} all-reduce"
        + (f", {plan.compression} cross-region" if plan.compression != "none" else "")
    )
    print(f"profile: {gpus}")
    tokens = f", {e.tokens_per_s:,.0f} tokens/s" if e.tokens_per_s else ""
    print(f"\niteration {e.iteration_time_s:.4g} s: {e.samples_per_s:,.2f} samples/s{tokens}")
    print(
        f"pipeline {e.pipeline_s:.4g} s: {e.period_s * 1000:.4g} ms per microbatch set by "
        f"{describe_bottleneck(plan, e.bottleneck)}; fill and drain {e.bubble_s:.3g} s"
    )
    rows = []
    for stage in e.stages:
        mine = [m for m in e.memory if m.stage == stage.stage]
        worst = max(mine, key=lambda m: m.peak_memory_bytes / m.capacity_bytes)
        rows.append(
            (
                stage.stage,
                f"{stage.layers[0]}-{stage.layers[1] - 1}",
                stage.forward_s * 1000,
                stage.backward_s * 1000,
                stage.send_s * 1000,
                stage.dp_sync_s,
                stage.dp_sync_exposed_s,
                stage.update_s * 1000,
                worst.peak_memory_bytes / GIB,
                worst.capacity_bytes / GIB,
                "OOM" if any(m.oom for m in mine) else "ok",
            )
        )
    print()
    print(
        format_table(
            (
                "stage",
                "layers",
                "fwd_ms",
                "bwd_ms",
                "send_ms",
                "dp_sync_s",
                "exposed_s",
                "update_ms",
                "peak_gib",
                "capacity_gib",
                "memory",
            ),
            rows,
        )
    )
    first, last = e.stages[0], e.stages[-1]
    if first.tied_wait_s > 0 or (len(e.stages) > 1 and last.tied_wait_s > 0):
        print(
            f"tied embedding: stage 0 waits {first.tied_wait_s * 1000:.3g} ms for the last stage's "
            f"gradient; the sum's return delays the next iteration by {last.tied_wait_s * 1000:.3g} ms"
        )
    share = (
        e.egress_usd_per_iteration / e.cost_per_iteration_usd if e.cost_per_iteration_usd else 0.0
    )
    print(
        f"\ncost: ${e.cost_per_hour_usd:,.2f}/h of GPUs; per iteration ${e.compute_usd_per_iteration:.4g} compute "
        f"+ ${e.egress_usd_per_iteration:.4g} egress = ${e.cost_per_iteration_usd:.4g}; "
        f"${e.cost_per_million_samples_usd:,.2f} per 1M samples (egress {share:.0%})"
    )
    if e.egress:
        print()
        print(
            format_table(
                ("egress_from", "to", "gb_per_iteration", "usd_per_iteration"),
                [
                    (x.src, x.dst, x.bytes_per_iteration / 1e9, x.usd_per_iteration)
                    for x in e.egress
                ],
            )
        )
    print(
        f"\ngranularity {e.granularity:.3g} (compute / communication): doubling the GPUs would give at most "
        f"{e.speedup_if_doubled:.2f}x"
    )
    if e.oom:
        print("\nOOM: some replicas do not fit their GPU's memory (peak_gib > capacity_gib)")
    for note in e.notes:
        print(f"note: {note}")
