"""What the planner may choose from: GPUs by place, and the options the recipe allows.

A *resource* is one GPU type in one place of the market, with how many GPUs it can give, its
largest VM (tensor parallelism stays inside a node), and whether it has a spot price. The options
come from the recipe: microbatch sizes, TP degrees, stage count, DP degrees, sync algorithms,
compression, spot or on-demand.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.catalog import Catalog, Location, OfferTable
from orchestrator.errors import UserError
from orchestrator.recipe import Recipe
from orchestrator.recipe.models import spec_of


@dataclass(frozen=True)
class Resource:
    infra: str  # the place, as offers name it
    region: str  # cloud/region
    cloud: str
    gpu: str
    capacity: int  # GPUs this place can give
    max_node_gpus: int
    has_spot: bool
    preemption_rate_per_hour: float | None  # from the market, per spot VM-hour
    spot_usd_per_gpu_hour: float | None = None  # the cheapest offer's, to order places by price
    on_demand_usd_per_gpu_hour: float | None = None

    def usd_per_gpu_hour(self, spot: bool) -> float:
        price = self.spot_usd_per_gpu_hour if spot else self.on_demand_usd_per_gpu_hour
        return float("inf") if price is None else price


@dataclass(frozen=True)
class SearchSpace:
    resources: tuple[Resource, ...]
    microbatch_sizes: tuple[int, ...]
    tp_degrees: tuple[int, ...]
    max_stages: int
    data_parallel: tuple[int, ...]  # allowed DP degrees; empty: any
    max_gpus: int | None
    allreduce: tuple[str, ...]
    compression: tuple[str, ...]
    spot_options: tuple[bool, ...]
    streams: int
    global_batch_size: int
    num_layers: int
    min_locations: int = 1  # a plan's replicas must use at least this many places

    @property
    def gpu_types(self) -> tuple[str, ...]:
        return tuple(sorted({r.gpu for r in self.resources}))

    def places(self, gpu: str, tp: int, spot: bool) -> tuple[Resource, ...]:
        """Places that can host a replica of ``tp`` GPUs of ``gpu``, priced as asked."""
        return tuple(
            r
            for r in self.resources
            if r.gpu == gpu and r.max_node_gpus >= tp and (r.has_spot or not spot)
        )

    def capacity(self, gpu: str) -> int:
        total = sum(r.capacity for r in self.resources if r.gpu == gpu)
        return min(total, self.max_gpus) if self.max_gpus else total


def build_space(
    recipe: Recipe, market: OfferTable, catalog: Catalog, *, num_layers: int | None = None
) -> SearchSpace:
    """The planner's choices for ``recipe`` on ``market`` (already the provider's or a user's)."""
    k = recipe.constraints
    within = [catalog.location(t) for t in k.locations]
    exclude = [catalog.location(t) for t in k.exclude_locations]
    offers = market.query(
        gpus=k.gpu_types,
        within=within,
        exclude=exclude,
        pricing="spot" if k.pricing == "spot" else "any",
    )
    if not offers:
        raise UserError(
            "no GPU offer is left by the recipe's constraints",
            field="constraints",
            fix="allow more locations or GPU types (python -m orchestrator validate RECIPE says which)",
        )
    spec = spec_of(recipe.model)
    layers = num_layers or spec.num_layers
    tp_degrees = tuple(
        sorted(d for d in recipe.parallelism.tensor_parallel if splits(spec, d))
    ) or (1,)
    t = recipe.training
    microbatch_sizes = tuple(sorted(m for m in t.microbatch_sizes if t.global_batch_size % m == 0))
    useful = most_useful_gpus(t.global_batch_size, microbatch_sizes, layers, tp_degrees)
    resources = _resources(offers, k.max_gpus, useful)
    places = sorted({r.infra for r in resources if r.capacity > 0})
    if len(places) < k.min_locations:
        raise UserError(
            f"{k.min_locations} locations asked for, but the market has GPUs the recipe allows in "
            f"only {len(places)}: {', '.join(places) or 'none'}",
            field="constraints.min_locations",
            fix=f"lower constraints.min_locations to {max(1, len(places))}, or allow more "
            "locations or GPU types (constraints.locations, gpu_types)",
        )
    runtime = recipe.runtime
    return SearchSpace(
        resources=resources,
        microbatch_sizes=microbatch_sizes,
        tp_degrees=tp_degrees,
        max_stages=min(layers, recipe.parallelism.max_pipeline_stages or layers),
        data_parallel=tuple(sorted(recipe.parallelism.data_parallel)),
        max_gpus=k.max_gpus,
        allreduce=("flat", "hierarchical") if runtime.allreduce == "auto" else (runtime.allreduce,),
        compression=("none",) if runtime.compression == "none" else ("none", runtime.compression),
        spot_options={"spot": (True,), "on_demand": (False,), "any": (True, False)}[k.pricing],
        streams=runtime.streams,
        global_batch_size=recipe.training.global_batch_size,
        num_layers=layers,
        min_locations=k.min_locations,
    )


def splits(spec, degree: int) -> bool:
    """Whether the runtime can split ``spec``'s blocks ``degree`` ways (runtime/tensor_parallel.py):
    GPT layers have a tensor-parallel plan whose heads and widths must divide evenly; a user's
    module model gets no tensor parallelism from the planner (its profile is measured whole)."""
    if degree == 1:
        return True
    if spec.family != "gpt":
        return False
    sizes = (spec.num_heads, spec.num_kv_heads or spec.num_heads, spec.ffn_hidden_size)
    return all(size % degree == 0 for size in sizes)


def most_useful_gpus(
    global_batch_size: int,
    microbatch_sizes: tuple[int, ...],
    layers: int,
    tp_degrees: tuple[int, ...],
) -> int:
    """The most GPUs any plan of the space can use: a replica per smallest microbatch of the
    batch, a stage per layer, the widest TP degree in each. No place needs to offer more, so the
    planner's work is bounded by this and what the market gives, never by ``max_gpus`` alone."""
    replicas = global_batch_size // min(microbatch_sizes, default=global_batch_size)
    return max(1, replicas * layers * max(tp_degrees, default=1))


def _resources(offers, max_gpus: int | None, useful: int) -> tuple[Resource, ...]:
    grouped: dict[tuple[str, str], list] = {}
    for offer in offers:
        grouped.setdefault((str(offer.location), offer.gpu), []).append(offer)
    resources = []
    for (infra, gpu), here in sorted(grouped.items()):
        counts = [
            o.available_count * o.gpus_per_node for o in here if o.available_count is not None
        ]
        unknown = any(o.available_count is None for o in here)
        if unknown and max_gpus is None:
            raise UserError(
                f"the market does not say how many {gpu} GPUs {infra} can give, and the recipe sets no max_gpus",
                field="constraints.max_gpus",
                fix="set constraints.max_gpus, or plan against a market file with available_count",
            )
        # a place that does not say its capacity gives what the recipe allows
        capacity = min(max_gpus if unknown else sum(counts), useful)
        if capacity <= 0:
            continue
        location = Location.parse(infra)
        rates = [o.preemption_rate_per_hour for o in here if o.preemption_rate_per_hour is not None]
        resources.append(
            Resource(
                infra=infra,
                region=f"{location.cloud}/{location.region}",
                cloud=location.cloud,
                gpu=gpu,
                capacity=capacity,
                max_node_gpus=max(o.gpus_per_node for o in here),
                has_spot=any(o.spot_usd_per_hour is not None for o in here),
                preemption_rate_per_hour=max(rates) if rates else None,
                spot_usd_per_gpu_hour=_cheapest(here, spot=True),
                on_demand_usd_per_gpu_hour=_cheapest(here, spot=False),
            )
        )
    if not resources:
        raise UserError(
            "every allowed offer has no GPU available now",
            field="market",
            fix="wait for capacity, or allow other locations",
        )
    return tuple(resources)


def _cheapest(offers, *, spot: bool) -> float | None:
    prices = [
        o.price_usd_per_hour(spot=spot) / o.gpus_per_node
        for o in offers
        if o.price_usd_per_hour(spot=spot) is not None
    ]
    return min(prices) if prices else None
