"""Data-parallel degrees that do not divide the batch: where the GPUs there are fall short of the
next divisor, the planner runs as many pipelines as fit, with unequal shares of the batch."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.catalog import default_catalog
from orchestrator.planner import plan_recipe
from orchestrator.planner.candidates import least_degrees, shares
from orchestrator.recipe import parse_recipe


@pytest.mark.parametrize("microbatches", [1, 2, 3, 7, 16, 100, 256, 1000, 4099])
def test_least_degrees_are_the_least_pipelines_for_each_fullest_share(microbatches):
    brute = sorted({-(-microbatches // m) for m in range(1, microbatches + 1)})
    assert list(least_degrees(microbatches)) == brute
    for d in least_degrees(microbatches):  # one pipeline fewer would need a fuller share
        fullest = -(-microbatches // d)
        assert d == 1 or -(-microbatches // (d - 1)) > fullest


def test_shares_are_as_even_as_they_go():
    assert shares(256, 16) is None  # equal shares
    got = shares(256, 20)
    assert sum(got) == 256 and len(got) == 20 and set(got) == {12, 13}
    assert list(got) == sorted(got, reverse=True)


def _recipe(max_gpus: int):
    text = f"""\
name: degrees
provider: local
model: {{name: gpt-tiny, profile: analytic}}
training: {{global_batch_size: 256, microbatch_sizes: [4], steps: 100, precision: fp32}}
objective: {{goal: max_throughput}}
constraints:
  locations: [local/sim-us/sim-us-a]
  gpu_types: [T4]
  max_gpus: {max_gpus}
  pricing: spot
parallelism: {{max_pipeline_stages: 1, tensor_parallel: [1]}}
"""
    return parse_recipe(text, file="degrees.yaml", folder=Path("."))


def test_the_planner_runs_as_many_pipelines_as_fit_when_no_divisor_does():
    catalog = default_catalog()
    market = catalog.market("local")
    # 64 microbatches; 12 GPUs allow DP 12 (shares of 6 and 5), where the divisors stop at 8
    market = type(market)(
        [o.__class__(**{**o.__dict__, "available_count": 12}) for o in market.offers], market.file
    )
    best = plan_recipe(_recipe(12), catalog, market).plans[0]
    plan = best.plan
    assert plan.dp_degree == 11  # the least pipelines that need no more than 6 microbatches
    assert sum(plan.pipeline_microbatches) == 64 and max(plan.pipeline_microbatches) == 6
    even = plan_recipe(_recipe(8), catalog, market).plans[0]
    assert best.estimate.samples_per_s > 1.2 * even.estimate.samples_per_s
