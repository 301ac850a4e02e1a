"""Mixed stages: the search's best plan grown with pipelines of other GPU types.

The search (search.py) proves its best over plans whose stages each hold one GPU type and TP
degree. SAILOR also mixes GPU types among a stage's replicas: a V100 stage with one more replica on
a spare T4, pipelines built from different GPUs sharing the batch by their speed. ``grow`` reaches
such plans from the search's best: it tries to add one whole pipeline of the layer split built
from the GPUs the plan leaves unused (any GPU type a place can host at each stage's TP degree: the
runtime needs one degree per stage, ``check_plan``), or to swap one of the plan's pipelines for
such a pipeline, keeps the move that scores best if it beats the plan, and repeats. After each move the batch's microbatches are shared out anew, each to the
pipeline that would finish it first given its slowest stage (``speed_shares``).

This is a local search, not a bounded one: where a market has more than one GPU type, the search
result names "mixed stages" among the choices not all tried, without a bound (search.py).
"""

from __future__ import annotations

import heapq
from collections import Counter

from orchestrator.errors import UserError
from orchestrator.plan import Plan, Replica, Stage
from orchestrator.planner.candidates import Evaluated, Evaluator
from orchestrator.planner.space import Resource, SearchSpace

MAX_MOVES = 16  # pipelines added or swapped in one search, at most


def seeds(evaluator: Evaluator, space: SearchSpace, like: Plan) -> list[Evaluated]:
    """One-stage plans of one replica, one per GPU type and TP degree a place can host, at
    ``like``'s microbatch size and pricing: where the search's bounds cut the shallow plans short,
    growing these reaches data parallelism over several GPU types."""
    spot = like.stages[0].replicas[0].spot
    template = Plan(
        global_batch_size=like.global_batch_size,
        microbatch_size=like.microbatch_size,
        stages=(Stage(layers=(0, like.num_layers), replicas=like.stages[0].replicas[:1]),),
        allreduce=like.allreduce,
        compression=like.compression,
        streams=like.streams,
    )
    found = []
    for row in _new_rows(evaluator, space, template, [], spot):
        plan = _plan(evaluator, template, [row])
        if plan is not None:
            evaluated = evaluator.evaluate(plan)
            if not evaluated.estimate.oom:  # below a floor, say, growing may mend it
                found.append(evaluated)
    return found


def grow(evaluator: Evaluator, space: SearchSpace, start: Evaluated) -> list[Evaluated]:
    """The feasible plans the moves reached, in order, each better than the last; a start that
    is not feasible moves towards more throughput until it is."""
    found: list[Evaluated] = []
    current = start
    for _ in range(MAX_MOVES):
        better = _best_move(evaluator, space, current)
        if better is None:
            break
        if better.score.feasible:
            found.append(better)
        current = better
    return found


def _rank(evaluated: Evaluated) -> tuple:
    """Feasible plans by the objective's value; infeasible ones (a seed below a floor, say) by
    throughput, the way a move leads towards a feasible plan."""
    s = evaluated.score
    return (True, s.value) if s.feasible else (False, s.samples_per_s)


def _best_move(evaluator: Evaluator, space: SearchSpace, current: Evaluated) -> Evaluated | None:
    plan = current.plan
    rows = [tuple(stage.replicas[i] for stage in plan.stages) for i in range(plan.dp_degree)]
    spot = rows[0][0].spot
    best, floor = None, _rank(current)
    for row in _new_rows(evaluator, space, plan, rows, spot):
        options = [rows + [row]]
        # or swap out one pipeline of the most common kind other than the new one's
        common = next((kind for kind, _ in Counter(rows).most_common() if kind != row), None)
        if common is not None:
            swapped = list(rows)
            swapped.remove(common)
            options.append(swapped + [row])
        for candidate_rows in options:
            candidate = _plan(evaluator, plan, candidate_rows)
            if candidate is None:
                continue
            evaluated = evaluator.evaluate(candidate)
            rank = _rank(evaluated)
            if rank[0] == floor[0] and rank[1] <= floor[1] + 1e-12 * abs(floor[1]):
                continue
            if rank < floor:
                continue
            if best is None or rank > _rank(best):
                best = evaluated
    return best


def _new_rows(evaluator: Evaluator, space: SearchSpace, plan: Plan, rows, spot: bool):
    """Pipelines of one GPU type each, built from the GPUs ``rows`` leave free: each stage at the
    TP degree its replicas have (the runtime sums a stage's gradients shard by shard), any degree
    for a plan with no rows yet; all stages in one place where one has room, else stage by stage
    over the places in order (the plan's own places first)."""
    used = Counter()
    for row in rows:
        for r in row:
            used[(r.infra, r.gpu)] += r.tp
    total_free = None if space.max_gpus is None else space.max_gpus - sum(used.values())
    home = [r.infra for r in rows[0]] if rows else []
    if rows:
        options = [tuple(r.tp for r in rows[0])]
    else:
        options = [(tp,) * plan.num_stages for tp in space.tp_degrees]
    for gpu in space.gpu_types:
        places = sorted(
            (r for r in space.resources if r.gpu == gpu and (r.has_spot or not spot)),
            key=lambda r: (r.infra not in home, r.infra),
        )
        for tps in options:
            if total_free is not None and sum(tps) > total_free:
                continue
            if not _has_times(evaluator, plan, gpu, tps):
                continue
            infras = _fit(places, used, tps)
            if infras is not None:
                yield tuple(
                    evaluator.replica(gpu, tp, infra, spot)
                    for tp, infra in zip(tps, infras, strict=True)
                )


def _fit(places: list[Resource], used: Counter, tps: tuple[int, ...]) -> list[str] | None:
    """A place for each stage's replica of ``tps[s]`` GPUs: one place for all if one has room."""
    free = {r.infra: r.capacity - used[(r.infra, r.gpu)] for r in places}
    node = {r.infra: r.max_node_gpus for r in places}
    for infra, left in free.items():
        if left >= sum(tps) and node[infra] >= max(tps):
            return [infra] * len(tps)
    chosen = []
    for tp in tps:
        infra = next((p for p, left in free.items() if left >= tp and node[p] >= tp), None)
        if infra is None:
            return None
        free[infra] -= tp
        chosen.append(infra)
    return chosen


def _has_times(evaluator: Evaluator, plan: Plan, gpu: str, tps: tuple[int, ...]) -> bool:
    try:
        for stage, tp in zip(plan.stages, tps, strict=True):
            evaluator.profile.stage_times(gpu, plan.microbatch_size, tp, *stage.layers)
    except UserError:  # no times at this TP degree on this GPU
        return False
    return True


def speed_shares(periods: list[float], microbatches: int) -> tuple[int, ...] | None:
    """Microbatches per pipeline, each to the pipeline that would finish it first (the least
    ``(count + 1) * period``): the least largest ``count * period``. None when some pipeline gets
    none (it would only cost)."""
    counts = [0] * len(periods)
    heap = [(period, i) for i, period in enumerate(periods)]
    heapq.heapify(heap)
    for _ in range(microbatches):
        _, i = heapq.heappop(heap)
        counts[i] += 1
        heapq.heappush(heap, ((counts[i] + 1) * periods[i], i))
    return tuple(counts) if min(counts) > 0 else None


def _plan(evaluator: Evaluator, plan: Plan, rows: list[tuple[Replica, ...]]) -> Plan | None:
    mbs = plan.microbatch_size
    periods = []
    for row in rows:
        slowest = 0.0
        for stage, r in zip(plan.stages, row, strict=True):
            f, b, _ = evaluator.profile.stage_times(r.gpu, mbs, r.tp, *stage.layers)
            slowest = max(slowest, f + b)
        periods.append(slowest)
    order = sorted(range(len(rows)), key=lambda i: (periods[i], i))  # like pipelines together
    rows, periods = [rows[i] for i in order], [periods[i] for i in order]
    shares = speed_shares(periods, plan.global_batch_size // mbs)
    if shares is None:
        return None
    return Plan(
        global_batch_size=plan.global_batch_size,
        microbatch_size=mbs,
        stages=tuple(
            Stage(layers=stage.layers, replicas=tuple(row[s] for row in rows))
            for s, stage in enumerate(plan.stages)
        ),
        allreduce=plan.allreduce,
        compression=plan.compression,
        streams=plan.streams,
        pipeline_warmup=None,
        pipeline_microbatches=shares,
    )
