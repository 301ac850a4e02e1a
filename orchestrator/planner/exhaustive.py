"""The reference search: every plan of the plan space, simulated. For small markets only.

It enumerates what the planner's space allows without any pruning or heuristic: every microbatch
size, stage count, layer split, GPU type and TP degree per stage, data-parallel degree, placement of
each stage's replicas over places, sync algorithm and compression, spot or on-demand. Tests compare
the planner's best plan with its best for every objective. Its data-parallel degrees are every
least degree that fits, between two divisors too, for every objective: the planner leaves those out
where they cannot be best (``between_divisors``), and the comparison checks that too.
"""

from __future__ import annotations

from collections.abc import Iterator

from orchestrator.planner.candidates import (
    Evaluated,
    Evaluator,
    Shape,
    dp_degrees,
    type_assignments,
)
from orchestrator.planner.placement import placements
from orchestrator.planner.space import SearchSpace
from orchestrator.planner.splits import all_splits


def enumerate_all(evaluator: Evaluator, space: SearchSpace) -> Iterator[Evaluated]:
    for mbs in space.microbatch_sizes:
        for stages in range(1, space.max_stages + 1):
            for split in all_splits(space.num_layers, stages):
                for gpus, tps in type_assignments(space, stages):
                    shape = Shape(mbs, gpus, tps, split)
                    if evaluator.stage_times(shape) is None:
                        continue
                    for dp in dp_degrees(
                        space, shape.mbs, shape.gpus_per_pipeline(), every_least=True
                    ):
                        yield from _variants(evaluator, space, shape, dp)


def _variants(
    evaluator: Evaluator, space: SearchSpace, shape: Shape, dp: int
) -> Iterator[Evaluated]:
    for spot in space.spot_options:
        for columns in placements(space, shape.gpus, shape.tps, dp, spot, exact_limit=10**9):
            for allreduce in space.allreduce:
                for compression in space.compression if allreduce == "hierarchical" else ("none",):
                    yield evaluator.evaluate(
                        evaluator.build(shape, columns, allreduce, compression, spot)
                    )


def best(evaluated: list[Evaluated]) -> Evaluated | None:
    feasible = [e for e in evaluated if e.score.feasible]
    return max(feasible, key=lambda e: e.score.value) if feasible else None


def binding_objectives(fastest: Evaluated, *, steps: int, global_batch_size: int) -> dict[str, str]:
    """Every kind of objective, as recipe YAML, with limits set from a market's fastest plan so that
    they bind: a $/h budget at 60% of its spend, a floor at half its throughput, a deadline it
    would meet at 40% of its throughput. For comparisons with the exhaustive search."""
    throughput, spend = fastest.score.samples_per_s, fastest.score.spend_usd_per_hour
    deadline_h = steps * global_batch_size / (0.4 * throughput) / 3600
    return {
        "max_throughput": "{goal: max_throughput}",
        "min_cost": "{goal: min_cost}",
        "max_throughput_under_budget": (
            f"{{goal: max_throughput, budget_usd_per_hour: {0.6 * spend:.6g}}}"
        ),
        "min_cost_over_floor": (
            f"{{goal: min_cost, min_throughput_samples_per_s: {0.5 * throughput:.6g}}}"
        ),
        "min_cost_by_deadline": f"{{goal: min_cost, deadline_h: {deadline_h:.6g}}}",
        "max_throughput_risk_aware": "{goal: max_throughput, risk_aware: true}",
        "min_cost_risk_aware": "{goal: min_cost, risk_aware: true}",
    }
