"""Check a plan against the catalog, the market and the model profile before simulating it.

Each problem names the stage and replica (``stages[1].replicas[0].tp``) and what to do: an unknown
GPU or place, TP larger than any node of that GPU there, no offer (or no spot price) there, a plan
that does not cover exactly the model's layers, a TP degree or GPU the profile lacks.
"""

from __future__ import annotations

import dataclasses

from orchestrator.catalog import Catalog
from orchestrator.errors import UserError
from orchestrator.plan import Plan, PlanError
from orchestrator.profiles.profile import ModelProfile
from orchestrator.simulator.environment import NetworkView, PriceView


def normalize_plan(plan: Plan, catalog: Catalog) -> Plan:
    """The plan with GPU aliases replaced by catalog names; PlanError for unknown GPUs."""
    stages = []
    for s, stage in enumerate(plan.stages):
        replicas = []
        for i, replica in enumerate(stage.replicas):
            spec = catalog.gpus.find(replica.gpu)
            if spec is None:
                hint = catalog.gpus.suggest(replica.gpu)
                raise PlanError(
                    f"unknown GPU '{replica.gpu}'" + (f" (did you mean '{hint}'?)" if hint else ""),
                    field=f"stages[{s}].replicas[{i}].gpu",
                    fix="use a GPU of configs/gpus.yaml",
                )
            replicas.append(dataclasses.replace(replica, gpu=spec.name))
        stages.append(dataclasses.replace(stage, replicas=tuple(replicas)))
    return dataclasses.replace(plan, stages=tuple(stages))


def check_plan_runs(
    plan: Plan, profile: ModelProfile, network: NetworkView, prices: PriceView
) -> None:
    """Raise PlanError for the first replica that cannot run as written."""
    if plan.num_layers != profile.num_layers:
        raise PlanError(
            f"the plan covers layers 0-{plan.num_layers - 1} but {profile.model} has "
            f"{profile.num_layers} layers (0-{profile.num_layers - 1})",
            field=f"stages[{plan.num_stages - 1}].layers",
            fix=f"end the last stage at layer {profile.num_layers}",
        )
    for s, stage in enumerate(plan.stages):
        for i, replica in enumerate(stage.replicas):
            where = f"stages[{s}].replicas[{i}]"
            try:
                network.place(replica.infra)
                prices.gpu_hour_usd(
                    replica.gpu,
                    replica.infra,
                    spot=replica.spot,
                    tp=replica.tp,
                    instance_type=replica.instance_type,
                )
                profile.time_table(replica.gpu, plan.microbatch_size, replica.tp)
                profile.layer_table(replica.tp)
            except PlanError:
                raise
            except UserError as exc:
                raise PlanError(
                    exc.message,
                    field=f"{where} ({replica.gpu} in {replica.infra}, tp={replica.tp})",
                    fix=exc.fix,
                ) from None
