"""Mixed stages (planner/mixed.py): the planner's best plan grown with pipelines of other GPU types.

SAILOR's heterogeneous data parallelism puts one stage's replicas on different GPU types. On a
market of 4 V100 and a spare T4 the planner's best of one type per stage is 4 V100 replicas; a
fifth replica on the T4, given fewer microbatches, runs faster (the challenger test found it).
"""

from __future__ import annotations

import pytest

from orchestrator.catalog import OFFER_COLUMNS, default_catalog
from orchestrator.cli.plan_cmd import search_verdict
from orchestrator.layout import layout_from_plan
from orchestrator.planner import SearchOptions, plan_recipe
from orchestrator.planner.mixed import speed_shares
from orchestrator.recipe import parse_recipe

MARKET = [
    "gcp,us-central1,us-central1-a,vm-T4-1,T4,1,8,30,0.3,0.116,1,0.123,test,2026-01-01",
    "gcp,us-central1,us-central1-a,vm-V100-1,V100,1,8,30,2.293,1.129,4,0.204,test,2026-01-01",
]
RECIPE = (
    "model: {{name: gpt-tiny}}\nprovider: gcp\nmarket: market.csv\n"
    "training: {{global_batch_size: 24, microbatch_sizes: [1], steps: 100}}\n"
    "objective: {objective}\nconstraints: {{pricing: spot}}\n"
    "parallelism: {{tensor_parallel: [1], max_pipeline_stages: 1}}\n"
)


def _plan(tmp_path, objective: str, *, market=MARKET, recipe=RECIPE, **options):
    (tmp_path / "market.csv").write_text(",".join(OFFER_COLUMNS) + "\n" + "\n".join(market) + "\n")
    catalog = default_catalog()
    parsed = parse_recipe(
        recipe.format(objective=objective), file="r.yaml", folder=tmp_path, catalog=catalog
    )
    return plan_recipe(parsed, catalog, options=SearchOptions(**options))


def test_speed_shares_give_each_microbatch_to_the_pipeline_done_first():
    assert speed_shares([1.0, 2.0], 9) == (6, 3)
    assert speed_shares([1.0, 1.0, 1.0], 7) in {(3, 2, 2), (2, 3, 2), (2, 2, 3)}
    assert sum(speed_shares([0.3, 0.7, 1.1], 50)) == 50
    assert speed_shares([1.0, 100.0], 3) is None  # the slow one would get nothing


def test_a_spare_gpu_of_another_type_joins_as_a_replica(tmp_path):
    one_type = _plan(tmp_path, "{goal: max_throughput}", mixed_stages=False)
    mixed = _plan(tmp_path, "{goal: max_throughput}")
    before, after = one_type.plans[0], mixed.plans[0]
    assert {r.gpu for r in before.plan.stages[0].replicas} == {"V100"}
    assert one_type.proven
    gpus = [r.gpu for r in after.plan.stages[0].replicas]
    assert sorted(gpus) == ["T4", "V100", "V100", "V100", "V100"]
    shares = dict(zip(gpus, after.plan.microbatches(), strict=True))
    assert shares["T4"] < shares["V100"]  # the slower GPU runs fewer microbatches
    assert sum(after.plan.microbatches()) == 24
    assert after.score.samples_per_s > before.score.samples_per_s * 1.05
    # the growth is a local search: it says so, with no bound
    assert "mixed stages" in mixed.heuristics and mixed.gap is None
    assert "no bound covers them all" in search_verdict(mixed)


@pytest.mark.parametrize(
    "objective",
    [
        "{goal: min_cost, min_throughput_samples_per_s: 700}",
        "{goal: max_throughput, budget_usd_per_hour: 2.4}",
    ],
)
def test_growth_keeps_to_the_objective_and_its_limits(tmp_path, objective):
    one_type = _plan(tmp_path, objective, mixed_stages=False)
    mixed = _plan(tmp_path, objective)
    best = mixed.plans[0]
    assert best.score.feasible
    assert best.score.value >= one_type.plans[0].score.value
    if "budget" in objective:
        assert best.estimate.cost_per_hour_usd <= 2.4
    else:
        assert best.estimate.samples_per_s >= 700


def test_grown_plans_keep_one_tp_degree_per_stage_and_run(tmp_path):
    # V100 in 2-GPU nodes (TP 2 possible) beside single-T4 nodes: a T4 pipeline may join only at
    # the TP degree each stage already has, since the runtime sums a stage's gradients shard by
    # shard; every plan returned must become the runtime's layout
    market = [
        "gcp,us-central1,us-central1-a,vm-T4-1,T4,1,8,30,0.3,0.116,4,0.123,test,2026-01-01",
        "gcp,us-central1,us-central1-a,vm-V100-2,V100,2,16,60,4.586,2.258,2,0.204,test,2026-01-01",
    ]
    recipe = RECIPE.replace("tensor_parallel: [1]", "tensor_parallel: [1, 2]").replace(
        "max_pipeline_stages: 1", "max_pipeline_stages: 3"
    )
    result = _plan(tmp_path, "{goal: max_throughput}", market=market, recipe=recipe, top_k=5)
    assert result.plans
    for evaluated in result.plans:
        for stage in evaluated.plan.stages:
            assert len({r.tp for r in stage.replicas}) == 1, evaluated.plan.to_yaml()
        layout_from_plan(evaluated.plan, model="gpt-tiny")


def test_a_new_pipeline_takes_each_stages_tp_degree(tmp_path):
    from orchestrator.plan import Plan, Replica, Stage
    from orchestrator.planner import prepare
    from orchestrator.planner.mixed import _new_rows

    market = [
        "gcp,us-central1,us-central1-a,vm-T4-2,T4,2,16,60,0.6,0.232,4,0.123,test,2026-01-01",
        "gcp,us-central1,us-central1-a,vm-V100-2,V100,2,16,60,4.586,2.258,2,0.204,test,2026-01-01",
    ]
    (tmp_path / "market.csv").write_text(",".join(OFFER_COLUMNS) + "\n" + "\n".join(market) + "\n")
    catalog = default_catalog()
    text = RECIPE.replace("tensor_parallel: [1]", "tensor_parallel: [1, 2]").replace(
        "max_pipeline_stages: 1", "max_pipeline_stages: 2"
    )
    context = prepare(
        parse_recipe(
            text.format(objective="{goal: max_throughput}"),
            file="r.yaml",
            folder=tmp_path,
            catalog=catalog,
        ),
        catalog,
    )
    zone = "gcp/us-central1/us-central1-a"
    row = (Replica(gpu="V100", tp=2, infra=zone), Replica(gpu="V100", tp=1, infra=zone))
    plan = Plan(
        global_batch_size=24,
        microbatch_size=1,
        stages=(Stage(layers=(0, 3), replicas=row[:1]), Stage(layers=(3, 6), replicas=row[1:])),
    )
    rows = list(_new_rows(context.evaluator, context.space, plan, [row], spot=True))
    # one V100 is left (2 + 1 of 4 used), too few for a pipeline of 2 + 1; 8 T4 are free
    assert {new[0].gpu for new in rows} == {"T4"}
    assert all(tuple(r.tp for r in new) == (2, 1) for new in rows), rows
