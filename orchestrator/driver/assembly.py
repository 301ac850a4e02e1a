"""The job's driver put together from its folder's state and its world's parts (called in the
driver actor, on every start): the plans of the market, the provider's contract behind the cloud,
the runtime's trainer, the chaos schedule and the per-step metrics."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from orchestrator.driver.actor import DriverSpec
from orchestrator.driver.chaos import ChaosSchedule
from orchestrator.driver.events import EventLog
from orchestrator.driver.job import STOP_FILE, job_folder, signing_key
from orchestrator.driver.machine import Driver, DriverConfig, StepResult
from orchestrator.driver.metrics import METRICS_FILE, DashboardMetrics, StepMetrics
from orchestrator.driver.state import JobState, StateStore
from orchestrator.plan import plan_from_dict

CAPACITY_WAIT_S = 300.0  # after a loss, how long to wait for the market to have room again


def build_driver(
    spec: DriverSpec,
    *,
    own_node: str | None,
    on_step: Callable[[JobState, StepResult], None] | None = None,
) -> Driver:
    """The job's driver from its folder's state, talking to the local cloud through its gateway
    (called in the driver actor, on every start)."""
    from orchestrator.catalog import default_catalog
    from orchestrator.driver.market_plans import MarketPlans
    from orchestrator.driver.world import (
        ProvisionerCloud,
        RuntimeTrainer,
        checkpoint_url,
    )
    from orchestrator.simulator import views_for
    from provisioners.local.gateway import RemoteProvisioner

    recipe, catalog = spec.recipe, default_catalog()
    store = StateStore(job_folder(recipe, Path(spec.recipe_path), Path(spec.jobs_dir)))
    state = store.load().state
    market = RemoteProvisioner(spec.gateway)  # the local cloud, or an emulated cloud's market
    provisioner = market
    if spec.cloud is not None:  # the provider's API, called from here (the controller)
        from orchestrator.driver.cloud import cloud_provisioner

        provisioner = cloud_provisioner(spec.cloud, job=state.job)
    network = None
    if recipe.runtime.link_emulation:
        network = views_for(catalog, catalog.market("local"))[0]
    trainer = RuntimeTrainer(
        recipe=recipe,
        catalog=catalog,
        job=state.run_id or state.job,
        checkpoint_url=checkpoint_url(recipe),
        network=network,
        signing_key=signing_key(store.folder),
    )
    chaos = ChaosSchedule(
        provisioner,
        market=market,
        nodes=set(spec.preempt_at),
        locations=set(spec.preempt_location_at),
        drivers=set(spec.preempt_driver_at),
        losses=set(spec.lose_at),
        own_node=own_node,
        done_steps=state.step,
        events=EventLog(store.folder / "events.jsonl"),
    )
    metrics = StepMetrics(store.folder / METRICS_FILE, recipe.training.global_batch_size)
    metrics.catch_up(state)  # a step its dead predecessor saved but had no time to log
    gauges = DashboardMetrics(state.job)

    def stepped(current: JobState, result: StepResult) -> None:
        row = metrics.record(current, result)
        gauges.update(
            row, usd_per_hour=sum(r.usd_per_node_hour for r in driver.session.nodes.values())
        )
        if on_step is not None:
            on_step(current, result)
        chaos.after(current)

    driver = Driver(
        store=store,
        events=EventLog(store.folder / "events.jsonl"),
        plans=MarketPlans(
            recipe,
            catalog,
            provisioner,
            progress=lambda: (driver.state.step, time.time() - driver.state.started_at_s),
            given=plan_from_dict(spec.given_plan) if spec.given_plan else None,
        ),
        cloud=ProvisionerCloud(provisioner, launch_timeout_s=spec.launch_timeout_s),
        trainer=trainer,
        config=DriverConfig(
            steps=recipe.training.steps,
            checkpoint_every_steps=recipe.checkpointing.every_steps,
            budget_usd=recipe.objective.budget_usd,
            # look for a better plan at each periodic checkpoint (a move then loses nothing)
            replan_every_steps=recipe.checkpointing.every_steps,
            samples_per_step=recipe.training.global_batch_size,
            goal=recipe.objective.goal,
            capacity_wait_s=CAPACITY_WAIT_S,
            max_attempts=recipe.recovery.max_attempts,
            max_attempts_s=recipe.recovery.max_seconds,
            backoff_s=recipe.recovery.backoff_s,
            max_backoff_s=recipe.recovery.max_backoff_s,
            migration_s=spec.migration_s,
            deadline_s=recipe.objective.deadline_h * 3600 if recipe.objective.deadline_h else None,
        ),
        state=state,
        on_step=stepped,
        stop_requested=lambda: _stop_asked(store.folder),
        own_node=own_node,
    )
    return driver


def _stop_asked(folder: Path) -> str | None:
    """Who asks the job to stop: its user (``stop``), or its controller VM shutting down (the
    next controller resumes the job: controller.py)."""
    from orchestrator.driver.controller import LEAVE_FILE

    if (folder / STOP_FILE).exists():
        return "asked to stop"
    if (folder / LEAVE_FILE).exists():
        return "its controller VM shuts down: the next controller resumes the job"
    return None
