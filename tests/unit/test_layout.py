"""Plan → Layout and the Layout's groups: ranks, pipelines, data-parallel and hierarchical groups."""

from __future__ import annotations

import pytest

from orchestrator.errors import UserError
from orchestrator.layout import layout_from_plan
from orchestrator.plan import Plan, Replica
from runtime.layout import Layout, LayoutError, WorkerSpec

A1, A2, B1 = "local/sim-us/sim-us-a", "local/sim-us/sim-us-b", "local/sim-eu/sim-eu-a"


def _plan(places: list[str], *, tp: int = 1) -> Plan:
    rows = [
        (1, [Replica(gpu="T4", tp=tp, infra=p), Replica(gpu="T4", tp=tp, infra=p)]) for p in places
    ]
    return Plan.from_pipelines(
        global_batch_size=8 * len(places),
        microbatch_size=2,
        layers=[(0, 3), (3, 6)],
        pipelines=rows,
    )


def test_ranks_pipelines_and_groups():
    layout = layout_from_plan(_plan([A1, A1, A2, B1]), model="gpt-tiny")
    assert layout.world_size == 8 and layout.replicas == 4 and layout.num_stages == 2
    assert layout.pipeline(2) == (2, 6)
    assert layout.dp_group(1) == (4, 5, 6, 7)
    assert layout.zone_groups(0) == ((0, 1), (2,), (3,))
    assert layout.region_groups(0) == ((0, 1, 2), (3,))
    assert layout.cross_region_group(1) == (4, 7)
    assert layout.worker(1, 3).region == "local/sim-eu" and layout.worker(0, 0).microbatches == 4
    assert layout.warmup == (1, 0) and layout.places() == (B1, A1, A2)


def test_tensor_parallel_plans_are_refused_with_a_fix():
    with pytest.raises(UserError, match="tensor parallelism") as caught:
        layout_from_plan(_plan([A1], tp=2), model="gpt-tiny")
    assert "tp: 1" in caught.value.fix


def test_a_broken_layout_names_every_problem():
    workers = (
        WorkerSpec(stage=0, replica=0, place=A1, microbatches=4),
        WorkerSpec(stage=1, replica=0, place=A1, microbatches=3),
    )
    with pytest.raises(LayoutError) as caught:
        Layout(
            model="gpt-tiny",
            layers=((0, 3), (4, 6)),
            workers=workers,
            microbatch_size=1,
            warmup=(1,),
        )
    text = str(caught.value)
    assert "follow each other" in text and "warm-up" in text and "different microbatch" in text
