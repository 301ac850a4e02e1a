"""The driver's plans from the live market: ``MarketPlans`` polls the provisioner's offers now
(prices and free capacity), plans the recipe on them with the places that just refused capacity
left out (and what the job's own nodes measured laid over the profile: measure.py), and turns the
best plan into launch requests (nodes per place, at the offer's price).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace

from orchestrator.catalog import Catalog
from orchestrator.catalog.offers import OfferTable
from orchestrator.driver.contract import deadline_rate
from orchestrator.driver.machine import Choice, Request
from orchestrator.driver.measure import NodeProfiles
from orchestrator.errors import UserError
from orchestrator.market import convert_offers
from orchestrator.plan import Plan
from orchestrator.recipe.schema import Recipe
from provisioners.base import Provisioner


def describe(plan: Plan) -> str:
    """``PP2 x DP2 x TP1, microbatch 2: local/sim-us/sim-us-a: 2 T4 spot; ...``"""
    from orchestrator.planner.explain import gpus_by_location, shape_text

    return f"{shape_text(plan)}, microbatch {plan.microbatch_size}: {gpus_by_location(plan)}"


class MarketPlans:
    def __init__(
        self,
        recipe: Recipe,
        catalog: Catalog,
        provisioner: Provisioner | None,
        *,
        progress: Callable[[], tuple[int, float]] | None = None,
        given: Plan | None = None,
    ) -> None:
        """``progress``: (steps committed, seconds since the job began), so that a deadline's
        throughput floor is what the rest of the job needs in the time left. ``given``: the
        plan to run (``submit --plan``, or the one shown before renting) for as long as the
        market can hold it; once it cannot (a place lost or refused, no room), the planner
        chooses. ``provisioner``: None where only ``choose_on`` is asked (a market given)."""
        self.recipe, self.catalog, self.provisioner = recipe, catalog, provisioner
        self.progress = progress
        self.given = given
        # profile: auto on a real cloud: what the job's own nodes measured (measure.py)
        self.node_profiles = NodeProfiles(recipe)

    def unmeasured(self, plan: Plan) -> tuple[str, ...]:
        return self.node_profiles.unmeasured(plan)

    def learn(self, gpu: str, profile) -> None:
        self.node_profiles.learn(gpu, profile)

    def choose(
        self, *, excluded: frozenset[str], held: dict[str, int], held_only: bool = False
    ) -> Choice:
        """The best plan on the provider's market now, without the ``excluded`` places; the
        ``held`` nodes (per place) count as free (``held_only``: they are all there is)."""
        return self.choose_on(self.market(held, held_only=held_only), excluded=excluded)

    def choose_on(self, market: OfferTable, *, excluded: frozenset[str] = frozenset()) -> Choice:
        """The best plan on ``market`` (the given plan while it fits there)."""
        constraints = self.recipe.constraints
        recipe = replace(
            self._with_deadline_left(),
            constraints=replace(
                constraints,
                exclude_locations=tuple(sorted({*constraints.exclude_locations, *excluded})),
            ),
        )
        given_note = ""
        if self.given is not None:
            try:
                return self.given_choice(market, recipe)
            except UserError as error:
                self.given = None  # the planner chooses from now on
                given_note = f"the plan given no longer fits ({error.message}): re-planned"
        result, note = self._plan_spread(recipe, market)
        note = "; ".join(filter(None, (given_note, note)))
        if not result.plans:
            left_out = f" (left out after refusing capacity: {', '.join(sorted(excluded))})"
            raise UserError(
                "no feasible plan on the market now" + (left_out if excluded else ""),
                fix="see why: python -m orchestrator plan RECIPE; widen constraints.locations, "
                "gpu_types or max_gpus, or raise the budget",
            )
        best = result.plans[0]
        return Choice(
            plan=best.plan,
            summary=describe(best.plan),
            requests=tuple(requests_for(best.plan, market)),
            samples_per_s=best.estimate.samples_per_s,
            usd_per_hour=best.estimate.cost_per_hour_usd,
            egress_usd_per_step=best.estimate.egress_usd_per_iteration,
            note=note,
        )

    def given_choice(self, market: OfferTable, recipe: Recipe | None = None) -> Choice:
        """The given plan on ``market``: its launch requests and its estimate. UserError when
        it does not fit: a place left out, a GPU the market lacks there, too few free nodes."""
        from orchestrator.planner import given_plan

        recipe, plan = recipe or self.recipe, self.given
        assert plan is not None, "no plan was given"
        places = {r.infra for stage in plan.stages for r in stage.replicas}
        left_out = sorted(places & set(recipe.constraints.exclude_locations))
        if left_out:
            raise UserError(f"it uses {', '.join(left_out)}, which the job left out", fix="re-plan")
        requests = requests_for(plan, market)
        for request in requests:
            free = _free_nodes(market, request)
            if free is not None and free < request.count:
                raise UserError(
                    f"it needs {request.count} {request.gpu} nodes in {request.infra}; the market "
                    f"has {free} free",
                    fix="give a plan within the market's capacity, or drop --plan",
                )
        measured = self.node_profiles.measured
        estimate = given_plan(recipe, plan, self.catalog, market, measured=measured).estimate
        return Choice(
            plan=plan,
            summary=describe(plan),
            requests=tuple(requests),
            samples_per_s=estimate.samples_per_s,
            usd_per_hour=estimate.cost_per_hour_usd,
            egress_usd_per_step=estimate.egress_usd_per_iteration,
        )

    def _plan_spread(self, recipe: Recipe, market: OfferTable):
        """The planner's result, and a note when the recipe's spread (constraints.min_locations,
        for resilience) had to go: with fewer places on the market, train on what is there."""
        from orchestrator.planner import plan_recipe

        spread = recipe.constraints.min_locations
        try:
            result = plan_recipe(recipe, self.catalog, market, measured=self.node_profiles.measured)
            if result.plans or spread <= 1:
                return result, ""
        except UserError:
            if spread <= 1:
                raise
        relaxed = replace(recipe, constraints=replace(recipe.constraints, min_locations=1))
        note = f"spread over fewer than constraints.min_locations ({spread}): the market has fewer"
        return plan_recipe(
            relaxed, self.catalog, market, measured=self.node_profiles.measured
        ), note

    def _with_deadline_left(self) -> Recipe:
        """The recipe with its deadline turned into the floor the remaining steps need now."""
        objective, training = self.recipe.objective, self.recipe.training
        if not objective.deadline_h or self.progress is None:
            return self.recipe
        done, elapsed_s = self.progress()
        if done == 0 and elapsed_s <= 0:
            return self.recipe
        floor = deadline_rate(
            samples_left=(training.steps - done) * training.global_batch_size,
            seconds_left=objective.deadline_h * 3600 - elapsed_s,
        )
        return replace(
            self.recipe,
            objective=replace(objective, deadline_h=None, min_throughput_samples_per_s=floor),
        )

    def market(self, held: dict[str, int], *, held_only: bool = False) -> OfferTable:
        """The provisioner's offers now, in the catalog's terms; the nodes this job holds count
        as free to it (``held_only``: they are all there is)."""
        converted, _ = convert_offers(self.catalog, self.provisioner.offers())
        offers = []
        for offer, _ in converted:
            mine = held.get(str(offer.location), 0)
            if held_only:
                if mine:
                    offers.append(replace(offer, available_count=mine))
                continue
            if mine and offer.available_count is not None:
                offer = replace(offer, available_count=offer.available_count + mine)
            offers.append(offer)
        return OfferTable(offers, f"live: {self.recipe.provider}")


def _free_nodes(market: OfferTable, request: Request) -> int | None:
    """Free nodes of the request's kind in its place (None: the market does not say)."""
    counts = [
        o.available_count
        for o in market.offers
        if str(o.location) == request.infra
        and o.gpu == request.gpu
        and o.gpus_per_node == request.gpus_per_node
    ]
    if not counts or any(c is None for c in counts):
        return None
    return sum(counts)


def requests_for(plan: Plan, market: OfferTable) -> list[Request]:
    """Nodes per (place, GPU, pricing): the cheapest offer there, as many nodes as the GPUs need."""
    gpus: dict[tuple[str, str, bool], int] = defaultdict(int)
    for stage in plan.stages:
        for r in stage.replicas:
            gpus[(r.infra, r.gpu, r.spot)] += r.tp
    requests = []
    for (infra, gpu, spot), count in sorted(gpus.items()):
        offers = [
            o
            for o in market.offers
            if str(o.location) == infra and o.gpu == gpu and o.price_usd_per_hour(spot=spot)
        ]
        if not offers:
            raise UserError(f"the market has no {gpu} offer in {infra}", fix="re-plan")
        offer = min(offers, key=lambda o: o.price_usd_per_hour(spot=spot) / o.gpus_per_node)
        requests.append(
            Request(
                infra=infra,
                gpu=gpu,
                count=math.ceil(count / offer.gpus_per_node),
                spot=spot,
                usd_per_node_hour=offer.price_usd_per_hour(spot=spot),
                instance_type=offer.instance_type,
                gpus_per_node=offer.gpus_per_node,
            )
        )
    return requests
