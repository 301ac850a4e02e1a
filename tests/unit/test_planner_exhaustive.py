"""The planner against exhaustive search on seeded random small markets, for every objective.

Each market: up to 16 GPUs of 2 types (T4, L4) in 3 places of 2 regions (two zones of us-central1,
one of europe-west1), random capacities, prices and preemption rates. The model is gpt-tiny (6
layers) with analytic profiles. Limits (budget, throughput floor, deadline) are set from what the
market can do, so that they bind. The planner's best plan must be within 1% of the exhaustive best.
"""

from __future__ import annotations

import random

import pytest

from orchestrator.catalog import OFFER_COLUMNS, default_catalog
from orchestrator.planner import SearchOptions, prepare
from orchestrator.planner.exhaustive import best, binding_objectives, enumerate_all
from orchestrator.planner.search import search
from orchestrator.recipe import parse_recipe
from orchestrator.simulator import views_for

PLACES = [
    ("gcp", "us-central1", "us-central1-a"),
    ("gcp", "us-central1", "us-central1-b"),
    ("gcp", "europe-west1", "europe-west1-b"),
]
TOLERANCE = 0.01
pytestmark = pytest.mark.slow  # every objective's exhaustive search: the unit tier's longest


def write_market(rng: random.Random, folder) -> str:
    rows, total = [",".join(OFFER_COLUMNS)], 0
    for cloud, region, zone in PLACES:
        for gpu in ("T4", "L4"):
            count = rng.choice([0, 0, 1, 2, 3, 4])
            count = count if total + count <= 16 else 0
            total += count
            if count:
                on_demand = round(rng.uniform(0.4, 1.2), 3)
                spot = round(on_demand * rng.uniform(0.2, 0.6), 3)
                rate = round(rng.uniform(0.0, 0.5), 3)
                rows.append(
                    f"{cloud},{region},{zone},vm-{gpu},{gpu},1,8,30,{on_demand},{spot},{count},{rate},test,2026-01-01"
                )
    if total == 0:
        rows.append("gcp,us-central1,us-central1-a,vm-T4,T4,1,8,30,0.5,0.2,2,0.1,test,2026-01-01")
    (folder / "market.csv").write_text("\n".join(rows) + "\n")
    return "market.csv"


def recipe(folder, objective: str, stages: int):
    text = (
        f"model: {{name: gpt-tiny}}\nprovider: gcp\nmarket: market.csv\n"
        f"training: {{global_batch_size: 8, microbatch_sizes: [1, 2], steps: 100}}\n"
        f"objective: {objective}\n"
        f"parallelism: {{tensor_parallel: [1], max_pipeline_stages: {stages}}}\n"
        f"runtime: {{allreduce: auto, compression: fp16}}\n"
    )
    return parse_recipe(text, file="r.yaml", folder=folder, catalog=default_catalog())


def objectives(fastest) -> dict[str, str]:
    """The objectives, with limits taken from the market's fastest plan so that they bind."""
    return binding_objectives(fastest, steps=100, global_batch_size=8)


def compare(folder, stages: int) -> list[tuple[str, float]]:
    """Exhaustive search once per market (estimates do not depend on the objective), re-scored for
    each objective; the planner runs afresh for each."""
    catalog = default_catalog()
    base = prepare(recipe(folder, "{goal: max_throughput}", stages), catalog)
    everything = list(enumerate_all(base.evaluator, base.space))
    gaps = []
    for name, objective in objectives(best(everything)).items():
        context = prepare(recipe(folder, objective, stages), catalog)
        reference = best([context.evaluator.rescore(e.plan, e.estimate) for e in everything])
        found = search(context.evaluator, context.space, SearchOptions(top_k=1)).plans
        if reference is None:
            assert not found, f"{name}: the planner found a plan exhaustive search calls infeasible"
            continue
        assert found, f"{name}: exhaustive search found a feasible plan, the planner none"
        gaps.append(
            (name, (reference.score.value - found[0].score.value) / abs(reference.score.value))
        )
    return gaps


@pytest.mark.parametrize("seed", range(20))
def test_planner_matches_exhaustive_search(seed, tmp_path):
    rng = random.Random(seed)
    write_market(rng, tmp_path)
    for name, gap in compare(tmp_path, stages=2):
        assert gap <= TOLERANCE, (
            f"seed {seed}, {name}: planner {gap:.2%} worse than exhaustive search"
        )


@pytest.mark.parametrize("seed", [100, 101, 102])
def test_planner_matches_exhaustive_search_with_three_stages(seed, tmp_path):
    rng = random.Random(seed)
    write_market(rng, tmp_path)
    for name, gap in compare(tmp_path, stages=3):
        assert gap <= TOLERANCE, (
            f"seed {seed}, {name}: planner {gap:.2%} worse than exhaustive search"
        )


def in_blocks(plan) -> bool:
    """Stages of one GPU type come together, one TP degree per type: the space of type_blocks."""
    kinds = [(s.replicas[0].gpu, s.replicas[0].tp) for s in plan.stages]
    runs = [k for i, k in enumerate(kinds) if i == 0 or k != kinds[i - 1]]
    gpus = [g for g, _ in runs]
    return len(set(gpus)) == len(gpus)


@pytest.mark.parametrize(
    ("seed", "round_s"),
    [(200, 0.0), (201, 0.0), (202, 0.0), (203, 0.0), (200, 0.002), (201, 0.002)],
)
def test_bounds_never_prune_the_best_plan(seed, round_s, tmp_path, monkeypatch):
    """With every split and placement exact and GPU types in blocks (the families of configs),
    the only thing that can make the planner miss is a bound that is not one: it must find the
    best plan of that space exactly, for every objective; also when each data-parallel round
    costs a fixed time beyond its bytes (a framework's coordination: simulator settings)."""
    if round_s:
        import dataclasses

        import orchestrator.planner as planner

        def with_round_cost(catalog, market, **options):
            network, prices, settings = views_for(catalog, market, **options)
            return network, prices, dataclasses.replace(settings, dp_round_overhead_s=round_s)

        monkeypatch.setattr(planner, "views_for", with_round_cost)
    rng = random.Random(seed)
    write_market(rng, tmp_path)
    catalog = default_catalog()
    base = prepare(recipe(tmp_path, "{goal: max_throughput}", 3), catalog)
    everything = [e for e in enumerate_all(base.evaluator, base.space) if in_blocks(e.plan)]
    options = SearchOptions(
        top_k=1,
        exact_types_limit=1,
        exact_splits_limit=10**6,
        exact_placements_limit=10**9,
        mixed_stages=False,  # the reference enumerates one GPU type per stage
    )
    for name, objective in objectives(best(everything)).items():
        context = prepare(recipe(tmp_path, objective, 3), catalog)
        reference = best([context.evaluator.rescore(e.plan, e.estimate) for e in everything])
        found = search(context.evaluator, context.space, options).plans
        if reference is None:
            assert not found, name
            continue
        assert found, name
        assert found[0].score.value == pytest.approx(reference.score.value, rel=1e-9), name
