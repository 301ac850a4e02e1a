"""MarketPlans turns a recipe's deadline into the throughput the rest of the job needs now."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.driver.world import MarketPlans
from orchestrator.recipe import parse_recipe

RECIPE = """\
name: due
provider: local
model: {name: gpt-tiny, profile: analytic}
training: {global_batch_size: 8, microbatch_sizes: [2], steps: 100, precision: fp32}
objective: {goal: min_cost, deadline_h: 1.0}
constraints: {gpu_types: [T4], pricing: spot}
"""


def _floor(progress) -> tuple[float | None, float | None]:
    recipe = parse_recipe(RECIPE, file="due.yaml", folder=Path("."))
    plans = MarketPlans(recipe, catalog=None, provisioner=None, progress=progress)
    objective = plans._with_deadline_left().objective
    return objective.min_throughput_samples_per_s, objective.deadline_h


def test_before_any_progress_the_recipe_is_planned_as_written():
    assert _floor(lambda: (0, 0.0)) == (None, 1.0)


def test_the_floor_is_what_the_remaining_steps_need_in_the_time_left():
    floor, deadline = _floor(lambda: (50, 1800.0))  # half the steps, half the hour
    assert deadline is None and floor == pytest.approx(50 * 8 / 1800)
    late, _ = _floor(lambda: (50, 3600.0 * 2))  # past the deadline: as fast as one minute needs
    assert late == pytest.approx(50 * 8 / 60)
