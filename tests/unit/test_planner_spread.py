"""constraints.min_locations: the planner spreads a job over at least that many places, says so
when the market cannot, and the driver then trains on fewer places rather than stopping."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.catalog import default_catalog
from orchestrator.driver.market_plans import MarketPlans
from orchestrator.errors import UserError
from orchestrator.planner import plan_recipe
from orchestrator.recipe import parse_recipe

US_A, US_B, EU_A = "local/sim-us/sim-us-a", "local/sim-us/sim-us-b", "local/sim-eu/sim-eu-a"


def _recipe(*, spread: int, places=(US_A, US_B, EU_A)):
    text = f"""\
name: spread
provider: local
model: {{name: gpt-tiny, profile: analytic}}
training: {{global_batch_size: 16, microbatch_sizes: [2, 4], steps: 100, precision: fp32}}
objective: {{goal: max_throughput}}
constraints:
  locations: [{", ".join(places)}]
  gpu_types: [T4]
  max_gpus: 4
  min_locations: {spread}
  pricing: spot
"""
    return parse_recipe(text, file="spread.yaml", folder=Path("."))


def _places(plan) -> set[str]:
    return {r.infra for stage in plan.stages for r in stage.replicas}


def _best(recipe):
    catalog = default_catalog()
    return plan_recipe(recipe, catalog, catalog.market("local")).plans[0]


def test_without_a_spread_the_tiny_model_stays_in_one_zone():
    # crossing places costs gpt-tiny more than a GPU gives: the honest best keeps it home
    assert len(_places(_best(_recipe(spread=1)).plan)) == 1


def test_a_spread_of_three_uses_three_places_in_two_regions():
    best = _best(_recipe(spread=3))
    places = _places(best.plan)
    assert places == {US_A, US_B, EU_A}
    assert best.plan.total_gpus <= 4
    unspread = _best(_recipe(spread=1))
    assert best.estimate.samples_per_s < unspread.estimate.samples_per_s  # resilience has a price


def test_a_spread_the_market_cannot_give_names_the_field_and_the_places():
    catalog = default_catalog()
    with pytest.raises(UserError) as caught:
        plan_recipe(_recipe(spread=3, places=(US_A, US_B)), catalog, catalog.market("local"))
    assert caught.value.field == "constraints.min_locations"
    assert "only 2" in caught.value.message and US_B in caught.value.message
    assert "lower constraints.min_locations to 2" in caught.value.fix


def test_the_driver_trains_on_fewer_places_when_the_spread_cannot_be_had():
    catalog = default_catalog()
    recipe = _recipe(spread=3, places=(US_A, US_B))
    plans = MarketPlans(recipe, catalog, provisioner=None, progress=lambda: (0, 0.0))
    plans.market = lambda held, held_only=False: catalog.market("local")  # the market, no provider
    choice = plans.choose(excluded=frozenset(), held={})
    assert "fewer than constraints.min_locations (3)" in choice.note
    spread = MarketPlans(_recipe(spread=3), catalog, provisioner=None, progress=lambda: (0, 0.0))
    spread.market = lambda held, held_only=False: catalog.market("local")
    assert spread.choose(excluded=frozenset(), held={}).note == ""


def test_the_driver_runs_the_tensor_parallel_plan_the_planner_finds_best():
    """GPT-Neo-2.7B on V100s in at most two stages: the planner's best splits stages 4 ways (TP;
    not 8, which does not divide its 20 heads), and the driver chooses that plan (the runtime
    runs tensor parallelism)."""
    text = """\
name: tp
provider: gcp
model: {name: gpt-neo-2.7b, profile: analytic}
training: {global_batch_size: 32, microbatch_sizes: [1], steps: 10, precision: fp16-mixed}
objective: {goal: max_throughput}
constraints: {gpu_types: [V100], max_gpus: 16, pricing: spot, locations: [gcp/us-central1/us-central1-a]}
parallelism: {max_pipeline_stages: 2}
"""
    recipe = parse_recipe(text, file="tp.yaml", folder=Path("."))
    catalog = default_catalog()
    best = plan_recipe(recipe, catalog, catalog.market("gcp")).plans[0]
    assert {r.tp for stage in best.plan.stages for r in stage.replicas} == {4}
    plans = MarketPlans(recipe, catalog, provisioner=None, progress=lambda: (0, 0.0))
    plans.market = lambda held, held_only=False: catalog.market("gcp")
    choice = plans.choose(excluded=frozenset(), held={})
    assert {r.tp for stage in choice.plan.stages for r in stage.replicas} == {4}
    assert [s.layers for s in choice.plan.stages] == [s.layers for s in best.plan.stages]


def test_a_spread_does_not_cap_the_gpus_of_a_model_that_scales():
    """A CNN that scales over data-parallel T4s in four zones of one region: asked to spread over
    two places it still takes all eight GPUs it may, as it does without the spread (a planner that
    met the spread by halving the GPUs once called a 4-GPU plan at half the rate its best)."""
    text = Path(__file__).resolve().parents[2] / "recipes/erben-convnext-large-t4-4continents.yaml"
    base = text.read_text().replace("goal: min_cost", "goal: max_throughput")
    start = base.index("  locations:")
    end = base.index("  gpu_types:")
    catalog = default_catalog()
    best = {}
    for spread in (1, 2):
        where = f"  locations: [gcp/us-central1]\n  min_locations: {spread}\n"
        recipe = parse_recipe(base[:start] + where + base[end:], file="cnn.yaml", folder=Path("."))
        best[spread] = plan_recipe(recipe, catalog, catalog.market("gcp")).plans[0]
    assert best[2].plan.total_gpus == best[1].plan.total_gpus == 8
    assert len(_places(best[2].plan)) >= 2
    assert best[2].estimate.samples_per_s == pytest.approx(best[1].estimate.samples_per_s, rel=0.02)
