"""The risk-aware objective weighs what a preemption really costs the driver: nothing trained
again after a notice, the survivors' state kept when every stage has a replica left, a rollback to
the newest checkpoint otherwise (a pipeline without replicas, or a location holding every replica
of a stage lost at once)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from orchestrator.catalog import default_catalog
from orchestrator.plan import Plan, Replica
from orchestrator.planner.objective import RiskModel

A, B = "gcp/us-central1/us-central1-a", "gcp/us-central1/us-central1-b"
STEP = SimpleNamespace(iteration_time_s=2.0)  # what live_fraction reads of an estimate


def _plan(rows: list[list[str]]) -> Plan:
    """One pipeline per row, its stages' places in order."""
    stages = len(rows[0])
    return Plan.from_pipelines(
        global_batch_size=8,
        microbatch_size=1,
        layers=[(i * 4, (i + 1) * 4) for i in range(stages)],
        pipelines=[(1, [Replica(gpu="T4", infra=p, spot=True) for p in row]) for row in rows],
    )


def _live(model: RiskModel, plan: Plan, every: int) -> float:
    rates = {p: ("gcp", 0.1) for p in (A, B)}
    return model.live_fraction(plan, STEP, rates, every)


@pytest.fixture(scope="module")
def model() -> RiskModel:
    return RiskModel.load(default_catalog())


def test_without_notice_a_pipeline_without_replicas_pays_the_rollback(model):
    plan = _plan([[A, B]])
    silent = model.for_provider("gcp", local_notice_s=0)  # GCP's notice reaches only the VM
    assert _live(silent, plan, every=500) < _live(silent, plan, every=50)
    # (a location lost at once comes without notice: left out here)
    calm = {"location_rate_per_hour": {"default": 0.0}}
    noticed = replace(model, **calm, notice_s={"default": 0.0, "gcp": 120.0})
    assert _live(noticed, plan, every=500) == _live(noticed, plan, every=50)
    silent = replace(silent, **calm)
    assert _live(noticed, plan, every=500) > _live(silent, plan, every=500)


def test_a_notice_too_short_for_a_step_and_a_checkpoint_counts_as_none(model):
    plan = _plan([[A, B]])
    short = replace(model, notice_s={"default": 0.0, "gcp": 10.0})
    silent = model.for_provider("gcp", local_notice_s=0)
    assert _live(short, plan, every=500) == _live(silent, plan, every=500)


def test_replicas_of_a_stage_in_one_place_pay_the_rollback_when_that_place_goes(model):
    silent = model.for_provider("gcp", local_notice_s=0)
    together = _plan([[A, B], [A, B]])  # each stage's two replicas share a place
    spread = _plan([[A, B], [B, A]])
    assert _live(silent, together, every=500) < _live(silent, spread, every=500)
    assert _live(silent, spread, every=500) == _live(silent, spread, every=50)


def test_the_providers_notices_as_delivered(model):
    assert model.for_provider("aws", local_notice_s=0).notice_s["aws"] == 120.0
    assert model.for_provider("gcp", local_notice_s=0).notice_s == {"default": 0.0}
    assert model.for_provider("skypilot", local_notice_s=0).notice_s == {"default": 0.0}
    assert model.for_provider("local", local_notice_s=2.5).notice_s["local"] == 2.5
