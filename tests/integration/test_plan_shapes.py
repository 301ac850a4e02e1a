"""Every shape of plan the planner can write runs on the runtime, as the single-process run does.

The planner's plans vary along: pipeline stages (uneven layer splits), data-parallel replicas,
tensor parallelism per stage (stages of different degrees: GPU types of other memory), pipelines
built differently (kinds of pipeline placed apart), unequal shares of the batch per pipeline,
flat or hierarchical all-reduce, a compressed cross-region hop, a deeper latency-aware warm-up.
First, whatever the planner returns for recipes that open all of these becomes a runtime
layout (the only refusal left: replicas of one stage at different degrees). Then plans that
cover every shape between them train two steps on a local Ray cluster with the losses of one
process (TP stages with replicas in two regions: test_runtime_tensor_parallel.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from orchestrator.catalog import default_catalog  # noqa: E402
from orchestrator.layout import layout_from_plan  # noqa: E402
from orchestrator.plan import Plan, Replica, check_plan  # noqa: E402
from orchestrator.planner import plan_recipe  # noqa: E402
from orchestrator.planner.search import SearchOptions  # noqa: E402
from orchestrator.recipe import parse_recipe  # noqa: E402
from runtime.reference import TrainConfig, workload_losses  # noqa: E402
from runtime.workload import build_workload  # noqa: E402

A1, A2, B1 = "local/sim-us/sim-us-a", "local/sim-us/sim-us-b", "local/sim-eu/sim-eu-a"
MODEL = "gpt-tiny"  # 6 layers: embedding, 4 blocks, head; 4 heads
CONFIG = TrainConfig(
    steps=2, global_batch_size=8, microbatch_size=2, learning_rate=3e-3, seed=2, grad_clip_norm=1.0
)
CORPUS_BYTES = 2**18
# the same sums in another order (replicas, shards, the tied weight's two stages): last bits only
EXACT, COMPRESSED = 1e-5, 1e-2
RECIPE = """\
name: shapes
provider: gcp
model: {name: gpt-neo-2.7b, profile: analytic}
training: {global_batch_size: 64, microbatch_sizes: [1, 2], steps: 10, precision: fp16-mixed}
objective: {goal: max_throughput}
constraints: {gpu_types: GPUS, max_gpus: MAX, pricing: spot, min_locations: 2,
  locations: [gcp/us-central1, gcp/europe-west4]}
parallelism: {tensor_parallel: [1, 2, 4], max_pipeline_stages: 8}
runtime: {allreduce: auto, compression: int8}
"""


@pytest.mark.parametrize(
    ("gpus", "most"), [("[A100, V100]", 16), ("[T4, V100, A100]", 24)]
)  # their best 10: TP 1, 2 and 4, stages of mixed degrees and GPU types, 4-8 stages
def test_every_plan_the_planner_returns_becomes_a_runtime_layout(gpus, most):
    text = RECIPE.replace("GPUS", gpus).replace("MAX", str(most))
    recipe = parse_recipe(text, file="shapes.yaml", folder=Path("."))
    catalog = default_catalog()
    result = plan_recipe(recipe, catalog, catalog.market("gcp"), SearchOptions(top_k=10))
    assert result.plans
    for evaluated in result.plans:
        layout = layout_from_plan(evaluated.plan, model="gpt-neo-2.7b")
        assert layout.world_size == sum(r.tp for s in evaluated.plan.stages for r in s.replicas)


def _plan(layers, pipelines, **options) -> Plan:
    """``pipelines``: (how many, [(place, tp) per stage])."""
    plan = Plan.from_pipelines(
        global_batch_size=CONFIG.global_batch_size,
        microbatch_size=CONFIG.microbatch_size,
        layers=layers,
        pipelines=[
            (count, [Replica(gpu="T4" if tp == 1 else "V100", infra=p, tp=tp) for p, tp in row])
            for count, row in pipelines
        ],
        **options,
    )
    check_plan(plan)
    return plan


SHAPES = {
    "stages of other degrees (TP 1 -> TP 2 -> TP 1)": _plan(
        [(0, 2), (2, 4), (4, 6)], [(1, [(A1, 1), (A1, 2), (A1, 1)])]
    ),
    "pipelines built differently, uneven split, unequal shares, flat": _plan(
        [(0, 2), (2, 6)],
        [(1, [(A1, 1), (A2, 1)]), (1, [(B1, 1), (A2, 1)])],
        pipeline_microbatches=(3, 1),
        allreduce="flat",
    ),
    "compressed cross-region hop with TP 2": _plan(
        [(0, 6)], [(1, [(A1, 2)]), (1, [(B1, 2)])], compression="int8"
    ),
    "deeper latency-aware warm-up, 3 stages": _plan(
        [(0, 2), (2, 4), (4, 6)], [(1, [(A1, 1), (B1, 1), (A1, 1)])], pipeline_warmup=(3, 2, 0)
    ),
}


@pytest.fixture(scope="module")
def cluster(shared_workers):
    """The runtime modules' shared pool of workers (conftest.SharedRuntime)."""
    return shared_workers


@pytest.fixture(scope="module")
def expected():
    return workload_losses(
        build_workload(MODEL, seed=CONFIG.seed, corpus_bytes=CORPUS_BYTES), CONFIG
    )


@pytest.mark.integration
@pytest.mark.parametrize("shape", list(SHAPES))
def test_each_shape_trains_as_one_process_does(cluster, expected, shape):
    plan = SHAPES[shape]
    layout = layout_from_plan(plan, model=MODEL)
    group = cluster.start(layout, CONFIG, corpus_bytes=CORPUS_BYTES)  # the last shape's workers
    got = [group.step(step) for step in range(CONFIG.steps)]
    tolerance = COMPRESSED if plan.compression != "none" else EXACT
    relative = [abs(g - w) / w for g, w in zip(got, expected, strict=True)]
    assert max(relative) <= tolerance, (shape, relative, got, expected)
