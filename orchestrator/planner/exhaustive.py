"""The reference search: every plan of the plan space, simulated. For small markets only.

It enumerates what the planner's space allows without any pruning or heuristic: every microbatch
size, stage count, layer split, GPU type and TP degree per stage, data-parallel degree, placement of
each stage's replicas over places, sync algorithm and compression, spot or on-demand. Tests compare
the planner's best plan with its best for every objective.
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
                    for dp in dp_degrees(space, shape.mbs, shape.gpus_per_pipeline()):
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
