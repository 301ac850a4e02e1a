"""The planner: which GPUs to rent where, and how to split the model over them.

    result = plan_recipe(recipe, catalog, top_k=5)
    result.plans[0].plan, result.plans[0].estimate

Every candidate is scored by the simulator (docs/planner.md describes the plan space, the bounds
and the heuristics).
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.catalog import Catalog, OfferTable
from orchestrator.plan import Plan, PlanError
from orchestrator.planner.candidates import Evaluated, Evaluator
from orchestrator.planner.objective import Objective, RiskModel
from orchestrator.planner.search import SearchOptions, SearchResult, search
from orchestrator.planner.space import SearchSpace, build_space
from orchestrator.profiles import profile_for_recipe
from orchestrator.profiles.profile import ModelProfile, overlaid
from orchestrator.recipe import Recipe
from orchestrator.simulator import Estimate, check_plan_runs, normalize_plan, simulate, views_for

__all__ = [
    "Evaluated",
    "Objective",
    "PlanningContext",
    "SearchOptions",
    "SearchResult",
    "plan_recipe",
    "prepare",
    "given_plan",
]


@dataclass
class PlanningContext:
    space: SearchSpace
    evaluator: Evaluator


def prepare(
    recipe: Recipe,
    catalog: Catalog,
    market: OfferTable | None = None,
    *,
    measured: ModelProfile | None = None,
) -> PlanningContext:
    """The search space and evaluator for ``recipe`` over ``market`` (default: the recipe's);
    ``measured``: figures measured on the job's own nodes, laid over the recipe's profile."""
    if market is None:
        market = catalog.market(recipe.provider, recipe.market_file())
    space = build_space(recipe, market, catalog)
    profile = profile_for_recipe(
        recipe,
        space.gpu_types,
        catalog,
        microbatch_sizes=space.microbatch_sizes,
        tp_degrees=space.tp_degrees,
    )
    if measured is not None:
        profile = overlaid(profile, measured)
    if profile.num_layers != space.num_layers:
        space = build_space(recipe, market, catalog, num_layers=profile.num_layers)
    network, prices, settings = views_for(catalog, market)
    objective = Objective.from_recipe(recipe)
    risk = None
    if objective.risk_aware:
        risk = RiskModel.load(catalog).for_provider(
            recipe.provider, local_notice_s=recipe.local_cloud.notice_s
        )
    evaluator = Evaluator(
        space,
        profile,
        objective,
        network=network,
        prices=prices,
        settings=settings,
        risk=risk,
        checkpoint_every_steps=recipe.checkpointing.every_steps,
    )
    return PlanningContext(space, evaluator)


def plan_recipe(
    recipe: Recipe,
    catalog: Catalog,
    market: OfferTable | None = None,
    options: SearchOptions | None = None,
    *,
    measured: ModelProfile | None = None,
) -> SearchResult:
    """The best plans for ``recipe`` on ``market``, best first (``options.top_k`` of them);
    ``measured``: see ``prepare``."""
    context = prepare(recipe, catalog, market, measured=measured)
    return search(context.evaluator, context.space, options)


@dataclass(frozen=True)
class GivenPlan:
    """A given plan, normalized, its estimate and what it was simulated with."""

    plan: Plan
    estimate: Estimate
    profile: ModelProfile
    network: object
    prices: object
    settings: object


def given_plan(
    recipe: Recipe,
    plan: Plan,
    catalog: Catalog,
    market: OfferTable | None = None,
    *,
    measured: ModelProfile | None = None,
) -> GivenPlan:
    """A plan someone gave (a plan file), checked against the recipe, the catalog and the profile
    the planner would use, and its estimate on ``market`` (default: the recipe's). Raises
    PlanError naming what does not fit."""
    plan = normalize_plan(plan, catalog)
    if plan.global_batch_size != recipe.training.global_batch_size:
        raise PlanError(
            f"the plan's global_batch_size {plan.global_batch_size} differs from the recipe's "
            f"{recipe.training.global_batch_size}",
            field="global_batch_size",
            fix="use the recipe's global batch size in the plan",
        )
    if market is None:
        market = catalog.market(recipe.provider, recipe.market_file())
    network, prices, settings = views_for(catalog, market)
    gpus = {r.gpu for stage in plan.stages for r in stage.replicas}
    tps = {r.tp for stage in plan.stages for r in stage.replicas}
    profile = profile_for_recipe(
        recipe, gpus, catalog, microbatch_sizes=[plan.microbatch_size], tp_degrees=tps
    )
    if measured is not None:
        profile = overlaid(profile, measured)
    check_plan_runs(plan, profile, network, prices)
    estimate = simulate(profile, plan, network=network, prices=prices, settings=settings)
    return GivenPlan(plan, estimate, profile, network, prices, settings)
