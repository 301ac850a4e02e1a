"""Challengers: random feasible plans, SAILOR-style shapes included, never beat the planner.

For seeded random small markets (1 or 2 GPU types of T4, L4, A100, V100; places in 1 or 2 regions;
random node sizes, capacities, prices and preemption rates) and recipes (gpt-tiny or gpt-mini with
analytic profiles, random global batch and microbatch sizes, TP degrees, stage limits, pricing,
compression, every objective with limits that bind), the planner runs as ``plan`` does (on a
third of the markets with splits and placements cut to menus, to put the gap it reports to the
test). Then
challengers, built only from the market's offers and the recipe's constraints, are simulated and
scored by the planner's own evaluator (the same simulator, settings, warm-up choice and scoring):

- random plans: a stage count and layer split, a data-parallel degree that need not divide the
  batch, with even, random or speed-weighted shares; per stage one (GPU, TP) pair for every replica,
  or one per pipeline (pipelines of different types), or one per replica (SAILOR's heterogeneous
  stages); places at random or following the pipeline, spot and on-demand mixed where allowed;
- hill climbs from the planner's best plan and from the best random one, one move at a time (a
  layer boundary, a replica's place, type or pricing, a pipeline more or less, a microbatch moved
  between pipelines, a stage split or merged, the sync algorithm).

Each must pass ``check_plan`` and ``check_plan_runs``, fit the places' capacities as the planner
counts them (``SearchSpace.places``, ``Resource.capacity``, ``max_gpus``) and keep to the recipe's
choices; memory and the objective's limits are the score's (``Score.feasible``). None may beat the
planner's best by more than 0.1%, unless the gap the planner reports covers it; where the planner
reports no gap (interleaved GPU types not all tried), a win is a warning, not a failure.

Challengers inside the planner's space (``outside_space``: nothing) must lose on every market. The
wins found outside it are listed: ``SPACE_GAPS`` (SAILOR's heterogeneous stages) and an expected
failure (a data-parallel degree between two divisors, under a $/h budget).
"""

from __future__ import annotations

import dataclasses
import math
import random
import warnings
from collections import Counter
from dataclasses import dataclass

import pytest

from orchestrator.catalog import OFFER_COLUMNS, default_catalog
from orchestrator.plan import Plan, Replica, check_plan
from orchestrator.planner import Evaluated, PlanningContext, SearchOptions, SearchResult, prepare
from orchestrator.planner.candidates import dp_degrees
from orchestrator.planner.candidates import shares as even_shares
from orchestrator.planner.exhaustive import binding_objectives
from orchestrator.planner.search import search
from orchestrator.recipe import parse_recipe
from orchestrator.simulator import check_plan_runs

pytestmark = pytest.mark.slow  # many planner runs and thousands of simulated challengers

TOLERANCE = 0.001  # a challenger may beat the planner's best by this much (relative)
MARKETS = range(49)  # 48: GPU types in blocks only ("type orders"), no gap reported
RANDOM_CHALLENGERS = 300  # per market, scored under every objective
CLIMB_STEPS = 100  # per start (the planner's best, the best random plan) and objective
EXACT = SearchOptions(top_k=1)  # the default limits: exact on markets this small
# every split and placement past the first cut to a menu: the gap the planner reports must cover
# what the menus skip
MENUS = SearchOptions(top_k=1, exact_splits_limit=1, exact_placements_limit=1)

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
    check_plan(plan)
    e = context.evaluator
    check_plan_runs(plan, e.profile, e.network, e.prices)
    return e.evaluate(plan)


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
    if dp not in dp_degrees(space, plan.microbatch_size, need):
        out.append("degree")
    total = space.global_batch_size // plan.microbatch_size
    if tuple(plan.microbatches()) != tuple(even_shares(total, dp) or (total // dp,) * dp):
        out.append("shares")
    rows = Counter(zip(*(s.replicas for s in plan.stages), strict=True))
    ordered = zip(*(sorted(s.replicas, key=lambda r: r.infra) for s in plan.stages), strict=True)
    if rows != Counter(ordered):
        out.append("chaining")
    return tuple(out)


def best_of(evaluated) -> Evaluated | None:
    feasible = [e for e in evaluated if e.score.feasible]
    return max(feasible, key=lambda e: e.score.value) if feasible else None


def excess(challenger: Evaluated, result: SearchResult) -> float:
    """How much better than the planner's best the challenger is (relative; <= 0: not better)."""
    if not result.plans:
        return math.inf
    best = result.plans[0].score.value
    return (challenger.score.value - best) / abs(best)


@dataclass
class Challenge:
    objective: str
    result: SearchResult
    winner: Evaluated | None  # the best challenger
    inside: Evaluated | None  # the best challenger inside the planner's space
    why: tuple[str, ...] = ()  # what puts the best challenger outside the planner's space


def challenges(seed: int, folder) -> list[Challenge]:
    """Every objective's planner result on market ``seed`` and the best challengers to it."""
    rng = random.Random(seed)
    write_market(rng, folder)
    text = recipe_text(rng)
    options = rng.choice([EXACT, EXACT, MENUS])
    base = context_for(folder, text, "{goal: max_throughput}")
    fastest = search(base.evaluator, base.space, EXACT)
    assert fastest.plans, f"seed {seed}: no plan for the maximum throughput without limits"
    drafts = (random_draft(rng, base) for _ in range(RANDOM_CHALLENGERS))
    randoms = [e for e in (evaluate(base, d) for d in drafts if d is not None) if e is not None]
    assert randoms, f"seed {seed}: no random challenger fits the market"
    objectives = binding_objectives(
        fastest.plans[0], steps=100, global_batch_size=base.space.global_batch_size
    )
    out = []
    for name, objective in objectives.items():
        context = context_for(folder, text, objective)
        result = search(context.evaluator, context.space, options)
        rescored = [context.evaluator.rescore(e.plan, e.estimate) for e in randoms]
        best = result.plans[:1]
        tiers = []
        for inside in (False, True):
            pool = [e for e in rescored if not inside or not outside_space(e.plan, context)]
            starts = [e for e in (*best, best_of(pool)) if e is not None]
            climbed = [climb(rng, context, e, inside=inside) for e in starts]
            tiers.append(best_of([*pool, *climbed]))
        why = outside_space(tiers[0].plan, context) if tiers[0] else ()
        out.append(Challenge(name, result, *tiers, why))
    return out


def verdict(challenger: Evaluated | None, result: SearchResult) -> str:
    """ "loses" (not better beyond the tolerance), "covered" (within the gap the planner reports),
    "unbounded" (better, where the planner reports no gap: interleaved GPU types not all tried),
    or "beats"."""
    if challenger is None or excess(challenger, result) <= TOLERANCE:
        return "loses"
    if result.gap is None:
        return "unbounded"
    return "covered" if excess(challenger, result) <= result.gap + TOLERANCE else "beats"


def describe(seed: int, name: str, winner: Evaluated, result: SearchResult) -> str:
    """The case, with both plans and their scores."""
    planner = result.plans[0] if result.plans else None
    return (
        f"seed {seed}, {name}: a challenger scores {winner.score.value:.6g} against the "
        f"planner's {planner.score.value if planner else float('-inf'):.6g} "
        f"({excess(winner, result):.3%} better; planner gap {result.gap}, heuristics "
        f"{result.heuristics})\nchallenger:\n{winner.plan.to_yaml()}\nplanner's:\n"
        f"{planner.plan.to_yaml() if planner else 'none'}"
    )


# Wins of challengers outside the planner's space, found by this test (seed, objective): for
# these only challengers inside the space must lose, and the win must still show, so that the
# list shrinks when the space grows. A stage's replicas on different GPU types (SAILOR's
# heterogeneous data parallelism) is not in the space (docs/planner.md: per stage, a GPU type and
# a TP degree); on these markets a cheap or spare GPU of another type as one more replica wins:
SPACE_GAPS = {
    # 4 V100 + 1 T4 in us-central1-a, gpt-tiny, batch 24 of microbatch 1: the T4 as a fifth
    # replica of the whole model (shares 5, 5, 5, 5, 4) gives 1,129.4 samples/s, the planner's 4
    # V100 994.8 (+13.5%); with a budget, a floor or a deadline, 1-3 replicas over both types
    # beat the planner's 1-3 stage pipelines by 2.6-5.9%
    (5, "max_throughput"): "heterogeneous stage",
    (5, "max_throughput_risk_aware"): "heterogeneous stage",
    (5, "max_throughput_under_budget"): "heterogeneous stage",
    (5, "min_cost_over_floor"): "heterogeneous stage",
    (5, "min_cost_by_deadline"): "heterogeneous stage",
    # 4 T4 (2-GPU nodes) + 1 L4 in europe-west4-a, gpt-tiny, batch 24: a T4 and the cheaper L4 as
    # two replicas, $0.0513 per 1M samples against the planner's two T4 at $0.0522 (+1.7%)
    (27, "min_cost_over_floor"): "heterogeneous stage",
}


@pytest.mark.parametrize("seed", MARKETS)
def test_no_challenger_beats_the_planner(seed, tmp_path):
    failures = []
    for c in challenges(seed, tmp_path):
        inside, winner = verdict(c.inside, c.result), verdict(c.winner, c.result)
        if inside == "beats":
            failures.append(
                "inside the planner's space: " + describe(seed, c.objective, c.inside, c.result)
            )
        gap = SPACE_GAPS.get((seed, c.objective))
        if gap is not None:
            if winner == "loses" or gap not in c.why:
                failures.append(f"seed {seed}, {c.objective}: the {gap} win no longer shows")
        elif winner == "beats":
            failures.append(
                f"outside the planner's space ({', '.join(c.why)}): "
                + describe(seed, c.objective, c.winner, c.result)
            )
        elif winner == "unbounded":  # recorded, not failed: the planner said it has no bound
            what = describe(seed, c.objective, c.winner, c.result)
            warnings.warn(f"no gap reported, a challenger wins: {what}", stacklevel=1)
    assert not failures, "\n\n".join(failures)


@pytest.mark.xfail(
    strict=True,
    reason="a data-parallel degree between two divisors that both fit is not in the planner's "
    "space (candidates.dp_degrees, docs/planner.md), though a $/h budget can leave out the larger",
)
def test_a_budget_that_leaves_out_the_next_divisor_gets_the_degree_below_it(tmp_path):
    # 6 L4 in one zone; 8 microbatches of 2: divisors 1, 2, 4, 8. The budget pays for 3 L4 but not
    # 4: 3 pipelines with 3, 3 and 2 microbatches (1,235.1 samples/s) beat the planner's 2 with 4
    # each (1,003.0). Found by this file's markets 71 and 225 (outside MARKETS; 3 stages allowed
    # there, where the planner's best is 3 stages x 1 L4 at 1,180.5 samples/s: +4.6%)
    rows = [
        ",".join(OFFER_COLUMNS),
        "gcp,europe-west4,europe-west4-a,vm-L4-2,L4,2,8,30,1.652,0.561,3,0.083,test,2026-01-01",
    ]
    (tmp_path / "market.csv").write_text("\n".join(rows) + "\n")
    text = (
        "model: {name: gpt-tiny}\nprovider: gcp\nmarket: market.csv\n"
        "training: {global_batch_size: 16, microbatch_sizes: [2], steps: 100}\n"
        "objective: {objective}\nconstraints: {pricing: spot}\n"
        "parallelism: {tensor_parallel: [1], max_pipeline_stages: 1}\n"
    )
    context = context_for(tmp_path, text, "{goal: max_throughput, budget_usd_per_hour: 1.0}")
    best = search(context.evaluator, context.space, EXACT).plans[0]
    assert best.plan.dp_degree == 3, best.plan.to_yaml()
