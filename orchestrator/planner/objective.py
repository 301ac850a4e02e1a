"""How the planner scores an estimate: the recipe's goal, its limits, and preemption risk.

Goals: ``max_throughput`` (samples/s, optionally under a $/h budget) and ``min_cost`` ($ per sample,
optionally above a throughput floor, given directly or implied by a deadline for the recipe's steps).
A total budget (``budget_usd``) bounds the whole run. $/h counts compute and egress.

Risk-aware scoring (Parcae's "liveput" idea, simplified): each spot VM is preempted at its place's
rate, and now and then a location loses all its spot VMs at once; each costs time, as the driver
recovers (docs/driver.md, "When a lost node costs steps"):

- a preemption with a notice long enough for a step and a checkpoint (the provider must deliver
  notices: AWS and the local cloud do) rolls nothing back: the driver checkpoints, moves off, waits
  for the replacement and restores;
- without one, with a replica of every stage left, the survivors' state is kept (copied) and
  training goes on with one replica fewer until a replacement arrives;
- without one, on a pipeline without replicas, or when a location that holds every replica of a
  stage goes at once, the job waits for the replacement, restores the newest checkpoint and trains
  again what came after it: half a checkpoint interval on average.

Expected throughput = throughput x (1 - seconds lost per hour / 3600). Rates and times come from
the market, else configs/planner.yaml.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import NamedTuple

from orchestrator.catalog import Catalog
from orchestrator.catalog.records import Entry
from orchestrator.plan import Plan
from orchestrator.recipe import Recipe
from orchestrator.simulator import Estimate


@dataclass(frozen=True)
class Objective:
    goal: str  # max_throughput | min_cost
    budget_usd_per_hour: float | None = None
    min_samples_per_s: float | None = None  # a floor, or what a deadline needs
    budget_usd: float | None = None
    steps: int = 1
    risk_aware: bool = False

    @classmethod
    def from_recipe(cls, recipe: Recipe) -> Objective:
        o, t = recipe.objective, recipe.training
        floor = o.min_throughput_samples_per_s
        if o.deadline_h:
            floor = t.steps * t.global_batch_size / (o.deadline_h * 3600)
        return cls(
            goal=o.goal,
            budget_usd_per_hour=o.budget_usd_per_hour,
            min_samples_per_s=floor,
            budget_usd=o.budget_usd,
            steps=t.steps,
            risk_aware=o.risk_aware,
        )


class Score(NamedTuple):
    feasible: bool
    value: float  # higher is better: samples/s, or minus $ per 1M samples
    samples_per_s: float  # expected under preemptions when risk-aware
    cost_per_million_samples_usd: float
    spend_usd_per_hour: float  # compute + egress
    violation: str  # which limit it breaks ("" if none)


@dataclass(frozen=True)
class RiskModel:
    rate_per_hour: dict[
        str, float
    ]  # default spot preemption rate by cloud ("default" for the rest)
    replacement_s: dict[str, float]
    copy_s: dict[str, float]
    restore_s: dict[str, float]
    notice_s: dict[str, float]  # as the driver receives it (0: none)
    checkpoint_write_s: dict[str, float]
    location_rate_per_hour: dict[str, float]  # all of a location's spot VMs at once
    # per cloud, the figures above looked up once (``_costs``)
    _by_cloud: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @classmethod
    def load(cls, catalog: Catalog) -> RiskModel:
        doc = catalog.yaml_doc("planner.yaml")
        entry = Entry(doc, ("risk",))

        def by_cloud(key: str) -> dict[str, float]:
            raw = entry.raw(key)
            if (
                not isinstance(raw, dict)
                or "default" not in raw
                or not all(isinstance(v, (int, float)) and v >= 0 for v in raw.values())
            ):
                entry.fail(
                    entry.path + (key,),
                    "expected {default: seconds-or-rate, <cloud>: ...} >= 0",
                    "write e.g. {default: 300, local: 10}",
                )
            return {str(k): float(v) for k, v in raw.items()}

        model = cls(
            by_cloud("default_spot_preemption_rate_per_hour"),
            by_cloud("replacement_s"),
            by_cloud("copy_from_replica_s"),
            by_cloud("restore_from_checkpoint_s"),
            by_cloud("notice_s"),
            by_cloud("checkpoint_write_s"),
            by_cloud("location_event_rate_per_hour"),
        )
        entry.text("source")
        entry.done()
        return model

    def for_provider(self, provider: str, *, local_notice_s: float) -> RiskModel:
        """The model as the recipe's provider delivers notices: none where its adapter cannot
        (provisioners declare it), the recipe's own on the local cloud."""
        from provisioners.base import Feature
        from provisioners.registry import provisioner_class

        if provider == "local":
            notice = {"default": 0.0, "local": local_notice_s}
        elif Feature.PREEMPTION_NOTICE in provisioner_class(provider).unsupported:
            notice = {"default": 0.0}
        else:
            notice = self.notice_s
        return replace(self, notice_s=notice)

    @staticmethod
    def _get(table: dict[str, float], cloud: str) -> float:
        return table.get(cloud, table["default"])

    def _costs(self, cloud: str) -> _CloudCosts:
        """The model's figures for one cloud, looked up once (the planner asks for every plan)."""
        costs = self._by_cloud.get(cloud)
        if costs is None:
            get = self._get
            costs = _CloudCosts(
                rate_per_hour=get(self.rate_per_hour, cloud),
                replacement_s=get(self.replacement_s, cloud),
                copy_s=get(self.copy_s, cloud),
                restore_s=get(self.restore_s, cloud),
                notice_s=get(self.notice_s, cloud),
                checkpoint_write_s=get(self.checkpoint_write_s, cloud),
                location_rate_per_hour=get(self.location_rate_per_hour, cloud),
            )
            self._by_cloud[cloud] = costs
        return costs

    def live_fraction(
        self,
        plan: Plan,
        estimate: Estimate,
        rates: dict[str, tuple[str, float | None]],
        checkpoint_every_steps: int,
    ) -> float:
        """Share of time spent training, given preemptions. ``rates``: infra -> (cloud, market rate)."""
        iteration_s = estimate.iteration_time_s
        rollback_s = checkpoint_every_steps * iteration_s / 2
        dp = plan.dp_degree
        lost_per_hour = 0.0
        spot_places = set()
        for stage in plan.stages:
            for replica in stage.replicas:
                if not replica.spot:
                    continue
                spot_places.add(replica.infra)
                cloud, rate = rates[replica.infra]
                c = self._costs(cloud)
                if c.notice_s >= iteration_s + c.checkpoint_write_s:
                    loss = c.replacement_s + c.restore_s  # checkpointed on the notice
                elif dp >= 2:
                    loss = c.copy_s + c.replacement_s / dp  # the survivors hold the last step
                else:
                    loss = c.replacement_s + c.restore_s + rollback_s
                lost_per_hour += (c.rate_per_hour if rate is None else rate) * loss
        for infra in spot_places:
            c = self._costs(rates[infra][0])
            if c.location_rate_per_hour:
                lost_per_hour += c.location_rate_per_hour * self._location_loss_s(
                    c, plan, infra, rollback_s
                )
        return max(0.0, 1.0 - lost_per_hour / 3600)

    @staticmethod
    def _location_loss_s(c: _CloudCosts, plan: Plan, infra: str, rollback_s: float) -> float:
        """A location's spot VMs all at once: its stages' state survives elsewhere, or not."""
        if all(any(r.infra != infra for r in stage.replicas) for stage in plan.stages):
            return c.copy_s + c.replacement_s
        return c.replacement_s + c.restore_s + rollback_s


class _CloudCosts(NamedTuple):
    rate_per_hour: float
    replacement_s: float
    copy_s: float
    restore_s: float
    notice_s: float
    checkpoint_write_s: float
    location_rate_per_hour: float


def score(estimate: Estimate, objective: Objective, live_fraction: float = 1.0) -> Score:
    """Feasibility and value of one estimate under the objective."""
    samples = estimate.samples_per_s * live_fraction
    per_iteration = estimate.cost_per_iteration_usd
    spend = per_iteration / estimate.iteration_time_s * 3600
    per_million = per_iteration / estimate.global_batch_size * 1e6 / max(live_fraction, 1e-9)
    violation = ""
    if estimate.oom:
        violation = "memory"
    elif objective.budget_usd_per_hour is not None and spend > objective.budget_usd_per_hour:
        violation = "budget_usd_per_hour"
    elif objective.min_samples_per_s is not None and samples < objective.min_samples_per_s:
        violation = "throughput floor"
    elif (
        objective.budget_usd is not None
        and per_iteration * objective.steps / max(live_fraction, 1e-9) > objective.budget_usd
    ):
        violation = "budget_usd"
    value = samples if objective.goal == "max_throughput" else -per_million
    return Score(not violation, value, samples, per_million, spend, violation)
