"""The bounds the search prunes with are bounds: on seeded random markets, every plan of the
space (every split, placement, sync algorithm; the better of the two warm-ups the evaluator tries)
takes at least its placement's bound (``Evaluator.plan_time_bound``: its own links and
all-reduces) and its shape's (``time_lower_bounds``: the market's best links); and one warm-up
shared by a plan's pipelines hides every pipeline's loops (``joint_latency_aware_warmup``)."""

from __future__ import annotations

import random

import pytest

from orchestrator.catalog import default_catalog
from orchestrator.planner import prepare
from orchestrator.planner.candidates import Shape
from orchestrator.planner.exhaustive import enumerate_all
from orchestrator.simulator.pipeline import (
    joint_latency_aware_warmup,
    latency_aware_warmup,
    pipeline_time,
)

from .test_planner_exhaustive import recipe, write_market

pytestmark = pytest.mark.slow  # an exhaustive enumeration per market


def _shape(plan) -> Shape:
    first = [s.replicas[0] for s in plan.stages]
    split = tuple(s.layers[0] for s in plan.stages) + (plan.stages[-1].layers[1],)
    return Shape(
        plan.microbatch_size, tuple(r.gpu for r in first), tuple(r.tp for r in first), split
    )


@pytest.mark.parametrize("seed", [300, 301, 302, 303])
def test_no_plan_beats_its_placement_or_shape_bound(seed, tmp_path):
    write_market(random.Random(seed), tmp_path)
    context = prepare(recipe(tmp_path, "{goal: max_throughput}", 3), default_catalog())
    evaluator, checked, tight = context.evaluator, 0, 0
    from orchestrator.planner.bounds import ConfigBounds

    bounds = ConfigBounds(evaluator.profile, evaluator.settings)
    for evaluated in enumerate_all(evaluator, context.space):
        plan, seconds = evaluated.plan, evaluated.estimate.iteration_time_s
        shape = _shape(plan)
        times = evaluator.stage_times(shape)
        in_flight = bounds.most_in_flight(
            shape.mbs, shape.gpus[0], shape.tps[0], shape.split[0], shape.split[1]
        )
        placed = evaluator.plan_time_bound(shape, times, plan, in_flight=in_flight)
        (shaped,) = evaluator.time_lower_bounds(shape, times, [plan.dp_degree], in_flight=in_flight)
        assert placed <= seconds * (1 + 1e-9), (plan.to_yaml(), placed, seconds)
        assert shaped <= seconds * (1 + 1e-9), (plan.to_yaml(), shaped, seconds)
        checked += 1
        tight += placed >= 0.9 * seconds
    assert checked > 50
    assert tight > checked / 2  # a bound this close is what lets the search skip simulations


def test_one_warmup_hides_the_loops_of_every_pipeline():
    """Two pipelines of one plan, each with one slow link at another place: taking each one's own
    warm-up and the largest per stage leaves a loop of each short; the joint warm-up does not."""
    f, b = (0.01,) * 4, (0.02,) * 4
    slow, fast = 0.05, 0.0005
    first = (f, b, (slow, fast, fast), (0.001,) * 3, (0.001,) * 3)
    second = (f, b, (fast, fast, slow), (0.001,) * 3, (0.001,) * 3)
    each = [latency_aware_warmup(*p) for p in (first, second)]
    largest = tuple(max(w) for w in zip(*each, strict=True))
    joint = joint_latency_aware_warmup([first, second])
    m = 32
    for pipeline in (first, second):
        paced = pipeline_time(*pipeline[:2], m, *pipeline[2:], warmup=joint)
        assert paced.period_s == pytest.approx(0.03)  # its slowest stage, f + b
    slower = [pipeline_time(*p[:2], m, *p[2:], warmup=largest).period_s for p in (first, second)]
    assert max(slower) > 0.03 * 1.05
    assert all(j >= w for j, w in zip(joint, largest, strict=True))


def test_groups_fit_apart_packs_whole_groups():
    from orchestrator.planner.links import groups_fit_apart

    assert groups_fit_apart((344, 172), (512, 128)) is False  # 516 GPUs, but not split up
    assert groups_fit_apart((344, 86), (512, 128)) is True
    assert groups_fit_apart((49,) * 13, (128, 128, 128, 128, 128)) is False  # 2 a bin: 10 < 13
    assert groups_fit_apart((49,) * 10, (128,) * 5) is True
    assert groups_fit_apart((5, 4, 3), (6, 6)) is False and groups_fit_apart((5, 4, 3), (7, 6))


def test_a_shape_whose_stage_groups_cannot_keep_to_a_region_pays_a_crossing_all_reduce():
    """Three stages at TP 1, 4, 2 on 86 pipelines: 602 A100s, more than us-central1's 512, and
    neither the TP-4 nor the TP-2 stage's group fits us-west1's 128: one of them spans the two
    regions, so one of their all-reduces crosses (not only a pipeline hop, which is cheaper)."""
    from orchestrator.planner.links import crossing_candidates

    bins = {"A100": (512, 128)}
    gpus, tps = ("A100",) * 3, (1, 4, 2)
    assert crossing_candidates(gpus, tps, 86, bins) == (1, 2)
    assert crossing_candidates(gpus, tps, 40, bins) is None


def test_a_stage_is_weighed_by_the_layers_it_may_hold():
    """GPT-Neo-2.7B on SAILOR's profiles: at TP 4 a V100 takes about 1.1x an A100's time for the
    embedding but 3.9x for a block. A middle stage never holds the embedding, so its speed ratio
    is the blocks'; the slowest-stage bound that follows still holds for every split."""
    import itertools

    from orchestrator.planner.bounds import ConfigBounds
    from orchestrator.profiles import sailor_profile
    from orchestrator.simulator.settings import load_settings

    catalog = default_catalog()
    profile = sailor_profile("gpt-neo-2.7b", ["A100", "V100"], catalog)
    bounds = ConfigBounds(profile, load_settings(catalog))
    gpus, tps = ("A100", "V100", "V100", "V100"), (4, 4, 4, 4)
    rhos = bounds.stage_rhos(1, gpus, tps)
    whole = bounds.fastest(1, frozenset(zip(gpus, tps, strict=True)))[2][("V100", 4)]
    assert whole < 1.5 < 3 < min(rhos[1:3])
    _, slowest = bounds.slowest_stage(1, gpus, tps, 512)
    layers = profile.num_layers
    best = min(
        max(
            sum(profile.stage_times(g, 1, t, a, b)[:2])
            for g, t, a, b in zip(gpus, tps, (0, *cuts), (*cuts, layers), strict=True)
        )
        for cuts in itertools.combinations(range(1, layers), len(gpus) - 1)
    )
    assert slowest <= best * (1 + 1e-9)
    assert slowest > 0.8 * best  # and close: the embedding no longer sets the V100 stages' ratio
