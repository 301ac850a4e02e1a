"""The planner draws the cross-region study's and Erben et al.'s conclusions by itself, with the seeds'
network table (relation defaults only) and SAILOR's OPT-350M profile on A100s:

- in the two-region DP x PP setting it keeps each stage's data-parallel group inside a region and
  lets the pipeline cross the boundary ("with 2D parallelism, maintain data parallel traffic within
  one region");
- for a low-granularity model it refuses data parallelism across continents, unless the objective
  leaves it no other way (maximum throughput when one continent's GPUs are too few, or a throughput
  floor one continent cannot reach).
"""

from __future__ import annotations

import pytest

from orchestrator.catalog.locations import Location
from orchestrator.planner import SearchOptions, prepare
from orchestrator.planner.exhaustive import enumerate_all
from orchestrator.planner.search import SearchResult, search
from orchestrator.recipe import parse_recipe

from .fakes import seeds_catalog

US_A, US_WEST, EU = "us-central1-a", "us-west1-b", "europe-west4-a"
OFFER_HEADER = (
    "cloud,region,zone,instance_type,gpu,gpus_per_node,vcpus,memory_gib,on_demand_usd_per_hour,"
    "spot_usd_per_hour,available_count,preemption_rate_per_hour,source,as_of"
)


@pytest.fixture(scope="module")
def catalog(tmp_path_factory):
    return seeds_catalog(tmp_path_factory.mktemp("seeds"))


def context(catalog, folder, *, a100s: dict[str, int], batch: int, objective: str, stages: int):
    """A GCP market of single-A100 spot VMs (GCP's a2-highgpu-1g list price) in the given zones."""
    rows = [OFFER_HEADER] + [
        f"gcp,{zone.rsplit('-', 1)[0]},{zone},a2-highgpu-1g,A100,1,12,85,3.67,1.10,{n},0.1,test,"
        "2026-01-01"
        for zone, n in a100s.items()
    ]
    (folder / "market.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    text = (
        "name: seeds\nmodel: {name: opt-350m, profile: sailor}\nprovider: gcp\nmarket: market.csv\n"
        f"training: {{global_batch_size: {batch}, microbatch_sizes: [1, 2, 4], steps: 100, "
        "precision: fp16-mixed}\n"
        f"objective: {objective}\n"
        f"parallelism: {{tensor_parallel: [1], max_pipeline_stages: {stages}}}\n"
        "runtime: {allreduce: auto, compression: none}\n"
    )
    recipe = parse_recipe(text, file="seeds.yaml", folder=folder, catalog=catalog)
    return prepare(recipe, catalog)


def best_plan(catalog, folder, **kwargs):
    c = context(catalog, folder, **kwargs)
    result: SearchResult = search(c.evaluator, c.space, SearchOptions(top_k=1))
    assert result.plans, "the planner found no plan"
    return result.plans[0]


def places(catalog, replicas, level: str) -> set[str]:
    """The regions or continents of some replicas."""
    out = set()
    for r in replicas:
        location = Location.parse(r.infra)
        out.add(location.region if level == "region" else catalog.regions.continent(location))
    return out


def test_dp_stays_inside_regions_and_the_pipeline_crosses(catalog, tmp_path):
    """Four A100s in each of two US regions, OPT-350M, maximum throughput: the planner uses all
    eight, as a pipeline cut at the region boundary (each stage's all-reduce stays in its region)."""
    found = best_plan(
        catalog,
        tmp_path,
        a100s={US_A: 4, US_WEST: 4},
        batch=1024,
        objective="{goal: max_throughput}",
        stages=4,
    )
    plan = found.plan
    assert plan.total_gpus == 8
    assert plan.num_stages >= 2
    for stage in plan.stages:
        assert len(places(catalog, stage.replicas, "region")) == 1, "DP crosses a region"
    stage_regions = [places(catalog, s.replicas, "region").pop() for s in plan.stages]
    assert set(stage_regions) == {"us-central1", "us-west1"}, "the pipeline stays in one region"
    # activations cross the boundary every microbatch: egress is paid, and it is the price of speed
    assert found.estimate.egress_usd_per_iteration > 0


def low_granularity_market(catalog, folder):
    """Four A100s on each of two continents, OPT-350M with a small batch: data parallelism over all
    eight is low-granularity (compute time under half the communication time), and every plan that
    crosses the Atlantic is slower than four GPUs on one continent, as exhaustive search shows."""
    kwargs = dict(a100s={US_A: 4, EU: 4}, batch=128, stages=1)
    c = context(catalog, folder, objective="{goal: max_throughput}", **kwargs)
    everything = list(enumerate_all(c.evaluator, c.space))
    local = max(
        e.score.samples_per_s
        for e in everything
        if len(places(catalog, e.plan.stages[0].replicas, "continent")) == 1
    )
    across = [
        e for e in everything if len(places(catalog, e.plan.stages[0].replicas, "continent")) > 1
    ]
    assert all(e.estimate.granularity < 0.6 for e in across if e.plan.total_gpus == 8)
    assert max(e.score.samples_per_s for e in across) < local
    return kwargs


@pytest.mark.parametrize(
    "objective",
    [
        "{goal: max_throughput}",
        "{goal: min_cost}",
        "{goal: max_throughput, budget_usd_per_hour: 20}",
        "{goal: max_throughput, risk_aware: true}",
    ],
)
def test_refuses_intercontinental_dp_for_a_low_granularity_model(catalog, tmp_path, objective):
    kwargs = low_granularity_market(catalog, tmp_path)
    found = best_plan(catalog, tmp_path, objective=objective, **kwargs)
    assert len(places(catalog, found.plan.stages[0].replicas, "continent")) == 1


def test_crosses_the_ocean_only_when_the_objective_forces_it(catalog, tmp_path):
    """Two A100s per continent: four across the Atlantic are still a little faster than two at home,
    at about twelve times the dollars per sample. Maximum throughput, or a floor above what two GPUs
    reach, forces the crossing; the cheapest plan stays home."""
    kwargs = dict(a100s={US_A: 2, EU: 2}, batch=128, stages=1)
    home = best_plan(catalog, tmp_path, objective="{goal: min_cost}", **kwargs)
    assert len(places(catalog, home.plan.stages[0].replicas, "continent")) == 1
    local_best = best_plan(
        catalog, tmp_path, objective="{goal: max_throughput}", **{**kwargs, "a100s": {US_A: 2}}
    )
    fastest = best_plan(catalog, tmp_path, objective="{goal: max_throughput}", **kwargs)
    floor = 1.05 * local_best.score.samples_per_s
    forced = best_plan(
        catalog,
        tmp_path,
        objective=f"{{goal: min_cost, min_throughput_samples_per_s: {floor:.4f}}}",
        **kwargs,
    )
    for found in (fastest, forced):
        assert len(places(catalog, found.plan.stages[0].replicas, "continent")) == 2
        assert found.score.samples_per_s > local_best.score.samples_per_s
        assert found.estimate.granularity < 1.5  # still low-granularity: forced, not chosen
        assert (
            found.score.cost_per_million_samples_usd > 5 * home.score.cost_per_million_samples_usd
        )
    assert forced.score.samples_per_s >= floor
