"""Words for plans: where their GPUs are, their shape, why a runner-up lost, what binds when none fits.

The planner ranks plans by one number; people deciding what to rent want the reason behind the order
("DP across us-central1 and europe-west1: all-reduce 3.1 s/iteration, $0.42/iteration egress"), and,
when no plan meets the objective, which limit binds and what to relax.
"""

from __future__ import annotations

from collections import Counter

from orchestrator.errors import UserError
from orchestrator.plan import Plan
from orchestrator.planner.candidates import Evaluated
from orchestrator.planner.objective import Objective
from orchestrator.planner.search import SearchResult
from orchestrator.simulator import NetworkView


def gpus_by_location(plan: Plan) -> str:
    """``gcp/us-central1/us-central1-a: 16 A100 spot; ...`` (GPUs, not replicas)."""
    counts: Counter = Counter()
    for stage in plan.stages:
        for r in stage.replicas:
            counts[(r.infra, r.gpu, "spot" if r.spot else "on-demand")] += r.tp
    places: dict[str, list[str]] = {}
    for (infra, gpu, pricing), n in sorted(counts.items()):
        places.setdefault(infra, []).append(f"{n} {gpu} {pricing}")
    return "; ".join(f"{infra}: {', '.join(items)}" for infra, items in places.items())


def shape_text(plan: Plan) -> str:
    """``PP4 x DP16 x TP1/2``: stages, replicas per stage, and the TP degrees used."""
    tps = sorted({r.tp for s in plan.stages for r in s.replicas})
    return f"PP{plan.num_stages} x DP{plan.dp_degree} x TP{'/'.join(map(str, tps))}"


def peak_memory(evaluated: Evaluated) -> tuple[float, float]:
    """(peak bytes, capacity bytes) of the GPU closest to its capacity."""
    worst = max(evaluated.estimate.memory, key=lambda m: m.peak_memory_bytes / m.capacity_bytes)
    return worst.peak_memory_bytes, worst.capacity_bytes


def why_behind(
    runner: Evaluated, best: Evaluated, network: NetworkView, objective: Objective
) -> str:
    """The main reason ``runner`` ranks below ``best``, with the figures behind it."""
    r, b = runner.estimate, best.estimate
    reasons: list[tuple[float, str]] = []  # (seconds per iteration it costs over the best, words)
    sync_r, stage_r = _worst_sync(runner)
    sync_b, _ = _worst_sync(best)
    if stage_r is not None:
        regions = sorted({network.region_of(x.infra) for x in runner.plan.stages[stage_r].replicas})
        where = f"DP across {' and '.join(regions)}" if len(regions) > 1 else "all-reduce"
        egress = (
            f", ${r.egress_usd_per_iteration:.3g}/iteration egress"
            if r.egress_usd_per_iteration
            else ""
        )
        reasons.append(
            (sync_r - sync_b, f"{where}: all-reduce {sync_r:.3g} s/iteration exposed{egress}")
        )
    reasons.append(
        (
            r.bubble_s - b.bubble_s,
            f"pipeline fill and drain {r.bubble_s:.3g} s/iteration ({r.microbatches[0]} microbatches "
            f"over {runner.plan.num_stages} stages)",
        )
    )
    steady_r = r.pipeline_s - r.bubble_s
    steady_b = b.pipeline_s - b.bubble_s
    reasons.append(
        (
            steady_r - steady_b,
            f"{r.period_s * 1000:.3g} ms per microbatch set by {r.bottleneck}, "
            f"{r.microbatches[0]} microbatches per pipeline",
        )
    )
    extra, words = max(reasons, key=lambda x: x[0])
    slower = r.iteration_time_s > b.iteration_time_s * 1.0005
    pace = f"{runner.score.samples_per_s:,.1f} vs {best.score.samples_per_s:,.1f} samples/s"
    if objective.goal == "min_cost" or not slower:
        cost = (
            f"${runner.score.cost_per_million_samples_usd:,.2f} vs "
            f"${best.score.cost_per_million_samples_usd:,.2f} per 1M samples"
        )
        if r.egress_usd_per_iteration > 0.1 * r.cost_per_iteration_usd:
            share = r.egress_usd_per_iteration / r.cost_per_iteration_usd
            return f"{cost}: egress is {share:.0%} of its cost ({words})"
        if not slower:
            return f"{cost} at {pace}: its GPUs cost ${r.cost_per_hour_usd:,.2f}/h"
        return f"{cost}: {words}"
    if extra <= 0:
        words = f"{runner.plan.total_gpus} GPUs against {best.plan.total_gpus}"
    return f"{pace}: {words}"


def _worst_sync(evaluated: Evaluated) -> tuple[float, int | None]:
    stages = evaluated.estimate.stages
    if not stages or evaluated.plan.dp_degree < 2:
        return 0.0, None
    worst = max(stages, key=lambda s: s.dp_sync_exposed_s)
    return worst.dp_sync_exposed_s, worst.stage


def no_plan_error(result: SearchResult, objective: Objective) -> UserError:
    """Which limit binds when no plan meets the objective, and what to relax."""
    if result.unreachable_floor is not None:
        return UserError(
            f"no plan reaches {objective.min_samples_per_s:,.3g} samples/s: even at the bound the "
            f"search proves, the market allows at most {result.unreachable_floor:,.3g}",
            field="objective",
            fix="lower min_throughput_samples_per_s, extend deadline_h, or allow more GPUs "
            "(constraints.max_gpus, locations, gpu_types)",
        )
    budget = objective.budget_usd_per_hour
    if result.no_fit and result.cheapest_usd_per_hour is not None and budget is not None:
        return UserError(
            f"no plan meets the objective: budget_usd_per_hour binds: the cheapest pipeline that "
            f"fits in memory costs ${result.cheapest_usd_per_hour:,.2f}/h for its GPUs alone, over "
            f"the budget of ${budget:,.2f}/h",
            field="objective.budget_usd_per_hour",
            fix=f"raise objective.budget_usd_per_hour to at least {result.cheapest_usd_per_hour:.2f}, "
            "or allow cheaper GPUs (constraints.gpu_types, locations) or spot pricing",
        )
    if result.no_fit or (result.violations and set(result.violations) == {"memory"}):
        skipped = ", ".join(f"{n} for {why}" for why, n in result.skipped.most_common()) or "all"
        return UserError(
            f"no plan fits: configurations left out: {skipped}",
            field="parallelism",
            fix="allow more pipeline stages (parallelism.max_pipeline_stages), larger TP "
            "(parallelism.tensor_parallel), GPUs with more memory (constraints.gpu_types), smaller "
            "training.microbatch_sizes, or more GPUs (constraints.max_gpus, locations)",
        )
    closest = result.closest
    limit = result.violations.most_common(1)[0][0] if result.violations else "objective"
    detail = ""
    if closest is not None:
        s = closest.score
        limit = s.violation
        detail = (
            f"; the closest plan ({shape_text(closest.plan)}, {closest.plan.total_gpus} GPUs) gives "
            f"{s.samples_per_s:,.3g} samples/s at ${s.spend_usd_per_hour:,.2f}/h"
        )
    fixes = {
        "budget_usd_per_hour": "raise objective.budget_usd_per_hour, or allow cheaper GPUs or spot",
        "budget_usd": "raise objective.budget_usd, or train fewer steps",
        "throughput floor": "lower the throughput floor or extend the deadline",
        "memory": "allow more stages, larger TP or GPUs with more memory",
    }
    return UserError(
        f"no plan meets the objective: {limit} binds{detail}",
        field="objective",
        fix=fixes.get(limit, "relax the objective's limits or allow more GPUs"),
    )
