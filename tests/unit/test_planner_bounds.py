"""The planner's config-level bounds hold against every layer split, stage by stage.

The exhaustive comparisons (test_planner_exhaustive.py) catch a bound that prunes the best plan of
a small market; these tests check each bound directly, for every stage count up to the layer count
(where the windows of layers a stage must hold are narrowest), on two GPU types and two microbatch
sizes of gpt-mini's analytic profile.
"""

from __future__ import annotations

import itertools

import pytest

from orchestrator.catalog import OFFER_COLUMNS, default_catalog
from orchestrator.planner import prepare
from orchestrator.planner.bounds import ConfigBounds
from orchestrator.planner.candidates import Shape, block_sizes, expand_blocks
from orchestrator.planner.splits import all_splits
from orchestrator.planner.sync_bounds import SyncBounds
from orchestrator.recipe import parse_recipe

PAIRS = (("T4", 1), ("L4", 1))


@pytest.fixture(scope="module")
def context(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bounds")
    rows = [",".join(OFFER_COLUMNS)] + [
        f"gcp,us-central1,us-central1-a,vm-{gpu},{gpu},1,8,30,1.0,0.3,8,0.1,test,2026-01-01"
        for gpu, _ in PAIRS
    ]
    (folder / "market.csv").write_text("\n".join(rows) + "\n")
    text = (
        "model: {name: gpt-mini}\nprovider: gcp\nmarket: market.csv\n"
        "training: {global_batch_size: 16, microbatch_sizes: [1, 4], steps: 10}\n"
        "parallelism: {tensor_parallel: [1]}\n"
    )
    recipe = parse_recipe(text, file="r.yaml", folder=folder, catalog=default_catalog())
    return prepare(recipe, default_catalog())


def configs(stages: int):
    """Every assignment of the two pairs to ``stages`` stages, up to 64 of them."""
    return itertools.islice(itertools.product(PAIRS, repeat=stages), 64)


def slowest_of_best_split(context, mbs: int, config) -> float:
    gpus = tuple(g for g, _ in config)
    tps = tuple(t for _, t in config)
    layers = context.space.num_layers
    best = float("inf")
    for split in all_splits(layers, len(config)):
        times = context.evaluator.stage_times(Shape(mbs, gpus, tps, split))
        best = min(best, max(f + b for f, b, _ in times))
    return best


@pytest.mark.parametrize("mbs", [1, 4])
def test_forced_layers_never_exceed_the_best_splits_slowest_stage(context, mbs):
    bounds = ConfigBounds(context.evaluator.profile, context.evaluator.settings)
    layers = context.space.num_layers
    checked = 0
    for stages in range(1, layers + 1):
        for config in configs(stages):
            gpus = tuple(g for g, _ in config)
            tps = tuple(t for _, t in config)
            forced = bounds.forced_layers(mbs, gpus, tps)
            assert forced > 0
            assert forced <= slowest_of_best_split(context, mbs, config) * (1 + 1e-12), config
            checked += 1
    assert checked > 100


@pytest.mark.parametrize("mbs", [1, 4])
def test_forced_blocks_never_exceed_any_config_of_the_family(context, mbs):
    bounds = ConfigBounds(context.evaluator.profile, context.evaluator.settings)
    layers = context.space.num_layers
    for stages in range(2, layers + 1):
        for blocks in (PAIRS, PAIRS[::-1]):
            family = bounds.forced_blocks(mbs, blocks, stages)
            for sizes in block_sizes(stages, len(blocks)):
                gpus, tps = expand_blocks(blocks, sizes)
                assert family <= bounds.forced_layers(mbs, gpus, tps) * (1 + 1e-12)


def test_first_stage_tail_never_exceeds_the_first_stages_sync_and_step(context):
    """After the first stage's last backward come its exposed all-reduce and its optimizer step,
    whatever layers it holds."""
    e, layers = context.evaluator, context.space.num_layers
    sync = SyncBounds(e, num_layers=layers, least_tp=min(context.space.tp_degrees))
    profile = e.profile
    for stages, dp, (gpu, tp) in itertools.product((1, 2, 4), (1, 2, 4), PAIRS):
        tail = sync.first_stage_tail(1, (gpu, tp), dp, stages)
        for split in all_splits(layers, stages):
            _, backward, update = profile.stage_times(gpu, 1, tp, 0, split[1])
            message = profile.stage_gradient_elements(0, split[1], tp) * profile.element_bytes
            assert tail <= e.exposed_sync(message, dp, gpu, tp, backward) + update + 1e-15
