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
wins found outside it would be listed in ``SPACE_GAPS``: SAILOR's heterogeneous stages were, until
the planner grew its best plans with pipelines of other GPU types (planner/mixed.py), which has no
bound; a win over that is still a failure here (``verdict``).
"""

from __future__ import annotations

import math
import random
import warnings
from dataclasses import dataclass

import pytest

from orchestrator.catalog import OFFER_COLUMNS
from orchestrator.planner import Evaluated, SearchOptions, SearchResult
from orchestrator.planner.exhaustive import binding_objectives
from orchestrator.planner.search import search
from tests.unit.challengers import (
    climb,
    context_for,
    evaluate,
    outside_space,
    random_draft,
    recipe_text,
    write_market,
)

pytestmark = pytest.mark.slow  # many planner runs and thousands of simulated challengers

TOLERANCE = 0.001  # a challenger may beat the planner's best by this much (relative)
MARKETS = range(49)  # 48: GPU types in blocks only ("type orders"), no gap reported
RANDOM_CHALLENGERS = 300  # per market, scored under every objective
EXACT = SearchOptions(top_k=1)  # the default limits: exact on markets this small
# every split and placement past the first cut to a menu: the gap the planner reports must cover
# what the menus skip
MENUS = SearchOptions(top_k=1, exact_splits_limit=1, exact_placements_limit=1)


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
        # interleaved GPU types not all tried have no bound: a win there is recorded, not failed;
        # mixed stages (also no bound) are grown from the planner's best, and must hold here
        return "unbounded" if "type orders" in result.heuristics else "beats"
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
# list shrinks when the space grows. Empty since the planner grows its best plans with pipelines
# of other GPU types (planner/mixed.py): SAILOR's heterogeneous stages won on seed 5 (a T4 as a
# fifth replica beside 4 V100, +13.5%; 1-3 replicas over both types under a budget, a floor or a
# deadline, +2.3-5.2%) and seed 27 (a T4 and a cheaper L4 as two replicas, 1.7% cheaper); the
# planner now finds these or better.
SPACE_GAPS: dict[tuple[int, str], str] = {}


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


# 6 L4 in one zone; 8 microbatches of 2: divisors 1, 2, 4, 8. Found by this file's markets 71
# and 225 (outside MARKETS; 3 stages allowed there, where the planner's best was 3 stages x 1 L4
# at 1,180.5 samples/s: +4.6%)
SIX_L4 = "gcp,europe-west4,europe-west4-a,vm-L4-2,L4,2,8,30,1.652,0.561,3,0.083,test,2026-01-01"
ONE_STAGE = (
    "model: {name: gpt-tiny}\nprovider: gcp\nmarket: market.csv\n"
    "training: {global_batch_size: 16, microbatch_sizes: [2], steps: 100}\n"
    "objective: {objective}\nconstraints: {pricing: spot}\n"
    "parallelism: {tensor_parallel: [1], max_pipeline_stages: 1}\n"
)


def _six_l4_best(tmp_path, objective: str):
    (tmp_path / "market.csv").write_text(",".join(OFFER_COLUMNS) + "\n" + SIX_L4 + "\n")
    context = context_for(tmp_path, ONE_STAGE, objective)
    return search(context.evaluator, context.space, EXACT).plans[0]


def test_a_budget_that_leaves_out_the_next_divisor_gets_the_degree_below_it(tmp_path):
    # the budget pays for 3 L4 but not 4: 3 pipelines with 3, 3 and 2 microbatches (1,235.1
    # samples/s) beat 2 with 4 each (1,003.0)
    best = _six_l4_best(tmp_path, "{goal: max_throughput, budget_usd_per_hour: 1.0}")
    assert best.plan.dp_degree == 3 and tuple(best.plan.microbatches()) == (3, 3, 2), (
        best.plan.to_yaml()
    )


def test_the_cheapest_plan_over_a_floor_takes_a_degree_between_two_divisors(tmp_path):
    # 2 pipelines (1,003.0 samples/s) miss the floor; 3 (1,235.1) meet it for 3/4 of what 4 cost
    best = _six_l4_best(tmp_path, "{goal: min_cost, min_throughput_samples_per_s: 1100}")
    assert best.plan.dp_degree == 3, best.plan.to_yaml()
    assert best.estimate.samples_per_s >= 1100


def test_the_fastest_plan_under_a_total_budget_takes_a_degree_between_two_divisors(tmp_path):
    # the run's cost (100 steps) of the 3 pipelines a $/h budget leaves and of the fastest plan,
    # 4 pipelines, from the planner's own estimates: a total budget between the two pays for 3
    three = _six_l4_best(tmp_path, "{goal: max_throughput, budget_usd_per_hour: 1.0}")
    four = _six_l4_best(tmp_path, "{goal: max_throughput}")
    assert (three.plan.dp_degree, four.plan.dp_degree) == (3, 4)
    run_usd = [e.estimate.cost_per_iteration_usd * 100 for e in (three, four)]
    assert run_usd[0] < run_usd[1]
    budget = sum(run_usd) / 2
    best = _six_l4_best(tmp_path, f"{{goal: max_throughput, budget_usd: {budget:.9g}}}")
    assert best.plan.dp_degree == 3 and tuple(best.plan.microbatches()) == (3, 3, 2), (
        best.plan.to_yaml()
    )
