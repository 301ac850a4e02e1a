"""The planner says whether its best plan is proven the best of the plan space, or found by a
search that skipped choices, and then how far the bounds say a skipped one could be better."""

from __future__ import annotations

from pathlib import Path

from orchestrator.catalog import default_catalog
from orchestrator.cli.plan_cmd import search_verdict
from orchestrator.planner import SearchOptions, plan_recipe
from orchestrator.recipe import load_recipe

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def _result(name: str, **options):
    catalog = default_catalog()
    return plan_recipe(load_recipe(RECIPES / name, catalog=catalog), catalog, **options)


def test_an_exhaustive_search_proves_its_best():
    result = _result("quickstart.yaml")
    assert result.proven and result.heuristics == () and result.gap == 0.0
    assert "proven the best" in search_verdict(result)


def test_a_search_with_skipped_placements_and_splits_bounds_what_it_skipped():
    # few placements and splits tried, a single (GPU, TP) pair: the skipped ones are bounded
    options = SearchOptions(exact_placements_limit=1, exact_splits_limit=1)
    result = _result("quickstart.yaml", options=options)
    assert not result.proven
    assert set(result.heuristics) <= {"placements", "splits"} and result.heuristics
    assert result.gap is not None and result.gap >= 0.0
    verdict = search_verdict(result)
    assert verdict.startswith("best found: the bounds allow a plan up to")


def test_interleaved_gpu_types_have_no_bound_and_say_so():
    result = _result("sailor-gptneo27-a100-v100.yaml")
    assert "type orders" in result.heuristics and result.gap is None
    assert "no bound covers them all" in search_verdict(result)
