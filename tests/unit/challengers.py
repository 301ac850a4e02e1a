"""Random markets, recipes and challenger plans for tests/unit/test_planner_challenger.py.

A market: 1 or 2 GPU types of T4, L4, A100, V100 in places of 1 or 2 regions, random node sizes,
capacities, prices and preemption rates; a recipe: gpt-tiny or gpt-mini with analytic profiles,
random batch and microbatch sizes, TP degrees, stage limits, pricing and compression. A challenger
(``Draft``) is built only from the market's offers and the recipe's choices: random stage counts
and splits, data-parallel degrees that need not divide the batch with even, random or
speed-weighted shares, (GPU, TP) per stage, per pipeline or per replica, places at random or
following the pipeline; ``mutate`` moves one thing at a time for the hill climbs. Each is scored by
the planner's own evaluator (``evaluate``); ``outside_space`` names what puts a plan outside the
planner's space.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections import Counter
from dataclasses import dataclass

from orchestrator.catalog import OFFER_COLUMNS, default_catalog
from orchestrator.plan import Plan, PlanError, Replica, check_plan
from orchestrator.planner import Evaluated, PlanningContext, prepare
from orchestrator.planner.candidates import between_divisors, dp_degrees
from orchestrator.planner.candidates import shares as even_shares
from orchestrator.recipe import parse_recipe
from orchestrator.simulator import check_plan_runs

CLIMB_STEPS = 100  # per start (the planner's best, the best random plan) and objective

REGIONS = {
    "us-central1": ("us-central1-a", "us-central1-b"),
    "europe-west4": ("europe-west4-a", "europe-west4-b"),
    "us-east1": ("us-east1-b", "us-east1-c"),
}
ON_DEMAND_USD = {"T4": 0.35, "L4": 0.70, "V100": 2.48, "A100": 3.67}  # per GPU-hour, roughly GCP's


# ---- markets and recipes -------------------------------------------------------------------
def write_market(rng: random.Random, folder) -> None:
    """1-2 GPU types in 1-2 zones of each of 1-2 regions, nodes of 1, 2 or 4 GPUs, at most 16."""
    gpus = rng.sample(sorted(ON_DEMAND_USD), rng.choice([1, 2]))
    regions = rng.sample(sorted(REGIONS), rng.choice([1, 2]))
    rows, total = [",".join(OFFER_COLUMNS)], 0
    for region in regions:
        for zone in REGIONS[region][: rng.choice([1, 2])]:
            for gpu in gpus:
                node = rng.choice([1, 1, 2, 4])
                count = rng.randint(0, 6 // node)
                if not count or total + count * node > 16:
                    continue
                total += count * node
                on_demand = round(node * ON_DEMAND_USD[gpu] * rng.uniform(0.8, 1.3), 3)
                spot = round(on_demand * rng.uniform(0.2, 0.6), 3)
                rate = round(rng.uniform(0.0, 0.5), 3)
                rows.append(
                    f"gcp,{region},{zone},vm-{gpu}-{node},{gpu},{node},8,30,{on_demand},{spot},"
                    f"{count},{rate},test,2026-01-01"
                )
    if total == 0:
        rows.append("gcp,us-central1,us-central1-a,vm-T4,T4,1,8,30,0.35,0.12,2,0.1,test,2026-01-01")
    (folder / "market.csv").write_text("\n".join(rows) + "\n")


def recipe_text(rng: random.Random) -> str:
    """A recipe's fields but its objective (``{objective}``, filled per objective)."""
    model = rng.choice(["gpt-tiny", "gpt-mini"])
    batch = rng.choice([8, 12, 16, 24])
    microbatches = sorted(rng.sample([1, 2, 4], rng.choice([1, 2, 3])))
    tp = rng.choice(["[1]", "[1, 2]"])
    stages = rng.choice([2, 3, 3, 4])  # 4 stages of 2 GPU types and 2 TP degrees: type orders
    pricing = rng.choice(["spot", "any", "any"])
    compression = rng.choice(["none", "fp16"])
    return (
        f"model: {{name: {model}}}\nprovider: gcp\nmarket: market.csv\n"
        f"training: {{global_batch_size: {batch}, microbatch_sizes: {microbatches}, steps: 100}}\n"
        "objective: {objective}\n"
        f"constraints: {{pricing: {pricing}}}\n"
        f"parallelism: {{tensor_parallel: {tp}, max_pipeline_stages: {stages}}}\n"
        f"runtime: {{allreduce: auto, compression: {compression}}}\n"
    )


def context_for(folder, text: str, objective: str) -> PlanningContext:
    catalog = default_catalog()
    recipe = parse_recipe(
        text.replace("{objective}", objective), file="r.yaml", folder=folder, catalog=catalog
    )
    return prepare(recipe, catalog)


# ---- challengers ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Draft:
    """A plan being built or changed: per pipeline, its replica in every stage."""

    mbs: int
    split: tuple[int, ...]  # stage boundaries, 0 ... L
    rows: tuple[tuple[Replica, ...], ...]  # per pipeline, per stage
    shares: tuple[int, ...] | None  # microbatches per pipeline; None: equal
    allreduce: str
    compression: str

    @classmethod
    def of(cls, plan: Plan) -> Draft:
        rows = tuple(zip(*(s.replicas for s in plan.stages), strict=True))
        split = (0, *(s.end_layer for s in plan.stages))
        return cls(
            plan.microbatch_size,
            split,
            rows,
            plan.pipeline_microbatches,
            plan.allreduce,
            plan.compression,
        )

    def plan(self, context: PlanningContext) -> Plan:
        space = context.space
        return Plan.from_pipelines(
            global_batch_size=space.global_batch_size,
            microbatch_size=self.mbs,
            layers=list(zip(self.split, self.split[1:], strict=False)),
            pipelines=[(1, row) for row in self.rows],
            allreduce=self.allreduce,
            compression=self.compression,
            streams=space.streams,
            pipeline_microbatches=self.shares,
        )


def pairs_of(context: PlanningContext) -> list[tuple[str, int]]:
    """(GPU, TP) pairs some place hosts under some allowed pricing."""
    space = context.space
    return [
        (g, t)
        for g in space.gpu_types
        for t in space.tp_degrees
        if any(space.places(g, t, spot) for spot in space.spot_options)
    ]


def used_gpus(rows) -> Counter:
    used: Counter = Counter()
    for row in rows:
        for r in row:
            used[(r.infra, r.gpu)] += r.tp
    return used


def within_market(draft: Draft, context: PlanningContext) -> bool:
    """The planner's own rules (placement.py): a replica's place hosts its GPU at its TP degree and
    pricing, places give at most their capacity of each type, at most ``max_gpus`` in all; and the
    recipe's choices: microbatch size, TP degrees, stages, DP degrees, sync, spread."""
    space = context.space
    capacity = {(r.infra, r.gpu): r.capacity for r in space.resources}
    used = used_gpus(draft.rows)
    if any(n > capacity.get(key, 0) for key, n in used.items()):
        return False
    if space.max_gpus is not None and sum(used.values()) > space.max_gpus:
        return False
    for row in draft.rows:
        for r in row:
            if r.tp not in space.tp_degrees or r.spot not in space.spot_options:
                return False
            if r.infra not in {p.infra for p in space.places(r.gpu, r.tp, r.spot)}:
                return False
    dp, stages = len(draft.rows), len(draft.split) - 1
    if space.data_parallel and dp not in space.data_parallel:
        return False
    if len({r.infra for row in draft.rows for r in row}) < space.min_locations:
        return False
    return (
        draft.mbs in space.microbatch_sizes
        and 1 <= stages <= space.max_stages
        and draft.allreduce in space.allreduce
        and draft.compression
        in (space.compression if draft.allreduce == "hierarchical" else ("none",))
    )


def random_split(rng: random.Random, layers: int, stages: int) -> tuple[int, ...]:
    return (0, *sorted(rng.sample(range(1, layers), stages - 1)), layers)


def replica_choice(rng, context, gpu, tp, spot, left, near: str | None) -> Replica | None:
    """A replica of ``tp`` GPUs of ``gpu`` at a place with room: ``near`` when it has some and
    a coin says so (pipelines that stay in a place), else any."""
    places = [r.infra for r in context.space.places(gpu, tp, spot) if left[(r.infra, gpu)] >= tp]
    if not places:
        return None
    infra = near if near in places and rng.random() < 0.7 else rng.choice(places)
    left[(infra, gpu)] -= tp
    return Replica(gpu=gpu, tp=tp, infra=infra, spot=spot)


def random_shares(rng, context, draft: Draft) -> tuple[int, ...] | None:
    """Even (as the planner shares), random, or weighted by each pipeline's slowest stage."""
    total = context.space.global_batch_size // draft.mbs
    dp = len(draft.rows)
    how = rng.choice(["even", "random", "weighted"])
    if how == "even" or dp == 1:
        return even_shares(total, dp)
    if how == "random":
        cuts = sorted(rng.sample(range(1, total), dp - 1))
        return unequal(tuple(b - a for a, b in zip((0, *cuts), (*cuts, total), strict=True)))
    profile, speeds = context.evaluator.profile, []
    for row in draft.rows:
        slowest = max(
            sum(profile.stage_times(r.gpu, draft.mbs, r.tp, a, b)[:2])
            for r, a, b in zip(row, draft.split, draft.split[1:], strict=False)
        )
        speeds.append(1 / slowest)
    return unequal(weighted(total, speeds))


def unequal(counts) -> tuple[int, ...] | None:
    """``counts`` as a plan's ``pipeline_microbatches``: None where they are all equal."""
    return tuple(counts) if counts and len(set(counts)) > 1 else None


def weighted(total: int, speeds: list[float]) -> tuple[int, ...]:
    """``total`` shared in proportion to ``speeds``, at least 1 each, largest remainders first."""
    spare = total - len(speeds)
    raw = [spare * s / sum(speeds) for s in speeds]
    shares = [1 + math.floor(x) for x in raw]
    for i in sorted(range(len(raw)), key=lambda i: raw[i] - math.floor(raw[i]), reverse=True):
        if sum(shares) == total:
            break
        shares[i] += 1
    return tuple(shares)


def random_draft(rng: random.Random, context: PlanningContext) -> Draft | None:
    space = context.space
    pairs = pairs_of(context)
    mbs = rng.choice(space.microbatch_sizes)
    total = space.global_batch_size // mbs
    stages = rng.randint(1, space.max_stages)
    split = random_split(rng, space.num_layers, stages)
    style = rng.choice(["uniform", "pipelines", "replicas"])  # one pair per stage, pipeline, GPU
    mixed = rng.random() < 0.3  # spot and on-demand replicas in one plan
    spot = rng.choice(space.spot_options)
    stage_pairs = [rng.choice(pairs) for _ in range(stages)]
    left = {(r.infra, r.gpu): r.capacity for r in space.resources}
    most = min(total, space.max_gpus or total, rng.randint(1, total))
    rows: list[tuple[Replica, ...]] = []
    while len(rows) < most:
        pipeline_pairs = [rng.choice(pairs) for _ in range(stages)]
        trial, row, near = dict(left), [], None
        for s in range(stages):
            gpu, tp = {
                "uniform": stage_pairs[s],
                "pipelines": pipeline_pairs[s],
                "replicas": rng.choice(pairs),
            }[style]
            pricing = rng.choice(space.spot_options) if mixed else spot
            replica = replica_choice(rng, context, gpu, tp, pricing, trial, near)
            if replica is None:
                break
            row.append(replica)
            near = replica.infra
        if len(row) < stages:
            break
        rows.append(tuple(row))
        left = trial
    if not rows:
        return None
    allreduce = rng.choice(space.allreduce)
    compression = rng.choice(space.compression) if allreduce == "hierarchical" else "none"
    draft = Draft(mbs, split, tuple(rows), None, allreduce, compression)
    return dataclasses.replace(draft, shares=random_shares(rng, context, draft))


def mutate(rng: random.Random, context: PlanningContext, draft: Draft) -> Draft | None:
    """One random move; None when it does not apply."""
    space = context.space
    rows = [list(row) for row in draft.rows]
    dp, stages = len(rows), len(draft.split) - 1
    total = space.global_batch_size // draft.mbs
    shares = list(draft.shares) if draft.shares else None
    left = {(r.infra, r.gpu): r.capacity for r in space.resources}
    left.update({key: left.get(key, 0) - n for key, n in used_gpus(rows).items()})
    move = rng.choice(
        [
            *("boundary", "place", "pair", "spot", "stage pair", "pricing", "add", "remove"),
            *("share", "split", "merge", "sync"),
        ]
    )
    split = list(draft.split)
    if move == "boundary" and stages > 1:
        b = rng.randint(1, stages - 1)
        split[b] += rng.choice([-1, 1])
        if not split[b - 1] < split[b] < split[b + 1]:
            return None
    elif move in ("place", "pair", "spot"):
        i, s = rng.randrange(dp), rng.randrange(stages)
        old = rows[i][s]
        left[(old.infra, old.gpu)] += old.tp
        gpu, tp = rng.choice(pairs_of(context)) if move == "pair" else (old.gpu, old.tp)
        spot = rng.choice(space.spot_options) if move == "spot" else old.spot
        near = rows[i][s - 1].infra if s and move != "place" else None
        replica = replica_choice(rng, context, gpu, tp, spot, left, near or old.infra)
        if replica is None:
            return None
        rows[i][s] = replica
    elif move in ("stage pair", "pricing"):
        s = rng.randrange(stages)
        gpu, tp = rng.choice(pairs_of(context))
        spot = rng.choice(space.spot_options)
        for row in rows:
            for t in range(stages) if move == "pricing" else (s,):
                old = row[t]
                left[(old.infra, old.gpu)] += old.tp
                if move == "pricing":
                    gpu, tp = old.gpu, old.tp
                replica = replica_choice(rng, context, gpu, tp, spot, left, old.infra)
                if replica is None:
                    return None
                row[t] = replica
    elif move == "add" and dp < total:
        copy, row = rows[rng.randrange(dp)], []
        for r in copy:
            replica = replica_choice(rng, context, r.gpu, r.tp, r.spot, left, r.infra)
            if replica is None:
                return None
            row.append(replica)
        rows.append(row)
        shares = None  # shared out again below
    elif move == "remove" and dp > 1:
        del rows[rng.randrange(dp)]
        shares = None
    elif move == "share" and dp > 1:
        shares = shares or [total // dp] * dp  # None: equal shares
        a, b = rng.sample(range(dp), 2)
        if shares[a] <= 1:
            return None
        shares[a] -= 1
        shares[b] += 1
    elif move == "split" and stages < space.max_stages:
        s = rng.randrange(stages)
        if split[s + 1] - split[s] < 2:
            return None
        split.insert(s + 1, rng.randint(split[s] + 1, split[s + 1] - 1))
        for row in rows:
            r = row[s]
            replica = replica_choice(rng, context, r.gpu, r.tp, r.spot, left, r.infra)
            if replica is None:
                return None
            row.insert(s + 1, replica)
    elif move == "merge" and stages > 1:
        s = rng.randrange(stages - 1)
        del split[s + 1]
        for row in rows:
            del row[s + 1 if rng.random() < 0.5 else s]
    elif move == "sync":
        allreduce = rng.choice(space.allreduce)
        compression = rng.choice(space.compression) if allreduce == "hierarchical" else "none"
        return dataclasses.replace(draft, allreduce=allreduce, compression=compression)
    else:
        return None
    moved = dataclasses.replace(draft, split=tuple(split), rows=tuple(tuple(row) for row in rows))
    if shares is None or len(shares) != len(rows):
        shares = unequal(even_shares(total, len(rows)))
    return dataclasses.replace(moved, shares=unequal(shares))


# ---- scoring and the verdict ---------------------------------------------------------------
def evaluate(context: PlanningContext, draft: Draft) -> Evaluated | None:
    """The challenger scored as the planner scores its plans (``Evaluator.evaluate``: the
    simulator, the latency-aware warm-up where it is faster and fits, the objective and risk);
    None where it breaks the market's or the recipe's rules."""
    if not within_market(draft, context):
        return None
    plan = draft.plan(context)
    try:
        check_plan(plan)  # e.g. a stage's replicas at two TP degrees: the runtime cannot run it
    except PlanError:
        return None
    e = context.evaluator
    check_plan_runs(plan, e.profile, e.network, e.prices)
    return e.evaluate(plan)


def outside_space(plan: Plan, context: PlanningContext) -> tuple[str, ...]:
    """What puts ``plan`` outside the planner's plan space (docs/planner.md): a stage whose
    replicas differ in GPU type or TP degree (SAILOR's heterogeneous stages), spot and on-demand
    in one plan, a data-parallel degree the planner does not list (``dp_degrees``), shares other
    than as even as they go, pipelines chained otherwise than in place order."""
    out = []
    if any(len({(r.gpu, r.tp) for r in s.replicas}) > 1 for s in plan.stages):
        out.append("heterogeneous stage")
    if len({r.spot for s in plan.stages for r in s.replicas}) > 1:
        out.append("mixed pricing")
    if out:
        return tuple(out)
    space, dp = context.space, plan.dp_degree
    need: Counter = Counter()
    for stage in plan.stages:
        need[stage.replicas[0].gpu] += stage.replicas[0].tp
    objective = context.evaluator.objective
    listed = dp_degrees(
        space,
        plan.microbatch_size,
        need,
        most_affordable=_affordable(plan, context),
        every_least=between_divisors(objective),
    )
    if dp not in listed:
        out.append("degree")
    total = space.global_batch_size // plan.microbatch_size
    if tuple(plan.microbatches()) != tuple(even_shares(total, dp) or (total // dp,) * dp):
        out.append("shares")
    rows = Counter(zip(*(s.replicas for s in plan.stages), strict=True))
    ordered = zip(*(sorted(s.replicas, key=lambda r: r.infra) for s in plan.stages), strict=True)
    if rows != Counter(ordered):
        out.append("chaining")
    return tuple(out)


def _affordable(plan: Plan, context: PlanningContext) -> int | None:
    """The most pipelines like ``plan``'s a $/h budget pays for (their GPUs at the cheapest
    allowed prices), as the search counts them; None without a budget."""
    budget = context.evaluator.objective.budget_usd_per_hour
    if budget is None:
        return None
    prices = []
    for spot in context.space.spot_options:
        stage_prices = [
            context.evaluator.cheapest_gpu_hour(s.replicas[0].gpu, s.replicas[0].tp, spot)
            for s in plan.stages
        ]
        if None not in stage_prices:
            prices.append(
                sum(p * s.replicas[0].tp for p, s in zip(stage_prices, plan.stages, strict=True))
            )
    return max(1, math.floor(budget / min(prices) * (1 + 1e-12))) if prices else None


def climb(
    rng: random.Random, context: PlanningContext, start: Evaluated, *, inside: bool
) -> Evaluated:
    """The best plan reached from ``start`` by single moves that each improve the score (with
    ``inside``, only through plans of the planner's space)."""
    current, draft = start, Draft.of(start.plan)
    for _ in range(CLIMB_STEPS):
        moved = mutate(rng, context, draft)
        found = None if moved is None else evaluate(context, moved)
        if (
            found is not None
            and found.score.feasible
            and found.score.value > current.score.value
            and (not inside or not outside_space(found.plan, context))
        ):
            current, draft = found, moved
    return current
